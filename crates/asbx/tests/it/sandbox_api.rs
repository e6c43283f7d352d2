//! The in-sandbox workspace API through the real `asbx up` and the jailed
//! runner (docs/protocol.md §3): attachments of 30 B, 5 MB and 16 MiB are
//! streamed into the sandbox byte-exact (the scripted model runs
//! `sha256sum` on them; the test hashes what it uploaded with the host's
//! `sha256sum`), a turn puts a file into the chat's bag with
//! `workspace_create_file`, and a sandbox can't read another chat's file.

use std::time::Duration;

use asbx_protocol::sse::{Parser, SseEvent};
use serde_json::{Value, json};

use crate::harness::*;

/// Skips (out loud) unless the jailed runner can run here.
fn can_jail(test: &str) -> bool {
    if profile() == "strict" && !nix::unistd::geteuid().is_root() {
        asbx_test_support::skip(test, "the strict jail needs root");
        return false;
    }
    true
}

/// The host's `sha256sum` of `bytes`, independent of the code under test.
fn host_sha256(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, bytes).unwrap();
    let out = std::process::Command::new("sha256sum")
        .arg(&path)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

/// Bytes that are not all alike, so a shifted or repeated chunk shows.
fn bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x.to_le_bytes()[0]
        })
        .collect()
}

/// Uploads `content` to the bag (of `chat_id`, or not yet of a chat).
async fn upload(up: &UpProc, name: &str, chat_id: Option<&str>, content: Vec<u8>) -> Value {
    let mut url = format!("{}/api/assistant/files?name={name}", up.url);
    if let Some(c) = chat_id {
        url.push_str(&format!("&chatId={c}"));
    }
    let res = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/octet-stream")
        .body(content)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201, "{:?}", res.text().await);
    res.json().await.unwrap()
}

/// Runs one chat turn to its end; returns the chat id and the SSE events.
async fn turn(up: &UpProc, body: Value) -> (String, Vec<(SseEvent, Value)>) {
    let res = reqwest::Client::new()
        .post(format!("{}/api/assistant/chat/stream", up.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "{:?}", res.text().await);
    let chat_id = res.headers()["x-asbx-chat-id"].to_str().unwrap().to_owned();
    let text = tokio::time::timeout(Duration::from_secs(120), res.bytes())
        .await
        .expect("the turn ended")
        .unwrap();
    let events = Parser::new()
        .push(&text)
        .into_iter()
        .map(|e| {
            let data = serde_json::from_str(&e.data).unwrap_or(Value::Null);
            (e, data)
        })
        .collect::<Vec<_>>();
    let done = events
        .iter()
        .find(|(e, _)| e.event == "done")
        .unwrap_or_else(|| panic!("no done event: {events:?}"));
    assert_eq!(done.1["status"], "succeeded", "{events:#?}");
    (chat_id, events)
}

/// The finished `step` events: (name, data).
fn finished_steps(events: &[(SseEvent, Value)]) -> Vec<(String, Value)> {
    events
        .iter()
        .filter(|(e, d)| e.event == "step" && d["status"] != "running")
        .map(|(_, d)| (d["name"].as_str().unwrap_or("").to_owned(), d.clone()))
        .collect()
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

#[tokio::test]
async fn attachments_of_30_b_5_mb_and_16_mib_arrive_byte_exact_in_the_sandbox() {
    if !can_jail("attachments_of_30_b_5_mb_and_16_mib_arrive_byte_exact_in_the_sandbox") {
        return;
    }
    let up = UpProc::start(&[]);
    let small = b"a thirty byte attachment text!".to_vec();
    assert_eq!(small.len(), 30);
    let files = [
        ("small.txt", small),
        ("five.bin", bytes(5_000_000, 7)),
        ("sixteen.bin", bytes(16 << 20, 11)),
    ];
    // One turn per attachment: a sandbox takes at most 16 MiB of them.
    for (name, content) in files {
        let want = host_sha256(&content);
        let size = content.len();
        let info = upload(&up, name, None, content).await;
        let (_, events) = turn(
            &up,
            json!({
                "message": script(json!([
                    {"tool": "shell", "args": {"command": "sha256sum attachments/* && stat -c %s attachments/*"}},
                    {"say": "hashed"}
                ])),
                "attachmentIds": [info["id"]],
            }),
        )
        .await;
        let steps = finished_steps(&events);
        assert_eq!(steps.len(), 1, "{events:#?}");
        assert_eq!(steps[0].1["status"], "succeeded", "{:?}", steps[0]);
        let stdout = steps[0].1["result"]["stdout"].as_str().unwrap();
        assert!(
            stdout.starts_with(&want),
            "{name}: the sandbox hashed {stdout:?}, the host {want}"
        );
        assert!(
            stdout.lines().any(|l| l == size.to_string()),
            "{name}: {stdout}"
        );
    }
}

#[tokio::test]
async fn a_turn_puts_a_file_into_the_chats_bag_through_the_sandbox_api() {
    if !can_jail("a_turn_puts_a_file_into_the_chats_bag_through_the_sandbox_api") {
        return;
    }
    let up = UpProc::start(&[]);
    let summary = "A summary written from inside the sandbox.\n";
    let (chat_id, events) = turn(
        &up,
        json!({"message": script(json!([
            {"tool": "workspace_create_file", "args": {"path": "summary.txt", "content": summary}},
            {"tool": "workspace_list_files", "args": {}},
            {"say": "filed"}
        ]))}),
    )
    .await;
    let steps = finished_steps(&events);
    assert_eq!(
        steps.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["workspace_create_file", "workspace_list_files"],
        "{events:#?}"
    );
    assert_eq!(steps[0].1["status"], "succeeded", "{:?}", steps[0]);
    let id = steps[0].1["result"]["id"].as_str().unwrap().to_owned();
    assert!(
        steps[1].1["result"].as_str().unwrap().contains(&id),
        "{:?}",
        steps[1]
    );
    // The bag of the chat has it, as the page and the API see it.
    let d = chat(&up, &chat_id).await;
    let files = d["files"].as_array().unwrap_or_else(|| panic!("{d}"));
    let f = files
        .iter()
        .find(|f| f["id"] == id.as_str())
        .unwrap_or_else(|| panic!("{d}"));
    assert_eq!(f["path"], "summary.txt", "{f}");
    let body = reqwest::get(format!("{}/api/files/{id}", up.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(body, summary);
}

#[tokio::test]
async fn a_sandbox_cant_read_another_chats_file() {
    if !can_jail("a_sandbox_cant_read_another_chats_file") {
        return;
    }
    let up = UpProc::start(&[]);
    // Chat A, with a file of its own.
    let (chat_a, _) = turn(&up, json!({"message": script(json!([{"say": "a"}]))})).await;
    let secret = upload(&up, "secret.txt", Some(&chat_a), b"chat A only".to_vec()).await;
    let secret_id = secret["id"].as_str().unwrap().to_owned();
    // Chat B's sandbox asks for it by id, and lists its own bag.
    let (_, events) = turn(
        &up,
        json!({"message": script(json!([
            {"tool": "workspace_read_file", "args": {"id": secret_id}},
            {"tool": "workspace_list_files", "args": {}},
            {"say": "b"}
        ]))}),
    )
    .await;
    let steps = finished_steps(&events);
    assert_eq!(steps.len(), 2, "{events:#?}");
    assert_eq!(steps[0].1["status"], "failed", "{:?}", steps[0]);
    let err = steps[0].1["error"].as_str().unwrap();
    assert!(err.contains("404"), "{err}");
    assert!(!err.contains("chat A only"), "{err}");
    let listed = steps[1].1["result"].as_str().unwrap();
    assert!(!listed.contains(&secret_id), "{listed}");
    // Positive control: chat A's own sandbox reads it.
    let (_, events) = turn(
        &up,
        json!({"chatId": chat_a, "message": script(json!([
            {"tool": "workspace_read_file", "args": {"id": secret_id}},
            {"say": "a again"}
        ]))}),
    )
    .await;
    let steps = finished_steps(&events);
    assert_eq!(steps[0].1["status"], "succeeded", "{:?}", steps[0]);
    assert_eq!(steps[0].1["result"], "chat A only");
}

#[tokio::test]
async fn files_written_before_a_model_error_still_reach_the_workspace() {
    if !can_jail("files_written_before_a_model_error_still_reach_the_workspace") {
        return;
    }
    let up = UpProc::start(&[]);
    let client = reqwest::Client::new();
    let prompt = script(json!([
        {"tool": "write_file", "args": {"path": "out/partial.txt", "content": "half the work"}},
        {"fail": "the model fell over"}
    ]));
    let res = client
        .post(format!("{}/api/runs", up.url))
        .json(&json!({ "prompt": prompt }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let run_id = res.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let bytes = res.bytes().await.unwrap();
    let lines: Vec<_> = asbx_protocol::LineDecoder::default()
        .push(&bytes)
        .into_iter()
        .map(|l| l.unwrap())
        .collect();
    assert_well_formed(&lines);
    match terminal(&lines) {
        asbx_protocol::Event::Error(e) => {
            assert_eq!(e.code, "model_error", "{e:?}");
            assert!(!e.message.contains("writeback"), "{e:?}");
        }
        other => panic!("{other:?}"),
    }
    let run: Value = client
        .get(format!("{}/api/runs/{run_id}", up.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(run["status"], "failed", "{run}");
    let files = run["files"].as_array().unwrap_or_else(|| panic!("{run}"));
    assert_eq!(files.len(), 1, "{run}");
    assert_eq!(files[0]["path"], "partial.txt");
    let id = files[0]["id"].as_str().unwrap();
    let body = client
        .get(format!("{}/api/files/{id}", up.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(body, "half the work");
}

/// Issue 28 (seed 001: skills call back the workspace API): a shell step
/// runs the `asbx_files` skill's scripts and plain `curl` with
/// `$ASBX_WORKSPACE_URL` and `$ASBX_WORKSPACE_TOKEN`: it creates a file in
/// the chat's bag and lists it; the URL serves nothing but the workspace
/// API (the gateway's other routes are `404`, a dot segment `400`, no
/// bearer `401`, the workspace itself is out of the egress proxy's reach);
/// once the turn has ended, the token is refused.
#[tokio::test]
async fn skill_scripts_reach_the_chats_bag_with_the_workspace_variables() {
    if !can_jail("skill_scripts_reach_the_chats_bag_with_the_workspace_variables") {
        return;
    }
    let up = UpProc::start(&[]);
    let command = r#"set -u
printf 'written by a skill script\n' > note.txt
.skills/asbx_files/scripts/put.sh note.txt 'from curl.txt' text/plain; echo
.skills/asbx_files/scripts/list.sh; echo
echo "url=$ASBX_WORKSPACE_URL"
echo "token=$ASBX_WORKSPACE_TOKEN"
base="${ASBX_WORKSPACE_URL%/workspace}"
auth="Authorization: Bearer $ASBX_WORKSPACE_TOKEN"
for route in callback/env callback/config usage mcp/x; do
  echo "$route=$(curl -s -o /dev/null -w '%{http_code}' -H "$auth" "$base/$route")"
done
echo "dotdot=$(curl -s --path-as-is -o /dev/null -w '%{http_code}' -H "$auth" "$ASBX_WORKSPACE_URL/../callback/env")"
echo "nobearer=$(curl -s -o /dev/null -w '%{http_code}' "$ASBX_WORKSPACE_URL/files")"
echo "direct=$(curl -s -o /dev/null -w '%{http_code}' --noproxy '*' --max-time 10 -H "$auth" "$WS_PUBLIC/api/assistant/chats")"
echo "proxied=$(curl -s -o /dev/null -w '%{http_code}' --noproxy '' --proxy "$HTTP_PROXY" --max-time 10 -H "$auth" "$WS_PUBLIC/api/assistant/chats")"
"#
    .replace("$WS_PUBLIC", &up.url);
    let res = reqwest::Client::new()
        .post(format!("{}/api/assistant/chat/stream", up.url))
        .json(&json!({"message": script(json!([
            {"tool": "shell", "args": {"command": command}},
            {"say": "filed with curl"}
        ]))}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "{:?}", res.text().await);
    let chat_id = res.headers()["x-asbx-chat-id"].to_str().unwrap().to_owned();
    let session = res.headers()["x-asbx-turn-id"].to_str().unwrap().to_owned();
    let text = tokio::time::timeout(Duration::from_secs(120), res.bytes())
        .await
        .expect("the turn ended")
        .unwrap();
    let events: Vec<(SseEvent, Value)> = Parser::new()
        .push(&text)
        .into_iter()
        .map(|e| {
            let data = serde_json::from_str(&e.data).unwrap_or(Value::Null);
            (e, data)
        })
        .collect();
    let steps = finished_steps(&events);
    assert_eq!(steps.len(), 1, "{events:#?}");
    let stdout = steps[0].1["result"]["stdout"]
        .as_str()
        .unwrap_or_else(|| panic!("{:?}", steps[0]))
        .to_owned();
    let field = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name}= in {stdout}"))
            .to_owned()
    };
    // The file went in and the listing shows it.
    let created: Value = serde_json::from_str(stdout.lines().next().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let id = created["id"].as_str().unwrap_or_else(|| panic!("{stdout}"));
    let listed: Value = serde_json::from_str(stdout.lines().nth(1).unwrap()).unwrap();
    assert!(
        listed["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["id"] == id && f["path"] == "from curl.txt"),
        "{stdout}"
    );
    let url = field("url");
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/workspace"),
        "{url}"
    );
    let token = field("token");
    assert!(token.starts_with("asbx_ws_"), "{token}");
    // Nothing but the workspace API behind the URL, even with the bearer.
    for route in ["callback/env", "callback/config", "usage", "mcp/x"] {
        assert_eq!(field(route), "404", "{route}: {stdout}");
    }
    assert_eq!(field("dotdot"), "400", "{stdout}");
    assert_eq!(field("nobearer"), "401", "{stdout}");
    // The workspace itself: unreachable directly (the sandbox's loopback is
    // its own) and refused by the egress proxy (no allowed host, an
    // internal address).
    assert_eq!(field("direct"), "000", "{stdout}");
    assert_eq!(field("proxied"), "403", "{stdout}");
    // The bag of the chat holds it, as the API sees it.
    let d = chat(&up, &chat_id).await;
    let files = d["files"].as_array().unwrap_or_else(|| panic!("{d}"));
    assert!(
        files
            .iter()
            .any(|f| f["id"] == id && f["path"] == "from curl.txt"),
        "{d}"
    );
    let body = reqwest::get(format!("{}/api/files/{id}", up.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(body, "written by a skill script\n");
    // The session has ended: its token is refused.
    let res = reqwest::Client::new()
        .get(format!(
            "{}/api/assistant/sandbox/{session}/workspace/files",
            up.url
        ))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401, "{:?}", res.text().await);
}
