//! The agent as its sandbox's init: reaping the orphans its tools leave.
//!
//! In a jail the agent is pid 1 of the sandbox's pid namespace (no separate
//! init process; see `asbx_jail`'s `init` module). A process a tool
//! started that outlives its parent (a double fork, a daemon) then becomes
//! the agent's child, and its exit leaves a zombie, holding a pid of the
//! sandbox's `pids` bound, until the agent waits for it.
//!
//! The agent's own children are tokio's to wait for: reaping one of them
//! here would leave its `wait` an error. So every child the agent starts
//! goes through [`spawn`], which records its pid while it holds the lock
//! [`reap`] takes; [`reap`] waits only for the children of the main thread
//! (where orphans go) that were not recorded. A recorded pid that is no
//! longer a child (tokio reaped it) is forgotten at the next [`reap`].
//! Outside a jail (pid other than 1) nobody is reaped here: orphans go to
//! the host's init or subreaper.

use std::sync::{Mutex, MutexGuard, PoisonError};

use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

/// Pids of the children the agent started (tokio's to wait for).
static SPAWNED: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn spawned() -> MutexGuard<'static, Vec<u32>> {
    SPAWNED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts a child with `start`, recording its pid (`pid_of`) before any
/// [`reap`] can see it.
pub(crate) fn spawn<T>(
    start: impl FnOnce() -> std::io::Result<T>,
    pid_of: impl FnOnce(&T) -> Option<u32>,
) -> std::io::Result<T> {
    let mut spawned = spawned();
    let child = start()?;
    if let Some(pid) = pid_of(&child) {
        spawned.push(pid);
    }
    Ok(child)
}

/// Whether this process is its pid namespace's init, which orphans go to.
pub(crate) fn is_init() -> bool {
    std::process::id() == 1
}

/// Reaps, at every `SIGCHLD`, the orphans that ended: for the agent as
/// its sandbox's init ([`is_init`]). Runs until the runtime ends.
pub(crate) async fn reap_orphans() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut children) = signal(SignalKind::child()) else {
        return;
    };
    loop {
        reap(std::process::id());
        if children.recv().await.is_none() {
            return;
        }
    }
}

/// Waits for each child of this process's thread `tid` (the main thread's
/// is the process id: where orphans go) that ended and was not started
/// through [`spawn`]; forgets recorded pids that are no longer its children.
fn reap(tid: u32) {
    let mut spawned = spawned();
    let Ok(list) = std::fs::read_to_string(format!("/proc/self/task/{tid}/children")) else {
        return;
    };
    let children: Vec<u32> = list
        .split_ascii_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    spawned.retain(|p| children.contains(p));
    for child in children {
        if spawned.contains(&child) {
            continue;
        }
        let Ok(child) = i32::try_from(child) else {
            continue;
        };
        // Never blocks: one still running is left for a later signal.
        let _ = waitpid(
            Pid::from_raw(child),
            Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What [`reap`] waits for and what it leaves: a child it did not start
    /// through [`spawn`] that ended is reaped; one started through [`spawn`]
    /// is left for its owner's `wait`, which still gets its status.
    #[test]
    fn reaps_what_it_did_not_start_and_leaves_its_own() {
        // Children of this test's thread (the harness runs each on its own).
        let me = nix::unistd::gettid().as_raw() as u32;
        #[expect(
            clippy::zombie_processes,
            reason = "`reap` waits for it: what this checks"
        )]
        let stray = std::process::Command::new("true").spawn().unwrap();
        let mut own = spawn(
            || std::process::Command::new("true").spawn(),
            |c| Some(c.id()),
        )
        .unwrap();
        let zombie = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
        };
        let gone = |pid: u32| !std::path::Path::new(&format!("/proc/{pid}")).exists();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !(zombie(stray.id()) && zombie(own.id())) {
            assert!(std::time::Instant::now() < deadline, "both end");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        reap(me);
        assert!(gone(stray.id()), "the stray child was reaped");
        assert!(zombie(own.id()), "its own child was left alone");
        assert!(
            own.wait().unwrap().success(),
            "and its owner gets the status"
        );
        // Reaped by its owner: forgotten at the next pass.
        reap(me);
        assert!(!spawned().contains(&own.id()));
    }
}
