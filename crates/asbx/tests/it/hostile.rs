//! Hostile end-to-end cases for the jail (issue 13, "Security, round two"):
//! the real runner, real jailed sandboxes, and an attack on the one thing a
//! sandbox must never do: outlive the runner that started it.

use std::path::Path;
use std::time::{Duration, Instant};

use asbx_protocol::{Event, StepStatus};
use serde_json::json;

use crate::harness::*;

/// Starts a turn whose shell tool leaves two `sleep`s marked with a fresh
/// environment variable (the marker, returned) and waits until the step runs.
async fn sleeping_turn(
    runner: &RunnerProc,
    ws: &FakeWorkspace,
    name: &str,
) -> (
    String,
    asbx_test_support::fake_workspace::Tokens,
    impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + use<>,
) {
    let marker = format!("{name}{}", rand::random::<u32>());
    let t = ws.mint(&session_id(name));
    let command = format!("export {marker}=1; sleep 300 & sleep 301; echo never");
    let body = ws.body(
        &t,
        &script(json!([{"tool": "shell", "args": {"command": command}}])),
    );
    let res = post_stream(&runner.url, &body).await;
    let stream = crate::dispatch::read_until(
        res,
        |e| matches!(e, Event::Step(s) if s.status == StepStatus::Running),
    )
    .await;
    (marker, t, stream)
}

/// docs/protocol.md §8: SIGKILL the runner mid-turn; 5 s later no process of
/// its sandboxes (the tool's `sleep`, the agent, init, the supervisors of
/// the turn and of the warm pool) and none of their cgroups is left.
#[tokio::test]
async fn sandboxes_die_with_a_sigkilled_runner() {
    if !strict_with_cgroups("sandboxes_die_with_a_sigkilled_runner") {
        return;
    }
    let mut runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let (marker, t, stream) = sleeping_turn(&runner, &ws, "orphan").await;
    let data = runner.data.path().canonicalize().unwrap();
    let data = data.display().to_string();
    let warm = format!("asbx-warm-{}-", runner.pid());
    let needles = vec![t.session.clone(), warm];
    // Positive control: the tool runs, supervisors exist, cgroups exist.
    let deadline = Instant::now() + Duration::from_secs(20);
    while pids_mentioning(&marker).len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tools = pids_mentioning(&marker);
    let supervisors = pids_mentioning(&data);
    let cgroups = cgroups_named(&needles);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(runner.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    drop(stream);
    let killed = Instant::now();
    let mut left = (Vec::new(), Vec::new(), Vec::new());
    while killed.elapsed() < Duration::from_secs(5) {
        left = (
            pids_mentioning(&marker),
            pids_mentioning(&data),
            cgroups_named(&needles),
        );
        if left.0.is_empty() && left.1.is_empty() && left.2.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let gone_after = killed.elapsed();
    // Whatever is left is this test's own doing: end the supervisors (by
    // PID) so a failure leaves nothing behind, then report.
    for pid in &left.1 {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    runner.terminate();
    assert!(tools.len() >= 2, "the tool's sleeps never ran: {tools:?}");
    assert!(
        supervisors.len() >= 2,
        "no supervisor seen before the kill: {supervisors:?}"
    );
    assert!(!cgroups.is_empty(), "no sandbox cgroup before the kill");
    assert!(
        left.0.is_empty() && left.1.is_empty() && left.2.is_empty(),
        "5 s after SIGKILL of the runner: tools {:?}, supervisors {:?}, cgroups {:?}",
        left.0,
        left.1,
        left.2
    );
    println!(
        "sandboxes gone {} ms after the runner",
        gone_after.as_millis()
    );
}

/// The runner starts its jails without a cleanup guard (one process less per
/// sandbox) and removes what a killed supervisor leaves itself: SIGKILL the
/// supervisor of a turn whose tool runs in the `tools` child cgroup; the
/// runner lives on, the turn ends with an error, and within 5 s no process
/// of the sandbox and none of its cgroups, children included, is left.
#[tokio::test]
async fn a_sigkilled_supervisor_leaves_nothing_behind() {
    if !strict_with_cgroups("a_sigkilled_supervisor_leaves_nothing_behind") {
        return;
    }
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let (marker, t, stream) = sleeping_turn(&runner, &ws, "supkill").await;
    let needles = vec![t.session.clone()];
    let deadline = Instant::now() + Duration::from_secs(20);
    while pids_mentioning(&marker).len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tools = pids_mentioning(&marker);
    let supervisors = pids_mentioning(&t.session);
    let cgroups = cgroups_named(&needles);
    let tools_child = cgroups
        .iter()
        .any(|c| Path::new(c).join("tools").join("cgroup.procs").exists());
    assert!(tools.len() >= 2, "the tool's sleeps never ran: {tools:?}");
    assert_eq!(
        supervisors.len(),
        1,
        "one supervisor, no guard: {supervisors:?}"
    );
    assert!(
        tools_child,
        "no tools child cgroup before the kill: {cgroups:?}"
    );
    // A sandbox serving a dispatch has the default CPU weight (a warm one
    // taken from the pool got it back).
    let cpu = cgroups
        .iter()
        .find(|c| c.contains("/cpu/"))
        .expect("a cpu cgroup");
    let shares = std::fs::read_to_string(Path::new(cpu).join("cpu.shares")).unwrap_or_default();
    assert_eq!(shares.trim(), "1024", "cpu.shares of {cpu}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(supervisors[0]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let mut rest = String::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        use futures::StreamExt;
        let mut stream = std::pin::pin!(stream);
        while let Some(Ok(chunk)) = stream.next().await {
            rest.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await
    .expect("the turn ends after its supervisor died");
    let last = rest.lines().last().unwrap_or_default();
    assert!(
        last.contains(r#""type":"error""#),
        "the turn ends with an error: {rest}"
    );
    let left = left_after(Duration::from_secs(5), || {
        (pids_mentioning(&marker), cgroups_named(&needles))
    })
    .await;
    assert!(
        left.0.is_empty() && left.1.is_empty(),
        "5 s after SIGKILL of the supervisor: tools {:?}, cgroups {:?}",
        left.0,
        left.1
    );
    runner.assert_clean().await;
}

/// Whether the strict profile's cgroups are here; says why `test` is
/// skipped when not.
fn strict_with_cgroups(test: &str) -> bool {
    let here = Path::new("/sys/fs/cgroup").exists() && profile() == "strict";
    if !here {
        asbx_test_support::skip(
            test,
            &format!("needs the strict profile (ASBX_TEST_PROFILE={})", profile()),
        );
    }
    here
}

/// The runner's zygote (`asbx jail --zygote` among its children), and
/// whether it is a zombie. A supervisor it just forked shows the same title
/// until it writes its own, a moment later: the zygote is the oldest.
fn zygote_of(runner: u32) -> Option<(i32, bool)> {
    let mut found: Option<(u64, i32, bool)> = None;
    for pid in pids_with("asbx jail --zygote") {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(") ")
            .map(|(_, r)| r)
            .unwrap_or("")
            .split(' ')
            .collect();
        // Fields 3, 4 and 22 of /proc/pid/stat: state, ppid, start time.
        let ppid = fields.get(1).and_then(|p| p.parse::<u32>().ok());
        let started = fields.get(19).and_then(|t| t.parse::<u64>().ok());
        if let (Some(ppid), Some(started)) = (ppid, started)
            && ppid == runner
            && found.is_none_or(|(t, _, _)| started < t)
        {
            found = Some((started, pid, fields.first() == Some(&"Z")));
        }
    }
    found.map(|(_, pid, zombie)| (pid, zombie))
}

/// A runner's zygote that dies (SIGKILLed here) costs no dispatch: the next
/// boot finds it gone, reaps it, spawns that sandbox's supervisor instead
/// and starts a new zygote for the boots after.
#[tokio::test]
async fn a_dead_zygote_is_replaced_and_no_dispatch_fails() {
    if !strict_with_cgroups("a_dead_zygote_is_replaced_and_no_dispatch_fails") {
        return;
    }
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        if let Some((pid, false)) = zygote_of(runner.pid()) {
            break pid;
        }
        assert!(
            Instant::now() < deadline,
            "no zygote: the pool boots through one"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    for i in 0..4 {
        let t = ws.mint(&session_id(&format!("zyg{i}")));
        let prompt =
            script(json!([{"tool": "shell", "args": {"command": "echo hi"}}, {"say": "ok"}]));
        let (status, lines, _) = dispatch(&runner.url, &ws.body(&t, &prompt)).await;
        assert_eq!(status, 200);
        assert_well_formed(&lines);
        assert!(
            matches!(terminal(&lines), Event::Result(r) if r.message == "ok"),
            "dispatch {i} after the zygote died: {lines:?}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = zygote_of(runner.pid());
        let reaped = !std::path::Path::new(&format!("/proc/{first}")).exists();
        if reaped && now.is_some_and(|(pid, zombie)| pid != first && !zombie) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dead zygote {first} was not reaped (gone: {reaped}) and replaced: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its spare cgroups went with it (the runner removes what a killed
    // zygote could not).
    let spares = cgroups_named(&[format!("zygote-{first}-")]);
    assert!(spares.is_empty(), "the dead zygote's spares: {spares:?}");
    runner.assert_clean().await;
}

/// A runner stopped (SIGTERM) while its warm pool is still booting leaves
/// no warm sandbox behind: the drain first stops the refill, so no sandbox
/// is booted after the drain took the warm ones (one that was would be
/// killed with its runner and leave its cgroups to the next sweep), and
/// its zygote's spare cgroups go too.
#[tokio::test]
async fn a_runner_stopped_while_its_pool_boots_leaves_nothing() {
    if !strict_with_cgroups("a_runner_stopped_while_its_pool_boots_leaves_nothing") {
        return;
    }
    let mut runner = RunnerProc::start(&[("ASBX_WARM_POOL", "12"), ("ASBX_WARM_POOL_MAX", "12")]);
    let warm = vec![format!("asbx-warm-{}-", runner.pid())];
    let data = runner.data.path().canonicalize().unwrap();
    let data = data.display().to_string();
    // Stop it once its first warm sandbox exists, while the rest boot.
    let deadline = Instant::now() + Duration::from_secs(20);
    while cgroups_named(&warm).is_empty() {
        assert!(Instant::now() < deadline, "the pool never booted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The pool boots through the zygote, whose spare cgroups go with it.
    let (zygote, _) = zygote_of(runner.pid()).expect("the pool boots through a zygote");
    let warm = vec![warm[0].clone(), format!("zygote-{zygote}-")];
    runner.terminate();
    let left = left_after(Duration::from_secs(10), || {
        (cgroups_named(&warm), pids_mentioning(&data))
    })
    .await;
    assert!(
        left.0.is_empty() && left.1.is_empty(),
        "10 s after SIGTERM: warm cgroups {:?}, processes {:?}",
        left.0,
        left.1
    );
}

/// What `probe` still finds once both its lists are empty, or `limit` passed.
async fn left_after<A, B>(
    limit: Duration,
    probe: impl Fn() -> (Vec<A>, Vec<B>),
) -> (Vec<A>, Vec<B>) {
    let since = Instant::now();
    loop {
        let left = probe();
        if (left.0.is_empty() && left.1.is_empty()) || since.elapsed() >= limit {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
