//! The whole system as a newcomer starts it: `asbx up`, then a run through
//! the workspace, whose written-back file lands in the workspace's store.

use asbx_protocol::{Event, LineDecoder, StepStatus};
use serde_json::json;

use crate::harness::*;

#[tokio::test]
async fn a_run_through_asbx_up_lands_its_file_in_the_workspace() {
    let up = UpProc::start(&[]);
    let client = reqwest::Client::new();
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "mkdir -p out && printf 'quarterly numbers' > out/report.txt && echo wrote"}},
        {"say": "report written"}
    ]));
    let res = client
        .post(format!("{}/api/runs", up.url))
        .json(&json!({ "prompt": prompt }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let run_id = res.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let bytes = res.bytes().await.unwrap();
    let lines: Vec<_> = LineDecoder::default()
        .push(&bytes)
        .into_iter()
        .map(|l| l.unwrap())
        .collect();
    assert_well_formed(&lines);
    assert_eq!(
        steps(&lines),
        vec![
            ("shell", StepStatus::Running),
            ("shell", StepStatus::Succeeded)
        ]
    );
    assert!(matches!(terminal(&lines), Event::Result(r) if r.message == "report written"));

    let run: serde_json::Value = client
        .get(format!("{}/api/runs/{run_id}", up.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(run["result"], "report written", "{run}");
    let files = run["files"].as_array().expect("files");
    assert_eq!(files.len(), 1, "{run}");
    assert_eq!(files[0]["path"], "report.txt");
    let id = files[0]["id"].as_str().unwrap();
    let body = client
        .get(format!("{}/api/files/{id}", up.url))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(&body[..], b"quarterly numbers");
}

#[tokio::test]
async fn the_default_scripted_model_says_it_is_not_real() {
    let up = UpProc::start(&[]);
    let res = reqwest::Client::new()
        .post(format!("{}/api/runs", up.url))
        .json(&json!({ "prompt": "hello there" }))
        .send()
        .await
        .unwrap();
    let bytes = res.bytes().await.unwrap();
    let lines: Vec<_> = LineDecoder::default()
        .push(&bytes)
        .into_iter()
        .map(|l| l.unwrap())
        .collect();
    assert_well_formed(&lines);
    match terminal(&lines) {
        Event::Result(r) => assert!(r.message.contains("not a real model"), "{}", r.message),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn with_auth_required_only_a_minted_key_dispatches() {
    let up = UpProc::start(&[("ASBX_REQUIRE_AUTH", "true")]);
    let client = reqwest::Client::new();
    let body = json!({ "prompt": script(json!([{"say": "authorized"}])) });
    let denied = client
        .post(format!("{}/api/runs", up.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(denied.status(), 401);
    assert_eq!(denied.headers()["content-type"], "application/problem+json");

    let out = std::process::Command::new(ASBX)
        .args(["key", "--new-workspace", "team-a"])
        .env("ASBX_DATA", up.data.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let key = text
        .lines()
        .find_map(|l| l.strip_prefix("key"))
        .map(|k| k.trim().to_owned())
        .expect("a key line");
    let res = client
        .post(format!("{}/api/runs", up.url))
        .bearer_auth(&key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let bytes = res.bytes().await.unwrap();
    let lines: Vec<_> = LineDecoder::default()
        .push(&bytes)
        .into_iter()
        .map(|l| l.unwrap())
        .collect();
    assert!(matches!(terminal(&lines), Event::Result(r) if r.message == "authorized"));
    // The key is stored only as a hash.
    let db = std::fs::read(up.data.path().join("workspace/asbx.db")).unwrap_or_default();
    let wal = std::fs::read(up.data.path().join("workspace/asbx.db-wal")).unwrap_or_default();
    let needle = key.as_bytes();
    for bytes in [&db, &wal] {
        assert!(
            !bytes.windows(needle.len()).any(|w| w == needle),
            "plaintext key in the database"
        );
    }

    // Issue 28, defect 9: `asbx run` sends a key too (`ASBX_API_KEY` or
    // `--api-key`); without one, or with a wrong one, it gets `401`.
    let asbx_run = |key: Option<(&str, &str)>| {
        let mut cmd = std::process::Command::new(ASBX);
        cmd.args(["run", "--url", &up.url])
            .env_remove("ASBX_API_KEY");
        match key {
            Some(("env", k)) => {
                cmd.env("ASBX_API_KEY", k);
            }
            Some((_, k)) => {
                cmd.args(["--api-key", k]);
            }
            None => {}
        }
        let out = cmd
            .arg(script(json!([{"say": "authorized by asbx run"}])))
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for key in [None, Some(("flag", "asbx_key_wrong"))] {
        let (ok, _, stderr) = asbx_run(key);
        assert!(!ok && stderr.contains("401"), "{key:?}: {stderr}");
    }
    for how in ["env", "flag"] {
        let (ok, stdout, stderr) = asbx_run(Some((how, &key)));
        assert!(ok, "{how}: {stderr}");
        assert!(stdout.contains("authorized by asbx run"), "{how}: {stdout}");
        assert!(!stderr.contains(&key), "{how}: the key is never shown");
    }
}

/// Issue 28, defect 12: a shell step whose command exits 3 is shown failed
/// (`✗`, with its exit code), never `✓`, and its output still shows.
#[tokio::test]
async fn asbx_run_shows_a_command_that_exits_non_zero_as_failed() {
    let up = UpProc::start(&[]);
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "echo partial-output; exit 3"}},
        {"say": "the command failed"}
    ]));
    let out = std::process::Command::new(ASBX)
        .args(["run", "--url", &up.url])
        .arg(&prompt)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("the command failed"), "{stdout}");
    assert!(stderr.contains("│ partial-output"), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("✗ shell") && l.contains("exited with code 3")),
        "{stderr}"
    );
    assert!(!stderr.contains("✓ shell"), "{stderr}");
    // The same in the raw lines: `failed`, the error, the output kept.
    let out = std::process::Command::new(ASBX)
        .args(["run", "--json", "--url", &up.url])
        .arg(&prompt)
        .output()
        .unwrap();
    let lines: Vec<_> = LineDecoder::default()
        .push(&out.stdout)
        .into_iter()
        .map(|l| l.unwrap())
        .collect();
    let done = lines
        .iter()
        .find_map(|l| match &l.event {
            Event::Step(s) if s.status != StepStatus::Running => Some(s.clone()),
            _ => None,
        })
        .expect("a finished step");
    assert_eq!(done.status, StepStatus::Failed, "{done:?}");
    assert!(done.error.as_deref().unwrap_or_default().contains("code 3"));
    assert_eq!(done.result.as_ref().unwrap()["exitCode"], 3, "{done:?}");
    assert_eq!(done.result.as_ref().unwrap()["stdout"], "partial-output\n");
}

#[tokio::test]
async fn asbx_run_shows_escape_sequences_from_the_model_escaped() {
    let up = UpProc::start(&[]);
    let hostile = "\u{1b}]0;owned\u{7}\u{1b}[31mRED\u{1b}[0m \u{9b}2J \u{202e}txt.exe";
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "printf '\\033[2Jcleared\\n'"}},
        {"say": hostile}
    ]));
    for json_mode in [false, true] {
        let mut cmd = std::process::Command::new(ASBX);
        cmd.args(["run", "--url", &up.url]);
        if json_mode {
            cmd.arg("--json");
        }
        let out = cmd.arg(&prompt).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        for (name, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
            let text = String::from_utf8_lossy(bytes);
            assert!(
                !text.contains(['\u{1b}', '\u{7}', '\u{9b}', '\u{202e}']),
                "raw control characters on {name} (json: {json_mode}): {text:?}"
            );
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        if json_mode {
            // Still the same JSON, with the text intact once decoded.
            let lines: Vec<_> = LineDecoder::default()
                .push(&out.stdout)
                .into_iter()
                .map(|l| l.unwrap())
                .collect();
            // Protocol 2: session_init first, the result, session_ended last.
            assert!(matches!(lines[0].event, Event::SessionInit(_)), "{lines:?}");
            assert!(
                lines
                    .iter()
                    .any(|l| matches!(&l.event, Event::Result(r) if r.message == hostile)),
                "{lines:?}"
            );
            assert!(matches!(terminal(&lines), Event::SessionEnded(_)));
        } else {
            assert!(
                stdout.contains("\\x1b[31mRED\\x1b[0m \\x9b2J \\u{202e}txt.exe"),
                "{stdout:?}"
            );
            // The tool's output, live under its step, escaped too.
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains("│ \\x1b[2Jcleared"), "{stderr:?}");
        }
    }
}

/// TCP ports process `pid` listens on (its socket inodes matched against
/// `/proc/net/tcp`).
fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            l.to_string_lossy()
                .strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .map(str::to_owned)
        })
        .collect();
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let listening = f.get(3) == Some(&"0A");
            let port = f.get(1)?.rsplit(':').next()?;
            (listening && inodes.iter().any(|i| Some(&i.as_str()) == f.get(9)))
                .then(|| u16::from_str_radix(port, 16).ok())
                .flatten()
        })
        .collect()
}

#[tokio::test]
async fn asbx_ups_runner_takes_only_its_own_workspaces_token() {
    let up = UpProc::start(&[]);
    let ws_port: u16 = up.url.rsplit(':').next().unwrap().parse().unwrap();
    let runner_port = listening_ports(up.pid())
        .into_iter()
        .find(|p| *p != ws_port)
        .expect("the runner's loopback port");
    let client = reqwest::Client::new();
    let runner = format!("http://127.0.0.1:{runner_port}");
    for (method, path) in [("GET", "/v1/sessions"), ("POST", "/stream")] {
        let status = client
            .request(method.parse().unwrap(), format!("{runner}{path}"))
            .json(&json!({}))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 401, "{path} without the token");
    }
    let status = client
        .get(format!("{runner}/v1/sessions"))
        .bearer_auth("a-guess")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 401, "a wrong token");
    // Positive control: the workspace holds the token, so its runs go through.
    let res = client
        .post(format!("{}/api/runs", up.url))
        .json(&json!({ "prompt": script(json!([{"say": "through"}])) }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let lines: Vec<_> = LineDecoder::default()
        .push(&res.bytes().await.unwrap())
        .into_iter()
        .map(|l| l.unwrap())
        .collect();
    assert!(matches!(terminal(&lines), Event::Result(r) if r.message == "through"));
}
