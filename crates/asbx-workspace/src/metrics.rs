//! The workspace's Prometheus metrics, served at `GET /metrics` in the text
//! exposition format (`prometheus-client`, written as the Prometheus text
//! format 0.0.4).
//!
//! Who may scrape: with `ASBX_METRICS_TOKEN` set, only a request with
//! `Authorization: Bearer <token>` (compared in constant time); without it,
//! anyone who reaches the server while `require_auth` is off (a loopback
//! server: a public one needs `require_auth`), and nobody (`403`) while it
//! is on.
//!
//! One process-wide set of atomics ([`METRICS`]): chat turns by how they
//! ended, quota refusals by quota name (never by workspace), and the
//! database's latency: a `SELECT 1` round trip timed on every
//! scrape (so it is measured as often as it is read, with no sampler task)
//! and the pool's open and idle connections.

use std::sync::{Arc, LazyLock};
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use sha2::{Digest, Sha256};

use crate::AppState;
use crate::apidoc as doc;
use crate::error::WorkspaceError;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TurnLabels {
    /// `succeeded`, `failed`, `cancelled`, or `rejected` (refused before
    /// it ran: a turn already in flight, a runner that said no).
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuotaLabels {
    /// The quota's name (`concurrent-sandboxes`, ...); never the workspace
    /// (cardinality).
    quota: &'static str,
}

/// Every metric of the workspace, registered once.
pub(crate) struct Metrics {
    registry: Registry,
    chat_turns: Family<TurnLabels, Counter>,
    quota_refusals: Family<QuotaLabels, Counter>,
    reattaches: Counter,
    db_ping: Histogram,
    db_errors: Counter,
    db_connections: Gauge,
    db_idle: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// The workspace's metrics.
pub(crate) static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

impl Metrics {
    fn new() -> Self {
        let mut m = Metrics {
            registry: Registry::with_prefix("asbx_workspace"),
            chat_turns: Family::default(),
            quota_refusals: Family::default(),
            reattaches: Counter::default(),
            // 0.1 ms .. ~1.6 s.
            db_ping: Histogram::new(exponential_buckets(0.0001, 2.0, 15)),
            db_errors: Counter::default(),
            db_connections: Gauge::default(),
            db_idle: Gauge::default(),
        };
        let r = &mut m.registry;
        r.register(
            "chat_turns",
            "Chat turns by how they ended",
            m.chat_turns.clone(),
        );
        r.register(
            "quota_refusals",
            "Requests refused by a quota, by the quota's name (all workspaces)",
            m.quota_refusals.clone(),
        );
        r.register(
            "runner_reattaches",
            "Streams from a runner re-attached after they broke or were taken over",
            m.reattaches.clone(),
        );
        r.register(
            "db_ping_seconds",
            "Database round trip (SELECT 1), timed on each scrape",
            m.db_ping.clone(),
        );
        r.register(
            "db_ping_errors",
            "Database round trips that failed",
            m.db_errors.clone(),
        );
        r.register(
            "db_connections",
            "Open database connections",
            m.db_connections.clone(),
        );
        r.register(
            "db_connections_idle",
            "Idle database connections",
            m.db_idle.clone(),
        );
        m
    }

    /// A chat turn ended (or was refused) with this status.
    pub(crate) fn chat_turn(&self, status: &'static str) {
        self.chat_turns.get_or_create(&TurnLabels { status }).inc();
    }

    /// A request was refused by `quota` (`quota::refused`).
    pub(crate) fn quota_refused(&self, quota: &'static str) {
        self.quota_refusals
            .get_or_create(&QuotaLabels { quota })
            .inc();
    }

    /// A node re-attached to a runner's session (`runs::reattach`).
    pub(crate) fn reattached(&self) {
        self.reattaches.inc();
    }

    fn render(&self) -> String {
        let mut out = String::with_capacity(4 * 1024);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        asbx_protocol::exposition::to_prometheus_text(&out)
    }
}

/// `GET /metrics`.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "meta",
    security((), ("metrics_token" = [])),
    responses(
        (status = 200, description = "Prometheus text exposition", body = String, content_type = "text/plain; version=0.0.4; charset=utf-8"),
        (status = 401, description = "`unauthorized`: the metrics token is missing or wrong", body = doc::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: no metrics token is set and the caller is not on loopback", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn serve(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Response, WorkspaceError> {
    match &state.config.metrics_token {
        Some(want) => {
            let got = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            if !got.is_some_and(|g| same_secret(g, want)) {
                return Err(WorkspaceError::Unauthorized);
            }
        }
        None if state.config.require_auth => {
            return Err(WorkspaceError::Forbidden(
                "/metrics needs ASBX_METRICS_TOKEN when ASBX_REQUIRE_AUTH is on".to_owned(),
            ));
        }
        None => {}
    }
    let m = &*METRICS;
    let pool = state.store.pool();
    let started = Instant::now();
    match sqlx::query("SELECT 1").execute(pool).await {
        Ok(_) => m.db_ping.observe(started.elapsed().as_secs_f64()),
        Err(e) => {
            tracing::warn!(error = %e, "the metrics' database round trip failed");
            m.db_errors.inc();
        }
    }
    m.db_connections.set(i64::from(pool.size()));
    m.db_idle.set(pool.num_idle() as i64);
    Ok(Response::builder()
        .header(
            header::CONTENT_TYPE,
            asbx_protocol::exposition::CONTENT_TYPE,
        )
        .body(Body::from(m.render()))
        .unwrap_or_default())
}

/// Compares two secrets in constant time (their SHA-256, so the length
/// leaks nothing either).
fn same_secret(got: &str, want: &str) -> bool {
    let (a, b) = (Sha256::digest(got), Sha256::digest(want));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("s3cret", "s3cret"));
        assert!(!same_secret("s3cret", "s3creT"));
        assert!(!same_secret("s3cret", "s3cret2"));
        assert!(!same_secret("", "x"));
    }

    #[test]
    fn turns_are_counted_by_status() {
        let m = Metrics::new();
        m.chat_turn("succeeded");
        m.chat_turn("succeeded");
        m.chat_turn("rejected");
        m.quota_refused("tokens-per-day");
        let text = m.render();
        assert!(text.contains("asbx_workspace_quota_refusals_total{quota=\"tokens-per-day\"} 1"));
        assert!(text.contains("asbx_workspace_chat_turns_total{status=\"succeeded\"} 2"));
        assert!(text.contains("asbx_workspace_chat_turns_total{status=\"rejected\"} 1"));
        assert!(text.contains("asbx_workspace_db_ping_seconds_count 0"));
    }
}
