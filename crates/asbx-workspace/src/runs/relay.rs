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

async fn relay(
    state: Arc<AppState>,
    run_id: String,
    live: Live,
    response: Option<reqwest::Response>,
    stored: Vec<u8>,
) {
    let gone = response.is_none();
    let mut upstream = match response {
        Some(r) => r.bytes_stream().boxed(),
        None => futures::stream::empty().boxed(),
    };
    let mut tap = OutcomeTap::relaying();
    // Lines stored before a takeover: read for the outcome and the last
    // `seq`, not stored again.
    drop(tap.observe_raw(&Bytes::from(stored)));
    let mut broken = gone.then(|| "the runner no longer has the session".to_owned());
    let mut cancelled = false;
    let mut reading = !gone;
    let mut superseded = false;
    let mut renew = tokio::time::interval(lease::renewal_every(&state));
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut unstored: Vec<Tapped> = Vec::new();
    let mut unstored_bytes = 0usize;
    let mut storing: Option<Storing> = None;
    // After a cancel the runner is asked to end the session; its last lines
    // (`error`, `session_ended` with the termination) are still read until
    // this deadline.
    let mut wind_down: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        if storing.is_none() && !unstored.is_empty() {
            let lines = std::mem::take(&mut unstored);
            unstored_bytes = 0;
            storing = Some(Box::pin(publish(
                Arc::clone(&state),
                run_id.clone(),
                live.clone(),
                lines,
            )));
        }
        if !reading {
            match storing.take() {
                Some(s) => {
                    s.await;
                    continue;
                }
                None => break,
            }
        }
        tokio::select! {
            biased;
            _ = live.cancel.cancelled(), if !cancelled => {
                cancelled = true;
                if let Some(stop) = state.dispatcher.stops.get(&run_id) {
                    tap.end_errors_with(stop.code(), stop.message());
                }
                if dispatch::cancel_on_runner(&state, &run_id).await {
                    wind_down = Some(Box::pin(tokio::time::sleep(dispatch::CANCEL_WIND_DOWN)));
                } else {
                    reading = false;
                }
            }
            () = async {
                if let Some(d) = wind_down.as_mut() {
                    d.await;
                }
            }, if wind_down.is_some() => {
                tracing::warn!(run = %run_id, "the runner did not end the cancelled session in time");
                reading = false;
            }
            () = async {
                match storing.as_mut() {
                    Some(s) => s.await,
                    None => std::future::pending().await,
                }
            }, if storing.is_some() => storing = None,
            _ = renew.tick() => match lease::renew(&state, &run_id).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(run = %run_id, "lost the run's lease; leaving the run to its new holder");
                    superseded = true;
                    reading = false;
                }
                Err(e) => tracing::warn!(run = %run_id, error = %e, "renewing the run's lease failed"),
            },
            chunk = upstream.next(), if unstored_bytes < MAX_UNSTORED_BYTES => match &chunk {
                Some(Ok(bytes)) => {
                    unstored_bytes += bytes.len();
                    unstored.extend(tap.observe_raw(bytes));
                }
                Some(Err(_)) | None if cancelled || tap.ended() => {
                    if let Some(Err(e)) = &chunk {
                        broken = Some(crate::error::error_chain(&e));
                    }
                    reading = false;
                }
                // Broken before the session's end: read on from the runner's
                // resume log, from the line after the last one read.
                Some(Err(_)) | None => match reattach(&state, &run_id, &live, &mut tap).await {
                    Reattached::Stream(r) => upstream = r.bytes_stream().boxed(),
                    Reattached::Cancelled => {
                        cancelled = true;
                        dispatch::cancel_on_runner(&state, &run_id).await;
                        reading = false;
                    }
                    Reattached::Superseded => {
                        superseded = true;
                        reading = false;
                    }
                    Reattached::Gone => {
                        if let Some(Err(e)) = &chunk {
                            broken = Some(crate::error::error_chain(&e));
                        }
                        reading = false;
                    }
                },
            },
        }
    }
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
    // A stream the runner left without its end (it died, or was cut off)
    // ends with an `error` line all the same, as a chat turn's does.
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
