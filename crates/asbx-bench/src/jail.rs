//! `jail-startup [N]`: start-up latency of `asbx-sandbox jail` running
//! `/bin/true` (strict and namespaces profiles) next to bubblewrap and a
//! plain fork+exec, and the memory of one idle sandbox. The jail is reached
//! only by running the binary, as the runner does.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use asbx_protocol::jail::{
    HOST_IDS_PER_SANDBOX, JailEntry, JailPolicy, JailProfile, ResourceLimits,
};

/// Host uids the bench's sandboxes use (far from the runner's ranges).
const HOST_UID_BASE: u32 = 700_000;

fn policy(workdir: &Path, argv: &[&str], profile: JailProfile, i: u32) -> JailPolicy {
    JailPolicy {
        workdir: workdir.to_string_lossy().into_owned(),
        binds: Vec::new(),
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        host_uid: HOST_UID_BASE + HOST_IDS_PER_SANDBOX * (i % 10_000),
        limits: ResourceLimits::default(),
        cgroup: format!("asbx-bench-{}-{i}", std::process::id()),
        profile,
        entry: JailEntry::Exec,
        guard: true,
        background: false,
    }
}

fn jail(exe: &Path, policy: &JailPolicy) -> anyhow::Result<Command> {
    let mut cmd = Command::new(exe);
    cmd.args(["jail", "--policy", &serde_json::to_string(policy)?])
        .stdin(Stdio::null());
    Ok(cmd)
}

fn stats(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (
        ms(v[v.len() / 2]),
        ms(v[((v.len() * 99) / 100).min(v.len() - 1)]),
    )
}

/// Runs `f` `n` times; the durations, or `None` when a run failed.
fn time(n: usize, mut f: impl FnMut(u32) -> bool) -> Option<Vec<Duration>> {
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        if !f(i as u32) {
            return None;
        }
        v.push(t.elapsed());
    }
    Some(v)
}

fn report(label: &str, n: usize, v: Option<Vec<Duration>>) {
    match v {
        Some(v) => {
            let (m, p) = stats(v);
            println!("{label}: median {m:.2} ms, p99 {p:.2} ms over {n} runs");
        }
        None => println!("{label}: a run failed (not installed, or not root)"),
    }
}

pub(crate) fn startup(n: usize) -> anyhow::Result<()> {
    let n = n.max(1);
    let exe = crate::sibling("asbx-sandbox")?;
    let work = std::env::temp_dir().join(format!("asbx-bench-jail-{}", std::process::id()));
    std::fs::create_dir_all(&work).context("bench workdir")?;
    for (label, profile) in [
        ("asbx jail (strict) true", JailProfile::Strict),
        ("asbx jail (namespaces) true", JailProfile::Namespaces),
    ] {
        let v = time(n, |i| {
            jail(&exe, &policy(&work, &["/bin/true"], profile, i))
                .ok()
                .and_then(|mut c| c.status().ok())
                .is_some_and(|s| s.success())
        });
        report(label, n, v);
    }
    let bwrap = crate::BWRAP_TRUE;
    report(
        "bwrap --unshare-all ... true",
        n,
        time(n, |_| {
            Command::new("bwrap")
                .args(bwrap)
                .stdin(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        }),
    );
    report(
        "plain fork+exec /bin/true",
        n,
        time(n, |_| {
            Command::new("/bin/true")
                .status()
                .is_ok_and(|s| s.success())
        }),
    );
    let idle = idle_memory(&exe, &work);
    let _ = std::fs::remove_dir_all(&work);
    idle
}

/// One sandbox idling in `sleep`: its cgroup's memory and the supervisor's RSS.
fn idle_memory(exe: &Path, work: &Path) -> anyhow::Result<()> {
    let p = policy(
        work,
        &["/bin/sh", "-c", "echo ready; exec sleep 30"],
        JailProfile::Strict,
        9_999,
    );
    let mut child: Child = jail(exe, &p)?.stdout(Stdio::piped()).spawn()?;
    let mut buf = [0u8; 6];
    if let Some(out) = child.stdout.as_mut() {
        let _ = std::io::Read::read_exact(out, &mut buf);
    }
    let usage = std::fs::read_to_string(format!(
        "/sys/fs/cgroup/memory/asbx/{}/memory.usage_in_bytes",
        p.cgroup
    ))
    .unwrap_or_default();
    let rss = std::fs::read_to_string(format!("/proc/{}/status", child.id()))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        .unwrap_or_default();
    println!(
        "idle sandbox (sleep): cgroup memory.usage_in_bytes {} KiB; supervisor VmRSS {rss} KiB",
        usage.trim().parse::<u64>().map(|b| b / 1024).unwrap_or(0),
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
    Ok(())
}
