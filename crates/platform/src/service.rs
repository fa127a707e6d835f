//! What every service binary does, once: read configuration, start telemetry, build the
//! application, serve until SIGTERM, flush telemetry last.

use std::future::Future;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigError, Env};

/// A service as its binary sees it. Tests use the same `build` and `run`.
pub trait Service: Sized {
    /// Typed settings.
    type Config;
    /// `service.name` of its telemetry.
    const NAME: &'static str;
    /// Reads the settings; fails naming the variable.
    fn config(env: &Env) -> Result<Self::Config, ConfigError>;
    /// Connects to its dependencies and binds its port.
    fn build(config: Self::Config) -> impl Future<Output = anyhow::Result<Self>> + Send;
    /// The bound HTTP port.
    fn port(&self) -> u16;
    /// Serves until `shutdown` is cancelled, then drains.
    fn run(self, shutdown: CancellationToken) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// The `migrate` subcommand: applies the service's schema migrations and returns. Nothing
    /// to do for a service without a database.
    fn migrate(env: &Env) -> impl Future<Output = anyhow::Result<()>> + Send {
        let _ = env;
        async { Ok(()) }
    }
}

/// The whole `main` of a service binary: serves, or with the argument `migrate` applies the
/// service's migrations and exits, or with `nats-setup` (run as the NATS admin) creates or
/// reconciles the streams and buckets every service uses and exits.
pub async fn main<S: Service>() -> anyhow::Result<()> {
    let env = Env::from_process();
    let telemetry = crate::telemetry::init(&env.telemetry(S::NAME)?)?;
    let outcome = match std::env::args().nth(1).as_deref() {
        None => serve::<S>(&env).await,
        Some("migrate") => S::migrate(&env).await,
        Some("nats-setup") => nats_setup(&env).await,
        Some(other) => Err(anyhow::anyhow!(
            "unknown argument {other:?}: run without arguments to serve, or `migrate`, or \
             `nats-setup`"
        )),
    };
    if let Err(err) = &outcome {
        tracing::error!(
            error = format!("{err:#}"),
            "{} stopped with an error",
            S::NAME
        );
    }
    telemetry.shutdown();
    outcome
}

/// `nats-setup`: the streams and buckets of the deployment's settings (`SB_NATS_*`), made or
/// brought in line by the NATS user this runs as (the admin: the services' own users may not).
async fn nats_setup(env: &Env) -> anyhow::Result<()> {
    let config = env.nats()?;
    let (_client, js) = crate::nats::connect(&config, "nats-setup").await?;
    crate::nats::setup(&js, &config).await?;
    tracing::info!(
        prefix = config.names.prefix(),
        "NATS streams and buckets set up"
    );
    Ok(())
}

async fn serve<S: Service>(env: &Env) -> anyhow::Result<()> {
    let config = S::config(env)?;
    let shutdown = crate::shutdown::on_signal();
    let app = S::build(config).await?;
    tracing::info!(port = app.port(), "{} listening", S::NAME);
    app.run(shutdown).await
}

/// Binds `addr`, naming it in the error.
pub async fn bind(addr: std::net::SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))
}

/// Binds `addr` like [`bind`], with every accepted connection's kernel send buffer fixed at
/// `send_buffer` bytes (the kernel doubles it) instead of growing up to 4 MiB: what a client that
/// stops reading a stream can pin in the kernel is bounded by it. Accepted sockets inherit the
/// listening socket's buffer size.
pub async fn bind_with_send_buffer(
    addr: std::net::SocketAddr,
    send_buffer: u32,
) -> anyhow::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .with_context(|| format!("cannot open a socket for {addr}"))?;
    socket.set_reuseaddr(true)?;
    socket.set_send_buffer_size(send_buffer)?;
    socket
        .bind(addr)
        .with_context(|| format!("cannot listen on {addr}"))?;
    socket
        .listen(1024)
        .with_context(|| format!("cannot listen on {addr}"))
}

/// The port a listener is bound to.
pub fn port(listener: &TcpListener) -> u16 {
    listener.local_addr().map(|a| a.port()).unwrap_or_default()
}
