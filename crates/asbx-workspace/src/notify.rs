//! Wake-ups across workspace nodes: PostgreSQL `LISTEN/NOTIFY`.
//!
//! Workspace nodes sharing one PostgreSQL learn that another node stored a
//! run's lines (or settled the run) from a notification on
//! [`RUN_EVENTS_CHANNEL`] whose payload is the run id, instead of polling
//! the table every half second. One task per node holds a listening
//! connection and fans the payloads out in process ([`Notifier::subscribe`]);
//! a follower still reads the table itself, so a notification only says
//! "look now". Notifications are transient (one sent while the listening
//! connection was down is lost), so followers keep a slow safety poll.
//!
//! On SQLite (one node) there is nothing to listen to: [`Notifier`] is off
//! and followers on the relaying node use its in-process broadcast.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::error::WorkspaceError;

/// The channel a run's new lines and its end are announced on.
pub(crate) const RUN_EVENTS_CHANNEL: &str = "asbx_run_events";
/// Payloads buffered for local followers; one that falls further behind
/// reads the table, as it would after any missed wake-up.
const FANOUT_CAPACITY: usize = 4096;
/// How long the listener waits before reconnecting after an error.
const RECONNECT_BACKOFF: Duration = Duration::from_secs(1);

/// This node's listening connection and the in-process fan-out of what it
/// hears. Off on SQLite.
#[derive(Debug)]
pub(crate) struct Notifier {
    tx: Option<broadcast::Sender<Arc<str>>>,
    task: Option<JoinHandle<()>>,
}

impl Notifier {
    /// No cross-node notifications (SQLite).
    pub(crate) fn off() -> Notifier {
        Notifier {
            tx: None,
            task: None,
        }
    }

    /// Listens on [`RUN_EVENTS_CHANNEL`] over its own connection to `url`.
    /// Fails when the first connection can't be made; later losses are
    /// reconnected by themselves.
    pub(crate) async fn listen(url: &str) -> Result<Notifier, WorkspaceError> {
        let mut listener = PgListener::connect(url).await?;
        listener.listen(RUN_EVENTS_CHANNEL).await?;
        let (tx, _) = broadcast::channel(FANOUT_CAPACITY);
        let fanout = tx.clone();
        let task = tokio::spawn(async move {
            loop {
                match listener.recv().await {
                    Ok(n) => {
                        // No local follower is fine.
                        let _ = fanout.send(Arc::from(n.payload()));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "listening for run notifications failed; reconnecting");
                        tokio::time::sleep(RECONNECT_BACKOFF).await;
                    }
                }
            }
        });
        Ok(Notifier {
            tx: Some(tx),
            task: Some(task),
        })
    }

    /// The run ids other nodes (and this one) announce; `None` when off.
    pub(crate) fn subscribe(&self) -> Option<broadcast::Receiver<Arc<str>>> {
        self.tx.as_ref().map(broadcast::Sender::subscribe)
    }

    /// Announces that `run_id` has new lines or has ended. Best effort: a
    /// failure only delays followers until their safety poll.
    pub(crate) async fn announce(&self, pool: &sqlx::AnyPool, run_id: &str) {
        if self.tx.is_none() {
            return;
        }
        let sent = sqlx::query("SELECT pg_notify($1, $2)")
            .bind(RUN_EVENTS_CHANNEL)
            .bind(run_id)
            .execute(pool)
            .await;
        if let Err(e) = sent {
            tracing::warn!(run = run_id, error = %e, "announcing run lines failed");
        }
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Waits until `run_id` is announced on `rx` (or announcements were missed,
/// which may have included it). Never returns when `rx` is closed; callers
/// race it against their safety poll.
pub(crate) async fn announced(rx: &mut broadcast::Receiver<Arc<str>>, run_id: &str) {
    loop {
        match rx.recv().await {
            Ok(id) if &*id == run_id => return,
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}
