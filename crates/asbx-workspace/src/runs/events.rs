//! A run's lines, kept and replayed: `run_events` (one row per line, as the
//! runner sent it, ciphertext included) and [`RunHub`], the in-process
//! broadcast of the node that relays a run.
//!
//! Order of writes: the relay stores a line, then publishes it. A reader
//! subscribes first, then reads the table, then follows the broadcast,
//! skipping what it already has; so it sees every line once, with no gap
//! (docs/protocol.md §4, resume). A reader on another node (no local
//! broadcast) reads the table when the relaying node announces new lines
//! over PostgreSQL `NOTIFY` ([`crate::notify`]), with a slow safety poll
//! (`replay_safety_poll`); on SQLite it polls every [`POLL_INTERVAL`].
//!
//! Retention: the newest [`KEEP_LINES`] lines of each run. Older lines are
//! deleted as the run goes on and `runs.events_from` names the oldest kept
//! `seq`; asking for lines before it is `410`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use asbx_protocol::EventKind;
use bytes::Bytes;
use futures::{Stream, StreamExt as _};
use sqlx::{Any, Executor, Row as _};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::AppState;
use crate::error::WorkspaceError;
use crate::runs::store as runs;
use crate::runs::tap::Tapped;
use crate::wire::RunStatus;

/// Lines of one run kept for replay.
pub(crate) const KEEP_LINES: u64 = 10_000;
/// How often a reader without a local broadcast looks for new lines.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// Batches buffered per broadcast (one per store of the relay, so up to
/// hundreds of thousands of lines); a reader that falls further behind
/// reads the table instead.
const BROADCAST_CAPACITY: usize = 1024;
/// Most lines a follower hands on at once.
const MAX_BATCH: usize = 4096;
/// Rows read per query.
const PAGE: i64 = 500;

/// One kept line.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    pub(crate) seq: u64,
    pub(crate) kind: Option<EventKind>,
    pub(crate) raw: Bytes,
}

impl From<Tapped> for Kept {
    fn from(t: Tapped) -> Kept {
        Kept {
            seq: t.seq,
            kind: Some(t.kind),
            raw: t.raw,
        }
    }
}

/// A run this node relays: its broadcast (the lines of one store at a
/// time, in order) and what cancels its relay.
#[derive(Debug, Clone)]
pub(crate) struct Live {
    pub(crate) tx: broadcast::Sender<Arc<[Kept]>>,
    pub(crate) cancel: CancellationToken,
}

/// The runs this node relays, by run id. The lock is taken to open, join
/// and close a run's broadcast, never per line.
#[derive(Debug, Default)]
pub(crate) struct RunHub {
    live: Mutex<HashMap<String, Live>>,
}

impl RunHub {
    /// Opens the broadcast of a run this node is about to relay.
    pub(crate) fn open(&self, run_id: &str) -> Live {
        let (tx, _) = broadcast::channel(BROADCAST_CAPACITY);
        let live = Live {
            tx,
            cancel: CancellationToken::new(),
        };
        self.lock().insert(run_id.to_owned(), live.clone());
        live
    }

    /// Whether this node relays the run.
    pub(crate) fn relays(&self, run_id: &str) -> bool {
        self.lock().contains_key(run_id)
    }

    /// Cancels a run relayed here; `false` when this node does not relay it.
    pub(crate) fn cancel(&self, run_id: &str) -> bool {
        match self.lock().get(run_id) {
            Some(live) => {
                live.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// Closes it: readers drain what is buffered, then see the end.
    pub(crate) fn close(&self, run_id: &str) {
        self.lock().remove(run_id);
    }

    fn subscribe(&self, run_id: &str) -> Option<broadcast::Receiver<Arc<[Kept]>>> {
        self.lock().get(run_id).map(|l| l.tx.subscribe())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Rows per `INSERT`: 3 binds each stays far below SQLite's and
/// PostgreSQL's limits on bound parameters.
const INSERT_ROWS: usize = 500;

/// Stores lines of a run in one transaction (one statement per
/// [`INSERT_ROWS`]) and drops the ones past [`KEEP_LINES`] each time the
/// run's `seq` crosses a multiple of 1,000, so between [`KEEP_LINES`] and
/// [`KEEP_LINES`] + 1,000 are kept; then announces them.
pub(crate) async fn append(
    state: &AppState,
    run_id: &str,
    lines: &[Tapped],
) -> Result<(), WorkspaceError> {
    let rows: Vec<(u64, &[u8])> = lines.iter().map(|t| (t.seq, &t.raw[..])).collect();
    append_rows(state, run_id, &rows).await
}

/// [`append`] for lines already split out: `(seq, line without newline)`.
pub(crate) async fn append_rows(
    state: &AppState,
    run_id: &str,
    rows: &[(u64, &[u8])],
) -> Result<(), WorkspaceError> {
    let mut tx = crate::store::begin_write(state.store.pool()).await?;
    append_rows_on(&mut tx, run_id, rows).await?;
    tx.commit().await?;
    state.notifier.announce(state.store.pool(), run_id).await;
    crate::audit::tools::record(state, run_id, rows).await;
    Ok(())
}

/// [`append_rows`] inside the caller's transaction `conn`, without the
/// announcement (the caller announces once it committed). Lines that the
/// same call would drop again (a batch longer than [`KEEP_LINES`]) are not
/// written at all: inside one transaction nobody could tell.
pub(crate) async fn append_rows_on(
    conn: &mut sqlx::AnyConnection,
    run_id: &str,
    rows: &[(u64, &[u8])],
) -> Result<(), WorkspaceError> {
    let backend = crate::store::Backend::of(conn);
    let from = prune_from(rows);
    let keep = |r: &&(u64, &[u8])| from.is_none_or(|f| r.0 >= f);
    let kept: Vec<(u64, &[u8])>;
    let rows_to_write = if from.is_some() && rows.iter().any(|r| !keep(&r)) {
        kept = rows.iter().filter(keep).copied().collect();
        &kept[..]
    } else {
        rows
    };
    for batch in rows_to_write.chunks(INSERT_ROWS) {
        insert(&mut *conn, backend, run_id, batch).await?;
    }
    if let Some(from) = from {
        prune(conn, run_id, from).await?;
    }
    Ok(())
}

/// The first `seq` to keep when storing `rows` crosses a multiple of 1,000
/// past [`KEEP_LINES`].
fn prune_from(rows: &[(u64, &[u8])]) -> Option<u64> {
    let first = rows.iter().map(|r| r.0).min()?;
    let last = rows.iter().map(|r| r.0).max()?;
    (last > KEEP_LINES && last / 1000 != first.saturating_sub(1) / 1000)
        .then(|| last + 1 - KEEP_LINES)
}

/// One multi-row `INSERT` ([`crate::store::push_values`]).
async fn insert<'c, E>(
    db: E,
    backend: crate::store::Backend,
    run_id: &str,
    rows: &[(u64, &[u8])],
) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let mut sql = String::with_capacity(96 + rows.len() * 20);
    sql.push_str("INSERT INTO run_events (run_id, seq, line) VALUES ");
    crate::store::push_values(&mut sql, backend, rows.len(), 3);
    // A runner never repeats a seq; a repeated one is not stored twice.
    sql.push_str(" ON CONFLICT (run_id, seq) DO NOTHING");
    let mut q = sqlx::query(&sql);
    for (seq, raw) in rows {
        q = q.bind(run_id).bind(i64::try_from(*seq).unwrap_or(i64::MAX));
        // Lines the tap read are JSON, so UTF-8: borrowed, not copied.
        q = match std::str::from_utf8(raw) {
            Ok(text) => q.bind(text),
            Err(_) => q.bind(String::from_utf8_lossy(raw).into_owned()),
        };
    }
    q.execute(db).await?;
    Ok(())
}

/// Drops the lines before `from`; on a transaction (both statements or none).
/// The `DELETE` starts at the run's previous `events_from` (nothing below
/// it is left): on PostgreSQL the deleted rows stay in the index until a
/// vacuum, and a scan from the run's first `seq` walked all of them on
/// every prune, so a long run's prunes grew with its length.
async fn prune(
    tx: &mut sqlx::AnyConnection,
    run_id: &str,
    from: u64,
) -> Result<(), WorkspaceError> {
    let from = i64::try_from(from).unwrap_or(i64::MAX);
    let before: i64 = sqlx::query_scalar("SELECT events_from FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_optional(&mut *tx)
        .await?
        .unwrap_or(0);
    sqlx::query("UPDATE runs SET events_from = $1 WHERE id = $2 AND events_from < $1")
        .bind(from)
        .bind(run_id)
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM run_events WHERE run_id = $1 AND seq >= $2 AND seq < $3")
        .bind(run_id)
        .bind(before)
        .bind(from)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Every kept line of a run, newline-terminated, and the last `seq`.
pub(crate) async fn stored(
    pool: &sqlx::AnyPool,
    run_id: &str,
) -> Result<(Vec<u8>, u64), WorkspaceError> {
    let (mut out, mut last) = (Vec::new(), 0u64);
    loop {
        let page = after(pool, run_id, last).await?;
        let full = page.len() as i64 >= PAGE;
        for k in page {
            out.extend_from_slice(&k.raw);
            out.push(b'\n');
            last = k.seq;
        }
        if !full {
            return Ok((out, last));
        }
    }
}

async fn after<'c, E>(db: E, run_id: &str, after: u64) -> Result<Vec<Kept>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let rows = sqlx::query(
        "SELECT seq, line FROM run_events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
    )
    .bind(run_id)
    .bind(i64::try_from(after).unwrap_or(i64::MAX))
    .bind(PAGE)
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| {
            let seq: i64 = r.try_get("seq")?;
            let line: String = r.try_get("line")?;
            Ok(Kept {
                seq: u64::try_from(seq).unwrap_or(0),
                kind: None,
                raw: Bytes::from(line),
            })
        })
        .collect()
}

/// Where a replay starts, checked against what is kept.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start {
    pub(crate) after: u64,
}

/// Checks that lines after `after` are still kept: `Gone` naming the oldest
/// kept `seq` otherwise.
pub(crate) fn check_kept(run: &runs::RunRow, after: u64) -> Result<Start, WorkspaceError> {
    let oldest = u64::try_from(run.events_from).unwrap_or(0);
    if oldest > 1 && after.saturating_add(1) < oldest {
        return Err(WorkspaceError::EventsGone {
            run_id: run.id.clone(),
            oldest,
        });
    }
    Ok(Start { after })
}

/// Whether `page` does not start right after `last`: lines in between
/// were never kept, or were pruned while this reader was between reads
/// ([`check_kept`] tells which).
fn skips(page: &[Kept], last: u64) -> bool {
    page.first().is_some_and(|k| k.seq > last.saturating_add(1))
}

enum Phase {
    Replay,
    Live(broadcast::Receiver<Arc<[Kept]>>),
    Poll,
    Done,
}

struct Follow {
    state: Arc<AppState>,
    run_id: String,
    last: u64,
    phase: Phase,
    /// Subscribed before the first read: lines published after it are seen.
    rx: Option<broadcast::Receiver<Arc<[Kept]>>>,
    /// Other nodes' announcements (PostgreSQL), also subscribed before the
    /// first read.
    announced: Option<broadcast::Receiver<Arc<str>>>,
    /// When the poll last asked whether somebody still relays the run.
    lost_checked: std::time::Instant,
}

/// How often a follower without a local broadcast checks that the run is
/// still relayed by somebody (`runs::lost`).
const LOST_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// Tells the followers on every node that a run has ended (its row is
/// settled), so they stop without waiting for a poll.
pub(crate) async fn announce_end(state: &AppState, run_id: &str) {
    state.notifier.announce(state.store.pool(), run_id).await;
}

/// Every line of `run_id` after `from`, then the live tail until the run
/// ends, one line at a time: [`follow_batches`] flattened.
pub(crate) fn follow(
    state: Arc<AppState>,
    run_id: String,
    from: Start,
) -> impl Stream<Item = Result<Kept, WorkspaceError>> + Send + 'static {
    follow_batches(state, run_id, from).flat_map(|batch| {
        futures::stream::iter(match batch {
            Ok(lines) => lines.into_iter().map(Ok).collect::<Vec<_>>(),
            Err(e) => vec![Err(e)],
        })
    })
}

/// Every line of `run_id` after `from`, then the live tail until the run
/// ends: from the local broadcast when this node relays it, else by polling
/// the table. Ends when the run has ended and every line was given. Lines
/// come in batches (a page of the table, or what the relay stored at once),
/// never empty, in `seq` order. Lines pruned from the table before this
/// reader read them, but published after it subscribed, come from the
/// broadcast (which holds [`BROADCAST_CAPACITY`] batches): so the caller
/// that started a run gets every line however fast the run. A reader that
/// fell so far behind that the lines it missed are in neither gets
/// [`WorkspaceError::EventsGone`] (a client resuming from its last line
/// then gets `410`), never a gap.
pub(crate) fn follow_batches(
    state: Arc<AppState>,
    run_id: String,
    from: Start,
) -> impl Stream<Item = Result<Vec<Kept>, WorkspaceError>> + Send + 'static {
    let rx = state.run_hub.subscribe(&run_id);
    let announced = state.notifier.subscribe();
    let f = Follow {
        state,
        run_id,
        last: from.after,
        phase: Phase::Replay,
        rx,
        announced,
        lost_checked: std::time::Instant::now(),
    };
    futures::stream::try_unfold(f, |mut f| async move {
        loop {
            let batch = match std::mem::replace(&mut f.phase, Phase::Done) {
                Phase::Done => return Ok(None),
                Phase::Replay => f.replay().await?,
                Phase::Live(rx) => f.live(rx).await?,
                Phase::Poll => f.poll().await?,
            };
            if let Some(batch) = batch {
                return Ok(Some((batch, f)));
            }
        }
    })
}

/// The stages of [`follow_batches`]: each reads what its phase reads, sets
/// the next phase, and returns the batch to hand on, if any.
impl Follow {
    /// A page of the table after the last line given.
    async fn replay(&mut self) -> Result<Option<Vec<Kept>>, WorkspaceError> {
        let page = after(self.state.store.pool(), &self.run_id, self.last).await?;
        // A page that goes on from the last line lost nothing, even if a
        // prune moved `events_from` past it since (the page was read first).
        // One that skips is checked: read after the page, `events_from`
        // already names a prune that removed what the page lacks (a prune
        // moves it and deletes in one transaction).
        if skips(&page, self.last)
            && let Some(run) = runs::get(self.state.store.pool(), &self.run_id).await?
            && let Err(gone) = check_kept(&run, self.last)
        {
            // Pruned from the table, but perhaps published after this
            // reader subscribed (a run faster than its reader): then the
            // broadcast still holds it. Live checks what it gets for the
            // same gap.
            return match self.rx.take() {
                Some(rx) => {
                    self.phase = Phase::Live(rx);
                    Ok(None)
                }
                None => Err(gone),
            };
        }
        let full = page.len() as i64 >= PAGE;
        self.phase = if full {
            Phase::Replay
        } else {
            match self.rx.take() {
                Some(rx) => Phase::Live(rx),
                None => Phase::Poll,
            }
        };
        Ok(self.hand_on(page))
    }

    /// What the local broadcast has after the last line given: at least one
    /// batch (waiting for it), and what else is there already, up to
    /// [`MAX_BATCH`] lines.
    async fn live(
        &mut self,
        mut rx: broadcast::Receiver<Arc<[Kept]>>,
    ) -> Result<Option<Vec<Kept>>, WorkspaceError> {
        let from = self.last;
        let mut out: Vec<Kept> = Vec::new();
        let mut next = rx.recv().await;
        loop {
            match next {
                Ok(batch) => {
                    let last = self.last;
                    out.extend(batch.iter().filter(|k| k.seq > last).cloned());
                    if let Some(k) = out.last() {
                        self.last = k.seq;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // Fell behind: what was missed is in the table, or was
                    // pruned (the replay tells).
                    self.rx = Some(rx);
                    self.phase = Phase::Replay;
                    break;
                }
                Err(broadcast::error::RecvError::Closed) => {
                    // The relay stored everything before closing.
                    self.phase = Phase::Replay;
                    break;
                }
            }
            // Take what else is there already, up to a bound.
            if out.len() >= MAX_BATCH {
                self.phase = Phase::Live(rx);
                break;
            }
            next = match rx.try_recv() {
                Ok(b) => Ok(b),
                Err(broadcast::error::TryRecvError::Lagged(n)) => {
                    Err(broadcast::error::RecvError::Lagged(n))
                }
                Err(broadcast::error::TryRecvError::Closed) => {
                    Err(broadcast::error::RecvError::Closed)
                }
                Err(broadcast::error::TryRecvError::Empty) => {
                    self.phase = Phase::Live(rx);
                    break;
                }
            };
        }
        // Lines between the reader's last and the broadcast's first were
        // published before it subscribed: in the table, unless pruned since
        // (then `events_gone`).
        if skips(&out, from)
            && let Some(run) = runs::get(self.state.store.pool(), &self.run_id).await?
        {
            check_kept(&run, from)?;
        }
        Ok((!out.is_empty()).then_some(out))
    }

    /// The table's new lines, for a reader without a local broadcast; when
    /// there are none, whether the run still runs (and every
    /// [`LOST_CHECK_INTERVAL`], whether somebody still relays it), then a
    /// wait for another node's announcement or the next poll.
    async fn poll(&mut self) -> Result<Option<Vec<Kept>>, WorkspaceError> {
        let page = after(self.state.store.pool(), &self.run_id, self.last).await?;
        if skips(&page, self.last)
            && let Some(run) = runs::get(self.state.store.pool(), &self.run_id).await?
        {
            // Polled too seldom for a fast run: pruned past us.
            check_kept(&run, self.last)?;
        }
        if !page.is_empty() {
            self.phase = Phase::Poll;
            return Ok(self.hand_on(page));
        }
        let run = runs::get(self.state.store.pool(), &self.run_id).await?;
        let mut running = run.as_ref().is_some_and(|r| r.status == RunStatus::Running);
        // Every 10 s or so, check that somebody still relays it.
        if running
            && self.lost_checked.elapsed() >= LOST_CHECK_INTERVAL
            && let Some(r) = &run
        {
            self.lost_checked = std::time::Instant::now();
            running = !crate::runs::lost::settle_if_lost(&self.state, r).await;
        }
        if !running {
            // One last look: lines stored just before it ended.
            let page = after(self.state.store.pool(), &self.run_id, self.last).await?;
            self.phase = Phase::Done;
            return Ok(self.hand_on(page));
        }
        match self.announced.as_mut() {
            Some(rx) => {
                let _ = tokio::time::timeout(
                    self.state.config.replay_safety_poll,
                    crate::notify::announced(rx, &self.run_id),
                )
                .await;
            }
            None => tokio::time::sleep(POLL_INTERVAL).await,
        }
        self.phase = Phase::Poll;
        Ok(None)
    }

    /// `page` to hand on, the last line given moved to its end; `None` when
    /// it is empty.
    fn hand_on(&mut self, page: Vec<Kept>) -> Option<Vec<Kept>> {
        self.last = page.last()?.seq;
        Some(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::RunKind;

    fn kept(seqs: &[u64]) -> Vec<Kept> {
        seqs.iter()
            .map(|&seq| Kept {
                seq,
                kind: None,
                raw: Bytes::new(),
            })
            .collect()
    }

    fn run(events_from: i64) -> runs::RunRow {
        runs::RunRow {
            id: "r".into(),
            workspace_id: "w".into(),
            kind: RunKind::Run,
            chat_id: None,
            agent_id: None,
            status: RunStatus::Running,
            prompt: String::new(),
            model: String::new(),
            env_json: String::new(),
            env_secrets: None,
            config_json: String::new(),
            result: None,
            error_code: None,
            error_message: None,
            created_at: 0,
            ended_at: None,
            termination: None,
            sandbox_url: None,
            events_from,
        }
    }

    /// Stores `seqs` as one batch of the relay, then publishes it.
    async fn relay_batch(state: &AppState, live: &Live, seqs: std::ops::RangeInclusive<u64>) {
        let lines: Vec<Tapped> = seqs
            .map(|seq| Tapped {
                seq,
                kind: EventKind::Delta,
                raw: Bytes::from(format!(r#"{{"seq":{seq},"type":"delta","text":"w"}}"#)),
                line: None,
            })
            .collect();
        append(state, "run-1", &lines).await.unwrap();
        live.tx
            .send(lines.into_iter().map(Kept::from).collect())
            .unwrap();
    }

    /// A run faster than its reader: by the time the reader reads the
    /// table, a prune removed lines it has not had. Those published after
    /// it subscribed are still in the broadcast, so it gets every line; a
    /// reader that subscribed after them gets `events_gone`, never a gap.
    #[tokio::test]
    async fn a_reader_behind_a_prune_gets_from_the_broadcast_what_it_subscribed_to() {
        let dir = tempfile::tempdir().unwrap();
        let config =
            crate::WorkspaceConfig::new(dir.path(), url::Url::parse("http://127.0.0.1/").unwrap());
        let ws = crate::Workspace::open(config).await.unwrap();
        let state = Arc::clone(&ws.state);
        let new = runs::NewRun {
            id: "run-1",
            workspace_id: crate::DEFAULT_WORKSPACE,
            kind: RunKind::Run,
            chat_id: None,
            agent_id: None,
            prompt: "go",
            model: "m",
            env_json: "{}",
            env_secrets: None,
            config_json: "{}",
            sandbox_url: "http://127.0.0.1/",
            workdir_from: None,
            now_ms: 0,
        };
        runs::insert(state.store.pool(), &new).await.unwrap();
        let live = state.run_hub.open("run-1");
        let early = follow_batches(Arc::clone(&state), "run-1".into(), Start { after: 0 });
        relay_batch(&state, &live, 1..=1_000).await;
        // Crosses 11,000: the newest 10,000 are kept, 1..=1,500 are not.
        relay_batch(&state, &live, 1_001..=11_500).await;
        let run = runs::get(state.store.pool(), "run-1")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(run.events_from, 1_501, "the table was pruned");
        let late = follow_batches(Arc::clone(&state), "run-1".into(), Start { after: 0 });
        drop(live);
        state.run_hub.close("run-1");

        let mut early = std::pin::pin!(early);
        let mut seqs = Vec::new();
        while seqs.len() < 11_500 {
            let batch = tokio::time::timeout(Duration::from_secs(10), early.next())
                .await
                .expect("the early reader is not stuck")
                .expect("the early reader goes on")
                .expect("the early reader lost nothing");
            seqs.extend(batch.iter().map(|k| k.seq));
        }
        assert!(seqs.iter().copied().eq(1..=11_500), "every line, in order");

        let mut late = std::pin::pin!(late);
        let first = tokio::time::timeout(Duration::from_secs(10), late.next())
            .await
            .expect("the late reader is not stuck")
            .expect("the late reader gets an answer");
        assert!(
            matches!(first, Err(WorkspaceError::EventsGone { oldest: 1_501, .. })),
            "{first:?}"
        );
    }

    /// A page that does not go on from the reader's last line is checked
    /// against what is kept: pruned past the reader is `events_gone`, a
    /// hole that was never kept (nothing pruned there) is not.
    #[test]
    fn a_page_past_a_prune_is_gone_and_an_unpruned_hole_is_not() {
        assert!(!skips(&kept(&[3, 4]), 2));
        assert!(!skips(&kept(&[]), 2));
        assert!(skips(&kept(&[5, 6]), 2));
        // Pruned up to 5 while the reader was at 2: lines 3 and 4 are gone.
        assert!(matches!(
            check_kept(&run(5), 2),
            Err(WorkspaceError::EventsGone { oldest: 5, .. })
        ));
        // Nothing pruned (or pruned only below the reader): go on.
        assert!(check_kept(&run(1), 2).is_ok());
        assert!(check_kept(&run(3), 2).is_ok());
    }
}
