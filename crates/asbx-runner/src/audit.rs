//! What the runner reports to the workspace's audit log (docs/api-audit.md):
//! the egress proxy's requests and the gateway's model calls, which the
//! sandbox can neither forge nor suppress, since they happen here.
//!
//! A dispatch from the workspace carries an audit token in the
//! `x-asbx-audit-token` header (never in the body, so it never reaches
//! the agent's bootstrap, and an older runner ignores it and reports
//! nothing). Events of one session are kept in a bounded buffer
//! ([`MAX_PENDING`]; past it they are counted and reported as one
//! `dropped` event) and posted to `{agent_url}/audit` at least every
//! second and once more when the session ends.
//!
//! The hot path is one small struct pushed under a mutex per request; a
//! tunnel's byte counts are taken when it closes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use asbx_protocol::audit::{
    AUDIT_VERSION, AUDIT_VERSION_HEADER, AuditEvent, MAX_BATCH_EVENTS, RunnerAuditBatch,
};
use tokio_util::sync::CancellationToken;

/// Most events one session holds before it counts the rest as dropped.
const MAX_PENDING: usize = 10_000;
/// How often a session's events are posted.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// After the session stops: how long the last tunnels get to close.
const FINAL_GRACE: Duration = Duration::from_millis(200);

/// One session's audit events on their way to the workspace.
#[derive(Debug, Default)]
pub(crate) struct AuditLog {
    pending: std::sync::Mutex<Vec<AuditEvent>>,
    dropped: AtomicU64,
}

impl AuditLog {
    /// Keeps `event` for the next post (or counts it dropped when full).
    pub(crate) fn push(&self, event: AuditEvent) {
        let mut pending = self.lock();
        if pending.len() >= MAX_PENDING {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            pending.push(event);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<AuditEvent>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What is pending, with a `dropped` event when some were.
    fn take(&self) -> Vec<AuditEvent> {
        let mut events = std::mem::take(&mut *self.lock());
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            events.push(AuditEvent::Dropped { count: dropped });
        }
        events
    }

    /// Starts posting this session's events to `{agent_url}/audit` with
    /// `token` until `stop`, then posts the rest.
    pub(crate) fn start(
        client: reqwest::Client,
        agent_url: &str,
        token: String,
        stop: CancellationToken,
    ) -> Arc<AuditLog> {
        let log = Arc::new(AuditLog::default());
        let url = format!("{}/audit", agent_url.trim_end_matches('/'));
        let this = Arc::clone(&log);
        tokio::spawn(async move {
            loop {
                let stopped = tokio::select! {
                    _ = tokio::time::sleep(FLUSH_EVERY) => false,
                    _ = stop.cancelled() => true,
                };
                if stopped {
                    tokio::time::sleep(FINAL_GRACE).await;
                }
                let events = this.take();
                post(&client, &url, &token, events).await;
                if stopped {
                    return;
                }
            }
        });
        log
    }
}

/// Posts `events` in batches; a failed batch is logged and lost (the
/// workspace's chain never has holes, only fewer records).
async fn post(client: &reqwest::Client, url: &str, token: &str, events: Vec<AuditEvent>) {
    for chunk in events.chunks(MAX_BATCH_EVENTS) {
        let batch = RunnerAuditBatch {
            events: chunk.to_vec(),
        };
        let sent = client
            .post(url)
            .bearer_auth(token)
            .header(AUDIT_VERSION_HEADER, AUDIT_VERSION.to_string())
            .json(&batch)
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => {
                tracing::warn!(status = %r.status(), events = chunk.len(), "audit report refused")
            }
            Err(e) => tracing::warn!(error = %e, events = chunk.len(), "audit report failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_bound_events_are_counted_as_dropped() {
        let log = AuditLog::default();
        for _ in 0..MAX_PENDING + 3 {
            log.push(AuditEvent::Dropped { count: 0 });
        }
        let events = log.take();
        assert_eq!(events.len(), MAX_PENDING + 1);
        assert_eq!(events.last(), Some(&AuditEvent::Dropped { count: 3 }));
        assert!(log.take().is_empty());
    }
}
