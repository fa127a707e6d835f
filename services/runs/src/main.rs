//! The runs service binary.

use platform::config::Env;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let env = Env::from_process();
    let telemetry = platform::telemetry::init(&env.telemetry("runs")?)?;
    let config = switchboard_runs::Config::from_env(&env)?;
    let shutdown = platform::shutdown::on_signal();
    let app = switchboard_runs::Application::build(config).await?;
    tracing::info!(port = app.port(), "runs service listening");
    let outcome = app.run(shutdown).await;
    telemetry.shutdown();
    outcome
}
