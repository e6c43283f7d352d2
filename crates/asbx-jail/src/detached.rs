//! [`DetachedDir`]: a folder the runner shares with sandboxes without any
//! host path showing inside them.
//!
//! A bind mount's root (the fourth field of `/proc/self/mountinfo`) is the
//! path of its source inside the source's file system, and nothing in the
//! sandbox can rename it: binding `<data>/pool/<name>/run` or the installed
//! `asbx` binary would show the host's data folder, the runner's pid (in
//! the sandbox's name) and the install path. So what the runner shares
//! lives on a tmpfs of its own that is mounted nowhere (`fsopen` +
//! `fsmount`): its root is `/`, the runner reaches it through its
//! descriptor (`/proc/<runner pid>/fd/<n>`, the [`DetachedDir::path`]), the
//! jail clones it from that path (`open_tree`) into the sandbox, and it is
//! freed with the last descriptor and the last sandbox holding a clone: a
//! killed runner leaves no mount on the host.
//!
//! Cloning a detached mount needs a recent kernel (6.15 and later allow it
//! for the mount namespace that made it): [`DetachedDir::tmpfs`] tries one
//! clone and fails otherwise, so the runner can fall back to host folders.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::{JailError, sys};

/// A tmpfs mounted nowhere, reachable at [`DetachedDir::path`] by this
/// process and by the jails it starts. Dropping it releases the mount (the
/// sandboxes that cloned it keep their copy until they end).
#[derive(Debug)]
pub struct DetachedDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl DetachedDir {
    /// A new tmpfs of at most `size_bytes` and `inodes` inodes, root-owned,
    /// mode 0755, `nosuid`, `nodev`, and `noexec` unless `exec`. Fails on a
    /// kernel where a jail could not clone it.
    pub fn tmpfs(size_bytes: u64, inodes: u32, exec: bool) -> Result<DetachedDir, JailError> {
        let mut attrs = sys::MOUNT_ATTR_NOSUID_NODEV;
        if !exec {
            attrs |= sys::MOUNT_ATTR_NOEXEC;
        }
        let size = size_bytes.to_string();
        let inodes = inodes.to_string();
        let fd = sys::detached_tmpfs(
            &[("size", &size), ("nr_inodes", &inodes), ("mode", "0755")],
            attrs,
        )
        .map_err(|e| JailError::Host(format!("detached tmpfs: {e}")))?;
        let path = PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            fd.as_raw_fd()
        ));
        drop(
            sys::open_tree_clone(&path)
                .map_err(|e| JailError::Host(format!("cloning a detached tmpfs: {e}")))?,
        );
        Ok(DetachedDir { fd, path })
    }

    /// Where this process (and a jail it starts) finds the folder:
    /// `/proc/<pid>/fd/<n>`. A bind source in a `JailPolicy`.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl AsRawFd for DetachedDir {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}
