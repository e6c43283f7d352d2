//! A tiny OTLP/HTTP trace receiver on 127.0.0.1: `POST /v1/traces` with a
//! protobuf `ExportTraceServiceRequest` (decoded with `opentelemetry-proto`
//! and `prost`), every span kept flat with its service's name.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message as _;

use crate::lock;

/// One received span.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// The `service.name` of its resource.
    pub service: String,
    pub name: String,
    /// Hex, as in `traceparent`.
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// Attributes, their values as text.
    pub attributes: HashMap<String, String>,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// The receiver; stops when dropped.
pub struct OtlpReceiver {
    /// `http://127.0.0.1:<port>`: what `OTEL_EXPORTER_OTLP_ENDPOINT` takes.
    pub endpoint: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl OtlpReceiver {
    /// Starts a receiver on 127.0.0.1 with an ephemeral port.
    pub async fn start() -> OtlpReceiver {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(Arc::clone(&spans));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("OTLP receiver: cannot bind: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("OTLP receiver: no local addr: {e}"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        OtlpReceiver {
            endpoint: format!("http://{addr}"),
            spans,
            task,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        lock(&self.spans).clone()
    }
}

async fn receive(State(spans): State<Arc<Mutex<Vec<ReceivedSpan>>>>, body: Bytes) -> Response {
    let req = match ExportTraceServiceRequest::decode(body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let mut got = Vec::new();
    for rs in req.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .and_then(|r| attributes(&r.attributes).remove("service.name"))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                got.push(ReceivedSpan {
                    service: service.clone(),
                    name: s.name,
                    trace_id: hex::encode(&s.trace_id),
                    span_id: hex::encode(&s.span_id),
                    parent_span_id: hex::encode(&s.parent_span_id),
                    attributes: attributes(&s.attributes),
                    start_ns: s.start_time_unix_nano,
                    end_ns: s.end_time_unix_nano,
                });
            }
        }
    }
    lock(&spans).extend(got);
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    ([(header::CONTENT_TYPE, "application/x-protobuf")], answer).into_response()
}

fn attributes(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

fn text(v: Option<&AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}
