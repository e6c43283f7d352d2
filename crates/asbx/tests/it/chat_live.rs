//! The Assistant's live chat through the real `asbx up` (workspace, runner,
//! jail, the built-in scripted model): answer text streams as `delta`
//! events, a tool's output streams as `stdout` events while it runs, and a
//! crashed or cancelled turn shows its termination fields live and in the
//! saved thread (docs/protocol.md §4, §7).

use std::time::{Duration, Instant};

use asbx_protocol::sse::{Parser, SseEvent};
use futures::StreamExt as _;
use serde_json::{Value, json};

use crate::harness::*;

/// One SSE event and when it arrived.
struct Timed {
    at: Instant,
    /// Unix ms on arrival, beside the runner's `ts` stamp.
    wall_ms: u64,
    event: SseEvent,
    data: Value,
}

impl Timed {
    fn name(&self) -> &str {
        &self.event.event
    }
}

/// A chat turn's SSE stream as it arrives.
struct Turn {
    chat_id: String,
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    parser: Parser,
    events: Vec<Timed>,
    /// The SSE comments seen (a runner `heartbeat` is one).
    comments: Vec<String>,
}

impl Turn {
    async fn start(url: &str, body: Value) -> Turn {
        let res = reqwest::Client::new()
            .post(format!("{url}/api/assistant/chat/stream"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{:?}", res.text().await);
        assert_eq!(
            res.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        let chat_id = res.headers()["x-asbx-chat-id"].to_str().unwrap().to_owned();
        Turn {
            chat_id,
            body: res.bytes_stream().boxed(),
            parser: Parser::new(),
            events: Vec::new(),
            comments: Vec::new(),
        }
    }

    /// Reads until an event satisfies `stop` (inclusive); returns its index.
    async fn until(&mut self, stop: impl Fn(&Timed) -> bool) -> usize {
        self.until_with(|t| t.events.iter().position(&stop)).await
    }

    /// Reads until `found` finds something in what was read.
    async fn until_with<T>(&mut self, found: impl Fn(&Turn) -> Option<T>) -> T {
        let read = async {
            loop {
                if let Some(i) = found(self) {
                    return i;
                }
                let chunk = self
                    .body
                    .next()
                    .await
                    .expect("the stream ended early")
                    .unwrap();
                let at = Instant::now();
                let wall_ms = asbx_protocol::now_ms();
                // Comments are lines starting with ':' (chunks hold whole
                // lines here: the server flushes frame by frame).
                for line in String::from_utf8_lossy(&chunk).lines() {
                    if let Some(c) = line.strip_prefix(':') {
                        self.comments.push(c.trim().to_owned());
                    }
                }
                for event in self.parser.push(&chunk) {
                    let data = serde_json::from_str(&event.data).unwrap_or(Value::Null);
                    self.events.push(Timed {
                        at,
                        wall_ms,
                        event,
                        data,
                    });
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(240), read)
            .await
            .expect("the turn went on too long")
    }

    async fn until_done(&mut self) -> usize {
        self.until(|e| e.name() == "done").await
    }

    fn named(&self, name: &str) -> Vec<&Timed> {
        self.events.iter().filter(|e| e.name() == name).collect()
    }

    fn index_of(&self, name: &str) -> usize {
        self.events
            .iter()
            .position(|e| e.name() == name)
            .unwrap_or_else(|| panic!("no {name} event in {:?}", self.names()))
    }

    fn names(&self) -> Vec<&str> {
        self.events.iter().map(Timed::name).collect()
    }
}

async fn chat(up: &UpProc, chat_id: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{}/api/assistant/chats/{chat_id}", up.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The saved assistant message of a settled chat (its second message).
async fn saved_answer(up: &UpProc, chat_id: &str) -> Value {
    let d = chat(up, chat_id).await;
    assert!(d["activeTurnId"].is_null(), "{d}");
    let messages = d["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{d}");
    assert_eq!(messages[1]["role"], "assistant");
    messages[1]["content"].clone()
}

/// Every event with an `id` carries the seq of its line, increasing.
fn assert_ids_increase(turn: &Turn) {
    let ids: Vec<u64> = turn
        .events
        .iter()
        .filter(|e| !matches!(e.name(), "turn" | "done"))
        .filter_map(|e| e.event.id.as_deref())
        .map(|id| id.parse().unwrap())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
}

#[tokio::test]
async fn answer_text_streams_as_deltas_and_equals_the_saved_text() {
    let up = UpProc::start(&[]);
    let answer = "Streaming **works**: each word of this answer arrives on its own, in order.";
    let prompt = script(json!([{ "say": answer, "stream_ms": 150 }]));
    let mut turn = Turn::start(&up.url, json!({ "message": prompt })).await;
    turn.until_done().await;
    assert_ids_increase(&turn);

    let result = turn.index_of("result");
    let deltas = turn.named("delta");
    assert!(deltas.len() >= 8, "one delta per word: {:?}", turn.names());
    let last_delta = turn
        .events
        .iter()
        .rposition(|e| e.name() == "delta")
        .unwrap();
    assert!(last_delta < result, "{:?}", turn.names());
    let streamed: String = deltas
        .iter()
        .map(|d| d.data["text"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, answer);
    assert_eq!(turn.events[result].data["message"], answer);
    // Relayed as they came, not held until the end: the first word was on
    // the client well before the answer was complete.
    let early = turn.events[result].at - deltas[0].at;
    assert!(early >= Duration::from_millis(700), "{early:?}");
    // A figure, not an assertion: from the runner stamping a model's token
    // to this client reading it through the workspace.
    let lag: Vec<u64> = deltas
        .iter()
        .map(|d| d.wall_ms.saturating_sub(d.data["ts"].as_u64().unwrap()))
        .collect();
    eprintln!(
        "chat_live: token stamped by the runner to SSE client: first {} ms, max {} ms",
        lag[0],
        lag.iter().max().unwrap()
    );
    let done = turn.named("done");
    assert_eq!(done[0].data["status"], "succeeded");
    assert!(turn.named("log").is_empty());

    let saved = saved_answer(&up, &turn.chat_id).await;
    assert_eq!(saved, json!([{ "type": "text", "text": streamed }]));
}

#[tokio::test]
async fn a_tools_output_streams_while_it_runs() {
    let up = UpProc::start(&[]);
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "for i in 1 2 3 4 5 6; do echo line$i; sleep 0.3; done"}},
        {"say": "counted"}
    ]));
    let mut turn = Turn::start(&up.url, json!({ "message": prompt })).await;
    turn.until_done().await;
    assert_ids_increase(&turn);

    let running = turn
        .events
        .iter()
        .find(|e| e.name() == "step" && e.data["status"] == "running")
        .expect("a running step");
    let step_id = running.data["id"].as_str().unwrap().to_owned();
    let finished = turn
        .events
        .iter()
        .position(|e| e.name() == "step" && e.data["status"] == "succeeded")
        .expect("the step finished");
    let outputs: Vec<&Timed> = turn
        .events
        .iter()
        .filter(|e| e.name() == "stdout" && e.data["stepId"] == step_id.as_str())
        .collect();
    assert!(outputs.len() >= 3, "{:?}", turn.names());
    let text: String = outputs
        .iter()
        .map(|o| o.data["chunk"].as_str().unwrap())
        .collect();
    assert_eq!(text, "line1\nline2\nline3\nline4\nline5\nline6\n");
    // Spread over the ~1.5 s the tool ran, and all before the step ended.
    let spread = outputs.last().unwrap().at - outputs[0].at;
    assert!(spread >= Duration::from_millis(900), "{spread:?}");
    let last_output = turn
        .events
        .iter()
        .rposition(|e| e.name() == "stdout")
        .unwrap();
    assert!(last_output < finished, "{:?}", turn.names());
    let ahead = turn.events[finished].at - outputs[0].at;
    assert!(ahead >= Duration::from_millis(900), "{ahead:?}");

    let saved = saved_answer(&up, &turn.chat_id).await;
    assert_eq!(saved[0]["type"], "step");
    assert_eq!(saved[0]["id"], step_id.as_str());
    assert_eq!(saved[0]["status"], "succeeded");
    assert_eq!(saved[0]["output"], json!({ "text": text }));
    assert_eq!(saved[1], json!({"type": "text", "text": "counted"}));
}

#[tokio::test]
async fn a_flood_of_output_is_cut_once_per_step() {
    let up = UpProc::start(&[]);
    // About 400 KB on each stream; the agent streams up to its tool output
    // limit of each (64 KiB by default), past the 64 KiB a browser is sent.
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "yes 0123456789abcdef | head -c 400000; yes fedcba9876543210 | head -c 400000 >&2"}},
        {"say": "flooded"}
    ]));
    let mut turn = Turn::start(&up.url, json!({ "message": prompt })).await;
    turn.until_done().await;
    let outputs = turn.named("stdout");
    let sent: usize = outputs
        .iter()
        .map(|o| o.data["chunk"].as_str().unwrap().len())
        .sum();
    assert!(sent <= 64 * 1024, "{sent}");
    let truncated: Vec<_> = outputs
        .iter()
        .filter(|o| o.data["truncated"] == true)
        .collect();
    assert_eq!(
        truncated.len(),
        1,
        "one marker; {} stdout events, {sent} bytes",
        outputs.len()
    );
    assert!(std::ptr::eq(*truncated[0], *outputs.last().unwrap()));
    assert_eq!(turn.named("done")[0].data["status"], "succeeded");

    let saved = saved_answer(&up, &turn.chat_id).await;
    let output = &saved[0]["output"];
    assert_eq!(output["truncated"], true);
    assert_eq!(output["text"].as_str().unwrap().len(), sent);
    // The step's result still has the tool's own (bounded) output.
    assert!(
        saved[0]["result"].to_string().contains("0123456789abcdef"),
        "{}",
        saved[0]
    );
}

#[tokio::test]
async fn a_crashed_turn_shows_why_live_and_after_reload() {
    let up = UpProc::start(&[]);
    let prompt = script(json!([{ "crash": 3 }]));
    let mut turn = Turn::start(&up.url, json!({ "message": prompt })).await;
    turn.until_done().await;
    assert_ids_increase(&turn);

    let error = turn.named("error");
    assert_eq!(error.len(), 1, "{:?}", turn.names());
    let code = error[0].data["code"].as_str().unwrap().to_owned();
    assert_eq!(code, "sandbox_crashed");
    let ended = turn.named("session_ended");
    assert_eq!(ended.len(), 1, "{:?}", turn.names());
    let t = &ended[0].data;
    assert_eq!(t["reason"], "error", "{t}");
    assert_eq!(t["terminatedBy"], "agent", "{t}");
    assert_eq!(t["exitCode"], 3, "{t}");
    // A short stderr is all head.
    let stderr = format!("{}{}", t["stderr"]["head"], t["stderr"]["tail"]);
    assert!(stderr.contains("scripted crash"), "{t}");
    assert!(turn.index_of("error") < turn.index_of("session_ended"));
    assert_eq!(turn.named("done")[0].data["status"], "failed");

    let saved = saved_answer(&up, &turn.chat_id).await;
    assert_eq!(saved.as_array().unwrap().len(), 1, "{saved}");
    assert_eq!(saved[0]["type"], "error");
    assert_eq!(saved[0]["code"], code.as_str());
    assert_eq!(saved[0]["message"], error[0].data["message"]);
    // The saved termination is the live one, field for field.
    let mut live = t.clone();
    for stamp in ["type", "seq", "ts", "sessionId"] {
        live.as_object_mut().unwrap().remove(stamp);
    }
    assert_eq!(saved[0]["termination"], live);
}

#[tokio::test]
async fn a_cancelled_turn_shows_who_ended_it_live_and_after_reload() {
    let up = UpProc::start(&[]);
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "echo started; sleep 60"}},
        {"say": "never"}
    ]));
    let mut turn = Turn::start(&up.url, json!({ "message": prompt })).await;
    turn.until(|e| e.name() == "stdout").await;
    // While the step is quiet, the runner's heartbeats (one after 5 s
    // without a line) reach the browser as SSE comments, not events.
    turn.until_with(|t| t.comments.iter().any(|c| c == "heartbeat").then_some(()))
        .await;
    assert!(turn.named("heartbeat").is_empty());
    let asked = Instant::now();
    let res = reqwest::Client::new()
        .post(format!(
            "{}/api/assistant/chats/{}/cancel",
            up.url, turn.chat_id
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
    turn.until_done().await;
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "{:?}",
        asked.elapsed()
    );
    assert_ids_increase(&turn);

    let error = turn.named("error");
    assert_eq!(error.len(), 1, "{:?}", turn.names());
    assert_eq!(error[0].data["code"], "cancelled");
    let ended = turn.named("session_ended");
    assert_eq!(ended.len(), 1, "{:?}", turn.names());
    let t = &ended[0].data;
    assert_eq!(t["reason"], "terminated", "{t}");
    assert_eq!(t["terminatedBy"], "daemon", "{t}");
    assert_eq!(turn.named("done")[0].data["status"], "cancelled");

    let saved = saved_answer(&up, &turn.chat_id).await;
    let blocks = saved.as_array().unwrap();
    assert_eq!(blocks[0]["type"], "step", "{saved}");
    assert_eq!(blocks[0]["status"], "failed", "{saved}");
    assert_eq!(blocks[0]["output"]["text"], "started\n", "{saved}");
    let error_block = blocks.last().unwrap();
    assert_eq!(error_block["code"], "cancelled");
    let mut live = t.clone();
    for stamp in ["type", "seq", "ts", "sessionId"] {
        live.as_object_mut().unwrap().remove(stamp);
    }
    assert_eq!(error_block["termination"], live);
}

/// An `asbx up` this test started; killed (by PID) when dropped, so a
/// failing assertion leaves no process behind.
struct Up(std::process::Child);

impl Drop for Up {
    fn drop(&mut self) {
        kill_now(&mut self.0);
    }
}

/// `asbx up` on `data` (kept across restarts); its URL from the banner.
fn up_on(data: &std::path::Path) -> (Up, String) {
    let (child, banner) = spawn_up(data, &[], std::process::Stdio::inherit());
    (Up(child), banner.url)
}

/// Kills a process this test started, by its PID, and reaps it.
fn kill_now(child: &mut std::process::Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = child.wait();
}

/// The step of the turn lost in a crash.
const LOST_STEP: &str = "echo started; sleep 301";
/// What its process shows in its command line (bash may exec the `sleep`).
const LOST_STEP_PROCESS: &str = "sleep 301";

#[tokio::test]
async fn a_turn_lost_to_a_crash_of_asbx_up_is_marked_interrupted() {
    let data = tempfile::tempdir().unwrap();
    let (first, url) = up_on(data.path());
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": LOST_STEP}},
        {"say": "never"}
    ]));
    let client = reqwest::Client::new();
    let res = client
        .post(format!("{url}/api/assistant/chat/stream"))
        .json(&json!({ "message": prompt }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let chat_id = res.headers()["x-asbx-chat-id"].to_str().unwrap().to_owned();
    let turn_id = res.headers()["x-asbx-turn-id"].to_str().unwrap().to_owned();
    let mut body = res.bytes_stream();
    let mut seen = String::new();
    tokio::time::timeout(Duration::from_secs(120), async {
        while !seen.contains("event: stdout") {
            let chunk = body.next().await.expect("stream open").unwrap();
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await
    .expect("the step started");

    // The workspace and its runner die mid-turn (the sandbox with them,
    // docs/protocol.md §5); nothing got to save the turn.
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids_with(LOST_STEP_PROCESS).is_empty() {
        assert!(Instant::now() < deadline, "positive control: the step runs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(first);
    drop(body);
    // Its sandbox is gone with it.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !pids_with(LOST_STEP_PROCESS).is_empty() {
        assert!(Instant::now() < deadline, "the sandbox outlived asbx up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (second, url) = up_on(data.path());
    let detail = tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            let d: Value = client
                .get(format!("{url}/api/assistant/chats/{chat_id}"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if d["activeTurnId"].is_null() {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await
    .expect("the lost turn is settled, not left running");
    let messages = detail["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{detail}");
    assert_eq!(messages[1]["turnId"], turn_id.as_str());
    let content = &messages[1]["content"];
    assert_eq!(content[0]["type"], "error", "{content}");
    assert_eq!(content[0]["code"], "runner_lost", "{content}");
    assert_eq!(content[0]["interrupted"], true, "{content}");
    let run: Value = client
        .get(format!("{url}/api/runs/{turn_id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "runner_lost", "{run}");

    // The chat takes a new turn.
    let mut turn = Turn::start(
        &url,
        json!({ "chatId": chat_id, "message": script(json!([{"say": "back"}])) }),
    )
    .await;
    turn.until_done().await;
    assert_eq!(turn.named("done")[0].data["status"], "succeeded");
    drop(second);
}
