//! Secrets at rest (docs/secrets.md) through the real binary: an
//! environment's secret reaches the sandbox, while the workspace's data
//! folder (SQLite and its WAL included) never holds it in clear, before or
//! after it is rotated; the folder and its files are private; `--help`
//! never prints a secret from the environment; on PostgreSQL a workspace
//! without `ASBX_SECRET_KEY` refuses to start.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use asbx_protocol::LineDecoder;
use serde_json::{Value, json};

use crate::harness::*;

/// Every file under `dir`, concatenated.
fn all_bytes(dir: &std::path::Path) -> Vec<u8> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(all_bytes(&p));
        } else {
            out.extend(std::fs::read(&p).unwrap_or_default());
        }
    }
    out
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Runs `prompt` in environment `env` on `up`; the first shell step's stdout.
async fn shell_in(up: &UpProc, env: &str, command: &str) -> String {
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": command}},
        {"say": "done"}
    ]));
    let res = reqwest::Client::new()
        .post(format!("{}/api/runs", up.url))
        .json(&json!({"prompt": prompt, "protocol": 2, "environment": env}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body = res.bytes().await.unwrap();
    let lines: Vec<_> = LineDecoder::default()
        .push(&body)
        .into_iter()
        .map(|l| l.unwrap())
        .collect();
    shell_results(&lines)
        .first()
        .and_then(|r| r["stdout"].as_str())
        .unwrap_or_default()
        .trim()
        .to_owned()
}

#[tokio::test]
async fn a_secret_reaches_the_sandbox_and_never_the_disk_in_clear() {
    let first = format!("first-{}", hex::encode(rand::random::<[u8; 8]>()));
    let second = format!("second-{}", hex::encode(rand::random::<[u8; 8]>()));
    let up = UpProc::start(&[]);
    let client = reqwest::Client::new();
    let created: Value = client
        .post(format!("{}/api/environments", up.url))
        .json(&json!({"name": "prod", "secrets": {"API_TOKEN": first}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap();
    // The sandbox prints it reversed: the run's own lines don't carry it.
    let reversed = |s: &str| s.chars().rev().collect::<String>();
    let got = shell_in(&up, "prod", "printf %s \"$API_TOKEN\" | rev").await;
    assert_eq!(got, reversed(&first), "the sandbox got the secret at /env");

    // Rotated: the next run gets the new value.
    let r = client
        .put(format!("{}/api/environments/{id}", up.url))
        .json(&json!({"name": "prod", "secrets": {"API_TOKEN": second}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let got = shell_in(&up, "prod", "printf %s \"$API_TOKEN\" | rev").await;
    assert_eq!(got, reversed(&second));

    // Neither value, anywhere in the data folder: database, WAL, files.
    let data = up.data.path().join("workspace");
    let bytes = all_bytes(&data);
    assert!(contains(&bytes, "asbx-sealed:v1:"), "positive control");
    for secret in [&first, &second] {
        assert!(!contains(&bytes, secret), "{secret} is on disk in clear");
    }
    // Private: the folder, the database and its WAL, the key file.
    assert_eq!(mode(&data), 0o700);
    for file in ["asbx.db", "asbx.db-wal", "asbx.db-shm", "secret.key"] {
        assert_eq!(mode(&data.join(file)), 0o600, "{file}");
    }
}

#[test]
fn help_never_prints_a_secret_from_the_environment() {
    let secret = format!("tok-{}", hex::encode(rand::random::<[u8; 8]>()));
    let vars = [
        "ASBX_RUNNER_TOKEN",
        "ASBX_METRICS_TOKEN",
        "ASBX_SECRET_KEY",
        "ASBX_SECRET_KEY_OLD",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "DATABASE_URL",
    ];
    for sub in ["up", "runner", "workspace", "key", "gc"] {
        let mut cmd = Command::new(ASBX);
        cmd.args([sub, "--help"]).env_clear();
        for v in vars {
            cmd.env(v, &secret);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "asbx {sub} --help");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text.contains(&secret),
            "asbx {sub} --help printed it:\n{text}"
        );
        if sub != "gc" && sub != "key" {
            assert!(text.contains("[env: ASBX_RUNNER_TOKEN"), "{text}");
        }
    }
}

#[test]
fn on_postgres_a_workspace_without_a_secret_key_refuses_to_start() {
    let data = tempfile::tempdir().unwrap();
    // Nothing listens on port 1: it must refuse before connecting.
    let out = Command::new(ASBX)
        .args(["workspace", "--listen", "127.0.0.1:0"])
        .env_clear()
        .env("ASBX_DATA", data.path())
        .env("DATABASE_URL", "postgres://asbx@127.0.0.1:1/asbx")
        .env("SANDBOX_URL", "http://127.0.0.1:9")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ASBX_SECRET_KEY is required"), "{err}");
    assert!(!data.path().join("workspace").join("secret.key").exists());
}
