//! `asbx-bench turn [N]`: an Assistant turn end to end through a real
//! `asbx up` (the `asbx` binary beside this one): the chat `POST` to the
//! SSE `done` of a scripted two-step turn (one shell step, one file written
//! back), N turns one after another in one chat, on SQLite and, with
//! `ASBX_BENCH_PG_URL` set (a server URL; the bench makes its own
//! database), on PostgreSQL. Then the chat's history read back as the page
//! reads it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::{report, sibling, tempdir};

/// `asbx up` started for the bench; SIGTERM by PID on drop.
struct Up {
    child: Child,
    url: String,
}

impl Up {
    fn start(name: &str, database_url: Option<&str>) -> anyhow::Result<Up> {
        let data = tempdir(name)?;
        let mut cmd = Command::new(sibling("asbx")?);
        cmd.args(["up", "--listen", "127.0.0.1:0"])
            .env("ASBX_DATA", &data)
            .env("ASBX_LOG", "error")
            .env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("ASBX_MODEL")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(db) = database_url {
            cmd.env("DATABASE_URL", db);
        }
        let mut child = cmd.spawn().context("spawn asbx up")?;
        let mut reader = BufReader::new(child.stdout.take().context("stdout")?);
        let mut url = None;
        for _ in 0..10 {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                break;
            }
            if let Some(u) = line.trim().strip_prefix("open") {
                url = Some(u.trim().to_owned());
                break;
            }
        }
        std::thread::spawn(move || {
            let mut sink = String::new();
            while reader.read_line(&mut sink).unwrap_or(0) > 0 {
                sink.clear();
            }
        });
        let url = url.context("no `open URL` in the banner of asbx up")?;
        Ok(Up { child, url })
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

const SCRIPT: &str = r#"{"script": [{"tool": "shell", "args": {"command": "echo hi"}}, {"tool": "write_file", "args": {"path": "out/r.txt", "content": "r"}}, {"say": "ok"}]}"#;

/// One turn: its time from the `POST` to `done`, and the chat id.
async fn one_turn(
    client: &reqwest::Client,
    url: &str,
    chat: Option<&str>,
) -> anyhow::Result<(Duration, String)> {
    let mut body = serde_json::json!({ "message": SCRIPT });
    if let Some(c) = chat {
        body["chatId"] = c.into();
    }
    let started = Instant::now();
    let mut res = client
        .post(format!("{url}/api/assistant/chat/stream"))
        .json(&body)
        .send()
        .await?;
    if !res.status().is_success() {
        bail!("turn refused: {}", res.status());
    }
    let chat_id = res
        .headers()
        .get("x-asbx-chat-id")
        .and_then(|v| v.to_str().ok())
        .context("x-asbx-chat-id")?
        .to_owned();
    let mut seen = Vec::new();
    while let Some(chunk) = res.chunk().await? {
        seen.extend_from_slice(&chunk);
        if memchr::memmem::find(&seen, b"event: done").is_some() {
            let took = started.elapsed();
            if memchr::memmem::find(&seen, b"\"status\":\"succeeded\"").is_none() {
                bail!("a turn did not succeed: {}", String::from_utf8_lossy(&seen));
            }
            return Ok((took, chat_id));
        }
    }
    bail!("the turn's stream ended without done")
}

async fn bench_on(label: &str, database_url: Option<&str>, n: usize) -> anyhow::Result<()> {
    let up = Up::start(label, database_url)?;
    let client = reqwest::Client::new();
    // Warm up: the runner's warm pool, connections, caches.
    let (_, chat) = one_turn(&client, &up.url, None).await?;
    for _ in 0..4 {
        one_turn(&client, &up.url, Some(&chat)).await?;
    }
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        // The lease is released just after `done`: wait for it, untimed.
        let (t, _) = loop {
            match one_turn(&client, &up.url, Some(&chat)).await {
                Ok(r) => break r,
                Err(e) if e.to_string().contains("409") => {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Err(e) => return Err(e),
            }
        };
        times.push(t);
    }
    report(&format!("{label}: chat POST to SSE done"), times);
    let started = Instant::now();
    let thread = client
        .get(format!("{}/api/assistant/chats/{chat}", up.url))
        .send()
        .await?
        .bytes()
        .await?;
    println!(
        "  {label}: GET of the chat ({} turns): {:.2} ms, {} bytes",
        n + 5,
        started.elapsed().as_secs_f64() * 1e3,
        thread.len()
    );
    Ok(())
}

pub(crate) async fn turn(n: usize) -> anyhow::Result<()> {
    println!(
        "turn: an Assistant turn through asbx up (scripted: one shell step, one file written back), {n} turns in one chat"
    );
    bench_on("sqlite", None, n).await?;
    match std::env::var("ASBX_BENCH_PG_URL") {
        Ok(server) if !server.is_empty() => {
            let name = format!("asbx_bench_{}", std::process::id());
            psql(&server, &format!("CREATE DATABASE {name}"))?;
            let mut url = reqwest::Url::parse(&server)?;
            url.set_path(&format!("/{name}"));
            let res = bench_on("postgres", Some(url.as_str()), n).await;
            psql(
                &server,
                &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            )?;
            res
        }
        _ => {
            println!("  postgres: skipped (set ASBX_BENCH_PG_URL to a PostgreSQL server URL)");
            Ok(())
        }
    }
}

fn psql(url: &str, sql: &str) -> anyhow::Result<()> {
    let out = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-qc", sql])
        .output()
        .context("psql")?;
    if !out.status.success() {
        bail!("psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}
