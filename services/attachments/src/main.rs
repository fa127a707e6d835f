//! The attachments service binary.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    platform::service::main::<switchboard_attachments::Application>().await
}
