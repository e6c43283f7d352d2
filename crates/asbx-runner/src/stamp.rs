//! Stamping lines with `seq`, `ts` and `sessionId` (the hot path).
//!
//! Agent lines are already validated JSON objects, so instead of parsing and
//! re-serializing them the stamper writes `{"seq":N,"ts":T,"sessionId":"S",`
//! and then the original bytes after the opening brace. Output accumulates in
//! one buffer that is handed to the HTTP body a chunk at a time, so there is
//! no allocation per line.
//!
//! An encrypted session (`docs/protocol.md` §4) rewrites each stamped line in
//! place into its sealed form; only such sessions pay for it.

use std::sync::Arc;

use asbx_crypto::ServerSession;
use asbx_protocol::{Event, Line};
use bytes::{BufMut, Bytes, BytesMut};

#[derive(Debug)]
pub(crate) struct Stamper {
    seq: u64,
    /// `,"sessionId":"<id>",`, precomputed once per session.
    session_part: Vec<u8>,
    session_id: String,
    out: BytesMut,
    /// Protocol 2 keeps a resume log: where each line starts and ends in
    /// `out`, its `seq` and type. `None` (protocol 1) records nothing.
    marks: Option<Vec<(u64, &'static str, usize, usize)>>,
    /// Seals every line from now on (`None`: lines go out in the clear).
    crypto: Option<Arc<ServerSession>>,
}

impl Stamper {
    pub(crate) fn new(session_id: &str) -> Self {
        let mut session_part = Vec::with_capacity(session_id.len() + 16);
        session_part.extend_from_slice(b",\"sessionId\":\"");
        // Session ids match ^[A-Za-z0-9_-]{1,64}$: nothing to escape.
        session_part.extend_from_slice(session_id.as_bytes());
        session_part.extend_from_slice(b"\",");
        Stamper {
            seq: 0,
            session_part,
            session_id: session_id.to_owned(),
            out: BytesMut::new(),
            marks: None,
            crypto: None,
        }
    }

    /// Seals every later line with the session's key.
    pub(crate) fn encrypt_with(&mut self, crypto: Arc<ServerSession>) {
        self.crypto = Some(crypto);
    }

    /// Rewrites the line just written at `start` into its sealed form: the
    /// clear fields, then `encrypted` (`docs/protocol.md` §4). Returns the
    /// type the line goes out as.
    fn seal(&mut self, start: usize, kind: &'static str) -> &'static str {
        let Some(crypto) = &self.crypto else {
            return kind;
        };
        let end = self.out.len() - 1;
        let sealed = crypto.encrypt_line(&self.out[start..end]);
        self.out.truncate(start);
        match sealed {
            Ok(line) => {
                self.out.extend_from_slice(&line);
                self.out.put_u8(b'\n');
                kind
            }
            Err(e) => {
                // A line the stamper wrote is one JSON object, so this does
                // not happen; were it to, its seq carries a sealed warning
                // instead, never the plaintext.
                let line = Line {
                    seq: self.seq,
                    ts: asbx_protocol::now_ms(),
                    session_id: self.session_id.clone(),
                    event: Event::log(
                        asbx_protocol::LogLevel::Warn,
                        format!("dropped a {kind} line that could not be encrypted: {e}"),
                    ),
                };
                let plain = serde_json::to_vec(&line).unwrap_or_default();
                if let Ok(enc) = crypto.encrypt_line(&plain) {
                    self.out.extend_from_slice(&enc);
                    self.out.put_u8(b'\n');
                }
                "log"
            }
        }
    }

    /// Records line boundaries for a resume log from now on.
    pub(crate) fn keep_marks(&mut self) {
        self.marks = Some(Vec::new());
    }

    fn mark(&mut self, kind: &'static str, start: usize) {
        if let Some(m) = &mut self.marks {
            m.push((self.seq, kind, start, self.out.len()));
        }
    }

    /// The last `seq` handed out.
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// Takes the next `seq` without writing (a line a filter holds back).
    pub(crate) fn skip(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Stamps a validated agent line: `line` must be one JSON object,
    /// starting with `{` and holding no `seq`, `ts` or `sessionId`.
    pub(crate) fn raw(&mut self, line: &[u8], ts: u64, kind: &'static str) -> u64 {
        debug_assert!(line.first() == Some(&b'{'));
        self.seq += 1;
        let start = self.out.len();
        let mut itoa_buf = itoa::Buffer::new();
        self.out.reserve(line.len() + self.session_part.len() + 48);
        self.out.put_slice(b"{\"seq\":");
        self.out.put_slice(itoa_buf.format(self.seq).as_bytes());
        self.out.put_slice(b",\"ts\":");
        self.out.put_slice(itoa_buf.format(ts).as_bytes());
        self.out.put_slice(&self.session_part);
        self.out.put_slice(&line[1..]);
        self.out.put_u8(b'\n');
        let kind = self.seal(start, kind);
        self.mark(kind, start);
        self.seq
    }

    /// Stamps a line the runner makes itself.
    pub(crate) fn event(&mut self, event: Event) -> u64 {
        self.seq += 1;
        let start = self.out.len();
        let kind = event.type_name();
        let line = Line {
            seq: self.seq,
            ts: asbx_protocol::now_ms(),
            session_id: self.session_id.clone(),
            event,
        };
        let mut w = (&mut self.out).writer();
        // Serializing our own types to memory cannot fail.
        let _ = serde_json::to_writer(&mut w, &line);
        self.out.put_u8(b'\n');
        let kind = self.seal(start, kind);
        self.mark(kind, start);
        self.seq
    }

    /// Makes room for `n` more bytes of output at once.
    pub(crate) fn reserve(&mut self, n: usize) {
        self.out.reserve(n);
    }

    pub(crate) fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// Everything stamped since the last take, and (protocol 2) each line
    /// of it as a slice for the resume log (no copy).
    pub(crate) fn take(&mut self) -> (Bytes, Vec<crate::session::LoggedLine>) {
        let chunk = self.out.split().freeze();
        let lines = match &mut self.marks {
            Some(marks) => marks
                .drain(..)
                .map(|(seq, kind, start, end)| crate::session::LoggedLine {
                    seq,
                    kind,
                    bytes: chunk.slice(start..end),
                })
                .collect(),
            None => Vec::new(),
        };
        (chunk, lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use asbx_protocol::LogLevel;

    #[test]
    fn raw_and_runner_lines_decode_with_consecutive_seq() {
        let mut s = Stamper::new("sess_1");
        s.keep_marks();
        s.raw(br#"{"type":"log","level":"info","message":"a"}"#, 7, "log");
        s.event(Event::log(LogLevel::Warn, "b"));
        s.raw(br#"{"type":"result","message":"done"}"#, 9, "result");
        let (out, logged) = s.take();
        assert_eq!(logged.len(), 3);
        assert_eq!(logged[2].kind, "result");
        assert_eq!(
            logged.iter().map(|l| l.bytes.len()).sum::<usize>(),
            out.len()
        );
        let mut d = asbx_protocol::LineDecoder::default();
        let lines: Vec<Line> = d.push(&out).into_iter().map(Result::unwrap).collect();
        assert_eq!(
            lines.iter().map(|l| l.seq).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert!(lines.iter().all(|l| l.session_id == "sess_1"));
        assert_eq!(lines[0].ts, 7);
        assert!(matches!(&lines[2].event, Event::Result(r) if r.message == "done"));
        assert!(!s.has_output());
    }

    #[test]
    fn an_encrypting_stamper_seals_every_line_and_logs_the_sealed_bytes() {
        let mut client = asbx_crypto::ClientSession::new();
        let identity = asbx_crypto::IdentityKey::generate();
        let server = ServerSession::new(&client.public_key(), "sess_e", &identity).unwrap();
        client.agree(server.init(), "sess_e").unwrap();
        let mut s = Stamper::new("sess_e");
        s.keep_marks();
        s.event(Event::log(LogLevel::Info, "in the clear"));
        s.encrypt_with(Arc::new(server));
        s.raw(br#"{"type":"delta","text":"secret words"}"#, 7, "delta");
        s.event(Event::Heartbeat(asbx_protocol::line::Heartbeat {}));
        let (out, logged) = s.take();
        let text = std::str::from_utf8(&out).unwrap();
        assert!(text.contains("in the clear"), "{text}");
        assert!(!text.contains("secret words"), "{text}");
        assert_eq!(
            logged.iter().map(|l| l.kind).collect::<Vec<_>>(),
            vec!["log", "delta", "heartbeat"]
        );
        // The log holds exactly the bytes sent, line by line.
        assert_eq!(
            logged
                .iter()
                .flat_map(|l| l.bytes.to_vec())
                .collect::<Vec<u8>>(),
            out.to_vec()
        );
        let delta = client.decrypt_line(logged[1].bytes.trim_ascii()).unwrap();
        assert_eq!(delta["text"], "secret words");
        assert_eq!(delta["seq"], 2);
        assert_eq!(delta["ts"], 7);
        let beat = client.decrypt_line(logged[2].bytes.trim_ascii()).unwrap();
        assert_eq!(beat["type"], "heartbeat");
        let raw: serde_json::Value = serde_json::from_slice(&logged[2].bytes).unwrap();
        assert!(raw.get("encrypted").is_some(), "{raw}");
    }
}
