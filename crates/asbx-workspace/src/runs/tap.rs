//! The outcome tap: the runner's NDJSON bytes split into lines, each read
//! (CPU only, never awaiting) to learn how the run ended: the `result` or
//! `error` line, then `session_ended` with its termination fields. Lines of
//! an encrypted session carry only `type`, `seq`, `ts` and `sessionId` in
//! the clear; the tap reads those and never the ciphertext. A stream that
//! ends without a terminal line is a failure, never `running`: when the
//! runner went away without `session_ended` (it died, or the connection to
//! it did), `runner_lost`, and [`OutcomeTap::closing_line`] is the `error`
//! line that says so (docs/protocol.md §9).
//!
//! Used by the run relay (`runs::relay`), the kept lines (`runs::events`)
//! and the chat turn's driver (`chats::driver`); it uses none of them.

use asbx_protocol::session::{EndReason, Termination};
use asbx_protocol::{Event, EventKind, Line};
use bytes::{Bytes, BytesMut};

use crate::runs::store::Outcome;

/// Longest line the tap reads; longer ones are skipped up to their newline.
const MAX_LINE: usize = asbx_protocol::decode::DEFAULT_MAX_LINE;

/// The `error` code recorded for an encrypted run that ended with `error`:
/// its real code is ciphertext the workspace cannot read.
pub(crate) const ENCRYPTED_ERROR: &str = "encrypted_error";

/// One line of a run as it passed through.
#[derive(Debug, Clone)]
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
    /// Read `log` and `delta` lines of the common shape without serde
    /// ([`common_stamped`]); their [`Tapped::line`] is then `None`.
    kind_only: bool,
    /// Room for [`common_stamped`].
    scratch: Vec<u8>,
    /// `(code, message)` every later `error` line is rewritten to say
    /// ([`OutcomeTap::end_errors_with`]).
    error_override: Option<(String, String)>,
}

impl OutcomeTap {
    /// A tap for the run relay, which needs each line's `seq` and kind and
    /// only the terminal lines decoded: `log` and `delta` lines of the
    /// runner's common shape are checked byte by byte, not decoded (serde
    /// was about a quarter of the workspace's CPU on the relay's path).
    pub(crate) fn relaying() -> OutcomeTap {
        OutcomeTap {
            kind_only: true,
            ..OutcomeTap::default()
        }
    }

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
        if self.kind_only
            && let Some((seq, kind)) = common_stamped(&raw, &mut self.scratch)
        {
            self.last_seq = self.last_seq.max(seq);
            return Some(Tapped {
                seq,
                kind,
                raw,
                line: None,
            });
        }
        match asbx_protocol::decode::decode_line(&raw) {
            Ok(mut line) => {
                let raw = self.override_error(&mut line).unwrap_or(raw);
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

    /// From now on, an `error` line (the runner's answer to a cancel) says
    /// `code` and `message` instead: the run was stopped for a reason only
    /// the workspace knows (`quota::enforce`). Encrypted lines stay as
    /// they are.
    pub(crate) fn end_errors_with(&mut self, code: &str, message: String) {
        self.error_override = Some((code.to_owned(), message));
    }

    /// Rewrites an `error` line as [`OutcomeTap::end_errors_with`] asked;
    /// its new bytes.
    fn override_error(&self, line: &mut Line) -> Option<Bytes> {
        let (code, message) = self.error_override.as_ref()?;
        let Event::Error(e) = &mut line.event else {
            return None;
        };
        code.clone_into(&mut e.code);
        message.clone_into(&mut e.message);
        serde_json::to_vec(&line).ok().map(Bytes::from)
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
    pub(crate) fn ended(&self) -> bool {
        self.ended
    }

    /// The highest `seq` seen so far (0 before the first line).
    pub(crate) fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// A new stream of the same session follows (`runs::reattach`), from
    /// the line after [`OutcomeTap::last_seq`]: the broken stream's partial
    /// line is dropped (it comes again whole).
    pub(crate) fn reattached(&mut self) {
        self.buf.clear();
        self.skipping = false;
    }

    /// The outcome once the upstream stream has ended (cleanly or not): the
    /// terminal line's; else what `session_ended` says; else, when the
    /// session never said it ended, the runner went away (it died, or the
    /// connection to it did) and the run is `runner_lost` (docs/protocol.md
    /// §9). Runs and chat turns both end this way.
    pub(crate) fn outcome(&self, upstream_error: Option<&str>) -> Outcome {
        let upstream_failed = || {
            crate::error::ProblemCode::UpstreamFailed
                .as_str()
                .to_owned()
        };
        match (&self.terminal, &self.termination) {
            (Some(o), _) => o.clone(),
            (None, Some(t)) => Outcome::Failed {
                code: match t.reason {
                    EndReason::Terminated => asbx_protocol::codes::CANCELLED.to_owned(),
                    EndReason::Completed | EndReason::Error => upstream_failed(),
                },
                message: t.message.clone().unwrap_or_else(|| {
                    "the session ended without a result or error line".to_owned()
                }),
            },
            (None, None) if self.ended => Outcome::Failed {
                code: upstream_failed(),
                message: "the session ended without a result or error line".to_owned(),
            },
            (None, None) => Outcome::Failed {
                code: asbx_protocol::codes::RUNNER_LOST.to_owned(),
                message: match upstream_error {
                    Some(e) => format!("the runner went away before the run ended: {e}"),
                    None => "the runner's stream ended before the run did".to_owned(),
                },
            },
        }
    }

    /// The `error` line that tells readers how a stream ended that the
    /// runner left without its end (no terminal line, no `session_ended`):
    /// of the runner's shape, numbered after the last line seen. `None` when
    /// the stream has its end or `outcome` is a success.
    pub(crate) fn closing_line(
        &self,
        outcome: &Outcome,
        session_id: &str,
        ts: u64,
    ) -> Option<Line> {
        if self.terminal.is_some() || self.ended {
            return None;
        }
        closing_error(outcome, self.last_seq + 1, session_id, ts)
    }
}

/// An `error` line for a failed `outcome`, as the runner would stamp it.
pub(crate) fn closing_error(
    outcome: &Outcome,
    seq: u64,
    session_id: &str,
    ts: u64,
) -> Option<Line> {
    match outcome {
        Outcome::Succeeded { .. } => None,
        Outcome::Failed { code, message } => Some(Line {
            seq,
            ts,
            session_id: session_id.to_owned(),
            event: Event::error(code.clone(), message.clone()),
        }),
    }
}

impl Tapped {
    /// A line the workspace adds to a run's stream.
    pub(crate) fn own(line: Line) -> Option<Tapped> {
        let raw = serde_json::to_vec(&line).ok()?;
        Some(Tapped {
            seq: line.seq,
            kind: line.event.kind(),
            raw: Bytes::from(raw),
            line: Some(line),
        })
    }
}

fn memchr(needle: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|b| *b == needle)
}

/// A `log` or `delta` line as the runner stamps the commonest shapes:
/// exactly `{"seq":N,"ts":T,"sessionId":"S",` then the rest of an agent line
/// that [`asbx_protocol::raw::common_kind`] accepts (fields in order, no
/// whitespace, strings without escapes), checked byte by byte. `None` for
/// anything else, which serde then decides; what this accepts, serde
/// accepts with the same `seq` and kind (a test checks). `scratch` holds
/// the agent part while it is checked.
fn common_stamped(raw: &[u8], scratch: &mut Vec<u8>) -> Option<(u64, EventKind)> {
    let rest = raw.strip_prefix(b"{\"seq\":")?;
    let (seq, rest) = json_u64(rest)?;
    let rest = rest.strip_prefix(b",\"ts\":")?;
    let (_ts, rest) = json_u64(rest)?;
    let rest = rest.strip_prefix(b",\"sessionId\":\"")?;
    let end = memchr(b'"', rest)?;
    let (session_id, rest) = rest.split_at(end);
    if session_id.iter().any(|&b| b < 0x20 || b == b'\\')
        || std::str::from_utf8(session_id).is_err()
    {
        return None;
    }
    let rest = rest.strip_prefix(b"\",")?;
    scratch.clear();
    scratch.push(b'{');
    scratch.extend_from_slice(rest);
    match asbx_protocol::raw::common_kind(scratch)? {
        kind @ (EventKind::Log | EventKind::Delta) => Some((seq, kind)),
        _ => None,
    }
}

/// A JSON number that is an integer in `u64` (no sign, fraction, exponent
/// or leading zero), and what follows it.
fn json_u64(b: &[u8]) -> Option<(u64, &[u8])> {
    let n = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if n == 0 || (n > 1 && b[0] == b'0') {
        return None;
    }
    let mut v: u64 = 0;
    for &c in &b[..n] {
        v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    Some((v, &b[n..]))
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
    fn the_common_shapes_read_without_serde_as_serde_reads_them() {
        let accepted = [
            r#"{"seq":1,"ts":1764000000000,"sessionId":"abc","type":"log","level":"debug","message":"tick"}"#,
            r#"{"seq":18446744073709551615,"ts":0,"sessionId":"s-1_x","type":"delta","text":"Hé"}"#,
            r#"{"seq":7,"ts":1,"sessionId":"","type":"log","level":"error","message":""}"#,
        ];
        let refused = [
            // serde's cases: escapes, other types, other orders, whitespace.
            r#"{"seq":1,"ts":1,"sessionId":"a\"b","type":"delta","text":"x"}"#,
            r#"{"seq":1,"ts":1,"sessionId":"s","type":"delta","text":"a\nb"}"#,
            r#"{"seq":1,"ts":1,"sessionId":"s","type":"result","message":"ok"}"#,
            r#"{"seq":1,"ts":1,"sessionId":"s","type":"heartbeat"}"#,
            r#"{"ts":1,"seq":1,"sessionId":"s","type":"delta","text":"x"}"#,
            r#"{"seq":1, "ts":1,"sessionId":"s","type":"delta","text":"x"}"#,
            r#"{"seq":1,"ts":1,"sessionId":"s","type":"delta","text":"x","extra":1}"#,
            // Not lines at all, or not serde's numbers.
            r#"{"seq":01,"ts":1,"sessionId":"s","type":"delta","text":"x"}"#,
            r#"{"seq":18446744073709551616,"ts":1,"sessionId":"s","type":"delta","text":"x"}"#,
            r#"{"seq":-1,"ts":1,"sessionId":"s","type":"delta","text":"x"}"#,
            r#"{"seq":1.5,"ts":1,"sessionId":"s","type":"delta","text":"x"}"#,
            r#"{"seq":1,"ts":1,"sessionId":"s","type":"delta","text":"x"#,
            r#"{"seq":1,"ts":1,"sessionId":"s","type":"log","level":"loud","message":"x"}"#,
        ];
        let mut scratch = Vec::new();
        for line in accepted {
            let (seq, kind) = common_stamped(line.as_bytes(), &mut scratch)
                .unwrap_or_else(|| panic!("refused {line}"));
            let full = asbx_protocol::decode::decode_line(line.as_bytes()).unwrap();
            assert_eq!((seq, kind), (full.seq, full.event.kind()), "{line}");
        }
        for line in refused {
            assert_eq!(
                common_stamped(line.as_bytes(), &mut scratch),
                None,
                "{line}"
            );
        }
        // Through the relay's tap: the same lines, seq and kinds as the
        // chats' tap, and the outcome of the terminal line.
        let text = concat!(
            r#"{"seq":1,"ts":1,"sessionId":"s","type":"log","level":"info","message":"a"}"#,
            "\n",
            r#"{"seq":2,"ts":1,"sessionId":"s","type":"delta","text":"b"}"#,
            "\n",
            r#"{"seq":03,"ts":1,"sessionId":"s","type":"delta","text":"c"}"#,
            "\n",
            r#"{"seq":4,"ts":1,"sessionId":"s","type":"result","message":"done"}"#,
            "\n",
        );
        let (mut fast, mut full) = (OutcomeTap::relaying(), OutcomeTap::default());
        let a = feed(&mut fast, text);
        let b = feed(&mut full, text);
        let key = |v: &[Tapped]| v.iter().map(|t| (t.seq, t.kind)).collect::<Vec<_>>();
        assert_eq!(key(&a), key(&b));
        assert_eq!(
            key(&a),
            [
                (1, EventKind::Log),
                (2, EventKind::Delta),
                (4, EventKind::Result)
            ]
        );
        assert!(a[0].line.is_none() && a[2].line.is_some());
        assert_eq!((fast.bad_lines, full.bad_lines), (1, 1));
        assert_eq!(fast.outcome(None), full.outcome(None));
    }

    #[test]
    fn a_stream_the_runner_left_without_its_end_is_runner_lost_and_says_so() {
        let mut tap = OutcomeTap::default();
        let lines = feed(
            &mut tap,
            "{\"seq\":1,\"ts\":1,\"sessionId\":\"s\",\"type\":\"delta\",\"text\":\"x\"}\nnot json\n",
        );
        assert_eq!(lines.len(), 1);
        assert_eq!(tap.bad_lines, 1);
        let outcome = tap.outcome(None);
        let Outcome::Failed { code, .. } = &outcome else {
            panic!("a stream without a terminal line succeeded");
        };
        assert_eq!(code, "runner_lost");
        let Outcome::Failed { code, message } = tap.outcome(Some("reset")) else {
            panic!("a broken stream succeeded");
        };
        assert_eq!(code, "runner_lost");
        assert!(message.contains("reset"));
        // The stream gets its end: an `error` line after the last one.
        let line = tap.closing_line(&outcome, "s", 7).unwrap();
        assert_eq!((line.seq, line.ts, line.session_id.as_str()), (2, 7, "s"));
        let Event::Error(e) = &line.event else {
            panic!("not an error line: {line:?}");
        };
        assert_eq!(e.code, "runner_lost");
        let tapped = Tapped::own(line).unwrap();
        assert_eq!(
            asbx_protocol::decode::decode_line(&tapped.raw)
                .unwrap()
                .event
                .kind(),
            EventKind::Error
        );
    }

    #[test]
    fn a_stream_with_its_end_gets_no_closing_line() {
        // `session_ended` without a terminal line (an encrypted run's
        // shape): the runner ended it, it was not lost.
        let mut tap = OutcomeTap::default();
        feed(
            &mut tap,
            r#"{"seq":1,"ts":1,"sessionId":"s","type":"session_ended","encrypted":{"iv":"aa","ciphertext":"bb"}}"#,
        );
        let outcome = tap.outcome(None);
        assert!(
            matches!(&outcome, Outcome::Failed { code, .. } if code == "upstream_failed"),
            "{outcome:?}"
        );
        assert!(tap.closing_line(&outcome, "s", 1).is_none());
        // A terminal line: nothing to add either.
        let mut tap = OutcomeTap::default();
        feed(
            &mut tap,
            r#"{"seq":1,"ts":1,"sessionId":"s","type":"error","code":"model_error","message":"m"}"#,
        );
        let outcome = tap.outcome(None);
        assert!(tap.closing_line(&outcome, "s", 1).is_none());
    }
}
