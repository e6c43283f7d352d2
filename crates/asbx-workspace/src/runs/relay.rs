//! The NDJSON relay: the runner's response body, chunk by chunk, to the client.
//!
//! Bytes pass through unchanged and are flushed per chunk. Beside the relay,
//! an [`OutcomeTap`] decodes the lines (CPU only, never awaiting) to learn how
//! the run ended; the outcome is written once the upstream ends, before the
//! client sees the end of its stream, so a `GET /api/runs/{id}` after the
//! stream is over sees it. If the client goes away first, dropping the body
//! drops the upstream request, which cancels the sandbox, and a guard records
//! the run as cancelled.

use std::sync::Arc;

use asbx_protocol::{Event, Line, LineDecoder};
use axum::body::Body;
use bytes::Bytes;
use futures::{Stream, StreamExt as _};

use crate::AppState;
use crate::runs::dispatch;
use crate::runs::store::Outcome;

/// Learns a run's outcome from its lines.
#[derive(Debug, Default)]
pub(crate) struct OutcomeTap {
    decoder: LineDecoder,
    terminal: Option<Outcome>,
    bad_lines: u64,
}

impl OutcomeTap {
    /// Feeds a chunk; returns the lines it completed.
    pub(crate) fn observe(&mut self, chunk: &[u8]) -> Vec<Line> {
        let decoded = self.decoder.push(chunk);
        self.take(decoded)
    }

    /// Ends the input; returns a trailing line without newline, if any.
    pub(crate) fn finish_input(&mut self) -> Vec<Line> {
        let decoded = self.decoder.finish().into_iter().collect();
        self.take(decoded)
    }

    fn take(&mut self, decoded: Vec<Result<Line, asbx_protocol::DecodeError>>) -> Vec<Line> {
        let mut lines = Vec::with_capacity(decoded.len());
        for item in decoded {
            match item {
                Ok(line) => {
                    if self.terminal.is_none() {
                        self.terminal = match &line.event {
                            Event::Result(r) => Some(Outcome::Succeeded {
                                message: r.message.clone(),
                            }),
                            Event::Error(e) => Some(Outcome::Failed {
                                code: e.code.clone(),
                                message: e.message.clone(),
                            }),
                            _ => None,
                        };
                    }
                    lines.push(line);
                }
                Err(e) => {
                    self.bad_lines += 1;
                    tracing::warn!(error = %e, "undecodable line from the runner");
                }
            }
        }
        lines
    }

    /// The terminal line's outcome, if one was seen.
    pub(crate) fn terminal(&self) -> Option<&Outcome> {
        self.terminal.as_ref()
    }

    /// The outcome once the upstream stream has ended (cleanly or not).
    pub(crate) fn outcome(&self, upstream_error: Option<&str>) -> Outcome {
        match (&self.terminal, upstream_error) {
            (Some(o), _) => o.clone(),
            (None, Some(e)) => Outcome::Failed {
                code: crate::error::ProblemCode::UpstreamFailed
                    .as_str()
                    .to_owned(),
                message: format!("the runner's stream broke: {e}"),
            },
            (None, None) => Outcome::Failed {
                code: crate::error::ProblemCode::UpstreamFailed
                    .as_str()
                    .to_owned(),
                message: "the runner's stream ended without a result or error line".to_owned(),
            },
        }
    }
}

/// Settles the run as cancelled if dropped before [`SettleGuard::disarm`].
pub(crate) struct SettleGuard {
    state: Arc<AppState>,
    run_id: String,
    armed: bool,
}

impl SettleGuard {
    pub(crate) fn new(state: Arc<AppState>, run_id: String) -> Self {
        SettleGuard {
            state,
            run_id,
            armed: true,
        }
    }

    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for SettleGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let state = Arc::clone(&self.state);
        let run_id = std::mem::take(&mut self.run_id);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let outcome = Outcome::Failed {
                    code: asbx_protocol::codes::CANCELLED.to_owned(),
                    message: "the client went away; the run was cancelled".to_owned(),
                };
                dispatch::settle(&state, &run_id, &outcome).await;
            });
        }
    }
}

struct RelayState {
    upstream: futures::stream::BoxStream<'static, reqwest::Result<Bytes>>,
    tap: OutcomeTap,
    guard: SettleGuard,
}

/// The client's response body for a streaming run.
pub(crate) fn ndjson_body(
    state: Arc<AppState>,
    run_id: String,
    response: reqwest::Response,
) -> Body {
    let relay = RelayState {
        upstream: response.bytes_stream().boxed(),
        tap: OutcomeTap::default(),
        guard: SettleGuard::new(Arc::clone(&state), run_id.clone()),
    };
    Body::from_stream(relay_stream(state, run_id, relay))
}

fn relay_stream(
    state: Arc<AppState>,
    run_id: String,
    relay: RelayState,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::unfold(Some(relay), move |current| {
        let state = Arc::clone(&state);
        let run_id = run_id.clone();
        async move {
            let mut relay = current?;
            match relay.upstream.next().await {
                Some(Ok(chunk)) => {
                    relay.tap.observe(&chunk);
                    Some((Ok(chunk), Some(relay)))
                }
                Some(Err(e)) => {
                    let message = crate::error::error_chain(&e);
                    relay.tap.finish_input();
                    dispatch::settle(&state, &run_id, &relay.tap.outcome(Some(&message))).await;
                    relay.guard.disarm();
                    // Abort the client's body too, so it sees a broken stream,
                    // not a clean end.
                    Some((Err(std::io::Error::other(message)), None))
                }
                None => {
                    relay.tap.finish_input();
                    dispatch::settle(&state, &run_id, &relay.tap.outcome(None)).await;
                    relay.guard.disarm();
                    None
                }
            }
        }
    })
}
