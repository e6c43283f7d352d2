//! Host uid ranges for sandboxes: each live sandbox gets its own range of
//! `HOST_IDS_PER_SANDBOX` unprivileged host uids (agent, tools, MCP servers),
//! so no two sandboxes share an identity.
//!
//! **Several runners on one host.** The uids a runner hands out come from
//! blocks of [`BLOCK_UIDS`] it claims for its lifetime ([`UidClaim`]): an
//! exclusive `flock` on `block-<n>.lock` in a folder every runner on the
//! host shares (`/run/asbx-uids`; a `hostPath` in Kubernetes). Blocks are
//! aligned to multiples of [`BLOCK_UIDS`], so two runners never share a
//! uid whatever their `uid_base` and sandbox counts; a runner's death,
//! `SIGKILL` included, releases its locks. Known gap: a runner's sandboxes
//! die a moment after it does (their supervisors watch its pidfd), so a
//! runner started in that moment may hand out uids of sandboxes still being
//! killed. Without the claim, two runners
//! on one node would give their sandboxes the same host uids, and with them
//! per-user kernel state: process counts (`RLIMIT_NPROC`), inotify and
//! message-queue limits.

use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::error::RunnerError;

/// Host uids in one block a runner claims (21,845 sandboxes' worth).
pub(crate) const BLOCK_UIDS: u32 = 1 << 16;

/// Host uid blocks held by this runner: `uids` of them from `base` on.
#[derive(Debug)]
pub(crate) struct UidClaim {
    base: u32,
    /// Open, `flock`ed: the claim lasts as long as they do.
    _locks: Vec<File>,
}

impl UidClaim {
    /// Claims the first free run of consecutive blocks, at or above
    /// `uid_base`, that holds `uids` uids, in `dir` (made when missing).
    pub(crate) fn take(dir: &Path, uid_base: u32, uids: u64) -> Result<UidClaim, RunnerError> {
        let io = |what: &Path, e: std::io::Error| RunnerError::io(what.display(), e);
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let need = u32::try_from(uids.div_ceil(u64::from(BLOCK_UIDS)).max(1)).unwrap_or(u32::MAX);
        let first = uid_base.div_ceil(BLOCK_UIDS);
        let last = u32::MAX / BLOCK_UIDS; // the block holding u32::MAX is never used
        let mut start = first;
        while start.saturating_add(need) <= last {
            let mut locks = Vec::with_capacity(need as usize);
            let mut taken_at = None;
            for n in start..start + need {
                let path = dir.join(format!("block-{n}.lock"));
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)
                    .map_err(|e| io(&path, e))?;
                match file.try_lock() {
                    Ok(()) => locks.push(file),
                    Err(std::fs::TryLockError::WouldBlock) => {
                        taken_at = Some(n);
                        break;
                    }
                    Err(std::fs::TryLockError::Error(e)) => return Err(io(&path, e)),
                }
            }
            match taken_at {
                None => {
                    return Ok(UidClaim {
                        base: start * BLOCK_UIDS,
                        _locks: locks,
                    });
                }
                Some(n) => start = n + 1,
            }
        }
        Err(RunnerError::Spawn(format!(
            "no {need} free block(s) of {BLOCK_UIDS} host uids from {uid_base} up in {}",
            dir.display()
        )))
    }

    /// The first host uid of the claim.
    pub(crate) fn base(&self) -> u32 {
        self.base
    }
}

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
    fn claims_on_one_host_never_share_a_uid() {
        let dir = tempfile::tempdir().unwrap();
        let a = UidClaim::take(dir.path(), 1_000_000, 3 * 1024).unwrap();
        // Aligned up: the first whole block at or above the base.
        assert_eq!(a.base(), 16 * BLOCK_UIDS);
        // Another runner, a base inside a's block: the next block.
        let b = UidClaim::take(dir.path(), 1_050_000, 3 * 1024).unwrap();
        assert_eq!(b.base(), 17 * BLOCK_UIDS);
        // One that needs two blocks skips to two free ones in a row.
        let c = UidClaim::take(dir.path(), 1_000_000, u64::from(BLOCK_UIDS) + 1).unwrap();
        assert_eq!(c.base(), 18 * BLOCK_UIDS);
        let d = UidClaim::take(dir.path(), 1_000_000, 1).unwrap();
        assert_eq!(d.base(), 20 * BLOCK_UIDS);
        // A runner's end frees its blocks for the next one.
        drop(a);
        let e = UidClaim::take(dir.path(), 1_000_000, 1).unwrap();
        assert_eq!(e.base(), 16 * BLOCK_UIDS);
        drop((b, c, d, e));
    }

    #[test]
    fn a_claim_that_cannot_fit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = UidClaim::take(dir.path(), u32::MAX - 10, 3).unwrap_err();
        assert!(err.to_string().contains("no 1 free block"), "{err}");
        let file = tempfile::NamedTempFile::new().unwrap();
        let err = UidClaim::take(&file.path().join("x"), 1_000_000, 3).unwrap_err();
        assert!(err.to_string().contains("/x"), "{err}");
    }

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
