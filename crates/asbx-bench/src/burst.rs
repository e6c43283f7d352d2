//! `burst [N]`: N dispatches sent at once to a strict runner, beside N
//! `bwrap ... true` started at once; then, the pool having grown to the
//! burst (it sizes itself from the busiest second of the last minute), the
//! same burst again; then dispatches per second sustained end to end with
//! the scripted model.
//!
//! A burst's figures: the wall time until every first line arrived, and
//! the first-line latency of each dispatch (p50, p99).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use asbx_protocol::callback::ConfigResponse;
use asbx_protocol::jail::{IsolationProfile, JailProfile};
use asbx_runner::RunnerConfig;
use asbx_test_support::fake_workspace::FakeWorkspace;
use futures::StreamExt;

use crate::{body, percentile, refusing_workspace, serve_runner, sibling, tempdir, which};

/// First-line latencies of `n` dispatches sent at once, and the wall time
/// until the last first line.
async fn one_burst(
    client: &reqwest::Client,
    url: &str,
    ws: &str,
    n: usize,
) -> anyhow::Result<(Vec<Duration>, Duration)> {
    let started = Instant::now();
    let sends = (0..n).map(|_| {
        let req = client.post(format!("{url}/stream")).json(&body(ws, "hi"));
        async move {
            let res = req.send().await?;
            if !res.status().is_success() {
                bail!("dispatch refused: {}", res.status());
            }
            let mut stream = res.bytes_stream();
            let first = stream.next().await.context("no line")??;
            let at = started.elapsed();
            if first.is_empty() {
                bail!("empty first chunk");
            }
            while stream.next().await.is_some() {}
            Ok(at)
        }
    });
    let mut times = futures::future::join_all(sends)
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    times.sort();
    let wall = times.last().copied().unwrap_or_default();
    Ok((times, wall))
}

fn print_burst(label: &str, times: &[Duration], wall: Duration) {
    println!(
        "  {label}: all {} first lines in {:.0} ms ({:.0}/s); first line p50 {:.1} ms, p99 {:.1} ms",
        times.len(),
        wall.as_secs_f64() * 1e3,
        times.len() as f64 / wall.as_secs_f64().max(1e-9),
        percentile(times, 0.5).as_secs_f64() * 1e3,
        percentile(times, 0.99).as_secs_f64() * 1e3,
    );
}

async fn warm_count(client: &reqwest::Client, url: &str) -> u64 {
    let h: serde_json::Value = match client.get(format!("{url}/healthz")).send().await {
        Ok(r) => r.json().await.unwrap_or_default(),
        Err(_) => return 0,
    };
    h["warm"].as_u64().unwrap_or(0)
}

pub(crate) async fn burst(n: usize) -> anyhow::Result<()> {
    let asbx = sibling("asbx-sandbox")?;
    let ws = refusing_workspace().await?;
    let client = reqwest::Client::new();
    println!("burst: {n} dispatches at once (strict; default pool of 2, budget {n})");
    let state = tempdir("burst")?;
    let mut config = RunnerConfig::new(asbx, state.clone());
    config.isolation = IsolationProfile::Jail(JailProfile::Strict);
    config.warm_pool_max = n;
    config.max_sandboxes = n.max(64) * 2;
    let served = serve_runner(config).await?;
    let url = served.url.clone();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let (times, wall) = one_burst(&client, &url, &ws, n).await?;
    print_burst("asbx, from idle", &times, wall);

    if let Ok(bwrap) = which("bwrap") {
        let started = Instant::now();
        let runs = (0..n).map(|_| {
            let mut cmd = tokio::process::Command::new(&bwrap);
            cmd.args(crate::BWRAP_TRUE);
            async move {
                let st = cmd.status().await?;
                if !st.success() {
                    bail!("bwrap failed: {st}");
                }
                Ok(started.elapsed())
            }
        });
        let mut done = futures::future::join_all(runs)
            .await
            .into_iter()
            .collect::<anyhow::Result<Vec<_>>>()?;
        done.sort();
        let bwrap_wall = done.last().copied().unwrap_or_default();
        print_burst("bwrap ... true, all at once (exit)", &done, bwrap_wall);
        println!(
            "  ratio: asbx burst wall / bwrap burst wall = {:.2}",
            wall.as_secs_f64() / bwrap_wall.as_secs_f64().max(1e-9)
        );
    } else {
        println!("  bwrap: not installed (apt-get install bubblewrap) - no comparison");
    }

    // The pool grows to the burst; wait for it (bounded), then again.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut warm = 0;
    while Instant::now() < deadline {
        warm = warm_count(&client, &url).await;
        if warm >= n as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the last warm sandboxes finish booting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!("  pool after the first burst: {warm} warm");
    let cpu_before = crate::HostCpu::now()?;
    let window = Instant::now();
    let (times, wall) = one_burst(&client, &url, &ws, n).await?;
    let window = window.elapsed();
    let cpu = crate::HostCpu::since(cpu_before)?;
    print_burst("asbx, second burst (pool grown)", &times, wall);
    // What bounds it: the host's CPU from the sends until every stream
    // ended (each dispatch's whole life, its teardown too), against what
    // the cores had then (`/proc/stat` counts in ticks: about 10 ms).
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    println!(
        "  second burst: host CPU per dispatch, send to stream end, {}; the cores busy {:.0} % of those {:.0} ms",
        cpu.per(n),
        100.0 * cpu.busy().as_secs_f64() / (window.as_secs_f64() * cores as f64).max(1e-9),
        window.as_secs_f64() * 1e3
    );
    served.stop().await;
    sustained().await
}

/// Dispatches per second, end to end (the scripted model's answer to the
/// result line), 4 at a time for 5 s.
async fn sustained() -> anyhow::Result<()> {
    let asbx = sibling("asbx-sandbox")?;
    let ws = FakeWorkspace::start(ConfigResponse {
        model: "scripted:bench".to_owned(),
        ..Default::default()
    })
    .await;
    let state = tempdir("sustained")?;
    let mut config = RunnerConfig::new(asbx, state.clone());
    config.isolation = IsolationProfile::Jail(JailProfile::Strict);
    let served = serve_runner(config).await?;
    let url = served.url.clone();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = reqwest::Client::new();
    let until = Instant::now() + Duration::from_secs(5);
    let started = Instant::now();
    let workers = (0..4).map(|w| {
        let (client, url, ws) = (client.clone(), url.clone(), &ws);
        async move {
            let mut done = 0u64;
            let mut i = 0u64;
            while Instant::now() < until {
                i += 1;
                let t = ws.mint(&format!("sustained-{w}-{i}-{}", std::process::id()));
                let res = client
                    .post(format!("{url}/stream"))
                    .json(&ws.body(&t, "hi"))
                    .send()
                    .await?;
                let text = res.text().await?;
                if !text
                    .lines()
                    .last()
                    .unwrap_or_default()
                    .contains(r#""type":"result""#)
                {
                    bail!("a dispatch did not end with its result: {text}");
                }
                done += 1;
            }
            anyhow::Ok(done)
        }
    });
    let total: u64 = futures::future::join_all(workers)
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?
        .into_iter()
        .sum();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "  sustained, scripted model end to end, 4 at a time: {total} dispatches in {secs:.1} s = {:.0}/s",
        total as f64 / secs
    );
    served.stop().await;
    Ok(())
}
