//! The worker service binary.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    platform::service::main::<switchboard_worker::Application>().await
}
