//! The API for runs against a fake runner (docs/protocol.md §7): the
//! protocol 2 choices reach the runner, a protocol 2 caller gets the lines
//! as they are, `events` replays what was kept and answers `410` for what
//! is not, bad choices are `400` naming the field, and another workspace's
//! run is not found by any of the run routes. The real runner's side (client
//! tools, cancel, resume, encryption) is in `crates/asbx/tests/it/runs_api.rs`.

use std::sync::Arc;

use futures::StreamExt as _;
use serde_json::{Value, json};

use crate::support::{Db, FakeRunner, Mode, TestWorkspace, client, on_both, problem, settled_run};

fn lines(body: &[u8]) -> Vec<Value> {
    body.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect()
}

/// `GET .../events?after=N` of a run: `410 events_gone`; the problem.
async fn events_gone(ws: &TestWorkspace, run_id: &str, after: impl std::fmt::Display) -> Value {
    let p = problem(
        client()
            .get(ws.url(&format!("/api/runs/{run_id}/events?after={after}")))
            .send()
            .await
            .unwrap(),
        410,
    )
    .await;
    assert_eq!(p["code"], "events_gone");
    p
}

/// A string of the shape of a client public key (docs/protocol.md §4); the
/// fake runner checks the shape only.
/// `POST /api/runs` of a protocol 2 run with prompt `x`: the response (its
/// body not read yet) and the run's id.
async fn start_run(ws: &TestWorkspace) -> (reqwest::Response, String) {
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x", "protocol": 2}))
        .send()
        .await
        .unwrap();
    let run_id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    (resp, run_id)
}

fn key() -> String {
    format!("B{}", "A".repeat(86))
}

on_both!(protocol_2_choices_reach_the_runner_and_lines_come_back_as_they_are);
async fn protocol_2_choices_reach_the_runner_and_lines_come_back_as_they_are(db: Db) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let tools = json!([{"name": "pick", "description": "d", "parameters": {"type": "object"}}]);
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({
            "prompt": "hello", "protocol": 2, "clientTools": tools,
            "filter": {"blockedTypes": ["heartbeat"]},
            "encryption": {"clientPublicKey": key()}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let run_id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let body = resp.bytes().await.unwrap();
    assert_eq!(body.as_ref(), runner.sent().as_slice());
    let d = &runner.dispatches()[0];
    assert_eq!(d.protocol, asbx_protocol::Protocol::V2);
    assert_eq!(d.detach_grace_ms, Some(60_000));
    assert_eq!(d.client_tools.len(), 1);
    assert_eq!(d.client_tools[0].name, "pick");
    assert_eq!(
        d.filter,
        Some(asbx_protocol::Filter::Block {
            blocked_types: vec![asbx_protocol::EventKind::Heartbeat]
        })
    );
    assert_eq!(d.encryption.as_ref().unwrap().client_public_key, key());
    let run = settled_run(&ws, &run_id).await;
    assert_eq!(run["status"], "succeeded");

    // Every line was kept: the replay is the stream, byte for byte.
    let replay = client()
        .get(ws.url(&format!("/api/runs/{run_id}/events")))
        .send()
        .await
        .unwrap();
    assert_eq!(replay.headers()["content-type"], "application/x-ndjson");
    assert_eq!(replay.bytes().await.unwrap(), body);
    let after = client()
        .get(ws.url(&format!("/api/runs/{run_id}/events?after=2")))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let seqs: Vec<u64> = lines(&after)
        .iter()
        .map(|l| l["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [3, 4]);
}

on_both!(lines_no_longer_kept_are_410_naming_the_oldest_kept);
async fn lines_no_longer_kept_are_410_naming_the_oldest_kept(db: Db) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let (resp, run_id) = start_run(&ws).await;
    resp.bytes().await.unwrap();
    settled_run(&ws, &run_id).await;
    // What pruning does past the retention (runs::events::KEEP_LINES lines):
    // lines before seq 3 are gone and the run says so.
    let pool = ws.db().await;
    sqlx::query("DELETE FROM run_events WHERE run_id = $1 AND seq < 3")
        .bind(&run_id)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE runs SET events_from = 3 WHERE id = $1")
        .bind(&run_id)
        .execute(&pool)
        .await
        .unwrap();
    for after in ["0", "1"] {
        let p = events_gone(&ws, &run_id, after).await;
        assert_eq!(p["oldestSeq"], 3);
    }
    // Last-Event-ID counts the same way.
    let p = problem(
        client()
            .get(ws.url(&format!("/api/runs/{run_id}/events")))
            .header("accept", "text/event-stream")
            .header("last-event-id", "1")
            .send()
            .await
            .unwrap(),
        410,
    )
    .await;
    assert_eq!(p["code"], "events_gone");
    // Positive control: from the oldest kept line on, it replays.
    let body = client()
        .get(ws.url(&format!("/api/runs/{run_id}/events?after=2")))
        .send()
        .await
        .unwrap();
    assert_eq!(body.status(), 200);
    assert_eq!(lines(&body.bytes().await.unwrap()).len(), 2);
}

#[tokio::test]
async fn bad_protocol_2_choices_are_400_naming_the_field() {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;
    let cases = [
        (json!({"protocol": 3}), "protocol"),
        (json!({"filter": {"types": ["step"]}}), "filter"),
        (
            json!({"protocol": 2, "filter": {"types": ["bogus"]}}),
            "filter.types",
        ),
        (json!({"protocol": 2, "filter": {"nope": []}}), "filter"),
        (json!({"protocol": 2, "clientTools": {}}), "clientTools"),
        (
            json!({"protocol": 2, "clientTools": [{"name": "bad name", "parameters": {}}]}),
            "clientTools[0].name",
        ),
        (
            json!({"protocol": 2, "clientTools": [{"name": "t", "parameters": 1}]}),
            "clientTools[0].parameters",
        ),
        (
            json!({"protocol": 2, "encryption": {"clientPublicKey": "short"}}),
            "encryption.clientPublicKey",
        ),
        (
            json!({"protocol": 2, "encryption": {"clientPublicKey": key(), "x": 1}}),
            "encryption.x",
        ),
    ];
    for (extra, field) in cases {
        let mut body = json!({"prompt": "x"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let p = problem(
            client()
                .post(ws.url("/api/runs"))
                .json(&body)
                .send()
                .await
                .unwrap(),
            400,
        )
        .await;
        let fields: Vec<&str> = p["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["field"].as_str().unwrap())
            .collect();
        assert!(fields.contains(&field), "{field} missing for {body}: {p}");
    }
    assert!(runner.dispatches().is_empty(), "nothing was dispatched");
}

#[tokio::test]
async fn another_workspaces_run_is_not_found_by_any_run_route() {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_with(Some(runner.url.clone()), |c| c.require_auth = true).await;
    let a = ws.workspace.create_workspace("a").await.unwrap();
    let b = ws.workspace.create_workspace("b").await.unwrap();
    let key_a = ws.workspace.create_api_key(&a, "ka").await.unwrap();
    let key_b = ws.workspace.create_api_key(&b, "kb").await.unwrap();
    let resp = client()
        .post(ws.url("/api/runs"))
        .bearer_auth(&key_a)
        .json(&json!({"prompt": "x", "protocol": 2}))
        .send()
        .await
        .unwrap();
    let run = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    resp.bytes().await.unwrap();
    use reqwest::Method as M;
    let routes = [
        (M::GET, format!("/api/runs/{run}"), None),
        (M::GET, format!("/api/runs/{run}/events"), None),
        (
            M::POST,
            format!("/api/runs/{run}/tool-result"),
            Some(json!({"callId": "c", "result": 1})),
        ),
        (M::DELETE, format!("/api/runs/{run}"), None),
    ];
    for (method, path, body) in &routes {
        let mut req = client()
            .request(method.clone(), ws.url(path))
            .bearer_auth(&key_b);
        if let Some(b) = body {
            req = req.json(b);
        }
        let p = problem(req.send().await.unwrap(), 404).await;
        assert_eq!(p["code"], "not_found", "{method} {path}");
    }
    // Positive control: the owner sees it.
    for (method, path, _) in &routes[..2] {
        let r = client()
            .request(method.clone(), ws.url(path))
            .bearer_auth(&key_a)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{method} {path}");
    }
}

/// A runner that answers every dispatch with `n` `delta` lines and a
/// result, in 64 KiB chunks.
async fn long_runner(n: u64) -> (url::Url, crate::support::AbortOnDrop) {
    fake_runner(n, true).await
}

/// [`long_runner`], with or without the terminal `result` line.
async fn fake_runner(n: u64, terminal: bool) -> (url::Url, crate::support::AbortOnDrop) {
    held_runner(n, terminal, None).await
}

/// [`fake_runner`] whose lines start, when `go` is given, only once it is
/// notified (the answer's head goes out at once); each dispatch waits.
async fn held_runner(
    n: u64,
    terminal: bool,
    go: Option<Arc<tokio::sync::Notify>>,
) -> (url::Url, crate::support::AbortOnDrop) {
    use axum::routing::post;
    async fn stream(
        axum::extract::State((n, terminal, go)): axum::extract::State<(
            u64,
            bool,
            Option<Arc<tokio::sync::Notify>>,
        )>,
        body: bytes::Bytes,
    ) -> axum::response::Response {
        let d = asbx_protocol::DispatchRequest::parse(&body).unwrap();
        let sid = d.session_id.unwrap();
        let mut out = String::new();
        for seq in 1..=n {
            out.push_str(&format!(
                r#"{{"seq":{seq},"ts":1,"sessionId":"{sid}","type":"delta","text":"w{seq} "}}"#
            ));
            out.push('\n');
        }
        if terminal {
            out.push_str(&format!(
                r#"{{"seq":{},"ts":1,"sessionId":"{sid}","type":"result","message":"ok"}}"#,
                n + 1
            ));
            out.push('\n');
        }
        let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = out
            .into_bytes()
            .chunks(64 * 1024)
            .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
            .collect();
        let held = futures::stream::once(async move {
            if let Some(go) = go {
                go.notified().await;
            }
            futures::stream::iter(chunks)
        })
        .flatten();
        axum::response::Response::new(axum::body::Body::from_stream(held))
    }
    let listener = crate::support::bind_loopback().await;
    let url = format!("http://{}", listener.local_addr().unwrap())
        .parse()
        .unwrap();
    let router = axum::Router::new()
        .route("/stream", post(stream))
        .with_state((n, terminal, go));
    (url, crate::support::serve(listener, router))
}

on_both!(a_long_run_keeps_its_newest_lines_and_410s_the_rest);
async fn a_long_run_keeps_its_newest_lines_and_410s_the_rest(db: Db) {
    // 11,500 lines: past the retention of 10,000 and across 11,000, where
    // the relay prunes.
    let total = 11_500u64;
    let (url, _runner) = long_runner(total).await;
    let ws = TestWorkspace::start_on(db, Some(url), |_| {}).await;
    let (resp, run_id) = start_run(&ws).await;
    let all = lines(&resp.bytes().await.unwrap());
    assert_eq!(all.len() as u64, total + 1, "the caller got every line");
    assert_eq!(settled_run(&ws, &run_id).await["status"], "succeeded");

    let p = events_gone(&ws, &run_id, 0).await;
    let oldest = p["oldestSeq"].as_u64().unwrap();
    assert!(
        // 11,501 lines: the newest 10,000 (a batch stored at once, pruned
        // at its end) to 10,501 (pruned when crossing 11,000).
        (1_001..=1_502).contains(&oldest),
        "kept between 10,000 and 11,000 lines: oldest {oldest}"
    );
    let kept = client()
        .get(ws.url(&format!("/api/runs/{run_id}/events?after={}", oldest - 1)))
        .send()
        .await
        .unwrap();
    assert_eq!(kept.status(), 200);
    let kept = lines(&kept.bytes().await.unwrap());
    assert_eq!(kept[0]["seq"], oldest);
    assert_eq!(kept.len() as u64, total + 2 - oldest);
    assert_eq!(kept.last().unwrap()["type"], "result");
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM run_events WHERE run_id = $1")
        .bind(&run_id)
        .fetch_one(&ws.db().await)
        .await
        .unwrap();
    assert_eq!(stored as u64, total + 2 - oldest, "older rows were deleted");
}

// A reader that stops reading while a long run goes on (many times the
// retention of 10,000 lines, and more than loopback buffers hold) gets, once
// it reads on, every line from the first in order with no gap: all of them
// (what it missed was still held for it), or up to where it fell behind
// what is kept, and then resuming after its last line is `410
// events_gone`. Never a line after a gap.
on_both!(a_stalled_reader_gets_no_gap);
async fn a_stalled_reader_gets_no_gap(db: Db) {
    let total = 600_000u64;
    let go = Arc::new(tokio::sync::Notify::new());
    let (url, _runner) = held_runner(total, true, Some(Arc::clone(&go))).await;
    let ws = TestWorkspace::start_on(db, Some(url), |_| {}).await;
    let (resp, run_id) = start_run(&ws).await;
    let mut slow = client()
        .get(ws.url(&format!("/api/runs/{run_id}/events?after=0")))
        .send()
        .await
        .unwrap();
    assert_eq!(slow.status(), 200);
    go.notify_one();
    let mut got = slow.chunk().await.unwrap().unwrap_or_default().to_vec();
    // The caller reads all of it meanwhile: the run goes on to its end.
    let all = lines(&resp.bytes().await.unwrap());
    assert_eq!(all.len() as u64, total + 1, "the caller got every line");
    assert_eq!(settled_run(&ws, &run_id).await["status"], "succeeded");
    // Now the slow reader reads on, to the end of its stream.
    while let Ok(Some(c)) = slow.chunk().await {
        got.extend_from_slice(&c);
    }
    // A stream cut mid-line leaves a partial last line: drop it.
    let complete = got.len() - got.iter().rev().take_while(|b| **b != b'\n').count();
    let seqs: Vec<u64> = lines(&got[..complete])
        .iter()
        .map(|l| l["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs.first(), Some(&1), "from the first line");
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "no gap in what the slow reader got"
    );
    let last = *seqs.last().unwrap();
    if last == total + 1 {
        return; // It got everything.
    }
    events_gone(&ws, &run_id, last).await;
}

#[tokio::test]
async fn an_agent_run_takes_the_same_protocol_2_choices() {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;
    let agent: Value = client()
        .post(ws.url("/api/agents"))
        .json(&json!({"name": "helper"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let path = format!("/api/agents/{}/runs", agent["id"].as_str().unwrap());
    // Bad choices and a bad prompt are named together; nothing is dispatched.
    let p = problem(
        client()
            .post(ws.url(&path))
            .json(&json!({"prompt": " ", "clientTools": []}))
            .send()
            .await
            .unwrap(),
        400,
    )
    .await;
    let fields: Vec<&str> = p["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert!(
        fields.contains(&"clientTools") && fields.contains(&"prompt"),
        "{p}"
    );
    assert!(runner.dispatches().is_empty());

    let tools = json!([{"name": "pick", "parameters": {"type": "object"}}]);
    let resp = client()
        .post(ws.url(&path))
        .json(&json!({"prompt": "go", "protocol": 2, "clientTools": tools,
                      "filter": {"types": ["result"]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().contains_key("x-asbx-agent-id"));
    let body = resp.bytes().await.unwrap();
    assert_eq!(body.as_ref(), runner.sent().as_slice());
    let d = &runner.dispatches()[0];
    assert_eq!(d.protocol, asbx_protocol::Protocol::V2);
    assert_eq!(d.client_tools[0].name, "pick");
    assert_eq!(
        d.filter,
        Some(asbx_protocol::Filter::Allow {
            types: vec![asbx_protocol::EventKind::Result]
        })
    );
}

/// A run whose relaying node went away (its row left `running`) is settled
/// `runner_lost` when asked about, once the runner no longer knows it; a run
/// this node relays is left alone.
#[tokio::test]
async fn a_run_nobody_relays_is_not_left_running() {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;
    let (mut held, live) = start_run(&ws).await;
    held.chunk().await.unwrap();
    // A run another node relayed until it died: its row, nothing else.
    let pool = ws.db().await;
    let lost = "lost-run-1";
    sqlx::query(
        "INSERT INTO runs (id, workspace_id, kind, status, prompt, model, env_json, config_json, \
         created_at, sandbox_url) SELECT $1, workspace_id, kind, status, prompt, model, env_json, \
         config_json, created_at, sandbox_url FROM runs WHERE id = $2",
    )
    .bind(lost)
    .bind(&live)
    .execute(&pool)
    .await
    .unwrap();
    let get = |id: String| {
        let url = ws.url(&format!("/api/runs/{id}"));
        async move {
            client()
                .get(url)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    // Young runs may not have reached their runner yet: left alone.
    assert_eq!(get(lost.to_owned()).await["status"], "running");
    ws.clock.advance(std::time::Duration::from_secs(61));
    let run = get(lost.to_owned()).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "runner_lost", "{run}");
    // Positive control: the run this node relays is still running.
    assert_eq!(get(live.clone()).await["status"], "running");
    runner.shared.release.notify_one();
    while held.chunk().await.unwrap().is_some() {}
    assert_eq!(settled_run(&ws, &live).await["status"], "succeeded");
}

// Two workspace nodes on one database: a replay asked of the node that
// does not relay the run follows it from the table, with no gap, and ends
// when the run ends. On PostgreSQL node b's safety poll is set far beyond
// the test's deadline, so only the relaying node's `NOTIFY` can wake it for
// the lines after the hold and for the end; on SQLite it polls.
on_both!(another_node_follows_a_run_it_does_not_relay);
async fn another_node_follows_a_run_it_does_not_relay(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let a = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let shared = a.database_url.clone();
    let b = TestWorkspace::start_with(Some(runner.url.clone()), |c| {
        c.database_url = Some(shared);
        c.replay_safety_poll = std::time::Duration::from_secs(600);
    })
    .await;
    let (mut on_a, run_id) = start_run(&a).await;
    on_a.chunk().await.unwrap();
    let mut on_b = client()
        .get(b.url(&format!("/api/runs/{run_id}/events?after=0")))
        .send()
        .await
        .unwrap();
    assert_eq!(on_b.status(), 200);
    let mut got = Vec::new();
    // The four lines sent before the hold, then the rest once released.
    while lines(&got).len() < 4 {
        got.extend_from_slice(&on_b.chunk().await.unwrap().unwrap());
    }
    // Let node b find nothing new and settle into waiting first.
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    runner.shared.release.notify_one();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while let Some(c) = on_b.chunk().await.unwrap() {
            got.extend_from_slice(&c);
        }
    })
    .await;
    assert!(ended.is_ok(), "node b's replay ended with the run");
    let seqs: Vec<u64> = lines(&got)
        .iter()
        .map(|l| l["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5, 6]);
    while on_a.chunk().await.unwrap().is_some() {}
    assert_eq!(settled_run(&b, &run_id).await["status"], "succeeded");
}

/// A runner whose stream ends without `result`, `error` or `session_ended`
/// (it went away): the caller gets the lines it sent, then an `error` line
/// `runner_lost` (issue 28, defect 4; docs/protocol.md §9), and the run is
/// settled failed `runner_lost`, never left `running`.
#[tokio::test]
async fn a_stream_ending_without_a_terminal_line_settles_the_run_failed() {
    let (url, _runner) = fake_runner(3, false).await;
    let ws = TestWorkspace::start(Some(url)).await;
    for protocol in [1, 2] {
        let resp = client()
            .post(ws.url("/api/runs"))
            .json(&json!({"prompt": "x", "protocol": protocol}))
            .send()
            .await
            .unwrap();
        let run_id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
        let body = resp.bytes().await.unwrap();
        // Protocol 1 carries no delta lines; protocol 2 all three; both end
        // with the workspace's `error` line.
        let got = lines(&body);
        assert_eq!(got.len(), if protocol == 2 { 4 } else { 1 }, "{got:?}");
        let last = got.last().unwrap();
        assert_eq!(last["type"], "error", "{last}");
        assert_eq!(last["code"], "runner_lost", "{last}");
        assert_eq!(last["seq"], if protocol == 2 { 4 } else { 1 }, "{last}");
        let run = settled_run(&ws, &run_id).await;
        assert_eq!(run["status"], "failed", "{run}");
        assert_eq!(run["error"]["code"], "runner_lost", "{run}");
        assert!(
            run["error"]["message"]
                .as_str()
                .unwrap()
                .contains("the runner's stream ended before the run did"),
            "{run}"
        );
    }
}
