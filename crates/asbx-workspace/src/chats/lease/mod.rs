//! The chat's lease: the single-flight lock of a chat's turns, and what
//! lets a turn outlive the node that started it (docs/protocol.md §7, §9).
//!
//! The lease is three columns on the chat row (`lease_turn_id`,
//! `lease_expires_at`, `lease_holder`), written only by the statements in
//! [`sql`]. A turn's start takes it with one conditional `UPDATE` (free, or
//! expired); the turn's driver holds a [`LeaseGuard`], renews the lease every
//! [`renewal_every`] and releases it when the turn settles. A node that dies
//! hard stops renewing, so the lease expires and any node takes the turn
//! over ([`takeover`]) or ends it as lost.
//!
//! Uses the chats' store; the turn's start and its driver use this room, and
//! only `takeover` uses the driver (it drives the turns it takes over).

pub(crate) mod sql;
pub(crate) mod takeover;

use std::sync::Arc;
use std::time::Duration;

use crate::AppState;
use crate::error::WorkspaceError;

/// A duration in milliseconds, as `i64`.
fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// When a lease taken or renewed at `now_ms` expires.
pub(crate) fn expiry(state: &AppState, now_ms: i64) -> i64 {
    now_ms.saturating_add(ms(state.config.lease_ttl))
}

/// How often a held lease is renewed, and how often every node sweeps for
/// expired ones: a quarter of `lease_ttl`, at least 50 ms.
pub(crate) fn renewal_every(state: &AppState) -> Duration {
    (state.config.lease_ttl / 4).max(Duration::from_millis(50))
}

/// Holds a chat's lease for a turn; released explicitly, or on drop.
#[derive(Debug)]
pub(crate) struct LeaseGuard {
    state: Arc<AppState>,
    chat_id: String,
    turn_id: String,
    /// Who drives the turn (`HELD_BY` in `sql`): `""` for the node that
    /// started it, else the node that took it over.
    holder: String,
    held: bool,
}

impl LeaseGuard {
    /// The lease a turn's start took.
    pub(crate) fn new(state: Arc<AppState>, chat_id: String, turn_id: String) -> Self {
        LeaseGuard {
            state,
            chat_id,
            turn_id,
            holder: String::new(),
            held: true,
        }
    }

    /// The lease this node took over ([`sql::take_over_lease`]).
    pub(crate) fn taken_over(state: Arc<AppState>, chat_id: String, turn_id: String) -> Self {
        let holder = state.node_id.clone();
        LeaseGuard {
            state,
            chat_id,
            turn_id,
            holder,
            held: true,
        }
    }

    /// Who drives the turn: what the turn's end checks the lease against.
    pub(crate) fn holder(&self) -> &str {
        &self.holder
    }

    /// Extends the lease by `lease_ttl` from now; false when the turn no
    /// longer holds it (another node took it over, or marked it lost).
    pub(crate) async fn renew(&self) -> Result<bool, WorkspaceError> {
        let until = expiry(&self.state, self.state.now_ms());
        sql::renew_lease(
            self.state.store.pool(),
            &self.chat_id,
            &self.turn_id,
            &self.holder,
            until,
        )
        .await
    }

    /// Renews the lease every [`renewal_every`] while something else is
    /// awaited (re-attaching to the runner); returns once it was lost.
    pub(crate) async fn keep(&self) {
        loop {
            tokio::time::sleep(renewal_every(&self.state)).await;
            if let Ok(false) = self.renew().await {
                return;
            }
        }
    }

    pub(crate) async fn release(mut self) {
        self.held = false;
        release(&self.state, &self.chat_id, &self.turn_id).await;
    }

    /// Lets go without releasing: another node holds the lease now.
    pub(crate) fn forget(mut self) {
        self.held = false;
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let state = Arc::clone(&self.state);
        let (chat_id, turn_id) = (self.chat_id.clone(), self.turn_id.clone());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { release(&state, &chat_id, &turn_id).await });
        }
    }
}

async fn release(state: &AppState, chat_id: &str, turn_id: &str) {
    if let Err(e) = sql::release_lease(state.store.pool(), chat_id, turn_id, state.now_ms()).await {
        tracing::error!(chat = chat_id, turn = turn_id, error = %crate::error::error_chain(&e), "releasing the chat lease failed");
    }
}
