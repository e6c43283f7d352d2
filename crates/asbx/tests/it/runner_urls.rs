//! Issue 26, items 1 and 3, and issue 28, defect 1 (CONTRACT §6): the
//! workspace requests only the runners the operator configured (no URL an
//! agent, an environment or a request names reaches anything else, no
//! redirect from a runner is followed, no more than 64 KiB of a runner's
//! answer is read back); runs, agents and chats name only `ASBX_MODELS`;
//! `asbx workspace` without `SANDBOX_URL` refuses to start.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use asbx_test_support::fake_runner::{FakeRunner, Mode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::harness::*;

/// What a [`MockHttp`] answers a request with: `(method, path, how many
/// requests to this path came before)` to the raw response.
type Respond = dyn Fn(&str, &str, usize) -> Vec<u8> + Send + Sync;

/// A plain HTTP server on loopback that records every request line it
/// gets and answers each as `respond` says.
struct MockHttp {
    url: String,
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl MockHttp {
    async fn start(respond: impl Fn(&str, &str, usize) -> Vec<u8> + Send + Sync + 'static) -> Self {
        let listener = loop {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            if l.local_addr().unwrap().port() != 2024 {
                break l;
            }
        };
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let respond: Arc<Respond> = Arc::new(respond);
        let recorded = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (seen, respond) = (Arc::clone(&recorded), Arc::clone(&respond));
                tokio::spawn(answer(conn, seen, respond));
            }
        });
        MockHttp { url, seen, task }
    }

    fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for MockHttp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(mut conn: TcpStream, seen: Arc<Mutex<Vec<String>>>, respond: Arc<Respond>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let line = head.lines().next().unwrap_or("").to_owned();
    let mut parts = line.split_whitespace();
    let (method, path) = (
        parts.next().unwrap_or("").to_owned(),
        parts.next().unwrap_or("").to_owned(),
    );
    let before = {
        let mut seen = seen.lock().unwrap();
        let n = seen
            .iter()
            .filter(|l| l.split_whitespace().nth(1) == Some(path.as_str()))
            .count();
        seen.push(line);
        n
    };
    let _ = conn.write_all(&respond(&method, &path, before)).await;
    let _ = conn.shutdown().await;
}

/// A raw HTTP/1.1 response, the connection closed after it.
fn response(status: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status}\r\nconnection: close\r\n");
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

fn ok_json() -> Vec<u8> {
    response("200 OK", &[("content-type", "application/json")], b"{}")
}

async fn send(method: reqwest::Method, url: String, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .request(method, url)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn post(ws: &WorkspaceProc, path: &str, body: Value) -> (u16, Value) {
    send(reqwest::Method::POST, format!("{}{path}", ws.url), &body).await
}

async fn put(ws: &WorkspaceProc, path: &str, body: Value) -> (u16, Value) {
    send(reqwest::Method::PUT, format!("{}{path}", ws.url), &body).await
}

/// Asserts a `400` with problem `code`.
fn refused(answer: &(u16, Value), code: &str, what: &str) {
    assert_eq!(answer.0, 400, "{what}: {}", answer.1);
    assert_eq!(answer.1["code"], code, "{what}: {}", answer.1);
}

/// The URLs a caller might try to reach `victim` (or a configured runner
/// `runner`, by another route) through.
fn hostile_urls(victim: &str, runner: &str) -> Vec<String> {
    let runner = runner.trim_end_matches('/');
    let runner_host = runner.trim_start_matches("http://");
    vec![
        format!("{victim}/admin/x?q="),
        format!("{victim}/"),
        victim.to_owned(),
        format!("{runner}/admin/x?q="),
        format!("{runner}/admin"),
        format!("{runner}/#f"),
        format!("http://user:pw@{runner_host}/"),
    ]
}

#[tokio::test]
async fn no_url_an_agent_environment_or_request_names_is_requested() {
    let victim = MockHttp::start(|_, _, _| ok_json()).await;
    let runner = FakeRunner::start(Mode::Full { files: Vec::new() }).await;
    let ws = WorkspaceProc::start("127.0.0.1:0", &[("SANDBOX_URL", runner.url.as_str())]);

    // An agent whose runner is the configured one, to try the other routes on.
    let (status, agent) = post(&ws, "/api/agents", json!({"name": "plain"})).await;
    assert_eq!(status, 201, "{agent}");
    let agent_id = agent["id"].as_str().unwrap().to_owned();

    for url in hostile_urls(&victim.url, runner.url.as_str()) {
        let with_env = json!({"name": "a", "environment": {"variables": {"SANDBOX_URL": url}}});
        refused(
            &post(&ws, "/api/agents", with_env.clone()).await,
            "sandbox_url_not_allowed",
            &format!("agent {url}"),
        );
        refused(
            &put(&ws, &format!("/api/agents/{agent_id}"), with_env).await,
            "sandbox_url_not_allowed",
            &format!("agent update {url}"),
        );
        refused(
            &post(
                &ws,
                "/api/environments",
                json!({"name": "e", "variables": {"SANDBOX_URL": url}}),
            )
            .await,
            "sandbox_url_not_allowed",
            &format!("environment {url}"),
        );
        refused(
            &post(
                &ws,
                "/api/runs",
                json!({"prompt": "x", "variables": {"SANDBOX_URL": url}}),
            )
            .await,
            "sandbox_url_not_allowed",
            &format!("run variables {url}"),
        );
        // A run's or an agent block's `sandboxUrl` must be a configured
        // runner (CONTRACT §6).
        for path in [
            "/api/runs".to_owned(),
            format!("/api/agents/{agent_id}/runs"),
        ] {
            refused(
                &post(&ws, &path, json!({"prompt": "x", "sandboxUrl": url})).await,
                "sandbox_url_not_allowed",
                &format!("{path} sandboxUrl {url}"),
            );
        }
        // Stored agents and chat turns take no `sandboxUrl` field at all.
        for (path, body) in [
            (
                "/api/agents".to_owned(),
                json!({"name": "a", "sandboxUrl": url}),
            ),
            (
                "/api/assistant/chat/stream".to_owned(),
                json!({"message": "x", "sandboxUrl": url}),
            ),
        ] {
            let answer = post(&ws, &path, body).await;
            assert_eq!(answer.0, 400, "{path} {url}: {}", answer.1);
        }
    }
    assert_eq!(victim.requests(), Vec::<String>::new());
    assert!(runner.dispatches().is_empty(), "nothing ran");
}

#[tokio::test]
async fn an_agent_whose_runner_is_no_longer_allowed_is_refused_at_run_time() {
    let victim = MockHttp::start(|_, _, _| response("503 Service Unavailable", &[], b"")).await;
    let runner = FakeRunner::start(Mode::Full { files: Vec::new() }).await;
    let db = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}/asbx.db", db.path().display());
    let base = [
        ("SANDBOX_URL", runner.url.as_str()),
        ("DATABASE_URL", database.as_str()),
    ];

    // Allowed at first: the agent is stored and its runs go there.
    let allowing = [
        base.as_slice(),
        &[("ASBX_ALLOWED_SANDBOX_URLS", &victim.url)],
    ]
    .concat();
    let ws = WorkspaceProc::start("127.0.0.1:0", &allowing);
    let (status, agent) = post(
        &ws,
        "/api/agents",
        json!({"name": "own", "environment": {"variables": {"SANDBOX_URL": format!("{}/", victim.url)}}}),
    )
    .await;
    assert_eq!(status, 201, "{agent}");
    let agent_id = agent["id"].as_str().unwrap().to_owned();
    let run = post(
        &ws,
        &format!("/api/agents/{agent_id}/runs"),
        json!({"prompt": "x"}),
    )
    .await;
    assert_eq!(run.0, 503, "{}", run.1);
    // The runner's runtime cap is asked once (`runs::caps`, cached), then
    // the dispatch.
    assert_eq!(
        victim.requests(),
        ["GET /healthz HTTP/1.1", "POST /stream HTTP/1.1"]
    );
    drop(ws);

    // The operator takes the allowance back: the stored agent's runner
    // gets nothing more.
    let ws = WorkspaceProc::start("127.0.0.1:0", &base);
    refused(
        &post(
            &ws,
            &format!("/api/agents/{agent_id}/runs"),
            json!({"prompt": "x"}),
        )
        .await,
        "sandbox_url_not_allowed",
        "stored agent",
    );
    assert_eq!(victim.requests().len(), 2, "{:?}", victim.requests());
    assert!(runner.dispatches().is_empty());
}

#[tokio::test]
async fn a_runner_redirect_is_not_followed_and_its_answers_are_cut_at_64_kib() {
    let target = MockHttp::start(|_, _, _| ok_json()).await;
    let stolen = format!("{}/internal/secret", target.url);
    let big = vec![b'x'; 200 * 1024];
    let runner = MockHttp::start(move |_, path, before| {
        let redirect = response("302 Found", &[("location", &stolen)], b"");
        match (path.ends_with("/tool-result"), before) {
            (false, 0) => redirect,
            (false, 1) => response("200 OK", &[("content-type", "application/x-ndjson")], b""),
            (false, _) => response("400 Bad Request", &[("content-type", "text/plain")], &big),
            (true, 0) => redirect,
            (true, _) => response("200 OK", &[("content-type", "text/plain")], &big),
        }
    })
    .await;
    let ws = WorkspaceProc::start("127.0.0.1:0", &[("SANDBOX_URL", &runner.url)]);
    let client = reqwest::Client::new();
    let run = |body: Value| {
        client
            .post(format!("{}/api/runs", ws.url))
            .json(&body)
            .send()
    };

    // A dispatch answered with a redirect fails; nothing follows it.
    let r = run(json!({"prompt": "x"})).await.unwrap();
    assert_eq!(r.status().as_u16(), 502, "{:?}", r.text().await);

    // A run the runner took, then its tool result answered with a redirect.
    let r = run(json!({"prompt": "x", "protocol": 2})).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let run_id = r.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let _ = r.bytes().await;
    let tool_result = || {
        client
            .post(format!("{}/api/runs/{run_id}/tool-result", ws.url))
            .json(&json!({"callId": "c1", "result": "done"}))
            .send()
    };
    let r = tool_result().await.unwrap();
    assert_eq!(r.status().as_u16(), 502, "{:?}", r.text().await);

    // Oversize answers: a tool result's and a refused dispatch's.
    let r = tool_result().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.bytes().await.unwrap().len(), 64 * 1024);
    let r = run(json!({"prompt": "x"})).await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(r.bytes().await.unwrap().len() <= 64 * 1024);

    assert_eq!(target.requests(), Vec::<String>::new());
    assert_eq!(
        runner.requests(),
        [
            "GET /healthz HTTP/1.1".to_owned(),
            "POST /stream HTTP/1.1".to_owned(),
            "POST /stream HTTP/1.1".to_owned(),
            // The run's stream ended without its end: one try to
            // re-attach, refused for good (`400`), so the run is lost.
            format!("GET /v1/sessions/{run_id}/events?after=0 HTTP/1.1"),
            format!("POST /v1/sessions/{run_id}/tool-result HTTP/1.1"),
            format!("POST /v1/sessions/{run_id}/tool-result HTTP/1.1"),
            "POST /stream HTTP/1.1".to_owned(),
        ]
    );
}

#[tokio::test]
async fn only_the_listed_models_run_wherever_a_model_is_named() {
    let runner = FakeRunner::start(Mode::Full { files: Vec::new() }).await;
    let db = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}/asbx.db", db.path().display());
    let start = |models: &str| {
        WorkspaceProc::start(
            "127.0.0.1:0",
            &[
                ("SANDBOX_URL", runner.url.as_str()),
                ("DATABASE_URL", &database),
                ("ASBX_MODELS", models),
            ],
        )
    };
    let ws = start("openai:cheap-model");
    let expensive = "openai:gpt-expensive-not-allowed";

    let not_allowed = |answer: (u16, Value), what: &str| {
        refused(&answer, "model_not_allowed", what);
        assert_eq!(answer.1["allowed"], json!(["openai:cheap-model"]), "{what}");
        assert!(
            answer.1["detail"]
                .as_str()
                .unwrap()
                .contains("openai:cheap-model"),
            "{what}: {}",
            answer.1
        );
    };
    not_allowed(
        post(&ws, "/api/runs", json!({"prompt": "x", "model": expensive})).await,
        "run",
    );
    not_allowed(
        post(&ws, "/api/agents", json!({"name": "a", "model": expensive})).await,
        "agent",
    );
    let (status, agent) = post(
        &ws,
        "/api/agents",
        json!({"name": "a", "model": "openai:cheap-model"}),
    )
    .await;
    assert_eq!(status, 201, "{agent}");
    let agent_id = agent["id"].as_str().unwrap().to_owned();
    not_allowed(
        put(
            &ws,
            &format!("/api/agents/{agent_id}"),
            json!({"name": "a", "model": expensive}),
        )
        .await,
        "agent update",
    );
    not_allowed(
        post(
            &ws,
            "/api/assistant/chat/stream",
            json!({"message": "x", "settings": {"model": expensive}}),
        )
        .await,
        "chat",
    );
    assert!(runner.dispatches().is_empty(), "nothing ran");

    // The allowed model runs.
    let r = reqwest::Client::new()
        .post(format!("{}/api/runs", ws.url))
        .json(&json!({"prompt": "x", "model": "openai:cheap-model"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let _ = r.bytes().await;
    assert_eq!(runner.dispatches().len(), 1);
    drop(ws);

    // The list changed: the stored agent's model is refused at run time.
    let ws = start("openai:other-model");
    let answer = post(
        &ws,
        &format!("/api/agents/{agent_id}/runs"),
        json!({"prompt": "x"}),
    )
    .await;
    refused(&answer, "model_not_allowed", "stored agent");
    assert_eq!(answer.1["allowed"], json!(["openai:other-model"]));
    assert_eq!(runner.dispatches().len(), 1, "nothing more ran");
}

#[test]
fn the_workspace_refuses_to_start_without_sandbox_url() {
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(ASBX)
        .args(["workspace", "--listen", "127.0.0.1:0"])
        .env_clear()
        .env("ASBX_DATA", data.path())
        .env("ASBX_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("asbx workspace started without SANDBOX_URL");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "{err}");
    assert!(err.contains("SANDBOX_URL"), "names the setting: {err}");
}

#[tokio::test]
async fn a_run_or_agent_block_naming_a_configured_runner_goes_there() {
    let server = FakeRunner::start(Mode::Full { files: Vec::new() }).await;
    let other = FakeRunner::start(Mode::Full { files: Vec::new() }).await;
    let ws = WorkspaceProc::start(
        "127.0.0.1:0",
        &[
            ("SANDBOX_URL", server.url.as_str()),
            ("ASBX_ALLOWED_SANDBOX_URLS", other.url.as_str()),
        ],
    );
    let (status, run) = post(
        &ws,
        "/api/runs",
        json!({"prompt": "x", "sandboxUrl": other.url.as_str()}),
    )
    .await;
    assert_eq!(status, 200, "{run}");
    let (status, agent) = post(&ws, "/api/agents", json!({"name": "plain"})).await;
    assert_eq!(status, 201, "{agent}");
    let agent_id = agent["id"].as_str().unwrap();
    let (status, run) = post(
        &ws,
        &format!("/api/agents/{agent_id}/runs"),
        json!({"prompt": "x", "sandboxUrl": other.url.as_str()}),
    )
    .await;
    assert_eq!(status, 200, "{run}");
    assert_eq!(other.dispatches().len(), 2, "both went to the named runner");
    // Without one, the server's runner.
    let (status, run) = post(&ws, "/api/runs", json!({"prompt": "x"})).await;
    assert_eq!(status, 200, "{run}");
    assert_eq!(server.dispatches().len(), 1);
    assert_eq!(other.dispatches().len(), 2);
}
