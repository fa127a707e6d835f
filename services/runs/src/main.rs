//! The runs service binary.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    platform::service::main::<switchboard_runs::Application>().await
}
