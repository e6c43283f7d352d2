//! Each limit breached once.

use asbx_protocol::callback::RunLimits;
use asbx_protocol::gateway::ProviderKind;
use asbx_protocol::line::StepStatus;
use asbx_test_support::Tape;
use serde_json::json;

use crate::harness::{Harness, script};

#[tokio::test]
async fn max_steps() {
    let mut h = Harness::scripted(&script(json!([
        {"tool": "list_files", "args": {"path": "."}},
        {"tool": "list_files", "args": {"path": "."}},
        {"tool": "list_files", "args": {"path": "."}},
        {"say": "never"}
    ])));
    h.limits(RunLimits {
        max_steps: Some(2),
        ..Default::default()
    });
    let o = h.run().await;
    assert_eq!(o.error().0, "step_limit_exceeded");
    assert_eq!(o.finished_steps().len(), 2);
}

#[tokio::test]
async fn max_steps_is_clamped_to_the_runner_maximum() {
    let mut h = Harness::scripted(&script(json!([
        {"tool": "list_files", "args": {"path": "."}},
        {"say": "never"}
    ])));
    h.max_limits.max_steps = 1;
    h.limits(RunLimits {
        max_steps: Some(100),
        ..Default::default()
    });
    let o = h.run().await;
    assert_eq!(o.error().0, "step_limit_exceeded");
}

#[tokio::test]
async fn max_tool_calls() {
    let mut h = Harness::scripted(&script(json!([
        {"tools": [
            {"tool": "list_files", "args": {"path": "."}},
            {"tool": "list_files", "args": {"path": "."}}
        ]},
        {"say": "never"}
    ])));
    h.limits(RunLimits {
        max_tool_calls: Some(1),
        ..Default::default()
    });
    let o = h.run().await;
    assert_eq!(o.error().0, "tool_limit_exceeded");
    assert_eq!(o.finished_steps().len(), 1);
}

#[tokio::test]
async fn tool_timeout_kills_the_group_and_fails_the_step() {
    let marker = "asbx-timeout-marker-4242";
    let mut h = Harness::scripted(&script(json!([
        {"tool": "shell", "args": {"command": format!("(sleep 30; echo {marker}) & sleep 30")}},
        {"say": "carried on"}
    ])));
    h.limits(RunLimits {
        tool_timeout_ms: Some(300),
        ..Default::default()
    });
    let o = h.run().await;
    let steps = o.finished_steps();
    assert_eq!(steps[0].status, StepStatus::Failed);
    assert!(steps[0].error.as_ref().unwrap().contains("timed out"));
    assert_eq!(o.result(), "carried on");
    // No member of the tool's process group survives.
    let ps = std::process::Command::new("ps")
        .args(["-eo", "args"])
        .output()
        .unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(!ps.contains(marker), "a tool process survived:\n{ps}");
}

#[tokio::test]
async fn tool_output_bytes_truncates_with_a_marker() {
    let mut h = Harness::with_mock(ProviderKind::Openai).await;
    h.limits(RunLimits {
        tool_output_bytes: Some(200),
        ..Default::default()
    });
    h.mock().push(Tape::tool_call(
        "shell",
        json!({"command": "head -c 5000 /dev/zero | tr '\\0' a"}),
    ));
    h.mock().push(Tape::text("ok"));
    let o = h.run().await;
    assert_eq!(o.result(), "ok");
    let steps = o.finished_steps();
    let shown = steps[0].result.as_ref().unwrap()["stdout"]
        .as_str()
        .unwrap();
    assert!(shown.contains("…[truncated 4900 bytes]"), "{shown}");
    let reqs = o.mock.as_ref().unwrap().requests();
    let msgs = reqs[1].body["messages"].as_array().unwrap();
    let content = msgs.last().unwrap()["content"].as_str().unwrap();
    assert!(content.contains("…[truncated 4900 bytes]"), "{content}");
    assert!(content.len() < 400, "{}", content.len());
}

#[tokio::test]
async fn max_duration() {
    let mut h = Harness::scripted(&script(json!([
        {"tool": "shell", "args": {"command": "sleep 30"}},
        {"say": "never"}
    ])));
    h.limits(RunLimits {
        max_duration_ms: Some(500),
        ..Default::default()
    });
    let o = h.run().await;
    assert_eq!(o.error().0, "duration_limit_exceeded");
    assert!(
        o.gateway.results().is_empty(),
        "nothing under out/, nothing written back"
    );
}
