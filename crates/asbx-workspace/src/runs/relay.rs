//! The NDJSON relay: the runner's response body, chunk by chunk, to the client.
//!
//! Every dispatch speaks protocol 2 (docs/protocol.md §4). Beside the relay,
//! an [`OutcomeTap`] (`runs::tap`) reads each line to learn how the run
//! ended. The outcome is written once the upstream ends, before the client
//! sees the end of its stream, so a `GET /api/runs/{id}` after the stream is
//! over sees it. A stream that ends without a terminal line settles the run
//! as failed, never `running`, and the relay ends the stream with an `error`
//! line saying so (docs/protocol.md §9). A cancelled relay (a protocol 1
//! caller gone) asks the runner to end the session and reads its last
//! lines, so the run keeps the session's termination.

use std::sync::Arc;

use asbx_protocol::session::{EndReason, SessionStats, TerminatedBy, Termination};
use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;

use tokio_util::sync::CancellationToken;

use crate::AppState;
use crate::runs::dispatch;
use crate::runs::events::{self, Kept, Live};
use crate::runs::lease;
use crate::runs::store::Outcome;
use crate::runs::tap::{OutcomeTap, Tapped};

/// The termination of a run cancelled here whose runner did not say how
/// its session ended (it no longer had it, or did not answer in time): the
/// relay dropped the stream, so the runner ended it (a detach grace of 0).
fn cancelled_here() -> Termination {
    Termination {
        reason: EndReason::Terminated,
        terminated_by: TerminatedBy::Daemon,
        message: Some("the run was cancelled".to_owned()),
        exit_code: None,
        signal: None,
        stderr: None,
        stats: SessionStats::default(),
    }
}

/// Bytes of lines read ahead of the store: the relay stops reading the
/// runner's stream while this much waits, so a slow database slows the
/// runner down instead of filling memory. A store costs about the same
/// whatever its batch's size past [`events::KEEP_LINES`] lines (only the
/// newest are written), so this bounds the rate on a slow database: on
/// PostgreSQL, 65,536 lines (~10 MiB) gave ~400 k lines/s, 32 MiB ~800 k.
const MAX_UNSTORED_BYTES: usize = 32 << 20;

/// Starts relaying a run this node dispatched: a task reads the runner's
/// stream, stores every line (`run_events`), then publishes it on the run's
/// broadcast, and settles the run when the stream ends, before the
/// broadcast closes. The run's broadcast must have been opened
/// ([`RunHub::open`](crate::runs::events::RunHub::open)) before any reader
/// subscribed.
///
/// Reading and storing overlap: while one batch is being stored (one
/// transaction), the lines read meanwhile gather into the next, so a batch
/// is as large as the database is slow (up to [`MAX_UNSTORED_BYTES`]), and
/// each batch is published as one broadcast message once it is stored.
///
/// The relaying node holds the run's lease (`runs::takeover`) and renews
/// it while it reads; a relay that finds the lease taken (this node was cut
/// off long enough for another to take the run over) stops without
/// settling: the run is the other node's.
pub(crate) fn spawn(state: Arc<AppState>, run_id: String, live: Live, response: reqwest::Response) {
    tokio::spawn(async move {
        if let Err(e) = lease::hold(&state, &run_id).await {
            tracing::warn!(run = %run_id, error = %crate::error::error_chain(&e), "taking the run's lease failed");
        }
        relay(state, run_id, live, Some(response), Vec::new()).await;
    });
}

/// Relays a run this node took over (`runs::takeover`, its lease already
/// this node's): `stored` is what the run had stored (the tap reads it,
/// nothing is stored or published again), `response` the runner's replay
/// after it, `None` when the runner no longer has the session (the run
/// ends `runner_lost`).
pub(crate) fn spawn_resumed(
    state: Arc<AppState>,
    run_id: String,
    live: Live,
    response: Option<reqwest::Response>,
    stored: Vec<u8>,
) {
    tokio::spawn(relay(state, run_id, live, response, stored));
}

type Storing = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Relays one run: [`Relay::start`], [`Relay::read`] the runner's stream to
/// its end, then [`Relay::finish`] (settle the run, close its broadcast).
async fn relay(
    state: Arc<AppState>,
    run_id: String,
    live: Live,
    response: Option<reqwest::Response>,
    stored: Vec<u8>,
) {
    let mut relay = Relay::start(state, run_id, live, response, stored);
    relay.read().await;
    relay.finish().await;
}

/// One relay's state, from its start to the run's settling.
struct Relay {
    state: Arc<AppState>,
    run_id: String,
    live: Live,
    upstream: futures::stream::BoxStream<'static, reqwest::Result<Bytes>>,
    tap: OutcomeTap,
    /// Why the stream broke before the session's end, if it did.
    broken: Option<String>,
    cancelled: bool,
    /// Whether the runner's stream is still read.
    reading: bool,
    /// Another node holds the run now: it is not settled here.
    superseded: bool,
    renew: tokio::time::Interval,
    /// Lines read, waiting for the batch being stored.
    unstored: Vec<Tapped>,
    unstored_bytes: usize,
    /// The batch being stored, then published.
    storing: Option<Storing>,
    /// After a cancel the runner is asked to end the session; its last
    /// lines (`error`, `session_ended` with the termination) are still
    /// read until this deadline.
    wind_down: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl Relay {
    /// The relay before its first read: the lines stored before a takeover
    /// read into the tap (for the outcome and the last `seq`, not stored
    /// again), the lease's renewal timer started.
    fn start(
        state: Arc<AppState>,
        run_id: String,
        live: Live,
        response: Option<reqwest::Response>,
        stored: Vec<u8>,
    ) -> Relay {
        let gone = response.is_none();
        let upstream = match response {
            Some(r) => r.bytes_stream().boxed(),
            None => futures::stream::empty().boxed(),
        };
        let mut tap = OutcomeTap::relaying();
        drop(tap.observe_raw(&Bytes::from(stored)));
        let mut renew = tokio::time::interval(lease::renewal_every(&state));
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Relay {
            state,
            run_id,
            live,
            upstream,
            tap,
            broken: gone.then(|| "the runner no longer has the session".to_owned()),
            cancelled: false,
            reading: !gone,
            superseded: false,
            renew,
            unstored: Vec::new(),
            unstored_bytes: 0,
            storing: None,
            wind_down: None,
        }
    }

    /// Reads the runner's stream until it ends, the run is cancelled (and
    /// wound down) or the lease is lost, storing and publishing the lines
    /// read in batches, one being stored while the next gathers.
    async fn read(&mut self) {
        loop {
            if self.storing.is_none() && !self.unstored.is_empty() {
                let lines = std::mem::take(&mut self.unstored);
                self.unstored_bytes = 0;
                self.storing = Some(Box::pin(publish(
                    Arc::clone(&self.state),
                    self.run_id.clone(),
                    self.live.clone(),
                    lines,
                )));
            }
            if !self.reading {
                match self.storing.take() {
                    Some(s) => {
                        s.await;
                        continue;
                    }
                    None => break,
                }
            }
            tokio::select! {
                biased;
                _ = self.live.cancel.cancelled(), if !self.cancelled => {
                    self.drain().await;
                    self.cancelled = true;
                    if let Some(stop) = self.state.dispatcher.stops.get(&self.run_id) {
                        self.tap.end_errors_with(stop.code(), stop.message());
                    }
                    if dispatch::cancel_on_runner(&self.state, &self.run_id).await {
                        self.wind_down = Some(Box::pin(tokio::time::sleep(dispatch::CANCEL_WIND_DOWN)));
                    } else {
                        self.reading = false;
                    }
                }
                () = async {
                    if let Some(d) = self.wind_down.as_mut() {
                        d.await;
                    }
                }, if self.wind_down.is_some() => {
                    tracing::warn!(run = %self.run_id, "the runner did not end the cancelled session in time");
                    self.reading = false;
                }
                () = async {
                    match self.storing.as_mut() {
                        Some(s) => s.await,
                        None => std::future::pending().await,
                    }
                }, if self.storing.is_some() => self.storing = None,
                _ = self.renew.tick() => {
                    self.drain().await;
                    match lease::renew(&self.state, &self.run_id).await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::warn!(run = %self.run_id, "lost the run's lease; leaving the run to its new holder");
                            self.superseded = true;
                            self.reading = false;
                        }
                        Err(e) => tracing::warn!(run = %self.run_id, error = %e, "renewing the run's lease failed"),
                    }
                }
                chunk = self.upstream.next(), if self.unstored_bytes < MAX_UNSTORED_BYTES => {
                    self.on_chunk(chunk).await;
                }
            }
        }
    }

    /// Finishes storing the batch in flight, if any, before the relay
    /// awaits anything else: the batch's transaction holds SQLite's one
    /// write lock, and a lease renewal (or a cancel, or a re-attach that
    /// settles) awaited beside it while it is not polled waited for that
    /// lock until the busy timeout, then failed (the stall behind the
    /// `500`s of SQLite runs).
    async fn drain(&mut self) {
        if let Some(s) = self.storing.take() {
            s.await;
        }
    }

    /// One read of the runner's stream: a chunk for the tap, or its end
    /// (the session's, or a break: read on from the runner's resume log,
    /// from the line after the last one read).
    async fn on_chunk(&mut self, chunk: Option<reqwest::Result<Bytes>>) {
        match &chunk {
            Some(Ok(bytes)) => {
                self.unstored_bytes += bytes.len();
                self.unstored.extend(self.tap.observe_raw(bytes));
            }
            Some(Err(_)) | None if self.cancelled || self.tap.ended() => {
                if let Some(Err(e)) = &chunk {
                    self.broken = Some(crate::error::error_chain(&e));
                }
                self.reading = false;
            }
            Some(Err(_)) | None => {
                self.drain().await;
                match reattach(&self.state, &self.run_id, &self.live, &mut self.tap).await {
                    Reattached::Stream(r) => self.upstream = r.bytes_stream().boxed(),
                    Reattached::Cancelled => {
                        self.cancelled = true;
                        dispatch::cancel_on_runner(&self.state, &self.run_id).await;
                        self.reading = false;
                    }
                    Reattached::Superseded => {
                        self.superseded = true;
                        self.reading = false;
                    }
                    Reattached::Gone => {
                        if let Some(Err(e)) = &chunk {
                            self.broken = Some(crate::error::error_chain(&e));
                        }
                        self.reading = false;
                    }
                }
            }
        }
    }

    /// Settles the run once nothing more is read: its outcome and
    /// termination, a closing `error` line when the runner left the stream
    /// without its end (as a chat turn's does), published before the
    /// broadcast closes. A superseded run is left to its new holder.
    async fn finish(self) {
        let Relay {
            state,
            run_id,
            live,
            upstream,
            mut tap,
            broken,
            cancelled,
            superseded,
            ..
        } = self;
        // Not read any more: a sandbox that still runs (the relay gave up on
        // its runner, or a cancel it did not take) ends after its detach grace
        // (docs/protocol.md §4).
        drop(upstream);
        if superseded {
            state.run_hub.close(&run_id);
            return;
        }
        let mut rest = tap.finish_raw();
        // Stopped for a quota (`quota::enforce`): that is how it ended,
        // whatever the runner said of its cancel.
        let stopped = state.dispatcher.stops.take(&run_id).filter(|_| cancelled);
        let outcome = match (stopped, tap.terminal(), cancelled) {
            (Some(stop), _, _) => Outcome::Failed {
                code: stop.code().to_owned(),
                message: stop.message(),
            },
            (None, None, true) => Outcome::Failed {
                code: asbx_protocol::codes::CANCELLED.to_owned(),
                message: "the run was cancelled".to_owned(),
            },
            _ => tap.outcome(broken.as_deref()),
        };
        let termination = match tap.termination() {
            Some(t) => Some(t.clone()),
            None if cancelled && !tap.ended() => Some(cancelled_here()),
            None => None,
        };
        let ts = u64::try_from(state.now_ms()).unwrap_or(0);
        rest.extend(
            tap.closing_line(&outcome, &run_id, ts)
                .and_then(Tapped::own),
        );
        publish(Arc::clone(&state), run_id.clone(), live.clone(), rest).await;
        dispatch::settle_ended(&state, &run_id, &outcome, termination.as_ref()).await;
        state.run_hub.close(&run_id);
        events::announce_end(&state, &run_id).await;
    }
}

/// What re-attaching a broken stream gave.
enum Reattached {
    Stream(reqwest::Response),
    /// The run was cancelled meanwhile.
    Cancelled,
    /// Another node took the run over meanwhile.
    Superseded,
    /// The runner is gone, or no longer has the session.
    Gone,
}

/// The session's stream again after it broke before the session's end
/// (`runs::reattach`), from the line after the last one read.
async fn reattach(state: &AppState, run_id: &str, live: &Live, tap: &mut OutcomeTap) -> Reattached {
    tap.reattached();
    tokio::select! {
        r = crate::runs::reattach::resume(state, run_id, tap.last_seq()) => match r {
            Some(r) => Reattached::Stream(r),
            None => Reattached::Gone,
        },
        () = live.cancel.cancelled() => Reattached::Cancelled,
        () = lease::keep(state, run_id) => Reattached::Superseded,
    }
}

/// Stores `lines` (one transaction), then publishes them as one message.
async fn publish(state: Arc<AppState>, run_id: String, live: Live, lines: Vec<Tapped>) {
    if lines.is_empty() {
        return;
    }
    if let Err(e) = events::append(&state, &run_id, &lines).await {
        tracing::error!(run = run_id, error = %crate::error::error_chain(&e), "storing run lines failed");
    }
    let batch: Arc<[Kept]> = lines.into_iter().map(Kept::from).collect();
    // No receiver is fine: nobody is following right now.
    let _ = live.tx.send(batch);
}

/// Cancels the run's relay when dropped before [`CancelOnDrop::disarm`]: a
/// protocol 1 caller that goes away cancels its run, as it always did.
struct CancelOnDrop {
    cancel: Option<CancellationToken>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.cancel.take() {
            c.cancel();
        }
    }
}

fn with_newline(raw: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(raw.len() + 1);
    out.extend_from_slice(raw);
    out.extend_from_slice(b"\n");
    out.freeze()
}

/// The response body of a protocol 2 caller: the runner's lines as they
/// are, `seq` unchanged, each batch in one buffer.
pub(crate) fn protocol2_body(state: Arc<AppState>, run_id: String) -> Body {
    let batches = events::follow_batches(state, run_id, events::Start { after: 0 });
    Body::from_stream(batches.map(|b| match b {
        Ok(lines) => {
            let len = lines.iter().map(|k| k.raw.len() + 1).sum();
            let mut out = BytesMut::with_capacity(len);
            for k in &lines {
                out.extend_from_slice(&k.raw);
                out.extend_from_slice(b"\n");
            }
            Ok(out.freeze())
        }
        Err(e) => Err(std::io::Error::other(e.to_string())),
    }))
}

/// The response body of a protocol 1 caller: the lines of protocol 1's four
/// types, numbered 1, 2, 3... with no gap (docs/protocol.md §2); a line whose
/// `seq` already fits passes byte for byte. Dropping it before the end
/// cancels the run.
pub(crate) fn protocol1_body(state: Arc<AppState>, run_id: String, live: &Live) -> Body {
    let guard = CancelOnDrop {
        cancel: Some(live.cancel.clone()),
    };
    let lines = events::follow(state, run_id, events::Start { after: 0 });
    let stream = futures::stream::unfold(
        (Box::pin(lines), guard, 0u64),
        |(mut lines, mut guard, mut n)| async move {
            loop {
                match lines.next().await {
                    None => {
                        drop(guard.cancel.take());
                        return None;
                    }
                    Some(Err(e)) => {
                        drop(guard.cancel.take());
                        return Some((
                            Err(std::io::Error::other(e.to_string())),
                            (lines, guard, n),
                        ));
                    }
                    Some(Ok(k)) => {
                        let Ok(mut line) = asbx_protocol::decode::decode_line(&k.raw) else {
                            continue;
                        };
                        if !line.event.kind().in_protocol1() {
                            continue;
                        }
                        n += 1;
                        let bytes = if line.seq == n {
                            with_newline(&k.raw)
                        } else {
                            line.seq = n;
                            match serde_json::to_vec(&line) {
                                Ok(mut v) => {
                                    v.push(b'\n');
                                    Bytes::from(v)
                                }
                                Err(_) => continue,
                            }
                        };
                        return Some((Ok(bytes), (lines, guard, n)));
                    }
                }
            }
        },
    );
    Body::from_stream(stream)
}
