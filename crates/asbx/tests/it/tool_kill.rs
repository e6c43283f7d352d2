//! A timed-out tool dies with everything it started, inside a real jail
//! (issue 13, item 5), and a tool that outgrows the tools cgroup's memory is
//! killed alone: the agent survives and the turn ends normally. A stdio MCP
//! server runs as its own uid, so a tool can't read its environment (item 8).
//!
//! These depend on the jail's child cgroups (`tools`, `mcp` under
//! `/run/asbx-cgroup`, cgroup v1 with the freezer) and on the agent keeping
//! `CAP_KILL`; the `namespaces` case on the agent's tool-uid sweep.

use asbx_protocol::callback::{ConfigResponse, McpServer, RunLimits, Skill};
use asbx_protocol::line::Step;
use asbx_protocol::{Event, Line, StepStatus};
use asbx_test_support::echo_server_source;
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

/// Runs a turn of three tools whose second times out leaving `orphan`
/// behind and whose answer is `checked`, watching from the host that the
/// orphan ran before the timeout (the positive control); its finished
/// steps.
async fn run_with_orphan(url: &str, body: serde_json::Value, orphan: &str) -> Vec<Step> {
    let url = url.to_owned();
    let run = tokio::spawn(async move { dispatch(&url, &body).await });
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut orphan_ran = false;
    while !orphan_ran && !run.is_finished() && std::time::Instant::now() < until {
        orphan_ran = !pids_with(orphan).is_empty();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (_, lines, _) = run.await.unwrap();
    assert!(orphan_ran, "the orphan never ran (no positive control)");
    assert_well_formed(&lines);
    assert!(
        matches!(terminal(&lines), Event::Result(r) if r.message == "checked"),
        "{lines:?}"
    );
    let steps = finished(&lines);
    assert_eq!(steps.len(), 3, "{steps:?}");
    steps
}

/// Lists the command lines of the sandbox's `sleep` processes; the command
/// itself names no marker.
const LIST_SLEEPS: &str = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep '^sleep' || true";

#[tokio::test]
async fn a_timed_out_tool_is_killed_with_everything_it_started() {
    timed_out_tool_dies_with_everything(&profile()).await;
}

/// The same attack under the weaker `namespaces` profile, whatever profile
/// the suite runs: no cgroups there, and `hidepid` hides the tool's
/// processes from the agent, so the orphan dies of the tool-uid sweep
/// (`kill -1` as the tool user).
#[tokio::test]
async fn under_namespaces_a_timed_out_tools_orphans_are_killed_too() {
    timed_out_tool_dies_with_everything("namespaces").await;
}

async fn timed_out_tool_dies_with_everything(profile: &str) {
    let runner = RunnerProc::start_with(profile, &[]);
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
    let steps = run_with_orphan(&runner.url, ws.body(&t, &prompt), &orphan).await;
    assert!(
        text_of(&steps[0]).contains(&format!("sleep {early}")),
        "the listing must see a tool's background sleep: {:?}",
        steps[0]
    );
    let err = steps[1].error.clone().unwrap_or_default();
    assert_eq!(steps[1].status, StepStatus::Failed, "{:?}", steps[1]);
    assert!(err.contains("timed out after 1500 ms"), "{err}");
    assert!(err.contains("was killed"), "{err}");
    // `strict` has the child cgroups; `namespaces` has none, and the agent
    // falls back to the process group and a sweep of the tool uid.
    let how = if profile == "strict" {
        "tools cgroup"
    } else {
        "every process of the tool user (kill -1"
    };
    assert!(err.contains(how), "killed through {how}: {err}");
    assert!(!err.contains("survived"), "{err}");
    assert!(!err.contains("may still run"), "{err}");
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

#[tokio::test]
async fn a_tool_cannot_read_an_mcp_servers_environment() {
    let runner = RunnerProc::start(&[]);
    let secret = format!("mcp-secret-{}", rand::random::<u64>());
    let visible = format!("tool-visible-{}", rand::random::<u64>());
    let config = ConfigResponse {
        skills: vec![Skill {
            name: "srv".into(),
            description: "an MCP server".into(),
            files: [("server.py".to_owned(), echo_server_source().to_owned())].into(),
        }],
        mcp_servers: vec![McpServer::Stdio {
            name: "kit".into(),
            command: "python3".into(),
            args: vec![".skills/srv/server.py".into()],
            env: [("KIT_TOKEN".to_owned(), secret.clone())].into(),
        }],
        ..scripted("scripted:test")
    };
    let ws = FakeWorkspace::start(config).await;
    let t = ws.mint(&session_id("mcpenv"));
    let bg = marker();
    // What a tool can read: every environment it can open.
    let read_all = "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' \
                    | grep -a -e '^VISIBLE=' -e '^KIT_TOKEN=' || true";
    let prompt = script(json!([
        {"tool": "kit__add", "args": {"a": 1, "b": 2}},
        // Positive control: another tool process's environment is readable.
        {"tool": "shell", "args": {"command":
            format!("VISIBLE={visible} sleep {bg} >/dev/null 2>&1 & sleep 0.3; {read_all}")}},
        // Time for the host to look at both processes.
        {"sleep_ms": 1500},
        {"say": "read"}
    ]));
    let url = runner.url.clone();
    let body = ws.body(&t, &prompt);
    let run = tokio::spawn(async move { dispatch(&url, &body).await });
    // From the host: the server runs as the sandbox's MCP uid (host_uid + 2),
    // the tool as the tool uid (host_uid + 1).
    let host_uid = |pid: i32| -> Option<u32> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let mut uids = None;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while uids.is_none() && std::time::Instant::now() < until {
        let server = pids_with(".skills/srv/server.py")
            .into_iter()
            .find_map(host_uid);
        let tool = pids_with(&bg).into_iter().find_map(host_uid);
        if let (Some(s), Some(t)) = (server, tool) {
            uids = Some((s, t));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (_, lines, _) = run.await.unwrap();
    let (server_uid, tool_uid) = uids.expect("saw the MCP server and the tool from the host");
    assert_eq!(
        server_uid,
        tool_uid + 1,
        "the MCP server runs as the MCP uid"
    );
    assert_well_formed(&lines);
    assert!(
        matches!(terminal(&lines), Event::Result(r) if r.message == "read"),
        "{lines:?}"
    );
    let steps = finished(&lines);
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert_eq!(
        steps[0].status,
        StepStatus::Succeeded,
        "the server runs: {steps:?}"
    );
    let seen = steps[1].result.clone().unwrap_or_default()["stdout"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(seen.contains(&visible), "the reader works: {seen}");
    assert!(
        !seen.contains(&secret),
        "a tool read the MCP server's environment"
    );
    runner.assert_clean().await;
}

/// Issue 26, item 4: a tool tries to move itself into every cgroup it can
/// open but its own (the MCP servers' child, started first so that its
/// memory cgroup exists; whatever of the host's hierarchies it can reach);
/// every write is refused, and what it started dies at the timeout.
#[tokio::test]
async fn a_tool_cannot_move_into_another_cgroup_and_dies_at_its_timeout() {
    if profile() != "strict" || !std::path::Path::new("/sys/fs/cgroup/freezer").exists() {
        asbx_test_support::skip(
            "a_tool_cannot_move_into_another_cgroup_and_dies_at_its_timeout",
            "needs the strict profile and cgroup v1 child cgroups",
        );
        return;
    }
    let runner = RunnerProc::start(&[]);
    let config = ConfigResponse {
        limits: Some(RunLimits {
            tool_timeout_ms: Some(1500),
            ..Default::default()
        }),
        skills: vec![Skill {
            name: "escsrv".into(),
            description: "an MCP server".into(),
            files: [("server.py".to_owned(), echo_server_source().to_owned())].into(),
        }],
        mcp_servers: vec![McpServer::Stdio {
            name: "kit".into(),
            command: "python3".into(),
            args: vec![".skills/escsrv/server.py".into()],
            env: Default::default(),
        }],
        ..scripted("scripted:test")
    };
    let ws = FakeWorkspace::start(config).await;
    let t = ws.mint(&session_id("cgescape"));
    let (orphan, fg) = (marker(), marker());
    // The orphan tries each `cgroup.procs` and `tasks` outside its own
    // child, then becomes `sleep {orphan}`; the foreground sleep times out.
    let escape = format!(
        "for f in $(find /run/asbx-cgroup /sys/fs/cgroup \\( -name cgroup.procs -o -name tasks \\) \
         2>/dev/null); do case $f in /run/asbx-cgroup/tools/*) continue;; esac; \
         echo \"tried $f\"; {{ echo 0 > $f; }} 2>/dev/null && echo \"MOVED $f\"; done; \
         echo done; exec sleep {orphan}"
    );
    let prompt = script(json!([
        {"tool": "kit__add", "args": {"a": 1, "b": 2}},
        {"tool": "shell", "args": {"command": format!(
            "(setsid bash -c '{escape}' > /tmp/escape.txt 2>&1 &); sleep {fg}"
        )}},
        {"tool": "shell", "args": {"command": format!("cat /tmp/escape.txt; {LIST_SLEEPS}")}},
        {"say": "checked"}
    ]));
    let steps = run_with_orphan(&runner.url, ws.body(&t, &prompt), &orphan).await;
    assert_eq!(
        steps[0].status,
        StepStatus::Succeeded,
        "the MCP server runs"
    );
    let err = steps[1].error.clone().unwrap_or_default();
    assert!(err.contains("timed out after 1500 ms"), "{err}");
    assert!(err.contains("tools cgroup"), "{err}");
    assert!(!err.contains("survived"), "{err}");
    let after = steps[2].result.clone().unwrap_or_default()["stdout"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // Positive control: the orphan finished trying, and found the MCP
    // servers' cgroups (all three, the memory one included).
    assert!(
        after.contains("\ndone\n"),
        "the orphan did not finish: {after}"
    );
    for c in ["memory", "pids", "freezer"] {
        let procs = format!("tried /run/asbx-cgroup/mcp/{c}/cgroup.procs");
        assert!(after.contains(&procs), "{procs} not tried: {after}");
    }
    assert!(!after.contains("MOVED"), "a tool moved itself: {after}");
    assert!(
        !after.contains(&format!("sleep {orphan}")),
        "the orphan survived: {after}"
    );
    assert!(
        pids_with(&orphan).is_empty() && pids_with(&fg).is_empty(),
        "a tool's sleep is still running on the host"
    );
    runner.assert_clean().await;
}
