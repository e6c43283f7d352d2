//! Running runs that cross a daily quota (CONTRACT §10): a run or chat turn
//! that crosses `tokens-per-day` or `sandbox-seconds-per-day` while it runs
//! ends with `error` `quota_exceeded`, its lines so far kept, its sandbox
//! cancelled.
//!
//! Event-driven, never a poll per line:
//!
//! - **Tokens** come with the runner's model-call reports
//!   (`audit::runner::report`): each report's tokens are added to the run's
//!   tally (`runs.tokens`, which its `session_ended` later replaces with the
//!   exact figure), and the workspace's day is checked once per report.
//! - **Seconds**: a timer set at dispatch ([`watch_seconds`]) to the
//!   workspace's remaining budget, shared among its running runs; when it
//!   fires the figure is read again and the timer re-armed until the budget
//!   is spent or the run is over.
//!
//! A stop ([`stop`]) marks the run ([`Stops`]) and cancels it where it is
//! relayed or driven on this node; the relay (`runs::relay`) and the chat
//! driver (`chats::driver`) then end it with the quota's outcome, and the
//! runner's `error` line of the cancel is rewritten to say so
//! (`runs::tap::OutcomeTap::end_errors_with`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::AppState;
use crate::error::{ProblemCode, WorkspaceError};
use crate::quota::{self, Limits, Quota, store};

/// The shortest wait between two looks at the seconds budget: several
/// runs share it, so a look may find some left.
const MIN_RECHECK: Duration = Duration::from_secs(1);

/// Why a running run was stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stopped {
    pub(crate) quota: Quota,
    pub(crate) limit: u64,
}

impl Stopped {
    /// The `error` line's code.
    pub(crate) fn code(&self) -> &'static str {
        ProblemCode::QuotaExceeded.as_str()
    }

    /// The `error` line's message.
    pub(crate) fn message(&self) -> String {
        format!(
            "the workspace used up its {} quota ({}) while the run was running",
            self.quota.name(),
            self.limit
        )
    }
}

/// The runs of this node stopped for a quota and not yet settled.
#[derive(Debug, Default)]
pub(crate) struct Stops {
    inner: Mutex<HashMap<String, Stopped>>,
}

impl Stops {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Stopped>> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Why `run_id` was stopped, if it was.
    pub(crate) fn get(&self, run_id: &str) -> Option<Stopped> {
        self.lock().get(run_id).cloned()
    }

    /// Why `run_id` was stopped, forgotten (the run settles).
    pub(crate) fn take(&self, run_id: &str) -> Option<Stopped> {
        self.lock().remove(run_id)
    }
}

/// Stops run `run_id` (a run or a chat turn) for `stopped`: marked, then
/// cancelled where this node relays or drives it. False when this node
/// does neither (the mark is dropped).
pub(crate) fn stop(state: &AppState, run_id: &str, stopped: Stopped) -> bool {
    let stops = &state.dispatcher.stops;
    let name = stopped.quota.name();
    let first = stops.lock().insert(run_id.to_owned(), stopped).is_none();
    let here = state.turns.cancel(run_id) || state.run_hub.cancel(run_id);
    if !here {
        stops.take(run_id);
        tracing::warn!(
            run = run_id,
            "a run over its quota is relayed by another node; it ends at its next check there"
        );
    } else if first {
        tracing::info!(run = run_id, "stopping a run over its workspace's quota");
        crate::metrics::METRICS.quota_refused(name);
    }
    here
}

/// A runner reported `tokens` more model tokens for run `run_id` of
/// `workspace_id`: added to the run's tally; when the workspace's day is
/// then past `tokens-per-day`, the run is stopped.
pub(crate) async fn tokens_used(
    state: &AppState,
    workspace_id: &str,
    run_id: &str,
    tokens: u64,
) -> Result<(), WorkspaceError> {
    if tokens == 0 {
        return Ok(());
    }
    let pool = state.store.pool();
    let running = store::add_tokens(pool, run_id, tokens).await?;
    if !running {
        return Ok(());
    }
    let limits = quota::admit::limits(state, workspace_id).await?;
    let Some(limit) = limits.get(Quota::TokensPerDay) else {
        return Ok(());
    };
    let used = store::tokens_today(pool, workspace_id, state.now_ms()).await?;
    if used >= i64::try_from(limit).unwrap_or(i64::MAX) {
        stop(
            state,
            run_id,
            Stopped {
                quota: Quota::TokensPerDay,
                limit,
            },
        );
    }
    Ok(())
}

/// Sets the timer of a run just dispatched under `sandbox-seconds-per-day`:
/// it fires when the workspace's remaining budget, shared among its
/// running runs, would be spent, and stops the run once it is. Nothing
/// without the quota.
pub(crate) fn watch_seconds(state: &AppState, limits: &Limits, workspace_id: &str, run_id: &str) {
    let Some(limit) = limits.get(Quota::SandboxSecondsPerDay) else {
        return;
    };
    let Some(state) = state.arc() else {
        return;
    };
    let (workspace_id, run_id) = (workspace_id.to_owned(), run_id.to_owned());
    tokio::spawn(async move {
        if let Err(e) = seconds_timer(&state, limit, &workspace_id, &run_id).await {
            tracing::warn!(run = %run_id, error = %crate::error::error_chain(&e), "the sandbox-seconds timer failed");
        }
    });
}

async fn seconds_timer(
    state: &Arc<AppState>,
    limit: u64,
    workspace_id: &str,
    run_id: &str,
) -> Result<(), WorkspaceError> {
    let limit_ms = i64::try_from(limit).unwrap_or(i64::MAX / 1000) * 1000;
    loop {
        let pool = state.store.pool();
        let now = state.now_ms();
        let used = store::sandbox_ms_today(pool, workspace_id, now).await?;
        let left = limit_ms - used;
        if left <= 0 {
            stop(
                state,
                run_id,
                Stopped {
                    quota: Quota::SandboxSecondsPerDay,
                    limit,
                },
            );
            return Ok(());
        }
        // Every running run of the workspace spends the budget at once.
        let running = store::running(pool, workspace_id).await?.max(1);
        // Past midnight (UTC) the budget is new: look again then at the latest.
        let wait_ms = (left / running).min(quota::DAY_MS - now.rem_euclid(quota::DAY_MS));
        let wait = Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0)).max(MIN_RECHECK);
        tokio::time::sleep(wait).await;
        if !store::is_running(state.store.pool(), run_id).await? {
            return Ok(());
        }
    }
}
