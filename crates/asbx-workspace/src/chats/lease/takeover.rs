//! A chat turn outlives the workspace node that started it
//! (docs/protocol.md §9). The driving node renews the chat's lease every
//! quarter of `lease_ttl`; when it dies (or is cut off from the database)
//! the lease expires, and any node may take the turn over with one
//! conditional `UPDATE` ([`sql::take_over_lease`], one winner). The
//! winner reads the lines the turn had stored, re-attaches to the runner's
//! session after the last of them (`GET /v1/sessions/{id}/events?after=N`;
//! chat turns are dispatched with a detach grace, so the sandbox waits for
//! it) and drives the turn to its end as if it had started it: the thread
//! gets its message once, the writeback lands (the sandbox calls the
//! workspace's public URL, which any node answers), and clients resume on
//! any node. A runner that no longer has the session (or is gone) ends the
//! turn as lost: an `error` `runner_lost` marked interrupted.
//!
//! Every node sweeps for expired leases every quarter of `lease_ttl`;
//! reading a chat tries too ([`recover_lost_turn`]), so a thread never shows
//! a turn as running that nobody drives.

use std::sync::{Arc, Weak};
use std::time::Duration;

use asbx_protocol::callback::Role;

use crate::AppState;
use crate::chats::driver::{self, Resumed, TurnContext};
use crate::chats::lease::{self, LeaseGuard, sql};
use crate::chats::live::LiveTurn;
use crate::chats::store::{self as chats, ChatRow};
use crate::error::WorkspaceError;
use crate::runs::dispatch;
use crate::runs::events;
use crate::runs::lost::{self, SessionAnswer};
use crate::runs::store::{self as runs, Outcome};
use crate::tokens;
use crate::wire::{ContentBlock, PersistedMessage, RunStatus};

/// Expired leases looked at per sweep.
const SWEEP_BATCH: i64 = 50;
/// How long re-attaching to the runner may take: the sweep waits for it.
const REATTACH_PATIENCE: Duration = Duration::from_secs(10);

/// Sweeps for turns to take over until the workspace is dropped.
pub(crate) fn start_sweeper(state: &Arc<AppState>) {
    let weak: Weak<AppState> = Arc::downgrade(state);
    let every = lease::renewal_every(state);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(state) = weak.upgrade() else {
                return;
            };
            if let Err(e) = sweep(&state).await {
                tracing::warn!(error = %crate::error::error_chain(&e), "sweeping for lost chat turns failed");
            }
        }
    });
}

async fn sweep(state: &Arc<AppState>) -> Result<(), WorkspaceError> {
    let expired = sql::expired_leases(state.store.pool(), state.now_ms(), SWEEP_BATCH).await?;
    for chat in expired {
        take_over(state, &chat).await?;
    }
    Ok(())
}

/// Takes over the turn of `chat` if its lease has expired and no turn of
/// this node drives it: re-attached and driven here, or ended as lost.
/// True when this call settled or took the turn.
pub(crate) async fn take_over(
    state: &Arc<AppState>,
    chat: &ChatRow,
) -> Result<bool, WorkspaceError> {
    let Some(turn_id) = chat.lease_turn_id.clone() else {
        return Ok(false);
    };
    if state.turns.drives(&turn_id) {
        return Ok(false);
    }
    let pool = state.store.pool();
    let now = state.now_ms();
    let until = lease::expiry(state, now);
    if !sql::take_over_lease(pool, &chat.id, &turn_id, &state.node_id, until, now).await? {
        return Ok(false);
    }
    let lease = LeaseGuard::taken_over(Arc::clone(state), chat.id.clone(), turn_id.clone());
    let run = runs::get(pool, &turn_id).await?;
    let run = match run {
        Some(run) if run.status == RunStatus::Running => run,
        // Already ended (its message was saved before it settled), or a
        // turn that never reached the runs table.
        Some(_) => {
            lease.release().await;
            return Ok(true);
        }
        None => {
            mark_lost(state, &chat.id, &turn_id).await?;
            lease.release().await;
            return Ok(true);
        }
    };
    let (stored, last_seq) = events::stored(pool, &turn_id).await?;
    match reattach(state, run.sandbox_url.as_deref(), &turn_id, last_seq).await {
        Some(response) => {
            tracing::info!(chat = %chat.id, turn = %turn_id, after = last_seq, "took over a chat turn");
            let (user, _) = chats::turn_message_ids(pool, &chat.id, &turn_id).await?;
            let turn = LiveTurn::new(
                turn_id,
                chat.id.clone(),
                chat.workspace_id.clone(),
                user.unwrap_or_default(),
                run.created_at,
                state.config.detach_grace,
            );
            driver::spawn_resumed(
                TurnContext {
                    state: Arc::clone(state),
                    turn,
                    lease,
                },
                response,
                Resumed { stored },
            );
        }
        None => {
            mark_lost(state, &chat.id, &turn_id).await?;
            lease.release().await;
        }
    }
    Ok(true)
}

/// The runner's replay of the session after `after`, if it still has it
/// (`runs::reattach`, the one way back to a session).
async fn reattach(
    state: &AppState,
    sandbox_url: Option<&str>,
    turn_id: &str,
    after: u64,
) -> Option<reqwest::Response> {
    let url = crate::runs::reattach::runner_of(state, sandbox_url)?;
    crate::runs::reattach::reattach(state, url, turn_id, after, REATTACH_PATIENCE).await
}

/// Ends a turn nobody can finish: the thread says so (once), the run is
/// settled `runner_lost`. A turn that was never accepted (no user message)
/// leaves the thread as it is.
pub(crate) async fn mark_lost(
    state: &AppState,
    chat_id: &str,
    turn_id: &str,
) -> Result<(), WorkspaceError> {
    let message = "the workspace lost this turn before it ended (it restarted, or lost its runner)";
    let lost_run = Outcome::Failed {
        code: asbx_protocol::codes::RUNNER_LOST.to_owned(),
        message: message.to_owned(),
    };
    // A turn whose user message was never stored was never accepted: its
    // node failed the request (the database went away between taking the
    // lease and storing the message) and could not release the lease. It is
    // no turn of the thread, so nothing is written there.
    let (user, _) = chats::turn_message_ids(state.store.pool(), chat_id, turn_id).await?;
    if user.is_none() {
        tracing::info!(
            chat = chat_id,
            turn = turn_id,
            "a lease left by a turn that was never accepted: released, nothing written"
        );
        dispatch::settle(state, turn_id, &lost_run).await;
        return Ok(());
    }
    tracing::warn!(
        chat = chat_id,
        turn = turn_id,
        "marking a lost turn as interrupted"
    );
    let lost = PersistedMessage {
        id: tokens::random_id(),
        role: Role::Assistant,
        content: vec![ContentBlock::Error {
            code: asbx_protocol::codes::RUNNER_LOST.to_owned(),
            message: message.to_owned(),
            termination: None,
            interrupted: true,
        }],
        file_attachments: Vec::new(),
        created_at: state.now_ms(),
        turn_id: Some(turn_id.to_owned()),
    };
    chats::append_message(state.store.pool(), chat_id, &lost).await?;
    dispatch::settle(state, turn_id, &lost_run).await;
    Ok(())
}

/// A turn younger than this is never judged lost by asking its runner: it
/// may still be on its way there (the dispatch's connect timeout is 10 s).
const LOST_TURN_MIN_AGE_MS: i64 = 20_000;
/// A session the runner ended this long ago has no relay left finishing it.
const LOST_TURN_ENDED_MS: u64 = 10_000;

/// Marks the turn of `chat` as interrupted when it was lost: its lease is
/// still held, no relay in this process drives it, and either the lease has
/// expired (nothing renewed it) or its runner no longer runs the session
/// (the workspace or the runner restarted). The thread gets an `error`
/// block marked `interrupted`, the run is settled, the lease cleared; a chat
/// is never left showing a turn `running`. Safe to race: only the caller
/// that clears the lease writes.
pub(crate) async fn recover_lost_turn(
    state: &AppState,
    chat: &ChatRow,
) -> Result<bool, WorkspaceError> {
    let now = state.now_ms();
    let Some(turn_id) = chat.lease_turn_id.as_deref() else {
        return Ok(false);
    };
    if state.turns.drives(turn_id) {
        return Ok(false);
    }
    if chat.active_turn(now).is_none() {
        // Nothing renews the lease: take the turn over here and now (or
        // end it as lost), as the sweep would.
        let Some(state) = state.arc() else {
            return Ok(false);
        };
        return take_over(&state, chat).await;
    }
    if !session_is_gone(state, turn_id, now).await {
        return Ok(false);
    }
    let pool = state.store.pool();
    if !sql::clear_expired_lease(pool, &chat.id, turn_id, i64::MAX).await? {
        return Ok(false);
    }
    if !chats::has_assistant_message(pool, &chat.id, turn_id).await? {
        mark_lost(state, &chat.id, turn_id).await?;
    }
    Ok(true)
}

/// Whether the runner a turn was dispatched to no longer runs its session,
/// so no relay anywhere can still be reading it (a session without a reader
/// ends after its detach grace). Unknown answers (a timeout, another
/// status) count as not gone.
async fn session_is_gone(state: &AppState, turn_id: &str, now_ms: i64) -> bool {
    let run = match runs::get(state.store.pool(), turn_id).await {
        Ok(Some(run)) => run,
        Ok(None) | Err(_) => return false,
    };
    if run.status != RunStatus::Running {
        // Settled: its relay is done (it saves the message before settling).
        return true;
    }
    if now_ms.saturating_sub(run.created_at) < LOST_TURN_MIN_AGE_MS {
        return false;
    }
    let Some(url) = run.sandbox_url.as_deref() else {
        return false;
    };
    match lost::ask_session(state, url, turn_id, Some(Duration::from_secs(5))).await {
        // Nothing listens where the runner was: its sandboxes died with it
        // (docs/protocol.md §5).
        SessionAnswer::Unreachable(e) => e.is_connect(),
        SessionAnswer::Unknown => true,
        SessionAnswer::Known(Some(info)) => lost::ended_before(
            &info,
            u64::try_from(now_ms).unwrap_or(0),
            LOST_TURN_ENDED_MS,
        ),
        SessionAnswer::Known(None) | SessionAnswer::Unasked | SessionAnswer::Other => false,
    }
}
