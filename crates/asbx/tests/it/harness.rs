//! Starting the real binary, a fake workspace for callbacks, and reading streams.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use asbx_protocol::callback::ConfigResponse;
use asbx_protocol::{Event, Line, LineDecoder, StepStatus};

pub const ASBX: &str = env!("CARGO_BIN_EXE_asbx");

/// The isolation profile the tests run with (`strict` unless overridden).
pub fn profile() -> String {
    std::env::var("ASBX_TEST_PROFILE").unwrap_or_else(|_| "strict".to_owned())
}

/// A runner started from the real binary; killed (by PID) on drop.
pub struct RunnerProc {
    child: Child,
    pub url: String,
    pub data: tempfile::TempDir,
    /// The runner's bearer, when the test started it with one.
    token: Option<String>,
}

impl RunnerProc {
    pub fn start(extra_env: &[(&str, &str)]) -> RunnerProc {
        Self::start_with(&profile(), extra_env)
    }

    pub fn start_with(profile: &str, extra_env: &[(&str, &str)]) -> RunnerProc {
        Self::spawn(Command::new(ASBX), "127.0.0.1:0", profile, extra_env)
    }

    /// `asbx runner` from `cmd` (the binary, or the binary in a network
    /// namespace) on `listen`, over a clean provider environment.
    fn spawn(
        mut cmd: Command,
        listen: &str,
        profile: &str,
        extra_env: &[(&str, &str)],
    ) -> RunnerProc {
        let data = tempfile::tempdir().expect("tempdir");
        cmd.args(["runner", "--listen", listen, "--profile", profile])
            .env("ASBX_DATA", data.path())
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("ANTHROPIC_BASE_URL")
            .env_remove("ASBX_RUNNER_TOKEN")
            .env("ASBX_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn asbx runner");
        let url = banner_url(&mut child, "runner");
        let token = extra_env
            .iter()
            .find(|(k, _)| *k == "ASBX_RUNNER_TOKEN")
            .map(|(_, v)| (*v).to_owned());
        RunnerProc {
            child,
            url,
            data,
            token,
        }
    }

    pub fn sessions_dir(&self) -> PathBuf {
        self.data
            .path()
            .canonicalize()
            .unwrap()
            .join("runner/sessions")
    }

    /// Waits until no session folder is left.
    pub async fn assert_clean(&self) {
        let dir = self.sessions_dir();
        // Teardown is asynchronous and, on a loaded 2-core machine, slow:
        // what is checked is that nothing stays, not how fast it goes.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let left: Vec<_> = std::fs::read_dir(&dir)
                .map(|d| d.flatten().map(|e| e.file_name()).collect())
                .unwrap_or_default();
            if left.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "session folders left behind: {left:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut list = reqwest::Client::new().get(format!("{}/v1/sessions", self.url));
        if let Some(token) = &self.token {
            list = list.bearer_auth(token);
        }
        let sessions: Vec<serde_json::Value> = list
            .send()
            .await
            .expect("list sessions")
            .json()
            .await
            .expect("sessions json");
        let ids: Vec<String> = sessions
            .iter()
            .filter_map(|s| s["id"].as_str().map(str::to_owned))
            .collect();
        assert_no_cgroups_left(&ids);
        // Sandboxes taken from the warm pool are gone too: only the pool's
        // own (as many as `/healthz` counts warm) may remain, booted and
        // waiting.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let waiting = self.warm_count().await;
            let warm = self.warm_cgroups();
            let pool: Vec<_> = std::fs::read_dir(self.data.path().join("runner/pool"))
                .map(|d| d.flatten().map(|e| e.file_name()).collect())
                .unwrap_or_default();
            if warm.len() <= waiting && pool.len() <= waiting {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "used warm sandboxes left behind: {warm:?} {pool:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How many sandboxes wait in the warm pool (`/healthz`).
    pub async fn warm_count(&self) -> usize {
        let h: serde_json::Value = reqwest::get(format!("{}/healthz", self.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        h["warm"]
            .as_u64()
            .unwrap_or_else(|| panic!("no warm count: {h}")) as usize
    }

    /// The cgroups of this runner's warm-pool sandboxes (memory controller).
    pub fn warm_cgroups(&self) -> Vec<String> {
        let prefix = format!("asbx-warm-{}-", self.child.id());
        std::fs::read_dir("/sys/fs/cgroup/memory/asbx")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&prefix))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// SIGTERM, and wait for the runner to exit.
    pub fn terminate(&mut self) {
        stop(&mut self.child);
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for RunnerProc {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// Keeps reading a child's stdout, so it never writes into a closed pipe.
fn drain(mut reader: impl BufRead + Send + 'static) {
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        while reader.read_until(b'\n', &mut sink).unwrap_or(0) > 0 {
            sink.clear();
        }
    });
}

/// Ends a process this test started: SIGTERM by PID, SIGKILL after 3 s.
fn stop(child: &mut Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// No cgroup of these sessions is left under any controller.
pub fn assert_no_cgroups_left(sessions: &[String]) {
    for ctrl in [
        "memory",
        "pids",
        "cpu",
        "cpu,cpuacct",
        "freezer",
        "unified",
        "",
    ] {
        for id in sessions {
            let dir = Path::new("/sys/fs/cgroup")
                .join(ctrl)
                .join("asbx")
                .join(format!("asbx-{id}"));
            assert!(!dir.exists(), "cgroup left behind: {}", dir.display());
        }
    }
}

/// Process ids whose command line contains `needle`.
pub fn pids_with(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        let mut cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        for b in cmdline.iter_mut().filter(|b| **b == 0) {
            *b = b' ';
        }
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            out.push(pid);
        }
    }
    out
}

pub use asbx_test_support::fake_workspace::FakeWorkspace;

pub fn scripted(model: &str) -> ConfigResponse {
    ConfigResponse {
        model: model.to_owned(),
        ..Default::default()
    }
}

/// A unique session id for a test.
pub fn session_id(test: &str) -> String {
    format!("{test}-{}", hex::encode(rand::random::<[u8; 12]>()))
}

/// `POST /stream` of `body` to the runner at `url`: the response, its body
/// still to be read.
pub async fn post_stream(url: &str, body: &serde_json::Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{url}/stream"))
        .json(body)
        .send()
        .await
        .unwrap()
}

/// POSTs `/stream` and reads the whole NDJSON answer.
pub async fn dispatch(url: &str, body: &serde_json::Value) -> (u16, Vec<Line>, String) {
    let res = post_stream(url, body).await;
    let status = res.status().as_u16();
    let ct = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    // Generous: a probe that greps the whole sandbox filesystem takes ~35 s
    // on a loaded 2-core machine.
    let bytes = tokio::time::timeout(Duration::from_secs(180), res.bytes())
        .await
        .expect("stream finished in time")
        .expect("body");
    if status != 200 {
        return (
            status,
            Vec::new(),
            String::from_utf8_lossy(&bytes).into_owned(),
        );
    }
    assert_eq!(ct, "application/x-ndjson");
    assert!(bytes.ends_with(b"\n"), "every line ends in a newline");
    let mut d = LineDecoder::default();
    let lines = d
        .push(&bytes)
        .into_iter()
        .map(|l| l.expect("well-formed line"))
        .collect();
    (status, lines, String::new())
}

/// Checks the stream invariants of docs/protocol.md §2 for protocol 1.
pub fn assert_well_formed(lines: &[Line]) {
    assert!(!lines.is_empty(), "no lines");
    let sid = &lines[0].session_id;
    let mut open: HashMap<&str, ()> = HashMap::new();
    let mut done: HashMap<&str, ()> = HashMap::new();
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l.seq, i as u64 + 1, "seq gap at {l:?}");
        assert_eq!(&l.session_id, sid);
        assert!(l.ts > 1_600_000_000_000);
        match &l.event {
            Event::Step(s) => match s.status {
                StepStatus::Running => {
                    assert!(!done.contains_key(s.id.as_str()) && open.insert(&s.id, ()).is_none())
                }
                StepStatus::Succeeded | StepStatus::Failed => {
                    assert!(
                        open.remove(s.id.as_str()).is_some(),
                        "finish without running: {s:?}"
                    );
                    assert!(s.duration_ms.is_some());
                    done.insert(&s.id, ());
                }
            },
            Event::Result(_) | Event::Error(_) => {
                assert_eq!(i, lines.len() - 1, "terminal line is not last");
            }
            Event::Log(_) => {}
            other => panic!("protocol 1 stream carries {other:?}"),
        }
    }
    assert!(open.is_empty(), "steps never finished: {open:?}");
    assert!(
        lines.last().unwrap().event.is_terminal(),
        "no terminal line"
    );
}

pub fn steps(lines: &[Line]) -> Vec<(&str, StepStatus)> {
    lines
        .iter()
        .filter_map(|l| match &l.event {
            Event::Step(s) => Some((s.name.as_str(), s.status)),
            _ => None,
        })
        .collect()
}

pub fn terminal(lines: &[Line]) -> &Event {
    &lines.last().expect("a line").event
}

pub fn script(actions: serde_json::Value) -> String {
    serde_json::json!({ "script": actions }).to_string()
}

/// `asbx workspace` alone (its runners are separate processes) on `listen`
/// with `env` over a clean environment; SIGTERM by PID on drop, or
/// [`WorkspaceProc::kill`].
pub struct WorkspaceProc {
    child: Child,
    pub url: String,
    killed: bool,
    _data: tempfile::TempDir,
}

impl WorkspaceProc {
    pub fn start(listen: &str, env: &[(&str, &str)]) -> WorkspaceProc {
        Self::spawn(Command::new(ASBX), listen, env)
    }

    /// `asbx workspace` from `cmd` (the binary, or the binary in a network
    /// namespace) on `listen`, with `env` over a clean environment.
    fn spawn(mut cmd: Command, listen: &str, env: &[(&str, &str)]) -> WorkspaceProc {
        let data = tempfile::tempdir().expect("tempdir");
        cmd.args(["workspace", "--listen", listen])
            .env_clear()
            .env("ASBX_DATA", data.path())
            .env("ASBX_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn asbx workspace");
        let url = banner_url(&mut child, "workspace");
        WorkspaceProc {
            child,
            url,
            killed: false,
            _data: data,
        }
    }

    /// SIGKILL, as a machine dying would: nothing gets to clean up.
    pub fn kill(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.child.wait();
        self.killed = true;
    }
}

impl Drop for WorkspaceProc {
    fn drop(&mut self) {
        if !self.killed {
            stop(&mut self.child);
        }
    }
}

/// `asbx up` (workspace + runner) from the real binary; killed on drop.
pub struct UpProc {
    child: Child,
    pub url: String,
    /// The runner's own routes (`runner  URL` in the banner).
    pub runner_url: String,
    pub data: tempfile::TempDir,
}

impl UpProc {
    pub fn start(extra_env: &[(&str, &str)]) -> UpProc {
        let data = tempfile::tempdir().unwrap();
        let (child, banner) = spawn_up(data.path(), extra_env, Stdio::inherit());
        UpProc {
            child,
            url: banner.url,
            runner_url: banner.runner_url,
            data,
        }
    }
}

/// What `asbx up` prints when it is up.
pub struct Banner {
    /// `open  URL`: the workspace.
    pub url: String,
    /// `runner  URL (...)`: the runner's own routes.
    pub runner_url: String,
}

/// Starts `asbx up` on `data` (the caller keeps it, so it may outlive a
/// restart) with `extra_env` over a clean environment, and reads its banner.
/// The caller owns the child and ends it by PID.
pub fn spawn_up(data: &Path, extra_env: &[(&str, &str)], stderr: Stdio) -> (Child, Banner) {
    let mut cmd = Command::new(ASBX);
    cmd.args(["up", "--listen", "127.0.0.1:0", "--profile", &profile()])
        .env("ASBX_DATA", data)
        .env("ASBX_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr);
    for var in [
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "ASBX_MODEL",
        "ASBX_RUNNER_TOKEN",
        "ASBX_METRICS_TOKEN",
        "ASBX_REQUIRE_AUTH",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let (mut url, mut runner_url) = (None, None);
    for _ in 0..10 {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        let line = line.trim();
        if let Some(u) = line.strip_prefix("open") {
            url = Some(u.trim().to_owned());
        }
        if let Some(r) = line.strip_prefix("runner") {
            runner_url = r.split_whitespace().next().map(str::to_owned);
        }
        if url.is_some() && runner_url.is_some() {
            break;
        }
    }
    drain(reader);
    let banner = Banner {
        url: url.expect("`open URL` in the banner of asbx up"),
        runner_url: runner_url.expect("`runner URL` in the banner of asbx up"),
    };
    (child, banner)
}

impl Drop for UpProc {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

impl UpProc {
    /// The `asbx up` process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// The `result` values of the finished `shell` steps, in order: a command
/// that exited non-zero is a failed step that keeps its result.
pub fn shell_results(lines: &[Line]) -> Vec<serde_json::Value> {
    lines
        .iter()
        .filter_map(|l| match &l.event {
            Event::Step(s) if s.status != StepStatus::Running => s.result.clone(),
            _ => None,
        })
        .collect()
}

/// Runs `command` in a fresh sandbox and returns its stdout.
pub async fn shell(runner: &RunnerProc, ws: &FakeWorkspace, command: &str) -> (String, Vec<Line>) {
    let t = ws.mint(&session_id("sh"));
    let body = ws.body(
        &t,
        &script(
            serde_json::json!([{"tool": "shell", "args": {"command": command}}, {"say": "ok"}]),
        ),
    );
    let (status, lines, err) = dispatch(&runner.url, &body).await;
    assert_eq!(status, 200, "{err}");
    assert_well_formed(&lines);
    let out = shell_results(&lines)
        .first()
        .map(|r| r["stdout"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default();
    (out, lines)
}

/// `nsenter`, found where distributions put it (`ip netns exec` is not used:
/// it remounts `/sys`, which hides the cgroup tree a runner needs).
pub fn nsenter() -> &'static str {
    ["/usr/bin/nsenter", "/bin/nsenter", "/usr/sbin/nsenter"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("nsenter (util-linux)")
}

/// A command that runs `ASBX` in the network namespace `netns` (made with
/// `ip netns add`): `nsenter` enters it and execs the binary, so the child's
/// PID is the binary's own.
fn asbx_in_netns(netns: &str) -> Command {
    let mut cmd = Command::new(nsenter());
    cmd.arg(format!("--net=/run/netns/{netns}"))
        .arg("--")
        .arg(ASBX);
    cmd
}

/// Reads the first `http://` word of a child's banner line and keeps
/// draining its stdout.
fn banner_url(child: &mut Child, what: &str) -> String {
    let mut line = String::new();
    let mut reader = BufReader::new(child.stdout.take().expect("stdout"));
    reader.read_line(&mut line).expect("read banner");
    drain(reader);
    line.split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in the {what} banner {line:?}"))
        .to_owned()
}

impl RunnerProc {
    /// A runner in the network namespace `netns`, listening on `ip` (a
    /// non-loopback address there, so `extra_env` must give it
    /// `ASBX_RUNNER_TOKEN`).
    pub fn start_in_netns(netns: &str, ip: &str, extra_env: &[(&str, &str)]) -> RunnerProc {
        Self::spawn(
            asbx_in_netns(netns),
            &format!("{ip}:0"),
            &profile(),
            extra_env,
        )
    }

    /// SIGKILL, as a machine dying would; the sandboxes die with it.
    pub fn sigkill(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.child.wait();
    }

    /// The sessions the runner lists (`GET /v1/sessions` with `token`):
    /// `(id, status)`.
    pub async fn sessions_listed(&self, token: &str) -> Vec<(String, String)> {
        let sessions: Vec<serde_json::Value> = reqwest::Client::new()
            .get(format!("{}/v1/sessions", self.url))
            .bearer_auth(token)
            .send()
            .await
            .expect("list sessions")
            .json()
            .await
            .expect("sessions json");
        sessions
            .iter()
            .map(|s| {
                let field = |k: &str| s[k].as_str().unwrap_or_default().to_owned();
                (field("id"), field("status"))
            })
            .collect()
    }
}

impl WorkspaceProc {
    /// `asbx workspace` in the network namespace `netns` on `listen`, with
    /// `env` over a clean environment.
    pub fn start_in_netns(netns: &str, listen: &str, env: &[(&str, &str)]) -> WorkspaceProc {
        Self::spawn(asbx_in_netns(netns), listen, env)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Process ids whose command line or environment contains `needle`.
pub fn pids_mentioning(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let hit = ["cmdline", "environ"].iter().any(|f| {
            std::fs::read(e.path().join(f))
                .is_ok_and(|b| String::from_utf8_lossy(&b).contains(needle))
        });
        if hit {
            out.push(pid);
        }
    }
    out
}

/// Cgroup folders under any controller's `asbx/` whose name contains one of
/// `needles`.
pub fn cgroups_named(needles: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for h in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        for c in std::fs::read_dir(h.path().join("asbx"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = c.file_name().to_string_lossy().into_owned();
            if needles.iter().any(|n| name.contains(n.as_str())) {
                out.push(c.path().display().to_string());
            }
        }
    }
    out
}

/// The secret key of test workspace nodes on PostgreSQL (base64 of 32
/// bytes; every node of a test shares it).
pub(crate) const TEST_SECRET_KEY: &str = "dGVzdCBzZWNyZXQga2V5IG9mIDMyIGJ5dGVzIGxvbmc=";

/// A database of its own on the test PostgreSQL (`ASBX_TEST_PG_URL`),
/// dropped (`WITH (FORCE)`) on drop.
pub struct PgDatabase {
    server: String,
    pub name: String,
    pub url: String,
}

impl PgDatabase {
    pub fn create(server: &str, prefix: &str) -> PgDatabase {
        let name = format!("{prefix}_{}", hex::encode(rand::random::<[u8; 6]>()));
        pg_query(server, &format!("CREATE DATABASE {name}"));
        let mut url = reqwest::Url::parse(server).unwrap();
        url.set_path(&format!("/{name}"));
        PgDatabase {
            server: server.to_owned(),
            name,
            url: url.to_string(),
        }
    }

    /// Runs `sql` in this database; its rows, `|`-separated, one a line.
    pub fn query(&self, sql: &str) -> String {
        pg_query(&self.url, sql)
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        pg_query(
            &self.server,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

/// `psql` (Debian's postgresql-client) on `url`: the rows, unaligned.
pub fn pg_query(url: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-qtAc", sql])
        .output()
        .expect("psql (Debian's postgresql-client)");
    assert!(out.status.success(), "psql {sql}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
