//! The system under bench, started from the real binaries beside
//! `asbx-bench`: `asbx up`, or `asbx runner` and `asbx workspace` on a
//! PostgreSQL database of the bench's own; and one scripted chat turn.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::{sibling, tempdir};

/// The scripted turn every Assistant bench runs: one shell step, one file
/// written back, one answer.
pub(crate) const SCRIPT: &str = r#"{"script": [{"tool": "shell", "args": {"command": "echo hi"}}, {"tool": "write_file", "args": {"path": "out/r.txt", "content": "r"}}, {"say": "ok"}]}"#;

/// One turn: its time from the `POST` to `done`, and the chat id.
pub(crate) async fn one_turn(
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

/// The secret key every workspace node of this bench seals secrets with
/// (`ASBX_SECRET_KEY`): 32 random bytes drawn once, base64.
fn bench_secret_key() -> anyhow::Result<&'static str> {
    use base64::Engine as _;
    use std::io::Read as _;
    static KEY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    if let Some(key) = KEY.get() {
        return Ok(key);
    }
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom")?;
    Ok(KEY.get_or_init(|| base64::engine::general_purpose::STANDARD.encode(bytes)))
}

/// One `asbx` process (`runner`, `workspace` or `up`); SIGTERM by PID on drop.
pub(crate) struct Proc {
    child: Child,
    pub(crate) url: String,
    pub(crate) data: PathBuf,
}

impl Proc {
    pub(crate) fn start(what: &str, name: &str, env: &[(&str, &str)]) -> anyhow::Result<Proc> {
        let data = tempdir(name)?;
        let mut cmd = Command::new(sibling("asbx")?);
        cmd.args([what, "--listen", "127.0.0.1:0"])
            .env("ASBX_DATA", &data)
            .env("ASBX_LOG", "error")
            .env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("ASBX_MODEL")
            .env_remove("ASBX_RUNNER_TOKEN")
            .env_remove("DATABASE_URL")
            .env_remove("SANDBOX_URL")
            // PostgreSQL needs one secret key on every node of a database.
            .env("ASBX_SECRET_KEY", bench_secret_key()?)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().with_context(|| format!("spawn asbx {what}"))?;
        let mut reader = BufReader::new(child.stdout.take().context("stdout")?);
        let mut url = None;
        for _ in 0..10 {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                break;
            }
            // `up` prints `open URL` on a line of its own; `runner` and
            // `workspace` print one line with the URL in it.
            let found = match what {
                "up" => line
                    .trim()
                    .strip_prefix("open")
                    .map(|u| u.trim().to_owned()),
                _ => line
                    .split_whitespace()
                    .find(|w| w.starts_with("http://"))
                    .map(str::to_owned),
            };
            if found.is_some() {
                url = found;
                break;
            }
        }
        std::thread::spawn(move || {
            let mut sink = String::new();
            while reader.read_line(&mut sink).unwrap_or(0) > 0 {
                sink.clear();
            }
        });
        let url = url.with_context(|| format!("no URL in the banner of asbx {what}"))?;
        Ok(Proc { child, url, data })
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// A database of the bench's own on the server at `server`; dropped on drop.
pub(crate) struct Db {
    server: String,
    name: String,
    pub(crate) url: String,
}

impl Db {
    pub(crate) fn create(server: &str, label: &str) -> anyhow::Result<Db> {
        let name = format!("asbx_bench_{label}_{}", std::process::id());
        psql(server, &format!("CREATE DATABASE {name}"))?;
        let mut url = reqwest::Url::parse(server)?;
        url.set_path(&format!("/{name}"));
        Ok(Db {
            server: server.to_owned(),
            name,
            url: url.to_string(),
        })
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let _ = psql(
            &self.server,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

/// The whole system on one machine: `asbx up` on SQLite, or (`asbx up`
/// keeps to SQLite) one `asbx runner` and one `asbx workspace` on the
/// database `db`. The processes (stopped on drop), the workspace URL and its
/// data folder.
pub(crate) fn system(label: &str, db: Option<&Db>) -> anyhow::Result<(Vec<Proc>, String, PathBuf)> {
    match db {
        None => {
            let up = Proc::start("up", label, &[])?;
            let (url, data) = (up.url.clone(), up.data.clone());
            Ok((vec![up], url, data))
        }
        Some(db) => {
            let runner = Proc::start("runner", &format!("{label}-runner"), &[])?;
            let ws = Proc::start(
                "workspace",
                &format!("{label}-ws"),
                &[("DATABASE_URL", &db.url), ("SANDBOX_URL", &runner.url)],
            )?;
            let (url, data) = (ws.url.clone(), ws.data.clone());
            Ok((vec![ws, runner], url, data))
        }
    }
}

pub(crate) fn pg_server() -> Option<String> {
    std::env::var("ASBX_BENCH_PG_URL")
        .ok()
        .filter(|s| !s.is_empty())
}

/// A turn, retried while the chat's lease from its last turn is released.
pub(crate) async fn turn_in(
    client: &reqwest::Client,
    url: &str,
    chat: Option<&str>,
) -> anyhow::Result<(Duration, String)> {
    loop {
        match one_turn(client, url, chat).await {
            Err(e) if e.to_string().contains("409") => {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            r => return r,
        }
    }
}

pub(crate) fn psql(url: &str, sql: &str) -> anyhow::Result<()> {
    let out = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-qc", sql])
        .output()
        .context("psql")?;
    if !out.status.success() {
        bail!("psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}
