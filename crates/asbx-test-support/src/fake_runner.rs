//! A stand-in for the runner, for the workspace's tests: `POST /stream`
//! plays the sandbox (calls back `/env`, `/config`, `/results` with the
//! tokens it was given, then streams NDJSON lines), records every dispatch
//! and its `Authorization`, and can hold a turn open or refuse it.
//! `GET /healthz` answers [`Shared::health`] (a runner fleet ranks runners
//! by it); `/v1/sessions/{id}` answers `404` to every method, as it
//! knows no session, and records each `DELETE`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use asbx_protocol::DispatchRequest;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use url::Url;

/// Binds 127.0.0.1 on a free port (never 2024, which tests must not touch).
async fn bind_loopback() -> TcpListener {
    loop {
        match TcpListener::bind("127.0.0.1:0").await {
            Ok(l) if l.local_addr().is_ok_and(|a| a.port() != 2024) => return l,
            Ok(_) => continue,
            Err(e) => panic!("binding the fake runner: {e}"),
        }
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("an HTTP client: {e}"))
}

/// Aborts the server task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn serve(listener: TcpListener, router: Router) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    }))
}

/// What the fake runner does on `POST /stream`.
#[derive(Clone)]
pub enum Mode {
    /// Call back /env, /config, /results (with `files`), then stream a step,
    /// a log line and a result.
    Full { files: Vec<Value> },
    /// Stream one `step running` line, then wait for `release` (or the
    /// client to go away), then a result.
    Hold,
    /// Answer with this status and problem body.
    Reject(u16, Value),
}

/// One callback the fake runner made: `(route, status, body)`.
pub type Callback = (String, u16, Value);

pub struct FakeRunner {
    pub url: Url,
    pub shared: Arc<Shared>,
    _server: AbortOnDrop,
}

pub struct Shared {
    pub mode: Mutex<Mode>,
    pub dispatches: Mutex<Vec<DispatchRequest>>,
    /// The `Authorization` header of each dispatch, in order.
    pub authorizations: Mutex<Vec<Option<String>>>,
    pub callbacks: Mutex<Vec<Callback>>,
    /// Every byte the runner wrote to its response bodies.
    pub sent: Mutex<Vec<u8>>,
    pub release: Notify,
    pub dropped: Notify,
    pub dispatched: Notify,
    /// What `GET /healthz` answers (`200`).
    pub health: Mutex<Value>,
    /// The session id of every `DELETE /v1/sessions/{id}`, in order.
    pub deletes: Mutex<Vec<String>>,
    /// The `x-asbx-audit-token` header of each dispatch, in order.
    pub audit_tokens: Mutex<Vec<Option<String>>>,
}

impl FakeRunner {
    pub async fn start(mode: Mode) -> FakeRunner {
        let shared = Arc::new(Shared {
            mode: Mutex::new(mode),
            dispatches: Mutex::new(Vec::new()),
            authorizations: Mutex::new(Vec::new()),
            callbacks: Mutex::new(Vec::new()),
            sent: Mutex::new(Vec::new()),
            release: Notify::new(),
            dropped: Notify::new(),
            dispatched: Notify::new(),
            health: Mutex::new(json!({"status": "ok"})),
            deletes: Mutex::new(Vec::new()),
            audit_tokens: Mutex::new(Vec::new()),
        });
        let listener = bind_loopback().await;
        let url = match listener
            .local_addr()
            .map(|a| Url::parse(&format!("http://{a}")))
        {
            Ok(Ok(url)) => url,
            other => panic!("the fake runner's address: {other:?}"),
        };
        let router = Router::new()
            .route("/stream", post(stream))
            .route("/healthz", get(healthz))
            .route("/v1/sessions/{id}", any(session))
            .with_state(shared.clone());
        FakeRunner {
            url,
            shared,
            _server: serve(listener, router),
        }
    }

    pub fn dispatches(&self) -> Vec<DispatchRequest> {
        self.shared
            .dispatches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.shared
            .authorizations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn callbacks(&self) -> Vec<Callback> {
        self.shared
            .callbacks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Sets what `GET /healthz` answers.
    pub fn set_health(&self, health: Value) {
        *self
            .shared
            .health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = health;
    }

    /// The audit token of each dispatch (`x-asbx-audit-token`), in order.
    pub fn audit_tokens(&self) -> Vec<Option<String>> {
        self.shared
            .audit_tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn deletes(&self) -> Vec<String> {
        self.shared
            .deletes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn sent(&self) -> Vec<u8> {
        self.shared
            .sent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Waits (bounded) until a dispatch has arrived and returns it.
    pub async fn next_dispatch(&self, n: usize) -> DispatchRequest {
        tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let notified = self.shared.dispatched.notified();
                if let Some(d) = self.dispatches().get(n) {
                    return d.clone();
                }
                notified.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("dispatch {n} did not arrive within 20 s"))
    }
}

/// Calls a callback route and records the answer.
async fn call_back(
    shared: &Shared,
    d: &DispatchRequest,
    route: &str,
    token: &str,
    body: Option<Value>,
) {
    let url = format!("{}/{route}", d.agent_url);
    let c = client();
    let req = match &body {
        Some(b) => c.post(&url).json(b),
        None => c.get(&url),
    };
    let (status, value) = match req.bearer_auth(token).send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            (status, resp.json().await.unwrap_or(Value::Null))
        }
        // Recorded as status 0: the workspace could not be reached.
        Err(e) => (0, Value::String(e.to_string())),
    };
    shared
        .callbacks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((route.to_owned(), status, value));
}

/// A stamped NDJSON line.
pub fn line(seq: u64, session: &str, event: Value) -> String {
    let mut v = event;
    v["seq"] = seq.into();
    v["ts"] = (1_700_000_000_000u64 + seq).into();
    v["sessionId"] = session.into();
    format!("{v}\n")
}

async fn healthz(State(shared): State<Arc<Shared>>) -> axum::Json<Value> {
    axum::Json(
        shared
            .health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone(),
    )
}

async fn session(
    State(shared): State<Arc<Shared>>,
    method: axum::http::Method,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> StatusCode {
    if method == axum::http::Method::DELETE {
        shared
            .deletes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(id);
    }
    StatusCode::NOT_FOUND
}

struct DropSignal(Arc<Shared>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        self.0.dropped.notify_one();
    }
}

async fn stream(
    State(shared): State<Arc<Shared>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let authorization = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let d = match DispatchRequest::parse(&body) {
        Ok(d) => d,
        Err(errors) => {
            return (StatusCode::BAD_REQUEST, format!("{errors:?}")).into_response();
        }
    };
    let audit_token = headers
        .get(asbx_protocol::audit::AUDIT_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    shared
        .audit_tokens
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(audit_token);
    record(&shared, authorization, &d);
    let mode = shared
        .mode
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let session = d.session_id.clone().unwrap_or_default();
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    match mode {
        Mode::Reject(status, problem) => {
            return Response::builder()
                .status(status)
                .header("content-type", "application/problem+json")
                .body(Body::from(problem.to_string()))
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
        }
        Mode::Full { files } => full(&shared, &d, files, session, tx).await,
        Mode::Hold => hold(&shared, session, tx),
    }
    ndjson(&shared, rx)
}

/// Keeps the dispatch and its `authorization` for the test to read.
fn record(shared: &Arc<Shared>, authorization: Option<String>, d: &DispatchRequest) {
    shared
        .authorizations
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(authorization);
    shared
        .dispatches
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(d.clone());
    shared.dispatched.notify_waiters();
}

/// [`Mode::Full`]: the callbacks, then a whole turn, each line in two chunks.
async fn full(
    shared: &Arc<Shared>,
    d: &DispatchRequest,
    files: Vec<Value>,
    session: String,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    call_back(shared, d, "env", &d.otp_setup, None).await;
    call_back(shared, d, "config", &d.otp_run, None).await;
    if !files.is_empty() {
        let upload = d.otp_upload.clone().unwrap_or_default();
        call_back(shared, d, "results", &upload, Some(json!({"files": files}))).await;
    }
    let lines = [
        line(
            1,
            &session,
            json!({"type":"step","id":"s1","name":"shell","status":"running","args":{"command":"ls"}}),
        ),
        line(
            2,
            &session,
            json!({"type":"log","level":"info","message":"hello"}),
        ),
        line(
            3,
            &session,
            json!({"type":"step","id":"s1","name":"shell","status":"succeeded","result":{"exitCode":0},"durationMs":5}),
        ),
        line(
            4,
            &session,
            json!({"type":"result","message":format!("done: {}", d.prompt)}),
        ),
    ];
    let shared2 = shared.clone();
    tokio::spawn(async move {
        for l in lines {
            // Split each line in two chunks to exercise reassembly.
            let (a, b) = l.as_bytes().split_at(l.len() / 2);
            for part in [a, b] {
                shared2
                    .sent
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .extend_from_slice(part);
                if tx.send(Ok(Bytes::copy_from_slice(part))).await.is_err() {
                    return;
                }
            }
        }
    });
}

/// [`Mode::Hold`]: a turn that stops in a running step until released.
fn hold(shared: &Arc<Shared>, session: String, tx: mpsc::Sender<Result<Bytes, std::io::Error>>) {
    let shared2 = shared.clone();
    tokio::spawn(async move {
        let before = [
            line(
                1,
                &session,
                json!({"type":"step","id":"s1","name":"shell","status":"running"}),
            ),
            line(
                2,
                &session,
                json!({"type":"log","level":"info","message":"working"}),
            ),
            line(
                3,
                &session,
                json!({"type":"step","id":"s1","name":"shell","status":"succeeded","durationMs":1}),
            ),
            line(
                4,
                &session,
                json!({"type":"step","id":"s2","name":"shell","status":"running"}),
            ),
        ];
        for l in before {
            shared2
                .sent
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend_from_slice(l.as_bytes());
            if tx.send(Ok(Bytes::from(l))).await.is_err() {
                return;
            }
        }
        tokio::select! {
            _ = shared2.release.notified() => {}
            _ = tx.closed() => return,
        }
        let after = [
            line(
                5,
                &session,
                json!({"type":"step","id":"s2","name":"shell","status":"succeeded","durationMs":1}),
            ),
            line(6, &session, json!({"type":"result","message":"released"})),
        ];
        for l in after {
            shared2
                .sent
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend_from_slice(l.as_bytes());
            let _ = tx.send(Ok(Bytes::from(l))).await;
        }
    });
}

/// The stream's response; its end (the client gone) is signalled.
fn ndjson(shared: &Arc<Shared>, rx: mpsc::Receiver<Result<Bytes, std::io::Error>>) -> Response {
    let signal = DropSignal(shared.clone());
    let body = tokio_stream::wrappers::ReceiverStream::new(rx);
    let body = futures::StreamExt::map(body, move |item| {
        let _keep = &signal;
        item
    });
    Response::builder()
        .header("content-type", "application/x-ndjson")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
