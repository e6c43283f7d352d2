//! A timed-out tool dies with everything it started, inside a real jail
//! (issue 13, item 5), and a tool that outgrows the tools cgroup's memory is
//! killed alone: the agent survives and the turn ends normally.
//!
//! These depend on the jail's child cgroups (`tools`, `mcp` under
//! `/run/asbx-cgroup`, cgroup v1 with the freezer) and on the agent keeping
//! `CAP_KILL`.

use asbx_protocol::callback::{ConfigResponse, RunLimits};
use asbx_protocol::line::Step;
use asbx_protocol::{Event, Line, StepStatus};
use serde_json::json;

use crate::harness::*;

fn finished(lines: &[Line]) -> Vec<Step> {
    lines
        .iter()
        .filter_map(|l| match &l.event {
            Event::Step(s) if s.status != StepStatus::Running => Some(s.clone()),
            _ => None,
        })
        .collect()
}

fn text_of(s: &Step) -> String {
    format!(
        "{}{}",
        s.result.clone().unwrap_or_default(),
        s.error.clone().unwrap_or_default()
    )
}

/// A `sleep` argument no other process has.
fn marker() -> String {
    format!("1000.{}", rand::random::<u32>())
}

/// Lists the command lines of the sandbox's `sleep` processes; the command
/// itself names no marker.
const LIST_SLEEPS: &str = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep '^sleep' || true";

#[tokio::test]
async fn a_timed_out_tool_is_killed_with_everything_it_started() {
    let runner = RunnerProc::start(&[]);
    let config = ConfigResponse {
        limits: Some(RunLimits {
            tool_timeout_ms: Some(1500),
            ..Default::default()
        }),
        ..scripted("scripted:test")
    };
    let ws = FakeWorkspace::start(config).await;
    let t = ws.mint(&session_id("toolkill"));
    let (early, orphan, fg) = (marker(), marker(), marker());
    let prompt = script(json!([
        // Positive control: a background sleep of an earlier tool is listed.
        {"tool": "shell", "args": {"command":
            format!("sleep {early} >/dev/null 2>&1 & sleep 0.3; {LIST_SLEEPS}")}},
        // Times out: an orphaned background sleep (its parent subshell is
        // gone), a foreground one.
        {"tool": "shell", "args": {"command":
            format!("(setsid sleep {orphan} >/dev/null 2>&1 &); sleep {fg}")}},
        // While the turn still runs: nothing of the tools is left.
        {"tool": "shell", "args": {"command": LIST_SLEEPS}},
        {"say": "checked"}
    ]));
    let (_, lines, _) = dispatch(&runner.url, &ws.body(&t, &prompt)).await;
    assert_well_formed(&lines);
    assert!(
        matches!(terminal(&lines), Event::Result(r) if r.message == "checked"),
        "{lines:?}"
    );
    let steps = finished(&lines);
    assert_eq!(steps.len(), 3, "{steps:?}");
    assert!(
        text_of(&steps[0]).contains(&format!("sleep {early}")),
        "the listing must see a tool's background sleep: {:?}",
        steps[0]
    );
    let err = steps[1].error.clone().unwrap_or_default();
    assert_eq!(steps[1].status, StepStatus::Failed, "{:?}", steps[1]);
    assert!(err.contains("timed out after 1500 ms"), "{err}");
    assert!(err.contains("was killed"), "{err}");
    assert!(
        err.contains("tools cgroup"),
        "killed through the cgroup: {err}"
    );
    assert!(!err.contains("survived"), "{err}");
    let after = text_of(&steps[2]);
    for m in [&early, &orphan, &fg] {
        assert!(!after.contains(m.as_str()), "sleep {m} survived: {after}");
        assert!(
            pids_with(m).is_empty(),
            "sleep {m} is still running on the host"
        );
    }
    runner.assert_clean().await;
}

#[tokio::test]
async fn a_tool_over_the_tools_memory_is_killed_and_the_agent_survives() {
    let runner = RunnerProc::start(&[("ASBX_SANDBOX_MEMORY_MB", "256")]);
    let config = ConfigResponse {
        limits: Some(RunLimits {
            tool_timeout_ms: Some(30_000),
            ..Default::default()
        }),
        ..scripted("scripted:test")
    };
    let ws = FakeWorkspace::start(config).await;
    let t = ws.mint(&session_id("toolmem"));
    let hog = "python3 -c 'a = []\nwhile True: a.append(bytearray(16 << 20))'";
    let prompt = script(json!([
        {"tool": "write_file", "args": {"path": "out/kept.txt", "content": "still here"}},
        {"tool": "shell", "args": {"command": hog}},
        {"tool": "shell", "args": {"command": "echo agent alive"}},
        {"say": "survived"}
    ]));
    let (_, lines, _) = dispatch(&runner.url, &ws.body(&t, &prompt)).await;
    assert_well_formed(&lines);
    assert!(
        matches!(terminal(&lines), Event::Result(r) if r.message == "survived"),
        "the turn must end with its result, not sandbox_crashed: {:?}",
        terminal(&lines)
    );
    let steps = finished(&lines);
    assert_eq!(steps.len(), 3, "{steps:?}");
    // Killed by the OOM killer (SIGKILL): the tools cgroup's bound, not the
    // sandbox's, since the agent lived on.
    let hog_result = steps[1].result.clone().unwrap_or_default();
    assert_eq!(hog_result["signal"], json!(9), "{:?}", steps[1]);
    assert!(text_of(&steps[2]).contains("agent alive"), "{steps:?}");
    let results = ws.seen(|s| s.results.clone());
    assert_eq!(results.len(), 1, "one writeback");
    let files: Vec<&str> = results[0].files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(files, ["kept.txt"], "the writeback is intact");
    runner.assert_clean().await;
}
