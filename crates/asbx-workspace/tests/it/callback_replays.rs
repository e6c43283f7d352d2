//! A redeemed callback answered once more to its retry (docs/protocol.md
//! §3): the same token with the same request id (`x-asbx-request-id`),
//! within two minutes, while the run runs; nothing else.

use std::time::Duration;

use asbx_protocol::DispatchRequest;
use serde_json::{Value, json};

use crate::support::{Db, FakeRunner, Mode, TestWorkspace, client, on_both, problem};

const ID: &str = "x-asbx-request-id";

/// Starts a held run: its dispatch (with the plaintext tokens) and stream.
async fn held_run(
    ws: &TestWorkspace,
    runner: &FakeRunner,
    n: usize,
) -> (DispatchRequest, reqwest::Response) {
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "hi", "variables": {"A": "1"},
                      "limits": {"max_duration_ms": 60_000}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    (runner.next_dispatch(n).await, resp)
}

async fn get(url: &str, token: &str, request_id: Option<&str>) -> reqwest::Response {
    let mut req = client().get(url).bearer_auth(token);
    if let Some(id) = request_id {
        req = req.header(ID, id);
    }
    req.send().await.unwrap()
}

async fn ok_json(resp: reqwest::Response) -> Value {
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

async fn rejected(resp: reqwest::Response) {
    assert_eq!(problem(resp, 401).await["code"], "otp_rejected");
}

fn request_id() -> String {
    crate::support::random_hex()
}

on_both!(env_is_answered_once_more_to_its_retry_with_a_fresh_bearer);
async fn env_is_answered_once_more_to_its_retry_with_a_fresh_bearer(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let (d, _s) = held_run(&ws, &runner, 0).await;
    let url = format!("{}/env", d.agent_url);
    let id = request_id();
    let first = ok_json(get(&url, &d.otp_setup, Some(&id)).await).await;
    let again = ok_json(get(&url, &d.otp_setup, Some(&id)).await).await;
    // The same answer, but for the bearer: minted afresh, the lost one
    // revoked (only bearer hashes are ever stored).
    let (mut a, mut b) = (first.clone(), again.clone());
    let lost = a["workspace"]
        .as_object_mut()
        .unwrap()
        .remove("token")
        .unwrap();
    let fresh = b["workspace"]
        .as_object_mut()
        .unwrap()
        .remove("token")
        .unwrap();
    assert_eq!(a, b);
    assert_eq!(a["variables"], json!({"A": "1"}));
    assert_ne!(lost, fresh);
    let files = format!("{}/workspace/files", d.agent_url);
    assert_eq!(
        get(&files, fresh.as_str().unwrap(), None).await.status(),
        200
    );
    assert_eq!(
        get(&files, lost.as_str().unwrap(), None).await.status(),
        401
    );
    // Once more only: a third try with the same id is refused.
    rejected(get(&url, &d.otp_setup, Some(&id)).await).await;
}

on_both!(only_the_same_request_id_is_answered_again);
async fn only_the_same_request_id_is_answered_again(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let (d, _s) = held_run(&ws, &runner, 0).await;
    let url = format!("{}/config", d.agent_url);
    let id = request_id();
    let first = ok_json(get(&url, &d.otp_run, Some(&id)).await).await;
    // Another id, or none, is a second use: refused, and it takes nothing.
    rejected(get(&url, &d.otp_run, Some(&request_id())).await).await;
    rejected(get(&url, &d.otp_run, None).await).await;
    let again = ok_json(get(&url, &d.otp_run, Some(&id)).await).await;
    assert_eq!(first, again);
    rejected(get(&url, &d.otp_run, Some(&id)).await).await;

    // A token redeemed without a request id is never answered again.
    let env = format!("{}/env", d.agent_url);
    ok_json(get(&env, &d.otp_setup, None).await).await;
    rejected(get(&env, &d.otp_setup, Some(&id)).await).await;
    rejected(get(&env, &d.otp_setup, None).await).await;

    // A malformed request id is 400, before anything is redeemed.
    let (d2, _s2) = held_run(&ws, &runner, 1).await;
    let url2 = format!("{}/config", d2.agent_url);
    let p = problem(get(&url2, &d2.otp_run, Some("short")).await, 400).await;
    assert_eq!(p["code"], "invalid_request");
    ok_json(get(&url2, &d2.otp_run, None).await).await;
}

on_both!(a_retry_after_the_window_is_refused);
async fn a_retry_after_the_window_is_refused(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let (d, _s) = held_run(&ws, &runner, 0).await;
    let config = format!("{}/config", d.agent_url);
    let env = format!("{}/env", d.agent_url);
    let (id_config, id_env) = (request_id(), request_id());
    ok_json(get(&config, &d.otp_run, Some(&id_config)).await).await;
    ok_json(get(&env, &d.otp_setup, Some(&id_env)).await).await;
    // Just inside the window: answered.
    ws.clock.advance(Duration::from_millis(119_999));
    ok_json(get(&env, &d.otp_setup, Some(&id_env)).await).await;
    // Two minutes on: refused.
    ws.clock.advance(Duration::from_millis(1));
    rejected(get(&config, &d.otp_run, Some(&id_config)).await).await;
}

on_both!(another_dispatchs_or_routes_token_is_refused);
async fn another_dispatchs_or_routes_token_is_refused(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let (a, _sa) = held_run(&ws, &runner, 0).await;
    let (b, _sb) = held_run(&ws, &runner, 1).await;
    let id = request_id();
    ok_json(get(&format!("{}/config", a.agent_url), &a.otp_run, Some(&id)).await).await;
    // a's token and id at b's path: another dispatch's token.
    rejected(get(&format!("{}/config", b.agent_url), &a.otp_run, Some(&id)).await).await;
    // a's run token at a's /env: another route's token.
    rejected(get(&format!("{}/env", a.agent_url), &a.otp_run, Some(&id)).await).await;
    // b's own token with a's id is b's first redemption, and answers b.
    let bc = ok_json(get(&format!("{}/config", b.agent_url), &b.otp_run, Some(&id)).await).await;
    assert!(bc["model"].is_string());
    // None of that took a's retry.
    ok_json(get(&format!("{}/config", a.agent_url), &a.otp_run, Some(&id)).await).await;
}

on_both!(a_settled_runs_callbacks_are_not_answered_again);
async fn a_settled_runs_callbacks_are_not_answered_again(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let (d, resp) = held_run(&ws, &runner, 0).await;
    let url = format!("{}/config", d.agent_url);
    let id = request_id();
    ok_json(get(&url, &d.otp_run, Some(&id)).await).await;
    runner.shared.release.notify_one();
    resp.text().await.unwrap();
    rejected(get(&url, &d.otp_run, Some(&id)).await).await;
}

on_both!(results_are_stored_once_and_answered_again);
async fn results_are_stored_once_and_answered_again(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let (d, _s) = held_run(&ws, &runner, 0).await;
    let url = format!("{}/results", d.agent_url);
    let upload = d.otp_upload.clone().unwrap();
    let body = json!({"files": [
        {"path": "a.txt", "content_base64": "aGk="},
        {"path": "b/c.txt", "content_base64": "aG8="},
    ]});
    let post = |id: Option<String>| {
        let mut req = client().post(&url).bearer_auth(&upload).json(&body);
        if let Some(id) = id {
            req = req.header(ID, id);
        }
        req.send()
    };
    let id = request_id();
    let first = ok_json(post(Some(id.clone())).await.unwrap()).await;
    assert_eq!(first["files"].as_array().unwrap().len(), 2, "{first}");
    rejected(post(Some(request_id())).await.unwrap()).await;
    rejected(post(None).await.unwrap()).await;
    let again = ok_json(post(Some(id.clone())).await.unwrap()).await;
    assert_eq!(first, again, "the same file ids");
    rejected(post(Some(id)).await.unwrap()).await;

    // Stored once: two file rows for the run, the ones answered.
    let session = d.session_id.clone().unwrap();
    let pool = ws.db().await;
    let mut rows: Vec<(String,)> =
        sqlx::query_as("SELECT id FROM files WHERE run_id = $1 ORDER BY path")
            .bind(&session)
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    let mut answered: Vec<(String,)> = first["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["id"].as_str().unwrap().to_owned(),))
        .collect();
    rows.sort();
    answered.sort();
    assert_eq!(rows, answered);
}

on_both!(concurrent_retries_have_one_winner);
async fn concurrent_retries_have_one_winner(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let (d, _s) = held_run(&ws, &runner, 0).await;
    let url = format!("{}/config", d.agent_url);
    let id = request_id();
    let attempts = (0..12).map(|_| {
        let (url, token, id) = (url.clone(), d.otp_run.clone(), id.clone());
        tokio::spawn(async move { get(&url, &token, Some(&id)).await.status().as_u16() })
    });
    let mut statuses = Vec::new();
    for a in attempts {
        statuses.push(a.await.unwrap());
    }
    // The redemption and its one retry; everything else refused.
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        2,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 401).count(),
        10,
        "{statuses:?}"
    );
}
