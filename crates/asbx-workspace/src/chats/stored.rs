//! A live turn's lines on their way to the store: every line but
//! heartbeats is stored (`run_events`, batched), so any node can replay the
//! turn (`chats::remote`) or take it over (`chats::lease::takeover`). A
//! batch is stored every [`STORE_EVERY`] or once [`STORE_BATCH`] lines wait;
//! the lines still pending when the turn ends are stored with its end, in
//! one transaction (`chats::driver`).

use std::sync::Arc;
use std::time::Duration;

use crate::AppState;

/// How often a turn's new lines are stored at the latest.
const STORE_EVERY: Duration = Duration::from_millis(100);
/// Lines stored in one go at the most.
const STORE_BATCH: usize = 256;
/// Lines kept waiting for the database at the most.
const STORE_PENDING_MAX: usize = 50_000;

/// A turn's lines not yet stored: `(seq, the line's JSON)`.
#[derive(Default)]
pub(crate) struct StoredLines {
    rows: Vec<(u64, Arc<str>)>,
}

impl StoredLines {
    /// When to store what is pending. The first store is due
    /// [`STORE_EVERY`] after the start, not at once: an immediate tick
    /// stored the turn's first lines in a commit of their own while the
    /// relay waited (about 2 ms on PostgreSQL, an fsync).
    pub(crate) fn schedule() -> tokio::time::Interval {
        let mut flush =
            tokio::time::interval_at(tokio::time::Instant::now() + STORE_EVERY, STORE_EVERY);
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        flush
    }

    pub(crate) fn push(&mut self, seq: u64, line: Arc<str>) {
        self.rows.push((seq, line));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub(crate) fn is_full(&self) -> bool {
        self.rows.len() >= STORE_BATCH
    }

    /// The pending lines, oldest first.
    pub(crate) fn rows(&self) -> &[(u64, Arc<str>)] {
        &self.rows
    }

    /// Forgets the pending lines: stored by the caller.
    pub(crate) fn clear(&mut self) {
        self.rows.clear();
    }

    /// Stores what is pending. On a failure (the database is unreachable)
    /// the lines stay pending for the next try; past [`STORE_PENDING_MAX`]
    /// the oldest are given up, logged.
    pub(crate) async fn flush(&mut self, state: &AppState, run_id: &str) {
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
