//! Test harness: a workspace on 127.0.0.1:0 with a manual clock, and a fake
//! runner that plays the sandbox (calls back /env, /config, /results with the
//! tokens it was given, then streams NDJSON lines).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use asbx_workspace::{ManualClock, Workspace, WorkspaceConfig};
use axum::Router;
use serde_json::Value;
use tokio::net::TcpListener;
use url::Url;

/// The stored form of a secret: lowercase hex SHA-256.
pub(crate) fn sha256_hex(plaintext: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(plaintext.as_bytes()))
}

/// Lowercase hex SHA-256 of bytes.
pub(crate) fn sha256_bytes_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// 128 random bits as hex.
pub(crate) fn random_hex() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// Binds 127.0.0.1 on a free port (never 2024, which tests must not touch).
pub(crate) async fn bind_loopback() -> TcpListener {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        if l.local_addr().unwrap().port() != 2024 {
            return l;
        }
    }
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// Serves `router` on `listener` until the returned handle is dropped.
pub(crate) fn serve(listener: TcpListener, router: Router) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    }))
}

pub(crate) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Which database a test runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Db {
    Sqlite,
    /// The server URL from `ASBX_TEST_PG_URL`; each test gets its own database.
    Postgres(String),
}

impl Db {
    /// PostgreSQL when `ASBX_TEST_PG_URL` is set.
    pub(crate) fn postgres() -> Option<Db> {
        std::env::var("ASBX_TEST_PG_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .map(Db::Postgres)
    }
}

/// Runs an `async fn(Db)` test on SQLite and, when `ASBX_TEST_PG_URL` is set,
/// on PostgreSQL: `on_both!(name);` makes `name::sqlite` and `name::postgres`.
macro_rules! on_both {
    ($name:ident) => {
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                super::$name(crate::support::Db::Sqlite).await
            }

            #[tokio::test]
            async fn postgres() {
                match crate::support::Db::postgres() {
                    Some(db) => super::$name(db).await,
                    None => asbx_test_support::skip(
                        concat!(stringify!($name), "::postgres"),
                        "set ASBX_TEST_PG_URL to run on PostgreSQL",
                    ),
                }
            }
        }
    };
}
pub(crate) use on_both;

/// A PostgreSQL database made for one test, dropped with it.
struct PgDatabase {
    server_url: String,
    name: String,
}

impl PgDatabase {
    async fn create(server_url: &str) -> (PgDatabase, String) {
        sqlx::any::install_default_drivers();
        let name = format!("asbx_test_{}", random_hex());
        let admin = sqlx::AnyPool::connect(server_url).await.unwrap();
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&admin)
            .await
            .unwrap();
        admin.close().await;
        let mut url = Url::parse(server_url).unwrap();
        url.set_path(&format!("/{name}"));
        (
            PgDatabase {
                server_url: server_url.to_owned(),
                name,
            },
            url.to_string(),
        )
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let (server_url, name) = (self.server_url.clone(), self.name.clone());
        // Drop runs inside the test's runtime: use a thread with its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(admin) = sqlx::AnyPool::connect(&server_url).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&admin)
                        .await;
                    admin.close().await;
                }
            });
        })
        .join();
    }
}

/// The secret key of test workspaces on PostgreSQL (base64 of 32 bytes).
pub(crate) const TEST_SECRET_KEY: &str = "dGVzdCBzZWNyZXQga2V5IG9mIDMyIGJ5dGVzIGxvbmc=";

/// A running workspace. The temp dir (and a PostgreSQL test database) is
/// removed on drop.
pub(crate) struct TestWorkspace {
    pub(crate) base: String,
    pub(crate) clock: Arc<ManualClock>,
    pub(crate) database_url: String,
    pub(crate) data_dir: tempfile::TempDir,
    pub(crate) workspace: Workspace,
    _server: AbortOnDrop,
    _pg: Option<PgDatabase>,
}

impl TestWorkspace {
    pub(crate) async fn start(sandbox_url: Option<Url>) -> TestWorkspace {
        Self::start_on(Db::Sqlite, sandbox_url, |_| {}).await
    }

    pub(crate) async fn start_with(
        sandbox_url: Option<Url>,
        tweak: impl FnOnce(&mut WorkspaceConfig),
    ) -> TestWorkspace {
        Self::start_on(Db::Sqlite, sandbox_url, tweak).await
    }

    pub(crate) async fn start_on(
        db: Db,
        sandbox_url: Option<Url>,
        tweak: impl FnOnce(&mut WorkspaceConfig),
    ) -> TestWorkspace {
        // The workspace's warnings and errors, in the output a failed test
        // shows (`RUST_LOG` to see more).
        static LOGS: std::sync::Once = std::sync::Once::new();
        LOGS.call_once(|| {
            let filter = tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_test_writer()
                .try_init();
        });
        let (pg, pg_url) = match &db {
            Db::Sqlite => (None, None),
            Db::Postgres(server) => {
                let (pg, url) = PgDatabase::create(server).await;
                (Some(pg), Some(url))
            }
        };
        let data_dir = tempfile::tempdir().unwrap();
        let listener = bind_loopback().await;
        let addr: SocketAddr = listener.local_addr().unwrap();
        let base = format!("http://{addr}");
        let clock = Arc::new(ManualClock::new());
        let mut config = WorkspaceConfig::new(data_dir.path(), Url::parse(&base).unwrap());
        config.sandbox_url = sandbox_url;
        config.clock = clock.clone();
        config.database_url = pg_url;
        tweak(&mut config);
        // PostgreSQL needs a secret key, the same on every node.
        if config
            .database_url
            .as_deref()
            .is_some_and(|u| u.starts_with("postgres"))
        {
            config
                .secret_key
                .get_or_insert_with(|| TEST_SECRET_KEY.to_owned());
        }
        let database_url = config
            .database_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", data_dir.path().join("asbx.db").display()));
        let workspace = Workspace::open(config).await.unwrap();
        let server = serve(listener, workspace.router());
        TestWorkspace {
            base,
            clock,
            database_url,
            data_dir,
            workspace,
            _server: server,
            _pg: pg,
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A direct connection to the workspace's database.
    pub(crate) async fn db(&self) -> sqlx::AnyPool {
        sqlx::any::install_default_drivers();
        sqlx::AnyPool::connect(&self.database_url).await.unwrap()
    }
}

pub(crate) use asbx_test_support::fake_runner::{FakeRunner, Mode};

/// Parses a problem+json response, asserting status and content type.
pub(crate) async fn problem(resp: reqwest::Response, status: u16) -> Value {
    assert_eq!(resp.status().as_u16(), status);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "application/problem+json"
    );
    resp.json().await.unwrap()
}

/// Polls `GET /api/runs/{id}` until it is no longer running (bounded wait).
pub(crate) async fn settled_run(ws: &TestWorkspace, id: &str) -> Value {
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let v: Value = client()
                .get(ws.url(&format!("/api/runs/{id}")))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if v["status"] != "running" {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("run settled")
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SseEvent {
    pub(crate) id: Option<String>,
    pub(crate) event: String,
    pub(crate) data: Value,
}

/// `GET path` without credentials, its JSON answer (any status).
pub(crate) async fn get_json(ws: &TestWorkspace, path: &str) -> Value {
    client()
        .get(ws.url(path))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Moves the test clock to the next UTC noon, so a test's minutes and
/// seconds never cross a day.
pub(crate) fn to_noon(ws: &TestWorkspace) {
    use asbx_workspace::Clock as _;
    const DAY: i64 = 86_400_000;
    let now = ws.clock.now_ms();
    let noon = now - now.rem_euclid(DAY) + DAY + DAY / 2;
    ws.clock
        .advance(Duration::from_millis(u64::try_from(noon - now).unwrap()));
}

/// Reads server-sent events from a response.
pub(crate) struct SseReader {
    resp: reqwest::Response,
    buf: String,
}

impl SseReader {
    pub(crate) fn new(resp: reqwest::Response) -> Self {
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        SseReader {
            resp,
            buf: String::new(),
        }
    }

    /// The next event (comments skipped), or None at the end (bounded wait).
    pub(crate) async fn next(&mut self) -> Option<SseEvent> {
        tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                if let Some(i) = self.buf.find("\n\n") {
                    let block: String = self.buf.drain(..i + 2).collect();
                    let (mut id, mut event, mut data) = (None, "message".to_owned(), String::new());
                    for l in block.lines() {
                        if let Some(v) = l.strip_prefix("id:") {
                            id = Some(v.trim().to_owned());
                        } else if let Some(v) = l.strip_prefix("event:") {
                            event = v.trim().to_owned();
                        } else if let Some(v) = l.strip_prefix("data:") {
                            data.push_str(v.strip_prefix(' ').unwrap_or(v));
                        }
                    }
                    if data.is_empty() && id.is_none() && event == "message" {
                        continue; // a comment (keep-alive)
                    }
                    let data = serde_json::from_str(&data).unwrap_or(Value::String(data));
                    return Some(SseEvent { id, event, data });
                }
                match self.resp.chunk().await.unwrap() {
                    Some(c) => self.buf.push_str(&String::from_utf8_lossy(&c)),
                    None => return None,
                }
            }
        })
        .await
        .expect("next SSE event in time")
    }

    /// Every event up to and including `done`.
    pub(crate) async fn until_done(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        while let Some(e) = self.next().await {
            let done = e.event == "done";
            out.push(e);
            if done {
                break;
            }
        }
        out
    }
}

/// Starts a chat turn.
pub(crate) async fn post_turn(ws: &TestWorkspace, body: Value) -> reqwest::Response {
    client()
        .post(ws.url("/api/assistant/chat/stream"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// `/env` as a sandbox got it, without its `workspace` access, which is
/// checked first: a fresh `asbx_ws_` bearer (its attachments are returned
/// as the second value).
pub(crate) fn env_without_access(env: &Value) -> (Value, Value) {
    let mut env = env.clone();
    let access = env
        .as_object_mut()
        .and_then(|o| o.remove("workspace"))
        .unwrap_or_else(|| panic!("no workspace access in /env: {env}"));
    let token = access["token"].as_str().unwrap_or_default();
    assert!(
        token.starts_with("asbx_ws_") && token.len() == "asbx_ws_".len() + 43,
        "{access}"
    );
    (env, access["attachments"].clone())
}
