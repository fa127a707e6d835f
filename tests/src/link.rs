//! A TCP link a test can cut: one service connects to NATS through it instead of directly, and
//! the test drops that service's connections (and refuses new ones) while the others keep
//! theirs. The server is the real one; only the network between them fails.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// A forwarding listener to `upstream`, cut on demand.
pub struct CuttableLink {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Bumped on each cut: every forwarded connection watching it ends.
    cuts: watch::Sender<u64>,
    accepted: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl CuttableLink {
    /// Listens on a free loopback port and forwards each connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let (cuts, _) = watch::channel(0u64);
        let accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let task = tokio::spawn({
            let (cut, cuts, accepted) = (Arc::clone(&cut), cuts.clone(), Arc::clone(&accepted));
            async move {
                let mut links = JoinSet::new();
                while let Ok((inbound, _)) = listener.accept().await {
                    // Cut: the connection is dropped at once, as a refused one would be.
                    if cut.load(Ordering::SeqCst) {
                        continue;
                    }
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let mut ended = cuts.subscribe();
                    links.spawn(async move {
                        let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                            return;
                        };
                        let mut inbound = inbound;
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = ended.changed() => {}
                        }
                    });
                    while links.try_join_next().is_some() {}
                }
            }
        });
        Ok(Self {
            addr,
            cut,
            cuts,
            accepted,
            task,
        })
    }

    /// `nats://` URL of the link.
    pub fn nats_url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// Connections forwarded so far (a client that reconnected after [`CuttableLink::restore`]
    /// counts again).
    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Drops every forwarded connection and refuses new ones until [`CuttableLink::restore`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for CuttableLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}
