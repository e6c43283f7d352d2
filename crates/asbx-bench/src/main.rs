//! `asbx-bench`: prints figures for the runner's performance goals.
//!
//! - `throughput`: lines per second from a sandbox process through the
//!   runner's validation and stamping to an HTTP client, in protocol 1 and
//!   in protocol 2 with its resume log, beside raw chunked HTTP on loopback
//!   (ready-made chunks to the same client). `ASBX_BENCH_LINES` (4,000,000).
//! - `first-line`: time from `POST /stream` to the first line of a fully
//!   jailed dispatch, and the host's CPU per dispatch from boot to
//!   teardown, beside `bwrap ... true` when bubblewrap is installed.
//! - `burst`: N dispatches at once beside N `bwrap ... true`, again once
//!   the warm pool grew, and dispatches per second sustained.
//! - `idle`: host memory of idle sandboxes and of an idle runner.
//! - `jail-startup`: `asbx-sandbox jail` running `true`, beside bubblewrap,
//!   and one idle sandbox's memory (the jail alone, no runner).
//! - `turn`: an Assistant turn end to end through `asbx up`, on SQLite and
//!   (with `ASBX_BENCH_PG_URL`) PostgreSQL, and the host's CPU per turn;
//!   `ASBX_BENCH_THINK_MS` pauses before each turn (a user's think time);
//!   `ASBX_BENCH_LINK_DELAY_MS` also runs them with the runner that far
//!   from the workspace.
//! - `nodes`: chat turns per second through two workspace nodes and two
//!   runners on one PostgreSQL, beside one of each.
//! - `chat-append`: a turn on a chat of 100,000 messages beside one of 10.
//! - `egress`: the egress proxy for a host a secret is bound to (TLS ended
//!   at the proxy, the header set) beside the plain `CONNECT` tunnel: MB/s
//!   of a 100 MB HTTPS download and first-byte time of a fresh connection.
//! - `audit`: audit records appended per second to one workspace's chain
//!   and `asbx audit verify`'s time per 100,000 records, on SQLite and
//!   (with `ASBX_BENCH_PG_URL`) PostgreSQL.
//! - `relay`: a run's lines through the workspace to an SSE client, beside
//!   raw chunked HTTP, on SQLite and (with `ASBX_BENCH_PG_URL`) PostgreSQL.
//! - `workdir`: a chat's kept working directory of 1,000 files and 50 MB
//!   restored into a fresh tmpfs by the runner's code, beside `cp -a`;
//!   captured after a one-file change, beside a full capture.
//!
//! Build with `cargo build --release -p asbx -p asbx-bench`, then run
//! `target/release/asbx-bench all`. Needs root for the jailed parts.

#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use asbx_protocol::jail::IsolationProfile;
use asbx_runner::{Runner, RunnerConfig};
use futures::StreamExt;

mod audit;
mod burst;
mod egress;
mod idle;
mod jail;
mod link;
mod nodes;
mod relay;
mod system;
mod turn;
mod workdir;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).map(String::as_str).unwrap_or("all");
    let n: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(200);
    // The client side holds one connection per sandbox.
    if let Ok((_, hard)) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    {
        let _ =
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(async {
        match what {
            "throughput" => throughput().await,
            "first-line" => first_line(n).await,
            "idle" => idle::idle(n.min(10_000)).await,
            "egress" => {
                let mb = args.get(2).and_then(|v| v.parse().ok());
                egress::egress(mb.unwrap_or(100)).await
            }
            "idle-workspace" => idle::serve_idle_workspace().await,
            "jail-startup" => jail::startup(n),
            "burst" => burst::burst(n.min(1000)).await,
            "turn" => turn::turn(n.min(2000)).await,
            "nodes" => nodes::nodes(n.min(5000)).await,
            "chat-append" => nodes::chat_append(n.min(1000)).await,
            "audit" => audit::audit().await,
            "workdir" => workdir::workdir().await,
            "relay" => {
                let lines = args.get(2).and_then(|v| v.parse().ok());
                relay::relay(lines.unwrap_or(1_000_000)).await
            }
            "all" => {
                throughput().await?;
                first_line(n).await?;
                burst::burst(n).await?;
                idle::idle(100).await?;
                turn::turn(100).await?;
                nodes::nodes(200).await?;
                nodes::chat_append(50).await?;
                relay::relay(1_000_000).await
            }
            other => bail!("unknown bench {other:?}: throughput | first-line [N] | idle [N] | jail-startup [N] | burst [N] | turn [N] | nodes [N] | chat-append [N] | relay [N] | audit | workdir | all"),
        }
    });
    // A bench that failed half-way left its folders: what it started is
    // gone with the runtime, so they go too.
    drop(rt);
    if result.is_err() {
        remove_own_tempdirs();
    }
    result
}

/// Removes this process's [`tempdir`] folders.
fn remove_own_tempdirs() {
    let suffix = format!("-{}", std::process::id());
    for e in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("asbx-bench-") && name.ends_with(&suffix) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let p = me.parent().context("exe folder")?.join(name);
    if !p.exists() {
        bail!(
            "{} not found; build it with cargo build --release -p asbx -p asbx-bench",
            p.display()
        );
    }
    Ok(p)
}

async fn serve_runner(config: RunnerConfig) -> anyhow::Result<Served> {
    let state = config.state_dir.clone();
    let runner = Runner::new(config)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let app = runner.router();
    runner.warm_up();
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(Served {
        url,
        runner,
        server,
        state,
    })
}

/// A runner served in this process ([`serve_runner`]).
pub(crate) struct Served {
    pub(crate) url: String,
    runner: Runner,
    server: tokio::task::JoinHandle<()>,
    state: PathBuf,
}

impl Served {
    /// Stops serving, ends the warm sandboxes and removes the state folder
    /// (else the pool's refills would go on making sandboxes in it).
    pub(crate) async fn stop(self) {
        self.server.abort();
        self.runner.shutdown().await;
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

/// A callback server that refuses every token: the agent ends at once.
async fn refusing_workspace() -> anyhow::Result<String> {
    let app = axum::Router::new().fallback(|| async { axum::http::StatusCode::UNAUTHORIZED });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(url)
}

fn body(agent_url: &str, prompt: &str) -> serde_json::Value {
    serde_json::json!({
        "agent_url": agent_url, "otp_setup": "s", "otp_run": "r", "prompt": prompt,
    })
}

async fn throughput() -> anyhow::Result<()> {
    let state = tempdir("throughput")?;
    let mut config = RunnerConfig::new(sibling("asbx-firehose")?, state.clone());
    config.isolation = IsolationProfile::Unconfined;
    let lines: u64 = std::env::var("ASBX_BENCH_LINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4_000_000);
    config
        .agent_env
        .push(("ASBX_FIREHOSE_LINES".into(), lines.to_string()));
    let served = serve_runner(config).await?;
    let url = served.url.clone();
    let client = reqwest::Client::new();
    println!(
        "throughput: {lines} log lines (80 bytes each) from a sandbox process to an HTTP client, \
         beside raw chunked HTTP on loopback (an axum/hyper server writing lines of the same \
         stamped size in 64 KiB chunks to the same client)"
    );
    // The peer: the same client reading the same number of stamped-size
    // lines from a server that only writes ready-made chunks.
    let session_id = "0123456789abcdef0123456789abcdef";
    let raw_url = serve_raw_chunks(lines, session_id).await?;
    for round in 1..=3 {
        let (raw_n, raw_b, raw_s) = read_lines(client.get(&raw_url)).await?;
        let raw = raw_n as f64 / raw_s / 1e6;
        println!(
            "  round {round}: raw chunked HTTP {raw:.2} M lines/s ({raw_n} lines, {:.0} MiB/s)",
            raw_b as f64 / raw_s / (1 << 20) as f64
        );
        for protocol in [1, 2] {
            let mut b = body("http://127.0.0.1:9/none", "x");
            b["protocol"] = protocol.into();
            // A fresh id per dispatch, as long as the raw server's.
            b["session_id"] = format!("tp-{round}-{protocol}-{}", &session_id[8..]).into();
            let (n, bytes, secs) =
                read_lines(client.post(format!("{url}/stream")).json(&b)).await?;
            let what = if protocol == 1 {
                "protocol 1"
            } else {
                "protocol 2 + resume log"
            };
            let m = n as f64 / secs / 1e6;
            println!(
                "  round {round}: {what} {m:.2} M lines/s ({n} lines, {:.0} MiB/s) = {:.2} x raw HTTP",
                bytes as f64 / secs / (1 << 20) as f64,
                m / raw
            );
        }
    }
    served.stop().await;
    Ok(())
}

/// Sends `req` and counts the lines and bytes of the answer's body: (lines,
/// bytes, seconds from the request to the body's end).
async fn read_lines(req: reqwest::RequestBuilder) -> anyhow::Result<(u64, u64, f64)> {
    let started = Instant::now();
    let res = req.send().await?.error_for_status()?;
    let mut stream = res.bytes_stream();
    let (mut count, mut bytes) = (0u64, 0u64);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        bytes += chunk.len() as u64;
        count += memchr::memchr_iter(b'\n', &chunk).count() as u64;
    }
    Ok((count, bytes, started.elapsed().as_secs_f64()))
}

/// A server whose `GET /` answers `lines` NDJSON lines as long as the
/// runner's stamped firehose lines, in ready-made 64 KiB chunks: the cost
/// of chunked HTTP on loopback alone.
async fn serve_raw_chunks(lines: u64, session_id: &str) -> anyhow::Result<String> {
    let line = format!(
        r#"{{"seq":1000000,"ts":1764000000000,"sessionId":"{session_id}","type":"log","level":"debug","message":"tick tock the firehose is flowing"}}"#
    );
    let per_chunk = (64 * 1024) / (line.len() + 1);
    let mut chunk = Vec::with_capacity(64 * 1024);
    for _ in 0..per_chunk {
        chunk.extend_from_slice(line.as_bytes());
        chunk.push(b'\n');
    }
    let chunk = axum::body::Bytes::from(chunk);
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let chunk = chunk.clone();
            async move {
                let full = lines / per_chunk as u64;
                let rest = (lines % per_chunk as u64) as usize;
                let tail = chunk.slice(..rest * (chunk.len() / per_chunk));
                let chunks = std::iter::repeat_n(chunk, full as usize)
                    .chain(std::iter::once(tail))
                    .map(Ok::<_, std::io::Error>);
                axum::body::Body::from_stream(futures::stream::iter(chunks))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/", listener.local_addr()?);
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(url)
}

fn tempdir(name: &str) -> anyhow::Result<PathBuf> {
    let p = std::env::temp_dir().join(format!("asbx-bench-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&p)?;
    Ok(p)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report(label: &str, mut v: Vec<Duration>) {
    v.sort();
    println!(
        "  {label}: median {:.2} ms, p99 {:.2} ms, min {:.2} ms (n={})",
        percentile(&v, 0.5).as_secs_f64() * 1e3,
        percentile(&v, 0.99).as_secs_f64() * 1e3,
        v[0].as_secs_f64() * 1e3,
        v.len()
    );
}

async fn first_line(n: usize) -> anyhow::Result<()> {
    let asbx = sibling("asbx-sandbox")?;
    let ws = refusing_workspace().await?;
    let client = reqwest::Client::new();
    println!("first line: POST /stream to the first NDJSON line, {n} dispatches each");
    // A pause between dispatches keeps one sandbox's teardown from
    // overlapping the next one's start (ASBX_BENCH_GAP_MS, default 0).
    let gap = Duration::from_millis(
        std::env::var("ASBX_BENCH_GAP_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    );
    let profiles = std::env::var("ASBX_BENCH_PROFILES")
        .unwrap_or_else(|_| "strict,strict-cold,namespaces-cold,unconfined".to_owned());
    for profile in profiles.split(',') {
        let state = tempdir(&format!("first-{profile}"))?;
        let mut config = RunnerConfig::new(asbx.clone(), state.clone());
        // `<profile>-cold` boots every sandbox on demand (no warm pool).
        let (name, cold) = match profile.strip_suffix("-cold") {
            Some(p) => (p, true),
            None => (profile, false),
        };
        config.isolation = IsolationProfile::parse(name).context("profile")?;
        if cold {
            config.warm_pool = 0;
            config.warm_pool_max = 0;
        } else if let Some(max) = std::env::var("ASBX_BENCH_WARM_POOL_MAX")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            // How far the pool may grow with demand (the runner's
            // `ASBX_WARM_POOL_MAX`): one after another, a dispatch never
            // needs more than the minimum.
            config.warm_pool_max = max;
        }
        let served = serve_runner(config).await?;
        let url = served.url.clone();
        // Let the warm pool boot before the first dispatch.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut times = Vec::with_capacity(n);
        let cpu_before = HostCpu::now()?;
        for _ in 0..n {
            let started = Instant::now();
            let res = client
                .post(format!("{url}/stream"))
                .json(&body(&ws, "hi"))
                .send()
                .await?;
            let mut stream = res.bytes_stream();
            let first = stream.next().await.context("no line")??;
            times.push(started.elapsed());
            if first.is_empty() {
                bail!("empty first chunk");
            }
            while stream.next().await.is_some() {}
            if gap > Duration::ZERO {
                tokio::time::sleep(gap).await;
            }
        }
        // The last take's refill and teardown belong to the dispatches too.
        tokio::time::sleep(SETTLE).await;
        let cpu = HostCpu::since(cpu_before)?;
        print_slowest(&format!("asbx {profile}"), &times);
        report(&format!("asbx {profile}"), times);
        print_cpu(&format!("asbx {profile}"), cpu, n);
        served.stop().await;
    }
    if let Ok(bwrap) = which("bwrap") {
        let mut times = Vec::with_capacity(n);
        let cpu_before = HostCpu::now()?;
        for _ in 0..n {
            let started = Instant::now();
            let st = tokio::process::Command::new(&bwrap)
                .args(BWRAP_TRUE)
                .status()
                .await?;
            times.push(started.elapsed());
            if !st.success() {
                bail!("bwrap failed: {st}");
            }
        }
        tokio::time::sleep(SETTLE).await;
        let cpu = HostCpu::since(cpu_before)?;
        report("bwrap --unshare-all ... true", times);
        print_cpu("bwrap --unshare-all ... true", cpu, n);
    } else {
        println!("  bwrap: not installed (apt-get install bubblewrap) - no comparison");
    }
    Ok(())
}

/// How long `first-line` waits after its last dispatch before it reads the
/// host's CPU: the warm pool's last refill and the last teardown.
const SETTLE: Duration = Duration::from_millis(500);

/// The slowest of `times` with their places in the run (the tail's
/// pattern: evenly spaced, bunched, or the first ones).
fn print_slowest(label: &str, times: &[Duration]) {
    let mut order: Vec<usize> = (0..times.len()).collect();
    order.sort_by(|a, b| times[*b].cmp(&times[*a]));
    let shown: Vec<String> = order
        .iter()
        .take(5)
        .map(|i| format!("#{i} {:.2} ms", times[*i].as_secs_f64() * 1e3))
        .collect();
    println!("  {label}: slowest {}", shown.join(", "));
}

/// The host's CPU per dispatch over `n` of them (every process and the
/// kernel, `/proc/stat`; the settle time's idle host adds a little).
fn print_cpu(label: &str, cpu: HostCpu, n: usize) {
    println!(
        "  {label}: host CPU per dispatch, boot to teardown (/proc/stat): {}",
        cpu.per(n)
    );
}

/// The peer every start-up figure stands beside: `bwrap` with every
/// namespace, the host's root read-only, a `/dev` and a `/proc`, running `true`.
const BWRAP_TRUE: [&str; 9] = [
    "--unshare-all",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "true",
];

/// The host's CPU time so far, all cores (`/proc/stat`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostCpu {
    /// Every state but idle, iowait and steal: the work of this host's
    /// processes and kernel.
    busy: Duration,
    /// Time the hypervisor ran something else while this host's CPUs had
    /// work: not this host's, but a run with much of it is a slower one.
    steal: Duration,
}

impl HostCpu {
    pub(crate) fn now() -> anyhow::Result<HostCpu> {
        let stat = std::fs::read_to_string("/proc/stat").context("/proc/stat")?;
        let cpu = stat.lines().next().context("/proc/stat is empty")?;
        let ticks: Vec<u64> = cpu
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal (guest time is in
        // user).
        let busy: u64 = [0, 1, 2, 5, 6].iter().filter_map(|i| ticks.get(*i)).sum();
        let steal = ticks.get(7).copied().unwrap_or(0);
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .and_then(|h| u64::try_from(h).ok())
            .filter(|h| *h > 0)
            .unwrap_or(100);
        let time = |t: u64| Duration::from_micros(t * 1_000_000 / hz);
        Ok(HostCpu {
            busy: time(busy),
            steal: time(steal),
        })
    }

    /// What the host spent from `before` to now.
    pub(crate) fn since(before: HostCpu) -> anyhow::Result<HostCpu> {
        let now = HostCpu::now()?;
        Ok(HostCpu {
            busy: now.busy.saturating_sub(before.busy),
            steal: now.steal.saturating_sub(before.steal),
        })
    }

    /// The busy part.
    pub(crate) fn busy(&self) -> Duration {
        self.busy
    }

    /// `"B ms (steal S ms)"` for each of `n`.
    pub(crate) fn per(&self, n: usize) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3 / n.max(1) as f64;
        format!("{:.2} ms (steal {:.2} ms)", ms(self.busy), ms(self.steal))
    }
}

fn which(name: &str) -> anyhow::Result<PathBuf> {
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return Ok(p);
        }
    }
    bail!("{name} not found")
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("VmRSS")
}

/// Whether `pid` is a runner's zygote (its title, see `asbx_jail::Zygote`).
fn is_zygote(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.starts_with(b"asbx jail --zygote"))
}

fn pss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Sum of `memory.usage_in_bytes` of the sandboxes' cgroups (v1).
fn cgroup_usage_bytes() -> u64 {
    let dir = Path::new("/sys/fs/cgroup/memory/asbx");
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| std::fs::read_to_string(e.path().join("memory.usage_in_bytes")).ok())
        .filter_map(|v| v.trim().parse::<u64>().ok())
        .sum()
}

/// The `/proc/meminfo` fields an idle sandbox's host memory splits into, in KiB.
fn meminfo_parts() -> anyhow::Result<Vec<(&'static str, u64)>> {
    let info = std::fs::read_to_string("/proc/meminfo")?;
    [
        "AnonPages",
        "Shmem",
        "SReclaimable",
        "SUnreclaim",
        "KernelStack",
        "PageTables",
        "Percpu",
        "Cached",
    ]
    .into_iter()
    .map(|k| {
        let v = info
            .lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{k} in /proc/meminfo"))?;
        Ok((k, v))
    })
    .collect()
}

/// Memory in use on the host (MemTotal - MemAvailable), in KiB.
fn mem_used_kib() -> anyhow::Result<u64> {
    let info = std::fs::read_to_string("/proc/meminfo")?;
    let get = |k: &str| -> Option<u64> {
        info.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    Ok(get("MemTotal:").context("MemTotal")? - get("MemAvailable:").context("MemAvailable")?)
}
