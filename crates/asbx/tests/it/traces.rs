//! OpenTelemetry traces: `asbx workspace` and `asbx runner` as separate
//! processes export to a local OTLP/HTTP receiver; one chat turn (model
//! calls through the gateway to the mock provider, one shell step) is one
//! trace from the caller's `traceparent` through the workspace's request,
//! the runner's dispatch, the bootstrap, the model calls, the tool call and
//! the sandbox's callbacks back to the workspace. And `asbx up` (one
//! service) sends a run's trace when it stops, however long the batch delay.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde_json::json;

use asbx_test_support::{MockProvider, OtlpReceiver, ReceivedSpan, Tape};

use crate::harness::*;

/// The span named `name` of `service`, exactly one.
fn one<'a>(spans: &'a [ReceivedSpan], service: &str, name: &str) -> &'a ReceivedSpan {
    let found: Vec<_> = spans
        .iter()
        .filter(|s| s.service == service && s.name == name)
        .collect();
    assert_eq!(found.len(), 1, "{service} {name:?} in {spans:#?}");
    found[0]
}

/// Whether `span` descends from the span `ancestor` (by parent ids).
fn descends(spans: &[ReceivedSpan], span: &ReceivedSpan, ancestor: &ReceivedSpan) -> bool {
    let mut at = span;
    for _ in 0..32 {
        if at.parent_span_id == ancestor.span_id {
            return true;
        }
        match spans.iter().find(|s| s.span_id == at.parent_span_id) {
            Some(p) => at = p,
            None => return false,
        }
    }
    false
}

// Multi-threaded: the receiver answers the exports while the test thread
// blocks waiting for the processes to stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_turn_is_one_trace_across_the_workspace_the_runner_and_the_gateway() {
    let receiver = OtlpReceiver::start().await;
    let mock = MockProvider::start().await;
    mock.push(Tape::tool_call(
        "shell",
        json!({ "command": "echo traced-step" }),
    ));
    mock.push(Tape::text("the step ran"));
    let otel = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
    ];
    let mut runner_env = vec![
        ("OPENAI_BASE_URL", mock.base_url.as_str()),
        ("OPENAI_API_KEY", "sk-traces"),
        ("ASBX_WARM_POOL", "0"),
    ];
    runner_env.extend(otel);
    let mut runner = RunnerProc::start(&runner_env);
    let mut ws_env = vec![
        ("SANDBOX_URL", runner.url.as_str()),
        ("ASBX_MODEL", "openai:test-model"),
        ("ASBX_MODELS", "openai:test-model"),
    ];
    ws_env.extend(otel);
    let ws = WorkspaceProc::start("127.0.0.1:0", &ws_env);

    // The caller's own trace: the workspace's span is its child.
    let trace_id = hex::encode(rand::random::<[u8; 16]>());
    let caller_span = hex::encode(rand::random::<[u8; 8]>());
    let res = reqwest::Client::new()
        .post(format!("{}/api/assistant/chat/stream", ws.url))
        .header("traceparent", format!("00-{trace_id}-{caller_span}-01"))
        .json(&json!({ "message": "run the step" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let mut body = res.bytes_stream();
    let mut seen = Vec::new();
    let read = async {
        while let Some(chunk) = body.next().await {
            seen.extend_from_slice(&chunk.unwrap());
            if seen.windows(11).any(|w| w == b"event: done") {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(240), read)
        .await
        .expect("the turn went on too long");
    let text = String::from_utf8_lossy(&seen);
    assert!(text.contains("traced-step"), "{text}");
    assert!(text.contains("the step ran"), "{text}");
    // No stream left open, so the workspace stops at once on SIGTERM.
    drop(body);

    // The runner's spans end with the dispatch; a graceful stop flushes
    // what the batch has not sent yet.
    let deadline = Instant::now() + Duration::from_secs(30);
    let exported = |service: &str, name: &str| {
        receiver
            .spans()
            .iter()
            .any(|s| s.service == service && s.name == name)
    };
    while !(exported("asbx-runner", "dispatch")
        && exported("asbx-workspace", "POST /api/assistant/chat/stream"))
    {
        assert!(Instant::now() < deadline, "{:#?}", receiver.spans());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    runner.terminate();
    drop(ws);
    let spans = receiver.spans();

    let turn = one(&spans, "asbx-workspace", "POST /api/assistant/chat/stream");
    assert_eq!(turn.trace_id, trace_id, "{turn:?}");
    assert_eq!(turn.parent_span_id, caller_span, "{turn:?}");
    let dispatch = one(&spans, "asbx-runner", "dispatch");
    assert_eq!(dispatch.trace_id, trace_id);
    assert_eq!(
        dispatch.parent_span_id, turn.span_id,
        "the dispatch's parent is the workspace's request span"
    );

    let bootstrap = one(&spans, "asbx-runner", "bootstrap");
    assert_eq!(bootstrap.parent_span_id, dispatch.span_id);

    let models: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "model call openai")
        .collect();
    assert_eq!(models.len(), 2, "two model calls: {spans:#?}");
    for m in &models {
        assert_eq!(m.service, "asbx-runner");
        assert_eq!(m.trace_id, trace_id);
        assert!(descends(&spans, m, dispatch), "{m:?}");
        assert_eq!(m.attributes["http.response.status_code"], "200");
    }

    let tool = one(&spans, "asbx-runner", "tool shell");
    assert_eq!(tool.trace_id, trace_id);
    assert!(descends(&spans, tool, dispatch), "{tool:?}");
    assert_eq!(tool.attributes["tool.status"], "succeeded");
    assert!(tool.end_ns >= tool.start_ns);

    // The sandbox's callbacks, through the gateway, reach the workspace's
    // handlers in the same trace.
    for (gateway_name, route) in [
        (
            "callback env",
            "GET /api/assistant/sandbox/{session_id}/env",
        ),
        (
            "callback config",
            "GET /api/assistant/sandbox/{session_id}/config",
        ),
    ] {
        let hop = one(&spans, "asbx-runner", gateway_name);
        assert!(descends(&spans, hop, dispatch), "{hop:?}");
        let handler = one(&spans, "asbx-workspace", route);
        assert_eq!(handler.trace_id, trace_id, "{handler:?}");
        assert_eq!(handler.parent_span_id, hop.span_id, "{handler:?}");
    }

    // Every span of the turn is in the caller's trace.
    let others: Vec<_> = spans
        .iter()
        .filter(|s| s.trace_id != trace_id && s.service == "asbx-runner")
        .collect();
    assert!(
        others.is_empty(),
        "runner spans outside the turn: {others:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asbx_up_flushes_a_runs_trace_when_it_stops() {
    let receiver = OtlpReceiver::start().await;
    // The default batch delay (5 s) is longer than the run: what arrives
    // was sent by the flush at exit.
    let up = UpProc::start(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
        ("ASBX_WARM_POOL", "0"),
        ("ASBX_MODEL", "scripted:demo"),
    ]);
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "echo up-traced"}},
        {"say": "ok"}
    ]));
    let res = reqwest::Client::new()
        .post(format!("{}/api/runs", up.url))
        .json(&json!({ "prompt": prompt }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body = tokio::time::timeout(Duration::from_secs(120), res.text())
        .await
        .expect("the run went on too long")
        .unwrap();
    assert!(body.contains("up-traced"), "{body}");
    // The run's sandbox is torn down after its last line: wait for it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let sessions = std::fs::read_dir(up.data.path().join("runner/sessions"))
            .map(|d| d.count())
            .unwrap_or(0);
        if sessions == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the run's sandbox stayed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(receiver.spans().is_empty(), "nothing before the flush");
    drop(up);

    let spans = receiver.spans();
    let run = one(&spans, "asbx", "POST /api/runs");
    assert!(run.parent_span_id.is_empty(), "a new trace: {run:?}");
    let dispatch = one(&spans, "asbx", "dispatch");
    assert_eq!(dispatch.parent_span_id, run.span_id);
    let tool = one(&spans, "asbx", "tool shell");
    assert_eq!(tool.parent_span_id, dispatch.span_id);
    assert_eq!(tool.trace_id, run.trace_id);
    let env = one(
        &spans,
        "asbx",
        "GET /api/assistant/sandbox/{session_id}/env",
    );
    assert_eq!(env.trace_id, run.trace_id);
}
