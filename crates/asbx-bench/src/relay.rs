//! `asbx-bench relay [N]`: a run's lines relayed by the workspace to an SSE
//! client (issue 14, goal 5). `asbx workspace` (the binary beside this one)
//! dispatches to a stand-in runner of the bench's own, whose `POST /stream`
//! answers N valid lines (N - 1 `log` lines of the runner's stamped size and
//! a `result`) in ready-made 64 KiB chunks, as fast as loopback allows. The
//! bench starts a run through `POST /api/runs` (protocol 2), opens the run's
//! `GET /api/runs/{id}/events` with `Accept: text/event-stream`, and only
//! then lets the stand-in write, so the SSE client follows the live tail
//! from the first line. It counts the events (their `id`s must be 1..=N
//! with no gap), then reads back through the API what was persisted: the
//! run settled `succeeded`, and the kept lines (the newest 10,000 to
//! 11,000 of a run, `runs::events::KEEP_LINES`) are contiguous and end at
//! N. Beside it: raw chunked HTTP on loopback, the same number of lines of
//! the same size read by the same kind of client (`serve_raw_chunks`).
//! SQLite by default; with `ASBX_BENCH_PG_URL` also PostgreSQL.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::body::Bytes;
use futures::StreamExt as _;
use tokio::sync::oneshot;

use crate::system::{Db, Proc, pg_server};
use crate::{read_lines, serve_raw_chunks};

/// The stand-in runner: the next `POST /stream` waits for `go` before
/// writing its body.
#[derive(Clone, Default)]
struct StandIn {
    lines: u64,
    go: Arc<Mutex<Option<oneshot::Receiver<()>>>>,
}

/// N lines for `session_id` in 64 KiB chunks: `log` lines, then `result`.
fn chunks(lines: u64, session_id: &str) -> Vec<Bytes> {
    use std::io::Write as _;
    let mut out = Vec::new();
    let mut chunk = Vec::with_capacity(64 * 1024 + 512);
    for seq in 1..=lines {
        if seq == lines {
            let _ = writeln!(
                chunk,
                r#"{{"seq":{seq},"ts":1764000000000,"sessionId":"{session_id}","type":"result","message":"done"}}"#
            );
        } else {
            let _ = writeln!(
                chunk,
                r#"{{"seq":{seq},"ts":1764000000000,"sessionId":"{session_id}","type":"log","level":"debug","message":"tick tock the firehose is flowing"}}"#
            );
        }
        if chunk.len() >= 64 * 1024 {
            out.push(Bytes::from(std::mem::replace(
                &mut chunk,
                Vec::with_capacity(64 * 1024 + 512),
            )));
        }
    }
    if !chunk.is_empty() {
        out.push(Bytes::from(chunk));
    }
    out
}

async fn stream(
    axum::extract::State(s): axum::extract::State<StandIn>,
    axum::Json(dispatch): axum::Json<serde_json::Value>,
) -> axum::response::Response {
    let session_id = dispatch["session_id"].as_str().unwrap_or("none").to_owned();
    let body = chunks(s.lines, &session_id);
    let go =
        s.go.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
    let body = futures::stream::once(async move {
        if let Some(go) = go {
            let _ = go.await;
        }
        futures::stream::iter(body.into_iter().map(Ok::<_, std::io::Error>))
    })
    .flatten();
    let mut r = axum::response::Response::new(axum::body::Body::from_stream(body));
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/x-ndjson"),
    );
    r
}

async fn serve_stand_in(s: StandIn) -> anyhow::Result<String> {
    let app = axum::Router::new()
        .route("/stream", axum::routing::post(stream))
        .with_state(s);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(url)
}

/// What one relayed run gave: events, seconds from `go` to the last one,
/// SSE bytes, and the lines the workspace kept.
struct Relayed {
    events: u64,
    /// Lines the SSE client never got (ids skipped).
    lost: u64,
    secs: f64,
    bytes: u64,
    kept: u64,
}

/// Reads an SSE body, checking that the events' ids go up by one; returns
/// (events, bytes, ids skipped).
async fn read_sse(res: reqwest::Response) -> anyhow::Result<(u64, u64, u64)> {
    let mut stream = res.bytes_stream();
    let (mut events, mut bytes, mut last, mut lost) = (0u64, 0u64, 0u64, 0u64);
    // Bytes of an `id: ` line split across chunks.
    let mut carry: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        bytes += chunk.len() as u64;
        let mut data: &[u8] = &chunk;
        let joined;
        if !carry.is_empty() {
            carry.extend_from_slice(&chunk);
            joined = std::mem::take(&mut carry);
            data = &joined;
        }
        let mut at = 0;
        while let Some(i) = memchr::memchr(b'\n', &data[at..]) {
            let line = &data[at..at + i];
            at += i + 1;
            if let Some(id) = line.strip_prefix(b"id: ") {
                let id: u64 = std::str::from_utf8(id)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .context("an SSE id that is not a number")?;
                events += 1;
                if id <= last {
                    bail!("event {events} has id {id} after {last}: a line was repeated");
                }
                lost += id - last - 1;
                last = id;
            }
        }
        carry.extend_from_slice(&data[at..]);
    }
    Ok((events, bytes, lost))
}

/// One run of `lines` lines through the workspace at `ws` whose runner is
/// the stand-in `s`.
async fn one_run(
    client: &reqwest::Client,
    ws: &str,
    s: &StandIn,
    lines: u64,
) -> anyhow::Result<Relayed> {
    let (go_tx, go_rx) = oneshot::channel();
    *s.go
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(go_rx);
    let res = client
        .post(format!("{ws}/api/runs"))
        .json(&serde_json::json!({"prompt": "relay", "protocol": 2}))
        .send()
        .await?;
    if !res.status().is_success() {
        bail!(
            "POST /api/runs: {} {}",
            res.status(),
            res.text().await.unwrap_or_default()
        );
    }
    let run_id = res
        .headers()
        .get("x-asbx-run-id")
        .and_then(|v| v.to_str().ok())
        .context("x-asbx-run-id")?
        .to_owned();
    // Protocol 2: the caller going away does not cancel the run.
    drop(res);
    let sse = client
        .get(format!("{ws}/api/runs/{run_id}/events"))
        .header("accept", "text/event-stream")
        .send()
        .await?
        .error_for_status()?;
    let started = Instant::now();
    let _ = go_tx.send(());
    let (events, bytes, lost) = read_sse(sse).await?;
    let secs = started.elapsed().as_secs_f64();
    if events + lost != lines {
        bail!("{events} events and {lost} skipped for {lines} lines");
    }
    let kept = check_kept(client, ws, &run_id, lines).await?;
    Ok(Relayed {
        events,
        lost,
        secs,
        bytes,
        kept,
    })
}

/// Checks through the API what the workspace persisted of a finished run:
/// it succeeded, and its kept lines are contiguous and end at `lines`.
/// Returns how many are kept.
async fn check_kept(
    client: &reqwest::Client,
    ws: &str,
    run_id: &str,
    lines: u64,
) -> anyhow::Result<u64> {
    let run: serde_json::Value = client
        .get(format!("{ws}/api/runs/{run_id}"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    if run["status"] != "succeeded" {
        bail!("the run is {} after its stream ended: {run}", run["status"]);
    }
    let first = client
        .get(format!("{ws}/api/runs/{run_id}/events?after=0"))
        .send()
        .await?;
    // `410` names the oldest kept line once older ones were dropped.
    let oldest = if first.status() == reqwest::StatusCode::GONE {
        let p: serde_json::Value = first.json().await?;
        p["oldestSeq"].as_u64().context("oldestSeq")?
    } else {
        1
    };
    let body = client
        .get(format!(
            "{ws}/api/runs/{run_id}/events?after={}",
            oldest - 1
        ))
        .send()
        .await?
        .error_for_status()?
        .bytes()
        .await?;
    let mut expect = oldest;
    for line in body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let v: serde_json::Value = serde_json::from_slice(line)?;
        if v["seq"].as_u64() != Some(expect) {
            bail!("kept line {} where {expect} was due", v["seq"]);
        }
        expect += 1;
    }
    if expect != lines + 1 {
        bail!("the kept lines end at {} of {lines}", expect - 1);
    }
    Ok(lines + 1 - oldest)
}

async fn bench_on(label: &str, db: Option<&Db>, lines: u64, raw_url: &str) -> anyhow::Result<()> {
    let s = StandIn {
        lines,
        ..Default::default()
    };
    let runner = serve_stand_in(s.clone()).await?;
    let mut env = vec![("SANDBOX_URL", runner.as_str())];
    if let Some(db) = db {
        env.push(("DATABASE_URL", db.url.as_str()));
    }
    let ws = Proc::start("workspace", &format!("relay-{label}"), &env)?;
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(600))
        .build()?;
    let mut lost = 0;
    for round in 1..=3 {
        // The raw read is short (tens of ms): the median of three.
        let mut raws = Vec::with_capacity(3);
        for _ in 0..3 {
            let (n, b, secs) = read_lines(client.get(raw_url)).await?;
            raws.push((n as f64 / secs, b as f64 / secs));
        }
        raws.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (raw, raw_bytes) = raws[1];
        let r = one_run(&client, &ws.url, &s, lines).await?;
        let rate = r.events as f64 / r.secs;
        println!(
            "  {label} round {round}: workspace relay to SSE {:.0} k events/s ({} events, {} lines LOST, {:.0} MiB/s SSE) = {:.2} x raw chunked HTTP {:.0} k lines/s ({:.0} MiB/s); {} lines kept, contiguous to the last",
            rate / 1e3,
            r.events,
            r.lost,
            r.bytes as f64 / r.secs / (1 << 20) as f64,
            rate / raw,
            raw / 1e3,
            raw_bytes / (1 << 20) as f64,
            r.kept,
        );
        lost += r.lost;
    }
    if lost > 0 {
        bail!("{label}: the SSE client lost {lost} lines");
    }
    Ok(())
}

pub(crate) async fn relay(lines: u64) -> anyhow::Result<()> {
    let lines = lines.max(2);
    println!(
        "relay: {lines} lines of one run from a stand-in runner through asbx workspace to an SSE \
         client (events/s from the first byte written to the last event read), beside raw \
         chunked HTTP on loopback (the same number of lines of the same size, ready-made chunks)"
    );
    let raw_url = serve_raw_chunks(lines, "0123456789abcdef0123456789abcdef").await?;
    // Both databases' figures, even when one of them lost lines.
    let sqlite = bench_on("sqlite", None, lines, &raw_url).await;
    let postgres = match pg_server() {
        Some(server) => {
            let db = Db::create(&server, "relay")?;
            bench_on("postgres", Some(&db), lines, &raw_url).await
        }
        None => {
            println!("  postgres: skipped (set ASBX_BENCH_PG_URL to a PostgreSQL server URL)");
            Ok(())
        }
    };
    sqlite.and(postgres)
}
