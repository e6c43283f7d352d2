//! `asbx-bench turn [N]`: an Assistant turn end to end through the real
//! binaries (the `asbx` beside this one): the chat `POST` to the SSE `done`
//! of a scripted two-step turn (one shell step, one file written back), N
//! turns one after another in one chat, through `asbx up` on SQLite and,
//! with `ASBX_BENCH_PG_URL` set (a server URL; the bench makes its own
//! database), through `asbx workspace` + `asbx runner` on PostgreSQL. Then
//! the chat's history read back as the page reads it.

use std::time::{Duration, Instant};

use crate::report;
use crate::system::{Db, one_turn, pg_server, system};

async fn bench_on(label: &str, db: Option<&Db>, n: usize) -> anyhow::Result<()> {
    let (_procs, url, _) = system(&format!("turn-{label}"), db)?;
    let client = reqwest::Client::new();
    // Warm up: the runner's warm pool, connections, caches.
    let (_, chat) = one_turn(&client, &url, None).await?;
    for _ in 0..4 {
        one_turn(&client, &url, Some(&chat)).await?;
    }
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        // The lease is released just after `done`: wait for it, untimed.
        let (t, _) = loop {
            match one_turn(&client, &url, Some(&chat)).await {
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
    Ok(())
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
            bench_on("postgres", Some(&db), n).await
        }
        None => {
            println!("  postgres: skipped (set ASBX_BENCH_PG_URL to a PostgreSQL server URL)");
            Ok(())
        }
    }
}
