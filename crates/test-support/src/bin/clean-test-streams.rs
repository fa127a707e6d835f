//! Removes the NATS streams and buckets earlier test runs left behind (a test killed before its
//! cleanup ran). `scripts/test.sh` runs it before the tests, as it drops old test databases.
//! Usage: `clean-test-streams` (`SB_TEST_NATS_URL`, default the port of `scripts/infra.sh`).

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let infra = switchboard_test_support::Infra::from_env();
    let removed = switchboard_test_support::remove_leftover_test_streams(&infra.nats_url).await?;
    eprintln!("removed {removed} leftover test streams");
    Ok(())
}
