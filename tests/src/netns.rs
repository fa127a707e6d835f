//! A Linux network namespace joined to this one by a veth pair, for a process that must be cut
//! off from everything else while it keeps running (a network partition, not a crash).
//!
//! This side of the pair gets `10.213.X.Y+1/30`, the namespace's side `10.213.X.Y+2/30`, with
//! `X` and `Y` picked at random among the /30s no interface here has; a process in the
//! namespace reaches this side's address and the other way round. Made with `ip` (iproute2)
//! as root; there is no fallback: without `ip` or root, [`Netns::create`] fails and says why.
//!
//! [`Netns::partition`] drops every packet between the two sides silently: each side's
//! neighbour entry for the other is pinned to a MAC address nobody has, so frames still leave
//! and arrive, but the receiving kernel discards them as meant for another host. No RST, no
//! ICMP error: an open TCP connection hangs (its data retransmitted) and a new one times out,
//! as across a broken switch. [`Netns::heal`] removes the pinned entries; ARP finds the real
//! peer again and the retransmitted data flows. (`tc netem` would do the same, but this
//! kernel has no queueing disciplines; bringing a link down would fail sends on the
//! namespace's side at once instead of losing them.)

use std::net::Ipv4Addr;
use std::process::{Command, Output, Stdio};

use anyhow::{Context as _, bail};

/// A MAC address no interface has (locally administered, unicast): frames sent to it are
/// dropped by the receiver.
const NOWHERE: &str = "02:00:00:5b:00:00";

/// A network namespace and the veth pair to it; both deleted on drop (also on panic).
pub struct Netns {
    /// The namespace's name (`ip netns exec <name> ...`).
    pub name: String,
    /// The address of this side of the pair (the root namespace's).
    pub host_addr: Ipv4Addr,
    /// The address of the namespace's side of the pair.
    pub ns_addr: Ipv4Addr,
    host_link: String,
    ns_link: String,
}

/// Runs `ip args...`, failing with its stderr (or with how to get `ip`) unless it succeeds.
fn ip(args: &[&str]) -> anyhow::Result<Output> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context(
            "cannot run `ip` (iproute2): the partition tests need it and root \
             (apt-get install iproute2; scripts/test.sh runs as root)",
        )?;
    if !output.status.success() {
        bail!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(output)
}

impl Netns {
    /// Creates the namespace (loopback up) and the veth pair to it, both ends addressed and up.
    pub fn create() -> anyhow::Result<Self> {
        let id = uuid::Uuid::new_v4();
        let bytes = id.as_bytes();
        // Interface names are at most 15 characters: "sbp" + 8 hex digits + one letter.
        let name = format!("sbp{}", &id.simple().to_string()[..8]);
        let in_use = String::from_utf8_lossy(&ip(&["-4", "-o", "addr", "show"])?.stdout)
            .lines()
            .filter_map(|line| line.split_whitespace().skip_while(|w| *w != "inet").nth(1))
            .filter_map(|cidr| cidr.split('/').next()?.parse::<Ipv4Addr>().ok())
            .collect::<Vec<_>>();
        // The first /30 of 10.213.0.0/16 after a random one that no local address is in.
        let start = u16::from_be_bytes([bytes[0], bytes[1]]) >> 2;
        let base = (0..1 << 14)
            .map(|step: u16| u32::from(start.wrapping_add(step) & 0x3fff) << 2)
            .map(|offset| u32::from(Ipv4Addr::new(10, 213, 0, 0)) + offset)
            .find(|net| !in_use.iter().any(|addr| u32::from(*addr) & !3 == *net))
            .context("every /30 of 10.213.0.0/16 is in use")?;
        let netns = Self {
            host_addr: Ipv4Addr::from(base + 1),
            ns_addr: Ipv4Addr::from(base + 2),
            host_link: format!("{name}h"),
            ns_link: format!("{name}n"),
            name,
        };
        // From here on, drop deletes whatever of it exists.
        ip(&["netns", "add", &netns.name])?;
        ip(&[
            "link",
            "add",
            &netns.host_link,
            "type",
            "veth",
            "peer",
            "name",
            &netns.ns_link,
        ])?;
        ip(&["link", "set", &netns.ns_link, "netns", &netns.name])?;
        let host_cidr = format!("{}/30", netns.host_addr);
        ip(&["addr", "add", &host_cidr, "dev", &netns.host_link])?;
        ip(&["link", "set", &netns.host_link, "up"])?;
        let ns_cidr = format!("{}/30", netns.ns_addr);
        netns.ip(&["addr", "add", &ns_cidr, "dev", &netns.ns_link])?;
        netns.ip(&["link", "set", &netns.ns_link, "up"])?;
        netns.ip(&["link", "set", "lo", "up"])?;
        Ok(netns)
    }

    /// Runs `ip args...` inside the namespace.
    fn ip(&self, args: &[&str]) -> anyhow::Result<Output> {
        let mut all = vec!["netns", "exec", &self.name, "ip"];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// A command that runs `program` inside the namespace (`ip netns exec`, which execs it: the
    /// child's pid is the program's).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name]).arg(program);
        command
    }

    /// Cuts the namespace off: from now on every packet either way is lost (see the module's
    /// documentation).
    pub fn partition(&self) -> anyhow::Result<()> {
        let (host, ns) = (self.host_addr.to_string(), self.ns_addr.to_string());
        ip(&[
            "neigh",
            "replace",
            &ns,
            "lladdr",
            NOWHERE,
            "dev",
            &self.host_link,
            "nud",
            "permanent",
        ])?;
        self.ip(&[
            "neigh",
            "replace",
            &host,
            "lladdr",
            NOWHERE,
            "dev",
            &self.ns_link,
            "nud",
            "permanent",
        ])?;
        Ok(())
    }

    /// Ends the partition: the pinned entries go, ARP finds the real peers again.
    pub fn heal(&self) -> anyhow::Result<()> {
        let (host, ns) = (self.host_addr.to_string(), self.ns_addr.to_string());
        ip(&["neigh", "del", &ns, "dev", &self.host_link])?;
        self.ip(&["neigh", "del", &host, "dev", &self.ns_link])?;
        Ok(())
    }
}

impl Drop for Netns {
    /// Deletes the pair (deleting one end deletes both) and the namespace; what is already gone
    /// is skipped. Processes still inside keep the namespace alive until they exit, so whoever
    /// started them stops them first.
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.host_link]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}
