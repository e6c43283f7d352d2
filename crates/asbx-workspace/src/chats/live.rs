//! Live chat turns: the task that drives one turn, and the SSE subscribers.
//!
//! A turn runs in its own task, independent of any HTTP connection: it reads
//! the runner's NDJSON, folds the lines into the step trace, buffers the SSE
//! frames (so a reconnecting client with `Last-Event-ID` misses nothing),
//! renews the chat's lease, and when the stream ends (or is cancelled)
//! persists the assistant message, settles the run and releases the lease.
//! Clients are subscribers: when the last one goes away, the turn is
//! cancelled after the configured grace period (zero: at once).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use asbx_protocol::Line;
use asbx_protocol::callback::Role;
use asbx_protocol::session::{SessionInfo, SessionStatus};
use axum::response::sse;
use futures::{Stream, StreamExt as _};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::AppState;
use crate::chats::messages::{LiveAction, TraceBuilder, truncated_stdout};
use crate::chats::store as chats;
use crate::runs::dispatch;
use crate::runs::relay::{OutcomeTap, closing_error};
use crate::runs::store::{self as runs, Outcome};
use crate::tokens;
use crate::wire::{Done, PersistedMessage, RunStatus, TurnInfo, TurnStatus};

/// Most bytes of SSE frames kept per turn for resumption; older frames are
/// dropped first.
const MAX_BUFFERED_BYTES: usize = 32 * 1024 * 1024;
/// How long a settled turn stays attachable, so a late reconnect still gets
/// its last frames and the `done` event.
const LINGER: Duration = Duration::from_secs(60);
/// Keep-alive comment interval on SSE streams.
pub(crate) const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The turns in flight (and recently settled) in this process.
#[derive(Debug, Default)]
pub(crate) struct TurnHub {
    turns: Mutex<HashMap<String, Arc<LiveTurn>>>,
}

impl TurnHub {
    fn insert(&self, turn: Arc<LiveTurn>) {
        if let Ok(mut map) = self.turns.lock() {
            map.insert(turn.id.clone(), turn);
        }
    }

    fn remove(&self, turn_id: &str) {
        if let Ok(mut map) = self.turns.lock() {
            map.remove(turn_id);
        }
    }

    /// The turn `turn_id`, if this process drives (or just drove) it.
    fn get(&self, turn_id: &str) -> Option<Arc<LiveTurn>> {
        self.turns.lock().ok()?.get(turn_id).cloned()
    }

    /// The newest turn of a chat in `workspace_id`, if one is attachable.
    pub(crate) fn for_chat(&self, chat_id: &str, workspace_id: &str) -> Option<Arc<LiveTurn>> {
        let map = self.turns.lock().ok()?;
        map.values()
            .filter(|t| t.chat_id == chat_id && t.workspace_id == workspace_id)
            .max_by_key(|t| t.started_at)
            .cloned()
    }
}

/// One buffered SSE frame: a runner line (`id` = its seq), or a comment
/// (a runner `heartbeat`) when `kind` is empty.
#[derive(Debug, Clone)]
struct Frame {
    seq: u64,
    kind: &'static str,
    data: Arc<str>,
}

impl Frame {
    fn to_sse(&self) -> sse::Event {
        if self.kind.is_empty() {
            return sse::Event::default().comment(&*self.data);
        }
        sse::Event::default()
            .id(self.seq.to_string())
            .event(self.kind)
            .data(&*self.data)
    }
}

#[derive(Debug, Default)]
struct Frames {
    events: VecDeque<Frame>,
    bytes: usize,
    done: Option<Done>,
}

/// A turn other requests can attach to.
#[derive(Debug)]
pub(crate) struct LiveTurn {
    pub id: String,
    pub chat_id: String,
    pub workspace_id: String,
    pub user_message_id: String,
    started_at: i64,
    frames: Mutex<Frames>,
    version: watch::Sender<u64>,
    cancel: CancellationToken,
    subscribers: AtomicUsize,
    grace: Duration,
}

impl LiveTurn {
    pub(crate) fn new(
        id: String,
        chat_id: String,
        workspace_id: String,
        user_message_id: String,
        started_at: i64,
        grace: Duration,
    ) -> Arc<LiveTurn> {
        Arc::new(LiveTurn {
            id,
            chat_id,
            workspace_id,
            user_message_id,
            started_at,
            frames: Mutex::new(Frames::default()),
            version: watch::Sender::new(0),
            cancel: CancellationToken::new(),
            subscribers: AtomicUsize::new(0),
            grace,
        })
    }

    /// Asks the turn to stop; the driver cancels the sandbox and settles.
    pub(crate) fn cancel(&self) {
        self.cancel.cancel();
    }

    pub(crate) fn is_done(&self) -> bool {
        self.frames.lock().map(|f| f.done.is_some()).unwrap_or(true)
    }

    fn push(&self, frame: Frame) {
        if let Ok(mut f) = self.frames.lock() {
            f.bytes += frame.data.len();
            f.events.push_back(frame);
            while f.bytes > MAX_BUFFERED_BYTES {
                match f.events.pop_front() {
                    Some(old) => f.bytes -= old.data.len(),
                    None => break,
                }
            }
        }
        self.version.send_modify(|v| *v += 1);
    }

    fn finish(&self, done: Done) {
        if let Ok(mut f) = self.frames.lock() {
            f.done = Some(done);
        }
        self.version.send_modify(|v| *v += 1);
    }

    /// Frames after `cursor`, and the `done` payload once every frame is out.
    fn after(&self, cursor: u64) -> (Vec<Frame>, Option<Done>) {
        let Ok(f) = self.frames.lock() else {
            return (Vec::new(), None);
        };
        let start = f.events.partition_point(|e| e.seq <= cursor);
        let frames: Vec<Frame> = f.events.iter().skip(start).cloned().collect();
        (frames, f.done.clone())
    }

    fn info(&self) -> TurnInfo {
        TurnInfo {
            chat_id: self.chat_id.clone(),
            turn_id: self.id.clone(),
            user_message_id: self.user_message_id.clone(),
        }
    }
}

/// Counts a subscriber; the last one leaving starts the grace period.
struct Subscription {
    turn: Arc<LiveTurn>,
}

impl Subscription {
    fn new(turn: Arc<LiveTurn>) -> Self {
        turn.subscribers.fetch_add(1, Ordering::SeqCst);
        Subscription { turn }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if self.turn.subscribers.fetch_sub(1, Ordering::SeqCst) != 1 || self.turn.is_done() {
            return;
        }
        let turn = Arc::clone(&self.turn);
        if turn.grace.is_zero() {
            turn.cancel();
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                tokio::time::sleep(turn.grace).await;
                if turn.subscribers.load(Ordering::SeqCst) == 0 && !turn.is_done() {
                    tracing::info!(turn = %turn.id, "client gone past the grace period; cancelling");
                    turn.cancel();
                }
            });
        }
    }
}

/// The SSE events of a turn after `cursor` (a `Last-Event-ID`): a `turn`
/// event, every runner line but `log` with `id: <seq>` (`heartbeat` as a
/// comment, `stdout` bounded per step), then `done`.
pub(crate) fn subscribe(
    turn: Arc<LiveTurn>,
    cursor: u64,
) -> impl Stream<Item = Result<sse::Event, Infallible>> + Send + 'static {
    let first = sse::Event::default()
        .event("turn")
        .json_data(turn.info())
        .unwrap_or_default();
    let rx = turn.version.subscribe();
    let sub = Subscription::new(Arc::clone(&turn));
    let state = (sub, rx, cursor, VecDeque::<sse::Event>::new(), false);
    let rest = futures::stream::unfold(
        state,
        |(sub, mut rx, mut cursor, mut pending, ended)| async move {
            loop {
                if let Some(ev) = pending.pop_front() {
                    return Some((Ok(ev), (sub, rx, cursor, pending, ended)));
                }
                if ended {
                    return None;
                }
                rx.borrow_and_update();
                let (frames, done) = sub.turn.after(cursor);
                if !frames.is_empty() {
                    for f in frames {
                        cursor = f.seq;
                        pending.push_back(f.to_sse());
                    }
                    continue;
                }
                if let Some(done) = done {
                    let ev = sse::Event::default()
                        .event("done")
                        .json_data(&done)
                        .unwrap_or_default();
                    return Some((Ok(ev), (sub, rx, cursor, pending, true)));
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        },
    );
    futures::stream::once(async move { Ok(first) }).chain(rest)
}

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
/// (`chats::takeover`): who holds the lease now, and the lines the turn had
/// stored, which the driver folds in before the runner's lines after them.
pub(crate) struct Resumed {
    pub(crate) holder: String,
    pub(crate) stored: Vec<u8>,
}

/// Registers a taken-over turn and spawns its driver on the runner's
/// replay (`GET /v1/sessions/{id}/events?after=N`).
pub(crate) fn spawn_resumed(ctx: TurnContext, response: reqwest::Response, resumed: Resumed) {
    ctx.state.turns.insert(Arc::clone(&ctx.turn));
    tokio::spawn(drive(ctx, response, Some(resumed)));
}

async fn drive(ctx: TurnContext, response: reqwest::Response, resumed: Option<Resumed>) {
    let TurnContext { state, turn, lease } = ctx;
    let mut upstream = response.bytes_stream().boxed();
    let mut tap = OutcomeTap::default();
    let mut trace = TraceBuilder::default();
    let mut last_seq = 0u64;
    let session_id = turn.id.clone();
    let holder = resumed
        .as_ref()
        .map(|r| r.holder.clone())
        .unwrap_or_default();
    let renew_every = (state.config.lease_ttl / 4).max(Duration::from_millis(50));
    let mut renew = tokio::time::interval(renew_every);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    renew.tick().await;

    // Every line but heartbeats is also stored (`run_events`, batched), so
    // any node can replay the turn (`chats::remote`).
    let mut stored = StoredLines::default();
    let handle = |lines: Vec<Line>,
                  trace: &mut TraceBuilder,
                  last_seq: &mut u64,
                  stored: &mut StoredLines| {
        for line in lines {
            *last_seq = (*last_seq).max(line.seq);
            let action = trace.push(&line);
            if matches!(action, LiveAction::Comment) {
                turn.push(Frame {
                    seq: line.seq,
                    kind: "",
                    data: Arc::from("heartbeat"),
                });
                continue;
            }
            let Ok(full) = serde_json::to_string(&line).map(Arc::<str>::from) else {
                continue;
            };
            stored.push(line.seq, Arc::clone(&full));
            let data = match action {
                LiveAction::Hide | LiveAction::Drop | LiveAction::Comment => continue,
                LiveAction::Send => Some(full),
                LiveAction::Truncate { keep } => truncated_stdout(&line, keep).map(Arc::from),
            };
            if let Some(data) = data {
                turn.push(Frame {
                    seq: line.seq,
                    kind: line.event.type_name(),
                    data,
                });
            }
        }
    };
    // The first store is due `STORE_EVERY` after the start, not at once: an
    // immediate tick stored the turn's first lines in a commit of their own
    // while the relay waited (about 2 ms on PostgreSQL, an fsync).
    let mut flush =
        tokio::time::interval_at(tokio::time::Instant::now() + STORE_EVERY, STORE_EVERY);
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    if let Some(r) = &resumed {
        // Already stored: folded in (and buffered for this node's clients)
        // but not stored again.
        let mut scratch = StoredLines::default();
        let mut lines = tap.observe(&r.stored);
        lines.extend(tap.finish_input());
        handle(lines, &mut trace, &mut last_seq, &mut scratch);
    }
    let mut superseded = false;

    let mut cancelled = false;
    let mut broken: Option<String> = None;
    // After a cancel the runner is asked to end the session; its last lines
    // (`error`, `session_ended` with the termination fields) are still read
    // until this deadline.
    let mut wind_down: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        tokio::select! {
            biased;
            _ = turn.cancel.cancelled(), if !cancelled => {
                cancelled = true;
                if dispatch::cancel_on_runner(&state, &turn.id).await {
                    wind_down = Some(Box::pin(tokio::time::sleep(dispatch::CANCEL_WIND_DOWN)));
                } else {
                    break;
                }
            }
            _ = async { if let Some(d) = wind_down.as_mut() { d.await } }, if wind_down.is_some() => {
                tracing::warn!(turn = %turn.id, "the runner did not end the cancelled session in time");
                break;
            }
            _ = renew.tick() => {
                let until = state.now_ms().saturating_add(ms(state.config.lease_ttl));
                match chats::renew_lease(state.store.pool(), &turn.chat_id, &turn.id, &holder, until).await {
                    Ok(true) => {}
                    Ok(false) => {
                        // Another node took the turn over (or marked it
                        // lost) while this one could not renew: it is that
                        // node's now; this one stops without a word.
                        tracing::warn!(turn = %turn.id, "lost the chat lease; leaving the turn to its new holder");
                        superseded = true;
                        break;
                    }
                    Err(e) => tracing::warn!(turn = %turn.id, error = %e, "renewing the chat lease failed"),
                }
            }
            _ = flush.tick(), if !stored.is_empty() => stored.flush(&state, &turn.id).await,
            chunk = upstream.next() => match chunk {
                Some(Ok(bytes)) => {
                    handle(tap.observe(&bytes), &mut trace, &mut last_seq, &mut stored);
                    if stored.is_full() {
                        stored.flush(&state, &turn.id).await;
                    }
                }
                Some(Err(e)) => {
                    broken = Some(crate::error::error_chain(&e));
                    break;
                }
                None => break,
            },
        }
    }
    // Dropping the upstream request cancels the sandbox if it still runs
    // (after the runner's detach grace).
    drop(upstream);
    if superseded {
        stored.flush(&state, &turn.id).await;
        lease.forget();
        state.turns.remove(&turn.id);
        return;
    }
    handle(tap.finish_input(), &mut trace, &mut last_seq, &mut stored);

    let (outcome, status) = match (tap.terminal().cloned(), cancelled) {
        (Some(o @ Outcome::Succeeded { .. }), _) => (o, TurnStatus::Succeeded),
        (Some(o @ Outcome::Failed { .. }), true) => (o, TurnStatus::Cancelled),
        (Some(o @ Outcome::Failed { .. }), _) => (o, TurnStatus::Failed),
        (None, true) => (
            Outcome::Failed {
                code: asbx_protocol::codes::CANCELLED.to_owned(),
                message: "the turn was cancelled".to_owned(),
            },
            TurnStatus::Cancelled,
        ),
        (None, false) => (tap.outcome(broken.as_deref()), TurnStatus::Failed),
    };
    crate::metrics::METRICS.chat_turn(match status {
        TurnStatus::Succeeded => "succeeded",
        TurnStatus::Failed => "failed",
        TurnStatus::Cancelled => "cancelled",
    });
    if !trace.has_terminal() {
        // Tell subscribers how it ended with a line of the same shape as the
        // runner's, numbered after the last one seen.
        let ts = u64::try_from(state.now_ms()).unwrap_or(0);
        if let Some(line) = closing_error(&outcome, last_seq + 1, &session_id, ts) {
            handle(vec![line], &mut trace, &mut last_seq, &mut stored);
            if !cancelled {
                // The stream broke or ended early: the turn was lost, not
                // ended (the runner or the connection to it went away).
                trace.mark_interrupted();
            }
        }
    }

    let message = PersistedMessage {
        id: tokens::random_id(),
        role: Role::Assistant,
        content: trace.finish(),
        file_attachments: Vec::new(),
        created_at: state.now_ms(),
        turn_id: Some(turn.id.clone()),
    };
    // The database may be away right now (this node cut off from it): the
    // turn's end waits for it, its clients kept waiting, rather than be
    // lost (a turn whose message is never stored would later be marked
    // lost although its clients saw it end). The turn's end is one
    // transaction (one commit, one fsync on PostgreSQL): the lease released
    // if still ours (else nothing is stored), the last lines, the message,
    // the run's outcome, its tokens revoked. Every line is
    // stored with the message and the run's end, so a node replaying the
    // turn has them all once it sees the run settled.
    let patience = tokio::time::Instant::now() + FINISH_PATIENCE;
    let termination = tap
        .termination()
        .and_then(|t| serde_json::to_string(t).ok());
    let end = TurnEnd {
        turn: &turn,
        holder: &holder,
        message: &message,
        outcome: &outcome,
        termination: termination.as_deref(),
    };
    let stored_end = until_stored(&turn.id, "storing the turn's end", patience, || {
        end.store(&state, &stored.rows)
    })
    .await;
    match stored_end {
        Some(false) => {
            tracing::warn!(turn = %turn.id, "lost the chat lease at the turn's end; leaving it to its new holder");
            stored.flush(&state, &turn.id).await;
            lease.forget();
            state.turns.remove(&turn.id);
            return;
        }
        Some(true) => {
            stored.rows.clear();
            lease.forget();
        }
        None => {
            // Gave up on the database: what can still be stored, one by
            // one, as the turn's end did before it was one transaction.
            stored.flush(&state, &turn.id).await;
            let pool = state.store.pool();
            if let Err(e) = chats::append_message(pool, &turn.chat_id, &message).await {
                tracing::error!(turn = %turn.id, error = %crate::error::error_chain(&e), "persisting the assistant message failed");
            }
            dispatch::settle_ended(&state, &turn.id, &outcome, tap.termination()).await;
            lease.release().await;
        }
    }
    crate::runs::events::announce_end(&state, &turn.id).await;
    state
        .chat_events
        .emit(&turn.workspace_id, &turn.chat_id, Some(&turn.id), "ended");
    turn.finish(Done {
        chat_id: turn.chat_id.clone(),
        turn_id: turn.id.clone(),
        status,
        message_id: message.id,
    });
    tokio::time::sleep(LINGER).await;
    state.turns.remove(&turn.id);
}

/// How often a turn's new lines are stored at the latest.
const STORE_EVERY: Duration = Duration::from_millis(100);
/// Lines stored in one go at the most.
const STORE_BATCH: usize = 256;
/// Lines kept waiting for the database at the most.
const STORE_PENDING_MAX: usize = 50_000;

/// A turn's lines not yet stored: `(seq, the line's JSON)`.
#[derive(Default)]
struct StoredLines {
    rows: Vec<(u64, Arc<str>)>,
}

impl StoredLines {
    fn push(&mut self, seq: u64, line: Arc<str>) {
        self.rows.push((seq, line));
    }

    fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    fn is_full(&self) -> bool {
        self.rows.len() >= STORE_BATCH
    }

    /// Stores what is pending. On a failure (the database is unreachable)
    /// the lines stay pending for the next try; past [`STORE_PENDING_MAX`]
    /// the oldest are given up, logged.
    async fn flush(&mut self, state: &AppState, run_id: &str) {
        if self.rows.is_empty() {
            return;
        }
        let rows: Vec<(u64, &[u8])> = self.rows.iter().map(|(s, l)| (*s, l.as_bytes())).collect();
        match crate::runs::events::append_rows(state, run_id, &rows).await {
            Ok(()) => self.rows.clear(),
            Err(e) => {
                tracing::warn!(turn = run_id, error = %crate::error::error_chain(&e), "storing the turn's lines failed; will retry");
                if self.rows.len() > STORE_PENDING_MAX {
                    let over = self.rows.len() - STORE_PENDING_MAX;
                    tracing::error!(
                        turn = run_id,
                        lines = over,
                        "giving up storing the oldest lines of the turn"
                    );
                    self.rows.drain(..over);
                }
            }
        }
    }
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
    chat: &chats::ChatRow,
) -> Result<bool, crate::error::WorkspaceError> {
    let now = state.now_ms();
    let Some(turn_id) = chat.lease_turn_id.as_deref() else {
        return Ok(false);
    };
    if drives(state, turn_id) {
        return Ok(false);
    }
    if chat.active_turn(now).is_none() {
        // Nothing renews the lease: take the turn over here and now (or
        // end it as lost), as the sweep would (`chats::takeover`).
        let Some(state) = state.arc() else {
            return Ok(false);
        };
        return crate::chats::takeover::take_over(&state, chat).await;
    }
    if !session_is_gone(state, turn_id, now).await {
        return Ok(false);
    }
    let pool = state.store.pool();
    if !chats::clear_expired_lease(pool, &chat.id, turn_id, i64::MAX).await? {
        return Ok(false);
    }
    if !chats::has_assistant_message(pool, &chat.id, turn_id).await? {
        crate::chats::takeover::mark_lost(state, &chat.id, turn_id).await?;
    }
    Ok(true)
}

/// Whether a turn of this process drives `turn_id` now.
pub(crate) fn drives(state: &AppState, turn_id: &str) -> bool {
    state.turns.get(turn_id).is_some_and(|t| !t.is_done())
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
    let path = ["v1", "sessions", turn_id];
    let request = match dispatch::runner_request(state, reqwest::Method::GET, url, &path) {
        Ok(r) => r.timeout(Duration::from_secs(5)),
        Err(_) => return false,
    };
    match request.send().await {
        // Nothing listens where the runner was: its sandboxes died with it
        // (docs/protocol.md §5).
        Err(e) => e.is_connect(),
        Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => true,
        Ok(r) if r.status().is_success() => match crate::runner_url::read_json::<SessionInfo>(r)
            .await
        {
            Some(info) => {
                info.status == SessionStatus::Ended
                    && info.ended_at.is_some_and(|t| {
                        u64::try_from(now_ms).unwrap_or(0).saturating_sub(t) > LOST_TURN_ENDED_MS
                    })
            }
            None => false,
        },
        Ok(_) => false,
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
    /// transaction; false (nothing stored) when the lease is no longer this
    /// turn's holder's.
    async fn store(
        &self,
        state: &AppState,
        rows: &[(u64, Arc<str>)],
    ) -> Result<bool, crate::error::WorkspaceError> {
        let turn = self.turn;
        let mut tx = state.store.pool().begin().await?;
        // The lease is checked and released in one statement; all the rest
        // commits with it or not at all.
        let now = state.now_ms();
        let ours =
            chats::release_held_lease(&mut *tx, &turn.chat_id, &turn.id, self.holder, now).await?;
        if !ours {
            tx.rollback().await?;
            return Ok(false);
        }
        let rows: Vec<(u64, &[u8])> = rows.iter().map(|(s, l)| (*s, l.as_bytes())).collect();
        crate::runs::events::append_rows_on(&mut tx, &turn.id, &rows).await?;
        chats::append_message(&mut *tx, &turn.chat_id, self.message).await?;
        runs::finish(&mut *tx, &turn.id, self.outcome, self.termination, now).await?;
        crate::tokens::store::revoke_session(&mut *tx, &turn.id, now).await?;
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

/// Holds a chat's lease for a turn; released explicitly, or on drop.
#[derive(Debug)]
pub(crate) struct LeaseGuard {
    state: Arc<AppState>,
    chat_id: String,
    turn_id: String,
    held: bool,
}

impl LeaseGuard {
    pub(crate) fn new(state: Arc<AppState>, chat_id: String, turn_id: String) -> Self {
        LeaseGuard {
            state,
            chat_id,
            turn_id,
            held: true,
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
    if let Err(e) = chats::release_lease(state.store.pool(), chat_id, turn_id, state.now_ms()).await
    {
        tracing::error!(chat = chat_id, turn = turn_id, error = %crate::error::error_chain(&e), "releasing the chat lease failed");
    }
}

/// A duration in milliseconds, as `i64`.
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
