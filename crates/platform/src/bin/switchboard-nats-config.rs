//! Prints the `authorization` block of a nats-server configuration for a deployment: one user
//! per service, allowed only the subjects it needs (`platform::nats_auth`). Passwords are
//! read by nats-server from its environment (`SB_NATS_PASSWORD_<SERVICE>`, `..._ADMIN`).
//!
//! `switchboard-nats-config [PREFIX]` (default `sb`, the services' `SB_NATS_PREFIX`).

fn main() -> anyhow::Result<()> {
    let prefix = std::env::args().nth(1).unwrap_or_else(|| "sb".to_owned());
    let names = protocol::messaging::Names::new(&prefix)?;
    let block = switchboard_platform::nats_auth::authorization_block(&names);
    std::io::Write::write_all(&mut std::io::stdout(), block.as_bytes())?;
    Ok(())
}
