//! Runs whose relay is gone: a workspace node that stopped (crash, restart)
//! while relaying a run leaves its row `running`, though with a detach grace
//! of 0 the runner ended the sandbox when the node's stream closed
//! (docs/protocol.md §4). A run is never left `running` for a sandbox that
//! is gone (docs/protocol.md §7): when a node that does not relay a running
//! run is asked about it, it asks the runner (`GET /v1/sessions/{id}`), and
//! settles the run as failed `runner_lost` when the runner does not know the
//! session, the session ended a while ago, or the runner cannot be reached.

use asbx_protocol::session::{SessionInfo, SessionStatus};

use crate::AppState;
use crate::runs::dispatch;
use crate::runs::store::{Outcome, RunRow};
use crate::wire::{RunKind, RunStatus};

/// A run younger than this may not have reached its runner yet.
pub(crate) const MIN_AGE_MS: i64 = 60_000;
/// How long after its session ended a run's own relay has to settle it.
pub(crate) const SETTLE_GRACE_MS: u64 = 10_000;

/// Settles `run` as lost when nothing relays it and its session is gone;
/// returns whether it did. Chat turns have their own account of this
/// (`chats`) and are left alone.
pub(crate) async fn settle_if_lost(state: &AppState, run: &RunRow) -> bool {
    if run.status != RunStatus::Running
        || run.kind == RunKind::Chat
        || state.run_hub.relays(&run.id)
        || state.now_ms().saturating_sub(run.created_at) < MIN_AGE_MS
    {
        return false;
    }
    let Some(sandbox_url) = run.sandbox_url.as_deref() else {
        return false;
    };
    let why = match dispatch::runner_request(
        state,
        reqwest::Method::GET,
        sandbox_url,
        &["v1", "sessions", &run.id],
    ) {
        Err(_) => return false,
        Ok(req) => match req.send().await {
            Err(_) => Some("the runner cannot be reached"),
            Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => {
                Some("the runner no longer knows the session")
            }
            Ok(r) if r.status().is_success() => {
                match crate::runner_url::read_json::<SessionInfo>(r).await {
                    Some(info)
                        if info.status == SessionStatus::Ended
                            && info.ended_at.is_some_and(|t| {
                                asbx_protocol::now_ms().saturating_sub(t) > SETTLE_GRACE_MS
                            }) =>
                    {
                        Some("the session ended while no workspace node relayed it")
                    }
                    _ => None,
                }
            }
            Ok(_) => None,
        },
    };
    let Some(why) = why else {
        return false;
    };
    let outcome = Outcome::Failed {
        code: asbx_protocol::codes::RUNNER_LOST.to_owned(),
        message: format!("the run's relay was lost: {why}"),
    };
    dispatch::settle(state, &run.id, &outcome).await;
    true
}
