//! `asbx-bench turn [N]`: an Assistant turn end to end through the real
//! binaries (the `asbx` beside this one): the chat `POST` to the SSE `done`
//! of a scripted two-step turn (one shell step, one file written back), N
//! turns one after another in one chat, through `asbx up` on SQLite and,
//! with `ASBX_BENCH_PG_URL` set (a server URL; the bench makes its own
//! database), through `asbx workspace` + `asbx runner` on PostgreSQL. Then
//! the chat's history read back as the page reads it, and `asbx run` end to
//! end: the same turn as an API run, from starting the `asbx run` process to
//! its exit after the stream's end, beside `asbx --version` (the process
//! start alone). With `ASBX_BENCH_LINK_DELAY_MS`, the chat turns once more
//! with the workspace and the runner apart: that much latency each way on
//! the dispatch and on the sandbox's callbacks ([`Link`]).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::link::Link;
use crate::system::{Db, Proc, SCRIPT, one_turn, pg_server, system};
use crate::{HostCpu, report, sibling};

/// `asbx run --json SCRIPT` against the workspace at `url`, timed from the
/// spawn to the exit; fails unless the run completed.
fn asbx_run(asbx: &std::path::Path, url: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let out = Command::new(asbx)
        .args(["run", "--url", url, "--json", SCRIPT])
        .env_remove("ASBX_URL")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("asbx run")?;
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.contains(r#""reason":"completed""#) {
        bail!("asbx run did not complete ({}): {text}", out.status);
    }
    Ok(took)
}

/// `asbx run` end to end, N times, beside `asbx --version` N times.
fn run_cli(label: &str, url: &str, n: usize) -> anyhow::Result<()> {
    let asbx = sibling("asbx")?;
    for _ in 0..3 {
        asbx_run(&asbx, url)?;
    }
    let mut times = Vec::with_capacity(n);
    let mut start_only = Vec::with_capacity(n);
    for _ in 0..n {
        times.push(asbx_run(&asbx, url)?);
        let started = Instant::now();
        let status = Command::new(&asbx)
            .arg("--version")
            .stdout(Stdio::null())
            .status()?;
        start_only.push(started.elapsed());
        if !status.success() {
            bail!("asbx --version: {status}");
        }
    }
    report(&format!("{label}: asbx run, spawn to exit"), times);
    report(
        &format!("{label}: asbx --version (the process alone)"),
        start_only,
    );
    Ok(())
}

/// `ASBX_BENCH_THINK_MS` (default 0): a pause before each timed chat turn,
/// a user's reading and typing, in which the last turn's sandbox ends and
/// the warm pool refills.
fn think_time() -> Duration {
    Duration::from_millis(
        std::env::var("ASBX_BENCH_THINK_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    )
}

/// N timed chat turns in one chat through the workspace at `url` (after
/// five untimed ones), with their report and the host's CPU per turn; the
/// chat's id.
async fn chat_turns(label: &str, url: &str, n: usize) -> anyhow::Result<String> {
    let client = reqwest::Client::new();
    // Warm up: the runner's warm pool, connections, caches.
    let (_, chat) = one_turn(&client, url, None).await?;
    for _ in 0..4 {
        one_turn(&client, url, Some(&chat)).await?;
    }
    let gap = think_time();
    let mut times = Vec::with_capacity(n);
    let cpu_before = HostCpu::now()?;
    for _ in 0..n {
        tokio::time::sleep(gap).await;
        // The lease is released just after `done`: wait for it, untimed.
        let (t, _) = loop {
            match one_turn(&client, url, Some(&chat)).await {
                Ok(r) => break r,
                Err(e) if e.to_string().contains("409") => {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Err(e) => return Err(e),
            }
        };
        times.push(t);
    }
    let cpu = HostCpu::since(cpu_before)?;
    report(&format!("{label}: chat POST to SSE done"), times);
    println!(
        "  {label}: host CPU per turn (every process and the kernel, /proc/stat): {}",
        cpu.per(n)
    );
    Ok(chat)
}

async fn bench_on(label: &str, db: Option<&Db>, n: usize) -> anyhow::Result<()> {
    let (_procs, url, _) = system(&format!("turn-{label}"), db)?;
    let chat = chat_turns(label, &url, n).await?;
    let client = reqwest::Client::new();
    let started = Instant::now();
    let thread = client
        .get(format!("{}/api/assistant/chats/{chat}", url))
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
    run_cli(label, &url, n)
}

pub(crate) async fn turn(n: usize) -> anyhow::Result<()> {
    println!(
        "turn: an Assistant turn (scripted: one shell step, one file written back), {n} turns in one chat"
    );
    println!("  sqlite: through asbx up");
    bench_on("sqlite", None, n).await?;
    match pg_server() {
        Some(server) => {
            println!("  postgres: through asbx workspace + asbx runner (asbx up keeps to SQLite)");
            let db = Db::create(&server, "turn")?;
            bench_on("postgres", Some(&db), n).await?;
        }
        None => {
            println!("  postgres: skipped (set ASBX_BENCH_PG_URL to a PostgreSQL server URL)");
        }
    }
    match link_delay() {
        Some(delay) => apart(delay, n).await,
        None => Ok(()),
    }
}

/// `ASBX_BENCH_LINK_DELAY_MS`: when set, the chat turns also run with the
/// workspace and the runner apart, this much latency each way between
/// them.
fn link_delay() -> Option<Duration> {
    std::env::var("ASBX_BENCH_LINK_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis)
}

/// Chat turns through `asbx workspace` (SQLite) and `asbx runner` joined
/// by two [`Link`]s with `delay` each way: the dispatch and its stream,
/// and the sandbox's callbacks (`ASBX_PUBLIC_URL`).
async fn apart(delay: Duration, n: usize) -> anyhow::Result<()> {
    let ms = delay.as_millis();
    println!(
        "  sqlite, the runner {ms} ms each way from the workspace (asbx workspace + asbx runner)"
    );
    let to_runner = Link::start(delay).await?;
    let to_workspace = Link::start(delay).await?;
    let runner = Proc::start("runner", "turn-apart-runner", &[])?;
    to_runner.forward_to(&runner.url)?;
    let (sandbox_url, public_url) = (to_runner.url(), to_workspace.url());
    let ws = Proc::start(
        "workspace",
        "turn-apart-ws",
        &[
            ("SANDBOX_URL", &sandbox_url),
            ("ASBX_PUBLIC_URL", &public_url),
        ],
    )?;
    to_workspace.forward_to(&ws.url)?;
    chat_turns(&format!("sqlite, {ms} ms apart"), &ws.url, n).await?;
    drop(ws);
    drop(runner);
    Ok(())
}
