//! Many machines (issue 12's benchmark), through the real binaries:
//!
//! - `nodes [N]`: chat turns per second with the scripted model through
//!   two `asbx workspace` nodes and two `asbx runner`s on one PostgreSQL,
//!   beside one node and one runner, in one run. Turns go to the nodes in
//!   turn (a load balancer's round robin), 16 chats at once (one turn per
//!   chat at a time: the chat lock). Needs `ASBX_BENCH_PG_URL` (a server
//!   URL; the bench makes and drops its own databases).
//! - `chat-append [N]`: a turn appended to a chat of 100,000 messages
//!   beside one appended to a chat of 10, alternating, through `asbx up` on
//!   SQLite and (with `ASBX_BENCH_PG_URL`) PostgreSQL; the 100,000 messages
//!   are inserted straight into the database (`sqlite3` / `psql`) first.
//!
//! On one machine the nodes share its cores, so `nodes` shows what the
//! second node and runner cost or give here, not what a second machine
//! gives.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::report;
use crate::system::{Db, Proc, pg_server, psql, system, turn_in};

const CHATS: usize = 16;

/// `n` turns over [`CHATS`] chats, chat `i`'s turns on node `i % nodes`.
async fn pump(nodes: &[String], n: usize) -> anyhow::Result<(Duration, Vec<Duration>)> {
    let client = reqwest::Client::new();
    // One warm-up turn per chat makes the chats (untimed).
    let mut chats = Vec::with_capacity(CHATS);
    for i in 0..CHATS {
        let (_, chat) = turn_in(&client, &nodes[i % nodes.len()], None).await?;
        chats.push(chat);
    }
    let left = Arc::new(AtomicUsize::new(n));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(CHATS);
    for (i, chat) in chats.into_iter().enumerate() {
        let node = nodes[i % nodes.len()].clone();
        let client = client.clone();
        let left = left.clone();
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::new();
            while left
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1))
                .is_ok()
            {
                let (t, _) = turn_in(&client, &node, Some(&chat)).await?;
                times.push(t);
            }
            anyhow::Ok(times)
        }));
    }
    let mut times = Vec::with_capacity(n);
    for t in tasks {
        times.extend(t.await??);
    }
    Ok((started.elapsed(), times))
}

async fn fleet(server: &str, nodes: usize, n: usize) -> anyhow::Result<f64> {
    let db = Db::create(server, &format!("nodes{nodes}"))?;
    let mut runners = Vec::with_capacity(nodes);
    for i in 0..nodes {
        runners.push(Proc::start(
            "runner",
            &format!("nodes{nodes}-runner{i}"),
            &[],
        )?);
    }
    let sandbox_url = runners
        .iter()
        .map(|r| r.url.as_str())
        .collect::<Vec<_>>()
        .join(",");
    // Every node calls back at the first node's URL, as all would at a
    // load balancer's; which node answers a callback does not matter.
    let first = Proc::start(
        "workspace",
        &format!("nodes{nodes}-ws0"),
        &[("DATABASE_URL", &db.url), ("SANDBOX_URL", &sandbox_url)],
    )?;
    let public = first.url.clone();
    let mut workspaces = vec![first];
    for i in 1..nodes {
        workspaces.push(Proc::start(
            "workspace",
            &format!("nodes{nodes}-ws{i}"),
            &[
                ("DATABASE_URL", &db.url),
                ("SANDBOX_URL", &sandbox_url),
                ("ASBX_PUBLIC_URL", &public),
            ],
        )?);
    }
    let urls: Vec<String> = workspaces.iter().map(|w| w.url.clone()).collect();
    let (wall, times) = pump(&urls, n).await?;
    let rate = times.len() as f64 / wall.as_secs_f64();
    println!(
        "  {nodes} workspace node(s) + {nodes} runner(s): {} turns in {:.2} s = {rate:.1} turns/s",
        times.len(),
        wall.as_secs_f64()
    );
    report(&format!("{nodes} node(s): chat POST to SSE done"), times);
    drop(workspaces);
    drop(runners);
    drop(db);
    Ok(rate)
}

pub(crate) async fn nodes(n: usize) -> anyhow::Result<()> {
    println!(
        "nodes: chat turns per second (scripted: one shell step, one file written back), {n} turns over {CHATS} chats at once, PostgreSQL"
    );
    let Some(server) = pg_server() else {
        println!("  skipped (set ASBX_BENCH_PG_URL to a PostgreSQL server URL)");
        return Ok(());
    };
    let one = fleet(&server, 1, n).await?;
    let two = fleet(&server, 2, n).await?;
    println!(
        "  two nodes and two runners / one of each: {:.2}x the turns per second",
        two / one
    );
    Ok(())
}

/// The SQLite database of an `asbx up` data folder.
fn find_db(data: &Path) -> anyhow::Result<PathBuf> {
    let mut stack = vec![data.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == "asbx.db") {
                return Ok(path);
            }
        }
    }
    bail!("no asbx.db under {}", data.display())
}

const BIG: usize = 100_000;

/// Inserts [`BIG`] messages into `chat` after its own, in one statement.
fn fill_sql(chat: &str) -> String {
    format!(
        "INSERT INTO messages (id, chat_id, position, role, content, attachments, turn_id, created_at) \
         SELECT 'bench-' || g, '{chat}', 1000 + g, CASE WHEN g % 2 = 0 THEN 'user' ELSE 'assistant' END, \
         '[{{\"type\":\"text\",\"text\":\"message ' || g || ' of a long chat\"}}]', '[]', NULL, 0 FROM "
    )
}

async fn append_on(label: &str, database: Option<&Db>, n: usize) -> anyhow::Result<()> {
    let (_procs, url, data) = system(&format!("append-{label}"), database)?;
    let client = reqwest::Client::new();
    let (_, small) = turn_in(&client, &url, None).await?;
    let (_, big) = turn_in(&client, &url, None).await?;
    for _ in 0..3 {
        turn_in(&client, &url, Some(&small)).await?;
    }
    // The 100,000 messages, straight into the database.
    let filled = Instant::now();
    match database {
        // ANALYZE, as autovacuum would soon: the planner's figures must
        // know the table grew from a few rows to 100,000 in one statement.
        Some(db) => psql(
            &db.url,
            &format!(
                "{} generate_series(1, {BIG}) AS g; ANALYZE messages",
                fill_sql(&big)
            ),
        )?,
        None => {
            let file = find_db(&data)?;
            let sql = format!(
                "WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < {BIG}) {} s; ANALYZE messages;",
                fill_sql(&big)
            );
            let out = Command::new("sqlite3")
                .arg(&file)
                .arg(".timeout 10000")
                .arg(&sql)
                .output()
                .context("sqlite3 (Debian's sqlite3)")?;
            if !out.status.success() {
                bail!("sqlite3: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
    }
    println!(
        "  {label}: {BIG} messages inserted in {:.1} s",
        filled.elapsed().as_secs_f64()
    );
    let mut at_small = Vec::with_capacity(n);
    let mut at_big = Vec::with_capacity(n);
    for _ in 0..n {
        at_small.push(turn_in(&client, &url, Some(&small)).await?.0);
        at_big.push(turn_in(&client, &url, Some(&big)).await?.0);
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (ms, mb) = (median(&mut at_small.clone()), median(&mut at_big.clone()));
    report(
        &format!("{label}: a turn on a chat of ~10 messages"),
        at_small,
    );
    report(
        &format!("{label}: a turn on a chat of {BIG} messages"),
        at_big,
    );
    println!(
        "  {label}: appending at {BIG} / at 10: {:.2}x (goal: at most 1.2x)",
        mb.as_secs_f64() / ms.as_secs_f64()
    );
    for (what, chat) in [("~10", &small), ("100,000", &big)] {
        let started = Instant::now();
        let page = client
            .get(format!("{url}/api/assistant/chats/{chat}"))
            .send()
            .await?
            .error_for_status()?
            .bytes()
            .await?;
        println!(
            "  {label}: GET of a chat of {what} messages (first page): {:.2} ms, {} bytes",
            started.elapsed().as_secs_f64() * 1e3,
            page.len()
        );
    }
    Ok(())
}

pub(crate) async fn chat_append(n: usize) -> anyhow::Result<()> {
    println!(
        "chat-append: a scripted turn appended to a chat of {BIG} messages beside one of ~10, {n} each, alternating"
    );
    append_on("sqlite", None, n).await?;
    match pg_server() {
        Some(server) => {
            let db = Db::create(&server, "append")?;
            append_on("postgres", Some(&db), n).await
        }
        None => {
            println!("  postgres: skipped (set ASBX_BENCH_PG_URL to a PostgreSQL server URL)");
            Ok(())
        }
    }
}
