//! The workspace's API for runs through the real `asbx up` (docs/protocol.md
//! §7, docs/api-runs.md): a client tool answered through
//! `/api/runs/{id}/tool-result` (with its `404` and `409`), a dropped
//! protocol 2 caller resuming from `/api/runs/{id}/events` (NDJSON and SSE
//! with `Last-Event-ID`) with no gap and no duplicate, `DELETE` cancelling a
//! running run whose `GET` then shows the termination, and an encrypted run
//! kept as ciphertext only: the database and the logs hold no plaintext of
//! it, while the client decrypts every line.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use asbx_protocol::{Event, Line, LineDecoder};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::harness::*;

fn decode(bytes: &[u8]) -> Vec<Line> {
    LineDecoder::default()
        .push(bytes)
        .into_iter()
        .map(|l| l.unwrap())
        .collect()
}

/// Reads a streaming response line by line, calling `on` for each; bounded.
async fn read_lines(res: reqwest::Response, mut on: impl AsyncFnMut(&Line) -> bool) -> Vec<Line> {
    let mut stream = Box::pin(res.bytes_stream());
    let mut d = LineDecoder::default();
    let mut lines = Vec::new();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(60), stream.next())
        .await
        .expect("a line within 60 s")
    {
        for l in d.push(&chunk.unwrap()) {
            let l = l.unwrap();
            let stop = !on(&l).await;
            lines.push(l);
            if stop {
                return lines;
            }
        }
    }
    lines
}

async fn get_run(url: &str, id: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{url}/api/runs/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Waits (bounded) until the run is no longer `running`.
async fn settled(url: &str, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let run = get_run(url, id).await;
        if run["status"] != "running" || Instant::now() > deadline {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_client_tool_round_trips_through_the_workspace() {
    let up = UpProc::start(&[]);
    let client = reqwest::Client::new();
    let prompt = script(json!([
        {"tool": "pick_color", "args": {"palette": "warm"}},
        {"say": "the client picked"}
    ]));
    let tools = json!([{
        "name": "pick_color",
        "description": "Ask the user for a color",
        "parameters": {"type": "object", "properties": {"palette": {"type": "string"}}}
    }]);
    let res = client
        .post(format!("{}/api/runs", up.url))
        .json(&json!({"prompt": prompt, "protocol": 2, "clientTools": tools}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "application/x-ndjson");
    let run_id = res.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let url = format!("{}/api/runs/{run_id}/tool-result", up.url);
    let mut answered = false;
    let lines = read_lines(res, async |l: &Line| {
        if let Event::ToolCall(c) = &l.event {
            assert_eq!(c.tool_name, "pick_color");
            assert_eq!(c.args, json!({"palette": "warm"}));
            let unknown = client
                .post(&url)
                .json(&json!({"callId": "not-a-call", "result": 1}))
                .send()
                .await
                .unwrap();
            assert_eq!(unknown.status(), 404);
            let ok = client
                .post(&url)
                .json(&json!({"callId": c.call_id, "result": {"color": "amber"}}))
                .send()
                .await
                .unwrap();
            assert_eq!(ok.status(), 200, "{:?}", ok.text().await);
            let again = client
                .post(&url)
                .json(&json!({"callId": c.call_id, "result": {"color": "red"}}))
                .send()
                .await
                .unwrap();
            assert_eq!(again.status(), 409);
            answered = true;
        }
        true
    })
    .await;
    assert!(answered, "a tool_call line came: {lines:?}");
    // Protocol 2 as the runner sent it: session_init first, seq 1, 2, 3...
    assert!(matches!(lines[0].event, Event::SessionInit(_)), "{lines:?}");
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l.seq, i as u64 + 1, "{lines:?}");
    }
    let applied = lines
        .iter()
        .position(|l| matches!(l.event, Event::ToolResultApplied(_)));
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

    let run = get_run(&up.url, &run_id).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(run["result"], "the client picked", "{run}");
    assert_eq!(run["termination"]["reason"], "completed", "{run}");
    assert_eq!(run["termination"]["stats"]["toolCalls"], 1, "{run}");
    // An unknown run is 404 too.
    let p = client
        .post(format!("{}/api/runs/nope/tool-result", up.url))
        .json(&json!({"callId": "c", "result": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(p.status(), 404);
}

#[tokio::test]
async fn a_dropped_run_resumes_with_no_gap_and_no_duplicate() {
    let up = UpProc::start(&[]);
    let client = reqwest::Client::new();
    let words = (1..=24)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    let prompt = script(json!([{"say": words, "stream_ms": 100}]));
    let res = client
        .post(format!("{}/api/runs", up.url))
        .json(&json!({"prompt": prompt, "protocol": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let run_id = res.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    // Read until the third delta, then drop the connection.
    let mut deltas = 0;
    let first = read_lines(res, async |l: &Line| {
        if matches!(l.event, Event::Delta(_)) {
            deltas += 1;
        }
        deltas < 3
    })
    .await;
    let n = first.last().unwrap().seq;
    assert!(
        !matches!(first.last().unwrap().event, Event::SessionEnded(_)),
        "the run ended before the drop: {first:?}"
    );

    // NDJSON from after=N: the rest, from N + 1, to session_ended.
    let rest = client
        .get(format!("{}/api/runs/{run_id}/events?after={n}", up.url))
        .send()
        .await
        .unwrap();
    assert_eq!(rest.status(), 200);
    let rest = decode(&rest.bytes().await.unwrap());
    assert!(!rest.is_empty());
    for (i, l) in rest.iter().enumerate() {
        assert_eq!(l.seq, n + 1 + i as u64, "gap or duplicate: {rest:?}");
    }
    assert!(matches!(rest.last().unwrap().event, Event::SessionEnded(_)));
    let mut text = String::new();
    for l in first.iter().chain(&rest) {
        if let Event::Delta(d) = &l.event {
            text.push_str(&d.text);
        }
    }
    assert_eq!(text.split_whitespace().collect::<Vec<_>>().join(" "), words);

    // SSE with Last-Event-ID: the same lines, `id: <seq>`, named by type.
    let sse = client
        .get(format!("{}/api/runs/{run_id}/events", up.url))
        .header("accept", "text/event-stream")
        .header("last-event-id", n.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(sse.headers()["content-type"], "text/event-stream");
    let mut parser = asbx_protocol::sse::Parser::new();
    let events = parser.push(&sse.bytes().await.unwrap());
    assert_eq!(events.len(), rest.len());
    for (e, l) in events.iter().zip(&rest) {
        assert_eq!(e.id.as_deref(), Some(l.seq.to_string().as_str()));
        assert_eq!(e.event, l.event.type_name());
        let line: Line = serde_json::from_str(&e.data).unwrap();
        assert_eq!(&line, l);
    }

    // The whole run replays from 0 identically to what the two reads saw.
    let all = client
        .get(format!("{}/api/runs/{run_id}/events?after=0", up.url))
        .send()
        .await
        .unwrap();
    let all = decode(&all.bytes().await.unwrap());
    assert_eq!(all, first.iter().chain(&rest).cloned().collect::<Vec<_>>());
    let run = get_run(&up.url, &run_id).await;
    assert_eq!(run["status"], "succeeded", "{run}");
}

#[tokio::test]
async fn delete_cancels_a_running_run_and_get_shows_its_termination() {
    let up = UpProc::start(&[]);
    let client = reqwest::Client::new();
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "echo started; sleep 60"}},
        {"say": "never"}
    ]));
    let res = client
        .post(format!("{}/api/runs", up.url))
        .json(&json!({"prompt": prompt, "protocol": 2}))
        .send()
        .await
        .unwrap();
    let run_id = res.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let base = up.url.clone();
    let started = Instant::now();
    let mut deleted = false;
    let lines = read_lines(res, async |l: &Line| {
        if !deleted
            && matches!(&l.event, Event::Step(s) if s.status == asbx_protocol::StepStatus::Running)
        {
            let r = client
                .delete(format!("{base}/api/runs/{run_id}"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 202);
            deleted = true;
        }
        true
    })
    .await;
    assert!(deleted, "{lines:?}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "cancel took {:?}",
        started.elapsed()
    );
    let Event::SessionEnded(t) = &lines.last().unwrap().event else {
        panic!("no session_ended last: {lines:?}");
    };
    assert_eq!(t.reason, asbx_protocol::session::EndReason::Terminated);
    let run = settled(&up.url, &run_id).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "cancelled", "{run}");
    assert_eq!(run["termination"]["reason"], "terminated", "{run}");
    assert_eq!(run["termination"]["terminatedBy"], "daemon", "{run}");
    // Deleting an ended run changes nothing.
    let r = client
        .delete(format!("{}/api/runs/{run_id}", up.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
}

/// Issue 28, defect 4 (docs/protocol.md §9): the runner is killed while a
/// protocol 2 run streams through the workspace. The caller's stream does
/// not just stop: it ends with an `error` line `runner_lost`, as a chat turn
/// does, and the run is settled failed `runner_lost`.
#[tokio::test]
async fn a_run_whose_runner_is_killed_ends_with_runner_lost() {
    let mut runner = RunnerProc::start(&[]);
    // A runner that refuses connections is given the detach grace to come
    // back (runs::reattach): a short one here.
    let ws = WorkspaceProc::start(
        "127.0.0.1:0",
        &[
            ("SANDBOX_URL", &runner.url),
            ("ASBX_RUNNER_DETACH_GRACE_MS", "3000"),
        ],
    );
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "echo started; sleep 120"}},
        {"say": "never"}
    ]));
    let res = reqwest::Client::new()
        .post(format!("{}/api/runs", ws.url))
        .json(&json!({"prompt": prompt, "protocol": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let run_id = res.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let mut killed = false;
    let lines = read_lines(res, async |l: &Line| {
        if !killed && matches!(&l.event, Event::Stdout(o) if o.chunk.contains("started")) {
            runner.sigkill();
            killed = true;
        }
        true
    })
    .await;
    assert!(killed, "the step never started: {lines:?}");
    let Event::Error(e) = &lines.last().unwrap().event else {
        panic!("the stream did not end with an error line: {lines:?}");
    };
    assert_eq!(e.code, "runner_lost", "{lines:?}");
    // Numbered after the runner's last line, no gap.
    let n = lines.len();
    assert_eq!(lines[n - 1].seq, lines[n - 2].seq + 1, "{lines:?}");
    let run = settled(&ws.url, &run_id).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "runner_lost", "{run}");
    // A replay ends the same way.
    let all = reqwest::get(format!("{}/api/runs/{run_id}/events?after=0", ws.url))
        .await
        .unwrap();
    let all = decode(&all.bytes().await.unwrap());
    assert_eq!(all.last(), lines.last());
}

/// Issue 28, defect 5: a protocol 1 run whose caller went away keeps how
/// its session ended: `GET /api/runs/{id}` carries the termination
/// (terminated, by the daemon), not `null`.
#[tokio::test]
async fn a_protocol_1_run_whose_caller_left_carries_its_termination() {
    let up = UpProc::start(&[]);
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "echo started; sleep 60"}},
        {"say": "never"}
    ]));
    let res = reqwest::Client::new()
        .post(format!("{}/api/runs", up.url))
        .json(&json!({"prompt": prompt}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let run_id = res.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    // Read until the step runs, then go away.
    let first = read_lines(res, async |l: &Line| {
        !matches!(&l.event, Event::Step(s) if s.status == asbx_protocol::StepStatus::Running)
    })
    .await;
    assert!(
        matches!(&first.last().unwrap().event, Event::Step(_)),
        "{first:?}"
    );
    let run = settled(&up.url, &run_id).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "cancelled", "{run}");
    assert_eq!(run["termination"]["reason"], "terminated", "{run}");
    assert_eq!(run["termination"]["terminatedBy"], "daemon", "{run}");
}

/// `asbx up` with its log written to a file, so the test can read it.
struct LoggedUp {
    child: Child,
    url: String,
    data: tempfile::TempDir,
    log: std::path::PathBuf,
}

impl LoggedUp {
    fn start() -> LoggedUp {
        let data = tempfile::tempdir().unwrap();
        let log = data.path().join("up.log");
        // The most the workspace and runner ever log.
        let (child, banner) = spawn_up(
            data.path(),
            &[("ASBX_LOG", "debug")],
            Stdio::from(std::fs::File::create(&log).unwrap()),
        );
        LoggedUp {
            child,
            url: banner.url,
            data,
            log,
        }
    }

    /// SIGTERM, then SIGKILL after 5 s; the process is this test's own.
    fn stop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LoggedUp {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Every file under `dir`, concatenated.
fn all_bytes(dir: &std::path::Path) -> Vec<u8> {
    let mut out = Vec::new();
    for entry in walk(dir) {
        out.extend(std::fs::read(entry).unwrap_or_default());
    }
    out
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn an_encrypted_run_is_kept_and_relayed_as_ciphertext_only() {
    // The marker exists only inside the sandbox: the prompt holds the pieces
    // of a shell expression, never the marker itself.
    const MARKER: &str = "PLAINMARK-73421";
    let mut up = LoggedUp::start();
    let client = reqwest::Client::new();
    let mut session = asbx_crypto::ClientSession::new();
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "printf 'PLAIN%s-%s\\n' MARK $((73000+421))"}},
        {"tool": "pick_color", "args": {}},
        {"say": "done"}
    ]));
    assert!(!prompt.contains(MARKER));
    let tools =
        json!([{"name": "pick_color", "description": "", "parameters": {"type": "object"}}]);
    let res = client
        .post(format!("{}/api/runs", up.url))
        .json(&json!({
            "prompt": prompt, "protocol": 2, "clientTools": tools,
            "encryption": {"clientPublicKey": session.public_key()}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let run_id = res.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let result_url = format!("{}/api/runs/{run_id}/tool-result", up.url);

    // Positive control: the client decrypts every line, and the marker is
    // there; the client tool is answered sealed, through the workspace.
    let mut stream = Box::pin(res.bytes_stream());
    let mut raw = Vec::new();
    let mut pending = Vec::new();
    let mut plain = Vec::new();
    let mut first = true;
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(60), stream.next())
        .await
        .expect("a line within 60 s")
    {
        let chunk = chunk.unwrap();
        raw.extend_from_slice(&chunk);
        pending.extend_from_slice(&chunk);
        while let Some(i) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=i).collect();
            let line = &line[..line.len() - 1];
            let v: Value = serde_json::from_slice(line).unwrap();
            if first {
                first = false;
                assert_eq!(v["type"], "session_init");
                let init: asbx_crypto::EncryptionInit =
                    serde_json::from_value(v["encryption"].clone()).unwrap();
                // Relayed unchanged: the runner's signature verifies under
                // the key it keeps in its data folder, and under no other.
                let pinned =
                    std::fs::read_to_string(up.data.path().join("runner/identity.pub")).unwrap();
                asbx_crypto::verify_init(&init, &run_id, Some(pinned.trim())).unwrap();
                let stranger = asbx_crypto::IdentityKey::generate().public_key();
                assert!(asbx_crypto::verify_init(&init, &run_id, Some(&stranger)).is_err());
                session.agree(&init, &run_id).unwrap();
                continue;
            }
            assert!(v.get("encrypted").is_some(), "a clear line: {v}");
            let opened = Value::Object(session.decrypt_line(line).unwrap());
            if opened["type"] == "tool_call" {
                let call_id = opened["callId"].as_str().unwrap().to_owned();
                let sealed = session
                    .seal_tool_result(&call_id, br#"{"result":{"color":"amber"}}"#)
                    .unwrap();
                let r = client
                    .post(&result_url)
                    .json(&json!({"callId": call_id, "encrypted": sealed}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200, "{:?}", r.text().await);
            }
            plain.push(opened);
        }
    }
    assert!(!contains(&raw, MARKER.as_bytes()), "plaintext on the wire");
    let all = serde_json::to_string(&plain).unwrap();
    assert!(
        all.contains(MARKER),
        "the marker was really produced: {all}"
    );
    assert!(
        plain.iter().any(|l| l["type"] == "tool_result_applied"),
        "the sealed answer reached the agent: {all}"
    );
    assert_eq!(plain.last().unwrap()["type"], "session_ended");

    // The replay gives the very same sealed bytes.
    let replay = client
        .get(format!("{}/api/runs/{run_id}/events?after=0", up.url))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(replay.as_ref(), raw.as_slice());
    let run = get_run(&up.url, &run_id).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert!(run.get("termination").is_none(), "{run}");

    up.stop();
    let stored = all_bytes(up.data.path());
    assert!(
        contains(&stored, b"ciphertext"),
        "the run's lines are in the data directory"
    );
    assert!(
        !contains(&stored, MARKER.as_bytes()),
        "plaintext of an encrypted run in the data directory"
    );
    let log = std::fs::read(&up.log).unwrap();
    assert!(!log.is_empty(), "the log was captured");
    assert!(
        !contains(&log, MARKER.as_bytes()),
        "plaintext of an encrypted run in the logs"
    );
}

pub(crate) fn new_workspace_key(up: &UpProc, name: &str) -> String {
    let out = Command::new(ASBX)
        .args(["key", "--new-workspace", name])
        .env("ASBX_DATA", up.data.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("key"))
        .map(|k| k.trim().to_owned())
        .expect("a key line")
}

#[tokio::test]
async fn another_workspaces_key_finds_none_of_a_runs_routes() {
    let up = UpProc::start(&[("ASBX_REQUIRE_AUTH", "true")]);
    let key_a = new_workspace_key(&up, "team-a");
    let key_b = new_workspace_key(&up, "team-b");
    let client = reqwest::Client::new();
    let prompt = script(json!([{"tool": "pick_color", "args": {}}, {"say": "picked"}]));
    let tools = json!([{"name": "pick_color", "parameters": {"type": "object"}}]);
    let res = client
        .post(format!("{}/api/runs", up.url))
        .bearer_auth(&key_a)
        .json(&json!({"prompt": prompt, "protocol": 2, "clientTools": tools}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let run_id = res.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let base = up.url.clone();
    let lines = read_lines(res, async |l: &Line| {
        let Event::ToolCall(c) = &l.event else {
            return true;
        };
        // The run waits for its client tool: B tries every route on it.
        let routes = [
            client.get(format!("{base}/api/runs/{run_id}")),
            client.get(format!("{base}/api/runs/{run_id}/events?after=0")),
            client
                .post(format!("{base}/api/runs/{run_id}/tool-result"))
                .json(&json!({"callId": c.call_id, "result": "from b"})),
            client.delete(format!("{base}/api/runs/{run_id}")),
        ];
        for req in routes {
            let r = req.bearer_auth(&key_b).send().await.unwrap();
            assert_eq!(r.status(), 404, "{:?}", r.url().clone());
            assert_eq!(r.headers()["content-type"], "application/problem+json");
        }
        // Positive control: A answers its own call.
        let r = client
            .post(format!("{base}/api/runs/{run_id}/tool-result"))
            .bearer_auth(&key_a)
            .json(&json!({"callId": c.call_id, "result": "from a"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        true
    })
    .await;
    assert!(
        lines
            .iter()
            .any(|l| matches!(&l.event, Event::Result(r) if r.message == "picked")),
        "{lines:?}"
    );
    let run: Value = client
        .get(format!("{}/api/runs/{run_id}", up.url))
        .bearer_auth(&key_a)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(run["status"], "succeeded", "{run}");
}
