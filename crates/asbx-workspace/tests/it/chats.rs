//! Chat turns: SSE, persistence, the single-flight lease, replay, resume,
//! cancel, grace, attachments, soft delete.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{
    Db, FakeRunner, Mode, SseReader, TestWorkspace, client, on_both, post_turn, problem,
};

async fn chat_detail(ws: &TestWorkspace, chat_id: &str) -> Value {
    let r = client()
        .get(ws.url(&format!("/api/assistant/chats/{chat_id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// Waits (bounded) until the chat has `n` messages and no active turn.
async fn settled_chat(ws: &TestWorkspace, chat_id: &str, n: usize) -> Value {
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let d = chat_detail(ws, chat_id).await;
            if d["messages"].as_array().unwrap().len() >= n && d["activeTurnId"].is_null() {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("chat settled")
}

on_both!(turn_flow_streams_sse_and_persists_the_thread);
async fn turn_flow_streams_sse_and_persists_the_thread(db: Db) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;

    let resp = post_turn(&ws, json!({"message": "hello"})).await;
    assert_eq!(resp.status(), 200);
    let chat_id = resp.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let turn_id = resp.headers()["x-asbx-turn-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let events = SseReader::new(resp).until_done().await;
    let kinds: Vec<_> = events.iter().map(|e| e.event.as_str()).collect();
    // The log line (seq 2) is filtered out.
    assert_eq!(kinds, ["turn", "step", "step", "result", "done"]);
    let ids: Vec<_> = events.iter().map(|e| e.id.clone()).collect();
    assert_eq!(
        ids,
        [
            None,
            Some("1".into()),
            Some("3".into()),
            Some("4".into()),
            None
        ]
    );
    assert_eq!(events[0].data["chatId"], chat_id.as_str());
    assert_eq!(events[1].data["status"], "running");
    assert_eq!(events[3].data["message"], "done: hello");
    assert_eq!(events[4].data["status"], "succeeded");
    assert_eq!(events[4].data["turnId"], turn_id.as_str());

    // History renders the same thread: the user message, then the step
    // trace and result folded into the assistant message.
    let d = settled_chat(&ws, &chat_id, 2).await;
    assert_eq!(d["title"], "hello");
    let m = d["messages"].as_array().unwrap();
    assert_eq!(m[0]["role"], "user");
    assert_eq!(m[0]["content"], json!([{"type": "text", "text": "hello"}]));
    assert_eq!(m[1]["role"], "assistant");
    assert_eq!(
        m[1]["content"],
        json!([
            {"type": "step", "id": "s1", "name": "shell", "status": "succeeded",
             "args": {"command": "ls"}, "result": {"exitCode": 0}, "durationMs": 5},
            {"type": "text", "text": "done: hello"}
        ])
    );
    assert_eq!(m[1]["id"], events[4].data["messageId"]);

    // The second turn continues the chat and replays the first.
    let resp = post_turn(&ws, json!({"chatId": chat_id, "message": "again"})).await;
    assert_eq!(resp.status(), 200);
    SseReader::new(resp).until_done().await;
    let config = &runner.callbacks()[3].2;
    assert_eq!(config["conversation"][0]["role"], "user");
    assert_eq!(config["conversation"][0]["content"], "hello");
    assert_eq!(config["conversation"][1]["role"], "assistant");
    assert_eq!(config["conversation"][1]["content"], "done: hello");
    assert_eq!(config["conversation"].as_array().unwrap().len(), 2);

    let list: Value = client()
        .get(ws.url("/api/assistant/chats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(
        settled_chat(&ws, &chat_id, 4).await["messages"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
}

on_both!(a_concurrent_turn_gets_409_and_a_stale_lease_is_recovered);
async fn a_concurrent_turn_gets_409_and_a_stale_lease_is_recovered(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let resp = post_turn(&ws, json!({"message": "first"})).await;
    let chat_id = resp.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let turn_id = resp.headers()["x-asbx-turn-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut sse = SseReader::new(resp);
    assert_eq!(sse.next().await.unwrap().event, "turn");

    let second = post_turn(&ws, json!({"chatId": chat_id, "message": "second"})).await;
    let p = problem(second, 409).await;
    assert_eq!(p["code"], "turn_in_flight");
    assert_eq!(p["activeTurnId"], turn_id.as_str());
    let d = chat_detail(&ws, &chat_id).await;
    assert_eq!(d["activeTurnId"], turn_id.as_str());

    runner.shared.release.notify_one();
    let events = sse.until_done().await;
    assert_eq!(events.last().unwrap().data["status"], "succeeded");
    settled_chat(&ws, &chat_id, 2).await;

    // A process that died mid-turn leaves its lease behind, and the turn's
    // user message (stored before the turn was answered).
    let pool = ws.db().await;
    let until = asbx_workspace::Clock::now_ms(&*ws.clock) + 120_000;
    sqlx::query("UPDATE chats SET lease_turn_id = 'ghost', lease_expires_at = $1 WHERE id = $2")
        .bind(until)
        .bind(&chat_id)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO messages (id, chat_id, position, role, content, attachments, turn_id, \
         created_at) VALUES ('ghost-user', $1, 3, 'user', '[{\"type\":\"text\",\"text\":\"lost\"}]', \
         '[]', 'ghost', 0)",
    )
    .bind(&chat_id)
    .execute(&pool)
    .await
    .unwrap();
    let p = problem(
        post_turn(&ws, json!({"chatId": chat_id, "message": "x"})).await,
        409,
    )
    .await;
    assert_eq!(p["activeTurnId"], "ghost");
    // Once the lease has expired, the lost turn shows as interrupted (never
    // left running), exactly once however often the chat is read.
    ws.clock.advance(Duration::from_secs(121));
    for _ in 0..2 {
        let d = chat_detail(&ws, &chat_id).await;
        assert!(d["activeTurnId"].is_null(), "{d}");
        let messages = d["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 4, "{d}");
        assert_eq!(messages[2]["turnId"], "ghost");
        let lost = &messages[3];
        assert_eq!(lost["role"], "assistant");
        assert_eq!(lost["turnId"], "ghost");
        assert_eq!(
            lost["content"],
            json!([{"type": "error", "code": "runner_lost", "interrupted": true,
                "message": "the workspace lost this turn before it ended (it restarted, or lost its runner)"}])
        );
    }
    // A turn refused before it was accepted (its node lost the database
    // between taking the lease and storing the user message, and could not
    // release the lease) is no turn of the thread: once its lease expires it
    // is gone without a trace. Found by the many-machines test.
    let until = asbx_workspace::Clock::now_ms(&*ws.clock) + 1_000;
    sqlx::query("UPDATE chats SET lease_turn_id = 'refused', lease_expires_at = $1 WHERE id = $2")
        .bind(until)
        .bind(&chat_id)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    ws.clock.advance(Duration::from_secs(2));
    for _ in 0..2 {
        let d = chat_detail(&ws, &chat_id).await;
        assert!(d["activeTurnId"].is_null(), "{d}");
        assert_eq!(d["messages"].as_array().unwrap().len(), 4, "{d}");
    }
    // The next turn takes the chat over.
    *runner.shared.mode.lock().unwrap() = Mode::Full { files: vec![] };
    let resp = post_turn(&ws, json!({"chatId": chat_id, "message": "after"})).await;
    assert_eq!(resp.status(), 200);
    let events = SseReader::new(resp).until_done().await;
    assert_eq!(events.last().unwrap().data["status"], "succeeded");
    let d = settled_chat(&ws, &chat_id, 6).await;
    assert!(d["activeTurnId"].is_null());
    assert_eq!(d["messages"].as_array().unwrap().len(), 6, "{d}");
}

on_both!(replay_is_capped_at_twenty_messages);
async fn replay_is_capped_at_twenty_messages(db: Db) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let mut chat_id: Option<String> = None;
    for i in 0..13 {
        let mut body = json!({"message": format!("m{i}")});
        if let Some(c) = &chat_id {
            body["chatId"] = c.clone().into();
        }
        let resp = post_turn(&ws, body).await;
        assert_eq!(resp.status(), 200, "turn {i}");
        chat_id = Some(
            resp.headers()["x-asbx-chat-id"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
        SseReader::new(resp).until_done().await;
        settled_chat(&ws, chat_id.as_deref().unwrap(), 2 * (i + 1)).await;
    }
    // The 13th turn saw the last 20 of the 24 earlier messages.
    let config = runner.callbacks().last().unwrap().2.clone();
    let conv = config["conversation"].as_array().unwrap();
    assert_eq!(conv.len(), 20);
    assert_eq!(conv[0]["content"], "m2");
    assert_eq!(conv[19]["content"], "done: m11");
    assert!(
        conv.windows(2)
            .all(|w| w[0]["ts"].as_u64() <= w[1]["ts"].as_u64())
    );
}

on_both!(sse_resume_with_last_event_id_loses_nothing);
async fn sse_resume_with_last_event_id_loses_nothing(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let resp = post_turn(&ws, json!({"message": "go"})).await;
    let chat_id = resp.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut sse = SseReader::new(resp);
    assert_eq!(sse.next().await.unwrap().event, "turn");
    let first = sse.next().await.unwrap();
    assert_eq!(first.id.as_deref(), Some("1"));
    // The page reloads: the connection is gone mid-turn.
    drop(sse);

    let resumed = client()
        .get(ws.url(&format!("/api/assistant/chats/{chat_id}/stream")))
        .header("Last-Event-ID", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 200);
    let mut sse = SseReader::new(resumed);
    assert_eq!(sse.next().await.unwrap().event, "turn");
    let mut seen = Vec::new();
    // Lines 3 and 4 were streamed while nobody listened.
    for _ in 0..2 {
        seen.push(sse.next().await.unwrap().id.unwrap());
    }
    runner.shared.release.notify_one();
    for e in sse.until_done().await {
        if let Some(id) = e.id {
            seen.push(id);
        }
    }
    assert_eq!(seen, ["3", "4", "5", "6"]);
    // The whole thread is persisted too.
    let d = settled_chat(&ws, &chat_id, 2).await;
    let steps: Vec<_> = d["messages"][1]["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "step")
        .map(|b| b["status"].clone())
        .collect();
    assert_eq!(steps, [json!("succeeded"), json!("succeeded")]);

    // No turn in flight: nothing to resume.
    let r = client()
        .get(ws.url("/api/assistant/chats/unknown/stream"))
        .send()
        .await
        .unwrap();
    assert_eq!(problem(r, 404).await["code"], "not_found");
}

#[tokio::test]
async fn cancel_route_stops_the_turn_at_once() {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;
    let dropped = runner.shared.dropped.notified();
    let resp = post_turn(&ws, json!({"message": "go"})).await;
    let chat_id = resp.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let turn_id = resp.headers()["x-asbx-turn-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut sse = SseReader::new(resp);
    sse.next().await.unwrap();
    sse.next().await.unwrap();

    let r = client()
        .post(ws.url(&format!("/api/assistant/chats/{chat_id}/cancel")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    assert_eq!(r.json::<Value>().await.unwrap()["turnId"], turn_id.as_str());
    let events = sse.until_done().await;
    let last_two = &events[events.len() - 2..];
    assert_eq!(last_two[0].event, "error");
    assert_eq!(last_two[0].data["code"], "cancelled");
    assert_eq!(last_two[1].data["status"], "cancelled");
    tokio::time::timeout(Duration::from_secs(20), dropped)
        .await
        .expect("the sandbox request was dropped");

    let d = settled_chat(&ws, &chat_id, 2).await;
    let content = d["messages"][1]["content"].as_array().unwrap();
    assert_eq!(content.last().unwrap()["type"], "error");
    assert_eq!(content.last().unwrap()["code"], "cancelled");
    // The step still running when cancelled is not left spinning.
    assert!(
        content
            .iter()
            .filter(|b| b["type"] == "step")
            .all(|b| b["status"] != "running")
    );

    // The lease is free again.
    *runner.shared.mode.lock().unwrap() = Mode::Full { files: vec![] };
    let resp = post_turn(&ws, json!({"chatId": chat_id, "message": "next"})).await;
    assert_eq!(resp.status(), 200);
    SseReader::new(resp).until_done().await;
}

#[tokio::test]
async fn a_gone_client_cancels_after_the_grace_period() {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_with(Some(runner.url.clone()), |c| {
        c.detach_grace = Duration::from_millis(200);
    })
    .await;
    let dropped = runner.shared.dropped.notified();
    let resp = post_turn(&ws, json!({"message": "go"})).await;
    let chat_id = resp.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut sse = SseReader::new(resp);
    sse.next().await.unwrap();
    drop(sse);
    tokio::time::timeout(Duration::from_secs(20), dropped)
        .await
        .expect("the sandbox request was dropped after the grace period");
    let d = settled_chat(&ws, &chat_id, 2).await;
    let content = d["messages"][1]["content"].as_array().unwrap();
    assert_eq!(content.last().unwrap()["code"], "cancelled");
}

on_both!(attachments_reach_the_sandbox_and_show_in_history);
async fn attachments_reach_the_sandbox_and_show_in_history(db: Db) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let content: Vec<u8> = b"line one\nline two \xff\x00 binary\n".to_vec();
    let up: Value = client()
        .post(ws.url("/api/assistant/files?name=notes.txt"))
        .header("content-type", "text/plain")
        .body(content.clone())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let file_id = up["id"].as_str().unwrap().to_owned();

    let resp = post_turn(
        &ws,
        json!({"message": "read it", "attachmentIds": [file_id]}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let chat_id = resp.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    SseReader::new(resp).until_done().await;

    // The sandbox gets a reference to fetch through the workspace API
    // (tests/it/sandbox_api.rs), never the bytes in a setup script.
    let d = &runner.dispatches()[0];
    assert!(d.prompt.contains("attachments/notes.txt"), "{}", d.prompt);
    let (env, attachments) = crate::support::env_without_access(&runner.callbacks()[0].2);
    assert_eq!(env["setup_script"], Value::Null);
    assert_eq!(
        attachments,
        json!([{"id": file_id, "path": "attachments/notes.txt", "size": content.len(),
                "sha256": crate::support::sha256_bytes_hex(&content), "mimeType": "text/plain"}])
    );

    // History shows the chip on the user message; the bag lists the file.
    let d = settled_chat(&ws, &chat_id, 2).await;
    assert_eq!(
        d["messages"][0]["fileAttachments"],
        json!([{"id": file_id, "name": "notes.txt", "mimeType": "text/plain", "size": content.len()}])
    );
    assert_eq!(d["files"][0]["id"], file_id.as_str());

    // An unknown attachment is a 400 naming it.
    let p = problem(
        post_turn(
            &ws,
            json!({"chatId": chat_id, "message": "x", "attachmentIds": ["nope"]}),
        )
        .await,
        400,
    )
    .await;
    assert!(
        p["detail"].as_str().unwrap().contains("attachmentIds[0]"),
        "{p}"
    );
}

on_both!(soft_delete_hides_the_chat_and_its_bag);
async fn soft_delete_hides_the_chat_and_its_bag(db: Db) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let resp = post_turn(&ws, json!({"message": "hello"})).await;
    let chat_id = resp.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    SseReader::new(resp).until_done().await;
    settled_chat(&ws, &chat_id, 2).await;
    let up: Value = client()
        .post(ws.url(&format!("/api/assistant/files?name=a.txt&chatId={chat_id}")))
        .body("abc")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let file_url = ws.url(&format!("/api/files/{}", up["id"].as_str().unwrap()));
    assert_eq!(client().get(&file_url).send().await.unwrap().status(), 200);

    let r = client()
        .delete(ws.url(&format!("/api/assistant/chats/{chat_id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let list: Value = client()
        .get(ws.url("/api/assistant/chats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list, json!([]));
    let r = client()
        .get(ws.url(&format!("/api/assistant/chats/{chat_id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(problem(r, 404).await["code"], "not_found");
    assert_eq!(
        problem(client().get(&file_url).send().await.unwrap(), 404).await["code"],
        "not_found"
    );
    let p = problem(
        post_turn(&ws, json!({"chatId": chat_id, "message": "x"})).await,
        404,
    )
    .await;
    assert_eq!(p["code"], "not_found");
    // Deleting twice: not found.
    let r = client()
        .delete(ws.url(&format!("/api/assistant/chats/{chat_id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn bad_turns_and_missing_sandbox_url() {
    let ws = TestWorkspace::start(None).await;
    let p = problem(post_turn(&ws, json!({"message": "hi"})).await, 503).await;
    assert_eq!(p["code"], "sandbox_url_missing");
    let p = problem(post_turn(&ws, json!({"message": " "})).await, 400).await;
    assert_eq!(p["errors"][0]["field"], "message");
    let p = problem(post_turn(&ws, json!({"msg": "x"})).await, 400).await;
    assert_eq!(p["code"], "invalid_request");
    // Nothing was created.
    let list: Value = client()
        .get(ws.url("/api/assistant/chats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list, json!([]));
}

#[tokio::test]
async fn a_runner_rejection_is_passed_through_and_persisted() {
    let rejection = json!({"type": "urn:asbx:problem:at_capacity", "title": "At capacity",
                           "status": 503, "detail": "too many sandboxes", "code": "at_capacity"});
    let runner = FakeRunner::start(Mode::Reject(503, rejection.clone())).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;
    let resp = post_turn(&ws, json!({"message": "hi"})).await;
    let chat_id = resp.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(problem(resp, 503).await, rejection);
    let d = settled_chat(&ws, &chat_id, 2).await;
    assert_eq!(
        d["messages"][1]["content"],
        json!([{"type": "error", "code": "at_capacity", "message": "too many sandboxes"}])
    );
}

/// Issue 28, defect 6: an upload to a bag is at most what a turn can
/// attach, 16 MiB; one byte more is refused `413` `body_too_large` (the
/// code of the other 16 MiB limits) and stores nothing, where it was stored
/// and could never be attached. A file at the limit is stored and attached.
#[tokio::test]
async fn an_upload_over_the_attachable_limit_is_refused() {
    const LIMIT: usize = 16 * 1024 * 1024;
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;
    let upload = |len: usize| {
        client()
            .post(ws.url("/api/assistant/files?name=big.bin"))
            .header("content-type", "application/octet-stream")
            .body(vec![7u8; len])
            .send()
    };
    let p = problem(upload(LIMIT + 1).await.unwrap(), 413).await;
    assert_eq!(p["code"], "body_too_large", "{p}");
    assert!(
        p["detail"].as_str().unwrap().contains(&LIMIT.to_string()),
        "{p}"
    );
    let pool = ws.db().await;
    let (files,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM files")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    assert_eq!(files, 0, "nothing stored");

    // Positive control: at the limit, stored and attachable.
    let resp = upload(LIMIT).await.unwrap();
    assert_eq!(resp.status(), 201);
    let up: Value = resp.json().await.unwrap();
    assert_eq!(up["size"], LIMIT as u64, "{up}");
    let resp = post_turn(
        &ws,
        json!({"message": "read it", "attachmentIds": [up["id"]]}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    SseReader::new(resp).until_done().await;
    assert!(
        runner.dispatches()[0]
            .prompt
            .contains("attachments/big.bin")
    );
}
