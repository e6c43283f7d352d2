//! OpenTelemetry traces of a dispatch (`docs/observability.md`): off unless
//! the `asbx` binary installed an exporter and called [`enable`]; then
//! nothing here is reached.
//!
//! - An incoming request's W3C `traceparent` becomes the OpenTelemetry
//!   context its handler runs in ([`incoming`]), so the `dispatch` span of a
//!   `POST /stream` is the child of the workspace's span.
//! - The dispatch span is kept on the session: the bootstrap (sandbox
//!   start to the agent's first line), each step (`running` to
//!   `succeeded`/`failed`, in `drive`) and each gateway request
//!   ([`gateway`]: model calls, callbacks, MCP, the workspace API) are its
//!   children, and the gateway's callbacks to the workspace carry
//!   `traceparent` ([`inject`]).

use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::Request;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::context::FutureExt as _;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns the spans on: the binary calls it once it installed the exporter
/// and the trace-context propagator, before it builds the routers.
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Middleware of the runner's routes: the handler runs in the context the
/// caller's `traceparent` names (none: a new trace).
pub(crate) async fn incoming(req: Request, next: Next) -> Response {
    let cx = opentelemetry::global::get_text_map_propagator(|p| {
        p.extract(&HeaderExtractor(req.headers()))
    });
    next.run(req).with_context(cx).await
}

/// The span of one dispatch, a child of the context the request came in
/// with; `Span::none()` when traces are off.
pub(crate) fn dispatch_span(session_id: &str) -> tracing::Span {
    if !enabled() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        "dispatch",
        otel.kind = "server",
        session.id = %session_id,
    );
    let _ = span.set_parent(opentelemetry::Context::current());
    span
}

/// Sandbox start to the agent's first line.
pub(crate) fn bootstrap_span(dispatch: &tracing::Span) -> Option<tracing::Span> {
    enabled().then(|| tracing::info_span!(parent: dispatch, "bootstrap"))
}

/// One step (a tool call), from `running` to its end.
pub(crate) fn step_span(dispatch: &tracing::Span, id: &str, name: &str) -> tracing::Span {
    if !enabled() {
        return tracing::Span::none();
    }
    tracing::info_span!(
        parent: dispatch,
        "tool call",
        otel.name = %format!("tool {name}"),
        step.id = %id,
        tool.name = %name,
        tool.status = tracing::field::Empty,
        tool.duration_ms = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// Records how a step ended on its span.
pub(crate) fn step_ended(span: &tracing::Span, succeeded: bool, duration_ms: Option<u64>) {
    if span.is_none() {
        return;
    }
    span.record(
        "tool.status",
        if succeeded { "succeeded" } else { "failed" },
    );
    if let Some(ms) = duration_ms {
        span.record("tool.duration_ms", ms);
    }
    if !succeeded {
        span.record("otel.status_code", "ERROR");
    }
}

/// Adds `traceparent` (and `tracestate`) for the current span to `headers`.
pub(crate) fn inject(headers: &mut HeaderMap) {
    if !enabled() {
        return;
    }
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut HeaderInjector(headers))
    });
}

/// What a gateway route is, for its span's name.
fn gateway_name(path: &str) -> String {
    use asbx_protocol::gateway::{
        CLIENT_TOOL_PREFIX, MCP_PREFIX, MODEL_PREFIX, USAGE, WORKSPACE_PREFIX,
    };
    if let Some(rest) = path.strip_prefix(MODEL_PREFIX) {
        let provider = rest.split('/').next().unwrap_or_default();
        return format!("model call {provider}");
    }
    if path.starts_with(MCP_PREFIX) {
        return "mcp".to_owned();
    }
    if path.starts_with(CLIENT_TOOL_PREFIX) {
        return "client tool".to_owned();
    }
    if path.starts_with(WORKSPACE_PREFIX) {
        return "workspace api".to_owned();
    }
    if path == USAGE {
        return "usage".to_owned();
    }
    match path.rsplit_once('/') {
        Some((_, name)) if path.starts_with("/callback/") => format!("callback {name}"),
        _ => "gateway".to_owned(),
    }
}

/// Middleware of a sandbox's gateway: each request is a span, the child of
/// its session's dispatch span, that lasts until the answer's body ended
/// (a model's streamed answer included).
pub(crate) async fn gateway(
    axum::extract::Extension(dispatch): axum::extract::Extension<tracing::Span>,
    req: Request,
    next: Next,
) -> Response {
    let span = tracing::info_span!(
        parent: &dispatch,
        "gateway",
        otel.name = %gateway_name(req.uri().path()),
        otel.kind = "server",
        http.request.method = %req.method(),
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    let res = next.run(req).instrument(span.clone()).await;
    span.record("http.response.status_code", res.status().as_u16());
    if res.status().is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    let (parts, body) = res.into_parts();
    let stream = futures::StreamExt::map(body.into_data_stream(), move |chunk| {
        let _ = &span;
        chunk
    });
    Response::from_parts(parts, axum::body::Body::from_stream(stream))
}

#[cfg(test)]
mod tests {
    use super::gateway_name;

    #[test]
    fn gateway_spans_are_named_by_route() {
        assert_eq!(
            gateway_name("/model/openai/chat/completions"),
            "model call openai"
        );
        assert_eq!(gateway_name("/callback/env"), "callback env");
        assert_eq!(gateway_name("/callback/results"), "callback results");
        assert_eq!(gateway_name("/mcp/echo"), "mcp");
        assert_eq!(gateway_name("/nowhere"), "gateway");
    }
}
