//! An API run or agent run outlives the workspace node relaying it, as a
//! chat turn does (`chats::lease::takeover`; docs/protocol.md §9). The
//! relaying node holds the run's lease (`runs.lease_holder`,
//! `runs.lease_expires_at`) and renews it every quarter of `lease_ttl`
//! while it reads; when the node dies the lease expires, and any node may
//! take the run over with one conditional `UPDATE` (one winner). The
//! winner reads the lines the run had stored, re-attaches to the runner's
//! session after the last of them (`runs::reattach`; every dispatch has a
//! detach grace, so the sandbox waits) and relays the run to its end, as
//! if it had dispatched it; clients resume with `GET /api/runs/{id}/events
//! ?after=N` on any node. A runner that no longer has the session (or is
//! gone) ends the run `runner_lost`, with the closing `error` line.

use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::{Any, Executor, Row as _};

use crate::AppState;
use crate::error::WorkspaceError;
use crate::runs::{events, reattach, relay, store as runs};
use crate::wire::RunStatus;

/// Expired leases looked at per sweep.
const SWEEP_BATCH: i64 = 50;
/// How long re-attaching may take: the sweep waits for it.
const REATTACH_PATIENCE: Duration = Duration::from_secs(10);

/// How often a relay renews its run's lease (and every node sweeps).
pub(crate) fn renewal_every(state: &AppState) -> Duration {
    (state.config.lease_ttl / 4).max(Duration::from_millis(50))
}

/// When a lease taken or renewed now expires.
fn expiry(state: &AppState) -> i64 {
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

/// Running runs whose lease expired (chat turns have none).
async fn expired<'c, E>(db: E, now_ms: i64) -> Result<Vec<String>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let rows = sqlx::query(
        "SELECT id FROM runs WHERE status = 'running' AND lease_expires_at IS NOT NULL \
         AND lease_expires_at <= $1 ORDER BY lease_expires_at LIMIT $2",
    )
    .bind(now_ms)
    .bind(SWEEP_BATCH)
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| r.try_get::<String, _>("id").map_err(WorkspaceError::from))
        .collect()
}

/// Takes the expired lease of `run_id` for this node: one statement, one
/// winner.
async fn take(state: &AppState, run_id: &str) -> Result<bool, WorkspaceError> {
    let done = sqlx::query(
        "UPDATE runs SET lease_holder = $1, lease_expires_at = $2 \
         WHERE id = $3 AND status = 'running' AND lease_expires_at <= $4",
    )
    .bind(&state.node_id)
    .bind(expiry(state))
    .bind(run_id)
    .bind(state.now_ms())
    .execute(state.store.pool())
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Sweeps for runs to take over until the workspace is dropped.
pub(crate) fn start_sweeper(state: &Arc<AppState>) {
    let weak: Weak<AppState> = Arc::downgrade(state);
    let every = renewal_every(state);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(state) = weak.upgrade() else {
                return;
            };
            if let Err(e) = sweep(&state).await {
                tracing::warn!(error = %crate::error::error_chain(&e), "sweeping for lost runs failed");
            }
        }
    });
}

async fn sweep(state: &Arc<AppState>) -> Result<(), WorkspaceError> {
    for run_id in expired(state.store.pool(), state.now_ms()).await? {
        if !state.run_hub.relays(&run_id) && take(state, &run_id).await? {
            take_over(state, &run_id).await?;
        }
    }
    Ok(())
}

/// Relays a run whose lease this node just took: re-attached after its
/// last stored line, or ended `runner_lost` when its runner is gone.
async fn take_over(state: &Arc<AppState>, run_id: &str) -> Result<(), WorkspaceError> {
    let pool = state.store.pool();
    let Some(run) = runs::get(pool, run_id).await? else {
        return Ok(());
    };
    if run.status != RunStatus::Running {
        return Ok(());
    }
    let (stored, last_seq) = events::stored(pool, run_id).await?;
    let live = state.run_hub.open(run_id);
    let response = match reattach::runner_of(state, run.sandbox_url.as_deref()) {
        Some(url) => reattach::reattach(state, url, run_id, last_seq, REATTACH_PATIENCE).await,
        None => None,
    };
    if response.is_some() {
        tracing::info!(run = run_id, after = last_seq, "took over a run");
    } else {
        tracing::warn!(
            run = run_id,
            after = last_seq,
            "took over a run whose runner is gone"
        );
    }
    relay::spawn_resumed(Arc::clone(state), run_id.to_owned(), live, response, stored);
    Ok(())
}
