//! Counts a model call's tokens in the provider's answer as it streams back
//! to the sandbox (issue 28, defect 3), so that `session_ended.stats` need
//! not trust the agent's own report, which a cancelled, crashed or capped
//! sandbox never sends.
//!
//! The answer passes through unchanged. On the way the tap reads each line
//! of an event stream (`data: {…}`) that names `usage`, or the whole body of
//! a JSON answer, and takes the provider's counts from it: `usage.prompt_tokens`
//! and `usage.completion_tokens` (OpenAI, the last chunk when
//! `stream_options.include_usage` is set), `usage.input_tokens` and
//! `usage.output_tokens` at the top or under `message` (Anthropic's
//! `message_start` and `message_delta`, whose counts are running totals).
//! Within one answer a count only grows: the tap keeps the largest seen and
//! adds what is new to the session (and the token metrics) at once, so an
//! answer cut short still counts what it carried. Reading is bounded: a
//! line or JSON body past [`MAX_HELD`] bytes is skipped, not held.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use serde_json::Value;

use crate::session::Session;

/// The most the tap holds of one line (or of a JSON answer) to read it.
const MAX_HELD: usize = 1 << 20;

/// Where counted tokens go: the session and the runner's token metrics.
pub(crate) struct Counter {
    pub(crate) session: Arc<Session>,
    pub(crate) provider: String,
    /// Where the call is reported when its answer ends (`crate::audit`):
    /// the log, the model and the answer's status.
    pub(crate) audit: Option<(Arc<crate::audit::AuditLog>, String, u16)>,
}

impl Counter {
    fn add(&self, input: u64, output: u64) {
        if input == 0 && output == 0 {
            return;
        }
        self.session.count_tokens(input, output);
        crate::metrics::METRICS.tokens(&self.provider, input, output);
    }
}

/// What one answer's bytes are read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// `text/event-stream`: line by line.
    Events,
    /// Anything else: one JSON document, read at its end.
    Json,
}

/// Reads the counts out of one answer's bytes.
pub(crate) struct UsageReader {
    shape: Shape,
    held: Vec<u8>,
    /// Past [`MAX_HELD`]: drop bytes until the next line (events) or the end.
    skipping: bool,
    /// The largest counts seen so far (input, output), already added.
    seen: (u64, u64),
    /// Whether any `usage` was read.
    saw_usage: bool,
    counter: Counter,
}

impl UsageReader {
    /// A reader for an answer of `content_type`.
    pub(crate) fn new(content_type: Option<&str>, counter: Counter) -> UsageReader {
        let events = content_type.is_some_and(|t| {
            t.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        });
        UsageReader {
            shape: if events { Shape::Events } else { Shape::Json },
            held: Vec::new(),
            skipping: false,
            seen: (0, 0),
            saw_usage: false,
            counter,
        }
    }

    /// Reads the next bytes of the answer.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) {
        if self.shape == Shape::Json {
            self.hold(bytes);
            return;
        }
        while let Some(i) = memchr::memchr(b'\n', bytes) {
            self.hold(&bytes[..i]);
            if !self.skipping {
                let line = std::mem::take(&mut self.held);
                self.line(&line);
            }
            self.held.clear();
            self.skipping = false;
            bytes = &bytes[i + 1..];
        }
        self.hold(bytes);
    }

    /// The answer ended: reads what is held (a JSON answer, a last line
    /// without its newline).
    pub(crate) fn finish(&mut self) {
        if !self.skipping {
            let rest = std::mem::take(&mut self.held);
            self.line(&rest);
        }
        self.held.clear();
    }

    fn hold(&mut self, bytes: &[u8]) {
        if self.skipping {
            return;
        }
        if self.held.len() + bytes.len() > MAX_HELD {
            self.held.clear();
            self.skipping = true;
            return;
        }
        self.held.extend_from_slice(bytes);
    }

    /// One event-stream line or the whole JSON answer.
    fn line(&mut self, line: &[u8]) {
        let line = line.trim_ascii();
        let json = line.strip_prefix(b"data:").unwrap_or(line).trim_ascii();
        if memchr::memmem::find(json, b"\"usage\"").is_none() {
            return;
        }
        let Ok(value) = serde_json::from_slice::<Value>(json) else {
            return;
        };
        let Some((input, output)) = counts(&value) else {
            return;
        };
        let (seen_in, seen_out) = self.seen;
        let (input, output) = (input.unwrap_or(0), output.unwrap_or(0));
        self.counter.add(
            input.saturating_sub(seen_in),
            output.saturating_sub(seen_out),
        );
        self.seen = (seen_in.max(input), seen_out.max(output));
        self.saw_usage = true;
    }
}

/// The call is reported once, when its answer is done with (read to its
/// end or dropped), with the tokens seen.
impl Drop for UsageReader {
    fn drop(&mut self) {
        if let Some((log, model, status)) = self.counter.audit.take() {
            let tokens = |n: u64| self.saw_usage.then_some(n);
            log.push(asbx_protocol::audit::AuditEvent::ModelCall {
                provider: self.counter.provider.clone(),
                model,
                input_tokens: tokens(self.seen.0),
                output_tokens: tokens(self.seen.1),
                status,
            });
        }
    }
}

/// The token counts in one provider message, if it has a `usage` object
/// (see the module docs for where each provider puts them).
fn counts(v: &Value) -> Option<(Option<u64>, Option<u64>)> {
    let usage = v
        .get("usage")
        .filter(|u| u.is_object())
        .or_else(|| v.get("message")?.get("usage").filter(|u| u.is_object()))?;
    let field = |names: [&str; 2]| {
        names
            .into_iter()
            .find_map(|n| usage.get(n).and_then(Value::as_u64))
    };
    Some((
        field(["input_tokens", "prompt_tokens"]),
        field(["output_tokens", "completion_tokens"]),
    ))
}

/// An answer's body stream, read by a [`UsageReader`] on its way through.
pub(crate) struct Tapped<S> {
    inner: S,
    reader: Option<UsageReader>,
}

impl<S> Tapped<S> {
    pub(crate) fn new(inner: S, reader: UsageReader) -> Tapped<S> {
        Tapped {
            inner,
            reader: Some(reader),
        }
    }
}

impl<S, E> Stream for Tapped<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    type Item = Result<Bytes, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = Pin::new(&mut self.inner).poll_next(cx);
        match &polled {
            Poll::Ready(Some(Ok(chunk))) => {
                if let Some(r) = self.reader.as_mut() {
                    r.feed(chunk);
                }
            }
            // The answer is over (or broke off): what it carried counts.
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                if let Some(mut r) = self.reader.take() {
                    r.finish();
                }
            }
            Poll::Pending => {}
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(content_type: &str) -> (UsageReader, Arc<Session>) {
        let sessions = crate::session::Sessions::default();
        let session = sessions
            .insert(
                "tap",
                asbx_protocol::Protocol::V2,
                std::time::Duration::from_secs(1),
            )
            .unwrap();
        let counter = Counter {
            session: Arc::clone(&session),
            provider: "test".into(),
            audit: None,
        };
        (UsageReader::new(Some(content_type), counter), session)
    }

    fn counted(s: &Session) -> (u64, u64) {
        let u = s.stats_usage();
        (u.input_tokens, u.output_tokens)
    }

    #[test]
    fn openai_stream_usage_is_read_from_its_last_chunk_split_anywhere() {
        let (mut r, s) = reader("text/event-stream");
        let body = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n\
                     data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5}}\n\n\
                     data: [DONE]\n\n";
        for chunk in body.chunks(7) {
            r.feed(chunk);
        }
        r.finish();
        assert_eq!(counted(&s), (12, 5));
    }

    #[test]
    fn anthropic_running_totals_count_once() {
        let (mut r, s) = reader("text/event-stream; charset=utf-8");
        r.feed(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":30,\"output_tokens\":1}}}\n\n");
        assert_eq!(counted(&s), (30, 1), "counted as it arrives");
        r.feed(b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n");
        r.feed(b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":30,\"output_tokens\":14}}");
        r.finish();
        assert_eq!(counted(&s), (30, 14));
    }

    #[test]
    fn a_json_answer_is_read_whole_and_junk_counts_nothing() {
        let (mut r, s) = reader("application/json");
        r.feed(b"{\n  \"usage\": {\n    \"input_tokens\": 7,\n");
        r.feed(b"    \"output_tokens\": 3\n  }\n}");
        r.finish();
        assert_eq!(counted(&s), (7, 3));
        let (mut r, s) = reader("text/event-stream");
        r.feed(b"data: {\"usage\": \"many\"}\ndata: not json \"usage\"\n");
        r.feed(&vec![b'x'; MAX_HELD + 10]);
        r.feed(b"\"usage\"\ndata: {\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":1}}\n");
        r.finish();
        assert_eq!(
            counted(&s),
            (2, 1),
            "the over-long line is skipped, not the next"
        );
    }
}
