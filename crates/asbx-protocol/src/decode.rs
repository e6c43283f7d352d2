//! A streaming NDJSON decoder for consumers of a runner stream.
//!
//! Feed it chunks as they arrive; it yields one typed [`Line`] (or a typed
//! error) per complete line. Lines longer than the cap are reported once and
//! skipped up to their newline, so one bad line never poisons the rest.

use crate::line::{EventKind, Line};

/// The default line-length cap: 1 MiB.
pub const DEFAULT_MAX_LINE: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("line longer than {limit} bytes")]
    TooLong { limit: usize },
    #[error("line is not valid UTF-8")]
    NotUtf8,
    #[error("unknown line type {0:?}")]
    UnknownType(String),
    #[error("malformed line: {0}")]
    Malformed(String),
}

/// Splits a byte stream into lines and decodes each.
#[derive(Debug)]
pub struct LineDecoder {
    buf: Vec<u8>,
    max: usize,
    /// Discarding the rest of an over-long line.
    skipping: bool,
}

impl Default for LineDecoder {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_LINE)
    }
}

impl LineDecoder {
    pub fn new(max_line: usize) -> Self {
        LineDecoder {
            buf: Vec::new(),
            max: max_line,
            skipping: false,
        }
    }

    /// Feeds a chunk and returns everything it completed.
    pub fn push(&mut self, mut chunk: &[u8]) -> Vec<Result<Line, DecodeError>> {
        let mut out = Vec::new();
        while !chunk.is_empty() {
            match memchr::memchr(b'\n', chunk) {
                Some(i) => {
                    let (head, rest) = (&chunk[..i], &chunk[i + 1..]);
                    chunk = rest;
                    if self.skipping {
                        self.skipping = false;
                        continue;
                    }
                    if self.buf.len() + head.len() > self.max {
                        self.buf.clear();
                        out.push(Err(DecodeError::TooLong { limit: self.max }));
                        continue;
                    }
                    if self.buf.is_empty() {
                        if !head.is_empty() {
                            out.push(decode_line(head));
                        }
                    } else {
                        self.buf.extend_from_slice(head);
                        let line = std::mem::take(&mut self.buf);
                        out.push(decode_line(&line));
                    }
                }
                None => {
                    if !self.skipping {
                        if self.buf.len() + chunk.len() > self.max {
                            self.buf.clear();
                            self.skipping = true;
                            out.push(Err(DecodeError::TooLong { limit: self.max }));
                        } else {
                            self.buf.extend_from_slice(chunk);
                        }
                    }
                    chunk = &[];
                }
            }
        }
        out
    }

    /// Ends the stream: a trailing line without a newline is decoded too.
    pub fn finish(&mut self) -> Option<Result<Line, DecodeError>> {
        self.skipping = false;
        if self.buf.is_empty() {
            return None;
        }
        let line = std::mem::take(&mut self.buf);
        Some(decode_line(&line))
    }
}

/// Decodes one line (no trailing newline).
pub fn decode_line(bytes: &[u8]) -> Result<Line, DecodeError> {
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    let text = std::str::from_utf8(bytes).map_err(|_| DecodeError::NotUtf8)?;
    serde_json::from_str::<Line>(text).map_err(|e| {
        #[derive(serde::Deserialize)]
        struct Probe {
            #[serde(rename = "type")]
            kind: String,
        }
        match serde_json::from_str::<Probe>(text) {
            Ok(p) if EventKind::parse(&p.kind).is_none() => DecodeError::UnknownType(p.kind),
            _ => DecodeError::Malformed(e.to_string()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::line::Event;

    const A: &str = r#"{"seq":1,"ts":5,"sessionId":"s","type":"result","message":"hé"}"#;

    #[test]
    fn splits_across_chunks_including_utf8() {
        let mut d = LineDecoder::default();
        let bytes = format!("{A}\n{A}\n");
        let bytes = bytes.as_bytes();
        let mut lines = Vec::new();
        for b in bytes.chunks(3) {
            lines.extend(d.push(b));
        }
        assert_eq!(lines.len(), 2);
        for l in lines {
            assert!(matches!(l.unwrap().event, Event::Result(r) if r.message == "hé"));
        }
        assert!(d.finish().is_none());
    }

    #[test]
    fn too_long_line_is_reported_once_and_skipped() {
        let mut d = LineDecoder::new(16);
        let mut out = d.push(&[b'x'; 10]);
        out.extend(d.push(&[b'x'; 10]));
        out.extend(d.push(&[b'x'; 10]));
        out.extend(d.push(b"\n"));
        out.extend(d.push(b"{\"a\":1}\n"));
        assert_eq!(out.len(), 2);
        assert_eq!(out[0], Err(DecodeError::TooLong { limit: 16 }));
        assert!(matches!(out[1], Err(DecodeError::Malformed(_))));
    }

    #[test]
    fn unknown_type_is_typed() {
        let r = decode_line(br#"{"seq":1,"ts":1,"sessionId":"s","type":"mystery"}"#);
        assert_eq!(r, Err(DecodeError::UnknownType("mystery".into())));
    }

    #[test]
    fn trailing_line_without_newline() {
        let mut d = LineDecoder::default();
        assert!(d.push(A.as_bytes()).is_empty());
        assert!(d.finish().unwrap().is_ok());
    }
}
