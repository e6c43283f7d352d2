//! The runner's Prometheus metrics, served at `GET /metrics` in the text
//! exposition format (`prometheus-client`, written as the Prometheus text
//! format 0.0.4).
//!
//! One process-wide set of atomics ([`METRICS`]): a call site adds to a
//! counter without a handle threaded through it, and nothing on the line
//! path takes a lock or allocates: lines and bytes are added once per chunk
//! the runner sends, dispatches and the time to the first line once per
//! session, tool calls once per finished step (the label set is the step's
//! own name, moved, so a known name costs a read lock on its family only).
//! Label values an agent chooses (tool names) are bounded: at most
//! [`MAX_TOOL_NAMES`] distinct names, then `other`.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Distinct tool names counted before the rest go to `other`.
pub(crate) const MAX_TOOL_NAMES: usize = 64;
/// Longest tool name kept as a label value.
const MAX_TOOL_NAME_LEN: usize = 64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DispatchLabels {
    /// `completed`, `agent_error`, `crashed`, `cancelled`, `runtime_cap`,
    /// or `refused` (the `/stream` request was answered with a problem).
    outcome: &'static str,
    /// The error code (docs/protocol.md §3), `none` for `completed`.
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EgressLabels {
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabels {
    provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    provider: String,
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    name: String,
    status: &'static str,
}

/// Every metric of the runner, registered once.
pub(crate) struct Metrics {
    registry: Registry,
    sandboxes_live: Gauge,
    sandboxes_warm: Gauge,
    dispatches: Family<DispatchLabels, Counter>,
    first_line: Histogram,
    duration: Histogram,
    lines: Counter,
    bytes: Counter,
    egress: Family<EgressLabels, Counter>,
    model_calls: Family<ProviderLabels, Counter>,
    tokens: Family<TokenLabels, Counter>,
    tool_calls: Family<ToolLabels, Counter>,
    /// Label sets `tool_calls` was asked to add (its bound).
    tool_series: AtomicUsize,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// The runner's metrics.
pub(crate) static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

impl Metrics {
    fn new() -> Self {
        let m = Metrics {
            registry: Registry::with_prefix("asbx_runner"),
            sandboxes_live: Gauge::default(),
            sandboxes_warm: Gauge::default(),
            dispatches: Family::default(),
            // 5 ms .. ~82 s.
            first_line: Histogram::new(exponential_buckets(0.005, 2.0, 15)),
            // 50 ms .. ~27 min.
            duration: Histogram::new(exponential_buckets(0.05, 2.0, 16)),
            lines: Counter::default(),
            bytes: Counter::default(),
            egress: Family::default(),
            model_calls: Family::default(),
            tokens: Family::default(),
            tool_calls: Family::default(),
            tool_series: AtomicUsize::new(0),
        };
        let mut m = m;
        let r = &mut m.registry;
        r.register(
            "sandboxes_live",
            "Sessions running now",
            m.sandboxes_live.clone(),
        );
        r.register(
            "sandboxes_warm",
            "Warm-pool sandboxes booted and waiting",
            m.sandboxes_warm.clone(),
        );
        r.register(
            "dispatches",
            "Dispatches by how they ended (outcome) and error code",
            m.dispatches.clone(),
        );
        r.register(
            "time_to_first_line_seconds",
            "From the dispatch's start to the first line sent",
            m.first_line.clone(),
        );
        r.register(
            "dispatch_duration_seconds",
            "From the dispatch's start to its end",
            m.duration.clone(),
        );
        r.register(
            "lines_streamed",
            "NDJSON lines stamped for clients",
            m.lines.clone(),
        );
        r.register(
            "bytes_streamed",
            "Bytes of NDJSON sent to clients",
            m.bytes.clone(),
        );
        r.register(
            "egress_requests",
            "Egress proxy requests by decision (allowed or refused)",
            m.egress.clone(),
        );
        r.register(
            "model_calls",
            "Model calls the gateway forwarded, by provider",
            m.model_calls.clone(),
        );
        r.register(
            "model_tokens",
            "Model tokens the agents reported, by provider and direction",
            m.tokens.clone(),
        );
        r.register(
            "tool_calls",
            "Finished tool steps by tool name and status",
            m.tool_calls.clone(),
        );
        m
    }

    /// The exposition, with the gauges read now.
    pub(crate) fn render(&self, live: usize, warm: usize) -> String {
        self.sandboxes_live.set(live as i64);
        self.sandboxes_warm.set(warm as i64);
        let mut out = String::with_capacity(8 * 1024);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        asbx_protocol::exposition::to_prometheus_text(&out)
    }

    /// A dispatch ended (`code` is `none` when it completed).
    pub(crate) fn dispatch_ended(&self, outcome: &'static str, code: &str, took: Duration) {
        self.dispatches
            .get_or_create(&DispatchLabels {
                outcome,
                code: code.to_owned(),
            })
            .inc();
        self.duration.observe(took.as_secs_f64());
    }

    /// A `/stream` request answered with a problem before a session ran.
    pub(crate) fn dispatch_refused(&self, code: String) {
        self.dispatches
            .get_or_create(&DispatchLabels {
                outcome: "refused",
                code,
            })
            .inc();
    }

    pub(crate) fn first_line(&self, after: Duration) {
        self.first_line.observe(after.as_secs_f64());
    }

    /// One chunk sent (or recorded): its lines and bytes.
    pub(crate) fn streamed(&self, lines: u64, bytes: usize) {
        self.lines.inc_by(lines);
        self.bytes.inc_by(bytes as u64);
    }

    pub(crate) fn egress(&self, allowed: bool) {
        let decision = if allowed { "allowed" } else { "refused" };
        self.egress.get_or_create(&EgressLabels { decision }).inc();
    }

    pub(crate) fn model_call(&self, provider: &str) {
        self.model_calls
            .get_or_create(&ProviderLabels {
                provider: provider.to_owned(),
            })
            .inc();
    }

    pub(crate) fn tokens(&self, provider: &str, input: u64, output: u64) {
        for (direction, n) in [("input", input), ("output", output)] {
            if n > 0 {
                self.tokens
                    .get_or_create(&TokenLabels {
                        provider: provider.to_owned(),
                        direction,
                    })
                    .inc_by(n);
            }
        }
    }

    /// A step finished; `name` is the step's own (moved, not copied, unless
    /// it is new to the family).
    pub(crate) fn tool_call(&self, mut name: String, succeeded: bool) {
        let status = if succeeded { "succeeded" } else { "failed" };
        if name.len() > MAX_TOOL_NAME_LEN || name.is_empty() {
            name = "other".to_owned();
        }
        let mut labels = ToolLabels { name, status };
        if let Some(c) = self.tool_calls.get(&labels) {
            c.inc();
            return;
        }
        if self.tool_series.fetch_add(1, Ordering::Relaxed) >= 2 * MAX_TOOL_NAMES {
            labels.name = "other".to_owned();
        }
        self.tool_calls.get_or_create(&labels).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_are_bounded() {
        let m = Metrics::new();
        for i in 0..500 {
            m.tool_call(format!("t{i}"), i % 2 == 0);
        }
        m.tool_call("x".repeat(200), true);
        let text = m.render(0, 0);
        let series = text
            .lines()
            .filter(|l| l.starts_with("asbx_runner_tool_calls_total{"))
            .count();
        assert!(series <= 2 * MAX_TOOL_NAMES + 2, "{series} series");
        assert!(series >= MAX_TOOL_NAMES, "{series} series");
        assert!(text.contains("asbx_runner_tool_calls_total{name=\"other\",status=\"failed\"}"));
        assert!(!text.contains(&"x".repeat(200)));
    }

    #[test]
    fn the_exposition_names_every_metric() {
        let m = Metrics::new();
        m.dispatch_ended("completed", "none", Duration::from_millis(300));
        m.first_line(Duration::from_millis(20));
        m.streamed(3, 120);
        m.egress(false);
        m.model_call("openai");
        m.tokens("openai", 10, 0);
        let text = m.render(2, 1);
        for want in [
            "asbx_runner_sandboxes_live 2",
            "asbx_runner_sandboxes_warm 1",
            "asbx_runner_dispatches_total{outcome=\"completed\",code=\"none\"} 1",
            "asbx_runner_time_to_first_line_seconds_count 1",
            "asbx_runner_dispatch_duration_seconds_count 1",
            "asbx_runner_lines_streamed_total 3",
            "asbx_runner_bytes_streamed_total 120",
            "asbx_runner_egress_requests_total{decision=\"refused\"} 1",
            "asbx_runner_model_calls_total{provider=\"openai\"} 1",
            "asbx_runner_model_tokens_total{provider=\"openai\",direction=\"input\"} 10",
        ] {
            assert!(text.contains(want), "{want} not in\n{text}");
        }
        assert!(
            !text.contains("direction=\"output\""),
            "zero adds no series"
        );
        // The Prometheus text format 0.0.4: a counter's family is named
        // like its samples, and there is no OpenMetrics `# EOF`.
        assert!(text.contains("# TYPE asbx_runner_dispatches_total counter\n"));
        assert!(text.contains("# HELP asbx_runner_lines_streamed_total NDJSON"));
        assert!(text.contains("# TYPE asbx_runner_time_to_first_line_seconds histogram\n"));
        assert!(!text.contains("# EOF"));
    }
}
