//! Incremental Server-Sent Events reading over the gateway, with a stall timeout.
//!
//! Bytes are buffered until a full line is present, so a UTF-8 character
//! split across body chunks is decoded only once it is whole. Every wait for
//! the next chunk (and for the response head) is bounded by the stall
//! timeout.

use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::Method;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::model::{ModelError, error_message};
use super::retry::parse_retry_after;
use crate::gateway_client::{GatewayClient, GatewayError, read_body};

/// Longest SSE line accepted, so a broken provider cannot exhaust memory.
const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;

/// One SSE event: its `event:` name (if any) and joined `data:` lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// Reads SSE events from a streaming response body.
#[derive(Debug)]
pub(crate) struct SseReader {
    body: Incoming,
    buf: BytesMut,
    stall: Duration,
    eof: bool,
}

/// Sends a streaming `POST` through the gateway and checks the status.
pub(crate) async fn open(
    gateway: &GatewayClient,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
    stall: Duration,
) -> Result<SseReader, ModelError> {
    let send = gateway.send(Method::POST, path, headers, body);
    let resp = match tokio::time::timeout(stall, send).await {
        Err(_) => return Err(ModelError::Stalled(stall)),
        Ok(Err(e)) => return Err(connect_error(e)),
        Ok(Ok(r)) => r,
    };
    let status = resp.status();
    if !status.is_success() {
        let retry_after = parse_retry_after(resp.headers().get(http::header::RETRY_AFTER));
        let body = match tokio::time::timeout(stall, read_body(resp.into_body(), 64 * 1024)).await {
            Ok(Ok(b)) => b,
            Ok(Err(_)) | Err(_) => Bytes::new(),
        };
        let message = error_message(&body);
        return Err(ModelError::Status {
            status: status.as_u16(),
            message: if message.is_empty() {
                status.to_string()
            } else {
                message
            },
            retry_after,
        });
    }
    Ok(SseReader {
        body: resp.into_body(),
        buf: BytesMut::new(),
        stall,
        eof: false,
    })
}

fn connect_error(e: GatewayError) -> ModelError {
    ModelError::Connect(e.to_string())
}

impl SseReader {
    /// The next event, or `None` at the end of the body.
    pub(crate) async fn next_event(&mut self) -> Result<Option<SseEvent>, ModelError> {
        let mut event = None;
        let mut data: Option<String> = None;
        loop {
            let Some(line) = self.next_line().await? else {
                // A trailing event without its blank line still counts.
                return Ok(data.map(|data| SseEvent { event, data }));
            };
            if line.is_empty() {
                if let Some(data) = data.take() {
                    return Ok(Some(SseEvent { event, data }));
                }
                event = None;
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line.as_str(), ""),
            };
            match field {
                "event" => event = Some(value.to_owned()),
                "data" => match &mut data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => data = Some(value.to_owned()),
                },
                _ => {}
            }
        }
    }

    async fn next_line(&mut self) -> Result<Option<String>, ModelError> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line = self.buf.split_to(pos + 1);
                line.truncate(pos);
                if line.last() == Some(&b'\r') {
                    line.truncate(pos - 1);
                }
                return String::from_utf8(line.to_vec())
                    .map(Some)
                    .map_err(|_| ModelError::Protocol("stream is not valid utf-8".into()));
            }
            if self.eof {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                let rest = self.buf.split().freeze();
                return String::from_utf8(rest.to_vec())
                    .map(Some)
                    .map_err(|_| ModelError::Protocol("stream is not valid utf-8".into()));
            }
            if self.buf.len() > MAX_LINE_BYTES {
                return Err(ModelError::Protocol("stream line too long".into()));
            }
            match tokio::time::timeout(self.stall, self.body.frame()).await {
                Err(_) => return Err(ModelError::Stalled(self.stall)),
                Ok(None) => self.eof = true,
                Ok(Some(Err(e))) => return Err(ModelError::StreamCut(e.to_string())),
                Ok(Some(Ok(frame))) => {
                    if let Ok(mut data) = frame.into_data() {
                        while data.has_remaining() {
                            let chunk = data.chunk();
                            self.buf.extend_from_slice(chunk);
                            let n = chunk.len();
                            data.advance(n);
                        }
                    }
                }
            }
        }
    }
}
