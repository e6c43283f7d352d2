//! The wire output of a scripted run and a scripted chat turn, pinned as
//! snapshots (`asbx_snapshot!`: ids and times filtered): the NDJSON a
//! protocol 1 caller of `POST /api/runs` reads, and the SSE of
//! `POST /api/assistant/chat/stream`. The fake runner's script is a step
//! (running, then succeeded), a `log` line and a `result`; a change to any
//! line's fields, order, numbering or framing shows in review.

use asbx_test_support::asbx_snapshot;
use serde_json::json;

use crate::support::{FakeRunner, Mode, TestWorkspace, client, post_turn};

/// Protocol 1: the four line types only, `seq` 1, 2, 3... with no gap.
#[tokio::test]
async fn a_runs_ndjson_stream_is_pinned() {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let body = resp.text().await.unwrap();
    asbx_snapshot!(text: "run_protocol1_ndjson", body);
}

/// `turn` first, the lines by type with `id: <seq>` (the `log` line
/// hidden), `done` last; the stream ends after `done`.
#[tokio::test]
async fn a_chat_turns_sse_stream_is_pinned() {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;
    let resp = post_turn(&ws, json!({"message": "hello"})).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let body = resp.text().await.unwrap();
    asbx_snapshot!(text: "chat_turn_sse", body);
}
