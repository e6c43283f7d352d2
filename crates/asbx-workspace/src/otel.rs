//! OpenTelemetry traces of the workspace's requests (`docs/observability.md`):
//! off unless the `asbx` binary installed an exporter and called [`enable`].
//!
//! Each request is a span ([`incoming`]): the root of a turn's trace (a
//! chat turn, `POST /api/runs`, an agent run), or the child of the caller's
//! W3C `traceparent` (the sandbox's callbacks, which the runner's gateway
//! sends with the dispatch's). Requests to a runner carry the current
//! span's `traceparent` ([`headers`]).

use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns the spans on: the binary calls it once it installed the exporter
/// and the trace-context propagator, before it builds the router.
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Middleware: the request's span, named `{method} {route}`, under the
/// caller's `traceparent` when it sent one. `/healthz`, `/metrics` and the
/// page's assets are not traced.
pub(crate) async fn incoming(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned());
    let Some(route) = route.filter(|r| {
        !matches!(r.as_str(), "/healthz" | "/readyz" | "/metrics" | "/")
            && !r.starts_with("/assets/")
    }) else {
        return next.run(req).await;
    };
    let span = tracing::info_span!(
        "request",
        otel.name = %format!("{} {route}", req.method()),
        otel.kind = "server",
        http.request.method = %req.method(),
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    let parent = opentelemetry::global::get_text_map_propagator(|p| {
        p.extract(&HeaderExtractor(req.headers()))
    });
    let _ = span.set_parent(parent);
    let res = next.run(req).instrument(span.clone()).await;
    span.record("http.response.status_code", res.status().as_u16());
    if res.status().is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    res
}

/// `traceparent` (and `tracestate`) of the current span, for a request to a
/// runner; empty with traces off.
pub(crate) fn headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    if enabled() {
        let cx = tracing::Span::current().context();
        opentelemetry::global::get_text_map_propagator(|p| {
            p.inject_context(&cx, &mut HeaderInjector(&mut headers));
        });
    }
    headers
}
