//! Kept working directories (CONTRACT §11) against a fake runner, which
//! plays the real runner's capture with the dispatch's `workdir` token: a
//! run of `POST /api/runs` with `workdir.from` gets the chat's directory
//! to restore and keeps nothing; another workspace's chat is not found, a
//! chat that kept none is `409 workdir_not_kept`; the distinct blobs count
//! in `storage-mb`; past `ASBX_WORKDIR_KEEP_TURNS` a turn's directory is
//! `410 workdir_gone` and its bytes are freed; deleting the chat frees the
//! rest. (The real runner's side: `crates/asbx/tests/it/workdir.rs`.)

use std::time::Duration;

use asbx_protocol::DispatchRequest;
use asbx_protocol::workdir::{SnapshotReport, WorkdirEntry, WorkdirManifest};
use serde_json::{Value, json};

use crate::support::{
    Db, FakeRunner, Mode, SseReader, TestWorkspace, client, get_json, on_both, post_turn, problem,
    sha256_bytes_hex,
};

/// What the runner does when a turn ends: stores the blobs of `files` and
/// reports their manifest, with the turn's `workdir` token.
async fn keep(d: &DispatchRequest, files: &[(&str, &[u8])]) -> WorkdirManifest {
    let wd = d
        .workdir
        .as_ref()
        .expect("a chat turn's dispatch has workdir");
    let mut entries = Vec::new();
    for (path, bytes) in files {
        let sha = sha256_bytes_hex(bytes);
        let r = client()
            .put(format!("{}/workdir/blobs/{sha}", d.agent_url))
            .bearer_auth(&wd.token)
            .body(bytes.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204);
        entries.push(WorkdirEntry::File {
            path: (*path).to_owned(),
            mode: 0o644,
            size: bytes.len() as u64,
            sha256: sha,
        });
    }
    let manifest = WorkdirManifest { entries };
    let report = SnapshotReport {
        manifest: Some(manifest.clone()),
        error: None,
    };
    let r = client()
        .post(format!("{}/workdir/snapshot", d.agent_url))
        .bearer_auth(&wd.token)
        .json(&report)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    manifest
}

/// One chat turn (a new chat when `chat` is none) that keeps `files`
/// (nothing when empty): the chat id and the turn's assistant message id.
async fn turn(
    ws: &TestWorkspace,
    runner: &FakeRunner,
    chat: Option<&str>,
    files: &[(&str, &[u8])],
) -> (String, String) {
    ws.clock.advance(Duration::from_secs(1));
    let n = runner.dispatches().len();
    let mut body = json!({"message": "hello"});
    if let Some(c) = chat {
        body["chatId"] = json!(c);
    }
    let resp = post_turn(ws, body).await;
    assert_eq!(resp.status(), 200);
    let chat_id = resp.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let d = runner.next_dispatch(n).await;
    if !files.is_empty() {
        keep(&d, files).await;
    }
    runner.shared.release.notify_one();
    SseReader::new(resp).until_done().await;
    let message = last_answer(ws, &chat_id).await;
    (chat_id, message)
}

/// The id of the chat's last assistant message, once the turn settled.
async fn last_answer(ws: &TestWorkspace, chat_id: &str) -> String {
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let d: Value = get_json(ws, &format!("/api/assistant/chats/{chat_id}")).await;
            if d["activeTurnId"].is_null()
                && let Some(m) = d["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .rev()
                    .find(|m| m["role"] == "assistant")
            {
                return m["id"].as_str().unwrap().to_owned();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the turn settled")
}

async fn storage_bytes(ws: &TestWorkspace) -> f64 {
    let u: Value = get_json(ws, "/api/usage").await;
    u["used"]["storage-mb"].as_f64().unwrap() * 1024.0 * 1024.0
}

/// Whether the blob `sha` is stored (the folder on SQLite, the database
/// on PostgreSQL).
async fn stored(ws: &TestWorkspace, sha: &str) -> bool {
    let file = ws
        .data_dir
        .path()
        .join("blobs")
        .join(&sha[..2])
        .join(&sha[2..]);
    if file.exists() {
        return true;
    }
    let n: i64 = sqlx::query_scalar(
        "SELECT CAST(COUNT(*) AS BIGINT) FROM blobs WHERE sha256 = $1 AND complete = 1",
    )
    .bind(sha)
    .fetch_one(&ws.db().await)
    .await
    .unwrap();
    n > 0
}

/// `POST /api/runs` of a protocol 2 run with `workdir`, as `key` (none:
/// the default workspace).
async fn run_from(ws: &TestWorkspace, workdir: Value, key: Option<&str>) -> reqwest::Response {
    let mut req = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x", "protocol": 2, "workdir": workdir}));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    req.send().await.unwrap()
}

on_both!(a_run_starts_from_a_chats_kept_directory_and_keeps_nothing);
async fn a_run_starts_from_a_chats_kept_directory_and_keeps_nothing(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let big = vec![7u8; 300 * 1024];
    let before = storage_bytes(&ws).await;
    let (chat, _) = turn(
        &ws,
        &runner,
        None,
        &[("a.txt", b"hello"), ("big.bin", &big)],
    )
    .await;
    let after = storage_bytes(&ws).await;
    // The kept blobs count (plus the turn's few stored lines).
    let grew = after - before;
    assert!(grew >= (300 * 1024 + 5) as f64, "grew {grew}");
    assert!(grew < (300 * 1024 + 64 * 1024) as f64, "grew {grew}");
    // A turn keeping the same bytes again adds nothing but its lines.
    turn(
        &ws,
        &runner,
        Some(&chat),
        &[("a.txt", b"hello"), ("big.bin", &big)],
    )
    .await;
    let again = storage_bytes(&ws).await - after;
    assert!(again < (64 * 1024) as f64, "counted twice: {again}");

    // A run from the chat: its dispatch restores the chat's latest
    // directory and captures nothing.
    let n = runner.dispatches().len();
    let resp = run_from(&ws, json!({"from": chat}), None).await;
    assert_eq!(resp.status(), 200);
    let d = runner.next_dispatch(n).await;
    let wd = d.workdir.clone().expect("the run's dispatch has workdir");
    let restore = wd.restore.expect("a directory to restore");
    let paths: Vec<&str> = restore.entries.iter().map(WorkdirEntry::path).collect();
    assert_eq!(paths, ["a.txt", "big.bin"]);
    assert!(!wd.capture, "a run from a chat keeps nothing");
    let hello = sha256_bytes_hex(b"hello");
    let blob = |sha: &str| {
        client()
            .get(format!("{}/workdir/blobs/{sha}", d.agent_url))
            .bearer_auth(&wd.token)
            .send()
    };
    // Its token reads the chat's blobs, nothing else, and keeps nothing.
    let r = blob(&hello).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"hello");
    let other = sha256_bytes_hex(b"not kept");
    assert_eq!(blob(&other).await.unwrap().status(), 404);
    let r = client()
        .post(format!("{}/workdir/snapshot", d.agent_url))
        .bearer_auth(&wd.token)
        .json(&json!({"manifest": {"entries": []}}))
        .send()
        .await
        .unwrap();
    assert_eq!(problem(r, 403).await["code"], "forbidden");
    runner.shared.release.notify_one();
    resp.bytes().await.unwrap();

    // Another workspace's chat is not found.
    let b = ws.workspace.create_workspace("b").await.unwrap();
    let key_b = ws.workspace.create_api_key(&b, "kb").await.unwrap();
    let p = problem(
        run_from(&ws, json!({"from": chat}), Some(&key_b)).await,
        404,
    )
    .await;
    assert_eq!(p["code"], "not_found", "{p}");
    // A chat that kept nothing, and a message not of the chat.
    let (empty, _) = turn(&ws, &runner, None, &[]).await;
    let p = problem(run_from(&ws, json!({"from": empty}), None).await, 409).await;
    assert_eq!(p["code"], "workdir_not_kept", "{p}");
    let p = problem(
        run_from(&ws, json!({"from": chat, "afterMessageId": "nope"}), None).await,
        400,
    )
    .await;
    assert_eq!(p["code"], "invalid_request", "{p}");
    let p = problem(
        run_from(&ws, json!({"from": chat, "extra": 1}), None).await,
        400,
    )
    .await;
    assert_eq!(p["code"], "invalid_request", "{p}");
    assert_eq!(
        runner.dispatches().len(),
        n + 2,
        "no refused run was dispatched"
    );
}

on_both!(only_the_latest_turns_stay_restorable);
async fn only_the_latest_turns_stay_restorable(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws =
        TestWorkspace::start_on(db, Some(runner.url.clone()), |c| c.workdir_keep_turns = 2).await;
    let one: &[u8] = b"turn one";
    let (chat, first) = turn(&ws, &runner, None, &[("f.txt", one)]).await;
    let (_, second) = turn(&ws, &runner, Some(&chat), &[("f.txt", b"turn two")]).await;
    let first_sha = sha256_bytes_hex(one);
    assert!(stored(&ws, &first_sha).await);
    let used = storage_bytes(&ws).await;
    let (_, _third) = turn(&ws, &runner, Some(&chat), &[("f.txt", b"turn three")]).await;

    // Turn one's directory is past the last 2: listed, not restorable,
    // its bytes freed and no longer counted.
    let kept: Value = get_json(&ws, &format!("/api/assistant/chats/{chat}/workdir")).await;
    let restorable: Vec<bool> = kept["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["restorable"].as_bool().unwrap())
        .collect();
    assert_eq!(restorable, [false, true, true], "{kept}");
    assert!(!stored(&ws, &first_sha).await, "turn one's blob is freed");
    let now = storage_bytes(&ws).await;
    assert!(now < used + 4096.0, "the retired blob no longer counts");

    // Fork, tar and run at turn one: 410 workdir_gone; at turn two: fine.
    let gone = |r: reqwest::Response| async move {
        let p = problem(r, 410).await;
        assert_eq!(p["code"], "workdir_gone", "{p}");
    };
    let fork = |m: &str| {
        client()
            .post(ws.url(&format!("/api/assistant/chats/{chat}/fork")))
            .json(&json!({"afterMessageId": m}))
            .send()
    };
    gone(fork(&first).await.unwrap()).await;
    let tar = |m: &str| {
        client()
            .get(ws.url(&format!(
                "/api/assistant/chats/{chat}/workdir.tar?afterMessageId={m}"
            )))
            .send()
    };
    gone(tar(&first).await.unwrap()).await;
    gone(run_from(&ws, json!({"from": chat, "afterMessageId": first}), None).await).await;
    assert_eq!(fork(&second).await.unwrap().status(), 201);
    let t = tar(&second).await.unwrap();
    assert_eq!(t.status(), 200);
    let archive = t.bytes().await.unwrap();
    assert!(
        archive.windows(8).any(|w| w == b"turn two"),
        "turn two's bytes in its archive"
    );

    // Deleting the chat (the fork keeps turn two's blob) frees turn
    // three's.
    let three = sha256_bytes_hex(b"turn three");
    assert!(stored(&ws, &three).await);
    let r = client()
        .delete(ws.url(&format!("/api/assistant/chats/{chat}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert!(
        !stored(&ws, &three).await,
        "deleting the chat frees its blobs"
    );
    assert!(
        stored(&ws, &sha256_bytes_hex(b"turn two")).await,
        "the fork's"
    );
}
