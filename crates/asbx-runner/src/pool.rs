//! Booting sandboxes, and the warm pool that does it ahead of time.
//!
//! Building a jail costs a few milliseconds, and on cgroup v1 hosts moving
//! its first process into its cgroups waits for an RCU grace period, which
//! on a quiet host takes around 10 ms. So the runner keeps a few sandboxes
//! booted in the background (`warm_pool`, default 2): fully jailed, their
//! agent waiting for its bootstrap on stdin. A dispatch takes one, binds its
//! gateway sockets into the sandbox's run folder (mounted in the sandbox
//! already), writes the bootstrap, and the pool boots a replacement. Each
//! sandbox still serves exactly one dispatch and dies with it: the pool
//! moves set-up off the critical path, it never reuses a sandbox.
//!
//! A warm sandbox whose runner dies reads end-of-file on stdin and exits.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::process::Child;

use crate::Inner;
use crate::error::RunnerError;
use crate::sandbox::{SandboxSpec, SessionDirs};
use crate::uids::UidLease;

/// A started sandbox whose agent waits for its bootstrap.
#[derive(Debug)]
pub(crate) struct Booted {
    pub(crate) child: Child,
    pub(crate) slot: Slot,
}

/// Everything of a sandbox but its process: folders, uid range, names.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) dirs: SessionDirs,
    pub(crate) uid: UidLease,
    /// Names its cgroups (`asbx-<name>`) and folder.
    pub(crate) name: String,
    pub(crate) gateway_socket: String,
    pub(crate) proxy_socket: String,
    pub(crate) workdir: String,
    pub(crate) tool_user: Option<(u32, u32)>,
}

impl Slot {
    /// Removes what the sandbox may leave behind; call after it ended.
    pub(crate) fn cleanup(&self, inner: &Inner) {
        let spec = SandboxSpec {
            name: &self.name,
            dirs: &self.dirs,
            host_uid: self.uid.host_uid(),
            resources: &inner.config.resources,
            env: &[],
        };
        inner.sandbox.cleanup(&spec);
        self.dirs.remove();
    }
}

/// Starts a sandbox named `name` in a folder under `parent`.
pub(crate) fn boot(inner: &Inner, parent: &str, name: &str) -> Result<Booted, RunnerError> {
    let uid = inner
        .uids
        .lease()
        .ok_or(RunnerError::AtCapacity(inner.config.max_sandboxes))?;
    let dirs = SessionDirs::create(
        &inner.config.state_dir.join(parent),
        name,
        inner.sandbox.detached_run(),
    )?;
    let spec = SandboxSpec {
        name,
        dirs: &dirs,
        host_uid: uid.host_uid(),
        resources: &inner.config.resources,
        env: &inner.config.agent_env,
    };
    let prepared = match inner.sandbox.prepare(&spec) {
        Ok(p) => p,
        Err(e) => {
            dirs.remove();
            return Err(e);
        }
    };
    let mut command = prepared.command;
    let child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            dirs.remove();
            return Err(RunnerError::Spawn(format!(
                "{}: {e}",
                inner.config.asbx_exe.display()
            )));
        }
    };
    Ok(Booted {
        child,
        slot: Slot {
            dirs,
            uid,
            name: name.to_owned(),
            gateway_socket: prepared.gateway_socket,
            proxy_socket: prepared.proxy_socket,
            workdir: prepared.workdir,
            tool_user: prepared.tool_user,
        },
    })
}

/// Sandboxes booted ahead of time.
#[derive(Debug)]
pub(crate) struct Pool {
    target: usize,
    warm: Mutex<VecDeque<Booted>>,
    counter: AtomicU64,
    /// One refill loop at a time, or concurrent ones overshoot the target.
    refilling: AtomicBool,
}

impl Pool {
    pub(crate) fn new(target: usize) -> Self {
        Pool {
            target,
            warm: Mutex::new(VecDeque::new()),
            counter: AtomicU64::new(0),
            refilling: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Booted>> {
        self.warm.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many warm sandboxes wait (for the metrics).
    pub(crate) fn warm(&self) -> usize {
        self.lock().len()
    }

    /// A warm sandbox that is still alive, if any.
    pub(crate) fn take(&self, inner: &Inner) -> Option<Booted> {
        loop {
            let mut b = self.lock().pop_front()?;
            match b.child.try_wait() {
                Ok(None) => return Some(b),
                // It died waiting (killed from outside, out of memory): drop it.
                _ => b.slot.cleanup(inner),
            }
        }
    }

    /// Boots sandboxes until the pool holds its target.
    pub(crate) fn refill(inner: &Arc<Inner>) {
        let pool = &inner.pool;
        loop {
            if pool.refilling.swap(true, Ordering::AcqRel) {
                return; // the running loop fills up to the target
            }
            let mut failed = false;
            while pool.lock().len() < pool.target {
                let n = pool.counter.fetch_add(1, Ordering::Relaxed);
                let name = format!("warm-{}-{n}", std::process::id());
                match boot(inner, "pool", &name) {
                    Ok(b) => pool.lock().push_back(b),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not boot a warm sandbox");
                        failed = true;
                        break;
                    }
                }
            }
            pool.refilling.store(false, Ordering::Release);
            // A sandbox taken after the last check but before the release
            // found the flag set: look once more.
            if failed || pool.lock().len() >= pool.target {
                return;
            }
        }
    }

    /// Ends every warm sandbox and removes its traces.
    pub(crate) async fn drain(inner: &Inner) {
        let warm: Vec<Booted> = inner.pool.lock().drain(..).collect();
        for mut b in warm {
            // Closing stdin ends a waiting agent; SIGTERM ends the jail.
            drop(b.child.stdin.take());
            crate::drive::kill_tree(&mut b.child).await;
            b.slot.cleanup(inner);
        }
    }
}
