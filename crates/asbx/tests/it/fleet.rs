//! A runner fleet end to end: two real `asbx runner` processes (capacity 1
//! and 4) behind one `asbx workspace` whose `SANDBOX_URL` lists both.
//! Concurrent runs fill exactly the capacity of each, a run beyond it gets
//! the runners' `503`, and once a runner is down runs land on the other.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{RunnerProc, WorkspaceProc, script};

/// Starts a run; its id and the response, unread.
async fn start_run(ws: &WorkspaceProc, command: &str) -> (String, reqwest::Response) {
    let prompt = script(json!([{"tool": "shell", "args": {"command": command}}, {"say": "ok"}]));
    let resp = reqwest::Client::new()
        .post(format!("{}/api/runs", ws.url))
        .json(&json!({"prompt": prompt}))
        .send()
        .await
        .unwrap();
    let id = resp
        .headers()
        .get("x-asbx-run-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (id, resp)
}

/// The last NDJSON line of a finished run.
async fn last_line(resp: reqwest::Response) -> Value {
    let body = tokio::time::timeout(Duration::from_secs(120), resp.bytes())
        .await
        .expect("the run ended within 120 s")
        .unwrap();
    body.split(|b| *b == b'\n')
        .rfind(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .unwrap_or(Value::Null)
}

/// Whether `runner` knows session `id` (`GET /v1/sessions/{id}`).
async fn knows(runner: &RunnerProc, id: &str) -> bool {
    let status = reqwest::get(format!("{}/v1/sessions/{id}", runner.url))
        .await
        .unwrap()
        .status();
    assert!(status == 200 || status == 404, "{status}");
    status == 200
}

#[tokio::test]
async fn runs_spread_over_two_runners_by_capacity_and_skip_a_full_or_down_one() {
    let mut small = RunnerProc::start(&[("ASBX_MAX_SANDBOXES", "1"), ("ASBX_WARM_POOL", "0")]);
    let big = RunnerProc::start(&[("ASBX_MAX_SANDBOXES", "4"), ("ASBX_WARM_POOL", "0")]);
    let health: Value = reqwest::get(format!("{}/healthz", big.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (health["capacity"].as_u64(), health["free"].as_u64()),
        (Some(4), Some(4)),
        "{health}"
    );
    assert_eq!(health["sessions"], 0, "{health}");
    let fleet = format!("{},{}", small.url, big.url);
    // This test is about the fleet, not the fair share between workspaces
    // (which holds one workspace to half of it): a limit of its own.
    let ws = WorkspaceProc::start(
        "127.0.0.1:0",
        &[
            ("SANDBOX_URL", &fleet),
            ("ASBX_QUOTA_CONCURRENT_SANDBOXES", "100"),
        ],
    );

    // Five at once fill both runners; each holds its sandbox a while.
    let mut held = Vec::new();
    for _ in 0..5 {
        let (id, resp) = start_run(&ws, "sleep 20").await;
        assert_eq!(resp.status(), 200, "run {id}: {:?}", resp.text().await);
        held.push((id, resp));
    }
    let health: Value = reqwest::get(format!("{}/healthz", big.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["free"], 0, "{health}");
    // A sixth finds every runner full: the runners' 503 passes through.
    let (id, resp) = start_run(&ws, "true").await;
    assert_eq!(resp.status(), 503, "run {id}");
    let problem: Value = resp.json().await.unwrap();
    assert_eq!(problem["code"], "at_capacity", "{problem}");

    let mut on_small = 0;
    let mut on_big = 0;
    for (id, resp) in held {
        let last = last_line(resp).await;
        assert_eq!(last["type"], "result", "run {id}: {last}");
        match (knows(&small, &id).await, knows(&big, &id).await) {
            (true, false) => on_small += 1,
            (false, true) => on_big += 1,
            other => panic!("run {id} on {other:?}"),
        }
    }
    assert_eq!(
        (on_small, on_big),
        (1, 4),
        "each runner filled to its capacity"
    );

    // The small runner goes down: runs land on the big one.
    small.terminate();
    for _ in 0..2 {
        let (id, resp) = start_run(&ws, "true").await;
        assert_eq!(resp.status(), 200, "run {id}");
        let last = last_line(resp).await;
        assert_eq!(last["type"], "result", "run {id}: {last}");
        assert!(
            knows(&big, &id).await,
            "run {id} is not on the runner still up"
        );
    }
    big.assert_clean().await;
}
