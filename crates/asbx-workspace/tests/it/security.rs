//! Issue 13 ("Security, round two"), workspace side: each protection is
//! attacked, and a positive control shows the same request succeeds when it
//! is legitimate, so a refusal is never vacuous.
//!
//! Router-level checks use `tower::ServiceExt::oneshot` (no socket); the
//! error bodies are snapshots (`insta`); what needs a real connection (the
//! `/results` body that is never read, the runner token on the wire) runs
//! over loopback.

use std::time::Duration;

use asbx_workspace::{Workspace, WorkspaceConfig, WorkspaceError};
use axum::body::Body;
use axum::http::{Request, Response};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tower::ServiceExt as _;

use asbx_test_support::asbx_snapshot;

use crate::support::{FakeRunner, Mode, TestWorkspace, client, problem};

/// The `Host` the test workspace answers to (`127.0.0.1:port`).
fn own_host(ws: &TestWorkspace) -> String {
    ws.base.trim_start_matches("http://").to_owned()
}

/// One request through the router, no socket.
async fn oneshot(ws: &TestWorkspace, req: Request<Body>) -> Response<Body> {
    ws.workspace.router().oneshot(req).await.unwrap()
}

/// The problem body of a response, asserting status and content type.
async fn problem_of(resp: Response<Body>, status: u16) -> Value {
    assert_eq!(resp.status().as_u16(), status);
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ct.starts_with("application/problem+json"), "{ct}");
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    let p: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(p["status"], status);
    p
}

async fn count(ws: &TestWorkspace, table: &str) -> i64 {
    let pool = ws.db().await;
    let (n,): (i64,) = sqlx::query_as(&format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    n
}

fn post(ws: &TestWorkspace, path: &str) -> axum::http::request::Builder {
    Request::post(path).header("host", own_host(ws))
}

/// Item 4: a browser-style cross-origin `text/plain` POST (a "simple"
/// request, sent without a preflight) to the chat stream and to the agents
/// API is refused and creates nothing; the same POST without an `Origin` but
/// as `text/plain` or without a content type is `415`; the same-origin JSON
/// POST works.
#[tokio::test]
async fn cross_origin_and_non_json_posts_are_refused_and_create_nothing() {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;
    let turn = json!({"message": "hello"}).to_string();
    let agent = json!({"name": "csrf"}).to_string();
    for (path, body) in [
        ("/api/assistant/chat/stream", &turn),
        ("/api/agents", &agent),
    ] {
        let req = post(&ws, path)
            .header("origin", "http://evil.example")
            .header("content-type", "text/plain")
            .body(Body::from(body.clone()))
            .unwrap();
        let p = problem_of(oneshot(&ws, req).await, 403).await;
        assert_eq!(p["code"], "cross_origin", "{p}");
        asbx_snapshot!("cross_origin", p);

        // Even as JSON, another origin may not change state.
        let req = post(&ws, path)
            .header("origin", "http://evil.example")
            .header("content-type", "application/json")
            .body(Body::from(body.clone()))
            .unwrap();
        assert_eq!(
            problem_of(oneshot(&ws, req).await, 403).await["code"],
            "cross_origin"
        );

        for content_type in [
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            None,
        ] {
            let mut req = post(&ws, path);
            if let Some(ct) = content_type {
                req = req.header("content-type", ct);
            }
            let req = req.body(Body::from(body.clone())).unwrap();
            let p = problem_of(oneshot(&ws, req).await, 415).await;
            assert_eq!(p["code"], "unsupported_media_type", "{content_type:?}: {p}");
            if content_type == Some("text/plain") {
                asbx_snapshot!("unsupported_media_type", p);
            }
        }
    }
    for table in ["chats", "messages", "runs", "agents", "tokens"] {
        assert_eq!(count(&ws, table).await, 0, "{table}");
    }
    assert!(runner.dispatches().is_empty());

    // Positive control: the same requests, same-origin and JSON, work.
    let req = post(&ws, "/api/agents")
        .header("origin", ws.base.clone())
        .header("content-type", "application/json")
        .body(Body::from(agent.clone()))
        .unwrap();
    assert_eq!(oneshot(&ws, req).await.status(), 201);
    assert_eq!(count(&ws, "agents").await, 1);
    let resp = client()
        .post(ws.url("/api/assistant/chat/stream"))
        .header("origin", ws.base.clone())
        .header("content-type", "application/json; charset=utf-8")
        .body(turn.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    assert_eq!(count(&ws, "chats").await, 1);
    assert_eq!(runner.dispatches().len(), 1);
}

/// Item 4, DNS rebinding: a request whose `Host` is not one the server
/// answers to is refused, reads included; loopback names are answered.
#[tokio::test]
async fn a_foreign_host_is_refused() {
    let ws = TestWorkspace::start(None).await;
    let port = own_host(&ws).rsplit(':').next().unwrap().to_owned();
    for host in [
        "evil.example",
        "evil.example:80",
        "localhost.evil.example",
        "127.0.0.2:80",
    ] {
        let req = Request::get("/api/assistant/chats")
            .header("host", host)
            .body(Body::empty())
            .unwrap();
        let p = problem_of(oneshot(&ws, req).await, 403).await;
        assert_eq!(p["code"], "host_not_allowed", "{host}: {p}");
        if host == "evil.example" {
            asbx_snapshot!("host_not_allowed", p);
        }
    }
    // The page itself is refused too: a rebound name can't load it.
    let req = Request::get("/")
        .header("host", "evil.example")
        .body(Body::empty())
        .unwrap();
    assert_eq!(oneshot(&ws, req).await.status(), 403);
    // Positive control: every loopback name with the server's port.
    for host in [
        own_host(&ws),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ] {
        let req = Request::get("/api/assistant/chats")
            .header("host", &host)
            .body(Body::empty())
            .unwrap();
        assert_eq!(oneshot(&ws, req).await.status(), 200, "{host}");
    }
    // And over a real socket, as a browser would send it.
    let resp = client()
        .get(ws.url("/api/assistant/chats"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

/// Issue 28 (docs/protocol.md §8 as amended): an SSH tunnel or a forwarded
/// port reaches a loopback workspace under its own port (`ssh -L
/// 9000:localhost:7878` sends `Host: localhost:9000`): the page, reads and
/// same-origin writes work through it; a foreign host, and an origin that is
/// neither the request's own nor the public URL's, are still refused.
#[tokio::test]
async fn a_tunnelled_port_is_answered_and_other_origins_are_still_refused() {
    let ws = TestWorkspace::start(None).await;
    let agent = json!({"name": "tunnelled"}).to_string();
    let tunnel = "localhost:9000";
    for path in ["/", "/api/assistant/chats"] {
        let req = Request::get(path)
            .header("host", tunnel)
            .body(Body::empty())
            .unwrap();
        assert_eq!(oneshot(&ws, req).await.status(), 200, "{path}");
    }
    let create = |host: &str, origin: &str| {
        Request::post("/api/agents")
            .header("host", host)
            .header("origin", origin)
            .header("content-type", "application/json")
            .body(Body::from(agent.clone()))
            .unwrap()
    };
    // The tunnelled page posts with its own origin.
    let resp = oneshot(&ws, create(tunnel, "http://localhost:9000")).await;
    assert_eq!(resp.status(), 201);
    assert_eq!(count(&ws, "agents").await, 1);
    // The public URL's origin is accepted whatever the Host.
    let resp = oneshot(&ws, create(tunnel, &ws.base)).await;
    assert_eq!(resp.status(), 201);
    assert_eq!(count(&ws, "agents").await, 2);

    // The tunnel's origin on a request to another port is another origin.
    for (host, origin) in [
        (own_host(&ws), "http://localhost:9000"),
        (tunnel.to_owned(), "http://localhost:9001"),
        (tunnel.to_owned(), "https://localhost:9000"),
        (tunnel.to_owned(), "http://evil.example"),
    ] {
        let p = problem_of(oneshot(&ws, create(&host, origin)).await, 403).await;
        assert_eq!(p["code"], "cross_origin", "{origin} on {host}: {p}");
    }
    // A foreign host is refused even with its "own" origin.
    let p = problem_of(
        oneshot(&ws, create("evil.example", "http://evil.example")).await,
        403,
    )
    .await;
    assert_eq!(p["code"], "host_not_allowed", "{p}");
    assert_eq!(count(&ws, "agents").await, 2);
}

/// Item 4: `405`, `404` of unknown routes, `413` and extractor rejections
/// all answer problem+json, never an empty body.
#[tokio::test]
async fn every_error_is_problem_json() {
    let ws = TestWorkspace::start(None).await;
    let req = Request::delete("/api/runs")
        .header("host", own_host(&ws))
        .body(Body::empty())
        .unwrap();
    let resp = oneshot(&ws, req).await;
    let allow = resp.headers()["allow"].to_str().unwrap().to_owned();
    assert!(allow.contains("POST"), "{allow}");
    let p = problem_of(resp, 405).await;
    assert_eq!(p["code"], "method_not_allowed");
    asbx_snapshot!("method_not_allowed", p);

    let req = Request::get("/api/nothing-here")
        .header("host", own_host(&ws))
        .body(Body::empty())
        .unwrap();
    let p = problem_of(oneshot(&ws, req).await, 404).await;
    assert_eq!(p["code"], "not_found");
    asbx_snapshot!("not_found", p);

    let huge = format!("{{\"message\": \"{}\"}}", "x".repeat(9 << 20));
    let req = post(&ws, "/api/assistant/chat/stream")
        .header("content-type", "application/json")
        .body(Body::from(huge))
        .unwrap();
    let p = problem_of(oneshot(&ws, req).await, 413).await;
    assert_eq!(p["code"], "body_too_large");
    asbx_snapshot!("body_too_large", p);

    // A query the extractor can't decode.
    let req = Request::get("/api/assistant/chats/x/stream?after=%ZZ")
        .header("host", own_host(&ws))
        .body(Body::empty())
        .unwrap();
    let resp = oneshot(&ws, req).await;
    assert!(resp.status().is_client_error(), "{}", resp.status());
    let status = resp.status().as_u16();
    let p = problem_of(resp, status).await;
    assert!(p["detail"].as_str().is_some_and(|d| !d.is_empty()), "{p}");

    let req = post(&ws, "/api/runs")
        .header("content-type", "application/json")
        .body(Body::from(
            "{\"prompt\": \"x\", \"sandboxUrl\": \"http://127.0.0.1:9\"}",
        ))
        .unwrap();
    let p = problem_of(oneshot(&ws, req).await, 400).await;
    asbx_snapshot!("sandbox_url_not_configured", p);
}

/// Item 3: listening on a non-loopback address needs `require_auth`.
#[tokio::test]
async fn a_public_listener_needs_auth() {
    let dir = tempfile::tempdir().unwrap();
    let config = |listen: &str, require_auth: bool| {
        let mut c = WorkspaceConfig::new(dir.path(), "http://127.0.0.1:1".parse().unwrap());
        c.listen = Some(listen.parse().unwrap());
        c.require_auth = require_auth;
        c
    };
    for listen in ["0.0.0.0:8080", "192.0.2.1:8080", "[::]:8080"] {
        match Workspace::open(config(listen, false)).await {
            Err(e @ WorkspaceError::AuthRequired { .. }) => {
                assert!(e.to_string().contains("ASBX_REQUIRE_AUTH"), "{e}");
            }
            other => panic!("{listen}: expected AuthRequired, got {other:?}"),
        }
    }
    // Positive controls: with auth anywhere, or on loopback without it.
    Workspace::open(config("0.0.0.0:8080", true)).await.unwrap();
    Workspace::open(config("127.0.0.1:8080", false))
        .await
        .unwrap();
    Workspace::open(config("[::1]:8080", false)).await.unwrap();
}

/// Item 3: the runner token goes as `Authorization: Bearer` to the
/// operator's runner on every dispatch (runs, chat turns, agent runs), and
/// never to a runner a stored agent names itself.
#[tokio::test]
async fn the_runner_token_goes_to_the_operators_runner_only() {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let agents_own = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_with(Some(runner.url.clone()), |c| {
        c.runner_token = Some("asbx_runner_secret".to_owned());
        // Allowed, yet not the operator's: no token goes there.
        c.allowed_sandbox_urls = vec![agents_own.url.clone()];
    })
    .await;
    let c = client();
    let resp = c
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    let resp = crate::support::post_turn(&ws, json!({"message": "hi"})).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    let plain: Value = c
        .post(ws.url("/api/agents"))
        .json(&json!({"name": "plain"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let own: Value = c
        .post(ws.url("/api/agents"))
        .json(&json!({"name": "own", "environment": {"variables": {"SANDBOX_URL": agents_own.url.as_str()}}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for agent in [&plain, &own] {
        let resp = c
            .post(ws.url(&format!(
                "/api/agents/{}/runs",
                agent["id"].as_str().unwrap()
            )))
            .json(&json!({"prompt": "x"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    let want = Some("Bearer asbx_runner_secret".to_owned());
    assert_eq!(
        runner.authorizations(),
        vec![want.clone(), want.clone(), want]
    );
    assert_eq!(agents_own.authorizations(), vec![None]);

    // Control: without a configured token, none is sent.
    let bare = TestWorkspace::start(Some(runner.url.clone())).await;
    let resp = c
        .post(bare.url("/api/runs"))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    resp.bytes().await.unwrap();
    assert_eq!(runner.authorizations().last().unwrap(), &None);
}

/// Sends a raw `/results` request over TCP: the headers declare
/// `content_length` bytes, of which only `send` are written. Returns what the
/// server answered within `wait`, or `None`.
async fn raw_results(
    ws: &TestWorkspace,
    session: &str,
    token: &str,
    content_length: usize,
    send: &[u8],
    wait: Duration,
) -> Option<String> {
    let mut tcp = tokio::net::TcpStream::connect(own_host(ws)).await.unwrap();
    let head = format!(
        "POST /api/assistant/sandbox/{session}/results HTTP/1.1\r\nhost: {}\r\n\
         authorization: Bearer {token}\r\ncontent-type: application/json\r\n\
         content-length: {content_length}\r\n\r\n",
        own_host(ws)
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    // The server may answer (and close) before taking all of it.
    let _ = tcp.write_all(send).await;
    let mut buf = vec![0u8; 4096];
    match tokio::time::timeout(wait, tcp.read(&mut buf)).await {
        Ok(Ok(n)) if n > 0 => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
        _ => None,
    }
}

/// Item 11: the upload token is checked before the (up to 64 MiB) body is
/// read: a wrong token is answered `401` while the client has sent only a
/// sliver of what it announced; the right token with a whole body works.
#[tokio::test]
async fn results_token_is_checked_before_the_body_is_read() {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let d = runner.next_dispatch(0).await;
    let session = d.session_id.clone().unwrap();

    // 60 MiB announced, 64 KiB sent: the answer comes anyway, at once.
    let sliver = vec![b' '; 64 * 1024];
    let answer = raw_results(
        &ws,
        &session,
        "asbx_otp_wrong",
        60 << 20,
        &sliver,
        Duration::from_secs(5),
    )
    .await
    .expect("answered before the body was sent");
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("otp_rejected"), "{answer}");

    // Positive control: the right token and a whole body are stored.
    let body = json!({"files": [{"path": "a.txt", "content_base64": "aGk="}]}).to_string();
    let upload = d.otp_upload.clone().unwrap();
    let answer = raw_results(
        &ws,
        &session,
        &upload,
        body.len(),
        body.as_bytes(),
        Duration::from_secs(10),
    )
    .await
    .expect("answered");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("a.txt"), "{answer}");
    runner.shared.release.notify_waiters();
    drop(resp);
}

/// Item 11 with the ordinary client: a wrong token gets the 401 problem.
#[tokio::test]
async fn results_with_a_wrong_token_is_a_401_problem() {
    let ws = TestWorkspace::start(None).await;
    let resp = client()
        .post(ws.url("/api/assistant/sandbox/abc/results"))
        .bearer_auth("asbx_otp_wrong")
        .json(&json!({"files": []}))
        .send()
        .await
        .unwrap();
    let p = problem(resp, 401).await;
    assert_eq!(p["code"], "otp_rejected");
}
