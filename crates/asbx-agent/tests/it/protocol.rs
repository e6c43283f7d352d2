//! Protocol 2 lines (`delta`, `stdout`) appear only in protocol 2.

use asbx_protocol::gateway::ProviderKind;
use asbx_protocol::line::OutputStream;
use asbx_protocol::{Event, Protocol};
use asbx_test_support::Tape;
use serde_json::json;

use crate::harness::{Harness, script};

fn count(events: &[Event], ty: &str) -> usize {
    events.iter().filter(|e| e.type_name() == ty).count()
}

#[tokio::test]
async fn protocol1_has_no_delta_or_stdout() {
    // The harness also asserts every line is a protocol 1 type.
    let h = Harness::with_mock(ProviderKind::Openai).await;
    h.mock().push(Tape::tool_call(
        "shell",
        json!({"command": "echo out; echo err >&2"}),
    ));
    h.mock().push(Tape::text("streamed text"));
    let o = h.run().await;
    assert_eq!(o.result(), "streamed text");
    assert_eq!(count(&o.events, "delta"), 0);
    assert_eq!(count(&o.events, "stdout"), 0);
}

#[tokio::test]
async fn protocol2_streams_deltas_and_tool_output() {
    let mut h = Harness::with_mock(ProviderKind::Openai).await;
    h.protocol = Protocol::V2;
    h.mock().push(Tape::tool_call(
        "shell",
        json!({"command": "echo out; echo err >&2"}),
    ));
    h.mock().push(Tape::text("streamed text"));
    let o = h.run().await;
    assert_eq!(o.result(), "streamed text");
    let text: String = o
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Delta(d) => Some(d.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(text, "streamed text");
    let step_id = &o.finished_steps()[0].id;
    let outs: Vec<_> = o
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Stdout(s) => Some(s),
            _ => None,
        })
        .collect();
    assert!(outs.iter().all(|s| &s.step_id == step_id));
    let joined = |st: OutputStream| -> String {
        outs.iter()
            .filter(|s| s.stream == st)
            .map(|s| s.chunk.as_str())
            .collect()
    };
    assert_eq!(joined(OutputStream::Stdout), "out\n");
    assert_eq!(joined(OutputStream::Stderr), "err\n");
}

#[tokio::test]
async fn scripted_say_streams_a_delta_in_protocol2() {
    let mut h = Harness::scripted(&script(json!([{"say": "hello"}])));
    h.protocol = Protocol::V2;
    let o = h.run().await;
    assert_eq!(count(&o.events, "delta"), 1);
    assert_eq!(o.result(), "hello");
}
