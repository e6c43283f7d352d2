//! A sandbox's stderr: read while it runs ([`capture_stderr`]) into a head
//! and tail capture (`session_ended`, docs/protocol.md §4).
//!
//! Keeps the first 50 and the last 50 lines, each cut to 500 bytes on a
//! UTF-8 boundary, and counts every line, in bounded memory whatever the
//! process writes.

use std::collections::VecDeque;
use std::time::Duration;

use asbx_protocol::session::StderrOutput;
use tokio::io::AsyncReadExt;
use tokio::task::JoinHandle;

pub(crate) const KEEP_LINES: usize = 50;
pub(crate) const MAX_LINE_BYTES: usize = 500;

#[derive(Debug, Default)]
pub(crate) struct StderrCapture {
    head: Vec<String>,
    tail: VecDeque<String>,
    total: u64,
    /// The current, unfinished line (at most `MAX_LINE_BYTES` kept).
    partial: Vec<u8>,
    partial_len: usize,
}

impl StderrCapture {
    pub(crate) fn push(&mut self, mut chunk: &[u8]) {
        while let Some(i) = memchr::memchr(b'\n', chunk) {
            self.append(&chunk[..i]);
            self.end_line();
            chunk = &chunk[i + 1..];
        }
        self.append(chunk);
    }

    fn append(&mut self, bytes: &[u8]) {
        let room = (MAX_LINE_BYTES + 4).saturating_sub(self.partial.len());
        self.partial
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
        self.partial_len += bytes.len();
    }

    fn end_line(&mut self) {
        let line = cut_utf8(&self.partial, MAX_LINE_BYTES);
        self.partial.clear();
        self.partial_len = 0;
        self.total += 1;
        if self.head.len() < KEEP_LINES {
            self.head.push(line);
        } else {
            if self.tail.len() == KEEP_LINES {
                self.tail.pop_front();
            }
            self.tail.push_back(line);
        }
    }

    /// The captured output; `None` when the process wrote nothing.
    pub(crate) fn finish(mut self) -> Option<StderrOutput> {
        if self.partial_len > 0 {
            self.end_line();
        }
        if self.total == 0 {
            return None;
        }
        let truncated = self.total > (2 * KEEP_LINES) as u64;
        let head = self.head.join("\n");
        let tail: Vec<String> = self.tail.into();
        Some(StderrOutput {
            head: Some(head),
            tail: (!tail.is_empty()).then(|| tail.join("\n")),
            truncated,
            total_lines: self.total,
        })
    }

    /// The last line written, for error messages.
    pub(crate) fn last_line(&self) -> Option<&str> {
        self.tail.back().or(self.head.last()).map(String::as_str)
    }
}

/// Lossily decodes `bytes` and cuts it to at most `max` bytes without
/// splitting a character.
fn cut_utf8(bytes: &[u8], max: usize) -> String {
    let s = String::from_utf8_lossy(bytes);
    if s.len() <= max {
        return s.into_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// A sandbox's stderr, read into a head/tail capture until it closes or
/// the sandbox is known to have ended ([`StderrReader::finish`]).
pub(crate) struct StderrReader {
    task: JoinHandle<StderrCapture>,
    done: tokio_util::sync::CancellationToken,
}

impl StderrReader {
    /// Nothing to read (no pipe).
    pub(crate) fn none() -> StderrReader {
        StderrReader {
            task: tokio::spawn(async { StderrCapture::default() }),
            done: tokio_util::sync::CancellationToken::new(),
        }
    }

    /// The capture, once the sandbox ended: what the pipe holds now is
    /// read (without waiting for its end-of-file, which a supervisor still
    /// tearing the sandbox down holds back), then the reading stops.
    pub(crate) async fn finish(self) -> StderrCapture {
        self.done.cancel();
        match tokio::time::timeout(Duration::from_secs(1), self.task).await {
            Ok(Ok(c)) => c,
            _ => StderrCapture::default(),
        }
    }
}

/// Reads a sandbox's stderr into a head/tail capture; see [`StderrReader`].
pub(crate) fn capture_stderr(mut stderr: tokio::net::unix::pipe::Receiver) -> StderrReader {
    let done = tokio_util::sync::CancellationToken::new();
    let finish = done.clone();
    let task = tokio::spawn(async move {
        let mut cap = StderrCapture::default();
        // Most sandboxes write little or nothing there while they idle:
        // start small, and read big once a read fills the buffer.
        let mut buf = vec![0u8; 256];
        loop {
            tokio::select! {
                biased;
                read = stderr.read(&mut buf) => match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        cap.push(&buf[..n]);
                        if n == buf.len() && buf.len() < 8192 {
                            buf.resize(8192, 0);
                        }
                    }
                },
                _ = finish.cancelled() => {
                    // What is in the pipe now, read directly (the pipe does
                    // not block), whether or not the reactor saw it yet.
                    buf.resize(8192, 0);
                    while let Ok(n) = nix::unistd::read(&stderr, &mut buf) {
                        if n == 0 {
                            break;
                        }
                        cap.push(&buf[..n]);
                    }
                    break;
                }
            }
        }
        cap
    });
    StderrReader { task, done }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_head_and_tail_and_counts() {
        let mut c = StderrCapture::default();
        for i in 0..250 {
            c.push(format!("line {i}\n").as_bytes());
        }
        let out = c.finish().unwrap();
        assert!(out.truncated);
        assert_eq!(out.total_lines, 250);
        let head = out.head.unwrap();
        assert!(head.starts_with("line 0\n") && head.ends_with("line 49"));
        let tail = out.tail.unwrap();
        assert!(tail.starts_with("line 200\n") && tail.ends_with("line 249"));
    }

    #[test]
    fn short_output_is_not_truncated() {
        let mut c = StderrCapture::default();
        c.push(b"a\nb");
        let out = c.finish().unwrap();
        assert!(!out.truncated);
        assert_eq!(out.total_lines, 2);
        assert_eq!(out.head.as_deref(), Some("a\nb"));
        assert_eq!(out.tail, None);
    }

    #[test]
    fn long_lines_cut_on_char_boundary() {
        let mut c = StderrCapture::default();
        let line = "é".repeat(400); // 800 bytes
        c.push(line.as_bytes());
        c.push(b"\n");
        let out = c.finish().unwrap();
        let head = out.head.unwrap();
        assert_eq!(head.len(), 500);
        assert!(head.chars().all(|ch| ch == 'é'));
    }

    #[test]
    fn nothing_written_is_none() {
        assert!(StderrCapture::default().finish().is_none());
    }
}
