//! The asbx control plane: one-time tokens, the sandbox callback routes,
//! dispatch to the runner, the file store, chats, and stored agents.
//!
//! Entry points: [`Workspace::open`] connects the store (SQLite by default,
//! PostgreSQL by URL) and runs the migrations; [`Workspace::router`] is the
//! HTTP surface the `asbx` binary serves.
//!
//! Architecture invariant: plaintext tokens are never stored; a token is
//! redeemed at most once, atomically (see `tokens::store::redeem`).

// Shared, below every feature: errors, configuration, the store's pool,
// tokens, validation, the wire bodies, the HTTP plumbing, the sealing of
// secrets at rest.
mod apidoc;
mod auth;
mod chat_events;
mod config;
mod error;
mod guard;
mod http;
mod metrics;
mod notify;
mod openapi;
mod otel;
mod pages;
mod quota;
mod runner_url;
mod secrets;
mod store;
mod tokens;
mod usage;
mod validate;
mod wire;

// Features, each with its store, logic and handlers. Dependencies point one
// way: agents, chats and callbacks use runs and files; runs uses files;
// agents, chats, runs and callbacks use environments; sandbox_api uses chats and
// files; files and environments use none of them.
mod agents;
mod audit;
mod callbacks;
mod chats;
mod environments;
mod files;
mod runs;
mod sandbox_api;
mod workdir;

use std::sync::Arc;

pub use audit::{AuditEvent, AuditVerdict};
pub use config::{
    BlobBackend, Clock, ManualClock, Quota, QuotaDefaults, SystemClock, WorkspaceConfig,
};
pub use error::WorkspaceError;
pub use otel::enable as enable_traces;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter};
use utoipa_axum::routes;

use crate::callbacks::writeback::MAX_RESULTS_BODY;
use crate::chats::live::TurnHub;
use crate::files::blobs::BlobStore;
use crate::guard::Authority;
use crate::http::MAX_JSON_BODY;
use crate::runs::dispatch::Dispatcher;
use crate::store::Store;

/// The workspace every request without other credentials belongs to.
pub(crate) const DEFAULT_WORKSPACE: &str = "default";

/// An opened workspace: its store, blob folder and configuration.
#[derive(Debug, Clone)]
pub struct Workspace {
    state: Arc<AppState>,
}

impl Workspace {
    /// Creates the data folder, connects the database, runs the migrations.
    ///
    /// Refuses ([`WorkspaceError::AuthRequired`]) to serve a non-loopback
    /// `listen` address without `require_auth` (docs/protocol.md §8).
    pub async fn open(config: WorkspaceConfig) -> Result<Workspace, WorkspaceError> {
        if let Some(listen) = config.listen
            && !listen.ip().is_loopback()
            && !config.require_auth
        {
            return Err(WorkspaceError::AuthRequired { listen });
        }
        if !matches!(config.public_url.scheme(), "http" | "https") {
            return Err(WorkspaceError::Config(
                "public_url must be an http(s) URL".to_owned(),
            ));
        }
        for url in config
            .sandbox_url
            .iter()
            .chain(&config.sandbox_urls)
            .chain(&config.allowed_sandbox_urls)
        {
            runner_url::check(url)
                .map_err(|e| WorkspaceError::Config(format!("runner URL {url}: {e}")))?;
        }
        for m in &config.models {
            asbx_protocol::rules::names::check_model(m)
                .map_err(|e| WorkspaceError::Config(format!("model {m:?}: {e}")))?;
        }
        private_dir(&config.data_dir).await?;
        // Before connecting: PostgreSQL without a key is refused at once.
        let sealer = secrets::Sealer::load(
            config.secret_key.as_deref(),
            config.secret_key_old.as_deref(),
            &config.data_dir,
            config
                .database_url
                .as_deref()
                .is_some_and(store::is_postgres_url),
        )?;
        let store = Store::open(config.database_url.as_deref(), &config.data_dir).await?;
        let blobs = BlobStore::open(&config, &store).await?;
        let notifier = match store.listen_url() {
            Some(url) => notify::Notifier::listen(url).await?,
            None => notify::Notifier::off(),
        };
        let state = AppState {
            dispatcher: Dispatcher::new(config.runner_token.as_deref())?,
            authority: Authority::from_config(&config),
            config,
            store,
            blobs,
            turns: Default::default(),
            run_hub: Default::default(),
            notifier,
            node_id: tokens::random_id(),
            chat_events: Default::default(),
            me: std::sync::OnceLock::new(),
            sealer,
        };
        reseal_stored_secrets(&state).await?;
        state.blobs.start_sweeper();
        let state = Arc::new(state);
        let _ = state.me.set(Arc::downgrade(&state));
        chats::lease::takeover::start_sweeper(&state);
        runs::takeover::start_sweeper(&state);
        audit::start_pruner(&state);
        Ok(Workspace { state })
    }

    /// The HTTP routes.
    pub fn router(&self) -> axum::Router {
        let router = router(Arc::clone(&self.state));
        // Traces on: each request is a span (`otel`).
        if otel::enabled() {
            return router.layer(middleware::from_fn(otel::incoming));
        }
        router
    }

    /// Frees the file bytes no file refers to any more (`asbx gc`; a node
    /// also does it at start and hourly); how many blobs were freed.
    pub async fn collect_garbage(&self) -> Result<u64, WorkspaceError> {
        self.state.blobs.sweep().await
    }

    /// Checks every workspace's audit chain (or `workspace`'s): one
    /// verdict each, naming the first broken record (`asbx audit verify`).
    pub async fn verify_audit(
        &self,
        workspace: Option<&str>,
    ) -> Result<Vec<AuditVerdict>, WorkspaceError> {
        audit::verify_all(self.state.store.pool(), workspace).await
    }

    /// Appends `events` to `workspace`'s audit chain in one transaction,
    /// stamped now (`asbx-bench audit`, tests).
    pub async fn append_audit(
        &self,
        workspace: &str,
        run_id: Option<&str>,
        events: Vec<AuditEvent>,
    ) -> Result<(), WorkspaceError> {
        let scope = audit::Scope {
            run_id,
            session_id: None,
        };
        let pending = scope.pending(workspace, self.state.now_ms(), events);
        audit::store::append(self.state.store.pool(), workspace, &pending).await
    }

    /// Drops audit records older than `retention` behind each chain's
    /// anchor; how many went.
    pub async fn prune_audit(&self, retention: std::time::Duration) -> Result<u64, WorkspaceError> {
        audit::prune(&self.state, retention).await
    }

    pub fn config(&self) -> &WorkspaceConfig {
        &self.state.config
    }

    /// Creates a workspace; returns its id.
    pub async fn create_workspace(&self, name: &str) -> Result<String, WorkspaceError> {
        let id = tokens::random_id();
        auth::store::create_workspace(self.state.store.pool(), &id, name, self.state.now_ms())
            .await?;
        Ok(id)
    }

    /// Sets a quota of a workspace (`asbx quota set`): `Some(value)`
    /// (`Some(None)`: unlimited), or `None` to fall back to the server's
    /// default. [`WorkspaceError::NotFound`] for an unknown workspace.
    pub async fn set_quota(
        &self,
        workspace_id: &str,
        quota: Quota,
        value: Option<Option<u64>>,
    ) -> Result<(), WorkspaceError> {
        let pool = self.state.store.pool();
        if auth::store::workspace_name(pool, workspace_id)
            .await?
            .is_none()
        {
            return Err(WorkspaceError::NotFound(format!(
                "workspace {workspace_id}"
            )));
        }
        quota::store::set(pool, workspace_id, quota, value, self.state.now_ms()).await
    }

    /// A workspace's quotas and usage as `GET /api/usage` answers them
    /// (JSON; requests counted for its anonymous callers), and which
    /// quotas it overrides (`asbx quota show`).
    pub async fn quota_report(
        &self,
        workspace_id: &str,
    ) -> Result<(serde_json::Value, Vec<Quota>), WorkspaceError> {
        let pool = self.state.store.pool();
        if auth::store::workspace_name(pool, workspace_id)
            .await?
            .is_none()
        {
            return Err(WorkspaceError::NotFound(format!(
                "workspace {workspace_id}"
            )));
        }
        let subject = quota::admit::subject(None, workspace_id);
        let usage = quota::report::of(&self.state, workspace_id, &subject).await?;
        let overridden = quota::store::overrides(pool, workspace_id)
            .await?
            .into_iter()
            .map(|(q, _)| q)
            .collect();
        let json = serde_json::to_value(&usage)
            .map_err(|e| WorkspaceError::Corrupt(format!("usage: {e}")))?;
        Ok((json, overridden))
    }

    /// Mints an API key for a workspace; returns the plaintext, shown once
    /// (only its hash is stored).
    pub async fn create_api_key(
        &self,
        workspace_id: &str,
        name: &str,
    ) -> Result<String, WorkspaceError> {
        let key = tokens::mint(auth::KEY_PREFIX);
        auth::store::insert_key(
            self.state.store.pool(),
            &key.hash,
            workspace_id,
            name,
            self.state.now_ms(),
        )
        .await?;
        let event = AuditEvent::ApiKeyCreated {
            name: name.to_owned(),
            key_id: key.hash.chars().take(KEY_ID_LEN).collect(),
        };
        audit::record(&self.state, workspace_id, Default::default(), vec![event]).await;
        Ok(key.plaintext)
    }

    /// Revokes an API key of a workspace, named by the key itself or by its
    /// `keyId` (the first hex digits of its hash, as the audit log names
    /// it, at least 12); the revocation is audited (`api_key_revoked`).
    /// The key's name; `None` when no unrevoked key (or more than one)
    /// matches.
    pub async fn revoke_api_key(
        &self,
        workspace_id: &str,
        key: &str,
    ) -> Result<Option<String>, WorkspaceError> {
        let hash = if key.starts_with(auth::KEY_PREFIX) {
            tokens::hash(key)
        } else if key.len() >= KEY_ID_LEN && key.bytes().all(|b| b.is_ascii_hexdigit()) {
            key.to_ascii_lowercase()
        } else {
            return Err(WorkspaceError::invalid(format!(
                "a key is {}… or its keyId of at least {KEY_ID_LEN} hex digits",
                auth::KEY_PREFIX
            )));
        };
        let pool = self.state.store.pool();
        let now = self.state.now_ms();
        let Some((hash, name)) = auth::store::revoke_key(pool, workspace_id, &hash, now).await?
        else {
            return Ok(None);
        };
        let event = AuditEvent::ApiKeyRevoked {
            name: name.clone(),
            key_id: hash.chars().take(KEY_ID_LEN).collect(),
        };
        audit::record(&self.state, workspace_id, Default::default(), vec![event]).await;
        Ok(Some(name))
    }
}

/// The hex digits of a key's hash the audit log names it by (`keyId`).
const KEY_ID_LEN: usize = 12;

/// The state every handler shares, passed explicitly as `Arc<AppState>`.
/// It lives here, at the root, because it holds a part of several features
/// (the runner client, the live chat turns, the blob folder): the features
/// use it, it uses them, and no feature module depends on another through it.
#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) config: WorkspaceConfig,
    pub(crate) store: Store,
    pub(crate) blobs: BlobStore,
    pub(crate) dispatcher: Dispatcher,
    pub(crate) turns: TurnHub,
    /// The runs this node relays (their live broadcasts).
    pub(crate) run_hub: crate::runs::events::RunHub,
    /// Other nodes' announcements of new run lines (PostgreSQL only).
    pub(crate) notifier: notify::Notifier,
    /// This process among the workspace nodes: the lease holder of the chat
    /// turns it took over (`chats::lease::takeover`).
    pub(crate) node_id: String,
    /// Chats' turns starting and ending, deletions, settings changes, for
    /// `GET /api/assistant/events`.
    pub(crate) chat_events: chat_events::ChatEvents,
    /// This state itself, for work a request starts that outlives it.
    me: std::sync::OnceLock<std::sync::Weak<AppState>>,
    /// The `Host`s and origins this server answers to.
    pub(crate) authority: Authority,
    /// Seals and opens secrets at rest (`secrets`).
    pub(crate) sealer: secrets::Sealer,
}

impl AppState {
    pub(crate) fn now_ms(&self) -> i64 {
        self.config.clock.now_ms()
    }

    /// This state as an `Arc` (`None` only while the workspace is dropped).
    pub(crate) fn arc(&self) -> Option<Arc<AppState>> {
        self.me.get().and_then(std::sync::Weak::upgrade)
    }
}

/// Creates `dir` if missing and makes it `0700`: it holds the database,
/// the secret key file and the file bag.
async fn private_dir(dir: &std::path::Path) -> Result<(), WorkspaceError> {
    use std::os::unix::fs::PermissionsExt as _;
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(|e| WorkspaceError::io(dir, e))?;
    tokio::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .await
        .map_err(|e| WorkspaceError::io(dir, e))
}

/// Seals what earlier versions stored in clear and reseals what an older
/// key sealed (docs/secrets.md), and clears the `/env` payloads of runs
/// that can no longer redeem one: earlier versions copied secret values
/// there. Each row is replaced only if it did not change meanwhile, so
/// nodes starting together and concurrent edits lose nothing.
async fn reseal_stored_secrets(state: &AppState) -> Result<(), WorkspaceError> {
    let environments = environments::reseal_all(state).await?;
    let agents = agents::reseal_all(state).await?;
    let chats = environments::reseal_chat_settings(state).await?;
    let runs = runs::store::clear_spent_env(state.store.pool(), state.now_ms()).await?;
    if environments + agents + chats + runs > 0 {
        // No page from before in the WAL either.
        state.store.checkpoint().await?;
        tracing::info!(
            environments,
            agents,
            chats,
            runs,
            "sealed or resealed stored secrets"
        );
    }
    Ok(())
}

/// The router over every feature's handlers (here, above the features, so
/// no feature depends on another through it), with the guards of
/// [`guard`] around all of it.
fn router(state: Arc<AppState>) -> Router {
    let (routes, _) = api().split_for_parts();
    routes
        .fallback(pages::not_found)
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            guard::host_and_origin,
        ))
        .layer(middleware::map_response(guard::problem_errors))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            audit::record_quota_refusals,
        ))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

/// Every route with its OpenAPI operation: `routes!` registers a handler
/// at the path and methods of its `#[utoipa::path]`, so no route is served
/// undocumented and none documented unserved. One `routes!` per path.
/// The document (`openapi::document`) is built from this list too.
pub(crate) fn api() -> OpenApiRouter<Arc<AppState>> {
    let limited = |(schemas, paths, method_router): UtoipaMethodRouter<Arc<AppState>>,
                   limit: usize| {
        (
            schemas,
            paths,
            method_router.layer(DefaultBodyLimit::max(limit)),
        )
    };
    OpenApiRouter::with_openapi(openapi::base())
        .routes(routes!(pages::index))
        .routes(routes!(pages::app_js))
        .routes(routes!(pages::app_css))
        .routes(routes!(pages::marked_js))
        .routes(routes!(pages::purify_js))
        .routes(routes!(pages::healthz))
        .routes(routes!(pages::readyz))
        .routes(routes!(metrics::serve))
        .routes(routes!(openapi::openapi_json))
        .routes(routes!(runs::api::create))
        .routes(routes!(runs::ws::upgrade))
        .routes(routes!(runs::api::get, runs::api::cancel))
        .routes(routes!(runs::api::events))
        .routes(routes!(runs::api::tool_result))
        .routes(routes!(audit::api::list))
        .routes(routes!(audit::api::of_run))
        .routes(routes!(agents::api::list, agents::api::create))
        .routes(routes!(
            agents::api::get,
            agents::api::update,
            agents::api::delete
        ))
        .routes(routes!(agents::api::run))
        .routes(routes!(environments::api::list, environments::api::create))
        .routes(routes!(
            environments::api::get,
            environments::api::update,
            environments::api::delete
        ))
        .routes(routes!(environments::api::models))
        .routes(routes!(usage::usage))
        .routes(routes!(files::api::download, files::api::delete))
        .routes(routes!(
            auth::api::current,
            auth::api::sign_in,
            auth::api::sign_out
        ))
        .routes(routes!(chats::api::turn))
        .routes(routes!(chats::api::list))
        .routes(routes!(chat_events::serve))
        .routes(routes!(chats::api::detail, chats::api::delete))
        .routes(routes!(chats::api::resume))
        .routes(routes!(chats::api::cancel))
        .routes(routes!(environments::api::put_chat_settings))
        .routes(limited(
            routes!(chats::api::upload),
            chats::view::MAX_UPLOAD_BYTES,
        ))
        .routes(routes!(callbacks::api::env))
        .routes(routes!(callbacks::api::config))
        .routes(limited(routes!(callbacks::api::results), MAX_RESULTS_BODY))
        .routes(limited(
            routes!(callbacks::api::assets_writeback),
            MAX_RESULTS_BODY,
        ))
        .routes(routes!(
            sandbox_api::api::list_files,
            sandbox_api::api::create_file
        ))
        .routes(routes!(sandbox_api::api::read_file))
        .routes(routes!(sandbox_api::api::history))
        .routes(routes!(chats::fork::workdir))
        .routes(routes!(chats::fork::fork))
        .routes(routes!(chats::fork::workdir_tar))
        .routes(routes!(workdir::api::missing))
        .routes(limited(
            routes!(workdir::api::put_blob, workdir::api::get_blob),
            workdir::api::MAX_BLOB_BYTES,
        ))
        .routes(routes!(workdir::api::snapshot))
        .routes(routes!(audit::runner::report))
}
