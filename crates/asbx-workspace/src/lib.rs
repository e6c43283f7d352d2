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
// tokens, validation, the wire bodies, the HTTP plumbing.
mod auth;
mod config;
mod error;
mod guard;
mod http;
mod pages;
mod state;
mod store;
mod tokens;
mod validate;
mod wire;

// Features, each with its store, logic and handlers. Dependencies point one
// way: agents, chats and callbacks use runs and files; runs uses files;
// files uses none of them.
mod agents;
mod callbacks;
mod chats;
mod files;
mod runs;

use std::sync::Arc;

pub use config::{Clock, ManualClock, SystemClock, WorkspaceConfig};
pub use error::WorkspaceError;

use crate::files::blobs::BlobStore;
use crate::runs::dispatch::Dispatcher;
use crate::state::AppState;
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
    /// `listen` address without `require_auth` (CONTRACT section 8).
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
        tokio::fs::create_dir_all(&config.data_dir)
            .await
            .map_err(|e| WorkspaceError::io(&config.data_dir, e))?;
        let store = Store::open(config.database_url.as_deref(), &config.data_dir).await?;
        let blobs = BlobStore::open(config.data_dir.join("blobs")).await?;
        if config.sandbox_url.is_none() {
            tracing::warn!(
                "no SANDBOX_URL configured: runs and chat turns will fail unless a stored agent names its runner"
            );
        }
        let state = AppState {
            dispatcher: Dispatcher::new(config.runner_token.as_deref())?,
            authority: guard::Authority::from_config(&config),
            config,
            store,
            blobs,
            turns: Default::default(),
        };
        Ok(Workspace {
            state: Arc::new(state),
        })
    }

    /// The HTTP routes.
    pub fn router(&self) -> axum::Router {
        http::router(Arc::clone(&self.state))
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
        Ok(key.plaintext)
    }
}
