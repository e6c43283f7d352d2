//! The relay lease of an API run or agent run (`runs.lease_holder`,
//! `runs.lease_expires_at`): the relaying node takes it, renews it every
//! quarter of `lease_ttl` while it reads (and while it re-attaches), and
//! learns from a failed renewal that another node took the run over
//! (`runs::takeover`).

use std::time::Duration;

use crate::AppState;
use crate::error::WorkspaceError;

/// How often a relay renews its run's lease (and every node sweeps).
pub(crate) fn renewal_every(state: &AppState) -> Duration {
    (state.config.lease_ttl / 4).max(Duration::from_millis(50))
}

/// When a lease taken or renewed now expires.
pub(crate) fn expiry(state: &AppState) -> i64 {
    let ttl = i64::try_from(state.config.lease_ttl.as_millis()).unwrap_or(i64::MAX);
    state.now_ms().saturating_add(ttl)
}

/// Takes the lease of a run this node starts relaying.
pub(crate) async fn hold(state: &AppState, run_id: &str) -> Result<(), WorkspaceError> {
    sqlx::query(
        "UPDATE runs SET lease_holder = $1, lease_expires_at = $2 \
         WHERE id = $3 AND status = 'running'",
    )
    .bind(&state.node_id)
    .bind(expiry(state))
    .bind(run_id)
    .execute(state.store.pool())
    .await?;
    Ok(())
}

/// Extends the lease while this node holds it; false when another node
/// took the run over (or it settled).
pub(crate) async fn renew(state: &AppState, run_id: &str) -> Result<bool, WorkspaceError> {
    let done = sqlx::query(
        "UPDATE runs SET lease_expires_at = $1, lease_holder = $3 \
         WHERE id = $2 AND COALESCE(lease_holder, $3) = $3 AND status = 'running'",
    )
    .bind(expiry(state))
    .bind(run_id)
    .bind(&state.node_id)
    .execute(state.store.pool())
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Renews the lease every [`renewal_every`] while something else is
/// awaited (re-attaching); returns once the lease was lost.
pub(crate) async fn keep(state: &AppState, run_id: &str) {
    loop {
        tokio::time::sleep(renewal_every(state)).await;
        if let Ok(false) = renew(state, run_id).await {
            return;
        }
    }
}
