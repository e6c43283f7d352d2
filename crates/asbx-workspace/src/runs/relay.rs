//! The NDJSON relay: the runner's response body, chunk by chunk, to the client.
//!
//! Every dispatch speaks protocol 2 (docs/protocol.md §4). Beside the relay,
//! an [`OutcomeTap`] splits the bytes into lines and reads each (CPU only,
//! never awaiting) to learn how the run ended: the `result` or `error` line,
//! then `session_ended` with its termination fields. Lines of an encrypted
//! session carry only `type`, `seq`, `ts` and `sessionId` in the clear; the
//! tap reads those and never the ciphertext. The outcome is written once the
//! upstream ends, before the client sees the end of its stream, so a
//! `GET /api/runs/{id}` after the stream is over sees it. A stream that ends
//! without a terminal line settles the run as failed, never `running`.

use std::sync::Arc;

use asbx_protocol::session::{EndReason, Termination};
use asbx_protocol::{Event, EventKind, Line};
use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt as _};

use crate::AppState;
use crate::runs::dispatch;
use crate::runs::store::Outcome;

/// Longest line the tap reads; longer ones are skipped up to their newline.
const MAX_LINE: usize = asbx_protocol::decode::DEFAULT_MAX_LINE;

/// The `error` code recorded for an encrypted run that ended with `error`:
/// its real code is ciphertext the workspace cannot read.
pub(crate) const ENCRYPTED_ERROR: &str = "encrypted_error";

/// One line of a run as it passed through.
#[derive(Debug, Clone)]
#[cfg_attr(
    not(test),
    expect(dead_code, reason = "stored and replayed by the run events relay")
)]
pub(crate) struct Tapped {
    pub(crate) seq: u64,
    pub(crate) kind: EventKind,
    /// The line's bytes as the runner sent them, without the newline.
    pub(crate) raw: Bytes,
    /// The decoded line; `None` for an encrypted line (docs/protocol.md §4).
    pub(crate) line: Option<Line>,
}

/// The clear part of an encrypted line (docs/protocol.md §4).
#[derive(serde::Deserialize)]
struct SealedLine<'a> {
    seq: u64,
    #[serde(rename = "type")]
    kind: &'a str,
    #[allow(dead_code)]
    encrypted: serde::de::IgnoredAny,
}

/// Learns a run's outcome and termination from its lines.
#[derive(Debug, Default)]
pub(crate) struct OutcomeTap {
    buf: BytesMut,
    /// Discarding the rest of an over-long line.
    skipping: bool,
    terminal: Option<Outcome>,
    termination: Option<Termination>,
    ended: bool,
    last_seq: u64,
    bad_lines: u64,
}

impl OutcomeTap {
    /// Feeds a chunk; returns the decoded lines it completed (encrypted
    /// lines are left out: see [`OutcomeTap::observe_raw`]).
    pub(crate) fn observe(&mut self, chunk: &[u8]) -> Vec<Line> {
        let chunk = Bytes::copy_from_slice(chunk);
        self.observe_raw(&chunk)
            .into_iter()
            .filter_map(|t| t.line)
            .collect()
    }

    /// Ends the input; returns a trailing line without newline, if any.
    pub(crate) fn finish_input(&mut self) -> Vec<Line> {
        self.finish_raw()
            .into_iter()
            .filter_map(|t| t.line)
            .collect()
    }

    /// Feeds a chunk; returns every line it completed, raw and decoded.
    /// A line that lies inside `chunk` is a zero-copy slice of it.
    pub(crate) fn observe_raw(&mut self, chunk: &Bytes) -> Vec<Tapped> {
        let mut out = Vec::new();
        let mut rest = chunk.clone();
        while !rest.is_empty() {
            let Some(i) = memchr(b'\n', &rest) else {
                if !self.skipping {
                    if self.buf.len() + rest.len() > MAX_LINE {
                        self.buf.clear();
                        self.skipping = true;
                        self.bad_line("line longer than the limit");
                    } else {
                        self.buf.extend_from_slice(&rest);
                    }
                }
                break;
            };
            let head = rest.split_to(i);
            let _newline = rest.split_to(1);
            if self.skipping {
                self.skipping = false;
                continue;
            }
            let raw = if self.buf.is_empty() {
                head
            } else if self.buf.len() + head.len() > MAX_LINE {
                self.buf.clear();
                self.bad_line("line longer than the limit");
                continue;
            } else {
                self.buf.extend_from_slice(&head);
                self.buf.split().freeze()
            };
            if let Some(t) = self.tap_line(raw) {
                out.push(t);
            }
        }
        out
    }

    /// Ends the input: a trailing line without a newline is read too.
    pub(crate) fn finish_raw(&mut self) -> Vec<Tapped> {
        self.skipping = false;
        if self.buf.is_empty() {
            return Vec::new();
        }
        let raw = self.buf.split().freeze();
        self.tap_line(raw).into_iter().collect()
    }

    fn tap_line(&mut self, raw: Bytes) -> Option<Tapped> {
        let raw = match raw.strip_suffix(b"\r") {
            Some(s) => raw.slice(..s.len()),
            None => raw,
        };
        if raw.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        match asbx_protocol::decode::decode_line(&raw) {
            Ok(line) => {
                let kind = line.event.kind();
                self.note(kind, Some(&line.event));
                self.last_seq = self.last_seq.max(line.seq);
                Some(Tapped {
                    seq: line.seq,
                    kind,
                    raw,
                    line: Some(line),
                })
            }
            Err(e) => {
                let sealed = serde_json::from_slice::<SealedLine<'_>>(&raw)
                    .ok()
                    .and_then(|s| EventKind::parse(s.kind).map(|k| (s.seq, k)));
                match sealed {
                    Some((seq, kind)) => {
                        self.note(kind, None);
                        self.last_seq = self.last_seq.max(seq);
                        Some(Tapped {
                            seq,
                            kind,
                            raw,
                            line: None,
                        })
                    }
                    None => {
                        self.bad_line(&e.to_string());
                        None
                    }
                }
            }
        }
    }

    /// Records what a line says about the end of the run; `event` is `None`
    /// for an encrypted line, whose kind alone is known.
    fn note(&mut self, kind: EventKind, event: Option<&Event>) {
        match (kind, event) {
            (EventKind::SessionEnded, Some(Event::SessionEnded(t))) => {
                self.termination = Some(t.clone());
                self.ended = true;
            }
            (EventKind::SessionEnded, _) => self.ended = true,
            _ if self.terminal.is_some() => {}
            (_, Some(Event::Result(r))) => {
                self.terminal = Some(Outcome::Succeeded {
                    message: r.message.clone(),
                });
            }
            (_, Some(Event::Error(e))) => {
                self.terminal = Some(Outcome::Failed {
                    code: e.code.clone(),
                    message: e.message.clone(),
                });
            }
            (EventKind::Result, None) => {
                self.terminal = Some(Outcome::Succeeded {
                    message: String::new(),
                });
            }
            (EventKind::Error, None) => {
                self.terminal = Some(Outcome::Failed {
                    code: ENCRYPTED_ERROR.to_owned(),
                    message: "the run ended with an error; its details are end-to-end encrypted"
                        .to_owned(),
                });
            }
            _ => {}
        }
    }

    fn bad_line(&mut self, error: &str) {
        self.bad_lines += 1;
        tracing::warn!(error, "undecodable line from the runner");
    }

    /// The terminal line's outcome, if one was seen.
    pub(crate) fn terminal(&self) -> Option<&Outcome> {
        self.terminal.as_ref()
    }

    /// The `session_ended` fields, once seen (never for an encrypted run).
    pub(crate) fn termination(&self) -> Option<&Termination> {
        self.termination.as_ref()
    }

    /// Whether `session_ended` was seen.
    #[cfg_attr(not(test), expect(dead_code, reason = "used by the run events relay"))]
    pub(crate) fn ended(&self) -> bool {
        self.ended
    }

    /// The highest `seq` seen so far (0 before the first line).
    #[cfg_attr(not(test), expect(dead_code, reason = "used by the run events relay"))]
    pub(crate) fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The outcome once the upstream stream has ended (cleanly or not).
    pub(crate) fn outcome(&self, upstream_error: Option<&str>) -> Outcome {
        let upstream_failed = || {
            crate::error::ProblemCode::UpstreamFailed
                .as_str()
                .to_owned()
        };
        match (&self.terminal, &self.termination, upstream_error) {
            (Some(o), _, _) => o.clone(),
            (None, Some(t), _) => Outcome::Failed {
                code: match t.reason {
                    EndReason::Terminated => asbx_protocol::codes::CANCELLED.to_owned(),
                    EndReason::Completed | EndReason::Error => upstream_failed(),
                },
                message: t.message.clone().unwrap_or_else(|| {
                    "the session ended without a result or error line".to_owned()
                }),
            },
            (None, None, Some(e)) => Outcome::Failed {
                code: upstream_failed(),
                message: format!("the runner's stream broke: {e}"),
            },
            (None, None, None) => Outcome::Failed {
                code: upstream_failed(),
                message: "the runner's stream ended without a result or error line".to_owned(),
            },
        }
    }
}

fn memchr(needle: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|b| *b == needle)
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
                    relay.tap.observe_raw(&chunk);
                    Some((Ok(chunk), Some(relay)))
                }
                Some(Err(e)) => {
                    let message = crate::error::error_chain(&e);
                    relay.tap.finish_raw();
                    let outcome = relay.tap.outcome(Some(&message));
                    dispatch::settle_ended(&state, &run_id, &outcome, relay.tap.termination())
                        .await;
                    relay.guard.disarm();
                    // Abort the client's body too, so it sees a broken stream,
                    // not a clean end.
                    Some((Err(std::io::Error::other(message)), None))
                }
                None => {
                    relay.tap.finish_raw();
                    let outcome = relay.tap.outcome(None);
                    dispatch::settle_ended(&state, &run_id, &outcome, relay.tap.termination())
                        .await;
                    relay.guard.disarm();
                    None
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(tap: &mut OutcomeTap, text: &str) -> Vec<Tapped> {
        // One byte at a time: lines are reassembled across chunks.
        let mut out = Vec::new();
        for b in text.as_bytes() {
            out.extend(tap.observe_raw(&Bytes::copy_from_slice(&[*b])));
        }
        out.extend(tap.finish_raw());
        out
    }

    #[test]
    fn every_protocol_two_line_is_read_and_the_termination_kept() {
        let text = concat!(
            r#"{"seq":1,"ts":1,"sessionId":"s","type":"session_init","protocolVersion":2,"limits":{"maxDurationMs":1,"maxSteps":1,"maxToolCalls":1,"heartbeatIntervalMs":5000}}"#,
            "\n",
            r#"{"seq":2,"ts":1,"sessionId":"s","type":"delta","text":"Hel"}"#,
            "\n",
            r#"{"seq":3,"ts":1,"sessionId":"s","type":"stdout","stepId":"a","stream":"stdout","chunk":"x"}"#,
            "\n",
            r#"{"seq":4,"ts":1,"sessionId":"s","type":"heartbeat"}"#,
            "\n",
            r#"{"seq":5,"ts":1,"sessionId":"s","type":"tool_call","callId":"c","toolName":"t","args":{}}"#,
            "\n",
            r#"{"seq":6,"ts":1,"sessionId":"s","type":"tool_result_applied","callId":"c"}"#,
            "\n",
            r#"{"seq":7,"ts":1,"sessionId":"s","type":"error","code":"cancelled","message":"gone"}"#,
            "\n",
            r#"{"seq":8,"ts":1,"sessionId":"s","type":"session_ended","reason":"terminated","terminatedBy":"daemon","signal":9,"stats":{"durationMs":5,"steps":1,"toolCalls":1,"inputTokens":2,"outputTokens":3}}"#,
        );
        let mut tap = OutcomeTap::default();
        let lines = feed(&mut tap, text);
        assert_eq!(
            lines.iter().map(|t| t.seq).collect::<Vec<_>>(),
            (1..=8).collect::<Vec<_>>()
        );
        assert!(lines.iter().all(|t| t.line.is_some()));
        assert_eq!(lines[1].kind, EventKind::Delta);
        assert_eq!(
            lines[1].raw.as_ref(),
            text.lines().nth(1).unwrap().as_bytes()
        );
        assert_eq!(tap.bad_lines, 0);
        assert!(tap.ended());
        assert_eq!(tap.last_seq(), 8);
        let t = tap.termination().unwrap();
        assert_eq!(t.reason, EndReason::Terminated);
        assert_eq!(t.signal, Some(9));
        assert_eq!(
            tap.outcome(None),
            Outcome::Failed {
                code: "cancelled".into(),
                message: "gone".into()
            }
        );
    }

    #[test]
    fn encrypted_lines_are_read_by_their_clear_fields_only() {
        let text = concat!(
            r#"{"seq":2,"ts":1,"sessionId":"s","type":"delta","encrypted":{"iv":"aa","ciphertext":"bb"}}"#,
            "\n",
            r#"{"seq":3,"ts":1,"sessionId":"s","type":"result","encrypted":{"iv":"aa","ciphertext":"bb"}}"#,
            "\n",
            r#"{"seq":4,"ts":1,"sessionId":"s","type":"session_ended","encrypted":{"iv":"aa","ciphertext":"bb"}}"#,
            "\n",
        );
        let mut tap = OutcomeTap::default();
        let lines = feed(&mut tap, text);
        assert_eq!(lines.len(), 3);
        assert!(lines.iter().all(|t| t.line.is_none()));
        assert_eq!(lines[2].kind, EventKind::SessionEnded);
        assert!(tap.ended());
        assert!(tap.termination().is_none());
        assert_eq!(
            tap.outcome(None),
            Outcome::Succeeded {
                message: String::new()
            }
        );
    }

    #[test]
    fn a_stream_without_a_terminal_line_is_a_failure() {
        let mut tap = OutcomeTap::default();
        let lines = feed(
            &mut tap,
            "{\"seq\":1,\"ts\":1,\"sessionId\":\"s\",\"type\":\"delta\",\"text\":\"x\"}\nnot json\n",
        );
        assert_eq!(lines.len(), 1);
        assert_eq!(tap.bad_lines, 1);
        let Outcome::Failed { code, .. } = tap.outcome(None) else {
            panic!("a stream without a terminal line succeeded");
        };
        assert_eq!(code, "upstream_failed");
        let Outcome::Failed { message, .. } = tap.outcome(Some("reset")) else {
            panic!("a broken stream succeeded");
        };
        assert!(message.contains("reset"));
    }
}
