//! Chat turns across workspace nodes sharing one database: a browser whose
//! connection dropped resumes the turn on another node with `Last-Event-ID`
//! and gets the very frames the driving node sends, with no gap and no
//! duplicate, then `done`.

use std::time::Duration;

use serde_json::json;

use crate::support::{Db, FakeRunner, Mode, SseReader, TestWorkspace, client, on_both, post_turn};

/// `(id, event, data)` of the events with an id.
fn framed(events: &[crate::support::SseEvent]) -> Vec<(String, String, serde_json::Value)> {
    events
        .iter()
        .filter_map(|e| Some((e.id.clone()?, e.event.clone(), e.data.clone())))
        .collect()
}

// On PostgreSQL node b's safety poll is far beyond the test's deadline, so
// only node a's `NOTIFY` wakes it (after it caught up with what was stored).
on_both!(a_turn_resumes_on_another_node_with_no_gap);
async fn a_turn_resumes_on_another_node_with_no_gap(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let a = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let shared = a.database_url.clone();
    let b = TestWorkspace::start_with(Some(runner.url.clone()), |c| {
        c.database_url = Some(shared);
        c.replay_safety_poll = Duration::from_secs(600);
    })
    .await;

    // Two clients on node a: one stays to the end (the reference), one is
    // the browser whose network drops after the first line.
    let resp = post_turn(&a, json!({"message": "go"})).await;
    let chat_id = resp.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut reference = SseReader::new(resp);
    let turn = reference.next().await.unwrap();
    assert_eq!(turn.event, "turn");
    let first = reference.next().await.unwrap();
    assert_eq!(first.id.as_deref(), Some("1"));

    // Stored lines reach node b: it replays from the stored lines and
    // follows (the driving node stores at least every 100 ms).
    let resumed = client()
        .get(b.url(&format!("/api/assistant/chats/{chat_id}/stream")))
        .header("Last-Event-ID", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 200);
    assert_eq!(resumed.headers()["x-asbx-chat-id"], chat_id.as_str());
    let mut on_b = SseReader::new(resumed);
    let b_turn = on_b.next().await.unwrap();
    assert_eq!(b_turn.event, "turn");
    assert_eq!(b_turn.data, turn.data, "the same turn and user message");
    // Let node b catch up and wait, then let the runner finish.
    let mut from_b = Vec::new();
    while from_b.len() < 2 {
        from_b.push(on_b.next().await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    runner.shared.release.notify_one();
    from_b.extend(on_b.until_done().await);
    let from_a = reference.until_done().await;

    let a_frames = framed(&from_a);
    let b_frames = framed(&from_b);
    assert!(a_frames.len() >= 4, "{from_a:?}");
    assert_eq!(
        b_frames, a_frames,
        "node b sends node a's frames after id 1"
    );
    let (a_done, b_done) = (from_a.last().unwrap(), from_b.last().unwrap());
    assert_eq!(b_done.event, "done");
    assert_eq!(
        b_done.data, a_done.data,
        "the same stored message and status"
    );

    // A chat with nothing in flight, or another workspace's, has nothing to resume.
    let r = client()
        .get(b.url("/api/assistant/chats/unknown/stream"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

// A turn whose node died and whose runner no longer has its session is
// marked lost by the node that takes it over. A client resuming it there
// gets the turn's stored lines, then the `error` saying why (`runner_lost`,
// which no stored line says), then `done`: never `failed` without a reason.
// Found by the many-machines test.
on_both!(a_turn_marked_lost_replays_with_its_error);
async fn a_turn_marked_lost_replays_with_its_error(db: Db) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let resp = post_turn(&ws, json!({"message": "first"})).await;
    let chat_id = resp.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    SseReader::new(resp).until_done().await;

    // What a node that died mid-turn leaves: the user message, the run
    // running, its first line stored, and the chat's lease expired.
    let pool = ws.db().await;
    let now = asbx_workspace::Clock::now_ms(&*ws.clock);
    let workspace: String = sqlx::query_scalar("SELECT workspace_id FROM chats WHERE id = $1")
        .bind(&chat_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO messages (id, chat_id, position, role, content, attachments, turn_id, \
         created_at) VALUES ('ghost-user', $1, 3, 'user', '[{\"type\":\"text\",\"text\":\"x\"}]', \
         '[]', 'ghost', $2)",
    )
    .bind(&chat_id)
    .bind(now)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO runs (id, workspace_id, kind, chat_id, status, prompt, model, env_json, \
         config_json, created_at, sandbox_url) \
         VALUES ('ghost', $1, 'chat', $2, 'running', 'x', 'scripted', '{}', '{}', $3, $4)",
    )
    .bind(&workspace)
    .bind(&chat_id)
    .bind(now + 1)
    .bind(runner.url.as_str())
    .execute(&pool)
    .await
    .unwrap();
    let step = asbx_test_support::fake_runner::line(
        1,
        "ghost",
        json!({"type":"step","id":"s1","name":"shell","status":"running"}),
    );
    sqlx::query("INSERT INTO run_events (run_id, seq, line) VALUES ('ghost', 1, $1)")
        .bind(step.trim_end())
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE chats SET lease_turn_id = 'ghost', lease_expires_at = $1 WHERE id = $2")
        .bind(now - 1)
        .bind(&chat_id)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;

    // The client resumes; reading the chat takes the turn over, and the
    // runner (which answers `404` for any session) no longer has it.
    let resumed = client()
        .get(ws.url(&format!("/api/assistant/chats/{chat_id}/stream")))
        .header("Last-Event-ID", "0")
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 200);
    let mut sse = SseReader::new(resumed);
    let detail = client()
        .get(ws.url(&format!("/api/assistant/chats/{chat_id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(detail.status(), 200);
    let events = sse.until_done().await;
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names, ["turn", "step", "error", "done"], "{events:?}");
    let error = &events[2];
    assert_eq!(
        error.id.as_deref(),
        Some("2"),
        "numbered after the last line"
    );
    assert_eq!(error.data["code"], "runner_lost", "{:?}", error.data);
    assert_eq!(events[3].data["status"], "failed");

    // A client that had seen the lines up to the error gets `done` alone.
    let events = resumed_after(&ws, &chat_id, 2).await;
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names, ["turn", "done"], "{events:?}");

    // A client that saw lines its dead node sent and never stored (here 2
    // to 5) still gets the error, numbered after what it saw.
    let events = resumed_after(&ws, &chat_id, 5).await;
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names, ["turn", "error", "done"], "{events:?}");
    assert_eq!(events[1].id.as_deref(), Some("6"), "{events:?}");
    assert_eq!(events[1].data["code"], "runner_lost");
}

/// The events of `chat_id`'s turn resumed after `last`, to its `done`.
async fn resumed_after(
    ws: &TestWorkspace,
    chat_id: &str,
    last: u64,
) -> Vec<crate::support::SseEvent> {
    let resp = client()
        .get(ws.url(&format!("/api/assistant/chats/{chat_id}/stream")))
        .header("Last-Event-ID", last.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    SseReader::new(resp).until_done().await
}
