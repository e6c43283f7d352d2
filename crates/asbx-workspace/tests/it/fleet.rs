//! A runner fleet: `SANDBOX_URL` lists several runners; dispatches spread by
//! free capacity, skip a runner that is full (`503`) or down, and the run
//! remembers the runner that served it.

use serde_json::{Value, json};
use url::Url;

use crate::support::{Db, FakeRunner, Mode, TestWorkspace, client, on_both, problem, settled_run};

async fn fleet_workspace(db: Db, runners: &[Url]) -> TestWorkspace {
    let all = runners.to_vec();
    TestWorkspace::start_on(db, runners.first().cloned(), move |c| {
        c.sandbox_urls = all;
        c.runner_token = Some("fleet-secret".to_owned());
    })
    .await
}

/// `POST /api/runs`; the run id and the whole body when it streamed.
async fn run(ws: &TestWorkspace) -> (String, u16, Value) {
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "hello"}))
        .send()
        .await
        .unwrap();
    let id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let status = resp.status().as_u16();
    let body = resp.bytes().await.unwrap();
    let last = body
        .split(|b| *b == b'\n')
        .rfind(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap_or(Value::Null))
        .unwrap_or(Value::Null);
    (id, status, last)
}

fn session_ids(r: &FakeRunner) -> Vec<String> {
    r.dispatches()
        .into_iter()
        .map(|d| d.session_id.unwrap_or_default())
        .collect()
}

/// A port nothing listens on any more.
async fn closed_port() -> Url {
    let port = crate::support::bind_loopback()
        .await
        .local_addr()
        .unwrap()
        .port();
    format!("http://127.0.0.1:{port}").parse().unwrap()
}

fn at_capacity() -> Value {
    json!({"type": "urn:asbx:problem:at_capacity", "title": "Runner at capacity",
           "status": 503, "detail": "at capacity: 1 sandboxes running", "code": "at_capacity"})
}

on_both!(dispatches_spread_by_free_capacity);
async fn dispatches_spread_by_free_capacity(db: Db) {
    let a = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let b = FakeRunner::start(Mode::Full { files: vec![] }).await;
    // `b` has more room: the first dispatches go there until it has no more
    // free than `a`, then they alternate.
    a.set_health(json!({"status": "ok", "sessions": 0, "capacity": 2, "free": 2}));
    b.set_health(json!({"status": "ok", "sessions": 0, "capacity": 4, "free": 4}));
    let ws = fleet_workspace(db, &[a.url.clone(), b.url.clone()]).await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        let (id, status, last) = run(&ws).await;
        assert_eq!(status, 200);
        assert_eq!(last["type"], "result", "{last}");
        ids.push(id);
    }
    let (on_a, on_b) = (session_ids(&a), session_ids(&b));
    assert_eq!(on_a.len() + on_b.len(), 6, "a: {on_a:?} b: {on_b:?}");
    assert!(
        on_b.len() >= 3 && !on_a.is_empty(),
        "a: {on_a:?} b: {on_b:?}"
    );
    assert_eq!(
        on_b[..2],
        ids[..2],
        "the runner with the most free capacity first"
    );
    // The operator's token goes to every runner of the fleet.
    for auth in a.authorizations().into_iter().chain(b.authorizations()) {
        assert_eq!(auth.as_deref(), Some("Bearer fleet-secret"));
    }
    for id in &ids {
        assert_eq!(settled_run(&ws, id).await["status"], "succeeded");
    }
}

on_both!(a_full_runner_is_skipped_and_the_run_remembers_its_runner);
async fn a_full_runner_is_skipped_and_the_run_remembers_its_runner(db: Db) {
    // `a` looks the emptiest (a stale view) but answers 503 at_capacity.
    let a = FakeRunner::start(Mode::Reject(503, at_capacity())).await;
    let b = FakeRunner::start(Mode::Hold).await;
    a.set_health(json!({"status": "ok", "free": 50}));
    b.set_health(json!({"status": "ok", "free": 1}));
    let ws = fleet_workspace(db, &[a.url.clone(), b.url.clone()]).await;
    let mut resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("running"));
    // Tried on `a` first, then the same session (and the same one-time
    // tokens, which nothing redeemed) on `b`.
    let (tried, served) = (a.dispatches(), b.dispatches());
    assert_eq!(tried.len(), 1);
    assert_eq!(served.len(), 1);
    assert_eq!(tried[0].session_id.as_deref(), Some(id.as_str()));
    assert_eq!(served[0].session_id.as_deref(), Some(id.as_str()));
    assert_eq!(tried[0].otp_run, served[0].otp_run);
    // Its `/healthz` now says so too, so a refresh keeps it last.
    a.set_health(json!({"status": "ok", "free": 0}));
    // A later call for the run goes to the runner that served it.
    let cancel = client()
        .delete(ws.url(&format!("/api/runs/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), 202);
    drop(resp);
    assert_eq!(settled_run(&ws, &id).await["status"], "failed");
    // `b` does not know the session (this fake answers `404`), so the
    // relay, cancelled, asks it once more for the session's end.
    let deletes = b.deletes();
    assert!(
        !deletes.is_empty() && deletes.iter().all(|d| d == &id),
        "{deletes:?}"
    );
    assert!(a.deletes().is_empty(), "{:?}", a.deletes());

    // Now `a` is known full: the next dispatch goes straight to `b`.
    *b.shared.mode.lock().unwrap() = Mode::Full { files: vec![] };
    let (id2, status, last) = run(&ws).await;
    assert_eq!((status, &last["type"]), (200, &json!("result")), "{last}");
    assert_eq!(
        a.dispatches().len(),
        1,
        "the full runner was not asked again"
    );
    assert_eq!(session_ids(&b)[1], id2);
    // The sandbox on `b` redeemed the tokens the first runner was sent.
    let callbacks = b.callbacks();
    assert!(!callbacks.is_empty());
    for (route, status, _) in callbacks {
        assert_eq!(status, 200, "{route}");
    }
}

on_both!(a_runner_that_is_down_is_skipped);
async fn a_runner_that_is_down_is_skipped(db: Db) {
    let down = closed_port().await;
    let b = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = fleet_workspace(db, &[down, b.url.clone()]).await;
    for _ in 0..3 {
        let (id, status, last) = run(&ws).await;
        assert_eq!(status, 200);
        assert_eq!(last["type"], "result", "{last}");
        assert_eq!(settled_run(&ws, &id).await["status"], "succeeded");
    }
    assert_eq!(b.dispatches().len(), 3);
}

#[tokio::test]
async fn every_runner_refusing_is_a_clear_problem() {
    // All full: the last runner's problem passes through, the run is failed.
    let a = FakeRunner::start(Mode::Reject(503, at_capacity())).await;
    let b = FakeRunner::start(Mode::Reject(503, at_capacity())).await;
    let ws = fleet_workspace(Db::Sqlite, &[a.url.clone(), b.url.clone()]).await;
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    let id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    assert_eq!(problem(resp, 503).await, at_capacity());
    assert_eq!(
        (a.dispatches().len(), b.dispatches().len()),
        (1, 1),
        "each runner once"
    );
    let run = settled_run(&ws, &id).await;
    assert_eq!(run["status"], "failed");
    assert_eq!(run["error"]["code"], "at_capacity");

    // All down: 502 upstream_failed, after trying each once.
    let ws = fleet_workspace(Db::Sqlite, &[closed_port().await, closed_port().await]).await;
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(problem(resp, 502).await["code"], "upstream_failed");
}

on_both!(stopping_a_chat_turn_asks_the_runner_that_serves_it);
async fn stopping_a_chat_turn_asks_the_runner_that_serves_it(db: Db) {
    // `a` looks the emptiest but is full: the turn lands on `b`.
    let a = FakeRunner::start(Mode::Reject(503, at_capacity())).await;
    let b = FakeRunner::start(Mode::Hold).await;
    a.set_health(json!({"status": "ok", "free": 50}));
    b.set_health(json!({"status": "ok", "free": 1}));
    let ws = fleet_workspace(db, &[a.url.clone(), b.url.clone()]).await;
    let mut resp = crate::support::post_turn(&ws, json!({"message": "go"})).await;
    assert_eq!(resp.status(), 200);
    let header = |name: &str| resp.headers()[name].to_str().unwrap().to_owned();
    let (chat_id, turn_id) = (header("x-asbx-chat-id"), header("x-asbx-turn-id"));
    resp.chunk().await.unwrap().expect("the turn streams");
    assert_eq!(session_ids(&b), std::slice::from_ref(&turn_id));

    let r = client()
        .post(ws.url(&format!("/api/assistant/chats/{chat_id}/cancel")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while b.deletes().is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(b.deletes(), [turn_id]);
    assert!(a.deletes().is_empty(), "{:?}", a.deletes());
}
