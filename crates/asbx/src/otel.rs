//! OpenTelemetry traces, off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set: then a
//! `tracing_opentelemetry` layer exports the spans of the runner and the
//! workspace over OTLP/HTTP (protobuf) with a batch processor, and W3C
//! `traceparent` headers carry the trace between them (`docs/observability.md`).
//!
//! The standard variables apply as the OpenTelemetry SDK reads them:
//! `OTEL_SERVICE_NAME` (default: `asbx-runner`, `asbx-workspace` or `asbx`
//! for `up`), `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_BSP_SCHEDULE_DELAY`, ...;
//! `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};

/// Whether the environment asks for traces.
pub(crate) fn wanted() -> bool {
    let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
    let endpoint = set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.trim() == "none");
    endpoint && !disabled
}

/// The tracer provider, built on `rt`: the OTLP exporter's HTTP client
/// (hyper) needs a Tokio runtime, while the batch processor exports from
/// its own thread, so each export is run as a task on `rt`.
pub(crate) fn provider(
    rt: &tokio::runtime::Handle,
    default_service: &'static str,
) -> anyhow::Result<SdkTracerProvider> {
    let _entered = rt.enter();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .build()?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name(default_service);
    }
    Ok(SdkTracerProvider::builder()
        .with_resource(resource.build())
        .with_batch_exporter(OnRuntime {
            inner: Arc::new(exporter),
            rt: rt.clone(),
        })
        .build())
}

/// The `tracing` layer that turns this process's spans into OpenTelemetry
/// spans, and the W3C trace-context propagator for the headers.
pub(crate) fn layer<S>(
    provider: &SdkTracerProvider,
) -> tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("asbx"))
        .with_threads(false)
}

/// Exports what is left; called once the server stopped, while the runtime
/// still runs.
pub(crate) fn shutdown(provider: &SdkTracerProvider) {
    if let Err(e) = provider.shutdown_with_timeout(Duration::from_secs(5)) {
        tracing::warn!(error = %e, "flushing the traces failed");
    }
}

/// The OTLP exporter, each export run as a task on a Tokio runtime.
#[derive(Debug)]
struct OnRuntime {
    inner: Arc<opentelemetry_otlp::SpanExporter>,
    rt: tokio::runtime::Handle,
}

impl SpanExporter for OnRuntime {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let inner = Arc::clone(&self.inner);
        match self
            .rt
            .spawn(async move { inner.export(batch).await })
            .await
        {
            Ok(r) => r,
            Err(e) => Err(OTelSdkError::InternalFailure(e.to_string())),
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.set_resource(resource);
        }
    }
}
