//! `asbx doctor` through the real binary (issue 28, item 6): on this host it
//! lists every layer and host setting and exits 0 exactly when the default
//! profile can run (as the jail's own probe says); an unreachable runner
//! and an unusable data folder make it exit 1 naming the row and its fix.

use std::process::{Command, Output};

use asbx_protocol::jail::LayerReport;
use asbx_test_support::fake_runner::{FakeRunner, Mode};

use crate::harness::ASBX;

/// `asbx doctor ARGS` over a clean environment.
fn doctor(args: &[&str]) -> (Output, String) {
    let out = Command::new(ASBX)
        .arg("doctor")
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, text)
}

/// What the jail's probe says of the strict profile on this host.
fn strict_runs_here() -> bool {
    let out = Command::new(ASBX)
        .args(["jail", "--check", "--profile", "strict"])
        .output()
        .unwrap();
    let report: LayerReport = serde_json::from_slice(&out.stdout).unwrap();
    report.missing().is_empty()
}

#[test]
fn doctor_lists_every_layer_and_passes_when_the_default_profile_runs() {
    let data = tempfile::tempdir().unwrap();
    let (out, text) = doctor(&["--data", data.path().to_str().unwrap()]);
    for row in [
        "profile strict",
        "profile namespaces",
        "root",
        "user_namespace",
        "pid_namespace",
        "mount_namespace",
        "network_namespace",
        "cgroup_namespace",
        "pivot_root",
        "cgroups",
        "seccomp",
        "landlock",
        "user.max_user_namespaces",
        "kernel.pid_max",
        "open files",
        "data folder",
        "runners",
    ] {
        assert!(text.contains(row), "no {row:?} in:\n{text}");
    }
    let runs = strict_runs_here();
    assert_eq!(out.status.success(), runs, "{text}");
    if runs {
        assert!(text.contains("✓ profile `strict` can run here."), "{text}");
        assert!(!text.contains("(needed)"), "{text}");
    } else {
        asbx_test_support::skip(
            "doctor_lists_every_layer_and_passes_when_the_default_profile_runs",
            "this host can't run the strict profile; checked that doctor says so",
        );
        assert!(text.contains("(needed)"), "{text}");
    }
}

#[tokio::test]
async fn an_unreachable_runner_fails_naming_it_and_the_fix() {
    let data = tempfile::tempdir().unwrap();
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/");
    // Positive control: a runner that answers `/healthz` passes.
    let runner = FakeRunner::start(Mode::Hold).await;
    runner.set_health(
        serde_json::json!({"status": "ok", "profile": "strict", "free": 3, "capacity": 4}),
    );
    let good = runner.url.to_string();
    let d = data.path().to_str().unwrap().to_owned();
    let (ok, text) = tokio::task::spawn_blocking(move || {
        doctor(&[
            "--profile",
            "unconfined",
            "--data",
            &d,
            "--sandbox-url",
            &good,
        ])
    })
    .await
    .unwrap();
    assert!(ok.status.success(), "{text}");
    assert!(text.contains("✓ runner http://127.0.0.1:"), "{text}");
    assert!(
        text.contains("reachable (profile strict, 3 free of 4)"),
        "{text}"
    );
    // The closed port: exit 1, the row and its fix.
    let d = data.path().to_str().unwrap().to_owned();
    let (bad, text) = tokio::task::spawn_blocking(move || {
        doctor(&[
            "--profile",
            "unconfined",
            "--data",
            &d,
            "--sandbox-url",
            &url,
        ])
    })
    .await
    .unwrap();
    assert_eq!(bad.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("✗ runner http://127.0.0.1:{port}/: unreachable")),
        "{text}"
    );
    assert!(text.contains("fix: start `asbx runner` there"), "{text}");
    assert!(text.contains("can't run here"), "{text}");
}

#[test]
fn an_unusable_data_folder_fails_naming_it_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-folder");
    std::fs::write(&file, "x").unwrap();
    let (out, text) = doctor(&["--profile", "unconfined", "--data", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("✗ data folder"), "{text}");
    assert!(text.contains("not a folder (needed)"), "{text}");
    assert!(text.contains("fix: `sudo mkdir -p"), "{text}");
    // Positive control: its folder is fine.
    let (out, text) = doctor(&[
        "--profile",
        "unconfined",
        "--data",
        dir.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{text}");
}
