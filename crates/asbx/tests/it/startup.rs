//! Fail closed (issue 3): without the layers of its profile the runner
//! refuses to start; a weaker profile must be named, and is then reported.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use crate::harness::*;

const NOBODY: u32 = 65534;

fn as_nobody(profile: &str, data: &std::path::Path) -> Command {
    let mut cmd = Command::new(ASBX);
    cmd.args(["runner", "--listen", "127.0.0.1:0", "--profile", profile])
        .env_clear()
        .env("ASBX_DATA", data)
        .env("ASBX_LOG", "warn")
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn nobody_can_run_the_binary() -> bool {
    Command::new(ASBX)
        .arg("--version")
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[tokio::test]
async fn without_its_layers_the_runner_refuses_to_start() {
    if !nobody_can_run_the_binary() {
        asbx_test_support::skip(
            "without_its_layers_the_runner_refuses_to_start",
            "the test binary is not reachable by an unprivileged user here",
        );
        return;
    }
    let data = tempfile::tempdir().unwrap();
    std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = as_nobody("strict", data.path()).output().unwrap();
    assert!(!out.status.success(), "started without its layers");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Refusing to start"), "{err}");
    assert!(err.contains("--profile"), "names the way out: {err}");
    assert!(err.contains("asbx doctor"), "points at the doctor: {err}");
}

#[tokio::test]
async fn a_weaker_profile_is_chosen_by_name_and_reported() {
    if !nobody_can_run_the_binary() {
        asbx_test_support::skip(
            "a_weaker_profile_is_chosen_by_name_and_reported",
            "the test binary is not reachable by an unprivileged user here",
        );
        return;
    }
    let data = tempfile::tempdir().unwrap();
    std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut child = as_nobody("unconfined", data.path()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("isolation: unconfined"), "{line}");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap()
        .to_owned();
    let health: serde_json::Value = reqwest::get(format!("{url}/healthz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["profile"], "unconfined");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
}

#[tokio::test]
async fn a_stopped_runner_leaves_no_warm_sandbox_behind() {
    let mut runner = RunnerProc::start(&[("ASBX_WARM_POOL", "2")]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while runner.warm_cgroups().len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the pool never warmed up"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let runner_pid = runner.pid();
    // The cgroups exist before the jail has finished; the agents follow.
    while pids_with("asbx-agent").len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "warm agents wait for their bootstrap"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    runner.terminate();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !runner.warm_cgroups().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "warm cgroups left: {:?}",
            runner.warm_cgroups()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let pool = runner.data.path().join("runner/pool");
    let left: Vec<_> = std::fs::read_dir(&pool)
        .map(|d| d.flatten().count())
        .into_iter()
        .collect();
    assert!(left.iter().all(|n| *n == 0), "warm folders left: {left:?}");
    assert!(
        !std::path::Path::new(&format!("/proc/{runner_pid}/status")).exists() || {
            let st =
                std::fs::read_to_string(format!("/proc/{runner_pid}/status")).unwrap_or_default();
            st.contains("zombie")
        }
    );
}

/// Starts `asbx workspace` on a loopback port with `ASBX_REQUIRE_AUTH=value`;
/// the child and the URL it printed, or its stderr when it refused to start.
fn workspace_with_require_auth(
    value: &str,
    data: &std::path::Path,
) -> Result<(std::process::Child, String), String> {
    let mut child = Command::new(ASBX)
        .args(["workspace", "--listen", "127.0.0.1:0"])
        .env_clear()
        .env("ASBX_DATA", data)
        .env("ASBX_LOG", "warn")
        .env("ASBX_REQUIRE_AUTH", value)
        .env("SANDBOX_URL", "http://127.0.0.1:9/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    match line.split_whitespace().find(|w| w.starts_with("http://")) {
        Some(url) => Ok((child, url.to_owned())),
        None => {
            let out = child.wait_with_output().unwrap();
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

#[tokio::test]
async fn boolean_settings_take_every_usual_spelling() {
    let client = reqwest::Client::new();
    for (value, on) in [
        ("1", true),
        ("true", true),
        ("yes", true),
        ("on", true),
        ("0", false),
        ("false", false),
        ("no", false),
        ("off", false),
    ] {
        let data = tempfile::tempdir().unwrap();
        let (mut child, url) = workspace_with_require_auth(value, data.path())
            .unwrap_or_else(|err| panic!("ASBX_REQUIRE_AUTH={value} did not start: {err}"));
        let status = client
            .get(format!("{url}/api/assistant/chats"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        let expected = if on { 401 } else { 200 };
        assert_eq!(status, expected, "ASBX_REQUIRE_AUTH={value}");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = child.wait();
    }
    let data = tempfile::tempdir().unwrap();
    let err = workspace_with_require_auth("maybe", data.path())
        .map(|(mut c, _)| {
            let _ = c.kill();
            let _ = c.wait();
        })
        .expect_err("an unknown spelling is refused");
    assert!(
        err.contains("ASBX_REQUIRE_AUTH") || err.contains("require-auth"),
        "{err}"
    );
}

/// The warm pool follows demand: with `ASBX_WARM_POOL=1` and a budget of
/// 6, a burst of 6 dispatches at once grows it to 6 warm sandboxes (the
/// busiest second of the last minute), not beyond the budget, and each
/// dispatch still runs to its result.
#[tokio::test]
async fn the_warm_pool_grows_to_a_burst_within_its_budget() {
    let runner = RunnerProc::start(&[("ASBX_WARM_POOL", "1"), ("ASBX_WARM_POOL_MAX", "6")]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let warm = |runner: &RunnerProc| {
        let url = format!("{}/healthz", runner.url);
        async move {
            let h: serde_json::Value = reqwest::get(url).await.unwrap().json().await.unwrap();
            h["warm"]
                .as_u64()
                .unwrap_or_else(|| panic!("no warm count: {h}"))
        }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while warm(&runner).await < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the pool never warmed up"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(warm(&runner).await, 1, "at rest: the minimum");
    let burst = (0..7).map(|i| {
        let t = ws.mint(&session_id(&format!("burst{i}")));
        let body = ws.body(&t, &script(serde_json::json!([{"say": "hi"}])));
        let url = runner.url.clone();
        async move { dispatch(&url, &body).await }
    });
    for (status, lines, err) in futures::future::join_all(burst).await {
        assert_eq!(status, 200, "{err}");
        assert_well_formed(&lines);
        assert!(
            matches!(terminal(&lines), asbx_protocol::Event::Result(_)),
            "{lines:?}"
        );
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while warm(&runner).await < 6 {
        assert!(
            std::time::Instant::now() < deadline,
            "the pool did not grow to the burst: {}",
            warm(&runner).await
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(warm(&runner).await, 6, "never beyond the budget");
}
