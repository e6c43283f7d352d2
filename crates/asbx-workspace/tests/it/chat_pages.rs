//! A long thread is read a page at a time: newest first, with a cursor to
//! older pages, each page one indexed range read.

use serde_json::{Value, json};

use crate::support::{
    Db, FakeRunner, Mode, SseReader, TestWorkspace, client, on_both, post_turn, problem,
};

async fn page(ws: &TestWorkspace, chat_id: &str, query: &str) -> reqwest::Response {
    client()
        .get(ws.url(&format!("/api/assistant/chats/{chat_id}{query}")))
        .send()
        .await
        .unwrap()
}

fn texts(detail: &Value) -> Vec<String> {
    detail["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"][0]["text"].as_str().unwrap_or("").to_owned())
        .collect()
}

on_both!(a_long_thread_pages_back_with_a_cursor);
async fn a_long_thread_pages_back_with_a_cursor(db: Db) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let resp = post_turn(&ws, json!({"message": "m0"})).await;
    let chat_id = resp.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    SseReader::new(resp).until_done().await;
    // 248 more messages, as if 124 turns had run: 250 in all.
    let pool = ws.db().await;
    for i in 3..=250i64 {
        sqlx::query(
            "INSERT INTO messages (id, chat_id, position, role, content, attachments, turn_id, created_at) \
             VALUES ($1, $2, $3, 'user', $4, '[]', NULL, $3)",
        )
        .bind(format!("msg-{i}"))
        .bind(&chat_id)
        .bind(i)
        .bind(json!([{"type": "text", "text": format!("m{i}")}]).to_string())
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;

    // Without parameters: the newest 100, oldest first, and a cursor.
    let first: Value = page(&ws, &chat_id, "").await.json().await.unwrap();
    let t = texts(&first);
    assert_eq!(t.len(), 100);
    assert_eq!((t[0].as_str(), t[99].as_str()), ("m151", "m250"));
    assert_eq!(first["before"], 151);

    // Paging back with the cursor visits every message once, in order.
    let mut seen: Vec<String> = Vec::new();
    let mut cursor = String::new();
    loop {
        let p: Value = page(&ws, &chat_id, &format!("?limit=64{cursor}"))
            .await
            .json()
            .await
            .unwrap();
        let mut t = texts(&p);
        t.extend(seen);
        seen = t;
        match p["before"].as_i64() {
            Some(c) => cursor = format!("&before={c}"),
            None => break,
        }
    }
    assert_eq!(seen.len(), 250);
    assert_eq!(seen[0], "m0", "the first message");
    assert_eq!(
        seen[2..],
        (3..=250).map(|i| format!("m{i}")).collect::<Vec<_>>()[..]
    );

    // Bounds and bad cursors are 400 naming the parameter.
    for (q, field) in [
        ("?limit=0", "limit"),
        ("?limit=501", "limit"),
        ("?limit=x", "limit"),
        ("?before=abc", "before"),
    ] {
        let p = problem(page(&ws, &chat_id, q).await, 400).await;
        assert_eq!(p["errors"][0]["field"], field, "{q}: {p}");
    }
    let p = problem(page(&ws, &chat_id, "?limt=5").await, 400).await;
    assert_eq!(p["code"], "invalid_request");
    // The largest page is allowed.
    let big: Value = page(&ws, &chat_id, "?limit=500")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(texts(&big).len(), 250);
    assert!(big["before"].is_null());
}

/// `GET /api/assistant/events`: a turn run on another connection shows as
/// `started` then `ended`, a deletion as `deleted`; another workspace's
/// subscriber sees none of it.
#[tokio::test]
async fn chat_events_announce_turns_and_deletions_to_their_workspace_only() {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;
    let other = ws.workspace.create_workspace("other").await.unwrap();
    let other_key = ws.workspace.create_api_key(&other, "k").await.unwrap();
    let mine = client()
        .get(ws.url("/api/assistant/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(mine.status(), 200);
    let theirs = client()
        .get(ws.url("/api/assistant/events"))
        .bearer_auth(&other_key)
        .send()
        .await
        .unwrap();
    let mut mine = SseReader::new(mine);
    let mut theirs = SseReader::new(theirs);

    let resp = post_turn(&ws, json!({"message": "hi"})).await;
    let chat_id = resp.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    SseReader::new(resp).until_done().await;
    let started = mine.next().await.unwrap();
    assert_eq!(started.event, "chat");
    assert_eq!(started.data["chatId"], chat_id.as_str());
    assert_eq!(started.data["state"], "started");
    assert!(started.data["turnId"].is_string());
    let ended = mine.next().await.unwrap();
    assert_eq!(ended.data["state"], "ended");
    assert_eq!(ended.data["turnId"], started.data["turnId"]);

    let r = client()
        .delete(ws.url(&format!("/api/assistant/chats/{chat_id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let deleted = mine.next().await.unwrap();
    assert_eq!(deleted.data["state"], "deleted");

    // The other workspace's own turn is all it sees.
    let r = client()
        .post(ws.url("/api/assistant/chat/stream"))
        .bearer_auth(&other_key)
        .json(&json!({"message": "theirs"}))
        .send()
        .await
        .unwrap();
    let their_chat = r.headers()["x-asbx-chat-id"].to_str().unwrap().to_owned();
    SseReader::new(r).until_done().await;
    let first = theirs.next().await.unwrap();
    assert_eq!(first.data["chatId"], their_chat.as_str(), "{first:?}");
    assert_eq!(first.data["state"], "started");
}
