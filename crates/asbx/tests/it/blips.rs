//! Nothing lost to a blip (docs/protocol.md §9): a real `asbx workspace`
//! reaches its real `asbx runner` through a forwarder that cuts every
//! connection at a random moment (within a budget of cuts a minute), while
//! chat turns and API runs run, each with a tool that prints for one to
//! three seconds. The relaying node re-attaches after the last line it
//! read: every turn and run ends `succeeded` with its whole output exactly
//! once and in order, and nothing is left running.
//!
//! `ASBX_BLIP_COUNT` sets how many chat turns and how many runs (default 6
//! each, so the test fits a loaded 2-core machine);
//! `ASBX_BLIP_COUNT=100` is the full run.

use std::sync::Arc;
use std::time::Duration;

use asbx_test_support::{Blips, CutPlan};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::harness::{RunnerProc, WorkspaceProc, script};

/// Turns and runs in flight at once.
const AT_ONCE: usize = 4;

/// A shell step printing `n` numbered lines, 0.1 s apart, and what it
/// prints.
fn printing(tag: &str, n: usize) -> (String, String) {
    let command = format!("for i in $(seq 1 {n}); do echo {tag}-$i; sleep 0.1; done");
    let expected: String = (1..=n).map(|i| format!("{tag}-{i}\n")).collect();
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": command}},
        {"say": format!("{tag} done")}
    ]));
    (prompt, expected)
}

/// `resp` if it is a `200`; else a panic naming its status and body.
async fn answered_200(resp: reqwest::Response) -> reqwest::Response {
    let status = resp.status();
    if status != 200 {
        panic!(
            "answered {status}: {}",
            resp.text().await.unwrap_or_default()
        );
    }
    resp
}

/// What a run or turn ended with: its status and its tool's output.
#[derive(Debug)]
struct Ended {
    status: String,
    output: String,
}

/// `POST /api/runs` (protocol 2), read to its end.
async fn api_run(ws: &str, prompt: &str) -> Ended {
    let client = reqwest::Client::new();
    let resp = client
        .post(format!("{ws}/api/runs"))
        .json(&json!({"prompt": prompt, "protocol": 2}))
        .send()
        .await
        .unwrap();
    let resp = answered_200(resp).await;
    let id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let body = tokio::time::timeout(Duration::from_secs(240), resp.bytes())
        .await
        .expect("the run ended in time")
        .unwrap();
    let mut output = String::new();
    let mut last_seq = 0;
    for line in body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let v: Value = serde_json::from_slice(line).unwrap();
        let seq = v["seq"].as_u64().unwrap();
        assert!(seq > last_seq, "seq {seq} after {last_seq}: {v}");
        last_seq = seq;
        if v["type"] == "stdout" {
            output.push_str(v["chunk"].as_str().unwrap());
        }
    }
    let run: Value = client
        .get(format!("{ws}/api/runs/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    Ended {
        status: run["status"].as_str().unwrap_or_default().to_owned(),
        output,
    }
}

/// A chat turn (`POST /api/assistant/chat/stream`), read to its `done`.
async fn chat_turn(ws: &str, prompt: &str) -> Ended {
    let resp = reqwest::Client::new()
        .post(format!("{ws}/api/assistant/chat/stream"))
        .json(&json!({ "message": prompt }))
        .send()
        .await
        .unwrap();
    let mut resp = answered_200(resp).await;
    let mut text = String::new();
    let finished = |t: &str| {
        t.find("event: done")
            .is_some_and(|i| t[i..].contains("\n\n"))
    };
    tokio::time::timeout(Duration::from_secs(240), async {
        while !finished(&text) {
            match resp.chunk().await.unwrap() {
                Some(c) => text.push_str(&String::from_utf8_lossy(&c)),
                None => break,
            }
        }
    })
    .await
    .expect("the turn ended in time");
    let mut output = String::new();
    let mut status = String::new();
    let mut ids = Vec::new();
    for frame in text.split("\n\n") {
        let mut event = "message";
        let mut data = String::new();
        for l in frame.lines() {
            if let Some(e) = l.strip_prefix("event:") {
                event = e.trim();
            } else if let Some(d) = l.strip_prefix("data:") {
                data.push_str(d.trim_start());
            } else if let Some(id) = l.strip_prefix("id:") {
                ids.push(id.trim().parse::<u64>().unwrap());
            }
        }
        match event {
            "stdout" => {
                let v: Value = serde_json::from_str(&data).unwrap();
                output.push_str(v["chunk"].as_str().unwrap());
            }
            "done" => {
                let v: Value = serde_json::from_str(&data).unwrap();
                status = v["status"].as_str().unwrap_or_default().to_owned();
            }
            _ => {}
        }
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids in order: {ids:?}");
    Ended { status, output }
}

#[tokio::test]
async fn runs_and_turns_outlive_connections_cut_at_random() {
    let count: usize = std::env::var("ASBX_BLIP_COUNT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let runner = RunnerProc::start(&[]);
    let target = runner
        .url
        .trim_start_matches("http://")
        .parse()
        .expect("the runner's address");
    let blips = Blips::start(
        target,
        CutPlan {
            within: Duration::from_millis(2_500),
            per_minute: 50,
        },
    )
    .await
    .unwrap();
    let ws = WorkspaceProc::start("127.0.0.1:0", &[("SANDBOX_URL", blips.url.as_str())]);
    let started = std::time::Instant::now();
    let gate = Arc::new(Semaphore::new(AT_ONCE));
    let mut tasks = Vec::new();
    for i in 0..2 * count {
        let (gate, url) = (Arc::clone(&gate), ws.url.clone());
        let chat = i % 2 == 0;
        let tag = format!("{}{i}", if chat { "turn" } else { "run" });
        let (prompt, expected) = printing(&tag, 10 + rand::random_range(0..=20));
        let named = tag.clone();
        tasks.push((
            named,
            tokio::spawn(async move {
                let _slot = gate.acquire_owned().await.unwrap();
                let ended = if chat {
                    chat_turn(&url, &prompt).await
                } else {
                    api_run(&url, &prompt).await
                };
                (tag, expected, ended)
            }),
        ));
    }
    // Every task's end is looked at (a panic in one is a failure named by
    // its tag, beside the others'), and then the whole list is asserted.
    let mut failures = Vec::new();
    for (named, t) in tasks {
        let (tag, expected, ended) = match t.await {
            Ok(ended) => ended,
            Err(e) => {
                failures.push(format!("{named}: {e}"));
                continue;
            }
        };
        if ended.status != "succeeded" || ended.output != expected {
            failures.push(format!("{tag}: {ended:?}, expected {expected:?}"));
        }
    }
    eprintln!(
        "blips: {count} chat turns and {count} runs in {:?}; {} connections, {} cut",
        started.elapsed(),
        blips.connections(),
        blips.cuts()
    );
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(blips.cuts() > 0, "the forwarder cut nothing");
    runner.assert_clean().await;
}
