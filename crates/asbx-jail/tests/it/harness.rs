//! The custom test harness and helpers: building policies, running the
//! jail binary with a timeout, scanning the host for leftovers.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use asbx_protocol::jail::{
    HOST_IDS_PER_SANDBOX, JailEntry, JailPolicy, JailProfile, ResourceLimits,
};

/// The jail's exit code when set-up failed.
pub const SETUP_FAILED: i32 = asbx_protocol::exit::SETUP_FAILED as i32;

/// `it __jail <policy>`: be `asbx jail`.
pub fn jail_main(args: &[String]) -> ! {
    let policy: JailPolicy = match args.get(2).map(|s| serde_json::from_str(s)) {
        Some(Ok(p)) => p,
        _ => {
            eprintln!("usage: it __jail <policy-json>");
            std::process::exit(i32::from(asbx_protocol::exit::USAGE))
        }
    };
    match asbx_jail::run_jail(&policy) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("asbx jail: {e}");
            std::process::exit(SETUP_FAILED)
        }
    }
}

/// `it __parent <policy>`: a stand-in runner that starts `it __jail
/// <policy>` (stdio inherited) and waits for it, so a test can kill the
/// jail's parent.
pub fn parent_main(args: &[String]) -> ! {
    let Some(policy) = args.get(2) else {
        eprintln!("usage: it __parent <policy-json>");
        std::process::exit(i32::from(asbx_protocol::exit::USAGE))
    };
    let status = Command::new(std::env::current_exe().unwrap())
        .arg("__jail")
        .arg(policy)
        .status()
        .unwrap();
    std::process::exit(status.code().unwrap_or(1))
}

/// One test case: Ok, Err(reason) or Skip(reason).
#[allow(dead_code)]
pub enum Outcome {
    Pass,
    Skip(String),
}

pub type Case = (&'static str, fn() -> Result<Outcome, String>);

pub fn run_all(cases: Vec<Case>, filters: &[&str]) -> i32 {
    let (mut passed, mut failed, mut ignored, mut filtered) = (0, 0, 0, 0);
    let before = tmp_entries();
    for (name, f) in cases {
        if !filters.is_empty() && !filters.iter().any(|flt| name.contains(flt)) {
            filtered += 1;
            continue;
        }
        let start = Instant::now();
        let result = std::panic::catch_unwind(f).unwrap_or_else(|_| Err("panicked".into()));
        let ms = start.elapsed().as_millis();
        match result {
            Ok(Outcome::Pass) => {
                passed += 1;
                println!("test {name} ... ok ({ms} ms)");
            }
            // As `asbx_test_support::skip` does: with `ASBX_TEST_NO_SKIP=1`
            // a skip fails (this harness prints uncaptured already).
            Ok(Outcome::Skip(why)) if no_skip() => {
                failed += 1;
                println!(
                    "test {name} ... FAILED: would skip ({why}), and ASBX_TEST_NO_SKIP=1 forbids skipping"
                );
            }
            Ok(Outcome::Skip(why)) => {
                ignored += 1;
                println!("test {name} ... skipped: {why}");
            }
            Err(e) => {
                failed += 1;
                println!("test {name} ... FAILED ({ms} ms)\n    {e}");
            }
        }
    }
    // Nothing the jail made may survive the whole suite.
    if filters.is_empty() {
        match leftovers(&before) {
            Ok(()) => {
                passed += 1;
                println!("test no_leftovers_after_suite ... ok");
            }
            Err(e) => {
                failed += 1;
                println!("test no_leftovers_after_suite ... FAILED\n    {e}");
            }
        }
    }
    let status = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {status}. {passed} passed; {failed} failed; {ignored} ignored; 0 measured; {filtered} filtered out"
    );
    i32::from(failed != 0)
}

/// Whether skipping is forbidden (`ASBX_TEST_NO_SKIP=1`, where CI has every
/// prerequisite installed).
fn no_skip() -> bool {
    std::env::var("ASBX_TEST_NO_SKIP").is_ok_and(|v| v == "1")
}

fn tmp_entries() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/tmp")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn leftovers(before: &[String]) -> Result<(), String> {
    let prefix = format!("asbx-it-{}-", std::process::id());
    for ctrl in ["memory", "pids", "cpu"] {
        let dir = Path::new("/sys/fs/cgroup").join(ctrl).join("asbx");
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with(&prefix) {
                    return Err(format!("cgroup left: {}", e.path().display()));
                }
            }
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if let Some(l) = mounts
        .lines()
        .find(|l| l.contains(".oldroot") || l.contains("asbx-it"))
    {
        return Err(format!("mount left on the host: {l}"));
    }
    let new: Vec<String> = tmp_entries()
        .into_iter()
        .filter(|e| !before.contains(e) && !e.starts_with(".tmp"))
        .collect();
    if !new.is_empty() {
        return Err(format!("new entries in /tmp: {new:?}"));
    }
    Ok(())
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A sandbox to be: its policy and the host folder behind `/work`.
pub struct Sbx {
    pub policy: JailPolicy,
    pub dir: tempfile::TempDir,
    pub marker: String,
}

impl Sbx {
    pub fn new(script: &str) -> Sbx {
        Sbx::argv(&["/bin/bash", "-c", script])
    }

    pub fn argv(argv: &[&str]) -> Sbx {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let dir = tempfile::Builder::new()
            .prefix(".tmp-asbx-it")
            .tempdir()
            .unwrap();
        let marker = format!("m{pid}x{n}");
        let policy = JailPolicy {
            workdir: dir.path().to_string_lossy().into_owned(),
            binds: Vec::new(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("HOME".into(), "/work".into()),
                ("LANG".into(), "C.UTF-8".into()),
                ("ASBX_IT_MARKER".into(), marker.clone()),
            ],
            host_uid: 300_000 + HOST_IDS_PER_SANDBOX * ((pid % 5000) * 100 + n),
            limits: ResourceLimits::default(),
            cgroup: format!("asbx-it-{pid}-{n}"),
            profile: JailProfile::Strict,
            entry: JailEntry::Exec,
            guard: true,
            background: false,
        };
        Sbx {
            policy,
            dir,
            marker,
        }
    }

    pub fn spawn(&self, stdin: Option<&[u8]>) -> Child {
        let json = serde_json::to_string(&self.policy).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .arg("__jail")
            .arg(json)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut sin = child.stdin.take().unwrap();
        if let Some(data) = stdin {
            sin.write_all(data).unwrap();
        }
        drop(sin);
        child
    }

    /// Start the jail in its own process group, the way the runner does.
    pub fn spawn_in_group(&self) -> Child {
        use std::os::unix::process::CommandExt;
        let json = serde_json::to_string(&self.policy).unwrap();
        Command::new(std::env::current_exe().unwrap())
            .arg("__jail")
            .arg(json)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    }

    /// Start the jail through `it __parent` (the returned child is that parent).
    pub fn spawn_via_parent(&self) -> Child {
        let json = serde_json::to_string(&self.policy).unwrap();
        Command::new(std::env::current_exe().unwrap())
            .arg("__parent")
            .arg(json)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    }

    /// Host pids whose command line names this sandbox's cgroup: its
    /// supervisor, the supervisor's cleanup guard, and `it __parent`.
    pub fn supervisor_pids(&self) -> Vec<i32> {
        let needle = format!("\"cgroup\":\"{}\"", self.policy.cgroup);
        let me = std::process::id() as i32;
        let mut v = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if pid == me {
                continue;
            }
            if let Ok(cmd) = std::fs::read(e.path().join("cmdline"))
                && String::from_utf8_lossy(&cmd).contains(&needle)
            {
                v.push(pid);
            }
        }
        v
    }

    pub fn run(&self) -> Out {
        self.run_with(None, Duration::from_secs(60))
    }

    pub fn run_with(&self, stdin: Option<&[u8]>, timeout: Duration) -> Out {
        finish(self.spawn(stdin), timeout)
    }

    pub fn cgroup_dirs(&self) -> Vec<PathBuf> {
        ["memory", "pids", "cpu", "freezer"]
            .iter()
            .filter(|c| Path::new("/sys/fs/cgroup").join(c).is_dir())
            .map(|c| {
                Path::new("/sys/fs/cgroup")
                    .join(c)
                    .join("asbx")
                    .join(&self.policy.cgroup)
            })
            .collect()
    }
}

/// What a run printed and returned.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn ok(self) -> Result<Out, String> {
        if self.code == 0 {
            Ok(self)
        } else {
            Err(format!(
                "exit {}: stdout {:?} stderr {:?}",
                self.code, self.stdout, self.stderr
            ))
        }
    }
}

/// Wait for `child` (killing it after `timeout`) and collect its output.
pub fn finish(mut child: Child, timeout: Duration) -> Out {
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t1 = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t2 = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    Out {
        code,
        stdout: t1.join().unwrap_or_default(),
        stderr: t2.join().unwrap_or_default(),
    }
}

/// Host pids whose environment carries `marker`.
pub fn marked_pids(marker: &str) -> Vec<i32> {
    let needle = format!("ASBX_IT_MARKER={marker}\0");
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(env) = std::fs::read(e.path().join("environ"))
            && String::from_utf8_lossy(&env).contains(&needle)
        {
            v.push(pid);
        }
    }
    v
}

/// Poll `f` until it is true or `timeout` passed.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Fail with a message unless `cond`.
pub fn ensure(cond: bool, msg: impl Into<String>) -> Result<(), String> {
    if cond { Ok(()) } else { Err(msg.into()) }
}
