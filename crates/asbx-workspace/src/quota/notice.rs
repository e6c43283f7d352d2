//! Telling a client that its dispatch is queued (docs/api-usage.md,
//! "Queued"): a dispatch waiting for its fair share of the fleet
//! ([`super::admit::ShareWait`]) waits before any answer, and a client that
//! asked with `Prefer: queued-notice` (RFC 7240) is answered `200` at once
//! instead, the body opening with a `queued` notice (again every
//! [`REPEAT`] while it waits), then either the dispatch's own body or, when
//! the wait ends in a refusal, one `refused` notice carrying what the
//! status answer would have carried (its status, its problem, its
//! `Retry-After`). A client that did not ask is answered as before.
//!
//! The notices are not session lines: they have no `seq` and are never
//! stored or replayed; a resume starts after them.

use std::future::Future;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::Serialize;
use tokio::sync::oneshot;

use crate::error::WorkspaceError;

/// The preference a client sends to be told (`Prefer: queued-notice`).
pub(crate) const PREFERENCE: &str = "queued-notice";

/// How often the notice is sent again while the dispatch waits: it also
/// keeps idle-timing proxies from cutting the quiet connection.
pub(crate) const REPEAT: Duration = Duration::from_secs(15);

/// What a queued dispatch waits for, sent once it starts waiting.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Queued {
    /// The quota it waits under (`concurrent-sandboxes`: the fair share).
    pub quota: &'static str,
    /// The longest it waits, in whole seconds, before it is refused.
    pub wait_s: u64,
}

/// Where a waiting dispatch says it started to wait: `None` when nobody
/// asked.
pub(crate) type Notify = Option<oneshot::Sender<Queued>>;

/// How the answer is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// NDJSON (`POST /api/runs`, protocol 2): `{"type":"queued",...}`.
    Ndjson,
    /// SSE (a chat turn): `event: queued`.
    Sse,
}

/// Whether the request asked to be told (`Prefer: queued-notice`, in any
/// of its `Prefer` headers, among other preferences).
pub(crate) fn wanted(headers: &HeaderMap) -> bool {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| {
            let token = p.split(';').next().unwrap_or("").trim();
            token.eq_ignore_ascii_case(PREFERENCE)
        })
}

/// Answers with what `dispatch` answers; when `wanted` and the dispatch
/// starts to wait first, answers `200` at once and follows with the
/// notices, then the dispatch's body or its refusal. `dispatch` runs in a
/// task of its own, given up when the client goes away while it waits.
pub(crate) async fn answer<F>(
    wanted: bool,
    framing: Framing,
    dispatch: impl FnOnce(Notify) -> F,
) -> Result<Response, WorkspaceError>
where
    F: Future<Output = Result<Response, WorkspaceError>> + Send + 'static,
{
    if !wanted {
        return dispatch(None).await;
    }
    let (tell, told) = oneshot::channel();
    let mut task = AbortOnDrop(tokio::spawn(dispatch(Some(tell))));
    let queued = tokio::select! {
        done = &mut task.0 => return joined(done),
        queued = told => match queued {
            Ok(queued) => queued,
            // It finished without waiting: its answer as it is.
            Err(_) => return joined((&mut task.0).await),
        },
    };
    let body = queued_body(framing, queued, task);
    let mut r = Response::new(Body::from_stream(body));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, content_type(framing));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    h.insert("preference-applied", HeaderValue::from_static(PREFERENCE));
    Ok(r)
}

fn content_type(framing: Framing) -> HeaderValue {
    HeaderValue::from_static(match framing {
        Framing::Ndjson => "application/x-ndjson",
        Framing::Sse => "text/event-stream",
    })
}

/// The dispatch task's answer; its panic goes on here.
fn joined(
    done: Result<Result<Response, WorkspaceError>, tokio::task::JoinError>,
) -> Result<Response, WorkspaceError> {
    match done {
        Ok(answer) => answer,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Only when the runtime shuts down.
        Err(_) => Err(WorkspaceError::Upstream(
            "the dispatch was given up".to_owned(),
        )),
    }
}

/// The task running the dispatch, aborted when dropped (the client went
/// away while it waited: its place in the queue is given up).
struct AbortOnDrop(tokio::task::JoinHandle<Result<Response, WorkspaceError>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The notice every [`REPEAT`] until the dispatch ends, then its body
/// (admitted) or one `refused` notice.
fn queued_body(
    framing: Framing,
    queued: Queued,
    task: AbortOnDrop,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let notice = frame(framing, "queued", &queued);
    let waiting = futures::stream::unfold(Some((task, notice, true)), move |s| async move {
        let (mut task, notice, first) = s?;
        if first {
            return Some((Wait::Notice(notice.clone()), Some((task, notice, false))));
        }
        tokio::select! {
            done = &mut task.0 => Some((Wait::Done(done), None)),
            () = tokio::time::sleep(REPEAT) => {
                Some((Wait::Notice(notice.clone()), Some((task, notice, false))))
            }
        }
    });
    waiting.flat_map(move |step| match step {
        Wait::Notice(bytes) => futures::stream::once(async move { Ok(bytes) }).boxed(),
        Wait::Done(done) => match joined(done) {
            Ok(r) if r.status() == StatusCode::OK => r
                .into_body()
                .into_data_stream()
                .map(|c| c.map_err(std::io::Error::other))
                .boxed(),
            Ok(r) => futures::stream::once(refusal(framing, r)).boxed(),
            Err(e) => futures::stream::once(refusal(framing, e.into_response())).boxed(),
        },
    })
}

enum Wait {
    Notice(Bytes),
    Done(Result<Result<Response, WorkspaceError>, tokio::task::JoinError>),
}

/// The `refused` notice for an answer that is not `200`: `{"status",
/// "retryAfter"?, "problem"}`, the problem as the status answer's body
/// (JSON, or its text).
async fn refusal(framing: Framing, r: Response) -> Result<Bytes, std::io::Error> {
    let status = r.status().as_u16();
    let retry_after = r
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let body = axum::body::to_bytes(r.into_body(), 1 << 20)
        .await
        .map_err(std::io::Error::other)?;
    let problem = serde_json::from_slice::<serde_json::Value>(&body)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&body).into()));
    let refused = Refused {
        status,
        retry_after,
        problem,
    };
    Ok(frame(framing, "refused", &refused))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Refused {
    status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after: Option<u64>,
    problem: serde_json::Value,
}

/// One notice: an NDJSON line `{"type": kind, ...fields}` or an SSE event
/// `event: kind` with the fields as its data.
fn frame<T: Serialize>(framing: Framing, kind: &str, fields: &T) -> Bytes {
    let mut value = serde_json::to_value(fields).unwrap_or_default();
    match framing {
        Framing::Ndjson => {
            if let serde_json::Value::Object(map) = &mut value {
                map.insert("type".to_owned(), kind.into());
            }
            let mut line = serde_json::to_vec(&value).unwrap_or_default();
            line.push(b'\n');
            line.into()
        }
        Framing::Sse => format!("event: {kind}\ndata: {value}\n\n").into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preference_is_found_among_others_and_in_any_case() {
        let mut h = HeaderMap::new();
        assert!(!wanted(&h));
        h.append("prefer", HeaderValue::from_static("respond-async, wait=5"));
        assert!(!wanted(&h));
        h.append("prefer", HeaderValue::from_static("Queued-Notice; x=1"));
        assert!(wanted(&h));
        let mut h = HeaderMap::new();
        h.insert("prefer", HeaderValue::from_static("queued-notices"));
        assert!(!wanted(&h), "a longer token is another preference");
    }

    #[test]
    fn a_notice_in_each_framing() {
        let q = Queued {
            quota: "concurrent-sandboxes",
            wait_s: 30,
        };
        let line = frame(Framing::Ndjson, "queued", &q);
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "queued", "quota": "concurrent-sandboxes", "waitS": 30})
        );
        assert!(line.ends_with(b"\n"));
        let event = frame(Framing::Sse, "queued", &q);
        assert_eq!(
            &event[..],
            b"event: queued\ndata: {\"quota\":\"concurrent-sandboxes\",\"waitS\":30}\n\n"
        );
    }
}
