//! Runs whose relay is gone: a workspace node that stopped (crash, restart)
//! while relaying a run leaves its row `running`; another node takes it
//! over once its lease expired (`runs::takeover`), and a run without a
//! lease (stored before leases) ends with its sandbox, its detach grace
//! after the node's stream closed (docs/protocol.md §4). A run is never
//! left `running` for a sandbox that is gone (docs/protocol.md §7): when a
//! node that does not relay a running run, and nobody holds its lease, is
//! asked about it, it asks the runner (`GET /v1/sessions/{id}`), and
//! settles the run as failed `runner_lost` when the runner does not know the
//! session, the session ended a while ago, or the runner cannot be reached.
//! Chat turns ask the runner the same question ([`ask_session`]) before
//! they are marked lost (`chats::lease::takeover`), with answers of their own.

use std::time::Duration;

use asbx_protocol::session::{SessionInfo, SessionStatus};

use sqlx::Row as _;

use crate::AppState;
use crate::error::WorkspaceError;
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
    // A node relays it, or is re-attaching to it after a blip: its
    // runner's answer now says nothing of the run's end.
    if leased(state, &run.id).await.unwrap_or(true) {
        return false;
    }
    let Some(sandbox_url) = run.sandbox_url.as_deref() else {
        return false;
    };
    let why = match ask_session(state, sandbox_url, &run.id, None).await {
        SessionAnswer::Unasked => return false,
        SessionAnswer::Unreachable(_) => Some("the runner cannot be reached"),
        SessionAnswer::Unknown => Some("the runner no longer knows the session"),
        SessionAnswer::Known(Some(info))
            if ended_before(&info, asbx_protocol::now_ms(), SETTLE_GRACE_MS) =>
        {
            Some("the session ended while no workspace node relayed it")
        }
        SessionAnswer::Known(_) | SessionAnswer::Other => None,
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

/// Whether a node holds the run's lease now (it relays the run, or is
/// re-attaching to it): nobody else may judge it lost.
pub(crate) async fn leased(state: &AppState, run_id: &str) -> Result<bool, WorkspaceError> {
    let row = sqlx::query("SELECT lease_expires_at FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_optional(state.store.pool())
        .await?;
    let until = match row {
        Some(r) => r.try_get::<Option<i64>, _>("lease_expires_at")?,
        None => None,
    };
    Ok(until.is_some_and(|t| t > state.now_ms()))
}

/// What a runner says of one of its sessions (`GET /v1/sessions/{id}`).
pub(crate) enum SessionAnswer {
    /// Not asked: the stored URL is unusable or no longer allowed.
    Unasked,
    /// The request failed (nothing listens there, a timeout, ...).
    Unreachable(reqwest::Error),
    /// `404`: the runner does not know the session.
    Unknown,
    /// A success: the session's info, `None` when unreadable.
    Known(Option<Box<SessionInfo>>),
    /// Any other status.
    Other,
}

/// Asks the runner at `sandbox_url` about `session_id`, within `timeout`
/// when given.
pub(crate) async fn ask_session(
    state: &AppState,
    sandbox_url: &str,
    session_id: &str,
    timeout: Option<Duration>,
) -> SessionAnswer {
    let path = ["v1", "sessions", session_id];
    let request = match dispatch::runner_request(state, reqwest::Method::GET, sandbox_url, &path) {
        Ok(r) => match timeout {
            Some(t) => r.timeout(t),
            None => r,
        },
        Err(_) => return SessionAnswer::Unasked,
    };
    match request.send().await {
        Err(e) => SessionAnswer::Unreachable(e),
        Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => SessionAnswer::Unknown,
        Ok(r) if r.status().is_success() => {
            let info = crate::runner_url::read_json::<SessionInfo>(r).await;
            SessionAnswer::Known(info.map(Box::new))
        }
        Ok(_) => SessionAnswer::Other,
    }
}

/// Whether the session ended more than `grace_ms` before `now_ms`: long
/// enough for any relay that still read it to have settled it.
pub(crate) fn ended_before(info: &SessionInfo, now_ms: u64, grace_ms: u64) -> bool {
    info.status == SessionStatus::Ended
        && info
            .ended_at
            .is_some_and(|t| now_ms.saturating_sub(t) > grace_ms)
}
