//! The worker binary.

use platform::config::Env;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let env = Env::from_process();
    let telemetry = platform::telemetry::init(&env.telemetry("worker")?)?;
    let config = switchboard_worker::Config::from_env(&env)?;
    let shutdown = platform::shutdown::on_signal();
    let app = switchboard_worker::Application::build(config).await?;
    tracing::info!(port = app.port(), "worker listening for health checks");
    let outcome = app.run(shutdown).await;
    telemetry.shutdown();
    outcome
}
