//! A fair share of the fleet (CONTRACT §10): the default of
//! `concurrent-sandboxes` when neither `ASBX_QUOTA_CONCURRENT_SANDBOXES`
//! nor a workspace's override sets it.
//!
//! - **The share.** A workspace holds at most half of the runners'
//!   capacity (at least one sandbox), so another workspace always finds
//!   room within a second, without preempting anything. The capacity is
//!   the sum of the operator's runners' `/healthz` `capacity`, as the
//!   dispatcher's cache last read it; unknown, there is no share.
//! - **Waiting.** A dispatch over its share, or one that finds the fleet
//!   full, waits (at most `ASBX_QUEUE_WAIT_MS`) instead of being refused at
//!   once. Waiters are woken round-robin across workspaces, not first come
//!   first served: a sandbox freed on this node wakes the first waiter of
//!   the next workspace in the ring. A waiter also looks again every
//!   [`RECHECK`], since sandboxes freed on other nodes send no event here.
//! - **Giving up.** Past the wait the dispatch is `429 quota_exceeded`
//!   (`concurrent-sandboxes`) with `Retry-After`.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::oneshot;

/// How often a waiter looks again without an event.
pub(crate) const RECHECK: Duration = Duration::from_millis(500);

/// The most sandboxes one workspace may hold of a fleet of `capacity`:
/// half, and at least one.
pub(crate) fn share(capacity: u64) -> u64 {
    (capacity / 2).max(1)
}

/// Whether a workspace holding `mine` of a fleet of `capacity` where
/// `total` run may start one more: under its share, and the fleet not full.
pub(crate) fn may_start(mine: u64, total: u64, capacity: u64) -> bool {
    mine < share(capacity) && total < capacity
}

/// The waiters of this node, by workspace, and the order workspaces are
/// served in.
#[derive(Debug, Default)]
pub(crate) struct FairQueue {
    inner: Mutex<Waiting>,
}

#[derive(Debug, Default)]
struct Waiting {
    /// Workspaces with waiters, the next to serve first.
    ring: VecDeque<String>,
    /// Each workspace's waiters, first come first.
    queues: HashMap<String, VecDeque<(u64, oneshot::Sender<()>)>>,
    next_ticket: u64,
}

/// A place in the queue; leaving it (drop) takes it out.
#[derive(Debug)]
pub(crate) struct Ticket<'q> {
    queue: &'q FairQueue,
    workspace: String,
    id: u64,
    woken: oneshot::Receiver<()>,
}

impl Ticket<'_> {
    /// Waits until this waiter is woken (`true`: the ticket is spent, join
    /// again to wait more) or `timeout` passes (`false`).
    pub(crate) async fn wait(&mut self, timeout: Duration) -> bool {
        matches!(
            tokio::time::timeout(timeout, &mut self.woken).await,
            Ok(Ok(()))
        )
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.queue.leave(&self.workspace, self.id);
    }
}

impl FairQueue {
    /// Queues a waiter of `workspace`.
    pub(crate) fn join(&self, workspace: &str) -> Ticket<'_> {
        let (tx, rx) = oneshot::channel();
        let mut w = self.lock();
        w.next_ticket += 1;
        let id = w.next_ticket;
        let queue = w.queues.entry(workspace.to_owned()).or_default();
        queue.push_back((id, tx));
        if queue.len() == 1 {
            w.ring.push_back(workspace.to_owned());
        }
        Ticket {
            queue: self,
            workspace: workspace.to_owned(),
            id,
            woken: rx,
        }
    }

    /// Whether a workspace other than `workspace` has a waiter here.
    pub(crate) fn others_waiting(&self, workspace: &str) -> bool {
        self.lock().ring.iter().any(|w| w != workspace)
    }

    /// Wakes the first waiter of the next workspace in the ring, which
    /// then goes to the ring's end if it has more. Whether one was woken.
    pub(crate) fn wake_next(&self) -> bool {
        let mut w = self.lock();
        while let Some(workspace) = w.ring.pop_front() {
            let Some(queue) = w.queues.get_mut(&workspace) else {
                continue;
            };
            let woken = queue.pop_front();
            let more = !queue.is_empty();
            if more {
                w.ring.push_back(workspace);
            } else {
                w.queues.remove(&workspace);
            }
            if let Some((_, tx)) = woken
                && tx.send(()).is_ok()
            {
                return true;
            }
        }
        false
    }

    fn leave(&self, workspace: &str, id: u64) {
        let mut w = self.lock();
        let Some(queue) = w.queues.get_mut(workspace) else {
            return;
        };
        queue.retain(|(t, _)| *t != id);
        if queue.is_empty() {
            w.queues.remove(workspace);
            w.ring.retain(|r| r != workspace);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_gets_half_the_fleet_and_at_least_one() {
        assert_eq!(share(4), 2);
        assert_eq!(share(5), 2);
        assert_eq!(share(1), 1);
        assert_eq!(share(0), 1);
        assert!(may_start(1, 3, 4));
        assert!(!may_start(2, 2, 4), "over its share");
        assert!(!may_start(0, 4, 4), "the fleet is full");
    }

    #[tokio::test]
    async fn waiters_are_woken_round_robin_across_workspaces() {
        let q = FairQueue::default();
        let mut a1 = q.join("a");
        let mut a2 = q.join("a");
        let a3 = q.join("a");
        let mut b1 = q.join("b");
        assert!(q.others_waiting("a"));
        assert!(q.others_waiting("c"));
        // a came first, then b, then a again: not a, a, a, b.
        assert!(q.wake_next());
        assert!(a1.woken.try_recv().is_ok(), "a's first waiter is first");
        assert!(q.wake_next());
        assert!(b1.woken.try_recv().is_ok(), "b's waiter is second");
        assert!(a2.woken.try_recv().is_err(), "a's second waits its turn");
        assert!(q.wake_next());
        assert!(a2.woken.try_recv().is_ok());
        // a's third is the only waiter left; leaving takes it out.
        assert!(!q.others_waiting("a"));
        assert!(q.others_waiting("b"));
        drop(a3);
        assert!(!q.wake_next(), "nobody left to wake");
        assert!(!q.others_waiting("z"));
        // A woken waiter's wait returns at once.
        let mut t = q.join("c");
        assert!(q.wake_next());
        let woken = tokio::time::timeout(Duration::from_secs(1), t.wait(Duration::from_secs(60)));
        assert!(woken.await.unwrap());
        let mut idle = q.join("d");
        assert!(
            !idle.wait(Duration::from_millis(10)).await,
            "nobody woke it"
        );
    }
}
