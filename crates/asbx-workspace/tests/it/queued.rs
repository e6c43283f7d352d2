//! A dispatch waiting for its fair share tells a client that asked
//! (`Prefer: queued-notice`) at once, then runs or is refused in the same
//! answer; a client that goes away while queued gives up its place.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Db, FakeRunner, Mode, SseReader, TestWorkspace, client, on_both};

/// A fleet of 2 (one sandbox each while another waits) whose one is held,
/// so the next dispatch queues for at most `wait`.
async fn one_held(db: Db, wait: Duration) -> (FakeRunner, TestWorkspace, reqwest::Response) {
    let runner = FakeRunner::start(Mode::Hold).await;
    runner.set_health(json!({"status": "ok", "capacity": 2}));
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |c| {
        c.queue_wait = wait;
    })
    .await;
    let held = post(
        &ws,
        "/api/runs",
        json!({"prompt": "x", "protocol": 2}),
        false,
    )
    .await;
    assert_eq!(held.status(), 200);
    (runner, ws, held)
}

async fn post(ws: &TestWorkspace, path: &str, body: Value, notice: bool) -> reqwest::Response {
    let mut req = client().post(ws.url(path)).json(&body);
    if notice {
        req = req.header("prefer", "queued-notice");
    }
    req.send().await.unwrap()
}

/// Reads NDJSON lines off a response (20 s at most for each).
struct Lines {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl Lines {
    fn new(resp: reqwest::Response) -> Self {
        Lines {
            resp,
            buf: Vec::new(),
        }
    }

    async fn next(&mut self) -> Option<Value> {
        tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = self.buf.drain(..=i).collect();
                    return Some(serde_json::from_slice(&line).unwrap());
                }
                self.buf
                    .extend_from_slice(&self.resp.chunk().await.unwrap()?);
            }
        })
        .await
        .expect("a line within 20 s")
    }
}

fn queued_at_once(resp: &reqwest::Response, started: tokio::time::Instant, content_type: &str) {
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], content_type);
    assert_eq!(resp.headers()["preference-applied"], "queued-notice");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "answered before the wait's end: {:?}",
        started.elapsed()
    );
}

/// A protocol 2 run asking for the notice, answered at once as queued;
/// when it was posted.
async fn queued_run(ws: &TestWorkspace) -> (tokio::time::Instant, reqwest::Response) {
    let started = tokio::time::Instant::now();
    let resp = post(ws, "/api/runs", json!({"prompt": "y", "protocol": 2}), true).await;
    queued_at_once(&resp, started, "application/x-ndjson");
    (started, resp)
}

on_both!(a_queued_run_is_told_at_once_then_refused_in_the_stream);
async fn a_queued_run_is_told_at_once_then_refused_in_the_stream(db: Db) {
    let (runner, ws, held) = one_held(db, Duration::from_millis(1500)).await;
    let (started, resp) = queued_run(&ws).await;
    let mut lines = Lines::new(resp);
    let queued = lines.next().await.unwrap();
    assert_eq!(
        queued,
        json!({"type": "queued", "quota": "concurrent-sandboxes", "waitS": 2})
    );
    let refused = lines.next().await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(1400),
        "it waited"
    );
    assert_eq!(refused["type"], "refused", "{refused}");
    assert_eq!(refused["status"], 429, "{refused}");
    assert!(
        refused["retryAfter"].as_u64().is_some_and(|s| s > 0),
        "{refused}"
    );
    assert_eq!(refused["problem"]["code"], "quota_exceeded", "{refused}");
    assert_eq!(
        refused["problem"]["quota"], "concurrent-sandboxes",
        "{refused}"
    );
    assert_eq!(lines.next().await, None, "nothing after the refusal");
    assert_eq!(
        runner.dispatches().len(),
        1,
        "the refused run reached no runner"
    );
    runner.shared.release.notify_one();
    drop(held);
}

on_both!(a_queued_run_runs_in_the_same_answer_once_room_frees);
async fn a_queued_run_runs_in_the_same_answer_once_room_frees(db: Db) {
    let (runner, ws, held) = one_held(db, Duration::from_secs(20)).await;
    let (_, resp) = queued_run(&ws).await;
    let run_id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let mut lines = Lines::new(resp);
    assert_eq!(lines.next().await.unwrap()["type"], "queued");
    // The held run ends: the queued one is dispatched, its lines follow.
    runner.shared.release.notify_one();
    let first = lines.next().await.unwrap();
    assert_eq!(
        first["seq"], 1,
        "the session's own lines, from its first: {first}"
    );
    assert_eq!(
        first["sessionId"],
        run_id.as_str(),
        "the id told while queued"
    );
    assert_eq!(runner.dispatches().len(), 2);
    runner.shared.release.notify_one();
    let mut last = first;
    while let Some(line) = lines.next().await {
        last = line;
    }
    assert!(
        matches!(last["type"].as_str(), Some("result" | "session_ended")),
        "{last}"
    );
    drop(held);
}

on_both!(a_client_gone_while_queued_gives_up_its_place);
async fn a_client_gone_while_queued_gives_up_its_place(db: Db) {
    let (runner, ws, held) = one_held(db, Duration::from_secs(20)).await;
    let (_, resp) = queued_run(&ws).await;
    let mut lines = Lines::new(resp);
    assert_eq!(lines.next().await.unwrap()["type"], "queued");
    drop(lines);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Room frees: nobody is waiting any more, nothing is dispatched.
    runner.shared.release.notify_one();
    drop(held);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        runner.dispatches().len(),
        1,
        "the gone client's run never ran"
    );
    let (runs,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM runs")
        .fetch_one(&ws.db().await)
        .await
        .unwrap();
    assert_eq!(runs, 1, "only the held run was recorded");
}

on_both!(a_run_without_the_preference_waits_before_its_answer);
async fn a_run_without_the_preference_waits_before_its_answer(db: Db) {
    let (runner, ws, held) = one_held(db, Duration::from_millis(800)).await;
    let started = tokio::time::Instant::now();
    let resp = post(
        &ws,
        "/api/runs",
        json!({"prompt": "y", "protocol": 2}),
        false,
    )
    .await;
    assert_eq!(resp.status(), 429);
    assert!(started.elapsed() >= Duration::from_millis(700));
    assert!(resp.headers().get("preference-applied").is_none());
    // Nor protocol 1, whose consumers know only its four line types.
    let started = tokio::time::Instant::now();
    let resp = post(&ws, "/api/runs", json!({"prompt": "y"}), true).await;
    assert_eq!(resp.status(), 429);
    assert!(started.elapsed() >= Duration::from_millis(700));
    runner.shared.release.notify_one();
    drop(held);
}

on_both!(a_queued_chat_turn_is_told_at_once_over_sse);
async fn a_queued_chat_turn_is_told_at_once_over_sse(db: Db) {
    let (runner, ws, held) = one_held(db, Duration::from_secs(20)).await;
    let started = tokio::time::Instant::now();
    let resp = post(
        &ws,
        "/api/assistant/chat/stream",
        json!({"message": "hi"}),
        true,
    )
    .await;
    queued_at_once(&resp, started, "text/event-stream");
    let mut sse = SseReader::new(resp);
    let queued = sse.next().await.unwrap();
    assert_eq!(queued.event, "queued");
    assert_eq!(
        queued.id, None,
        "a notice is not a turn event: no resume cursor"
    );
    assert_eq!(queued.data["waitS"], 20);
    runner.shared.release.notify_one();
    let turn = sse.next().await.unwrap();
    assert_eq!(turn.event, "turn", "the turn's own events follow");
    assert!(turn.data["chatId"].is_string(), "{:?}", turn.data);
    runner.shared.release.notify_one();
    let events = sse.until_done().await;
    assert_eq!(events.last().unwrap().data["status"], "succeeded");
    drop(held);
}
