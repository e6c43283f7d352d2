//! The audit log through real processes (`asbx workspace`, `asbx runner`,
//! `asbx audit verify`), on SQLite and, with `ASBX_TEST_PG_URL`, on
//! PostgreSQL: an egress request the proxy refuses and a model call
//! through the gateway (the mock provider) are in the run's audit with
//! their figures, reported by the runner; the workspace's own records
//! (callbacks, the tool call) are there too; the chain verifies, and a
//! record edited by hand makes `asbx audit verify` fail naming it.

use std::process::Command;
use std::time::{Duration, Instant};

use asbx_test_support::{MockProvider, Tape};
use serde_json::{Value, json};

use crate::harness::*;

/// A request for a host the run does not allow, through the proxy.
const EGRESS_PROBE: &str = r#"python3 -c '
import urllib.request, urllib.error
try:
    urllib.request.urlopen("http://blocked.example/", timeout=10)
    print("egress=200")
except urllib.error.HTTPError as e:
    print("egress=%d" % e.code)
'"#;

/// Posts a run and reads it to its end; its id and body.
async fn run(url: &str, body: Value) -> (String, String) {
    let res = reqwest::Client::new()
        .post(format!("{url}/api/runs"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let id = res.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let text = tokio::time::timeout(Duration::from_secs(120), res.text())
        .await
        .expect("the run ends within 120 s")
        .unwrap();
    (id, text)
}

/// The run's audit records once `done` holds for them (bounded: the
/// runner reports within a second or so of the session's end).
async fn audit_of(url: &str, run: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = reqwest::Client::new()
            .get(format!("{url}/api/runs/{run}/audit"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let records: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if done(&records) || Instant::now() > deadline {
            return records;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn of_kind<'a>(records: &'a [Value], kind: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["kind"] == kind).collect()
}

/// `asbx audit verify` on the database; its exit status and stdout.
fn verify(data: &std::path::Path, database_url: &str) -> (bool, String) {
    let out = Command::new(ASBX)
        .args(["audit", "verify"])
        .env_clear()
        .env("ASBX_DATA", data)
        .env("DATABASE_URL", database_url)
        .env("ASBX_SECRET_KEY", TEST_SECRET_KEY)
        .env("ASBX_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

async fn egress_and_model_calls_are_audited_and_an_edit_is_named(
    database_url: &str,
    edit: impl Fn(&str),
) {
    let data = tempfile::tempdir().unwrap();
    let mock = MockProvider::start().await;
    let runner = RunnerProc::start(&[
        ("OPENAI_BASE_URL", mock.base_url.as_str()),
        ("OPENAI_API_KEY", "sk-audit"),
    ]);
    let data_path = data.path().to_str().unwrap().to_owned();
    let ws = WorkspaceProc::start(
        "127.0.0.1:0",
        &[
            ("SANDBOX_URL", runner.url.as_str()),
            ("DATABASE_URL", database_url),
            ("ASBX_SECRET_KEY", TEST_SECRET_KEY),
            ("ASBX_DATA", data_path.as_str()),
        ],
    );

    // A tool call whose request the proxy refuses.
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": EGRESS_PROBE}},
        {"say": "probed"}
    ]));
    let (probe, text) = run(&ws.url, json!({ "prompt": prompt })).await;
    assert!(text.contains("egress=403"), "{text}");
    let records = audit_of(&ws.url, &probe, |r| !of_kind(r, "egress").is_empty()).await;
    let egress = of_kind(&records, "egress");
    assert_eq!(egress.len(), 1, "{records:?}");
    let e = egress[0];
    assert_eq!(e["host"], "blocked.example", "{e}");
    assert_eq!(e["port"], 80, "{e}");
    assert_eq!(e["method"], "GET", "{e}");
    assert_eq!(e["allowed"], false, "{e}");
    assert_eq!(e["code"], "egress_host_not_allowed", "{e}");
    assert_eq!(e["bytesIn"], 0, "{e}");
    assert_eq!(e["runId"], probe.as_str());
    let tools = of_kind(&records, "tool_call");
    assert_eq!(tools.len(), 1, "{records:?}");
    assert_eq!(tools[0]["name"], "shell");
    assert_eq!(tools[0]["exitCode"], 0);
    assert!(tools[0]["durationMs"].is_u64(), "{}", tools[0]);
    let routes: Vec<&Value> = of_kind(&records, "callback")
        .iter()
        .map(|r| &r["route"])
        .collect();
    assert!(routes.contains(&&json!("env")), "{records:?}");
    assert!(routes.contains(&&json!("config")), "{records:?}");
    // No token, no secret, no output.
    let all = serde_json::to_string(&records).unwrap();
    assert!(
        !all.contains("asbx_otp_") && !all.contains("sk-audit"),
        "{all}"
    );

    // A model call through the gateway, with the provider's counts.
    mock.push(Tape::text("the model answered"));
    let (call, text) = run(
        &ws.url,
        json!({ "prompt": "hello", "model": "openai:test-model" }),
    )
    .await;
    assert!(text.contains("the model answered"), "{text}");
    let records = audit_of(&ws.url, &call, |r| !of_kind(r, "model_call").is_empty()).await;
    let calls = of_kind(&records, "model_call");
    assert_eq!(calls.len(), 1, "{records:?}");
    let m = calls[0];
    assert_eq!(m["provider"], "openai", "{m}");
    assert_eq!(m["model"], "test-model", "{m}");
    assert_eq!(m["status"], 200, "{m}");
    assert!(m["inputTokens"].as_u64().is_some_and(|n| n > 0), "{m}");
    assert!(m["outputTokens"].as_u64().is_some_and(|n| n > 0), "{m}");

    // The chain verifies; an edited record is named.
    drop(ws);
    let (ok, out) = verify(data.path(), database_url);
    assert!(ok, "{out}");
    assert!(out.contains("chain intact"), "{out}");
    let id = e["id"].as_i64().unwrap();
    edit(&format!(
        "UPDATE audit_records SET record = REPLACE(record, 'blocked.example', 'other.example') \
         WHERE id = {id}"
    ));
    let (ok, out) = verify(data.path(), database_url);
    assert!(!ok, "{out}");
    assert!(out.contains(&format!("record {id} ")), "{out}");
    runner.assert_clean().await;
}

#[tokio::test]
async fn egress_and_model_calls_are_audited_and_an_edit_is_named_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("audit.db");
    let url = format!("sqlite://{}", db.display());
    egress_and_model_calls_are_audited_and_an_edit_is_named(&url, |sql| {
        let out = Command::new("sqlite3").arg(&db).arg(sql).output().unwrap();
        assert!(out.status.success(), "{out:?}");
    })
    .await;
}

#[tokio::test]
async fn egress_and_model_calls_are_audited_and_an_edit_is_named_on_postgres() {
    let Ok(server) = std::env::var("ASBX_TEST_PG_URL") else {
        asbx_test_support::skip(
            "audit::egress_and_model_calls_are_audited_and_an_edit_is_named_on_postgres",
            "set ASBX_TEST_PG_URL to run on PostgreSQL",
        );
        return;
    };
    let db = PgDatabase::create(&server, "asbx_audit");
    egress_and_model_calls_are_audited_and_an_edit_is_named(&db.url, |sql| {
        db.query(sql);
    })
    .await;
}
