//! The driver of a chat turn: the task that reads the runner's NDJSON to
//! the turn's end, whatever its clients do.
//!
//! In stages ([`drive`]): it folds the lines into the step trace and the
//! SSE frames ([`Driver::fold`]) while renewing the chat's lease and storing
//! the lines ([`Driver::read`]); when the stream ends (or is cancelled) it
//! works out how the turn ended ([`Driver::conclude`]), stores the turn's
//! end in one transaction ([`Driver::store_end`]) and tells the clients
//! ([`Driver::announce`]). A driver that loses the lease to another node
//! stops without a word ([`Driver::leave`]).

use std::sync::Arc;
use std::time::Duration;

use asbx_protocol::Line;
use asbx_protocol::callback::Role;
use futures::StreamExt as _;

use crate::AppState;
use crate::chats::frames::Frame;
use crate::chats::lease::{self, LeaseGuard, sql as lease_sql};
use crate::chats::live::LiveTurn;
use crate::chats::messages::{LiveAction, TraceBuilder, truncated_stdout};
use crate::chats::store as chats;
use crate::chats::stored::StoredLines;
use crate::runs::dispatch;
use crate::runs::store::{self as runs, Outcome};
use crate::runs::tap::{OutcomeTap, closing_error};
use crate::tokens;
use crate::wire::{Done, PersistedMessage, TurnStatus};

/// How long a settled turn stays attachable, so a late reconnect still gets
/// its last frames and the `done` event.
const LINGER: Duration = Duration::from_secs(60);

/// What the driver needs besides the upstream response.
#[derive(Debug)]
pub(crate) struct TurnContext {
    pub state: Arc<AppState>,
    pub turn: Arc<LiveTurn>,
    pub lease: LeaseGuard,
}

/// Registers the turn and spawns its driver.
pub(crate) fn spawn(ctx: TurnContext, response: reqwest::Response) {
    ctx.state.turns.insert(Arc::clone(&ctx.turn));
    let t = &ctx.turn;
    ctx.state
        .chat_events
        .emit(&t.workspace_id, &t.chat_id, Some(&t.id), "started");
    tokio::spawn(drive(ctx, response, None));
}

/// A turn this node took over from a node that stopped renewing its lease
/// (`chats::lease::takeover`): the lines the turn had stored, which the
/// driver folds in before the runner's lines after them.
pub(crate) struct Resumed {
    pub(crate) stored: Vec<u8>,
}

/// Registers a taken-over turn and spawns its driver on the runner's
/// replay (`GET /v1/sessions/{id}/events?after=N`).
pub(crate) fn spawn_resumed(ctx: TurnContext, response: reqwest::Response, resumed: Resumed) {
    ctx.state.turns.insert(Arc::clone(&ctx.turn));
    tokio::spawn(drive(ctx, response, Some(resumed)));
}

/// How the runner's stream stopped being read.
enum Ending {
    /// Another node took the turn over (or marked it lost) while this one
    /// could not renew the lease: it is that node's now.
    Superseded,
    /// The stream ended, broke (`broken`), or the turn was cancelled.
    Read {
        cancelled: bool,
        broken: Option<String>,
    },
}

async fn drive(ctx: TurnContext, response: reqwest::Response, resumed: Option<Resumed>) {
    let TurnContext { state, turn, lease } = ctx;
    let mut renew = tokio::time::interval(lease::renewal_every(&state));
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    renew.tick().await;
    let flush = StoredLines::schedule();
    let mut driver = Driver {
        state,
        turn,
        tap: OutcomeTap::default(),
        trace: TraceBuilder::default(),
        last_seq: 0,
        stored: StoredLines::default(),
    };
    if let Some(r) = &resumed {
        // Already stored: folded in (and buffered for this node's clients)
        // but not stored again.
        let mut lines = driver.tap.observe(&r.stored);
        lines.extend(driver.tap.finish_input());
        driver.fold(lines, false);
    }
    let (cancelled, broken) = match driver.read(response, &lease, renew, flush).await {
        Ending::Superseded => return driver.leave(lease).await,
        Ending::Read { cancelled, broken } => (cancelled, broken),
    };
    let (outcome, status) = driver.conclude(cancelled, broken.as_deref());
    if let Some(message_id) = driver.store_end(lease, &outcome).await {
        driver.announce(status, message_id).await;
    }
}

/// A turn being driven: what it has read so far.
struct Driver {
    state: Arc<AppState>,
    turn: Arc<LiveTurn>,
    tap: OutcomeTap,
    trace: TraceBuilder,
    /// The highest `seq` read.
    last_seq: u64,
    /// Lines read but not stored yet.
    stored: StoredLines,
}

impl Driver {
    /// Folds `lines` into the trace and the turn's frames (a `heartbeat` as
    /// a comment, `log` hidden, `stdout` bounded per step); every line but
    /// heartbeats is also kept for the store when `store`.
    fn fold(&mut self, lines: Vec<Line>, store: bool) {
        for line in lines {
            self.last_seq = self.last_seq.max(line.seq);
            let action = self.trace.push(&line);
            if matches!(action, LiveAction::Comment) {
                self.turn.push(Frame::heartbeat(line.seq));
                continue;
            }
            let Ok(full) = serde_json::to_string(&line).map(Arc::<str>::from) else {
                continue;
            };
            if store {
                self.stored.push(line.seq, Arc::clone(&full));
            }
            let data = match action {
                LiveAction::Hide | LiveAction::Drop | LiveAction::Comment => continue,
                LiveAction::Send => Some(full),
                LiveAction::Truncate { keep } => truncated_stdout(&line, keep).map(Arc::from),
            };
            if let Some(data) = data {
                self.turn
                    .push(Frame::line(line.seq, line.event.type_name(), data));
            }
        }
    }

    /// Reads the runner's stream to its end, renewing the lease every
    /// `renew` and storing the lines every `flush` (or when a batch is
    /// full). A cancel asks the runner to end the session; its last lines
    /// (`error`, `session_ended` with the termination fields) are still read
    /// until [`dispatch::CANCEL_WIND_DOWN`].
    async fn read(
        &mut self,
        response: reqwest::Response,
        lease: &LeaseGuard,
        mut renew: tokio::time::Interval,
        mut flush: tokio::time::Interval,
    ) -> Ending {
        let mut upstream = response.bytes_stream().boxed();
        let mut cancelled = false;
        let mut broken: Option<String> = None;
        let mut wind_down: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
        loop {
            tokio::select! {
                biased;
                _ = self.turn.cancelled(), if !cancelled => {
                    cancelled = true;
                    if let Some(stop) = self.state.dispatcher.stops.get(&self.turn.id) {
                        self.tap.end_errors_with(stop.code(), stop.message());
                    }
                    if dispatch::cancel_on_runner(&self.state, &self.turn.id).await {
                        wind_down = Some(Box::pin(tokio::time::sleep(dispatch::CANCEL_WIND_DOWN)));
                    } else {
                        break;
                    }
                }
                _ = async { if let Some(d) = wind_down.as_mut() { d.await } }, if wind_down.is_some() => {
                    tracing::warn!(turn = %self.turn.id, "the runner did not end the cancelled session in time");
                    break;
                }
                _ = renew.tick() => match lease.renew().await {
                    Ok(true) => {}
                    Ok(false) => {
                        // Another node took the turn over (or marked it
                        // lost) while this one could not renew: it is that
                        // node's now; this one stops without a word.
                        tracing::warn!(turn = %self.turn.id, "lost the chat lease; leaving the turn to its new holder");
                        return Ending::Superseded;
                    }
                    Err(e) => tracing::warn!(turn = %self.turn.id, error = %e, "renewing the chat lease failed"),
                },
                _ = flush.tick(), if !self.stored.is_empty() => {
                    self.stored.flush(&self.state, &self.turn.id).await;
                }
                chunk = upstream.next() => match &chunk {
                    Some(Ok(bytes)) => {
                        let lines = self.tap.observe(bytes);
                        self.fold(lines, true);
                        if self.stored.is_full() {
                            self.stored.flush(&self.state, &self.turn.id).await;
                        }
                    }
                    Some(Err(_)) | None if cancelled || self.tap.ended() => {
                        if let Some(Err(e)) = &chunk {
                            broken = Some(crate::error::error_chain(e));
                        }
                        break;
                    }
                    // Broken before the session's end: read on from the
                    // runner's resume log, after the last line read. A
                    // cancel meanwhile is the select's to handle.
                    Some(Err(_)) | None => {
                        self.tap.reattached();
                        let after = self.tap.last_seq().max(self.last_seq);
                        let again = tokio::select! {
                            r = crate::runs::reattach::resume(&self.state, &self.turn.id, after) => r,
                            () = self.turn.cancelled() => {
                                upstream = futures::stream::empty().boxed();
                                continue;
                            }
                            // The lease is kept meanwhile.
                            () = lease.keep() => return Ending::Superseded,
                        };
                        match again {
                            Some(r) => upstream = r.bytes_stream().boxed(),
                            None => {
                                if let Some(Err(e)) = &chunk {
                                    broken = Some(crate::error::error_chain(e));
                                }
                                break;
                            }
                        }
                    }
                },
            }
        }
        // Dropping the upstream request (here, as the function returns)
        // cancels the sandbox if it still runs (after the runner's detach
        // grace).
        Ending::Read { cancelled, broken }
    }

    /// How the turn ended: the terminal line's outcome, else cancelled,
    /// else what the tap makes of a stream without one; counted in the
    /// metrics. A stream the runner left without its end gets an `error`
    /// line of the runner's shape, marked interrupted unless cancelled.
    fn conclude(&mut self, cancelled: bool, broken: Option<&str>) -> (Outcome, TurnStatus) {
        let rest = self.tap.finish_input();
        self.fold(rest, true);
        // Stopped for a quota (`quota::enforce`): failed with its code,
        // whatever the runner said of its cancel.
        let stopped = (self.state.dispatcher.stops)
            .take(&self.turn.id)
            .filter(|_| cancelled);
        let (outcome, status) = match (stopped, self.tap.terminal().cloned(), cancelled) {
            (Some(stop), _, _) => (
                Outcome::Failed {
                    code: stop.code().to_owned(),
                    message: stop.message(),
                },
                TurnStatus::Failed,
            ),
            (None, Some(o @ Outcome::Succeeded { .. }), _) => (o, TurnStatus::Succeeded),
            (None, Some(o @ Outcome::Failed { .. }), true) => (o, TurnStatus::Cancelled),
            (None, Some(o @ Outcome::Failed { .. }), _) => (o, TurnStatus::Failed),
            (None, None, true) => (
                Outcome::Failed {
                    code: asbx_protocol::codes::CANCELLED.to_owned(),
                    message: "the turn was cancelled".to_owned(),
                },
                TurnStatus::Cancelled,
            ),
            (None, None, false) => (self.tap.outcome(broken), TurnStatus::Failed),
        };
        crate::metrics::METRICS.chat_turn(match status {
            TurnStatus::Succeeded => "succeeded",
            TurnStatus::Failed => "failed",
            TurnStatus::Cancelled => "cancelled",
        });
        if !self.trace.has_terminal() {
            // Tell subscribers how it ended with a line of the same shape as
            // the runner's, numbered after the last one seen.
            let ts = u64::try_from(self.state.now_ms()).unwrap_or(0);
            if let Some(line) = closing_error(&outcome, self.last_seq + 1, &self.turn.id, ts) {
                self.fold(vec![line], true);
                if !cancelled {
                    // The stream broke or ended early: the turn was lost,
                    // not ended (the runner or the connection to it went
                    // away).
                    self.trace.mark_interrupted();
                }
            }
        }
        (outcome, status)
    }

    /// Stores the turn's end: the assistant message, the run's outcome, the
    /// last lines, the lease released. The id of the stored message; `None`
    /// when the lease was lost meanwhile (the turn is left to its new
    /// holder, nothing stored but the lines).
    ///
    /// The database may be away right now (this node cut off from it): the
    /// turn's end waits for it, its clients kept waiting, rather than be
    /// lost (a turn whose message is never stored would later be marked
    /// lost although its clients saw it end). The turn's end is one
    /// transaction ([`TurnEnd::store`]); past [`FINISH_PATIENCE`] what can
    /// still be stored is stored one by one.
    async fn store_end(&mut self, lease: LeaseGuard, outcome: &Outcome) -> Option<String> {
        let trace = std::mem::take(&mut self.trace);
        let message = PersistedMessage {
            id: tokens::random_id(),
            role: Role::Assistant,
            content: trace.finish(),
            file_attachments: Vec::new(),
            created_at: self.state.now_ms(),
            turn_id: Some(self.turn.id.clone()),
        };
        let patience = tokio::time::Instant::now() + FINISH_PATIENCE;
        let termination = self
            .tap
            .termination()
            .and_then(|t| serde_json::to_string(t).ok());
        let end = TurnEnd {
            turn: &self.turn,
            holder: lease.holder(),
            message: &message,
            outcome,
            termination: termination.as_deref(),
        };
        let (state, stored) = (&self.state, &self.stored);
        let stored_end = until_stored(&self.turn.id, "storing the turn's end", patience, || {
            end.store(state, stored.rows())
        })
        .await;
        match stored_end {
            Some(false) => {
                tracing::warn!(turn = %self.turn.id, "lost the chat lease at the turn's end; leaving it to its new holder");
                self.leave(lease).await;
                return None;
            }
            Some(true) => {
                self.stored.clear();
                lease.forget();
            }
            None => {
                // Gave up on the database: what can still be stored, one by
                // one, as the turn's end did before it was one transaction.
                self.stored.flush(&self.state, &self.turn.id).await;
                let pool = self.state.store.pool();
                if let Err(e) = chats::append_message(pool, &self.turn.chat_id, &message).await {
                    tracing::error!(turn = %self.turn.id, error = %crate::error::error_chain(&e), "persisting the assistant message failed");
                }
                dispatch::settle_ended(&self.state, &self.turn.id, outcome, self.tap.termination())
                    .await;
                lease.release().await;
            }
        }
        Some(message.id)
    }

    /// Tells followers on every node and the chat's listeners that the turn
    /// ended, gives its clients `done`, and keeps it attachable for
    /// [`LINGER`].
    async fn announce(self, status: TurnStatus, message_id: String) {
        let Driver { state, turn, .. } = self;
        crate::runs::events::announce_end(&state, &turn.id).await;
        state
            .chat_events
            .emit(&turn.workspace_id, &turn.chat_id, Some(&turn.id), "ended");
        turn.finish(Done {
            chat_id: turn.chat_id.clone(),
            turn_id: turn.id.clone(),
            status,
            message_id,
        });
        tokio::time::sleep(LINGER).await;
        state.turns.remove(&turn.id);
    }

    /// Leaves the turn to the node that holds its lease now: what was read
    /// is stored, the lease is not released.
    async fn leave(&mut self, lease: LeaseGuard) {
        self.stored.flush(&self.state, &self.turn.id).await;
        lease.forget();
        self.state.turns.remove(&self.turn.id);
    }
}

/// What a turn's end stores, in one transaction ([`TurnEnd::store`]).
struct TurnEnd<'a> {
    turn: &'a LiveTurn,
    holder: &'a str,
    message: &'a PersistedMessage,
    outcome: &'a Outcome,
    termination: Option<&'a str>,
}

impl TurnEnd<'_> {
    /// Stores the turn's end and the lines still pending (`rows`) in one
    /// transaction (one commit, one fsync on PostgreSQL): the lease released
    /// if still this turn's holder's (else nothing is stored, false), the
    /// last lines, the message, the run's outcome, its tokens revoked, the
    /// audit records of the tool calls that ended among `rows`. Every
    /// line is stored with the message and the run's end, so a node
    /// replaying the turn has them all once it sees the run settled.
    async fn store(
        &self,
        state: &AppState,
        rows: &[(u64, Arc<str>)],
    ) -> Result<bool, crate::error::WorkspaceError> {
        let turn = self.turn;
        let mut tx = crate::store::begin_write(state.store.pool()).await?;
        // The lease is checked and released in one statement; all the rest
        // commits with it or not at all.
        let now = state.now_ms();
        let ours =
            lease_sql::release_held_lease(&mut *tx, &turn.chat_id, &turn.id, self.holder, now)
                .await?;
        if !ours {
            tx.rollback().await?;
            return Ok(false);
        }
        let rows: Vec<(u64, &[u8])> = rows.iter().map(|(s, l)| (*s, l.as_bytes())).collect();
        crate::runs::events::append_rows_on(&mut tx, &turn.id, &rows).await?;
        chats::append_message(&mut *tx, &turn.chat_id, self.message).await?;
        runs::finish(&mut *tx, &turn.id, self.outcome, self.termination, now).await?;
        crate::tokens::store::revoke_session(&mut *tx, &turn.id, now).await?;
        // The steps that ended among these last lines are tool calls, as
        // the batches stored before them were (`runs::events::append_rows`).
        crate::audit::tools::record_in(&mut tx, now, &turn.workspace_id, &turn.id, &rows).await?;
        tx.commit().await?;
        Ok(true)
    }
}

/// How long a turn's end waits for an unreachable database.
const FINISH_PATIENCE: Duration = Duration::from_secs(120);
const FINISH_RETRY_FIRST: Duration = Duration::from_millis(100);
const FINISH_RETRY_MAX: Duration = Duration::from_secs(2);

/// Runs `op` until it succeeds or `patience` is over (then logs and gives
/// up), backing off between tries.
async fn until_stored<T, F, Fut>(
    turn_id: &str,
    what: &str,
    patience: tokio::time::Instant,
    mut op: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, crate::error::WorkspaceError>>,
{
    let mut wait = FINISH_RETRY_FIRST;
    loop {
        match op().await {
            Ok(v) => return Some(v),
            Err(e) if tokio::time::Instant::now() < patience => {
                tracing::warn!(turn = turn_id, error = %crate::error::error_chain(&e), "{what} failed; will retry");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(FINISH_RETRY_MAX);
            }
            Err(e) => {
                tracing::error!(turn = turn_id, error = %crate::error::error_chain(&e), "{what} failed; giving up");
                return None;
            }
        }
    }
}
