//! `--bench-startup N`: start-up latency of a jail running `true`, next to
//! bubblewrap, and the host memory an idle sandbox costs.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::Sbx;

fn stats(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let median = ms(v[v.len() / 2]);
    let p99 = ms(v[((v.len() * 99) / 100).min(v.len() - 1)]);
    (median, p99)
}

fn time(n: usize, mut f: impl FnMut() -> bool) -> Option<Vec<Duration>> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        if !f() {
            return None;
        }
        v.push(t.elapsed());
    }
    Some(v)
}

pub fn run(n: usize) {
    let n = n.max(1);
    let exe = std::env::current_exe().unwrap();
    let sbx = Sbx::argv(&["/bin/true"]);
    let json = serde_json::to_string(&sbx.policy).unwrap();
    let jail = time(n, || {
        Command::new(&exe)
            .arg("__jail")
            .arg(&json)
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    match jail {
        Some(v) => {
            let (m, p) = stats(v);
            println!("asbx jail (strict) true: median {m:.2} ms, p99 {p:.2} ms over {n} runs");
        }
        None => println!("asbx jail: a run failed"),
    }
    let mut ns = Sbx::argv(&["/bin/true"]);
    ns.policy.profile = asbx_protocol::jail::JailProfile::Namespaces;
    let json = serde_json::to_string(&ns.policy).unwrap();
    if let Some(v) = time(n, || {
        Command::new(&exe)
            .arg("__jail")
            .arg(&json)
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }) {
        let (m, p) = stats(v);
        println!("asbx jail (namespaces profile) true: median {m:.2} ms, p99 {p:.2} ms");
    }
    let bwrap_args = [
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
    match time(n, || {
        Command::new("bwrap")
            .args(bwrap_args)
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }) {
        Some(v) => {
            let (m, p) = stats(v);
            println!("bwrap --unshare-all ... true: median {m:.2} ms, p99 {p:.2} ms");
        }
        None => println!("bwrap: not installed or failed, comparison skipped"),
    }
    let plain = time(n, || {
        Command::new("/bin/true")
            .status()
            .is_ok_and(|s| s.success())
    });
    if let Some(v) = plain {
        let (m, p) = stats(v);
        println!("plain fork+exec /bin/true: median {m:.2} ms, p99 {p:.2} ms");
    }
    memory();
}

fn memory() {
    let sbx = Sbx::new("echo ready; exec sleep 30");
    let mut child = sbx.spawn(None);
    let mut out = child.stdout.take().unwrap();
    let mut buf = [0u8; 6];
    let _ = std::io::Read::read_exact(&mut out, &mut buf);
    let cg = &sbx.cgroup_dirs()[0];
    let usage = std::fs::read_to_string(cg.join("memory.usage_in_bytes")).unwrap_or_default();
    let rss = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("VmRSS"))
            .map(|l| l.split_whitespace().nth(1).unwrap_or("?").to_string())
            .unwrap_or_default()
    };
    println!(
        "idle sandbox (sleep): cgroup memory.usage_in_bytes {} KiB; supervisor VmRSS {} KiB",
        usage.trim().parse::<u64>().map(|b| b / 1024).unwrap_or(0),
        rss(child.id()),
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
}
