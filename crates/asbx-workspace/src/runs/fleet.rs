//! The operator's runner fleet: `SANDBOX_URL` may list several runners.
//!
//! A small cached view of each runner's free capacity (its `GET /healthz`:
//! `free`, or `capacity - sessions` from runners that predate `free`) is
//! refreshed in the background every [`REFRESH_EVERY`]; a dispatch only reads
//! it, so no dispatch waits on a health probe while the view is fresh. When
//! it is stale (the first dispatch, or the refresher fell behind) one probe
//! round with a [`PROBE_TIMEOUT`] runs first and starts the refresher.
//!
//! [`Fleet::order`] lists every runner once, the most free capacity first;
//! runners the view can't rank (unknown, equal) keep a round-robin order, and
//! those last seen full (`503`) or down (connect error) go last. The
//! dispatcher tries them in that order (docs/protocol.md §4: a `503` or a
//! refused connection happens before any line, so nothing was started).

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Mutex as AsyncMutex;
use url::Url;

use crate::runner_url;

/// How often the background task refreshes the view.
const REFRESH_EVERY: Duration = Duration::from_secs(2);
/// The longest a probe of one runner may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// A view older than this is refreshed before a dispatch reads it.
const STALE_AFTER: Duration = Duration::from_secs(5);

/// `free` when nothing is known about a runner yet.
const UNKNOWN: i64 = -1;
/// `free` of a runner that answered `503` or `/healthz` said is full.
const FULL: i64 = -2;
/// `free` of a runner that refused the connection or timed out.
const DOWN: i64 = -3;

/// One runner and what was last learnt of it.
#[derive(Debug)]
struct Member {
    url: Url,
    /// Free sandboxes, or [`UNKNOWN`], [`FULL`], [`DOWN`]; a dispatch sent
    /// there takes one off until the next refresh, so a burst spreads.
    free: AtomicI64,
}

#[derive(Debug)]
pub(crate) struct Fleet {
    members: Vec<Member>,
    /// The round-robin cursor ties are broken with.
    next: AtomicUsize,
    /// When the view was last refreshed, in ms since `born` (`-1`: never);
    /// a dispatch reads it without a lock.
    refreshed_ms: AtomicI64,
    born: Instant,
    /// Held while an on-demand refresh runs, so concurrent dispatches on a
    /// stale view wait for one probe round, not one each.
    refreshing: AsyncMutex<()>,
    /// The background refresher has been started.
    refresher: std::sync::Once,
    client: reqwest::Client,
}

impl Fleet {
    pub(crate) fn new(urls: &[Url], client: reqwest::Client) -> Fleet {
        Fleet {
            members: urls
                .iter()
                .map(|url| Member {
                    url: url.clone(),
                    free: AtomicI64::new(UNKNOWN),
                })
                .collect(),
            next: AtomicUsize::new(0),
            refreshed_ms: AtomicI64::new(-1),
            born: Instant::now(),
            refreshing: AsyncMutex::new(()),
            refresher: std::sync::Once::new(),
            client,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// Every runner once, in the order a dispatch should try them. Starts the
    /// background refresher on first use and refreshes a stale view first.
    pub(crate) async fn order(self: &Arc<Self>) -> Vec<Url> {
        self.refresher.call_once(|| {
            let weak = Arc::downgrade(self);
            tokio::spawn(refresh_loop(weak));
        });
        if self.is_stale() {
            let _one_round = self.refreshing.lock().await;
            if self.is_stale() {
                self.probe_all().await;
            }
        }
        self.ranked()
    }

    /// The members ranked by the cached view, ties in round-robin order.
    fn ranked(&self) -> Vec<Url> {
        let n = self.members.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n.max(1);
        let mut order: Vec<(i64, &Member)> = (0..n)
            .map(|i| {
                let m = &self.members[(start + i) % n];
                (rank(m.free.load(Ordering::Relaxed)), m)
            })
            .collect();
        // Stable: equal ranks keep the rotated (round-robin) order.
        order.sort_by_key(|(r, _)| std::cmp::Reverse(*r));
        order.into_iter().map(|(_, m)| m.url.clone()).collect()
    }

    /// A dispatch streamed from `url`: one sandbox fewer is free there.
    pub(crate) fn took_one(&self, url: &Url) {
        if let Some(m) = self.member(url) {
            let _ = m
                .free
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |f| {
                    (f > 0).then(|| f - 1)
                });
        }
    }

    /// `url` answered `503`: full until a refresh says otherwise.
    pub(crate) fn mark_full(&self, url: &Url) {
        if let Some(m) = self.member(url) {
            m.free.store(FULL, Ordering::Relaxed);
        }
    }

    /// `url` refused the connection: down until a refresh says otherwise.
    pub(crate) fn mark_down(&self, url: &Url) {
        if let Some(m) = self.member(url) {
            m.free.store(DOWN, Ordering::Relaxed);
        }
    }

    fn member(&self, url: &Url) -> Option<&Member> {
        self.members.iter().find(|m| &m.url == url)
    }

    fn is_stale(&self) -> bool {
        let at = self.refreshed_ms.load(Ordering::Acquire);
        at < 0 || self.age_ms().saturating_sub(at) > millis(STALE_AFTER)
    }

    fn age_ms(&self) -> i64 {
        millis(self.born.elapsed())
    }

    /// Probes every runner at once, each within [`PROBE_TIMEOUT`].
    async fn probe_all(&self) {
        let probes = self.members.iter().map(|m| async {
            let free = probe(&self.client, &m.url).await;
            m.free.store(free, Ordering::Relaxed);
        });
        futures::future::join_all(probes).await;
        self.refreshed_ms.store(self.age_ms(), Ordering::Release);
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Higher is tried first: known free capacity, then unknown, then none
/// left by our own count, then full (it said so), then down.
fn rank(free: i64) -> i64 {
    match free {
        f if f > 0 => f + 1,
        0 => -1,
        FULL => -2,
        DOWN => -3,
        _ => 0,
    }
}

/// One runner's free sandboxes from its `GET /healthz`.
async fn probe(client: &reqwest::Client, url: &Url) -> i64 {
    let Ok(endpoint) = runner_url::join(url, &["healthz"]) else {
        return DOWN;
    };
    let answer = client.get(endpoint).timeout(PROBE_TIMEOUT).send().await;
    let Ok(response) = answer else {
        return DOWN;
    };
    if response.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE {
        return FULL;
    }
    if !response.status().is_success() {
        return UNKNOWN;
    }
    match runner_url::read_json::<serde_json::Value>(response).await {
        Some(health) => free_of(&health),
        None => UNKNOWN,
    }
}

/// `free`, else `capacity - sessions`; [`UNKNOWN`] when neither is there.
fn free_of(health: &serde_json::Value) -> i64 {
    let field = |name: &str| health.get(name).and_then(serde_json::Value::as_i64);
    let free = field("free").or_else(|| Some(field("capacity")? - field("sessions")?));
    match free {
        Some(f) if f > 0 => f,
        Some(_) => FULL,
        None => UNKNOWN,
    }
}

/// Refreshes the view every [`REFRESH_EVERY`] until the fleet is dropped.
async fn refresh_loop(fleet: Weak<Fleet>) {
    // The first dispatch probed just now: no immediate second round, which
    // could finish after that dispatch learnt a runner is full (a `503`)
    // and put back the runner's older `/healthz` view.
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + REFRESH_EVERY, REFRESH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(fleet) = fleet.upgrade() else {
            return;
        };
        fleet.probe_all().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(n: usize) -> Fleet {
        let urls: Vec<Url> = (0..n)
            .map(|i| Url::parse(&format!("http://127.0.0.1:{}", 10_000 + i)).unwrap())
            .collect();
        Fleet::new(&urls, reqwest::Client::new())
    }

    #[test]
    fn most_free_first_full_and_down_last_ties_round_robin() {
        let f = fleet(3);
        let [a, b, c] = [0, 1, 2].map(|i| f.members[i].url.clone());
        // Nothing known: plain round-robin.
        assert_eq!(f.ranked(), [a.clone(), b.clone(), c.clone()]);
        assert_eq!(f.ranked(), [b.clone(), c.clone(), a.clone()]);
        f.members[0].free.store(1, Ordering::Relaxed);
        f.members[1].free.store(5, Ordering::Relaxed);
        f.mark_down(&c);
        assert_eq!(f.ranked(), [b.clone(), a.clone(), c.clone()]);
        f.mark_full(&b);
        assert_eq!(f.ranked(), [a.clone(), b.clone(), c.clone()]);
        // Taking the last free sandbox of `a` by our count still ranks it
        // above `b`, which said it is full.
        f.took_one(&a);
        assert_eq!(f.members[0].free.load(Ordering::Relaxed), 0);
        assert_eq!(f.ranked(), [a.clone(), b.clone(), c.clone()]);
        assert_eq!(f.ranked(), [a.clone(), b.clone(), c.clone()]);
    }

    #[test]
    fn free_capacity_is_read_from_healthz() {
        use serde_json::json;
        assert_eq!(
            free_of(&json!({"free": 3, "capacity": 9, "sessions": 9})),
            3
        );
        assert_eq!(free_of(&json!({"capacity": 4, "sessions": 1})), 3);
        assert_eq!(free_of(&json!({"capacity": 4, "sessions": 4})), FULL);
        assert_eq!(free_of(&json!({"status": "ok"})), UNKNOWN);
    }
}
