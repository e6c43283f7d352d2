//! `asbx-bench audit`: records appended per second to one workspace's audit
//! chain (batches of 500, as a runner's report, and one at a time, as the
//! workspace's own records), and the time `asbx audit verify` takes per
//! 100,000 records; on SQLite and, with `ASBX_BENCH_PG_URL` (or
//! `ASBX_TEST_PG_URL`), PostgreSQL. Goals: 10,000 records/s per workspace
//! and a verify under 2 s per 100,000 records.

use std::time::Instant;

use asbx_workspace::{AuditEvent, Workspace, WorkspaceConfig};

use crate::system::Db;

/// Records in the batched run (and verified).
const RECORDS: usize = 100_000;
/// Records per batch (a runner's report of a busy session).
const BATCH: usize = 500;
/// Records appended one at a time.
const SINGLES: usize = 2_000;

fn event(i: usize) -> AuditEvent {
    AuditEvent::Egress {
        host: format!("api{}.example.com", i % 50),
        port: 443,
        method: Some("CONNECT".to_owned()),
        bytes_out: 1_000 + i as u64,
        bytes_in: 20_000 + i as u64,
        allowed: !i.is_multiple_of(10),
        code: i
            .is_multiple_of(10)
            .then(|| "egress_host_not_allowed".to_owned()),
        secret: None,
    }
}

pub(crate) async fn audit() -> anyhow::Result<()> {
    println!(
        "audit: {RECORDS} records appended to one workspace in batches of {BATCH}, {SINGLES} one at a time, then verified (goals: 10,000/s, verify < 2 s per 100,000)"
    );
    on("sqlite", None).await?;
    let server = crate::system::pg_server().or_else(|| {
        std::env::var("ASBX_TEST_PG_URL")
            .ok()
            .filter(|s| !s.is_empty())
    });
    match server {
        Some(server) => {
            let db = Db::create(&server, "audit")?;
            on("postgres", Some(&db)).await
        }
        None => {
            println!("  postgres: skipped (set ASBX_BENCH_PG_URL to a PostgreSQL server URL)");
            Ok(())
        }
    }
}

async fn on(label: &str, db: Option<&Db>) -> anyhow::Result<()> {
    let data = tempdir()?;
    let url = reqwest::Url::parse("http://127.0.0.1:1")?;
    let mut config = WorkspaceConfig::new(&data, url);
    if let Some(db) = db {
        config.database_url = Some(db.url.clone());
        // Base64 of 32 bytes: PostgreSQL needs a sealing key.
        config.secret_key = Some("dGVzdCBzZWNyZXQga2V5IG9mIDMyIGJ5dGVzIGxvbmc=".to_owned());
    }
    let ws = Workspace::open(config).await?;
    let start = Instant::now();
    for chunk in (0..RECORDS).collect::<Vec<_>>().chunks(BATCH) {
        let events = chunk.iter().map(|i| event(*i)).collect();
        ws.append_audit("bench", Some("run_bench"), events).await?;
    }
    let batched = start.elapsed();
    let start = Instant::now();
    for i in 0..SINGLES {
        ws.append_audit("bench", None, vec![event(i)]).await?;
    }
    let singles = start.elapsed();
    let start = Instant::now();
    let verdicts = ws.verify_audit(Some("bench")).await?;
    let verify = start.elapsed();
    let records = verdicts.first().map_or(0, |v| v.records);
    anyhow::ensure!(
        verdicts.iter().all(|v| v.broken.is_none()),
        "the chain does not verify: {verdicts:?}"
    );
    let per_100k = verify.as_secs_f64() * 100_000.0 / records.max(1) as f64;
    println!(
        "  {label}: batched {:.0} records/s ({:.2} s for {RECORDS}); one at a time {:.0} records/s; verify {:.2} s for {records} ({per_100k:.2} s per 100,000)",
        RECORDS as f64 / batched.as_secs_f64(),
        batched.as_secs_f64(),
        SINGLES as f64 / singles.as_secs_f64(),
        verify.as_secs_f64(),
    );
    drop(ws);
    let _ = std::fs::remove_dir_all(&data);
    Ok(())
}

fn tempdir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "asbx-bench-audit-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}
