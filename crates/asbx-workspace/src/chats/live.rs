//! Live chat turns as clients see them: the turns this process drives (or
//! just drove), and their SSE subscribers.
//!
//! A turn runs in its own task (`chats::driver`), independent of any HTTP
//! connection; it buffers its SSE frames here (`chats::frames`), so a
//! reconnecting client with `Last-Event-ID` misses nothing. Clients are
//! subscribers: when the last one goes away, the turn is cancelled after the
//! configured grace period (zero: at once).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::sse;
use futures::{Stream, StreamExt as _};
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::chats::frames::{Frame, Frames};
use crate::wire::{Done, TurnInfo};

/// Keep-alive comment interval on SSE streams.
pub(crate) const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The turns in flight (and recently settled) in this process.
#[derive(Debug, Default)]
pub(crate) struct TurnHub {
    turns: Mutex<HashMap<String, Arc<LiveTurn>>>,
}

impl TurnHub {
    pub(crate) fn insert(&self, turn: Arc<LiveTurn>) {
        if let Ok(mut map) = self.turns.lock() {
            map.insert(turn.id.clone(), turn);
        }
    }

    pub(crate) fn remove(&self, turn_id: &str) {
        if let Ok(mut map) = self.turns.lock() {
            map.remove(turn_id);
        }
    }

    /// The turn `turn_id`, if this process drives (or just drove) it.
    fn get(&self, turn_id: &str) -> Option<Arc<LiveTurn>> {
        self.turns.lock().ok()?.get(turn_id).cloned()
    }

    /// Cancels the turn `turn_id` if this process drives it now.
    pub(crate) fn cancel(&self, turn_id: &str) -> bool {
        let turn = self.get(turn_id).filter(|t| !t.is_done());
        turn.inspect(|t| t.cancel()).is_some()
    }

    /// Whether a turn of this process drives `turn_id` now.
    pub(crate) fn drives(&self, turn_id: &str) -> bool {
        self.get(turn_id).is_some_and(|t| !t.is_done())
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

    /// Completes once the turn is asked to stop.
    pub(crate) fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }

    pub(crate) fn is_done(&self) -> bool {
        self.frames.lock().map(|f| f.is_done()).unwrap_or(true)
    }

    /// Buffers a frame and wakes the subscribers.
    pub(crate) fn push(&self, frame: Frame) {
        if let Ok(mut f) = self.frames.lock() {
            f.push(frame);
        }
        self.version.send_modify(|v| *v += 1);
    }

    /// Settles the turn: subscribers get `done` after the last frame.
    pub(crate) fn finish(&self, done: Done) {
        if let Ok(mut f) = self.frames.lock() {
            f.finish(done);
        }
        self.version.send_modify(|v| *v += 1);
    }

    /// Frames after `cursor`, and the `done` payload once every frame is out.
    fn after(&self, cursor: u64) -> (Vec<Frame>, Option<Done>) {
        match self.frames.lock() {
            Ok(f) => f.after(cursor),
            Err(_) => (Vec::new(), None),
        }
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
