//! Running runs and chat turns that cross a daily quota (CONTRACT §10): a
//! run crossing `tokens-per-day` (as the runner's model-call reports come)
//! or `sandbox-seconds-per-day` (a timer set at dispatch) ends with `error`
//! `quota_exceeded`, its lines so far kept, its sandbox cancelled.

use std::time::Duration;

use asbx_workspace::Quota;
use serde_json::{Value, json};

use crate::support::{
    Db, FakeRunner, Mode, SseReader, TestWorkspace, client, get_json, on_both, post_turn,
    settled_run, to_noon,
};

async fn post_run(ws: &TestWorkspace) -> reqwest::Response {
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x", "protocol": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp
}

/// Posts a runner's report of one model call of `tokens` (input and
/// output halves) for the runner's `n`th dispatch.
async fn report_tokens(ws: &TestWorkspace, runner: &FakeRunner, n: usize, tokens: u64) {
    let session = runner.dispatches()[n].session_id.clone().unwrap();
    let token = runner.audit_tokens()[n].clone().expect("an audit token");
    let input = tokens / 2;
    let resp = client()
        .post(ws.url(&format!("/api/assistant/sandbox/{session}/audit")))
        .bearer_auth(token)
        .header("x-asbx-audit-version", "1")
        .json(&json!({"events": [{
            "kind": "model_call", "provider": "openai", "model": "m",
            "inputTokens": input, "outputTokens": tokens - input, "status": 200,
        }]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204, "{}", resp.text().await.unwrap());
}

/// Reads an NDJSON stream to its end (bounded): its lines.
async fn read_lines(mut resp: reqwest::Response) -> Vec<Value> {
    let mut bytes = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(c) = resp.chunk().await.unwrap() {
            bytes.extend_from_slice(&c);
        }
    })
    .await
    .expect("the stream ended");
    String::from_utf8(bytes)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

async fn used_tokens(ws: &TestWorkspace) -> Value {
    let u: Value = get_json(ws, "/api/usage").await;
    u["used"]["tokens-per-day"].clone()
}

on_both!(a_run_crossing_tokens_per_day_ends_quota_exceeded);
async fn a_run_crossing_tokens_per_day_ends_quota_exceeded(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |c| {
        c.quotas.set(Quota::TokensPerDay, Some(100));
    })
    .await;
    to_noon(&ws);
    let mut resp = post_run(&ws).await;
    let run_id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let first = resp.chunk().await.unwrap().unwrap();
    // Under the quota: the run goes on, its tokens counted as they come.
    report_tokens(&ws, &runner, 0, 60).await;
    assert_eq!(used_tokens(&ws).await, 60.0);
    assert_eq!(settled_or_running(&ws, &run_id).await, "running");
    // Across it: ended.
    report_tokens(&ws, &runner, 0, 50).await;
    let mut lines: Vec<Value> = String::from_utf8(first.to_vec())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    lines.extend(read_lines(resp).await);
    let last = lines.last().unwrap();
    assert_eq!(last["type"], "error", "{lines:?}");
    assert_eq!(last["code"], "quota_exceeded", "{last}");
    assert!(
        last["message"].as_str().unwrap().contains("tokens-per-day"),
        "{last}"
    );
    // The lines before it are kept.
    assert!(lines.iter().any(|l| l["type"] == "step"), "{lines:?}");
    let run = settled_run(&ws, &run_id).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "quota_exceeded", "{run}");
    let stored: Vec<Value> = client()
        .get(ws.url(&format!("/api/runs/{run_id}/events")))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(stored.last().unwrap()["code"], "quota_exceeded");
    assert_eq!(
        stored.len(),
        lines.len(),
        "every line the client saw is stored"
    );
    // The sandbox was cancelled; the day's tally keeps the tokens.
    assert_eq!(runner.deletes(), vec![run_id.clone()]);
    assert_eq!(used_tokens(&ws).await, 110.0);
}

/// The run's `status`, read once.
async fn settled_or_running(ws: &TestWorkspace, id: &str) -> Value {
    let v: Value = get_json(ws, &format!("/api/runs/{id}")).await;
    v["status"].clone()
}

on_both!(a_run_crossing_sandbox_seconds_per_day_ends_quota_exceeded);
async fn a_run_crossing_sandbox_seconds_per_day_ends_quota_exceeded(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |c| {
        c.quotas.set(Quota::SandboxSecondsPerDay, Some(2));
    })
    .await;
    to_noon(&ws);
    let started = tokio::time::Instant::now();
    let mut resp = post_run(&ws).await;
    let run_id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    resp.chunk().await.unwrap().unwrap();
    // The budget is spent while the run runs (the test clock stands still
    // otherwise); the timer set at dispatch for the 2 s left fires.
    ws.clock.advance(Duration::from_secs(3));
    let lines = read_lines(resp).await;
    let last = lines.last().unwrap();
    assert_eq!(last["code"], "quota_exceeded", "{lines:?}");
    assert!(
        last["message"]
            .as_str()
            .unwrap()
            .contains("sandbox-seconds-per-day"),
        "{last}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "ended by its timer, {:?}",
        started.elapsed()
    );
    let run = settled_run(&ws, &run_id).await;
    assert_eq!(run["error"]["code"], "quota_exceeded", "{run}");
    assert_eq!(runner.deletes(), vec![run_id]);
}

on_both!(a_chat_turn_crossing_tokens_per_day_is_stored_failed);
async fn a_chat_turn_crossing_tokens_per_day_is_stored_failed(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |c| {
        c.quotas.set(Quota::TokensPerDay, Some(10));
    })
    .await;
    to_noon(&ws);
    let resp = post_turn(&ws, json!({"message": "go"})).await;
    assert_eq!(resp.status(), 200);
    let chat_id = resp.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut sse = SseReader::new(resp);
    // Some output first.
    while sse.next().await.unwrap().event != "step" {}
    report_tokens(&ws, &runner, 0, 11).await;
    let events = sse.until_done().await;
    let last_two = &events[events.len() - 2..];
    assert_eq!(last_two[0].event, "error", "{events:?}");
    assert_eq!(last_two[0].data["code"], "quota_exceeded");
    assert_eq!(last_two[1].data["status"], "failed");
    let detail = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let d: Value = get_json(&ws, &format!("/api/assistant/chats/{chat_id}")).await;
            if d["messages"].as_array().unwrap().len() >= 2 && d["activeTurnId"].is_null() {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the chat settled");
    let content = detail["messages"][1]["content"].as_array().unwrap();
    // The turn's output so far is kept, its end says why.
    assert!(content.iter().any(|b| b["type"] == "step"), "{content:?}");
    assert_eq!(content.last().unwrap()["type"], "error");
    assert_eq!(content.last().unwrap()["code"], "quota_exceeded");
}
