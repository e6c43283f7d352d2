//! A stand-in for the workspace's sandbox callback routes, for the runner's
//! end-to-end tests: `/ws/{session}/env`, `/config` and `/results` with real
//! one-time tokens (each redeemed once, for its kind and session only), and
//! a record of what the sandbox asked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use asbx_protocol::callback::{ConfigResponse, EnvResponse, ResultsRequest};
use axum::Json;
use axum::extract::{Path as AxPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};

/// What the fake workspace has seen.
#[derive(Debug, Default)]
pub struct Seen {
    pub env_calls: u32,
    pub config_calls: u32,
    pub results: Vec<ResultsRequest>,
    pub rejected: u32,
}

#[derive(Debug)]
struct Token {
    kind: &'static str,
    session: String,
    used: bool,
}

#[derive(Debug)]
struct FakeState {
    tokens: Mutex<HashMap<String, Token>>,
    env: Mutex<EnvResponse>,
    config: Mutex<ConfigResponse>,
    seen: Mutex<Seen>,
    /// Kept working directories' blobs by hex SHA-256, and how many blob
    /// requests are still to be answered `503` first.
    blobs: Mutex<HashMap<String, Vec<u8>>>,
    blob_failures: Mutex<u32>,
    /// Every blob request, answered or not.
    blob_requests: Mutex<u32>,
}

/// A stand-in for the workspace's callback routes, with real one-time tokens.
#[derive(Clone)]
pub struct FakeWorkspace {
    state: Arc<FakeState>,
    pub base: String,
}

/// The three tokens of one dispatch.
#[derive(Debug, Clone)]
pub struct Tokens {
    pub session: String,
    pub setup: String,
    pub run: String,
    pub upload: String,
}

impl FakeWorkspace {
    pub async fn start(config: ConfigResponse) -> FakeWorkspace {
        let state = Arc::new(FakeState {
            tokens: Mutex::new(HashMap::new()),
            env: Mutex::new(EnvResponse::default()),
            config: Mutex::new(config),
            seen: Mutex::new(Seen::default()),
            blobs: Mutex::new(HashMap::new()),
            blob_failures: Mutex::new(0),
            blob_requests: Mutex::new(0),
        });
        let app = axum::Router::new()
            .route("/ws/{session}/env", get(env_route))
            .route("/ws/{session}/config", get(config_route))
            .route("/ws/{session}/results", post(results_route))
            .route("/ws/{session}/workdir/blobs/{sha}", get(blob_route))
            .with_state(Arc::clone(&state));
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => panic!("binding the fake workspace: {e}"),
        };
        let base = match listener.local_addr() {
            Ok(a) => format!("http://{a}"),
            Err(e) => panic!("the fake workspace's address: {e}"),
        };
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeWorkspace { state, base }
    }

    pub fn set_env(&self, env: EnvResponse) {
        *self
            .state
            .env
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = env;
    }

    pub fn mint(&self, session: &str) -> Tokens {
        let mut t = self
            .state
            .tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mk = |kind: &'static str| format!("tok_{kind}_{}", hex::encode(rand_bytes()));
        let tokens = Tokens {
            session: session.to_owned(),
            setup: mk("setup"),
            run: mk("run"),
            upload: mk("upload"),
        };
        for (tok, kind) in [
            (&tokens.setup, "setup"),
            (&tokens.run, "run"),
            (&tokens.upload, "upload"),
        ] {
            t.insert(
                tok.clone(),
                Token {
                    kind,
                    session: session.to_owned(),
                    used: false,
                },
            );
        }
        tokens
    }

    /// Stores `bytes` as a kept working directory's blob: its hex SHA-256.
    pub fn put_blob(&self, bytes: &[u8]) -> String {
        use sha2::Digest as _;
        let sha = hex::encode(sha2::Sha256::digest(bytes));
        lock(&self.state.blobs).insert(sha.clone(), bytes.to_vec());
        sha
    }

    /// The next `n` blob requests are answered `503` (a node going away).
    pub fn fail_blobs(&self, n: u32) {
        *lock(&self.state.blob_failures) = n;
    }

    /// How many blob requests came.
    pub fn blob_requests(&self) -> u32 {
        *lock(&self.state.blob_requests)
    }

    pub fn seen<R>(&self, f: impl FnOnce(&Seen) -> R) -> R {
        f(&self
            .state
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// A `/stream` body for these tokens.
    pub fn body(&self, t: &Tokens, prompt: &str) -> serde_json::Value {
        serde_json::json!({
            "agent_url": format!("{}/ws/{}", self.base, t.session),
            "otp_setup": t.setup,
            "otp_run": t.run,
            "otp_upload": t.upload,
            "prompt": prompt,
            "session_id": t.session,
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `GET {agent_url}/workdir/blobs/{sha}` (any bearer: the runner's own
/// token is checked by the real workspace's tests).
async fn blob_route(
    State(s): State<Arc<FakeState>>,
    AxPath((_session, sha)): AxPath<(String, String)>,
) -> Result<Vec<u8>, StatusCode> {
    *lock(&s.blob_requests) += 1;
    {
        let mut failures = lock(&s.blob_failures);
        if *failures > 0 {
            *failures -= 1;
            return Err(StatusCode::SERVICE_UNAVAILABLE);
        }
    }
    lock(&s.blobs)
        .get(&sha)
        .cloned()
        .ok_or(StatusCode::NOT_FOUND)
}

fn rand_bytes() -> [u8; 12] {
    rand::random()
}

fn redeem(state: &FakeState, headers: &HeaderMap, session: &str, kind: &str) -> bool {
    let Some(tok) = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let mut tokens = state
        .tokens
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match tokens.get_mut(tok) {
        Some(t) if !t.used && t.kind == kind && t.session == session => {
            t.used = true;
            true
        }
        _ => {
            state
                .seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .rejected += 1;
            false
        }
    }
}

async fn env_route(
    State(s): State<Arc<FakeState>>,
    AxPath(session): AxPath<String>,
    headers: HeaderMap,
) -> Result<Json<EnvResponse>, StatusCode> {
    if !redeem(&s, &headers, &session, "setup") {
        return Err(StatusCode::UNAUTHORIZED);
    }
    s.seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .env_calls += 1;
    Ok(Json(
        s.env
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone(),
    ))
}

async fn config_route(
    State(s): State<Arc<FakeState>>,
    AxPath(session): AxPath<String>,
    headers: HeaderMap,
) -> Result<Json<ConfigResponse>, StatusCode> {
    if !redeem(&s, &headers, &session, "run") {
        return Err(StatusCode::UNAUTHORIZED);
    }
    s.seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .config_calls += 1;
    Ok(Json(
        s.config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone(),
    ))
}

async fn results_route(
    State(s): State<Arc<FakeState>>,
    AxPath(session): AxPath<String>,
    headers: HeaderMap,
    Json(body): Json<ResultsRequest>,
) -> Result<Json<serde_json::Value>, StatusCode> {
    if !redeem(&s, &headers, &session, "upload") {
        return Err(StatusCode::UNAUTHORIZED);
    }
    let files: Vec<serde_json::Value> = body
        .files
        .iter()
        .enumerate()
        .map(|(i, f)| serde_json::json!({"path": f.path, "id": format!("file_{i}")}))
        .collect();
    s.seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .results
        .push(body);
    Ok(Json(serde_json::json!({ "files": files })))
}
