//! Open event streams per owner. (The rate limit on starting runs is
//! [`platform::limit::PerOwnerLimit`].)

/// Open streams (SSE responses and WebSockets) per owner, per replica: each holds memory and a
/// socket for as long as the client keeps it, so one owner may not hold more than `max`.
#[derive(Clone)]
pub(crate) struct StreamQuota {
    open: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    max: usize,
}

/// One open stream; released when dropped (the stream ended or the client went away).
pub(crate) struct StreamPermit {
    quota: StreamQuota,
    owner: String,
    _open: platform::metrics::GaugeGuard,
}

impl StreamQuota {
    /// At most `max` open streams per owner.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            open: std::sync::Arc::default(),
            max,
        }
    }

    /// A permit for one more stream of `owner` over `transport` (`sse`, `websocket`: the label
    /// of `switchboard_open_streams`), or `None` when the owner holds `max` already.
    pub(crate) fn acquire(&self, owner: &str, transport: &'static str) -> Option<StreamPermit> {
        let mut open = self.open.lock().ok()?;
        let count = open.entry(owner.to_owned()).or_default();
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(StreamPermit {
            quota: self.clone(),
            owner: owner.to_owned(),
            _open: platform::metrics::GaugeGuard::new(metrics::gauge!(
                "switchboard_open_streams",
                "transport" => transport
            )),
        })
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        if let Ok(mut open) = self.quota.open.lock()
            && let Some(count) = open.get_mut(&self.owner)
        {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.owner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_holds_at_most_max_streams_and_a_closed_one_frees_its_place() {
        let quota = StreamQuota::new(2);
        let first = quota.acquire("alice", "sse");
        let second = quota.acquire("alice", "sse");
        assert!(first.is_some() && second.is_some());
        assert!(
            quota.acquire("alice", "sse").is_none(),
            "a third is refused"
        );
        assert!(quota.acquire("bob", "sse").is_some(), "per owner");
        drop(first);
        assert!(
            quota.acquire("alice", "sse").is_some(),
            "a closed stream frees its place"
        );
    }
}
