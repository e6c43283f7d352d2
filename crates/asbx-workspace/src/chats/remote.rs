//! Resuming a chat turn that another workspace node drives (or drove
//! moments ago): its lines come from `run_events` (the driving node stores
//! them as they arrive, `chats::live`), woken by that node's `NOTIFY` on
//! PostgreSQL, and are folded through a fresh [`TraceBuilder`] from the
//! first line, so the SSE frames (ids, event names, the bounded `stdout`)
//! are exactly the ones the driving node sends. The stream ends with `done`
//! once the turn's message is stored (docs/protocol.md §7).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;

use asbx_protocol::Line;
use axum::response::sse;
use futures::{Stream, StreamExt as _};

use crate::AppState;
use crate::chats::messages::{LiveAction, TraceBuilder, truncated_stdout};
use crate::chats::store as chats;
use crate::error::WorkspaceError;
use crate::runs::events::{self, Kept, Start};
use crate::runs::store as runs;
use crate::wire::{Done, RunStatus, TurnInfo, TurnStatus};

/// A turn that ended longer ago than this is not resumed: read the thread.
const RESUMABLE_AFTER_END_MS: i64 = 60_000;

/// The turn of `chat_id` to resume from another node's lines: the one
/// holding the chat's lease, or the newest if it ended less than a minute
/// ago. `None`: nothing to resume (the caller answers `404`).
pub(crate) async fn find(
    state: &AppState,
    workspace_id: &str,
    chat_id: &str,
) -> Result<Option<TurnInfo>, WorkspaceError> {
    let pool = state.store.pool();
    let Some(chat) = chats::get(pool, chat_id, workspace_id).await? else {
        return Ok(None);
    };
    let turn_id = match chat.lease_turn_id {
        Some(id) => id,
        None => match runs::latest_for_chat(pool, chat_id).await? {
            Some(run)
                if run
                    .ended_at
                    .is_some_and(|t| state.now_ms().saturating_sub(t) < RESUMABLE_AFTER_END_MS) =>
            {
                run.id
            }
            _ => return Ok(None),
        },
    };
    let (user, _) = chats::turn_message_ids(pool, chat_id, &turn_id).await?;
    Ok(Some(TurnInfo {
        chat_id: chat_id.to_owned(),
        turn_id,
        user_message_id: user.unwrap_or_default(),
    }))
}

type Lines = Pin<Box<dyn Stream<Item = Result<Kept, WorkspaceError>> + Send>>;

struct Replay {
    state: Arc<AppState>,
    info: TurnInfo,
    cursor: u64,
    trace: TraceBuilder,
    lines: Option<Lines>,
    started: bool,
    /// The highest `seq` of the stored lines.
    last_seq: u64,
    /// `done`, sent after the closing `error` that came before it.
    pending: Option<Done>,
    finished: bool,
}

/// The SSE events of `info`'s turn after `cursor`: `turn`, the frames, then
/// `done`. Ends without `done` when the turn's message was never stored
/// (its node died; a later read of the thread marks it interrupted).
pub(crate) fn subscribe(
    state: Arc<AppState>,
    info: TurnInfo,
    cursor: u64,
) -> impl Stream<Item = Result<sse::Event, Infallible>> + Send + 'static {
    let lines: Lines = Box::pin(events::follow(
        Arc::clone(&state),
        info.turn_id.clone(),
        Start { after: 0 },
    ));
    let replay = Replay {
        state,
        info,
        cursor,
        trace: TraceBuilder::default(),
        lines: Some(lines),
        started: false,
        last_seq: 0,
        pending: None,
        finished: false,
    };
    futures::stream::unfold(replay, |mut r| async move {
        if r.finished {
            return None;
        }
        if !r.started {
            r.started = true;
            let ev = sse::Event::default()
                .event("turn")
                .json_data(&r.info)
                .unwrap_or_default();
            return Some((Ok(ev), r));
        }
        while let Some(lines) = r.lines.as_mut() {
            match lines.next().await {
                Some(Ok(kept)) => {
                    if let Some(ev) = frame(&mut r.trace, &kept, r.cursor, &mut r.last_seq) {
                        return Some((Ok(ev), r));
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(turn = %r.info.turn_id, error = %e, "replaying a turn failed");
                    return None;
                }
                None => r.lines = None,
            }
        }
        let done = match r.pending.take() {
            Some(done) => done,
            None => {
                // The turn ended without a line saying why (its runner or
                // its node died; the taker-over marked it lost): the
                // `error` the driving node would have sent, numbered after
                // the stored lines. A client that saw more than one line
                // past them (its dead node sent them and never stored
                // them) gets it numbered after what it saw; one exactly
                // one past them saw this `error` in an earlier replay (or
                // one unstored line: the stored message still says why).
                let after = r.last_seq.max(r.cursor);
                let (done, closing) = done(&r.state, &r.info, &r.trace, after).await?;
                if let Some(ev) = closing.filter(|_| r.cursor != r.last_seq + 1) {
                    r.pending = Some(done);
                    return Some((Ok(ev), r));
                }
                done
            }
        };
        let ev = sse::Event::default()
            .event("done")
            .json_data(&done)
            .unwrap_or_default();
        r.finished = true;
        Some((Ok(ev), r))
    })
}

/// The SSE frame of a stored line, as the driving node sent it, when it is
/// after `cursor` and the live stream sends it at all.
fn frame(
    trace: &mut TraceBuilder,
    kept: &Kept,
    cursor: u64,
    last_seq: &mut u64,
) -> Option<sse::Event> {
    let line: Line = serde_json::from_slice(&kept.raw).ok()?;
    *last_seq = (*last_seq).max(line.seq);
    let action = trace.push(&line);
    if line.seq <= cursor {
        return None;
    }
    let data = match action {
        LiveAction::Hide | LiveAction::Drop | LiveAction::Comment => return None,
        LiveAction::Send => String::from_utf8_lossy(&kept.raw).into_owned(),
        LiveAction::Truncate { keep } => truncated_stdout(&line, keep)?,
    };
    Some(
        sse::Event::default()
            .id(line.seq.to_string())
            .event(line.event.type_name())
            .data(data),
    )
}

/// The `done` payload once the turn's message is stored, and the closing
/// `error` frame (numbered after `after`) to send before it when the turn
/// failed and none of its stored lines (`trace`) said why.
async fn done(
    state: &AppState,
    info: &TurnInfo,
    trace: &TraceBuilder,
    after: u64,
) -> Option<(Done, Option<sse::Event>)> {
    let pool = state.store.pool();
    let (_, message) = chats::turn_message_ids(pool, &info.chat_id, &info.turn_id)
        .await
        .ok()?;
    let run = runs::get(pool, &info.turn_id).await.ok()??;
    let status = match run.status {
        RunStatus::Succeeded => TurnStatus::Succeeded,
        _ if run.error_code.as_deref() == Some(asbx_protocol::codes::CANCELLED) => {
            TurnStatus::Cancelled
        }
        _ => TurnStatus::Failed,
    };
    let closing = match (&run.error_code, trace.has_terminal()) {
        (Some(code), false) if status != TurnStatus::Succeeded => {
            let outcome = runs::Outcome::Failed {
                code: code.clone(),
                message: run.error_message.clone().unwrap_or_default(),
            };
            let ts = u64::try_from(run.ended_at.unwrap_or(0)).unwrap_or(0);
            crate::runs::tap::closing_error(&outcome, after + 1, &info.turn_id, ts)
                .and_then(|line| Some((line.seq, serde_json::to_string(&line).ok()?)))
                .map(|(seq, data)| {
                    sse::Event::default()
                        .id(seq.to_string())
                        .event("error")
                        .data(data)
                })
        }
        _ => None,
    };
    let done = Done {
        chat_id: info.chat_id.clone(),
        turn_id: info.turn_id.clone(),
        status,
        message_id: message?,
    };
    Some((done, closing))
}
