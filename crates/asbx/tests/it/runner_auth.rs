//! Authentication between the parts: a runner off loopback needs a token,
//! and a dispatch's `agent_url` may only point at a workspace origin.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::{
    ASBX, FakeWorkspace, RunnerProc, dispatch, script, scripted, session_id, terminal,
};

/// Starts `asbx runner --listen <listen>` (unconfined, no warm pool) and
/// returns its banner line, or its stderr if it exited.
fn runner_on(listen: &str, token: Option<&str>) -> Result<(std::process::Child, String), String> {
    let data = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(ASBX);
    cmd.args(["runner", "--listen", listen, "--profile", "unconfined"])
        .env("ASBX_DATA", data.path())
        .env("ASBX_WARM_POOL", "0")
        .env("ASBX_LOG", "warn")
        .env_remove("ASBX_RUNNER_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(t) = token {
        cmd.env("ASBX_RUNNER_TOKEN", t);
    }
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if line.contains("listening") {
        return Ok((child, line));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err);
    let status = child.try_wait().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    Err(format!("{status:?}: {err}"))
}

fn stop(mut child: std::process::Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
}

#[test]
fn a_runner_off_loopback_needs_a_token() {
    let err = runner_on("0.0.0.0:0", None).expect_err("started off loopback without a token");
    assert!(err.contains("ASBX_RUNNER_TOKEN"), "{err}");
    // Positive controls: with a token it serves there; on loopback it needs none.
    let (child, banner) = runner_on("0.0.0.0:0", Some("t0ken")).unwrap();
    assert!(banner.contains("http://0.0.0.0:"), "{banner}");
    stop(child);
    let (child, _) = runner_on("127.0.0.1:0", None).unwrap();
    stop(child);
}

#[tokio::test]
async fn agent_url_must_point_at_a_workspace_origin() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let prompt = script(json!([{"say": "hi"}]));
    // Cloud metadata and any non-loopback origin are refused by default.
    for bad in [
        "http://169.254.169.254/latest/meta-data",
        "http://10.0.0.1:80/ws",
    ] {
        let mut body = ws.body(&ws.mint(&session_id("origin")), &prompt);
        body["agent_url"] = json!(bad);
        let (status, _, problem) = dispatch(&runner.url, &body).await;
        assert_eq!(status, 400, "{bad}: {problem}");
        let p: serde_json::Value = serde_json::from_str(&problem).unwrap();
        assert_eq!(p["code"], "invalid_request");
        assert_eq!(p["errors"][0]["field"], "agent_url", "{p}");
    }
    // Positive control: the loopback workspace is reached.
    let (status, lines, problem) = dispatch(
        &runner.url,
        &ws.body(&ws.mint(&session_id("origin")), &prompt),
    )
    .await;
    assert_eq!(status, 200, "{problem}");
    assert!(
        matches!(terminal(&lines), asbx_protocol::Event::Result(_)),
        "{lines:?}"
    );

    // With configured origins, loopback is no longer implied.
    let strict = RunnerProc::start(&[("ASBX_WORKSPACE_ORIGINS", "https://ws.example.invalid")]);
    let (status, _, problem) = dispatch(
        &strict.url,
        &ws.body(&ws.mint(&session_id("origin")), &prompt),
    )
    .await;
    assert_eq!(status, 400, "{problem}");
    assert!(problem.contains("agent_url"), "{problem}");
}
