//! Host uid ranges for sandboxes: each live sandbox gets its own range of
//! `HOST_IDS_PER_SANDBOX` unprivileged host uids (agent, tools, MCP servers),
//! so no two sandboxes share an identity.

use std::sync::{Arc, Mutex};

#[derive(Debug)]
pub(crate) struct UidPool {
    base: u32,
    used: Mutex<Vec<bool>>,
}

/// A leased range; returned to the pool on drop.
#[derive(Debug)]
pub(crate) struct UidLease {
    pool: Arc<UidPool>,
    slot: usize,
}

impl UidPool {
    pub(crate) fn new(base: u32, slots: usize) -> Self {
        UidPool {
            base,
            used: Mutex::new(vec![false; slots]),
        }
    }

    pub(crate) fn lease(self: &Arc<Self>) -> Option<UidLease> {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let slot = used.iter().position(|u| !u)?;
        used[slot] = true;
        Some(UidLease {
            pool: Arc::clone(self),
            slot,
        })
    }
}

impl UidLease {
    /// The first host uid of this range.
    pub(crate) fn host_uid(&self) -> u32 {
        self.pool.base + asbx_protocol::jail::HOST_IDS_PER_SANDBOX * self.slot as u32
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        let mut used = self.pool.used.lock().unwrap_or_else(|p| p.into_inner());
        used[self.slot] = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_distinct_and_returned() {
        let pool = Arc::new(UidPool::new(1_000_000, 2));
        let a = pool.lease().unwrap();
        let b = pool.lease().unwrap();
        assert_ne!(a.host_uid(), b.host_uid());
        assert!(pool.lease().is_none());
        let freed = a.host_uid();
        drop(a);
        assert_eq!(pool.lease().unwrap().host_uid(), freed);
    }
}
