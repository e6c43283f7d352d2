//! Protocol 2 over the real runner (docs/protocol.md §4): session_init first,
//! deltas, session_ended last with stats; filters keep seq; a dropped client
//! resumes from `/events` (NDJSON and SSE with Last-Event-ID) within the
//! detach grace, and a grace of 0 cancels at once; heartbeats fill silence;
//! `session_init.limits` are the session's effective limits, `stats` count
//! model calls, tool calls (client tools included) and tokens apart, and
//! `session_ended.message` says why whenever a session ends with an error.

use std::time::{Duration, Instant};

use asbx_protocol::{Event, Line, LineDecoder, StepStatus};
use futures::StreamExt;
use serde_json::json;

use crate::harness::*;

fn v2(mut body: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    body["protocol"] = json!(2);
    if let Some(obj) = extra.as_object() {
        for (k, v) in obj {
            body[k] = v.clone();
        }
    }
    body
}

fn decode(bytes: &[u8]) -> Vec<Line> {
    LineDecoder::default()
        .push(bytes)
        .into_iter()
        .map(|l| l.unwrap())
        .collect()
}

#[tokio::test]
async fn a_protocol_2_stream_opens_with_session_init_and_closes_with_session_ended() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("p2"));
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "echo out; echo err >&2"}},
        {"say": "two point oh"}
    ]));
    let (status, lines, err) = dispatch(&runner.url, &v2(ws.body(&t, &prompt), json!({}))).await;
    assert_eq!(status, 200, "{err}");
    assert!(
        matches!(&lines[0].event, Event::SessionInit(i) if i.protocol_version == 2 && i.limits.heartbeat_interval_ms == 5000)
    );
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l.seq, i as u64 + 1);
    }
    let types: Vec<&str> = lines.iter().map(|l| l.event.type_name()).collect();
    assert!(types.contains(&"delta"), "{types:?}");
    assert!(
        types.contains(&"stdout"),
        "tool output streams as stdout lines: {types:?}"
    );
    let n = lines.len();
    assert!(matches!(&lines[n - 2].event, Event::Result(r) if r.message == "two point oh"));
    match &lines[n - 1].event {
        Event::SessionEnded(e) => {
            assert_eq!(e.reason, asbx_protocol::session::EndReason::Completed);
            assert_eq!(e.terminated_by, asbx_protocol::session::TerminatedBy::Agent);
            // Two model calls (the tool call, then the answer), one tool call.
            assert_eq!(e.stats.steps, 2);
            assert_eq!(e.stats.tool_calls, 1);
            assert!(
                e.stats.input_tokens > 0 && e.stats.output_tokens > 0,
                "{:?}",
                e.stats
            );
            assert_eq!(e.exit_code, Some(0));
        }
        other => panic!("last line {other:?}"),
    }
    runner.assert_clean().await;
}

#[tokio::test]
async fn a_filter_hides_lines_without_renumbering_and_keeps_terminal_lines() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("filter"));
    let prompt =
        script(json!([{"tool": "shell", "args": {"command": "echo hi"}}, {"say": "filtered"}]));
    let body = v2(ws.body(&t, &prompt), json!({"filter": {"types": ["step"]}}));
    let (_, lines, _) = dispatch(&runner.url, &body).await;
    let types: Vec<&str> = lines.iter().map(|l| l.event.type_name()).collect();
    assert_eq!(
        types,
        vec!["step", "step", "result", "session_ended"],
        "{types:?}"
    );
    let seqs: Vec<u64> = lines.iter().map(|l| l.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    assert!(
        seqs[0] > 1,
        "session_init and logs kept their numbers: {seqs:?}"
    );
    runner.assert_clean().await;
}

#[tokio::test]
async fn a_dropped_client_resumes_from_events_within_the_grace() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("resume"));
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "sleep 1; echo after-the-drop"}},
        {"say": "resumed fine"}
    ]));
    let body = v2(ws.body(&t, &prompt), json!({"detach_grace_ms": 10000}));
    let res = post_stream(&runner.url, &body).await;
    let mut stream = Box::pin(res.bytes_stream());
    let mut d = LineDecoder::default();
    let mut seen = Vec::new();
    'outer: while let Some(chunk) = stream.next().await {
        for l in d.push(&chunk.unwrap()) {
            let l = l.unwrap();
            let running = matches!(&l.event, Event::Step(s) if s.status == StepStatus::Running);
            seen.push(l);
            if running {
                break 'outer;
            }
        }
    }
    let last = seen.last().unwrap().seq;
    drop(stream);
    // Reconnect with SSE and Last-Event-ID: everything after, then the end.
    let res = reqwest::Client::new()
        .get(format!("{}/v1/sessions/{}/events", runner.url, t.session))
        .header("accept", "text/event-stream")
        .header("last-event-id", last.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    let text = tokio::time::timeout(Duration::from_secs(30), res.text())
        .await
        .unwrap()
        .unwrap();
    let mut ids = Vec::new();
    let mut data = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        for line in block.lines() {
            if let Some(id) = line.strip_prefix("id: ") {
                ids.push(id.parse::<u64>().unwrap());
            }
            if let Some(d) = line.strip_prefix("data: ") {
                data.push(serde_json::from_str::<Line>(d).unwrap());
            }
        }
    }
    assert_eq!(
        ids.first(),
        Some(&(last + 1)),
        "resumes right after the last seen line"
    );
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "no gap: {ids:?}");
    assert!(
        matches!(&data.last().unwrap().event, Event::SessionEnded(e) if e.reason == asbx_protocol::session::EndReason::Completed)
    );
    assert!(
        data.iter()
            .any(|l| matches!(&l.event, Event::Result(r) if r.message == "resumed fine"))
    );
    // The whole session is still there from the start, as NDJSON.
    let all = reqwest::get(format!(
        "{}/v1/sessions/{}/events?after=0",
        runner.url, t.session
    ))
    .await
    .unwrap()
    .bytes()
    .await
    .unwrap();
    let all = decode(&all);
    assert_eq!(all.len() as u64, data.last().unwrap().seq);
    assert_eq!(all[..seen.len()], seen[..], "the replay is the same lines");
    runner.assert_clean().await;
}

#[tokio::test]
async fn with_a_zero_grace_a_dropped_client_cancels_the_session() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("grace0"));
    let prompt = script(json!([{"tool": "shell", "args": {"command": "sleep 30"}}]));
    let body = v2(ws.body(&t, &prompt), json!({"detach_grace_ms": 0}));
    let res = post_stream(&runner.url, &body).await;
    let stream = crate::dispatch::read_until(
        res,
        |e| matches!(e, Event::Step(s) if s.status == StepStatus::Running),
    )
    .await;
    drop(stream);
    crate::protocol2::await_daemon_cancel(&runner.url, &t.session).await;
    runner.assert_clean().await;
}

#[tokio::test]
async fn heartbeats_fill_silence_and_events_of_protocol_1_sessions_are_refused() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("beat"));
    let prompt = script(json!([{"sleep_ms": 5600}, {"say": "woke up"}]));
    let (_, lines, _) = dispatch(&runner.url, &v2(ws.body(&t, &prompt), json!({}))).await;
    let beats = lines
        .iter()
        .filter(|l| matches!(l.event, Event::Heartbeat(_)))
        .count();
    assert!(beats >= 1, "{lines:?}");

    let t1 = ws.mint(&session_id("p1"));
    let (_, _, _) = dispatch(&runner.url, &ws.body(&t1, &script(json!([{"say": "v1"}])))).await;
    let res = reqwest::get(format!("{}/v1/sessions/{}/events", runner.url, t1.session))
        .await
        .unwrap();
    assert_eq!(res.status(), 409);
    let p: serde_json::Value = res.json().await.unwrap();
    assert_eq!(p["code"], "not_protocol_2");
    let res = reqwest::Client::new()
        .post(format!(
            "{}/v1/sessions/{}/tool-result",
            runner.url, t.session
        ))
        .json(&json!({"callId": "nope", "result": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    runner.assert_clean().await;
}

#[tokio::test]
async fn a_client_tool_call_round_trips_through_the_runner() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("client"));
    let prompt = script(json!([
        {"tool": "pick_color", "args": {"palette": "warm"}},
        {"say": "the client picked"}
    ]));
    let tools = json!([{
        "name": "pick_color",
        "description": "Ask the user for a color",
        "parameters": {"type": "object", "properties": {"palette": {"type": "string"}}}
    }]);
    let body = v2(ws.body(&t, &prompt), json!({"client_tools": tools}));
    let res = post_stream(&runner.url, &body).await;
    let mut stream = Box::pin(res.bytes_stream());
    let mut d = LineDecoder::default();
    let mut lines: Vec<Line> = Vec::new();
    let mut answered = false;
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .unwrap()
    {
        for l in d.push(&chunk.unwrap()) {
            let l = l.unwrap();
            if let Event::ToolCall(c) = &l.event {
                assert_eq!(c.tool_name, "pick_color");
                assert_eq!(c.args, json!({"palette": "warm"}));
                let url = format!("{}/v1/sessions/{}/tool-result", runner.url, t.session);
                let client = reqwest::Client::new();
                let bad = client
                    .post(&url)
                    .json(&json!({"callId": "not-a-call", "result": 1}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(bad.status(), 404);
                let both = client
                    .post(&url)
                    .json(&json!({"callId": c.call_id, "result": 1, "error": "x"}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(both.status(), 400);
                let ok = client
                    .post(&url)
                    .json(&json!({"callId": c.call_id, "result": {"color": "amber"}}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(ok.status(), 200);
                let again = client
                    .post(&url)
                    .json(&json!({"callId": c.call_id, "result": {"color": "red"}}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(again.status(), 409);
                answered = true;
            }
            lines.push(l);
        }
    }
    assert!(answered, "a tool_call line came");
    let call = lines.iter().find_map(|l| match &l.event {
        Event::ToolCall(c) => Some(c.call_id.clone()),
        _ => None,
    });
    let applied = lines.iter().position(
        |l| matches!(&l.event, Event::ToolResultApplied(a) if Some(&a.call_id) == call.as_ref()),
    );
    let result = lines
        .iter()
        .position(|l| matches!(&l.event, Event::Result(r) if r.message == "the client picked"));
    assert!(
        applied.is_some() && result.is_some() && applied < result,
        "{lines:?}"
    );
    assert!(matches!(
        lines.last().unwrap().event,
        Event::SessionEnded(_)
    ));
    runner.assert_clean().await;
}

/// The usage the agent logged: (model calls, tool calls, input, output tokens).
fn logged_usage(lines: &[Line]) -> (u32, u32, u64, u64) {
    let msg = lines
        .iter()
        .find_map(|l| match &l.event {
            Event::Log(g) if g.message.starts_with("usage: ") => Some(g.message.clone()),
            _ => None,
        })
        .expect("the agent logs its usage");
    let n: Vec<u64> = msg
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect();
    (n[0] as u32, n[1] as u32, n[2], n[3])
}

#[tokio::test]
async fn session_init_carries_the_effective_limits_not_the_runners_ceilings() {
    let runner = RunnerProc::start(&[]);
    let caps = asbx_protocol::gateway::MaxLimits::default();
    let mut config = scripted("scripted:test");
    // More steps and time than the runner allows, fewer tool calls.
    config.limits = Some(asbx_protocol::callback::RunLimits {
        max_steps: Some(caps.max_steps + 1000),
        max_tool_calls: Some(3),
        max_duration_ms: Some(caps.max_duration_ms * 10),
        ..Default::default()
    });
    let ws = FakeWorkspace::start(config).await;
    let t = ws.mint(&session_id("limits"));
    let (status, lines, err) = dispatch(
        &runner.url,
        &v2(ws.body(&t, &script(json!([{"say": "ok"}]))), json!({})),
    )
    .await;
    assert_eq!(status, 200, "{err}");
    match &lines[0].event {
        Event::SessionInit(i) => {
            assert_eq!(i.limits.max_steps, caps.max_steps, "clamped to the cap");
            assert_eq!(i.limits.max_duration_ms, caps.max_duration_ms);
            assert_eq!(i.limits.max_tool_calls, 3, "the request's own value");
            assert_eq!(i.limits.heartbeat_interval_ms, 5000);
        }
        other => panic!("first line {other:?}"),
    }

    // Positive control: with no /config limits, the caps are the limits.
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("nolimits"));
    let (_, lines, _) = dispatch(
        &runner.url,
        &v2(ws.body(&t, &script(json!([{"say": "ok"}]))), json!({})),
    )
    .await;
    match &lines[0].event {
        Event::SessionInit(i) => {
            assert_eq!(i.limits.max_tool_calls, caps.max_tool_calls);
            assert_eq!(i.limits.max_steps, caps.max_steps);
        }
        other => panic!("first line {other:?}"),
    }
    runner.assert_clean().await;
}

#[tokio::test]
async fn stats_count_model_calls_tool_calls_and_tokens_apart() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("stats"));
    // Two model calls: one asking for a shell tool and a client tool at
    // once, then the answer.
    let prompt = script(json!([
        {"tools": [
            {"tool": "shell", "args": {"command": "echo counted"}},
            {"tool": "ask_user", "args": {"q": "sure?"}}
        ]},
        {"say": "counted right"}
    ]));
    let tools = json!([{
        "name": "ask_user",
        "description": "Ask the user",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}
    }]);
    let body = v2(ws.body(&t, &prompt), json!({"client_tools": tools}));
    let res = post_stream(&runner.url, &body).await;
    let mut stream = Box::pin(res.bytes_stream());
    let mut d = LineDecoder::default();
    let mut lines: Vec<Line> = Vec::new();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(60), stream.next())
        .await
        .unwrap()
    {
        for l in d.push(&chunk.unwrap()) {
            let l = l.unwrap();
            if let Event::ToolCall(c) = &l.event {
                let ok = reqwest::Client::new()
                    .post(format!(
                        "{}/v1/sessions/{}/tool-result",
                        runner.url, t.session
                    ))
                    .json(&json!({"callId": c.call_id, "result": "yes"}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(ok.status(), 200);
            }
            lines.push(l);
        }
    }
    let stats = match &lines.last().unwrap().event {
        Event::SessionEnded(e) => {
            assert_eq!(e.reason, asbx_protocol::session::EndReason::Completed);
            e.stats.clone()
        }
        other => panic!("last line {other:?}"),
    };
    assert_eq!(stats.steps, 2, "model calls: {stats:?}");
    assert_eq!(stats.tool_calls, 2, "shell and the client tool: {stats:?}");
    let (calls, tools, input, output) = logged_usage(&lines);
    assert_eq!((calls, tools), (2, 2), "the agent's own count agrees");
    assert_eq!(stats.input_tokens, input);
    assert_eq!(stats.output_tokens, output);
    assert!(input > 0 && output > 0 && input != output, "{stats:?}");
    runner.assert_clean().await;
}

#[tokio::test]
async fn session_ended_says_why_whenever_the_session_ended_with_an_error() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    // The agent's own error: the model call fails.
    let t = ws.mint(&session_id("err-agent"));
    let (_, lines, _) = dispatch(
        &runner.url,
        &v2(
            ws.body(&t, &script(json!([{"fail": "the model fell over"}]))),
            json!({}),
        ),
    )
    .await;
    let error = lines.iter().find_map(|l| match &l.event {
        Event::Error(e) => Some(e.message.clone()),
        _ => None,
    });
    match &lines.last().unwrap().event {
        Event::SessionEnded(e) => {
            assert_eq!(e.reason, asbx_protocol::session::EndReason::Error);
            assert!(
                error
                    .as_deref()
                    .is_some_and(|m| m.contains("the model fell over"))
            );
            assert_eq!(e.message, error, "the error line's message");
        }
        other => panic!("last line {other:?}"),
    }
    // A crash: the runner's own message.
    let t = ws.mint(&session_id("err-crash"));
    let (_, lines, _) = dispatch(
        &runner.url,
        &v2(ws.body(&t, &script(json!([{"crash": 3}]))), json!({})),
    )
    .await;
    match &lines.last().unwrap().event {
        Event::SessionEnded(e) => {
            assert_eq!(e.reason, asbx_protocol::session::EndReason::Error);
            let m = e.message.as_deref().unwrap_or_default();
            assert!(m.contains("exited with code 3"), "{m}");
        }
        other => panic!("last line {other:?}"),
    }
    // Positive control: a completed session carries no message.
    let t = ws.mint(&session_id("err-none"));
    let (_, lines, _) = dispatch(
        &runner.url,
        &v2(ws.body(&t, &script(json!([{"say": "fine"}]))), json!({})),
    )
    .await;
    match &lines.last().unwrap().event {
        Event::SessionEnded(e) => {
            assert_eq!(e.reason, asbx_protocol::session::EndReason::Completed);
            assert_eq!(e.message, None);
        }
        other => panic!("last line {other:?}"),
    }
    // The same termination is what GET /v1/sessions/{id} reports.
    let info: serde_json::Value = reqwest::get(format!("{}/v1/sessions/{}", runner.url, t.session))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["termination"]["reason"], "completed");
    runner.assert_clean().await;
}

/// Issue 28, defect 2: `ASBX_MAX_RUNTIME_SEC` is the duration ceiling
/// `session_init` announces (it said 8 h whatever the cap).
#[tokio::test]
async fn session_init_announces_the_runtime_cap() {
    let runner = RunnerProc::start(&[("ASBX_MAX_RUNTIME_SEC", "20")]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("capinit"));
    let (status, lines, err) = dispatch(
        &runner.url,
        &v2(ws.body(&t, &script(json!([{"say": "ok"}]))), json!({})),
    )
    .await;
    assert_eq!(status, 200, "{err}");
    match &lines[0].event {
        Event::SessionInit(i) => assert_eq!(i.limits.max_duration_ms, 20_000),
        other => panic!("first line {other:?}"),
    }
    assert!(
        lines
            .iter()
            .any(|l| matches!(&l.event, Event::Result(r) if r.message == "ok")),
        "{lines:?}"
    );
    runner.assert_clean().await;
}

/// Waits (5 s at most) for the runner to say `session` ended, cancelled by
/// the daemon (its client went away with no grace).
pub(crate) async fn await_daemon_cancel(runner_url: &str, session: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let info: serde_json::Value = reqwest::get(format!("{runner_url}/v1/sessions/{session}"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if info["status"] == "ended" {
            assert_eq!(info["termination"]["reason"], "terminated");
            assert_eq!(info["termination"]["terminatedBy"], "daemon");
            return;
        }
        assert!(Instant::now() < deadline, "not cancelled: {info}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
