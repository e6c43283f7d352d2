//! A workspace node dies mid-turn and the turn goes on (docs/protocol.md
//! §9): two real `asbx workspace` processes on one PostgreSQL and one real
//! `asbx runner`. Node a starts a chat turn and is SIGKILLed while the
//! sandbox works; node b takes the turn over once a's lease expires,
//! re-attaches to the runner's session after the last stored line, and
//! finishes it: the client resumes on b with `Last-Event-ID` and gets the
//! rest and `done`, the thread holds the turn's message exactly once, and
//! the file the sandbox wrote back is in the bag.

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{RunnerProc, WorkspaceProc, script};

/// A database of its own on the test PostgreSQL, dropped at the end.
struct PgDb {
    server: String,
    name: String,
    url: String,
}

impl PgDb {
    fn create(server: &str) -> PgDb {
        let name = format!("asbx_takeover_{}", hex::encode(rand::random::<[u8; 6]>()));
        psql(server, &format!("CREATE DATABASE {name}"));
        let mut url = reqwest::Url::parse(server).unwrap();
        url.set_path(&format!("/{name}"));
        PgDb {
            server: server.to_owned(),
            name,
            url: url.to_string(),
        }
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        psql(
            &self.server,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

fn psql(url: &str, sql: &str) {
    let out = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-qc", sql])
        .output()
        .expect("psql (Debian's postgresql-client)");
    assert!(out.status.success(), "psql {sql}: {out:?}");
}

/// A free loopback port (bound, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Reads SSE frames until `want` is in what was read; returns the last
/// `id:` seen.
async fn read_until(body: &mut reqwest::Response, seen: &mut String, want: &str) -> Option<u64> {
    tokio::time::timeout(Duration::from_secs(120), async {
        while !seen.contains(want) {
            match body.chunk().await {
                Ok(Some(c)) => seen.push_str(&String::from_utf8_lossy(&c)),
                _ => break,
            }
        }
    })
    .await
    .expect("the stream went on in time");
    seen.lines()
        .rev()
        .filter_map(|l| l.strip_prefix("id:"))
        .find_map(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn a_node_killed_mid_turn_leaves_the_turn_to_another_node() {
    let Ok(server) = std::env::var("ASBX_TEST_PG_URL") else {
        asbx_test_support::skip(
            "takeover::a_node_killed_mid_turn_leaves_the_turn_to_another_node",
            "set ASBX_TEST_PG_URL to run the many-node tests",
        );
        return;
    };
    let db = PgDb::create(&server);
    let runner = RunnerProc::start(&[]);
    // The sandbox calls back at the public URL, as behind a load balancer:
    // node b's address stands in for it (it is the node that survives).
    let b_listen = format!("127.0.0.1:{}", free_port());
    let public = format!("http://{b_listen}");
    let env = [
        ("SANDBOX_URL", runner.url.as_str()),
        ("DATABASE_URL", db.url.as_str()),
        ("ASBX_SECRET_KEY", crate::harness::TEST_SECRET_KEY),
        ("ASBX_PUBLIC_URL", public.as_str()),
    ];
    let b = WorkspaceProc::start(&b_listen, &env);
    let mut a = WorkspaceProc::start("127.0.0.1:0", &env);

    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "echo working; sleep 8; mkdir -p out; echo report > out/report.txt"}},
        {"say": "finished the report"}
    ]));
    let client = reqwest::Client::new();
    let mut on_a = client
        .post(format!("{}/api/assistant/chat/stream", a.url))
        .json(&json!({ "message": prompt }))
        .send()
        .await
        .unwrap();
    assert_eq!(on_a.status(), 200);
    let chat_id = on_a.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut seen = String::new();
    let last = read_until(&mut on_a, &mut seen, "event: stdout").await;
    let last = last.expect("frames with ids before the kill");

    // Node a dies while the step runs: no goodbye, no cleanup.
    a.kill();
    drop(on_a);

    // The browser reconnects to the other node where it left off.
    let resumed = client
        .get(format!("{}/api/assistant/chats/{chat_id}/stream", b.url))
        .header("Last-Event-ID", last.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 200);
    let mut rest = String::new();
    let mut resumed = resumed;
    read_until(&mut resumed, &mut rest, "event: done").await;
    assert!(rest.contains("event: done"), "{rest}");
    let ids: Vec<u64> = rest
        .lines()
        .filter_map(|l| l.strip_prefix("id:"))
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    assert!(
        ids.first().is_some_and(|&f| f > last) && ids.windows(2).all(|w| w[0] < w[1]),
        "after {last}, in order, no repeat: {ids:?}"
    );
    assert!(rest.contains("finished the report"), "{rest}");
    assert!(rest.contains("\"status\":\"succeeded\""), "{rest}");

    let thread: Value = client
        .get(format!("{}/api/assistant/chats/{chat_id}", b.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let messages = thread["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "the turn's message once: {thread}");
    assert!(thread["activeTurnId"].is_null(), "{thread}");
    let files: Vec<&str> = thread["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["path"].as_str())
        .collect();
    assert!(
        files.iter().any(|p| p.ends_with("report.txt")),
        "the writeback landed: {thread}"
    );
    runner.assert_clean().await;
}
