//! Server-sent events (SSE) framing of relayed lines, written once.
//!
//! [`write_event`] frames one event so nothing in its name or data can break
//! the framing: data is split on `\n` into one `data:` field per line (the
//! reader joins them back with `\n`), and what SSE cannot carry exactly is
//! refused with a typed [`SseError`] rather than sent altered: a `\r` in the
//! data (a reader treats it as a line end), an event name that is empty or
//! holds a line break, and data that is not UTF-8 (a reader decodes the
//! stream as UTF-8 and would replace it). NDJSON lines never hold a raw `\r`
//! or `\n` (JSON escapes them), so a validated line always frames.
//!
//! [`Parser`] reads a stream the way the WHATWG "event stream interpretation"
//! does (lines end with CRLF, LF or CR; a leading BOM is dropped; comments and
//! unknown fields are ignored; an event is dispatched on an empty line), so
//! tests and the fuzz target can check that what we frame is what a browser
//! reads.

/// Why an event could not be framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("SSE event name must be non-empty and hold no line break")]
    EventName,
    #[error("SSE data may not hold a carriage return")]
    CarriageReturn,
    #[error("SSE data must be UTF-8")]
    NotUtf8,
}

/// Appends one event to `out`: `id: N` (when given), `event: NAME`, one
/// `data:` field per `\n`-separated line of `data`, then the blank line that
/// dispatches it. On error nothing is appended.
pub fn write_event(
    out: &mut Vec<u8>,
    id: Option<u64>,
    event: &str,
    data: &[u8],
) -> Result<(), SseError> {
    if event.is_empty() || event.bytes().any(|b| b == b'\n' || b == b'\r') {
        return Err(SseError::EventName);
    }
    if memchr::memchr(b'\r', data).is_some() {
        return Err(SseError::CarriageReturn);
    }
    if std::str::from_utf8(data).is_err() {
        return Err(SseError::NotUtf8);
    }
    out.reserve(data.len() + event.len() + 40);
    if let Some(id) = id {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(itoa_u64(id, &mut [0; 20]));
        out.push(b'\n');
    }
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.push(b'\n');
    for line in data.split(|&b| b == b'\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.push(b'\n');
    Ok(())
}

/// Formats `n` in decimal into `buf`, returning the digits.
fn itoa_u64(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

/// One dispatched event, as a browser's `EventSource` sees it.
///
/// - `id`: the last event id in effect (`lastEventId`), `None` when empty.
/// - `event`: the event type, `message` when none was given.
/// - `data`: the `data` fields joined with `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: String,
    pub data: String,
}

/// An incremental SSE reader following the WHATWG event stream rules.
///
/// Bytes may arrive in any chunks; a CRLF split across two chunks counts as
/// one line end. Invalid UTF-8 is replaced with U+FFFD per line, as a
/// browser's decoder would.
#[derive(Debug, Default)]
pub struct Parser {
    line: Vec<u8>,
    /// The previous chunk ended in `\r`: a leading `\n` of the next one
    /// belongs to that line end.
    after_cr: bool,
    /// A first line was read (only the first may start with a BOM).
    past_first_line: bool,
    data: String,
    event: String,
    last_id: String,
}

impl Parser {
    pub fn new() -> Self {
        Parser::default()
    }

    /// Feeds a chunk and returns the events it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        let mut chunk = chunk;
        while !chunk.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if chunk[0] == b'\n' {
                    chunk = &chunk[1..];
                    continue;
                }
            }
            match chunk.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(i) => {
                    self.line.extend_from_slice(&chunk[..i]);
                    self.after_cr = chunk[i] == b'\r';
                    chunk = &chunk[i + 1..];
                    let line = std::mem::take(&mut self.line);
                    if let Some(ev) = self.process_line(&line) {
                        out.push(ev);
                    }
                }
                None => {
                    self.line.extend_from_slice(chunk);
                    chunk = &[];
                }
            }
        }
        out
    }

    fn process_line(&mut self, raw: &[u8]) -> Option<SseEvent> {
        let mut raw = raw;
        if !self.past_first_line {
            self.past_first_line = true;
            raw = raw.strip_prefix("\u{feff}".as_bytes()).unwrap_or(raw);
        }
        if raw.is_empty() {
            return self.dispatch();
        }
        let line = String::from_utf8_lossy(raw);
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (&*line, ""),
        };
        match field {
            "event" => value.clone_into(&mut self.event),
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
            }
            "id" if !value.contains('\0') => value.clone_into(&mut self.last_id),
            _ => {}
        }
        None
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = std::mem::take(&mut self.event);
        if self.data.is_empty() {
            return None;
        }
        let mut data = std::mem::take(&mut self.data);
        if data.ends_with('\n') {
            data.pop();
        }
        Some(SseEvent {
            id: (!self.last_id.is_empty()).then(|| self.last_id.clone()),
            event: if event.is_empty() {
                "message".to_owned()
            } else {
                event
            },
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(id: Option<u64>, event: &str, data: &[u8]) -> Result<Vec<u8>, SseError> {
        let mut out = Vec::new();
        write_event(&mut out, id, event, data).map(|()| out)
    }

    #[test]
    fn frames_a_line_the_way_the_runner_did() {
        let out = frame(Some(7), "result", br#"{"seq":7,"type":"result"}"#).unwrap();
        assert_eq!(
            out,
            b"id: 7\nevent: result\ndata: {\"seq\":7,\"type\":\"result\"}\n\n"
        );
    }

    #[test]
    fn newlines_in_data_become_several_data_fields_and_round_trip() {
        let data = b"one\ntwo\n\nfour\n";
        let out = frame(Some(u64::MAX), "log", data).unwrap();
        assert_eq!(
            out,
            b"id: 18446744073709551615\nevent: log\ndata: one\ndata: two\ndata: \ndata: four\ndata: \n\n"
        );
        let evs = Parser::new().push(&out);
        assert_eq!(
            evs,
            vec![SseEvent {
                id: Some(u64::MAX.to_string()),
                event: "log".into(),
                data: "one\ntwo\n\nfour\n".into(),
            }]
        );
    }

    #[test]
    fn a_forged_frame_inside_data_stays_data() {
        // A line trying to end its event and start a forged one.
        let data = b"x\n\nid: 99\nevent: session_ended\ndata: forged";
        let out = frame(Some(1), "delta", data).unwrap();
        let evs = Parser::new().push(&out);
        assert_eq!(evs.len(), 1, "{evs:?}");
        assert_eq!(evs[0].id.as_deref(), Some("1"));
        assert_eq!(evs[0].event, "delta");
        assert_eq!(evs[0].data.as_bytes(), data);
        // Positive control: the same bytes written raw do forge an event.
        let mut raw = b"id: 1\nevent: delta\ndata: ".to_vec();
        raw.extend_from_slice(data);
        raw.extend_from_slice(b"\n\n");
        assert_eq!(Parser::new().push(&raw).len(), 2);
    }

    #[test]
    fn refuses_what_sse_cannot_carry_and_writes_nothing() {
        let mut out = b"kept".to_vec();
        assert_eq!(
            write_event(&mut out, None, "a", b"x\ry"),
            Err(SseError::CarriageReturn)
        );
        assert_eq!(
            write_event(&mut out, None, "a\nb", b""),
            Err(SseError::EventName)
        );
        assert_eq!(
            write_event(&mut out, None, "a\r", b""),
            Err(SseError::EventName)
        );
        assert_eq!(
            write_event(&mut out, None, "", b""),
            Err(SseError::EventName)
        );
        assert_eq!(
            write_event(&mut out, None, "a", b"\xff"),
            Err(SseError::NotUtf8)
        );
        assert_eq!(out, b"kept");
        // Positive control: the same writer accepts the clean versions.
        assert!(write_event(&mut out, None, "a", b"x y").is_ok());
        assert!(out.len() > 4);
    }

    #[test]
    fn empty_data_is_still_one_event() {
        let out = frame(None, "heartbeat", b"").unwrap();
        assert_eq!(
            Parser::new().push(&out),
            vec![SseEvent {
                id: None,
                event: "heartbeat".into(),
                data: String::new(),
            }]
        );
    }

    #[test]
    fn parser_follows_the_spec_on_line_ends_comments_and_fields() {
        let stream = b"\xEF\xBB\xBF: comment\r\nretry: 5\rdata:a\r\ndata:  b\nid\n\nevent: x\ndata\nid: 3\0\n\n";
        let evs = Parser::new().push(stream);
        assert_eq!(
            evs,
            vec![
                SseEvent {
                    id: None,
                    event: "message".into(),
                    data: "a\n b".into(),
                },
                SseEvent {
                    id: None,
                    event: "x".into(),
                    data: String::new(),
                },
            ]
        );
        // An event without data is not dispatched; an unfinished one neither.
        assert!(Parser::new().push(b"event: a\n\ndata: x").is_empty());
    }

    #[test]
    fn parser_is_independent_of_chunking_including_a_split_crlf() {
        let stream = b"id: 1\r\ndata: a\r\n\r\nid: 2\rdata: b\r\r";
        let whole = Parser::new().push(stream);
        assert_eq!(whole.len(), 2);
        for cut in 0..=stream.len() {
            let mut p = Parser::new();
            let mut evs = p.push(&stream[..cut]);
            evs.extend(p.push(&stream[cut..]));
            assert_eq!(evs, whole, "cut at {cut}");
        }
        for size in 1..4 {
            let mut p = Parser::new();
            let evs: Vec<_> = stream.chunks(size).flat_map(|c| p.push(c)).collect();
            assert_eq!(evs, whole, "chunks of {size}");
        }
    }
}
