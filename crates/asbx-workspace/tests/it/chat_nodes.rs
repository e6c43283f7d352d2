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
