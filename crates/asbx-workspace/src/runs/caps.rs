//! Each runner's runtime cap, learnt from its `GET /healthz`
//! (`max_duration_ms`: the longest a run may last there, which the runner
//! derives from `ASBX_MAX_RUNTIME_SEC`), cached per runner URL.
//!
//! Token lifetimes follow a dispatch's real cap (docs/protocol.md §3): a
//! run's own `limits.max_duration_ms` clamped by its runner's cap. The cap is
//! read from the runner rather than from a workspace setting, since the
//! runner is what ends a sandbox at its cap: a second setting on the
//! workspace would be one rule in two homes, free to drift. [`RunnerCaps::of`]
//! runs while a dispatch is routed, before its transaction: a cached cap
//! younger than [`FRESH_FOR`] is used as it is, otherwise one probe with a
//! [`PROBE_TIMEOUT`]. A runner whose cap is unknown (unreachable, or older
//! than the field) counts as the protocol's default cap (8 h), the longest
//! a run may last anywhere, so no legitimate callback is ever refused for
//! want of an answer.
//!
//! The same probe reads the runner's `capacity` (its `ASBX_MAX_SANDBOXES`),
//! which [`RunnerCaps::capacity`] sums over the operator's runners for the
//! fair share of the fleet (`quota::fair`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use url::Url;

use crate::runner_url;

/// How long a learnt cap is used without asking again.
const FRESH_FOR: Duration = Duration::from_secs(60);
/// The longest one probe may take (a dispatch waits for it).
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// The cached caps, by runner URL.
#[derive(Debug, Default)]
pub(crate) struct RunnerCaps {
    known: Mutex<HashMap<Url, (Health, Instant)>>,
}

impl RunnerCaps {
    /// The cap a dispatch to any of `runners` may run under: the largest of
    /// theirs (it may go to any of them), `None` when one is unknown.
    pub(crate) async fn of(&self, client: &reqwest::Client, runners: &[Url]) -> Option<u64> {
        let mut most = 0u64;
        for url in runners {
            most = most.max(self.health(client, url).await.cap_ms?);
        }
        (!runners.is_empty()).then_some(most)
    }

    /// The sandboxes `runners` hold together (each one's `/healthz`
    /// `capacity`); `None` when any is unknown.
    pub(crate) async fn capacity(&self, client: &reqwest::Client, runners: &[Url]) -> Option<u64> {
        let mut sum = 0u64;
        for url in runners {
            sum = sum.saturating_add(self.health(client, url).await.capacity?);
        }
        (!runners.is_empty()).then_some(sum)
    }

    /// What `url`'s `/healthz` said, fresh or probed now.
    async fn health(&self, client: &reqwest::Client, url: &Url) -> Health {
        match self.fresh(url) {
            Some(health) => health,
            None => {
                let health = probe(client, url).await;
                self.store(url, health);
                health
            }
        }
    }

    pub(crate) fn cached(&self, url: &Url) -> Option<u64> {
        self.lock().get(url).and_then(|(health, _)| health.cap_ms)
    }

    fn fresh(&self, url: &Url) -> Option<Health> {
        self.lock()
            .get(url)
            .filter(|(_, at)| at.elapsed() < FRESH_FOR)
            .map(|(health, _)| *health)
    }

    fn store(&self, url: &Url, health: Health) {
        self.lock().insert(url.clone(), (health, Instant::now()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Url, (Health, Instant)>> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// `max_duration_ms` of `url`'s `GET /healthz`, if it answers one.
/// What a runner's `/healthz` says that the workspace uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Health {
    /// `max_duration_ms`.
    cap_ms: Option<u64>,
    /// `capacity`.
    capacity: Option<u64>,
}

async fn probe(client: &reqwest::Client, url: &Url) -> Health {
    let Ok(endpoint) = runner_url::join(url, &["healthz"]) else {
        return Health::default();
    };
    let response = match client.get(endpoint).timeout(PROBE_TIMEOUT).send().await {
        Ok(r) if r.status().is_success() => r,
        _ => return Health::default(),
    };
    match runner_url::read_json::<serde_json::Value>(response).await {
        Some(health) => Health {
            cap_ms: cap_of(&health),
            capacity: health.get("capacity").and_then(serde_json::Value::as_u64),
        },
        None => Health::default(),
    }
}

fn cap_of(health: &serde_json::Value) -> Option<u64> {
    health
        .get("max_duration_ms")
        .and_then(serde_json::Value::as_u64)
        .filter(|ms| *ms > 0)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_cap_is_read_from_healthz() {
        assert_eq!(cap_of(&json!({"max_duration_ms": 2000})), Some(2000));
        assert_eq!(cap_of(&json!({"max_duration_ms": 0})), None);
        assert_eq!(cap_of(&json!({"status": "ok"})), None);
    }

    fn health(cap_ms: Option<u64>, capacity: Option<u64>) -> Health {
        Health { cap_ms, capacity }
    }

    #[tokio::test]
    async fn an_unknown_runner_makes_the_cap_and_the_capacity_unknown() {
        let caps = RunnerCaps::default();
        let a = Url::parse("http://127.0.0.1:9/a").unwrap();
        let b = Url::parse("http://127.0.0.1:9/b").unwrap();
        caps.store(&a, health(Some(2000), Some(4)));
        caps.store(&b, health(Some(5000), Some(6)));
        let client = reqwest::Client::new();
        assert_eq!(caps.of(&client, std::slice::from_ref(&a)).await, Some(2000));
        assert_eq!(caps.of(&client, &[a.clone(), b.clone()]).await, Some(5000));
        assert_eq!(
            caps.capacity(&client, &[a.clone(), b.clone()]).await,
            Some(10)
        );
        caps.store(&b, health(None, None));
        assert_eq!(caps.of(&client, &[a.clone(), b.clone()]).await, None);
        assert_eq!(caps.capacity(&client, &[a.clone(), b]).await, None);
        assert_eq!(caps.cached(&a), Some(2000));
    }
}
