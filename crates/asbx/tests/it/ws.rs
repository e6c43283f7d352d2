//! The WebSocket transport (docs/protocol.md §13) over the real runner
//! (`GET /v1/ws`) and workspace (`GET /api/runs/ws`): the same lines as
//! NDJSON, resume with `attach` after a dropped socket (no gap, no
//! duplicate), client tools and cancel over the socket, a dropped socket is
//! a dropped client, the bearer checked before the upgrade, and bad
//! messages answered with coded `error` lines.

use std::time::{Duration, Instant};

use asbx_protocol::session::{EndReason, TerminatedBy};
use asbx_protocol::{Event, Line, LineDecoder, StepStatus};
use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use crate::harness::*;

pub(crate) type Sock =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// What the server sent next (a test's value, read once: its size is no
/// concern).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Frame {
    /// A line (its text and its parse).
    Line(String, Line),
    /// The server closed, with this code.
    Closed(Option<u16>),
}

/// `http://host/path` to `ws://host/path`.
pub(crate) fn ws_url(http: &str, path: &str) -> String {
    format!("{}{path}", http.replacen("http://", "ws://", 1))
}

/// Opens a socket, with `headers` on the upgrade request.
pub(crate) async fn connect(url: &str, headers: &[(&str, &str)]) -> Result<Sock, WsError> {
    let mut req = url.into_client_request().unwrap();
    for (k, v) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    tokio_tungstenite::connect_async(req).await.map(|(s, _)| s)
}

pub(crate) async fn send(sock: &mut Sock, msg: serde_json::Value) {
    sock.send(Message::text(msg.to_string())).await.unwrap();
}

/// The next line or the close (within 60 s).
pub(crate) async fn next(sock: &mut Sock) -> Frame {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(60), sock.next())
            .await
            .expect("a message in time");
        match msg {
            None => return Frame::Closed(None),
            Some(Err(WsError::ConnectionClosed | WsError::AlreadyClosed)) => {
                return Frame::Closed(None);
            }
            Some(Err(e)) => panic!("socket error: {e}"),
            Some(Ok(Message::Text(t))) => {
                let text = t.as_str().to_owned();
                assert!(!text.contains('\n'), "one line a message: {text}");
                let line: Line = serde_json::from_str(&text).expect("a protocol 2 line");
                return Frame::Line(text, line);
            }
            Some(Ok(Message::Close(f))) => return Frame::Closed(f.map(|f| u16::from(f.code))),
            Some(Ok(Message::Binary(_))) => panic!("the server sends text only"),
            Some(Ok(_)) => {}
        }
    }
}

/// Every line until the server closes; the lines and the close code.
pub(crate) async fn read_to_close(sock: &mut Sock) -> (Vec<(String, Line)>, Option<u16>) {
    let mut lines = Vec::new();
    loop {
        match next(sock).await {
            Frame::Line(t, l) => lines.push((t, l)),
            Frame::Closed(code) => return (lines, code),
        }
    }
}

/// The next line, which must be an `error` answering a message: its code.
pub(crate) async fn message_error(sock: &mut Sock) -> String {
    match next(sock).await {
        Frame::Line(_, l) => match l.event {
            Event::Error(e) => {
                assert_eq!(l.seq, 0, "an answer is outside the numbering");
                e.code
            }
            other => panic!("expected an error line, got {other:?}"),
        },
        Frame::Closed(c) => panic!("closed ({c:?}) instead of an error line"),
    }
}

fn v2(mut body: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    body["type"] = json!("dispatch");
    if let Some(obj) = extra.as_object() {
        for (k, v) in obj {
            body[k] = v.clone();
        }
    }
    body
}

fn assert_numbered(lines: &[Line]) {
    for w in lines.windows(2) {
        assert_eq!(w[1].seq, w[0].seq + 1, "no gap, no duplicate");
    }
}

#[tokio::test]
async fn a_socket_carries_the_sessions_lines_as_ndjson_does() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("ws-lines"));
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "echo out"}},
        {"say": "over a socket"}
    ]));
    let mut sock = connect(&ws_url(&runner.url, "/v1/ws"), &[]).await.unwrap();
    // No `protocol`: a socket speaks protocol 2.
    send(&mut sock, v2(ws.body(&t, &prompt), json!({}))).await;
    let (frames, code) = read_to_close(&mut sock).await;
    assert_eq!(code, Some(1000), "closed normally after the last line");
    let lines: Vec<Line> = frames.iter().map(|(_, l)| l.clone()).collect();
    assert!(matches!(&lines[0].event, Event::SessionInit(i) if i.protocol_version == 2));
    assert_eq!(lines[0].seq, 1);
    assert_numbered(&lines);
    assert!(
        lines
            .iter()
            .any(|l| matches!(&l.event, Event::Result(r) if r.message == "over a socket"))
    );
    assert!(
        matches!(&lines.last().unwrap().event, Event::SessionEnded(e) if e.reason == EndReason::Completed)
    );
    // Byte for byte the lines NDJSON replays.
    let all = reqwest::get(format!(
        "{}/v1/sessions/{}/events?after=0",
        runner.url, t.session
    ))
    .await
    .unwrap()
    .bytes()
    .await
    .unwrap();
    let ndjson: Vec<&str> = std::str::from_utf8(&all).unwrap().lines().collect();
    let texts: Vec<&str> = frames.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(texts, ndjson);
    runner.assert_clean().await;
}

#[tokio::test]
async fn a_dropped_socket_resumes_with_attach_without_gap_or_duplicate() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("ws-resume"));
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "sleep 1; echo after-the-drop"}},
        {"say": "resumed fine"}
    ]));
    let url = ws_url(&runner.url, "/v1/ws");
    let mut sock = connect(&url, &[]).await.unwrap();
    send(
        &mut sock,
        v2(ws.body(&t, &prompt), json!({"detach_grace_ms": 10000})),
    )
    .await;
    let mut seen = Vec::new();
    loop {
        match next(&mut sock).await {
            Frame::Line(_, l) => {
                let running = matches!(&l.event, Event::Step(s) if s.status == StepStatus::Running);
                seen.push(l);
                if running {
                    break;
                }
            }
            Frame::Closed(c) => panic!("closed early: {c:?}"),
        }
    }
    let last = seen.last().unwrap().seq;
    drop(sock);

    let mut sock = connect(&url, &[]).await.unwrap();
    send(
        &mut sock,
        json!({"type": "attach", "sessionId": t.session, "after": last}),
    )
    .await;
    let (frames, code) = read_to_close(&mut sock).await;
    assert_eq!(code, Some(1000));
    let rest: Vec<Line> = frames.into_iter().map(|(_, l)| l).collect();
    assert_eq!(rest[0].seq, last + 1, "right after the last seen line");
    let mut all = seen.clone();
    all.extend(rest.iter().cloned());
    assert_numbered(&all);
    assert!(
        rest.iter()
            .any(|l| matches!(&l.event, Event::Result(r) if r.message == "resumed fine"))
    );
    assert!(
        matches!(&rest.last().unwrap().event, Event::SessionEnded(e) if e.reason == EndReason::Completed),
        "the session outlived its socket: {rest:?}"
    );
    // What the first socket saw is the log's start.
    let replay = reqwest::get(format!(
        "{}/v1/sessions/{}/events?after=0",
        runner.url, t.session
    ))
    .await
    .unwrap()
    .bytes()
    .await
    .unwrap();
    let replay: Vec<Line> = LineDecoder::default()
        .push(&replay)
        .into_iter()
        .map(|l| l.unwrap())
        .collect();
    assert_eq!(replay, all);
    runner.assert_clean().await;
}

#[tokio::test]
async fn with_a_zero_grace_a_dropped_socket_cancels_the_session() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("ws-grace0"));
    let prompt = script(json!([{"tool": "shell", "args": {"command": "sleep 30"}}]));
    let mut sock = connect(&ws_url(&runner.url, "/v1/ws"), &[]).await.unwrap();
    send(
        &mut sock,
        v2(ws.body(&t, &prompt), json!({"detach_grace_ms": 0})),
    )
    .await;
    loop {
        match next(&mut sock).await {
            Frame::Line(_, l) if matches!(&l.event, Event::Step(s) if s.status == StepStatus::Running) =>
            {
                break;
            }
            Frame::Line(..) => {}
            Frame::Closed(c) => panic!("closed early: {c:?}"),
        }
    }
    drop(sock);
    crate::protocol2::await_daemon_cancel(&runner.url, &t.session).await;
    runner.assert_clean().await;
}

#[tokio::test]
async fn a_client_tool_call_round_trips_over_the_socket() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("ws-client"));
    let prompt = script(json!([
        {"tool": "pick_color", "args": {"palette": "warm"}},
        {"say": "the client picked"}
    ]));
    let tools = json!([{
        "name": "pick_color",
        "description": "Ask the user for a color",
        "parameters": {"type": "object", "properties": {"palette": {"type": "string"}}}
    }]);
    let mut sock = connect(&ws_url(&runner.url, "/v1/ws"), &[]).await.unwrap();
    send(
        &mut sock,
        v2(ws.body(&t, &prompt), json!({"client_tools": tools})),
    )
    .await;
    let mut lines: Vec<Line> = Vec::new();
    let mut answered = false;
    loop {
        match next(&mut sock).await {
            Frame::Closed(code) => {
                assert_eq!(code, Some(1000));
                break;
            }
            Frame::Line(_, l) => {
                if let Event::ToolCall(c) = &l.event {
                    assert_eq!(c.tool_name, "pick_color");
                    assert_eq!(c.args, json!({"palette": "warm"}));
                    send(
                        &mut sock,
                        json!({"type": "tool_result", "callId": "not-a-call", "result": 1}),
                    )
                    .await;
                    assert_eq!(message_error(&mut sock).await, "unknown_call");
                    send(
                        &mut sock,
                        json!({"type": "tool_result", "callId": c.call_id, "result": 1, "error": "x"}),
                    )
                    .await;
                    assert_eq!(message_error(&mut sock).await, "invalid_request");
                    send(
                        &mut sock,
                        json!({"type": "tool_result", "callId": c.call_id, "result": {"color": "amber"}}),
                    )
                    .await;
                    send(
                        &mut sock,
                        json!({"type": "tool_result", "callId": c.call_id, "result": {"color": "red"}}),
                    )
                    .await;
                    answered = true;
                }
                lines.push(l);
            }
        }
    }
    assert!(answered, "a tool_call line came");
    // The session's lines, and among them the answer to the duplicate.
    let (answers, session): (Vec<Line>, Vec<Line>) = lines.into_iter().partition(|l| l.seq == 0);
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(
        matches!(&answers[0].event, Event::Error(e) if e.code == "already_answered"),
        "{answers:?}"
    );
    assert_numbered(&session);
    let applied = session
        .iter()
        .position(|l| matches!(&l.event, Event::ToolResultApplied(_)));
    let result = session
        .iter()
        .position(|l| matches!(&l.event, Event::Result(r) if r.message == "the client picked"));
    assert!(
        applied.is_some() && result.is_some() && applied < result,
        "{session:?}"
    );
    runner.assert_clean().await;
}

#[tokio::test]
async fn cancel_over_the_socket_ends_the_session_terminated_by_the_daemon() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("ws-cancel"));
    let prompt = script(json!([{"tool": "shell", "args": {"command": "sleep 30"}}]));
    let mut sock = connect(&ws_url(&runner.url, "/v1/ws"), &[]).await.unwrap();
    send(&mut sock, v2(ws.body(&t, &prompt), json!({}))).await;
    loop {
        match next(&mut sock).await {
            Frame::Line(_, l) if matches!(&l.event, Event::Step(s) if s.status == StepStatus::Running) =>
            {
                break;
            }
            Frame::Line(..) => {}
            Frame::Closed(c) => panic!("closed early: {c:?}"),
        }
    }
    let asked = Instant::now();
    send(&mut sock, json!({"type": "cancel"})).await;
    let (frames, code) = read_to_close(&mut sock).await;
    assert!(asked.elapsed() < Duration::from_secs(15), "ended promptly");
    assert_eq!(code, Some(1000));
    match &frames.last().unwrap().1.event {
        Event::SessionEnded(e) => {
            assert_eq!(e.reason, EndReason::Terminated);
            assert_eq!(e.terminated_by, TerminatedBy::Daemon);
        }
        other => panic!("last line {other:?}"),
    }
    runner.assert_clean().await;
}

#[tokio::test]
async fn the_upgrade_needs_the_runners_bearer_and_bad_messages_get_coded_errors() {
    let runner = RunnerProc::start(&[("ASBX_RUNNER_TOKEN", "ws-test-token")]);
    let url = ws_url(&runner.url, "/v1/ws");
    // No bearer, or a wrong one: 401 problem+json, no upgrade.
    for headers in [vec![], vec![("authorization", "Bearer wrong")]] {
        match connect(&url, &headers).await {
            Err(WsError::Http(res)) => {
                assert_eq!(res.status(), 401);
                assert_eq!(
                    res.headers()["content-type"],
                    "application/problem+json",
                    "{res:?}"
                );
                let p: serde_json::Value =
                    serde_json::from_slice(res.body().as_deref().unwrap()).unwrap();
                assert_eq!(p["code"], "unauthorized");
            }
            other => panic!("upgraded without the bearer: {:?}", other.map(|_| ())),
        }
    }
    // A web page's upgrade (it says where from), even with the bearer: 403.
    match connect(
        &url,
        &[
            ("authorization", "Bearer ws-test-token"),
            ("origin", "http://evil.example"),
        ],
    )
    .await
    {
        Err(WsError::Http(res)) => {
            assert_eq!(res.status(), 403);
            let p: serde_json::Value =
                serde_json::from_slice(res.body().as_deref().unwrap()).unwrap();
            assert_eq!(p["code"], "cross_origin");
        }
        other => panic!("a page's upgrade went through: {:?}", other.map(|_| ())),
    }
    // A plain GET is not an upgrade: 400 problem+json.
    let res = reqwest::Client::new()
        .get(format!("{}/v1/ws", runner.url))
        .bearer_auth("ws-test-token")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let p: serde_json::Value = res.json().await.unwrap();
    assert_eq!(p["code"], "invalid_request");

    let auth = [("authorization", "Bearer ws-test-token")];
    let mut sock = connect(&url, &auth).await.unwrap();
    // Answered, and the socket goes on.
    sock.send(Message::text("not json")).await.unwrap();
    assert_eq!(message_error(&mut sock).await, "invalid_request");
    send(&mut sock, json!({"type": "launch"})).await;
    assert_eq!(message_error(&mut sock).await, "invalid_request");
    send(&mut sock, json!({"type": "cancel"})).await;
    assert_eq!(message_error(&mut sock).await, "not_attached");
    send(
        &mut sock,
        json!({"type": "tool_result", "callId": "c", "result": 1}),
    )
    .await;
    assert_eq!(message_error(&mut sock).await, "not_attached");
    sock.send(Message::binary(vec![1u8, 2, 3])).await.unwrap();
    assert_eq!(message_error(&mut sock).await, "invalid_request");
    // A dispatch that is refused ends the socket: the error, then 1008.
    send(
        &mut sock,
        json!({"type": "dispatch", "prompt": "hi", "agentUrl": "x"}),
    )
    .await;
    assert_eq!(message_error(&mut sock).await, "invalid_request");
    assert!(matches!(next(&mut sock).await, Frame::Closed(Some(1008))));

    // Attaching to a session that does not exist.
    let mut sock = connect(&url, &auth).await.unwrap();
    send(
        &mut sock,
        json!({"type": "attach", "sessionId": "no-such-session", "after": 0}),
    )
    .await;
    assert_eq!(message_error(&mut sock).await, "not_found");
    assert!(matches!(next(&mut sock).await, Frame::Closed(Some(1008))));

    // Protocol 1 has no place on a socket.
    let mut sock = connect(&url, &auth).await.unwrap();
    send(&mut sock, json!({"type": "dispatch", "protocol": 1})).await;
    assert_eq!(message_error(&mut sock).await, "invalid_request");
    assert!(matches!(next(&mut sock).await, Frame::Closed(Some(1008))));

    // A message over the 2 MiB cap of a dispatch body.
    let mut sock = connect(&url, &auth).await.unwrap();
    let big = json!({"type": "dispatch", "prompt": "x".repeat(3 << 20)});
    let _ = sock.send(Message::text(big.to_string())).await;
    match next(&mut sock).await {
        Frame::Line(_, l) => {
            assert!(
                matches!(&l.event, Event::Error(e) if e.code == "body_too_large"),
                "{l:?}"
            );
            assert!(matches!(
                next(&mut sock).await,
                Frame::Closed(Some(1008) | None)
            ));
        }
        Frame::Closed(c) => assert!(
            c.is_none() || c == Some(u16::from(CloseCode::Size)),
            "{c:?}"
        ),
    }
    runner.assert_clean().await;
}

#[tokio::test]
async fn a_workspace_socket_answers_client_tools_resumes_and_keeps_every_line() {
    let up = UpProc::start(&[]);
    let url = ws_url(&up.url, "/api/runs/ws");
    let prompt = script(json!([
        {"tool": "pick_color", "args": {"palette": "warm"}},
        {"tool": "shell", "args": {"command": "sleep 1; echo after-the-drop"}},
        {"say": "the client picked"}
    ]));
    let tools = json!([{
        "name": "pick_color",
        "description": "Ask the user for a color",
        "parameters": {"type": "object", "properties": {"palette": {"type": "string"}}}
    }]);
    let mut sock = connect(&url, &[]).await.unwrap();
    // No `protocol`: a socket speaks protocol 2.
    send(
        &mut sock,
        json!({"type": "dispatch", "prompt": prompt, "clientTools": tools}),
    )
    .await;
    let mut seen: Vec<Line> = Vec::new();
    loop {
        match next(&mut sock).await {
            Frame::Line(_, l) if l.seq == 0 => panic!("an unexpected answer: {l:?}"),
            Frame::Line(_, l) => {
                let call = match &l.event {
                    Event::ToolCall(c) => Some(c.call_id.clone()),
                    _ => None,
                };
                let applied = matches!(&l.event, Event::ToolResultApplied(_));
                seen.push(l);
                if let Some(call_id) = call {
                    send(
                        &mut sock,
                        json!({"type": "tool_result", "callId": "not-a-call", "result": 1}),
                    )
                    .await;
                    assert_eq!(message_error(&mut sock).await, "unknown_call");
                    send(
                        &mut sock,
                        json!({"type": "tool_result", "callId": call_id, "result": {"color": "amber"}}),
                    )
                    .await;
                }
                if applied {
                    break;
                }
            }
            Frame::Closed(c) => panic!("closed early: {c:?} after {seen:?}"),
        }
    }
    let run_id = seen[0].session_id.clone();
    let last = seen.last().unwrap().seq;
    drop(sock);

    let mut sock = connect(&url, &[]).await.unwrap();
    send(
        &mut sock,
        json!({"type": "attach", "runId": run_id, "after": last}),
    )
    .await;
    let (frames, code) = read_to_close(&mut sock).await;
    assert_eq!(code, Some(1000));
    let rest: Vec<Line> = frames.into_iter().map(|(_, l)| l).collect();
    assert_eq!(rest[0].seq, last + 1, "right after the last seen line");
    let mut all = seen.clone();
    all.extend(rest.iter().cloned());
    assert_numbered(&all);
    assert!(matches!(&all[0].event, Event::SessionInit(_)));
    assert!(
        rest.iter()
            .any(|l| matches!(&l.event, Event::Result(r) if r.message == "the client picked"))
    );
    assert!(
        matches!(&rest.last().unwrap().event, Event::SessionEnded(e) if e.reason == EndReason::Completed)
    );
    // The relay stored every line: the NDJSON replay is the same run.
    let stored = reqwest::get(format!("{}/api/runs/{run_id}/events?after=0", up.url))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let stored: Vec<Line> = LineDecoder::default()
        .push(&stored)
        .into_iter()
        .map(|l| l.unwrap())
        .collect();
    assert_eq!(stored, all);
    let run: serde_json::Value = reqwest::get(format!("{}/api/runs/{run_id}", up.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(run["termination"]["reason"], "completed", "{run}");
}

#[tokio::test]
async fn a_workspace_socket_needs_the_key_and_its_origin_cancels_and_codes_refusals() {
    let up = UpProc::start(&[("ASBX_REQUIRE_AUTH", "true")]);
    let key = crate::runs_api::new_workspace_key(&up, "ws-team");
    let bearer = format!("Bearer {key}");
    let url = ws_url(&up.url, "/api/runs/ws");
    for headers in [vec![], vec![("authorization", "Bearer asbx_key_wrong")]] {
        match connect(&url, &headers).await {
            Err(WsError::Http(res)) => {
                assert_eq!(res.status(), 401);
                let p: serde_json::Value =
                    serde_json::from_slice(res.body().as_deref().unwrap()).unwrap();
                assert_eq!(p["code"], "unauthorized");
            }
            other => panic!("upgraded without the key: {:?}", other.map(|_| ())),
        }
    }
    // Another origin's page can't open one (the session cookie would go along).
    match connect(
        &url,
        &[
            ("authorization", bearer.as_str()),
            ("origin", "http://evil.example"),
        ],
    )
    .await
    {
        Err(WsError::Http(res)) => {
            assert_eq!(res.status(), 403);
            let p: serde_json::Value =
                serde_json::from_slice(res.body().as_deref().unwrap()).unwrap();
            assert_eq!(p["code"], "cross_origin");
        }
        other => panic!(
            "a cross-origin upgrade went through: {:?}",
            other.map(|_| ())
        ),
    }
    let auth = [("authorization", bearer.as_str())];
    let mut sock = connect(&url, &auth).await.unwrap();
    sock.send(Message::text("{")).await.unwrap();
    assert_eq!(message_error(&mut sock).await, "invalid_request");
    send(&mut sock, json!({"type": "cancel"})).await;
    assert_eq!(message_error(&mut sock).await, "not_attached");
    send(
        &mut sock,
        json!({"type": "dispatch", "prompt": "x", "filter": {"types": ["nope"]}}),
    )
    .await;
    assert_eq!(message_error(&mut sock).await, "invalid_request");
    assert!(matches!(next(&mut sock).await, Frame::Closed(Some(1008))));
    let mut sock = connect(&url, &auth).await.unwrap();
    send(
        &mut sock,
        json!({"type": "attach", "runId": "0".repeat(32), "after": 0}),
    )
    .await;
    assert_eq!(message_error(&mut sock).await, "not_found");
    assert!(matches!(next(&mut sock).await, Frame::Closed(Some(1008))));

    // Cancel over the socket.
    let mut sock = connect(&url, &auth).await.unwrap();
    let prompt = script(json!([{"tool": "shell", "args": {"command": "sleep 30"}}]));
    send(&mut sock, json!({"type": "dispatch", "prompt": prompt})).await;
    loop {
        match next(&mut sock).await {
            Frame::Line(_, l) if matches!(&l.event, Event::Step(s) if s.status == StepStatus::Running) =>
            {
                break;
            }
            Frame::Line(..) => {}
            Frame::Closed(c) => panic!("closed early: {c:?}"),
        }
    }
    send(&mut sock, json!({"type": "cancel"})).await;
    let (frames, code) = read_to_close(&mut sock).await;
    assert_eq!(code, Some(1000));
    let ended = frames.iter().rev().find_map(|(_, l)| match &l.event {
        Event::SessionEnded(e) => Some(e.clone()),
        _ => None,
    });
    let ended = ended.expect("session_ended came");
    assert_eq!(ended.reason, EndReason::Terminated);
    assert_eq!(ended.terminated_by, TerminatedBy::Daemon);
}
