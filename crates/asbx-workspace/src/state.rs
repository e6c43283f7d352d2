//! The state every handler shares, passed explicitly as `Arc<AppState>`.

use std::sync::Arc;

use crate::blobs::BlobStore;
use crate::config::{Clock, WorkspaceConfig};
use crate::dispatch::Dispatcher;
use crate::store::Store;
use crate::turns::TurnHub;

#[derive(Debug)]
pub struct AppState {
    pub config: WorkspaceConfig,
    pub store: Store,
    pub blobs: BlobStore,
    pub dispatcher: Dispatcher,
    pub turns: TurnHub,
}

impl AppState {
    pub fn now_ms(&self) -> i64 {
        self.config.clock.now_ms()
    }

    pub fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.config.clock)
    }
}
