//! The in-sandbox workspace API (`/api/assistant/sandbox/{session}/workspace/`,
//! docs/protocol.md §3): a session's `asbx_ws_` bearer opens its own bag and
//! history and nothing else; it dies with the run or its runtime cap;
//! uploads are capped and byte-exact. The fake runner holds the sessions
//! open; the tests play the sandbox with the bearer `/env` hands out.

use std::time::Duration;

use asbx_protocol::DispatchRequest;
use axum::Router;
use axum::body::Bytes;
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::{Value, json};

use crate::support::{
    Db, FakeRunner, Mode, SseReader, TestWorkspace, bind_loopback, client, on_both, post_turn,
    problem, serve, settled_run, sha256_bytes_hex, sha256_hex,
};

const MIB: usize = 1024 * 1024;

/// A session the fake runner holds open, seen from inside its sandbox.
struct Held {
    session: String,
    token: String,
    env: Value,
    dispatch: DispatchRequest,
    chat_id: Option<String>,
    _stream: reqwest::Response,
}

async fn redeem_env(d: &DispatchRequest) -> Value {
    let r = client()
        .get(format!("{}/env", d.agent_url))
        .bearer_auth(&d.otp_setup)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

async fn held(runner: &FakeRunner, n: usize, stream: reqwest::Response) -> Held {
    assert_eq!(stream.status(), 200);
    let chat_id = stream
        .headers()
        .get("x-asbx-chat-id")
        .map(|v| v.to_str().unwrap().to_owned());
    let dispatch = runner.next_dispatch(n).await;
    let env = redeem_env(&dispatch).await;
    let token = env["workspace"]["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("asbx_ws_"), "{env}");
    Held {
        session: dispatch.session_id.clone().unwrap(),
        token,
        env,
        dispatch,
        chat_id,
        _stream: stream,
    }
}

async fn open_chat(ws: &TestWorkspace, runner: &FakeRunner, n: usize, body: Value) -> Held {
    held(runner, n, post_turn(ws, body).await).await
}

async fn open_run(ws: &TestWorkspace, runner: &FakeRunner, n: usize, body: Value) -> Held {
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&body)
        .send()
        .await
        .unwrap();
    held(runner, n, resp).await
}

fn api(ws: &TestWorkspace, session: &str, rest: &str) -> String {
    ws.url(&format!(
        "/api/assistant/sandbox/{session}/workspace/{rest}"
    ))
}

async fn get(url: &str, token: &str) -> reqwest::Response {
    client().get(url).bearer_auth(token).send().await.unwrap()
}

async fn create(url: &str, token: &str, mime: Option<&str>, body: Vec<u8>) -> reqwest::Response {
    let mut req = client().post(url).bearer_auth(token).body(body);
    if let Some(m) = mime {
        req = req.header("content-type", m);
    }
    req.send().await.unwrap()
}

async fn ids(ws: &TestWorkspace, h: &Held) -> Vec<String> {
    let r = get(&api(ws, &h.session, "files"), &h.token).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    v["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn upload(ws: &TestWorkspace, name: &str, bytes: &[u8]) -> String {
    let v: Value = client()
        .post(ws.url(&format!("/api/assistant/files?name={name}")))
        .header("content-type", "text/plain")
        .body(bytes.to_vec())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["id"].as_str().unwrap().to_owned()
}

async fn unauthorized(resp: reqwest::Response, what: &str) {
    let p = problem(resp, 401).await;
    assert_eq!(p["code"], "unauthorized", "{what}: {p}");
}

on_both!(a_bearer_opens_its_own_session_and_nothing_else);
async fn a_bearer_opens_its_own_session_and_nothing_else(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let a_bytes = b"alpha \x00\xff\n".to_vec();
    let fa = upload(&ws, "a.txt", &a_bytes).await;
    let a = open_chat(
        &ws,
        &runner,
        0,
        json!({"message": "read a", "attachmentIds": [fa]}),
    )
    .await;
    assert_eq!(
        a.env["workspace"]["attachments"],
        json!([{"id": fa, "path": "attachments/a.txt", "size": a_bytes.len(),
                "sha256": sha256_bytes_hex(&a_bytes), "mimeType": "text/plain"}])
    );
    assert_eq!(a.env["setup_script"], Value::Null);
    let fb = upload(&ws, "b.txt", b"bravo").await;
    let b = open_chat(
        &ws,
        &runner,
        1,
        json!({"message": "read b", "attachmentIds": [fb]}),
    )
    .await;
    let c = open_run(&ws, &runner, 2, json!({"prompt": "solo"})).await;
    assert_eq!(
        c.env["workspace"],
        json!({"token": c.token, "attachments": []})
    );
    assert!(c.chat_id.is_none());

    // Positive controls: each session reads its own bag.
    assert_eq!(ids(&ws, &a).await, std::slice::from_ref(&fa));
    assert_eq!(ids(&ws, &b).await, std::slice::from_ref(&fb));
    assert!(ids(&ws, &c).await.is_empty());
    let r = get(&api(&ws, &a.session, &format!("files/{fa}")), &a.token).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/plain");
    assert_eq!(
        r.headers()["content-length"],
        a_bytes.len().to_string().as_str()
    );
    assert_eq!(
        r.headers()["x-asbx-sha256"],
        sha256_bytes_hex(&a_bytes).as_str()
    );
    assert_eq!(r.bytes().await.unwrap().to_vec(), a_bytes);

    // A run without a chat: its files are its bag.
    let r = create(
        &api(&ws, &c.session, "files?path=notes/c.txt"),
        &c.token,
        None,
        b"from c".to_vec(),
    )
    .await;
    assert_eq!(r.status(), 201);
    let fc: Value = r.json().await.unwrap();
    assert_eq!(fc["path"], "notes/c.txt");
    assert_eq!(fc["mimeType"], "application/octet-stream");
    assert_eq!(fc["size"], 6);
    assert_eq!(fc["sha256"], sha256_bytes_hex(b"from c").as_str());
    assert!(fc["createdAt"].is_i64());
    let fc = fc["id"].as_str().unwrap().to_owned();
    assert_eq!(ids(&ws, &c).await, std::slice::from_ref(&fc));

    // A's bearer on B's session: 401 on every route, before anything else.
    for (method, rest) in [
        ("GET", "files".to_owned()),
        ("GET", format!("files/{fb}")),
        ("GET", format!("files/{fa}")),
        ("POST", "files?path=x.txt".to_owned()),
        ("GET", "history".to_owned()),
    ] {
        let url = api(&ws, &b.session, &rest);
        let resp = if method == "POST" {
            create(&url, &a.token, None, b"x".to_vec()).await
        } else {
            get(&url, &a.token).await
        };
        unauthorized(resp, &format!("A's bearer: {method} {rest}")).await;
    }
    // ... and on a session that does not exist or has a bad id.
    unauthorized(
        get(&api(&ws, "nosuchsession", "files"), &a.token).await,
        "unknown",
    )
    .await;
    unauthorized(
        get(&api(&ws, "bad%20id", "files"), &a.token).await,
        "bad id",
    )
    .await;
    assert_eq!(
        ids(&ws, &b).await,
        std::slice::from_ref(&fb),
        "nothing was created in B"
    );

    // Its own session, another bag's file: not found, like no file at all.
    for (h, id) in [
        (&a, &fb),
        (&a, &fc),
        (&c, &fa),
        (&b, &fa),
        (&a, &"nope".to_owned()),
    ] {
        let r = get(&api(&ws, &h.session, &format!("files/{id}")), &h.token).await;
        assert_eq!(problem(r, 404).await["code"], "not_found");
    }

    // A file A creates joins its chat's bag (the page shows it), not B's.
    let r = create(
        &api(&ws, &a.session, "files?path=out/summary.md"),
        &a.token,
        Some("text/markdown"),
        b"# sum\n".to_vec(),
    )
    .await;
    assert_eq!(r.status(), 201);
    let made: Value = r.json().await.unwrap();
    assert_eq!(made["mimeType"], "text/markdown");
    let made = made["id"].as_str().unwrap().to_owned();
    let mut both = [fa.clone(), made.clone()];
    both.sort();
    let mut listed = ids(&ws, &a).await;
    listed.sort();
    assert_eq!(listed, both);
    assert_eq!(ids(&ws, &b).await, std::slice::from_ref(&fb));
    let chat: Value = client()
        .get(ws.url(&format!(
            "/api/assistant/chats/{}",
            a.chat_id.as_deref().unwrap()
        )))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let paths: Vec<_> = chat["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert!(
        paths.contains(&"a.txt") && paths.contains(&"out/summary.md") && paths.len() == 2,
        "{paths:?}"
    );

    // History: the chat's messages, oldest first; none for a run.
    let h: Value = get(&api(&ws, &a.session, "history"), &a.token)
        .await
        .json()
        .await
        .unwrap();
    let messages = h["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "{h}");
    assert_eq!(messages[0]["role"], "user");
    assert_eq!(messages[0]["text"], "read a\n[attached: a.txt]");
    assert!(messages[0]["createdAt"].is_i64());
    let h: Value = get(&api(&ws, &c.session, "history?limit=5"), &c.token)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(h, json!({"messages": []}));
    for bad in ["0", "101", "abc", "-1"] {
        let r = get(
            &api(&ws, &a.session, &format!("history?limit={bad}")),
            &a.token,
        )
        .await;
        assert_eq!(
            problem(r, 400).await["code"],
            "invalid_request",
            "limit={bad}"
        );
    }

    // What is not a workspace bearer: nothing, garbage, another scheme, a
    // callback one-time token (left unspent), an API key.
    let url = api(&ws, &a.session, "files");
    unauthorized(client().get(&url).send().await.unwrap(), "no bearer").await;
    unauthorized(get(&url, "garbage").await, "garbage").await;
    unauthorized(get(&url, "asbx_ws_garbage").await, "forged").await;
    let basic = client()
        .get(&url)
        .header("authorization", format!("Basic {}", a.token))
        .send()
        .await
        .unwrap();
    unauthorized(basic, "basic").await;
    unauthorized(get(&url, &a.dispatch.otp_run).await, "otp_run").await;
    let key = ws.workspace.create_api_key("default", "k").await.unwrap();
    assert!(key.starts_with("asbx_key_"));
    unauthorized(get(&url, &key).await, "api key").await;
    let r = client()
        .get(format!("{}/config", a.dispatch.agent_url))
        .bearer_auth(&a.dispatch.otp_run)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the run token was not spent");
    // `/env` answers once: there is no second bearer to be had.
    let r = client()
        .get(format!("{}/env", a.dispatch.agent_url))
        .bearer_auth(&a.dispatch.otp_setup)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // Only the bearer's hash is stored, nowhere its plaintext.
    let pool = ws.db().await;
    let rows: Vec<(String,)> =
        sqlx::query_as("SELECT hash FROM tokens WHERE session_id = $1 AND kind = 'workspace'")
            .bind(&a.session)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows, [(sha256_hex(&a.token),)]);
    let (env_json,): (String,) = sqlx::query_as("SELECT env_json FROM runs WHERE id = $1")
        .bind(&a.session)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(!env_json.contains("asbx_ws_"), "{env_json}");
    pool.close().await;

    // The run settles: its bearer is dead, the others live on.
    let r = client()
        .delete(ws.url(&format!("/api/runs/{}", c.session)))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    assert_ne!(settled_run(&ws, &c.session).await["status"], "running");
    unauthorized(
        get(&api(&ws, &c.session, "files"), &c.token).await,
        "settled",
    )
    .await;
    assert_eq!(ids(&ws, &a).await.len(), 2);
    runner.shared.release.notify_waiters();
}

on_both!(bearers_follow_the_runtime_cap);
async fn bearers_follow_the_runtime_cap(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    // A two-hour run: well past the contract's 10 min (run) and 1 h (upload).
    let cap_ms = 2 * 3_600_000u64;
    let h = open_run(
        &ws,
        &runner,
        0,
        json!({"prompt": "long", "limits": {"max_duration_ms": cap_ms}}),
    )
    .await;
    let url = api(&ws, &h.session, "files");
    ws.clock.advance(Duration::from_millis(cap_ms - 60_000));
    assert_eq!(get(&url, &h.token).await.status(), 200);
    let r = client()
        .get(format!("{}/config", h.dispatch.agent_url))
        .bearer_auth(&h.dispatch.otp_run)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the run token outlives a long setup");
    let r = client()
        .post(format!("{}/results", h.dispatch.agent_url))
        .bearer_auth(h.dispatch.otp_upload.as_deref().unwrap())
        .json(&json!({"files": [{"path": "late.txt", "content_base64": "bGF0ZQ=="}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "writeback after a long run is stored");
    // The written-back file is in the run's bag.
    let listed: Value = get(&url, &h.token).await.json().await.unwrap();
    assert_eq!(listed["files"][0]["path"], "late.txt");
    // Cap + 60 s: the bearer has expired although the run still runs.
    ws.clock.advance(Duration::from_millis(119_999));
    assert_eq!(get(&url, &h.token).await.status(), 200);
    ws.clock.advance(Duration::from_millis(2));
    unauthorized(get(&url, &h.token).await, "expired").await;
    runner.shared.release.notify_waiters();
}

#[tokio::test]
async fn uploads_are_capped_streamed_and_byte_exact() {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;
    let h = open_chat(&ws, &runner, 0, json!({"message": "make files"})).await;

    // Exactly 16 MiB of varied bytes: stored and read back identical.
    let big: Vec<u8> = (0..16 * MIB)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect();
    let r = create(
        &api(&ws, &h.session, "files?path=data/big.bin"),
        &h.token,
        None,
        big.clone(),
    )
    .await;
    assert_eq!(r.status(), 201);
    let made: Value = r.json().await.unwrap();
    assert_eq!(made["size"], 16 * MIB);
    assert_eq!(made["sha256"], sha256_bytes_hex(&big).as_str());
    let r = get(
        &api(
            &ws,
            &h.session,
            &format!("files/{}", made["id"].as_str().unwrap()),
        ),
        &h.token,
    )
    .await;
    assert_eq!(
        r.headers()["x-asbx-sha256"],
        sha256_bytes_hex(&big).as_str()
    );
    let back = r.bytes().await.unwrap();
    assert_eq!(back.len(), big.len());
    assert!(back == big, "the bytes differ");

    // One byte more: 413, declared or streamed without a length; nothing kept.
    let mut over = big;
    over.push(0);
    let r = create(
        &api(&ws, &h.session, "files?path=over.bin"),
        &h.token,
        None,
        over.clone(),
    )
    .await;
    assert_eq!(problem(r, 413).await["code"], "body_too_large");
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        over.chunks(MIB).map(|c| Ok(c.to_vec())).collect();
    let r = client()
        .post(api(&ws, &h.session, "files?path=over.bin"))
        .bearer_auth(&h.token)
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(problem(r, 413).await["code"], "body_too_large");
    assert_eq!(ids(&ws, &h).await.len(), 1);
    let tmp = ws.data_dir.path().join("blobs/tmp");
    if tmp.exists() {
        assert_eq!(
            std::fs::read_dir(&tmp).unwrap().count(),
            0,
            "a partial upload was left"
        );
    }

    // Paths that climb out, are absolute or empty: 400, nothing created.
    for bad in [
        "path=../x",
        "path=%2e%2e/x",
        "path=a/../../x",
        "path=/etc/passwd",
        "path=",
        "path=a//b",
        "other=x",
    ] {
        let r = create(
            &api(&ws, &h.session, &format!("files?{bad}")),
            &h.token,
            None,
            b"x".to_vec(),
        )
        .await;
        assert_eq!(problem(r, 400).await["code"], "invalid_request", "{bad}");
    }
    let r = create(
        &api(&ws, &h.session, "files?path=ok.txt"),
        &h.token,
        Some("not a mime"),
        b"x".to_vec(),
    )
    .await;
    assert_eq!(problem(r, 400).await["code"], "invalid_request");
    assert_eq!(ids(&ws, &h).await.len(), 1);
    runner.shared.release.notify_waiters();
}

/// A runner whose sandbox sends a writeback the workspace refuses, then
/// ends the turn the way the agent does: text, then an `error` line
/// `writeback_failed` (docs/protocol.md §2).
async fn refused_writeback_runner() -> (url::Url, crate::support::AbortOnDrop) {
    async fn stream(body: Bytes) -> axum::response::Response {
        let d = DispatchRequest::parse(&body).unwrap();
        let c = client();
        let env = redeem_env(&d).await;
        assert!(env["workspace"]["token"].is_string());
        let r = c
            .post(format!("{}/results", d.agent_url))
            .bearer_auth(d.otp_upload.as_deref().unwrap())
            .json(&json!({"files": [{"path": "../escape.txt", "content_base64": "eA=="}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        let s = d.session_id.clone().unwrap();
        let lines = [
            json!({"type": "delta", "text": "Here is the summary."}),
            json!({"type": "error", "code": "writeback_failed",
                   "message": "writeback failed: the workspace answered 400"}),
        ];
        let body: String = lines
            .into_iter()
            .enumerate()
            .map(|(i, l)| asbx_test_support::fake_runner::line(i as u64 + 1, &s, l))
            .collect();
        ([("content-type", "application/x-ndjson")], body).into_response()
    }
    let listener = bind_loopback().await;
    let url = url::Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
    (
        url,
        serve(listener, Router::new().route("/stream", post(stream))),
    )
}

#[tokio::test]
async fn a_refused_writeback_shows_on_the_chat_turn() {
    let (url, _runner) = refused_writeback_runner().await;
    let ws = TestWorkspace::start(Some(url)).await;
    let resp = post_turn(&ws, json!({"message": "summarise"})).await;
    assert_eq!(resp.status(), 200);
    let chat_id = resp.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let events = SseReader::new(resp).until_done().await;
    let error = events
        .iter()
        .find(|e| e.event == "error")
        .expect("an error event");
    assert_eq!(error.data["code"], "writeback_failed", "{error:?}");
    let done = events.last().unwrap();
    assert_eq!(done.data["status"], "failed");

    // Persisted: the text and a visible error block.
    let d: Value = client()
        .get(ws.url(&format!("/api/assistant/chats/{chat_id}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let content = d["messages"][1]["content"].as_array().unwrap();
    assert_eq!(
        content[0],
        json!({"type": "text", "text": "Here is the summary."})
    );
    let last = content.last().unwrap();
    assert_eq!(last["type"], "error");
    assert_eq!(last["code"], "writeback_failed");
    assert!(last["message"].as_str().unwrap().contains("400"));
}

#[tokio::test]
async fn a_workspace_bearer_is_no_api_key_and_needs_none() {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_with(Some(runner.url.clone()), |c| c.require_auth = true).await;
    let key = ws.workspace.create_api_key("default", "k").await.unwrap();
    let resp = client()
        .post(ws.url("/api/runs"))
        .bearer_auth(&key)
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    let h = held(&runner, 0, resp).await;
    // With auth required, the sandbox's routes take its bearer alone...
    assert!(ids(&ws, &h).await.is_empty());
    // ... and the bearer opens none of the API's routes (the key does).
    for path in [
        "/api/assistant/chats".to_owned(),
        format!("/api/runs/{}", h.session),
    ] {
        unauthorized(get(&ws.url(&path), &h.token).await, &path).await;
        assert_eq!(get(&ws.url(&path), &key).await.status(), 200, "{path}");
    }
    runner.shared.release.notify_waiters();
}
