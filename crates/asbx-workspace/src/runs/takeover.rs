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
use crate::runs::lease::{expiry, renewal_every};
use crate::runs::{events, reattach, relay, store as runs};
use crate::wire::RunStatus;

/// Expired leases looked at per sweep.
const SWEEP_BATCH: i64 = 50;
/// How long re-attaching may take: the sweep waits for it.
const REATTACH_PATIENCE: Duration = Duration::from_secs(10);

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
