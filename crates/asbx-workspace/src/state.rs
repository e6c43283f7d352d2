//! The state every handler shares, passed explicitly as `Arc<AppState>`.

use crate::chats::live::TurnHub;
use crate::config::WorkspaceConfig;
use crate::files::blobs::BlobStore;
use crate::guard::Authority;
use crate::runs::dispatch::Dispatcher;
use crate::store::Store;

#[derive(Debug)]
pub(crate) struct AppState {
    pub config: WorkspaceConfig,
    pub store: Store,
    pub blobs: BlobStore,
    pub dispatcher: Dispatcher,
    pub turns: TurnHub,
    /// The `Host`s and origins this server answers to.
    pub authority: Authority,
}

impl AppState {
    pub(crate) fn now_ms(&self) -> i64 {
        self.config.clock.now_ms()
    }
}
