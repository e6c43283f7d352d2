//! `asbx-bench idle N`: host memory with N sandboxes held open and idle.
//!
//! One runner holds about eight descriptors per live sandbox, so a host
//! whose hard `RLIMIT_NOFILE` can't be raised (no `CAP_SYS_RESOURCE`) caps
//! a runner near 2,500 sandboxes; the bench spreads the sandboxes over as
//! many runners as that takes ([`PER_RUNNER`] each, round robin). Runners
//! on one host claim their own host uids (`asbx_runner` `uids`), so their
//! sandboxes are as apart as one runner's.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::{
    body, cgroup_usage_bytes, is_zygote, mem_used_kib, meminfo_parts, pss_kib, rss_kib, sibling,
    tempdir,
};

/// Sandboxes per runner: 10 descriptors each and room fit a hard open-file
/// limit of 20,000.
const PER_RUNNER: usize = 1_800;

/// The model an idle sandbox's agent waits on: an OpenAI-compatible
/// provider (the runner's, `OPENAI_BASE_URL` = [`idle_workspace`]`/v1`)
/// whose stream never ends. So each idle sandbox holds what one waiting on
/// a real model holds: the agent's request through its gateway and the
/// runner's connection to the provider.
const IDLE_MODEL: &str = "openai:idle";

/// A callback server and model provider for idle sandboxes: `/env` and
/// `/config` answered at once, and a chat completion that streams a
/// keep-alive comment every 20 s and never ends (so no stall timeout fires).
async fn idle_workspace() -> anyhow::Result<String> {
    let stream = || async {
        let pings = futures::stream::unfold(true, |first| async move {
            if !first {
                tokio::time::sleep(Duration::from_secs(20)).await;
            }
            Some((
                Ok::<_, std::convert::Infallible>(axum::body::Bytes::from_static(b": waiting\n\n")),
                false,
            ))
        });
        (
            [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
            axum::body::Body::from_stream(pings),
        )
    };
    let app = axum::Router::new()
        .route(
            "/env",
            axum::routing::get(|| async { axum::Json(serde_json::json!({"variables": {}})) }),
        )
        .route(
            "/config",
            axum::routing::get(|| async { axum::Json(serde_json::json!({"model": IDLE_MODEL})) }),
        )
        .route("/v1/chat/completions", axum::routing::post(stream));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(url)
}

/// `asbx-bench idle-workspace`: [`idle_workspace`] in a process of its
/// own, which prints its URL and serves until its stdin closes (the bench
/// that started it ended). Its descriptors (one per sandbox waiting on the
/// model) then do not count against the bench's open-file limit, which
/// holds one per sandbox of its own: 10,000 sandboxes need both.
pub(crate) async fn serve_idle_workspace() -> anyhow::Result<()> {
    let url = idle_workspace().await?;
    println!("{url}");
    tokio::task::spawn_blocking(|| {
        use std::io::Read as _;
        let mut rest = Vec::new();
        std::io::stdin().read_to_end(&mut rest)
    })
    .await??;
    Ok(())
}

/// One `asbx runner` of the bench, SIGTERMed and reaped by
/// [`IdleRunner::stop`], or SIGTERMed when dropped on an error (never
/// killed: a runner killed outright leaves its sandboxes' cgroups behind;
/// one told to stop removes them, after the bench if need be).
struct IdleRunner {
    child: tokio::process::Child,
    pid: u32,
    url: String,
    data: PathBuf,
    rss_at_rest: u64,
}

/// The first line `child` prints on stdout (a runner prints its URL there).
async fn banner(child: &mut tokio::process::Child) -> anyhow::Result<String> {
    use tokio::io::AsyncBufReadExt;
    let out = child.stdout.take().context("stdout")?;
    let mut line = String::new();
    tokio::io::BufReader::new(out).read_line(&mut line).await?;
    Ok(line)
}

impl IdleRunner {
    /// A runner whose `openai` provider is `callbacks` (`/v1`).
    async fn start(k: usize, callbacks: &str) -> anyhow::Result<IdleRunner> {
        let data = tempdir(&format!("idle{k}"))?;
        let mut child = tokio::process::Command::new(sibling("asbx")?)
            .args(["runner", "--listen", "127.0.0.1:0"])
            .env("ASBX_DATA", &data)
            .env("ASBX_LOG", "warn")
            // Exactly the sandboxes held open: no warm pool beside them.
            .env("ASBX_WARM_POOL", "0")
            .env("ASBX_WARM_POOL_MAX", "0")
            .env("ASBX_MAX_SANDBOXES", PER_RUNNER.to_string())
            // Every held dispatch is a connection from this one address:
            // past the default cap (256) the runner refuses the rest.
            .env(
                "ASBX_MAX_CONNECTIONS_PER_PEER",
                (2 * PER_RUNNER + 64).to_string(),
            )
            .env("OPENAI_BASE_URL", format!("{callbacks}/v1"))
            .env("OPENAI_API_KEY", "asbx-bench-idle")
            .env_remove("ANTHROPIC_API_KEY")
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let pid = child.id().context("runner pid")?;
        let url = banner(&mut child)
            .await?
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .context("url")?
            .to_owned();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let rss_at_rest = rss_kib(pid)?;
        Ok(IdleRunner {
            child,
            pid,
            url,
            data,
            rss_at_rest,
        })
    }

    /// Its sandboxes' processes (the zygote included).
    fn descendants(&self) -> Vec<u32> {
        asbx_test_support::descendants_of(self.pid)
            .into_iter()
            .map(|p| p as u32)
            .collect()
    }

    /// True once every dispatch's permit came back (its sandbox cleaned
    /// up) and nothing but the zygote is left.
    async fn done(&self, client: &reqwest::Client) -> bool {
        let free = async {
            let h: serde_json::Value = client
                .get(format!("{}/healthz", self.url))
                .send()
                .await?
                .json()
                .await?;
            anyhow::Ok(h["free"] == h["capacity"])
        };
        self.descendants().iter().all(|p| is_zygote(*p)) && free.await.unwrap_or(false)
    }

    fn terminate(&self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }

    async fn stop(mut self) {
        self.terminate();
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

impl Drop for IdleRunner {
    fn drop(&mut self) {
        // Stopped already: no such process (its pid reaped), or a no-op.
        if matches!(self.child.try_wait(), Ok(None)) {
            self.terminate();
        }
    }
}

/// Host memory: the runners idle, and `n` sandboxes held open idle.
pub(crate) async fn idle(n: usize) -> anyhow::Result<()> {
    // Two processes per idle sandbox (its supervisor and the agent, its
    // init), and every thread of the host, come
    // out of `kernel.pid_max`: a bench that would run out of pids fails
    // forks all over the host, so it does not start.
    let pid_max: usize = std::fs::read_to_string("/proc/sys/kernel/pid_max")?
        .trim()
        .parse()?;
    let tasks: usize = std::fs::read_to_string("/proc/loadavg")?
        .split_whitespace()
        .nth(3)
        .and_then(|f| f.split('/').nth(1))
        .and_then(|t| t.parse().ok())
        .context("tasks in /proc/loadavg")?;
    let runners = n.div_ceil(PER_RUNNER).max(1);
    let need = tasks + 2 * n + 64 * runners;
    if need > pid_max * 9 / 10 {
        bail!(
            "{n} idle sandboxes take about {need} of the host's {pid_max} pids \
             (kernel.pid_max): raise it (sysctl -w kernel.pid_max=4194304) or hold fewer"
        );
    }
    // Each agent waits on a model whose answer never ends.
    let mut provider = tokio::process::Command::new(std::env::current_exe()?)
        .arg("idle-workspace")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let callbacks = banner(&mut provider).await?.trim().to_owned();
    let mut started = Vec::new();
    for k in 0..runners {
        match IdleRunner::start(k, &callbacks).await {
            Ok(r) => started.push(r),
            Err(e) => {
                for r in started {
                    r.stop().await;
                }
                return Err(e);
            }
        }
    }
    let held = hold(n, &started, &callbacks).await;
    for r in started {
        r.stop().await;
    }
    drop(provider.stdin.take());
    let _ = provider.wait().await;
    held
}

async fn hold(n: usize, runners: &[IdleRunner], callbacks: &str) -> anyhow::Result<()> {
    let rss_at_rest: u64 = runners.iter().map(|r| r.rss_at_rest).sum();
    println!(
        "idle: {} runner(s) (at most {PER_RUNNER} sandboxes each), RSS at rest {:.1} MiB in all",
        runners.len(),
        rss_at_rest as f64 / 1024.0
    );
    let client = reqwest::Client::new();
    // Host memory is counted from each runner's first sandbox on: the first
    // boot makes what a runner keeps for all (the copy of the binary
    // sandboxes run, about 55 MiB of tmpfs, and the zygote).
    let starting = Instant::now();
    let (streams, before, parts_before) = open_streams(n, runners, callbacks, &client).await?;
    println!(
        "idle: {n} sandboxes started one after another (each to its first line) in {:.1} s",
        starting.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = mem_used_kib()?;
    let parts_after = meminfo_parts()?;
    // The sandboxes started after each runner's first.
    let counted = n.saturating_sub(runners.len()).max(1) as f64;
    let runner_after: u64 = runners.iter().filter_map(|r| rss_kib(r.pid).ok()).sum();
    let descendants: Vec<u32> = runners.iter().flat_map(IdleRunner::descendants).collect();
    let pss: u64 = descendants.iter().filter_map(|p| pss_kib(*p)).sum();
    print_processes(&descendants);
    println!(
        "idle: {n} sandboxes alive ({} processes): PSS of all sandbox processes {:.2} MiB per sandbox",
        descendants.len(),
        pss as f64 / n as f64 / 1024.0,
    );
    println!(
        "idle: sandbox cgroups (memory.usage_in_bytes, incl. kernel memory) {:.2} MiB per sandbox",
        cgroup_usage_bytes() as f64 / n as f64 / (1 << 20) as f64
    );
    println!(
        "idle: runner RSS {:.1} MiB in all (+{:.1} KiB per sandbox); host MemAvailable delta {:.2} MiB per sandbox (noisy)",
        runner_after as f64 / 1024.0,
        (runner_after.saturating_sub(rss_at_rest)) as f64 / n as f64,
        (after.saturating_sub(before)) as f64 / counted / 1024.0
    );
    let parts: Vec<String> = parts_before
        .iter()
        .zip(&parts_after)
        .map(|((k, b), (_, a))| format!("{k} {:+.0}", (*a as f64 - *b as f64) / counted))
        .collect();
    // What no reclaim gives back (`Cached` holds `Shmem`; `SReclaimable` is
    // dentries and inodes the kernel may drop): steadier than MemAvailable,
    // which moves with the page cache of everything else on the host.
    let held: i64 = parts_before
        .iter()
        .zip(&parts_after)
        .filter(|((k, _), _)| !matches!(*k, "Cached" | "SReclaimable"))
        .map(|((_, b), (_, a))| *a as i64 - *b as i64)
        .sum();
    println!(
        "idle: where it went, /proc/meminfo KiB per sandbox: {}; held (all but Cached and SReclaimable) {:.2} MiB per sandbox",
        parts.join(", "),
        held as f64 / counted / 1024.0
    );
    if let Some(kib) = empty_memory_cgroup_kib() {
        println!(
            "idle: of it, an empty memory cgroup (a sandbox has one) costs this kernel {kib:.0} KiB of SUnreclaim now: \
             its shrinker maps, 1 KiB per 64 shrinkers at the host's peak since boot (each superblock is one; a sandbox has 4)"
        );
    }
    // Hang up and let the runners end every sandbox and remove its cgroups
    // before they stop (SIGTERM): killing one while thousands of sandboxes
    // are ending would leave their cgroups to the next runner's sweep.
    // Hang up and let the runners end every sandbox and remove its cgroups
    // before they stop (SIGTERM): killing one while thousands of sandboxes
    // are ending would leave their cgroups to the next runner's sweep.
    drop(streams);
    hang_up(runners, &client, n).await;
    Ok(())
}

/// Opens `n` streams spread over the runners, each read to its first line;
/// the host's memory is measured once every runner has its first sandbox.
async fn open_streams(
    n: usize,
    runners: &[IdleRunner],
    callbacks: &str,
    client: &reqwest::Client,
) -> anyhow::Result<(Vec<reqwest::Response>, u64, Vec<(&'static str, u64)>)> {
    let (mut before, mut parts_before) = (0, Vec::new());
    let mut streams = Vec::with_capacity(n);
    for i in 0..n {
        let runner = &runners[i % runners.len()];
        let res = client
            .post(format!("{}/stream", runner.url))
            .json(&body(callbacks, "hi"))
            .send()
            .await?;
        if !res.status().is_success() {
            let status = res.status();
            bail!(
                "sandbox {} of {n} refused ({status}): {}",
                streams.len() + 1,
                res.text().await.unwrap_or_default()
            );
        }
        let mut res = res;
        let _ = res.chunk().await;
        streams.push(res);
        if i + 1 == runners.len() {
            before = mem_used_kib()?;
            parts_before = meminfo_parts()?;
        }
    }
    Ok((streams, before, parts_before))
}

/// The sandboxes' processes by kind: how many, and each one's PSS.
fn print_processes(descendants: &[u32]) {
    let mut kinds: std::collections::BTreeMap<&str, (u64, u64)> = Default::default();
    for p in descendants {
        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        let kind = if is_zygote(*p) {
            "zygote (asbx jail --zygote, one per runner)"
        } else if cmd.contains("jail") {
            "supervisor or guard (asbx jail)"
        } else if cmd.contains("agent") {
            "agent (asbx agent)"
        } else {
            "init and others"
        };
        let e = kinds.entry(kind).or_default();
        e.0 += 1;
        e.1 += pss_kib(*p).unwrap_or(0);
    }
    for (kind, (count, kib)) in &kinds {
        println!(
            "  {kind}: {count} processes, PSS {:.0} KiB each",
            *kib as f64 / *count as f64
        );
    }
}

/// Waits (at most 3 minutes) until every runner ended its sandboxes and
/// removed their cgroups, the client having hung up.
async fn hang_up(runners: &[IdleRunner], client: &reqwest::Client, n: usize) {
    let ending = Instant::now();
    while ending.elapsed() < Duration::from_secs(180) {
        let mut all = true;
        for r in runners {
            all &= r.done(client).await;
        }
        if all {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "idle: {n} sandboxes ended and cleaned up (client hung up) in {:.1} s",
        ending.elapsed().as_secs_f64()
    );
}

/// SUnreclaim, in KiB, that one more empty memory cgroup costs now (cgroup
/// v1): the mean over a few made and removed at once. On Linux 6.x each
/// memory cgroup holds a shrinker map sized by the most memcg-aware
/// shrinkers the host ever had registered (every superblock is one), so
/// the figure grows with the host's peak count of mounts, not this bench's.
fn empty_memory_cgroup_kib() -> Option<f64> {
    const PROBES: usize = 32;
    let parent = std::path::Path::new("/sys/fs/cgroup/memory/asbx");
    if !parent.is_dir() {
        return None;
    }
    let unreclaimable = || {
        meminfo_parts()
            .ok()?
            .into_iter()
            .find_map(|(k, v)| (k == "SUnreclaim").then_some(v))
    };
    let before = unreclaimable()?;
    let made: Vec<PathBuf> = (0..PROBES)
        .map(|i| parent.join(format!("bench-probe-{}-{i}", std::process::id())))
        .filter(|d| std::fs::create_dir(d).is_ok())
        .collect();
    let after = unreclaimable();
    for d in &made {
        let _ = std::fs::remove_dir(d);
    }
    let after = after?;
    (!made.is_empty()).then(|| (after as f64 - before as f64) / made.len() as f64)
}
