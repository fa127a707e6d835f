//! The history service binary.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    platform::service::main::<switchboard_history::Application>().await
}
