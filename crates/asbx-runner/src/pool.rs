//! Booting sandboxes, and the warm pool that does it ahead of time.
//!
//! Building a jail costs a few milliseconds, and on cgroup v1 hosts moving
//! its first process into its cgroups waits for an RCU grace period, which
//! on a quiet host takes around 10 ms. So the runner keeps a few sandboxes
//! booted in the background (`warm_pool`, default 2, and more under load;
//! below): fully jailed, their
//! agent waiting for its bootstrap on stdin. A dispatch takes one, binds its
//! gateway sockets into the sandbox's run folder (mounted in the sandbox
//! already), writes the bootstrap, and the pool boots a replacement. Each
//! sandbox still serves exactly one dispatch and dies with it: the pool
//! moves set-up off the critical path, it never reuses a sandbox.
//!
//! A warm sandbox whose runner dies reads end-of-file on stdin and exits.
//!
//! **Sized from demand.** The pool holds at least `warm_pool` and at most
//! `warm_pool_max` (the memory budget: an idle warm sandbox costs about a
//! MiB of host memory). Between the two it follows the recent rate: the
//! most dispatches taken within one second over the last minute. A burst
//! of 200 dispatches therefore finds at most `warm_pool` sandboxes ready
//! the first time, but the pool then refills to 200 and a second burst of
//! the same size within a minute is served warm. When demand falls the
//! target falls back; warm sandboxes above it are used up, not killed.
//! Refilling runs on a blocking thread and waits while dispatches are
//! starting (taken or booted, first line not yet out), so in a burst it
//! never competes with them for the CPU: first lines go first. While at
//! least half the target is warm it also waits for a quiet moment, no take
//! in the last [`REFILL_QUIET`], so a chat turn's replacement boots after
//! the turn rather than on the same cores during it (much of a boot is the
//! kernel's work for the runner, the zygote and the supervisor, outside
//! the sandbox's cgroup). The pool's sandboxes boot at the lowest CPU
//! weight of their cgroup (`background`) and get the default weight when
//! taken, so what runs inside a booting sandbox never slows a turn down.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::Inner;
use crate::child::SandboxChild;
use crate::error::RunnerError;
use crate::sandbox::{SandboxSpec, SessionDirs};
use crate::uids::UidLease;

/// A started sandbox whose agent waits for its bootstrap.
#[derive(Debug)]
pub(crate) struct Booted {
    pub(crate) child: SandboxChild,
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
    /// Removes what the sandbox may leave behind, on a blocking thread (a
    /// killed supervisor's cgroups can take seconds to go, and the working
    /// folder may be large); call after it ended. The uid lease is released
    /// once that is done; await the handle to go on after it.
    pub(crate) fn cleanup(self, inner: &Arc<Inner>) -> tokio::task::JoinHandle<()> {
        let inner = Arc::clone(inner);
        tokio::task::spawn_blocking(move || self.cleanup_now(&inner))
    }

    fn cleanup_now(&self, inner: &Inner) {
        let spec = SandboxSpec {
            name: &self.name,
            dirs: &self.dirs,
            host_uid: self.uid.host_uid(),
            resources: &inner.config.resources,
            env: &[],
            background: false,
        };
        inner.sandbox.cleanup(&spec);
        self.dirs.remove();
    }
}

/// Where warm sandboxes live, under the state folder; boots there are the
/// pool's, in the background (lowest CPU weight until taken).
const POOL_DIR: &str = "pool";

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
        background: parent == POOL_DIR,
    };
    let prepared = match inner.sandbox.prepare(&spec) {
        Ok(p) => p,
        Err(e) => {
            dirs.remove();
            return Err(e);
        }
    };
    let child = match prepared.start.spawn() {
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

/// How long after the last take a refill waits, while at least half the
/// target is warm: the turn that took it runs then, and a boot on the same
/// cores would slow it (about a millisecond of a chat turn on two cores,
/// docs/performance.md). A chat's turns come seconds apart, so its refill
/// happens between them.
const REFILL_QUIET: Duration = Duration::from_millis(50);

/// How much longer a refill waits with `warm` of `target` sandboxes warm,
/// `since` the last take: nothing when fewer than half are left (the next
/// dispatch may otherwise find none) or the last take is
/// [`REFILL_QUIET`] old.
fn quiet_wait(warm: usize, target: usize, since: Duration) -> Option<Duration> {
    (warm * 2 >= target && since < REFILL_QUIET).then(|| REFILL_QUIET - since)
}

/// Seconds of demand the pool remembers.
const WINDOW_SECS: usize = 60;

/// Recent demand: how many dispatches were taken within one second (a
/// sliding second, so a burst that straddles a clock second counts whole),
/// and the most of that per second over the last [`WINDOW_SECS`] seconds.
#[derive(Debug)]
struct Demand {
    /// When the dispatches of the last second were taken, at most `cap`.
    last_second: VecDeque<Duration>,
    cap: usize,
    /// `(second, most dispatches within one second seen then)`, indexed by
    /// second modulo the window.
    buckets: [(u64, u32); WINDOW_SECS],
}

impl Demand {
    /// Counts up to `cap` dispatches a second (the pool never wants more).
    fn new(cap: usize) -> Self {
        Demand {
            last_second: VecDeque::new(),
            cap: cap.max(1),
            buckets: [(0, 0); WINDOW_SECS],
        }
    }

    /// A dispatch taken at `now` (time since the pool started).
    fn record(&mut self, now: Duration) {
        while self
            .last_second
            .front()
            .is_some_and(|t| now.saturating_sub(*t) >= Duration::from_secs(1))
        {
            self.last_second.pop_front();
        }
        if self.last_second.len() == self.cap {
            self.last_second.pop_front();
        }
        self.last_second.push_back(now);
        let rate = u32::try_from(self.last_second.len()).unwrap_or(u32::MAX);
        let sec = now.as_secs();
        let b = &mut self.buckets[(sec % WINDOW_SECS as u64) as usize];
        if b.0 != sec {
            *b = (sec, 0);
        }
        b.1 = b.1.max(rate);
    }

    /// When the last dispatch was taken (`None` before any).
    fn last_take(&self) -> Option<Duration> {
        self.last_second.back().copied()
    }

    /// The most dispatches within one second in the window ending at `now`.
    fn peak(&self, now: Duration) -> usize {
        let now = now.as_secs();
        self.buckets
            .iter()
            .filter(|(sec, _)| now.saturating_sub(*sec) < WINDOW_SECS as u64)
            .map(|(_, n)| *n as usize)
            .max()
            .unwrap_or(0)
    }
}

/// Sandboxes booted ahead of time.
#[derive(Debug)]
pub(crate) struct Pool {
    min: usize,
    max: usize,
    warm: Mutex<VecDeque<Booted>>,
    demand: Mutex<Demand>,
    epoch: std::time::Instant,
    /// One refill loop at a time, or concurrent ones overshoot the target.
    refilling: AtomicBool,
    /// Dispatches starting right now (first line not out yet): refilling
    /// waits for them.
    starting: AtomicUsize,
    started: tokio::sync::Notify,
    /// Set by [`Pool::drain`]: no refill starts or goes on, so none boots a
    /// sandbox after the drain took the warm ones (a booted sandbox that is
    /// dropped instead of drained leaves its cgroups behind).
    draining: AtomicBool,
    /// Woken when a refill loop ends.
    refilled: tokio::sync::Notify,
    /// Woken by every take (and the drain): a refill waiting for quiet
    /// looks again.
    taken: tokio::sync::Notify,
}

/// Marks a dispatch as starting until its first line; see [`Pool::starting`].
pub(crate) struct Starting(Arc<Inner>);

impl Drop for Starting {
    fn drop(&mut self) {
        let pool = &self.0.pool;
        if pool.starting.fetch_sub(1, Ordering::AcqRel) == 1 {
            pool.started.notify_waiters();
        }
    }
}

/// A response body that holds a [`Starting`] until its first chunk (the
/// sandbox's first line) or its end.
pub(crate) struct UntilFirstLine<S> {
    pub(crate) body: S,
    pub(crate) starting: Option<Starting>,
}

impl<S: futures::Stream + Unpin> futures::Stream for UntilFirstLine<S> {
    type Item = S::Item;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<S::Item>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_next(cx);
        if polled.is_ready() {
            self.starting = None;
        }
        polled
    }
}

impl Pool {
    /// A pool of at least `min` and at most `max.max(min)` warm sandboxes.
    pub(crate) fn new(min: usize, max: usize) -> Self {
        Pool {
            min,
            max: max.max(min),
            warm: Mutex::new(VecDeque::new()),
            demand: Mutex::new(Demand::new(max.max(min))),
            epoch: std::time::Instant::now(),
            refilling: AtomicBool::new(false),
            starting: AtomicUsize::new(0),
            started: tokio::sync::Notify::new(),
            draining: AtomicBool::new(false),
            refilled: tokio::sync::Notify::new(),
            taken: tokio::sync::Notify::new(),
        }
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// How many warm sandboxes the pool aims for now.
    pub(crate) fn target(&self) -> usize {
        let peak = self
            .demand
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .peak(self.now());
        peak.clamp(self.min, self.max)
    }

    /// A dispatch starts: refilling waits until the guard is dropped (at
    /// the sandbox's first line).
    pub(crate) fn starting(inner: &Arc<Inner>) -> Starting {
        inner.pool.starting.fetch_add(1, Ordering::AcqRel);
        Starting(Arc::clone(inner))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Booted>> {
        self.warm.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many warm sandboxes wait (for the metrics).
    pub(crate) fn warm(&self) -> usize {
        self.lock().len()
    }

    /// A warm sandbox that is still alive, if any. Counts as demand either way.
    pub(crate) fn take(&self, inner: &Arc<Inner>) -> Option<Booted> {
        self.demand
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(self.now());
        self.taken.notify_waiters();
        loop {
            let mut b = self.lock().pop_front()?;
            match b.child.try_wait() {
                Ok(None) => {
                    inner.sandbox.foreground(&b.slot.name);
                    return Some(b);
                }
                // It died waiting (killed from outside, out of memory): drop it.
                _ => drop(b.slot.cleanup(inner)),
            }
        }
    }

    /// Boots sandboxes until the pool holds its target, on a blocking
    /// thread; returns at once when a refill is already running.
    pub(crate) fn refill(inner: &Arc<Inner>) {
        if inner.pool.draining.load(Ordering::SeqCst) {
            return;
        }
        if inner.pool.refilling.swap(true, Ordering::SeqCst) {
            return; // the running loop fills up to the target
        }
        let inner = Arc::clone(inner);
        let handle = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            loop {
                let failed = Pool::fill(&inner, &handle);
                let pool = &inner.pool;
                pool.refilling.store(false, Ordering::SeqCst);
                // A sandbox taken after the last check but before the
                // release found the flag set: look once more.
                if failed
                    || pool.draining.load(Ordering::SeqCst)
                    || pool.lock().len() >= pool.target()
                    || pool.refilling.swap(true, Ordering::SeqCst)
                {
                    pool.refilled.notify_waiters();
                    return;
                }
            }
        });
    }

    /// The refill loop; true when a boot failed.
    fn fill(inner: &Arc<Inner>, handle: &tokio::runtime::Handle) -> bool {
        let pool = &inner.pool;
        while pool.lock().len() < pool.target() && !pool.draining.load(Ordering::SeqCst) {
            if !pool.wait_for_a_quiet_moment(handle) {
                return false; // draining
            }
            // One counter per process: two runners in one process (tests,
            // benches) must not name two sandboxes alike. A word drawn at
            // start after the pid: a killed runner's leftover cgroup must
            // not collide with a later runner given the same pid.
            static COUNTER: AtomicU64 = AtomicU64::new(0);
            static START: std::sync::LazyLock<u32> = std::sync::LazyLock::new(rand::random);
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let name = format!("warm-{}-{:08x}{n}", std::process::id(), *START);
            // Spawning needs the runtime's reactor (the child's pipes).
            let booted = {
                let _rt = handle.enter();
                boot(inner, POOL_DIR, &name)
            };
            match booted {
                Ok(b) => pool.lock().push_back(b),
                Err(e) => {
                    tracing::warn!(error = %e, "could not boot a warm sandbox");
                    return true;
                }
            }
        }
        false
    }

    /// Waits until a boot would not compete with a dispatch: none is
    /// starting, and unless fewer than half the target are warm, none was
    /// taken in the last [`REFILL_QUIET`] (its turn runs now). False when
    /// the pool is draining.
    fn wait_for_a_quiet_moment(&self, handle: &tokio::runtime::Handle) -> bool {
        loop {
            // Starting dispatches go first.
            while self.starting.load(Ordering::Acquire) > 0 {
                let done = self.started.notified();
                tokio::pin!(done);
                done.as_mut().enable();
                if self.starting.load(Ordering::Acquire) == 0 {
                    break;
                }
                handle.block_on(done);
            }
            // Registered before the look: a take (or the drain) after it
            // wakes the wait.
            let taken = self.taken.notified();
            tokio::pin!(taken);
            taken.as_mut().enable();
            if self.draining.load(Ordering::SeqCst) {
                return false;
            }
            let now = self.now();
            let since = self
                .demand
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .last_take()
                .map_or(REFILL_QUIET, |t| now.saturating_sub(t));
            // Bound first: a guard in the `match` would be held through
            // the wait, and a take would wait for the refill.
            let warm = self.lock().len();
            match quiet_wait(warm, self.target(), since) {
                None => return true,
                Some(wait) => {
                    let _ = handle.block_on(tokio::time::timeout(wait, taken));
                }
            }
        }
    }

    /// Ends every warm sandbox and removes its traces; no refill boots one
    /// after (a running refill loop finishes its boot first).
    pub(crate) async fn drain(inner: &Arc<Inner>) {
        let pool = &inner.pool;
        pool.draining.store(true, Ordering::SeqCst);
        // A refill waiting for a quiet moment sees the drain at once.
        pool.taken.notify_waiters();
        let done = pool.refilled.notified();
        tokio::pin!(done);
        done.as_mut().enable();
        if pool.refilling.load(Ordering::SeqCst) {
            done.await;
        }
        let warm: Vec<Booted> = pool.lock().drain(..).collect();
        for mut b in warm {
            // Closing stdin ends a waiting agent; SIGTERM ends the jail.
            drop(b.child.stdin.take());
            b.child.kill_tree().await;
            let _ = b.slot.cleanup(inner).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn demand_is_the_busiest_sliding_second_of_the_last_minute() {
        let mut d = Demand::new(1000);
        assert_eq!(d.peak(at(0)), 0);
        for _ in 0..5 {
            d.record(at(10_000));
        }
        // A burst of 200 across a clock second counts whole.
        for i in 0..200 {
            d.record(at(11_900 + i));
        }
        d.record(at(13_500));
        assert_eq!(d.peak(at(13_500)), 200);
        assert_eq!(d.peak(at(70_000)), 200, "still within the minute");
        d.record(at(75_000));
        assert_eq!(d.peak(at(75_000)), 1, "the burst is forgotten");
        assert_eq!(d.peak(at(200_000)), 0);
        assert_eq!(d.last_take(), Some(at(75_000)));
        assert_eq!(Demand::new(4).last_take(), None);
    }

    #[test]
    fn a_refill_waits_for_quiet_while_half_the_target_is_warm() {
        // The minimum pool of two, one just taken: the turn runs first.
        assert_eq!(quiet_wait(1, 2, at(0)), Some(at(50)));
        assert_eq!(quiet_wait(1, 2, at(20)), Some(at(30)));
        assert_eq!(quiet_wait(1, 2, at(50)), None, "quiet long enough");
        assert_eq!(quiet_wait(0, 2, at(0)), None, "none left: at once");
        // A pool grown to a burst refills at once below half its target.
        assert_eq!(quiet_wait(100, 200, at(1)), Some(at(49)));
        assert_eq!(quiet_wait(99, 200, at(1)), None);
    }

    #[test]
    fn demand_counts_no_more_than_its_cap() {
        let mut d = Demand::new(8);
        for i in 0..100 {
            d.record(at(i));
        }
        assert_eq!(d.peak(at(100)), 8);
    }

    #[test]
    fn the_target_follows_demand_within_the_bounds() {
        let pool = Pool::new(2, 64);
        assert_eq!(pool.target(), 2, "at rest: the minimum");
        let now = pool.now();
        {
            let mut d = pool.demand.lock().unwrap();
            for _ in 0..10 {
                d.record(now);
            }
        }
        assert_eq!(pool.target(), 10);
        {
            let mut d = pool.demand.lock().unwrap();
            for _ in 0..500 {
                d.record(now);
            }
        }
        assert_eq!(pool.target(), 64, "capped by the memory budget");
        assert_eq!(
            Pool::new(8, 4).target(),
            8,
            "the minimum wins over a smaller maximum"
        );
    }
}
