//! Workspace configuration and the clock every expiry is measured with.
//!
//! The clock is injectable so tests can expire tokens and leases without
//! sleeping: a [`ManualClock`] is advanced by hand.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use url::Url;

use crate::runner_url;

/// Everything [`crate::Workspace::open`] needs.
///
/// Build it with [`WorkspaceConfig::new`] and set the optional fields; new
/// fields get defaults there, so callers keep compiling.
///
/// - `data_dir`: holds the SQLite database (by default) and `blobs/`.
/// - `database_url`: `sqlite://...` or `postgres://...`; default
///   `sqlite://{data_dir}/asbx.db`, created if missing.
/// - `sandbox_url`: the server-level `SANDBOX_URL` (the runner's base URL;
///   the first of `sandbox_urls` when that lists several).
/// - `sandbox_urls`: every runner `SANDBOX_URL` lists (a runner fleet); a
///   dispatch to `sandbox_url` goes to the one with the most free capacity
///   and moves on to the next when one is full (`503`) or down. Empty: the
///   fleet is `sandbox_url` alone.
/// - `public_url`: the base the sandbox calls back at; a dispatch's
///   `agent_url` is `{public_url}/api/assistant/sandbox/{sessionId}`.
/// - `allowed_sandbox_urls`: runners besides `sandbox_url(s)` that a stored
///   agent's environment (`SANDBOX_URL`) may name
///   (`ASBX_ALLOWED_SANDBOX_URLS`). A runner URL that is none of these is
///   refused (`400 sandbox_url_not_allowed`) and never requested.
/// - `default_model`: `provider:model` used when a request names none.
/// - `models`: the models a chat may choose (`GET /api/models`,
///   `ASBX_MODELS`), `provider:model` each; `default_model` is always
///   among them (first, when not listed).
/// - `restrict_models`: runs and agents, too, may name only those models
///   (`400 model_not_allowed`): the operator listed them (`ASBX_MODELS`).
/// - `clock`: the time source for token and lease expiry.
/// - `detach_grace`: how long a chat turn outlives its dropped SSE client
///   before it is cancelled (zero: cancel on close).
/// - `runner_detach_grace`: how long a sandbox waits for its relay to come
///   back after the connection from the workspace broke (the detach grace
///   of every dispatch, `ASBX_RUNNER_DETACH_GRACE_MS`, default 60 s): the
///   relaying node re-attaches within it (`runs::reattach`), or another
///   node takes the run over.
/// - `lease_ttl`: how long a chat's single-flight lease lasts without
///   renewal (renewed every third of it while the turn runs), so a chat
///   whose node died is free again within seconds.
/// - `replay_safety_poll`: on PostgreSQL, how often a node following a run
///   another node relays reads the table without having been notified
///   (`crate::notify`); notifications can be lost while a connection is
///   down. (On SQLite a follower without a local broadcast polls every
///   500 ms.)
/// - `require_auth`: refuse requests without an API key or session cookie
///   (otherwise they act in the default workspace). Required when `listen`
///   is not a loopback address ([`crate::WorkspaceError::AuthRequired`]).
/// - `listen`: the address the server listens on, when known. On loopback
///   the server also answers to `localhost`, `127.0.0.1` and `[::1]` with
///   its port (docs/protocol.md §8); elsewhere only to `public_url`'s host.
///   Unknown (`None`): loopback names are answered when `public_url` is on
///   loopback.
/// - `runner_token`: `ASBX_RUNNER_TOKEN`, sent as `Authorization: Bearer`
///   on every request to a runner the operator configured (`sandbox_url`);
///   never to a runner a stored agent names itself.
/// - `metrics_token`: `ASBX_METRICS_TOKEN`, the bearer `GET /metrics`
///   takes; unset, `/metrics` answers only while `require_auth` is off.
/// - `secret_key`, `secret_key_old`: the key sealing secrets at rest
///   (`ASBX_SECRET_KEY`, base64 of 32 bytes) and the one before it, read
///   while values are resealed (`ASBX_SECRET_KEY_OLD`); without a key, a
///   key file under `data_dir` on SQLite, a refusal to start on PostgreSQL
///   (docs/secrets.md).
/// - `blob_store`: where the file bag's bytes live (`ASBX_BLOB_STORE`);
///   `None`: [`BlobBackend::Dir`] on SQLite, [`BlobBackend::Db`] on
///   PostgreSQL, so nodes sharing a database share the files too.
/// - `queue_wait`: the longest a dispatch waits for its fair share of the
///   fleet (`quota::fair`) before `429 quota_exceeded`.
/// - `quotas`: each quota's default for every workspace (`ASBX_QUOTA_*`,
///   `None` unlimited); a workspace's override (`asbx quota set`) wins.
/// - `workdir_keep_turns`: how many of a chat's latest kept working
///   directories stay restorable (`ASBX_WORKDIR_KEEP_TURNS`, default 20);
///   older turns keep their manifest, their bytes are freed.
/// - `audit_retention`: how long audit records are kept
///   (`ASBX_AUDIT_RETENTION_DAYS`); `None`: forever. Pruning leaves an
///   anchor, so the chain still verifies.
#[derive(Clone)]
pub struct WorkspaceConfig {
    pub data_dir: PathBuf,
    pub database_url: Option<String>,
    pub sandbox_url: Option<Url>,
    pub sandbox_urls: Vec<Url>,
    pub allowed_sandbox_urls: Vec<Url>,
    pub public_url: Url,
    pub default_model: String,
    pub models: Vec<String>,
    pub restrict_models: bool,
    pub clock: Arc<dyn Clock>,
    pub detach_grace: Duration,
    pub runner_detach_grace: Duration,
    pub lease_ttl: Duration,
    pub replay_safety_poll: Duration,
    pub require_auth: bool,
    pub listen: Option<SocketAddr>,
    pub runner_token: Option<String>,
    pub metrics_token: Option<String>,
    pub blob_store: Option<BlobBackend>,
    pub secret_key: Option<String>,
    pub secret_key_old: Option<String>,
    pub quotas: QuotaDefaults,
    pub queue_wait: Duration,
    pub audit_retention: Option<Duration>,
    pub workdir_keep_turns: u32,
}

/// How many of a chat's latest kept working directories stay restorable by
/// default (`ASBX_WORKDIR_KEEP_TURNS`); older turns keep their manifest.
pub(crate) const DEFAULT_WORKDIR_KEEP_TURNS: u32 = 20;

impl WorkspaceConfig {
    /// A configuration with defaults for every optional field.
    pub fn new(data_dir: impl Into<PathBuf>, public_url: Url) -> Self {
        WorkspaceConfig {
            data_dir: data_dir.into(),
            database_url: None,
            sandbox_url: None,
            sandbox_urls: Vec::new(),
            allowed_sandbox_urls: Vec::new(),
            public_url,
            default_model: "scripted:demo".to_owned(),
            models: Vec::new(),
            restrict_models: false,
            clock: Arc::new(SystemClock),
            detach_grace: Duration::from_secs(30),
            runner_detach_grace: Duration::from_secs(60),
            lease_ttl: Duration::from_secs(15),
            replay_safety_poll: Duration::from_secs(5),
            require_auth: false,
            listen: None,
            runner_token: None,
            metrics_token: None,
            blob_store: None,
            secret_key: None,
            secret_key_old: None,
            quotas: Default::default(),
            queue_wait: Duration::from_secs(30),
            audit_retention: None,
            workdir_keep_turns: DEFAULT_WORKDIR_KEEP_TURNS,
        }
    }
}

impl WorkspaceConfig {
    /// The operator's runners: `sandbox_urls`, or `sandbox_url` alone.
    pub(crate) fn fleet_urls(&self) -> Vec<Url> {
        if self.sandbox_urls.is_empty() {
            self.sandbox_url.iter().cloned().collect()
        } else {
            self.sandbox_urls.clone()
        }
    }

    /// The models a chat may choose: `models` in order, without repeats,
    /// `default_model` first when `models` does not name it.
    pub(crate) fn model_list(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::with_capacity(self.models.len() + 1);
        if !self.models.contains(&self.default_model) {
            out.push(self.default_model.clone());
        }
        for m in &self.models {
            if !out.contains(m) {
                out.push(m.clone());
            }
        }
        out
    }

    /// The models a run or an agent may name: [`Self::model_list`] when
    /// `restrict_models`, else any.
    pub(crate) fn allowed_models(&self) -> Option<Vec<String>> {
        self.restrict_models.then(|| self.model_list())
    }

    /// Whether `url` is a runner the operator configured (it gets the runner
    /// token), not one a stored agent names itself; compared as
    /// [`runner_url::key`]s.
    pub(crate) fn is_operator_runner(&self, url: &Url) -> bool {
        runner_url::is_one_of(url, self.sandbox_url.iter().chain(&self.sandbox_urls))
    }

    /// Whether the workspace may send a request to `url`: an operator's
    /// runner or one of `allowed_sandbox_urls`.
    pub(crate) fn is_allowed_runner(&self, url: &Url) -> bool {
        self.is_operator_runner(url) || runner_url::is_one_of(url, &self.allowed_sandbox_urls)
    }
}

impl fmt::Debug for WorkspaceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The database URL may carry a password; show only its scheme.
        let db = self
            .database_url
            .as_deref()
            .map(|u| u.split(':').next().unwrap_or(""));
        f.debug_struct("WorkspaceConfig")
            .field("data_dir", &self.data_dir)
            .field("database", &db)
            .field("sandbox_url", &self.sandbox_url.as_ref().map(Url::as_str))
            .field(
                "sandbox_urls",
                &self
                    .sandbox_urls
                    .iter()
                    .map(Url::as_str)
                    .collect::<Vec<_>>(),
            )
            .field(
                "allowed_sandbox_urls",
                &self
                    .allowed_sandbox_urls
                    .iter()
                    .map(Url::as_str)
                    .collect::<Vec<_>>(),
            )
            .field("public_url", &self.public_url.as_str())
            .field("default_model", &self.default_model)
            .field("models", &self.models)
            .field("restrict_models", &self.restrict_models)
            .field("detach_grace", &self.detach_grace)
            .field("runner_detach_grace", &self.runner_detach_grace)
            .field("workdir_keep_turns", &self.workdir_keep_turns)
            .field("lease_ttl", &self.lease_ttl)
            .field("replay_safety_poll", &self.replay_safety_poll)
            .field("require_auth", &self.require_auth)
            .field("listen", &self.listen)
            // Never the token itself.
            .field("runner_token", &self.runner_token.as_ref().map(|_| "<set>"))
            .field(
                "metrics_token",
                &self.metrics_token.as_ref().map(|_| "<set>"),
            )
            .field("blob_store", &self.blob_store)
            .field("secret_key", &self.secret_key.as_ref().map(|_| "<set>"))
            .field(
                "secret_key_old",
                &self.secret_key_old.as_ref().map(|_| "<set>"),
            )
            .field("quotas", &self.quotas)
            .finish_non_exhaustive()
    }
}

/// Where the file bag's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobBackend {
    /// A folder on this node's disk (`{data_dir}/blobs`): one node, or a
    /// folder every node mounts.
    Dir,
    /// The database, in 1 MiB chunks: every node sharing the database
    /// serves every file.
    Db,
}

impl FromStr for BlobBackend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "dir" => Ok(BlobBackend::Dir),
            "db" => Ok(BlobBackend::Db),
            other => Err(format!("blob store {other:?}: expected `dir` or `db`")),
        }
    }
}

impl fmt::Display for BlobBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BlobBackend::Dir => "dir",
            BlobBackend::Db => "db",
        })
    }
}

/// A source of the current time in Unix epoch milliseconds.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        i64::try_from(asbx_protocol::now_ms()).unwrap_or(i64::MAX)
    }
}

/// A clock that starts at the system time and moves only when told to.
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicI64,
}

impl ManualClock {
    pub fn new() -> Self {
        ManualClock {
            now: AtomicI64::new(SystemClock.now_ms()),
        }
    }

    pub fn advance(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// One quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Quota {
    ConcurrentSandboxes,
    RequestsPerMinute,
    SandboxSecondsPerDay,
    TokensPerDay,
    StorageMb,
}

impl Quota {
    /// Every quota, in the order they are listed.
    pub const ALL: [Quota; 5] = [
        Quota::ConcurrentSandboxes,
        Quota::RequestsPerMinute,
        Quota::SandboxSecondsPerDay,
        Quota::TokensPerDay,
        Quota::StorageMb,
    ];

    /// Its name on the wire and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Quota::ConcurrentSandboxes => "concurrent-sandboxes",
            Quota::RequestsPerMinute => "requests-per-minute",
            Quota::SandboxSecondsPerDay => "sandbox-seconds-per-day",
            Quota::TokensPerDay => "tokens-per-day",
            Quota::StorageMb => "storage-mb",
        }
    }

    const fn index(self) -> usize {
        match self {
            Quota::ConcurrentSandboxes => 0,
            Quota::RequestsPerMinute => 1,
            Quota::SandboxSecondsPerDay => 2,
            Quota::TokensPerDay => 3,
            Quota::StorageMb => 4,
        }
    }
}

impl FromStr for Quota {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quota::ALL
            .into_iter()
            .find(|q| q.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Quota::ALL.iter().map(|q| q.name()).collect();
                format!("unknown quota {s:?}; quotas: {}", names.join(", "))
            })
    }
}

impl std::fmt::Display for Quota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A value for each quota; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaDefaults {
    values: [Option<u64>; 5],
}

impl QuotaDefaults {
    /// The value of `quota` (`None`: unlimited).
    pub fn get(&self, quota: Quota) -> Option<u64> {
        self.values[quota.index()]
    }

    /// Sets `quota` (`None`: unlimited).
    pub fn set(&mut self, quota: Quota, value: Option<u64>) {
        self.values[quota.index()] = value;
    }
}
