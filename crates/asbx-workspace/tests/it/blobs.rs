//! The file bag in the database (`ASBX_BLOB_STORE=db`, the default on
//! PostgreSQL): uploads through the in-sandbox API and writebacks come back
//! byte-exact, a refused upload leaves no row, equal bytes are stored once
//! even when two uploads race, and a file written through one workspace
//! node downloads from another.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use sqlx::Row as _;

use crate::support::{
    Db, FakeRunner, Mode, TestWorkspace, client, on_both, post_turn, problem, sha256_bytes_hex,
};
use asbx_workspace::BlobBackend;

const MIB: usize = 1024 * 1024;
/// The in-sandbox API's upload cap.
const MAX_FILE: usize = 16 * MIB;

/// `n` bytes with no period that lines up with a chunk.
fn varied(n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| ((i as u64).wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// A chat turn the fake runner holds open, seen from inside its sandbox:
/// the session id and its `asbx_ws_` bearer.
struct Sandbox {
    session: String,
    token: String,
    _stream: reqwest::Response,
}

/// The `n`th dispatch the runner got.
async fn hold_a_turn(ws: &TestWorkspace, runner: &FakeRunner, n: usize) -> Sandbox {
    let stream = post_turn(ws, json!({"message": "make files"})).await;
    assert_eq!(stream.status(), 200);
    let d = runner.next_dispatch(n).await;
    let env: Value = client()
        .get(format!("{}/env", d.agent_url))
        .bearer_auth(&d.otp_setup)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    Sandbox {
        session: d.session_id.clone().unwrap(),
        token: env["workspace"]["token"].as_str().unwrap().to_owned(),
        _stream: stream,
    }
}

fn files_url(ws: &TestWorkspace, s: &Sandbox, rest: &str) -> String {
    ws.url(&format!(
        "/api/assistant/sandbox/{}/workspace/files{rest}",
        s.session
    ))
}

/// Uploads `bytes` through the in-sandbox API, streamed in 64 KiB pieces
/// without a length; returns the response.
async fn upload(ws: &TestWorkspace, s: &Sandbox, path: &str, bytes: &[u8]) -> reqwest::Response {
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> =
        bytes.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    client()
        .post(files_url(ws, s, &format!("?path={path}")))
        .bearer_auth(&s.token)
        .body(reqwest::Body::wrap_stream(futures::stream::iter(pieces)))
        .send()
        .await
        .unwrap()
}

/// `GET /api/files/{id}` on `ws`: the bytes, checked to be complete.
async fn download(ws: &TestWorkspace, id: &str) -> Vec<u8> {
    let r = client()
        .get(ws.url(&format!("/api/files/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "GET /api/files/{id}");
    r.bytes().await.unwrap().to_vec()
}

async fn count(db: &sqlx::AnyPool, sql: &str) -> i64 {
    sqlx::query(sql)
        .fetch_one(db)
        .await
        .unwrap()
        .try_get(0)
        .unwrap()
}

/// Rows in the blob tables: (complete blobs, uploads in progress, chunks).
async fn rows(ws: &TestWorkspace) -> (i64, i64, i64) {
    let db = ws.db().await;
    let out = (
        count(&db, "SELECT COUNT(*) FROM blobs WHERE complete = 1").await,
        count(&db, "SELECT COUNT(*) FROM blobs WHERE complete = 0").await,
        count(&db, "SELECT COUNT(*) FROM blob_chunks").await,
    );
    db.close().await;
    out
}

on_both!(the_db_bag_round_trips_byte_exact);
async fn the_db_bag_round_trips_byte_exact(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |c| {
        c.blob_store = Some(BlobBackend::Db);
    })
    .await;
    let s = hold_a_turn(&ws, &runner, 0).await;
    let mut chunks = 0;
    for (i, size) in [0, 1, MIB, 5 * MIB + 1].into_iter().enumerate() {
        let bytes = varied(size);
        let r = upload(&ws, &s, &format!("f{i}.bin"), &bytes).await;
        assert_eq!(r.status(), 201, "{size} bytes");
        let made: Value = r.json().await.unwrap();
        assert_eq!(made["size"], size);
        assert_eq!(made["sha256"], sha256_bytes_hex(&bytes).as_str());
        let id = made["id"].as_str().unwrap();
        // Through the public download and the in-sandbox read.
        assert!(download(&ws, id).await == bytes, "{size} bytes differ");
        let r = client()
            .get(files_url(&ws, &s, &format!("/{id}")))
            .bearer_auth(&s.token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.bytes().await.unwrap() == bytes, "{size} bytes differ");
        chunks += size.div_ceil(MIB) as i64;
    }
    assert_eq!(rows(&ws).await, (4, 0, chunks));
    // Nothing under the data folder: the bytes are in the database.
    assert!(!ws.data_dir.path().join("blobs").exists());

    // One byte over the cap, streamed: refused, no row left.
    let r = upload(&ws, &s, "over.bin", &varied(MAX_FILE + 1)).await;
    assert_eq!(problem(r, 413).await["code"], "body_too_large");
    assert_eq!(rows(&ws).await, (4, 0, chunks));
    // At the cap: stored.
    let r = upload(&ws, &s, "cap.bin", &varied(MAX_FILE)).await;
    assert_eq!(r.status(), 201);
    assert_eq!(rows(&ws).await, (5, 0, chunks + 16));
    runner.shared.release.notify_waiters();
}

on_both!(two_uploads_of_the_same_bytes_at_once_store_one_blob);
async fn two_uploads_of_the_same_bytes_at_once_store_one_blob(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |c| {
        c.blob_store = Some(BlobBackend::Db);
    })
    .await;
    let s = hold_a_turn(&ws, &runner, 0).await;
    let bytes = varied(3 * MIB + 5);
    let (a, b) = tokio::join!(
        upload(&ws, &s, "a.bin", &bytes),
        upload(&ws, &s, "b.bin", &bytes)
    );
    let (a, b): (Value, Value) = (a.json().await.unwrap(), b.json().await.unwrap());
    assert_eq!(a["sha256"], sha256_bytes_hex(&bytes).as_str(), "{a}");
    assert_eq!(a["sha256"], b["sha256"], "{b}");
    assert_ne!(a["id"], b["id"], "two files");
    assert_eq!(rows(&ws).await, (1, 0, 4), "one blob of four chunks");
    for f in [&a, &b] {
        assert!(download(&ws, f["id"].as_str().unwrap()).await == bytes);
    }
    runner.shared.release.notify_waiters();
}

// Two nodes on one database. On PostgreSQL with the default backend
// (nothing set: `db`), on SQLite with `db` named.
on_both!(a_file_written_on_one_node_downloads_from_another);
async fn a_file_written_on_one_node_downloads_from_another(db: Db) {
    let on_sqlite = db == Db::Sqlite;
    let pick = move |c: &mut asbx_workspace::WorkspaceConfig| {
        if on_sqlite {
            c.blob_store = Some(BlobBackend::Db);
        }
    };
    let written = varied(2 * MIB + 3);
    let runner = FakeRunner::start(Mode::Full {
        files: vec![json!({"path": "out/report.bin", "content_base64": STANDARD.encode(&written)})],
    })
    .await;
    let a = TestWorkspace::start_on(db, Some(runner.url.clone()), pick).await;
    let shared = a.database_url.clone();
    let b = TestWorkspace::start_with(None, |c| {
        c.database_url = Some(shared);
        pick(c);
    })
    .await;

    // Written back through node A.
    let resp = client()
        .post(a.url("/api/runs"))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    resp.text().await.unwrap();
    let (route, status, stored) = &runner.callbacks()[2];
    assert_eq!((route.as_str(), *status), ("results", 200));
    let id = stored["files"][0]["id"].as_str().unwrap().to_owned();
    assert!(
        download(&b, &id).await == written,
        "writeback read on node B"
    );

    // Uploaded through the in-sandbox API on node A.
    *runner.shared.mode.lock().unwrap() = Mode::Hold;
    let s = hold_a_turn(&a, &runner, 1).await;
    let uploaded = varied(5 * MIB + 1);
    let r = upload(&a, &s, "big.bin", &uploaded).await;
    assert_eq!(r.status(), 201);
    let made: Value = r.json().await.unwrap();
    assert!(
        download(&b, made["id"].as_str().unwrap()).await == uploaded,
        "upload read on node B"
    );
    runner.shared.release.notify_waiters();
}

/// The control: with each node's own folder, node B has the file's row but
/// not its bytes.
#[tokio::test]
async fn with_a_folder_per_node_another_node_can_not_serve_the_file() {
    let runner = FakeRunner::start(Mode::Full {
        files: vec![json!({"path": "out/a.txt", "content_base64": STANDARD.encode("hello")})],
    })
    .await;
    let a = TestWorkspace::start(Some(runner.url.clone())).await;
    let shared = a.database_url.clone();
    let b = TestWorkspace::start_with(None, |c| c.database_url = Some(shared)).await;
    let resp = client()
        .post(a.url("/api/runs"))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    resp.text().await.unwrap();
    let id = runner.callbacks()[2].2["files"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(download(&a, &id).await, b"hello");
    let r = client()
        .get(b.url(&format!("/api/files/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
}

/// Uploads `bytes` to the bag (of `chat`, if given); the file's id.
async fn upload_bag(ws: &TestWorkspace, name: &str, chat: Option<&str>, bytes: &[u8]) -> String {
    let query = match chat {
        Some(c) => format!("name={name}&chatId={c}"),
        None => format!("name={name}"),
    };
    let r = client()
        .post(ws.url(&format!("/api/assistant/files?{query}")))
        .header("content-type", "application/octet-stream")
        .body(bytes.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let made: Value = r.json().await.unwrap();
    made["id"].as_str().unwrap().to_owned()
}

async fn delete(ws: &TestWorkspace, path: &str) {
    let r = client().delete(ws.url(path)).send().await.unwrap();
    assert_eq!(r.status(), 204, "DELETE {path}");
}

/// Whether the bytes `sha` are stored anywhere: a file in the blob folder,
/// or rows in the blob tables.
async fn kept(ws: &TestWorkspace, sha: &str) -> bool {
    let file = ws
        .data_dir
        .path()
        .join("blobs")
        .join(&sha[..2])
        .join(&sha[2..])
        .exists();
    let db = ws.db().await;
    let rows = count(
        &db,
        &format!(
            "SELECT (SELECT COUNT(*) FROM blob_chunks WHERE sha256 = '{sha}') \
             + (SELECT COUNT(*) FROM blobs WHERE sha256 = '{sha}')"
        ),
    )
    .await;
    db.close().await;
    file || rows > 0
}

/// Deleting a file, or a chat, frees the bytes no other file has; a row
/// deleted without its bytes (a crash between) is freed by a sweep.
async fn deleting_frees_bytes(db: Db, backend: BlobBackend) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |c| {
        c.blob_store = Some(backend);
    })
    .await;
    // More than a chunk, so the database holds several rows of it.
    let same = varied(MIB + 5);
    let sha = sha256_bytes_hex(&same);
    let a = upload_bag(&ws, "a.bin", None, &same).await;
    let b = upload_bag(&ws, "b.bin", None, &same).await;
    assert!(kept(&ws, &sha).await, "positive control");
    delete(&ws, &format!("/api/files/{a}")).await;
    assert!(kept(&ws, &sha).await, "b still has these bytes");
    assert!(download(&ws, &b).await == same);
    delete(&ws, &format!("/api/files/{b}")).await;
    assert!(!kept(&ws, &sha).await, "the last file's bytes are freed");

    // A chat's attachment goes with the chat.
    let turn = post_turn(&ws, json!({"message": "hi"})).await;
    let chat = turn.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    turn.bytes().await.unwrap();
    let attached = varied(300);
    let attached_sha = sha256_bytes_hex(&attached);
    upload_bag(&ws, "c.bin", Some(&chat), &attached).await;
    assert!(kept(&ws, &attached_sha).await);
    delete(&ws, &format!("/api/assistant/chats/{chat}")).await;
    assert!(
        !kept(&ws, &attached_sha).await,
        "the chat's bytes are freed"
    );

    // A leak: the row deleted, the bytes not (the node died between).
    let leaked = varied(77);
    let leaked_sha = sha256_bytes_hex(&leaked);
    let d = upload_bag(&ws, "d.bin", None, &leaked).await;
    let pool = ws.db().await;
    sqlx::query("UPDATE files SET deleted_at = 1 WHERE id = $1")
        .bind(&d)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    assert!(kept(&ws, &leaked_sha).await);
    assert!(ws.workspace.collect_garbage().await.unwrap() >= 1);
    assert!(!kept(&ws, &leaked_sha).await, "the sweep freed the leak");
}

on_both!(deleting_frees_bytes_in_the_folder);
async fn deleting_frees_bytes_in_the_folder(db: Db) {
    deleting_frees_bytes(db, BlobBackend::Dir).await;
}

on_both!(deleting_frees_bytes_in_the_database);
async fn deleting_frees_bytes_in_the_database(db: Db) {
    deleting_frees_bytes(db, BlobBackend::Db).await;
}
