//! How tool processes start and how they end.
//!
//! **Start.** Every process the agent starts for a tool (`shell`, skill
//! scripts, the setup script) or a stdio MCP server gets a clean
//! environment ([`base_env`]), its own process group, the tool user (MCP
//! servers: [`MCP_UID`], so a tool can't read a server's environment from
//! `/proc`), and joins the sandbox's child cgroup for its kind ([`Slot`]):
//! `{TOOL_CGROUP_IN_JAIL}/{tools|mcp}/*/cgroup.procs`. The process joins
//! itself between `fork` and `exec`, already under the tool's uid
//! ([`asbx_jail::join_cgroups_on_spawn`]: the agent crate has no `unsafe`,
//! so the `pre_exec` hook lives in the jail crate): it writes `0` to each
//! `cgroup.procs`, and a failed write fails the spawn, so the tool never
//! runs outside its cgroup. One `exec` per tool start: a `sh -c` wrapper
//! that did the writes and then `exec`ed the command cost about 1 ms more.
//! No folder (the `namespaces` or `unconfined` profile, tests outside a
//! jail) means no join. On cgroup v1 a child's memory cgroup is made when
//! its first process starts: the agent asks its supervisor first
//! ([`asbx_jail::request_memory_cgroup`]), and a child folder without its
//! `cgroup.procs` fails the spawn.
//!
//! The environment ([`base_env`]) sets `SHELL`: without it bash looks the
//! tool uid up in NSS at start (`getpwuid`, which loads `libnss_systemd`
//! when `/etc/nsswitch.conf` names it and the uid has no `/etc/passwd`
//! line), about 0.5 ms per `bash -c`.
//!
//! **End.** [`Reaper::kill`] kills the tool and everything it started. With
//! a cgroup: v2 writes `cgroup.kill`; v1 freezes (`freezer.state` =
//! `FROZEN`), sends SIGKILL to every pid in `cgroup.procs`, thaws, and
//! repeats until the cgroup is empty (a frozen process can't fork away).
//! Only the tool user may write the `tools` cgroup's `cgroup.procs`, and
//! nothing else it can open (issue 26, item 4); should a tool's process
//! still get out of the cgroup, the sweep below finds it, so a tool that
//! runs as its own uid gets the sweep with a cgroup too.
//! Without one (the `namespaces` profile): SIGKILL to the process group, to
//! every descendant of the tool's process the agent can see, and, when tools
//! run as their own uid, a sweep of that uid: a short-lived helper
//! (`bash -c 'kill -KILL -1'`) started as the tool user sends `kill(-1,
//! SIGKILL)`, which reaches every process of that uid in the sandbox's pid
//! namespace, including what left the group (`setsid`, double fork) and
//! what `hidepid` hides from the agent, and nothing else: the agent (1000)
//! and MCP servers ([`MCP_UID`]) are other uids, init is never signalled by
//! `-1`. The kernel delivers it under the task list lock, so nothing forks
//! away from it. MCP servers get no sweep: it would end every server. The
//! result ([`Killed`]) says which way it went, for the step's error.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use asbx_protocol::jail::{CGROUP_CHILDREN, MCP_UID, TOOL_CGROUP_IN_JAIL};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// The `PATH` tools get.
pub(crate) const TOOL_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long [`Reaper::kill`] keeps trying.
const KILL_PATIENCE: Duration = Duration::from_secs(3);

/// Builds the minimal environment for tool processes (also the setup script).
pub(crate) fn base_env(workdir: &Path) -> Vec<(String, String)> {
    vec![
        ("PATH".into(), TOOL_PATH.into()),
        ("HOME".into(), workdir.display().to_string()),
        ("LANG".into(), "C.UTF-8".into()),
        ("TMPDIR".into(), "/tmp".into()),
        ("SHELL".into(), "/bin/bash".into()),
    ]
}

/// Which child cgroup (and user) a process gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// `shell`, skill scripts, the setup script: the tool user.
    Tools,
    /// Stdio MCP servers: [`MCP_UID`] with the tools' gid.
    Mcp,
}

impl Slot {
    fn dir_name(self) -> &'static str {
        match self {
            Slot::Tools => CGROUP_CHILDREN[0],
            Slot::Mcp => CGROUP_CHILDREN[1],
        }
    }

    /// The uid and gid a process of this slot runs as, given the tool user.
    pub(crate) fn user(self, tool_user: Option<(u32, u32)>) -> Option<(u32, u32)> {
        match self {
            Slot::Tools => tool_user,
            Slot::Mcp => tool_user.map(|(_, gid)| (MCP_UID, gid)),
        }
    }
}

/// Where the child cgroups are: [`TOOL_CGROUP_IN_JAIL`] in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupRoot(pub(crate) PathBuf);

impl Default for CgroupRoot {
    fn default() -> Self {
        CgroupRoot(PathBuf::from(TOOL_CGROUP_IN_JAIL))
    }
}

/// One child cgroup of the sandbox, as seen from inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChildCgroup {
    /// Every `cgroup.procs` of the child, one per hierarchy.
    procs: Vec<PathBuf>,
    /// v2: the `unified` folder (`cgroup.kill`, `cgroup.freeze`).
    unified: Option<PathBuf>,
    /// v1: `freezer/freezer.state`.
    freezer: Option<PathBuf>,
}

impl ChildCgroup {
    /// The child cgroup of `slot` under `root`: `Ok(None)` when its folder
    /// does not exist; an error when it exists but holds no `cgroup.procs`.
    pub(crate) fn find(root: &CgroupRoot, slot: Slot) -> Result<Option<ChildCgroup>, String> {
        let dir = root.0.join(slot.dir_name());
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", dir.display())),
        };
        let mut procs = Vec::new();
        for entry in entries.flatten() {
            let p = entry.path().join("cgroup.procs");
            if !p.exists() {
                // A cgroup not made (or not mounted): never run outside it.
                return Err(format!("{} holds no cgroup.procs", entry.path().display()));
            }
            procs.push(p);
        }
        procs.sort();
        if procs.is_empty() {
            return Err(format!("{} holds no cgroup.procs", dir.display()));
        }
        let unified = Some(dir.join("unified")).filter(|u| u.join("cgroup.procs").exists());
        let freezer = Some(dir.join("freezer").join("freezer.state")).filter(|f| f.exists());
        Ok(Some(ChildCgroup {
            procs,
            unified,
            freezer,
        }))
    }

    /// Every pid in any of the child's `cgroup.procs`.
    pub(crate) fn pids(&self) -> HashSet<i32> {
        self.procs
            .iter()
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .flat_map(|s| {
                s.lines()
                    .filter_map(|l| l.trim().parse::<i32>().ok())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// One pass: `cgroup.kill` (v2), or freeze, SIGKILL every pid, thaw.
    /// Returns the last error, if any step failed.
    fn kill_pass(&self) -> Option<String> {
        let mut err = None;
        if let Some(u) = &self.unified {
            match std::fs::write(u.join("cgroup.kill"), "1") {
                Ok(()) => return None,
                // Kernels before 5.14 have no cgroup.kill: freeze and kill.
                Err(e) => err = Some(format!("cgroup.kill: {e}")),
            }
        }
        let freeze = |on: bool| -> Option<String> {
            let r = match (&self.freezer, &self.unified) {
                (Some(f), _) => std::fs::write(f, if on { "FROZEN" } else { "THAWED" }),
                (None, Some(u)) => {
                    std::fs::write(u.join("cgroup.freeze"), if on { "1" } else { "0" })
                }
                (None, None) => return None,
            };
            r.err().map(|e| format!("freezer: {e}"))
        };
        if let Some(e) = freeze(true) {
            err = Some(e);
        }
        for pid in self.pids() {
            if let Err(e) = kill(Pid::from_raw(pid), Signal::SIGKILL)
                && e != nix::errno::Errno::ESRCH
            {
                err = Some(format!("kill {pid}: {}", e.desc()));
            }
        }
        if let Some(e) = freeze(false) {
            err = Some(e);
        }
        err
    }

    fn how(&self) -> &'static str {
        if self.unified.is_some() {
            "the tools cgroup (cgroup v2)"
        } else {
            "the tools cgroup (frozen, then every process killed)"
        }
    }

    /// [`ChildCgroup::how`] and the tool-uid sweep.
    fn how_with_sweep(&self) -> &'static str {
        if self.unified.is_some() {
            "the tools cgroup (cgroup v2) and every process of the tool user (kill -1 as that user)"
        } else {
            "the tools cgroup (frozen, then every process killed) and every process of the \
             tool user (kill -1 as that user)"
        }
    }
}

/// How a tool's processes were killed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Killed {
    /// Which way: the cgroup, or the process group and tool uid.
    pub(crate) how: &'static str,
    /// Processes still alive when the agent gave up (0: all gone).
    pub(crate) left: usize,
    /// The last error met, if any.
    pub(crate) error: Option<String>,
    /// Without a cgroup, the agent could not see the tool's process in
    /// `/proc` (mounted with `hidepid`) and no tool-uid sweep succeeded
    /// (MCP servers get none): what it started can't be found.
    pub(crate) blind: bool,
}

impl std::fmt::Display for Killed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "killed through {}", self.how)?;
        if self.left > 0 {
            write!(f, ", but {} process(es) survived", self.left)?;
        }
        if let Some(e) = &self.error {
            write!(f, " ({e})")?;
        }
        if self.blind {
            write!(
                f,
                "; the agent can't see the tool's processes in /proc, so what it started in \
                 the background may still run"
            )?;
        }
        Ok(())
    }
}

/// Kills one tool's processes: on demand ([`Reaper::kill`]) or, unless
/// disarmed, when dropped (a call abandoned at the run's duration limit).
#[derive(Debug)]
pub(crate) struct Reaper {
    pid: Option<i32>,
    cgroup: Option<ChildCgroup>,
    /// The uid the tool runs as, when it is not the agent's own.
    uid: Option<u32>,
    /// The tool uid to sweep with `kill(-1)` (not [`MCP_UID`]).
    sweep: Option<u32>,
    armed: bool,
}

impl Reaper {
    pub(crate) fn new(pid: Option<u32>, cgroup: Option<ChildCgroup>, uid: Option<u32>) -> Self {
        let own = nix::unistd::getuid().as_raw();
        let uid = uid.filter(|u| *u != own);
        Reaper {
            pid: pid.and_then(|p| i32::try_from(p).ok()),
            sweep: uid.filter(|u| *u != MCP_UID),
            cgroup,
            uid,
            armed: true,
        }
    }

    /// Leaves the processes alone when dropped.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }

    /// Kills everything the tool started and waits (up to a few seconds)
    /// until nothing is left.
    pub(crate) async fn kill(&mut self) -> Killed {
        self.armed = false;
        let started = Instant::now();
        let hidden = self.cgroup.is_none()
            && self
                .pid
                .is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists());
        let mut known: HashSet<i32> = HashSet::new();
        let mut swept = false;
        loop {
            let (mut left, mut error) = self.pass(&mut known);
            if let Some(uid) = self.sweep {
                let helper =
                    crate::orphans::spawn(|| sweep_command(uid).spawn(), tokio::process::Child::id);
                let status = match helper {
                    Ok(mut child) => child.wait().await,
                    Err(e) => Err(e),
                };
                match status {
                    Ok(s) if s.success() => swept = true,
                    // Retried: a fork bomb at its RLIMIT_NPROC makes the
                    // helper's exec fail until the group's kill thinned it.
                    Ok(s) => {
                        error = Some(format!("the kill -1 helper exited {s}"));
                        left = left.max(1);
                    }
                    Err(e) => {
                        error = Some(format!("the kill -1 helper: {e}"));
                        left = left.max(1);
                    }
                }
            }
            let blind = hidden && !swept;
            if left == 0 || started.elapsed() > KILL_PATIENCE {
                return Killed {
                    how: self.how(),
                    left,
                    error,
                    blind,
                };
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn how(&self) -> &'static str {
        match (&self.cgroup, self.uid, self.sweep) {
            (Some(c), _, Some(_)) => c.how_with_sweep(),
            (Some(c), _, None) => c.how(),
            (None, _, Some(_)) => {
                "its process group and every process of the tool user (kill -1 as that user)"
            }
            (None, Some(_), None) => "its process group and every process of the tool user",
            (None, None, _) => "its process group and its descendants",
        }
    }

    /// One round of killing; returns how many processes are still there.
    fn pass(&self, known: &mut HashSet<i32>) -> (usize, Option<String>) {
        if let Some(cg) = &self.cgroup {
            let error = cg.kill_pass();
            return (cg.pids().len(), error);
        }
        let mut error = None;
        let table = proc_table();
        if let Some(pid) = self.pid {
            known.insert(pid);
            if let Err(e) = killpg(Pid::from_raw(pid), Signal::SIGKILL)
                && e != nix::errno::Errno::ESRCH
            {
                error = Some(format!("killpg {pid}: {}", e.desc()));
            }
        }
        // Descendants (also those that left the group) and, with a tool
        // uid, every process of it.
        let mut grew = true;
        while grew {
            grew = false;
            for p in &table {
                let mine = known.contains(&p.ppid) || self.uid.is_some_and(|u| u == p.uid);
                if mine && known.insert(p.pid) {
                    grew = true;
                }
            }
        }
        let mut left = 0;
        for p in &table {
            if !known.contains(&p.pid) || p.zombie {
                continue;
            }
            left += 1;
            if let Err(e) = kill(Pid::from_raw(p.pid), Signal::SIGKILL)
                && e != nix::errno::Errno::ESRCH
            {
                error = Some(format!("kill {}: {}", p.pid, e.desc()));
            }
        }
        (left, error)
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if self.armed {
            let mut known = HashSet::new();
            // Two rounds: the second catches what forked during the first.
            let _ = self.pass(&mut known);
            let _ = self.pass(&mut known);
            if let Some(uid) = self.sweep {
                let helper = crate::orphans::spawn(
                    || sweep_command(uid).into_std().spawn(),
                    |c| Some(c.id()),
                );
                if let Ok(mut child) = helper {
                    let _ = child.wait();
                }
            }
        }
    }
}

/// The helper that sends `kill(-1, SIGKILL)` as `uid`: every process of
/// that uid in the pid namespace but the helper itself (see the module docs).
fn sweep_command(uid: u32) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("bash");
    cmd.args(["-c", "kill -KILL -1"])
        .env_clear()
        .env("PATH", TOOL_PATH)
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .uid(uid)
        .gid(nix::unistd::getgid().as_raw());
    cmd
}

/// One row of `/proc`.
#[derive(Debug, Clone, Copy)]
struct ProcRow {
    pid: i32,
    ppid: i32,
    uid: u32,
    zombie: bool,
}

/// Every process the agent can see, with its parent, real uid and state.
fn proc_table() -> Vec<ProcRow> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut rows = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
        };
        let ppid = field("PPid:").and_then(|v| v.parse().ok()).unwrap_or(0);
        let uid = field("Uid:")
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(u32::MAX);
        let zombie = field("State:").is_some_and(|s| s.starts_with('Z'));
        rows.push(ProcRow {
            pid,
            ppid,
            uid,
            zombie,
        });
    }
    rows
}

/// A command for `program args`, in its own process group, as the slot's
/// user, joining the slot's cgroup under `root` before it `exec`s when
/// there is one. Returns the cgroup it joins, for [`Reaper`] and
/// [`join_failure`].
pub(crate) fn command(
    program: &str,
    args: &[String],
    slot: Slot,
    tool_user: Option<(u32, u32)>,
    root: &CgroupRoot,
) -> Result<(tokio::process::Command, Option<ChildCgroup>), String> {
    // On cgroup v1 the child's memory cgroup is made when its first
    // process starts (see `asbx_jail::request_memory_cgroup`; a no-op
    // outside a jail that makes them so).
    asbx_jail::request_memory_cgroup(slot.dir_name())
        .map_err(|e| format!("the tool cannot get its cgroup: {e}"))?;
    let cgroup = ChildCgroup::find(root, slot)?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).process_group(0).kill_on_drop(true);
    if let Some((uid, gid)) = slot.user(tool_user) {
        cmd.uid(uid).gid(gid);
    }
    if let Some(cg) = &cgroup {
        asbx_jail::join_cgroups_on_spawn(cmd.as_std_mut(), &cg.procs)
            .map_err(|e| format!("the tool cannot join its cgroup: {e}"))?;
    }
    Ok((cmd, cgroup))
}

/// The cgroup join that failed a spawn of a command built by [`command`],
/// if that is why `err` happened.
pub(crate) fn join_failure(err: &std::io::Error, cgroup: Option<&ChildCgroup>) -> Option<String> {
    let why = asbx_jail::join_failure(err, &cgroup?.procs)?;
    Some(format!(
        "the tool could not join its cgroup ({why}); it did not run"
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use asbx_protocol::Protocol;

    use super::*;
    use crate::emit::Emitter;
    use crate::tools::context::{ToolContext, ToolOutput};
    use crate::tools::shell;

    fn ctx(workdir: &Path, cgroup_root: &Path, timeout_ms: u64) -> ToolContext {
        ToolContext {
            workdir: workdir.to_path_buf(),
            variables: BTreeMap::new(),
            tool_user: None,
            timeout: Duration::from_millis(timeout_ms),
            output_bytes: 64 * 1024,
            emitter: Emitter::new(tokio::io::sink(), Protocol::V1),
            cgroup_root: CgroupRoot(cgroup_root.to_path_buf()),
        }
    }

    /// A `sleep` argument no other process has: `1000.<random digits>`.
    fn marker() -> String {
        format!("1000.{}", rand::random::<u32>())
    }

    /// Pids whose command line contains `needle`.
    fn with_cmdline(needle: &str) -> Vec<i32> {
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
                continue;
            };
            let zombie =
                std::fs::read_to_string(e.path().join("stat")).is_ok_and(|s| s.contains(") Z "));
            if !zombie && String::from_utf8_lossy(&cmd).contains(needle) {
                out.push(pid);
            }
        }
        out
    }

    /// Polls until `f` holds or 5 s pass.
    async fn eventually(mut f: impl FnMut() -> bool) -> bool {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if f() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        f()
    }

    fn error_of(out: &ToolOutput) -> String {
        out.display
            .clone()
            .err()
            .map(|f| f.error)
            .unwrap_or_default()
    }

    #[tokio::test]
    async fn without_a_cgroup_a_timed_out_tool_and_all_it_started_are_killed() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (marker(), marker(), marker());
        // A background child, one that left the process group, the foreground.
        let cmd = format!("sleep {a} & setsid sleep {b} & sleep {c}");
        let ctx = ctx(dir.path(), &dir.path().join("no-cgroups"), 300);
        // Positive control: the processes do start (seen while the tool runs).
        let watch = {
            let (a, b, c) = (a.clone(), b.clone(), c.clone());
            tokio::spawn(async move {
                eventually(|| [&a, &b, &c].iter().all(|m| !with_cmdline(m).is_empty())).await
            })
        };
        let started = Instant::now();
        let out = shell::run(&ctx, "step_1", &cmd).await;
        assert!(
            watch.await.unwrap(),
            "the tool's processes were never seen running"
        );
        let err = error_of(&out);
        assert!(err.contains("timed out after 300 ms"), "{err}");
        assert!(err.contains("was killed"), "{err}");
        assert!(err.contains("process group and its descendants"), "{err}");
        assert!(
            !err.contains("survived") && !err.contains("can't see"),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        for m in [&a, &b, &c] {
            assert!(
                eventually(|| with_cmdline(m).is_empty()).await,
                "sleep {m} is still running: {:?}",
                with_cmdline(m)
            );
        }
    }

    #[tokio::test]
    async fn without_a_cgroup_every_process_of_the_tool_uid_is_killed() {
        if !nix::unistd::geteuid().is_root() {
            asbx_test_support::skip(
                "without_a_cgroup_every_process_of_the_tool_uid_is_killed",
                "it needs root to run a tool as another uid",
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let uid = 61000 + rand::random::<u32>() % 4000;
        let mut ctx = ctx(dir.path(), &dir.path().join("no-cgroups"), 300);
        ctx.tool_user = Some((uid, uid));
        let (a, b) = (marker(), marker());
        // `a` is orphaned at once (its parent subshell exits): only the uid
        // finds it.
        let cmd = format!("(setsid sleep {a} &) ; sleep {b}");
        let seen = {
            let a = a.clone();
            tokio::spawn(async move { eventually(|| !with_cmdline(&a).is_empty()).await })
        };
        let out = shell::run(&ctx, "step_1", &cmd).await;
        assert!(
            seen.await.unwrap(),
            "the orphan never ran (no positive control)"
        );
        let err = error_of(&out);
        assert!(err.contains("every process of the tool user"), "{err}");
        assert!(!err.contains("survived"), "{err}");
        for m in [&a, &b] {
            assert!(
                eventually(|| with_cmdline(m).is_empty()).await,
                "sleep {m} survived"
            );
        }
    }

    #[tokio::test]
    async fn a_tool_that_ends_leaves_its_background_processes_alone() {
        let dir = tempfile::tempdir().unwrap();
        let m = marker();
        let ctx = ctx(dir.path(), &dir.path().join("no-cgroups"), 5000);
        let out = shell::run(&ctx, "step_1", &format!("sleep {m} >/dev/null 2>&1 &")).await;
        assert!(!out.is_error(), "{out:?}");
        assert!(
            eventually(|| with_cmdline(&m).len() == 1).await,
            "the background sleep must still run"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pids = with_cmdline(&m);
        assert_eq!(pids.len(), 1, "the background sleep must still run");
        let _ = kill(Pid::from_raw(pids[0]), Signal::SIGKILL);
    }

    /// Real cgroup v1 children (memory, pids, freezer) for one test, linked
    /// under a temporary root in the sandbox's layout; removed on drop.
    struct TestCgroups {
        root: tempfile::TempDir,
        dirs: Vec<PathBuf>,
    }

    impl TestCgroups {
        /// The test's cgroups, or `None` (the check skipped out loud, as
        /// `test`) where they can't be made.
        fn new(test: &str) -> Option<TestCgroups> {
            let name = format!("asbx-agent-test-{:08x}", rand::random::<u32>());
            let root = tempfile::tempdir().unwrap();
            std::fs::create_dir(root.path().join("tools")).unwrap();
            let mut dirs = Vec::new();
            for ctl in ["memory", "pids", "freezer"] {
                let d = Path::new("/sys/fs/cgroup").join(ctl).join(&name);
                if let Err(e) = std::fs::create_dir(&d) {
                    asbx_test_support::skip(
                        test,
                        &format!("the cgroup check: cannot create {}: {e}", d.display()),
                    );
                    for d in &dirs {
                        let _ = std::fs::remove_dir(d);
                    }
                    return None;
                }
                std::os::unix::fs::symlink(&d, root.path().join("tools").join(ctl)).unwrap();
                dirs.push(d);
            }
            Some(TestCgroups { root, dirs })
        }

        fn procs(&self) -> String {
            std::fs::read_to_string(self.dirs[0].join("cgroup.procs")).unwrap()
        }
    }

    impl Drop for TestCgroups {
        fn drop(&mut self) {
            for d in &self.dirs {
                if let Ok(p) = std::fs::read_to_string(d.join("cgroup.procs")) {
                    for pid in p.lines().filter_map(|l| l.parse().ok()) {
                        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                    }
                }
                let _ = std::fs::write(d.join("freezer.state"), "THAWED");
            }
            for d in &self.dirs {
                for _ in 0..100 {
                    if std::fs::remove_dir(d).is_ok() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    #[tokio::test]
    async fn with_a_cgroup_the_tool_joins_it_and_a_timeout_empties_it() {
        let Some(cg) = TestCgroups::new("with_a_cgroup_the_tool_joins_it_and_a_timeout_empties_it")
        else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let ctx = ctx(dir.path(), cg.root.path(), 300);
        // Positive control: a quick tool runs inside the cgroup.
        let out = shell::run(&ctx, "step_1", "cat /proc/self/cgroup").await;
        let text = out.model_text.clone();
        for ctl in ["memory", "pids", "freezer"] {
            let want = format!(
                ":{ctl}:/{}",
                cg.dirs[0].file_name().unwrap().to_string_lossy()
            );
            assert!(text.contains(&want), "{ctl} not joined: {text}");
        }
        let (a, b) = (marker(), marker());
        let cmd = format!("setsid sleep {a} & (sleep {b} &) ; sleep 1000");
        let out = shell::run(&ctx, "step_2", &cmd).await;
        let err = error_of(&out);
        assert!(err.contains("timed out after 300 ms"), "{err}");
        assert!(err.contains("tools cgroup"), "{err}");
        assert!(!err.contains("survived"), "{err}");
        assert_eq!(cg.procs().trim(), "", "the tools cgroup must be empty");
        for m in [&a, &b] {
            assert!(
                eventually(|| with_cmdline(m).is_empty()).await,
                "sleep {m} survived"
            );
        }
        let state = std::fs::read_to_string(cg.dirs[2].join("freezer.state")).unwrap();
        assert_eq!(state.trim(), "THAWED", "the cgroup is left thawed");
    }

    /// Issue 26, item 4: a tool's process that moved itself out of the
    /// tools cgroup (here into cgroups it may write, as the `mcp` child's
    /// were) still dies at the timeout: the reaper sweeps the tool uid too.
    #[tokio::test]
    async fn a_tool_process_that_left_the_tools_cgroup_still_dies() {
        const TEST: &str = "a_tool_process_that_left_the_tools_cgroup_still_dies";
        if !nix::unistd::geteuid().is_root() {
            asbx_test_support::skip(TEST, "it needs root to run a tool as another uid");
            return;
        }
        let Some(cg) = TestCgroups::new(TEST) else {
            return;
        };
        let Some(elsewhere) = TestCgroups::new(TEST) else {
            return;
        };
        let uid = 61000 + rand::random::<u32>() % 4000;
        // As in a jail: the tools cgroup is the tool user's to join.
        for d in &cg.dirs {
            std::os::unix::fs::chown(d.join("cgroup.procs"), Some(uid), None).unwrap();
        }
        for d in &elsewhere.dirs {
            std::fs::set_permissions(
                d.join("cgroup.procs"),
                std::os::unix::fs::PermissionsExt::from_mode(0o666),
            )
            .unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let mut ctx = ctx(dir.path(), cg.root.path(), 500);
        ctx.tool_user = Some((uid, uid));
        let m = marker();
        let moves: Vec<String> = elsewhere
            .dirs
            .iter()
            .map(|d| format!("echo 0 > {}/cgroup.procs", d.display()))
            .collect();
        let cmd = format!(
            "(setsid bash -c '{}; exec sleep {m}' &) ; sleep 1000",
            moves.join("; ")
        );
        // Positive control, while the tool runs: the process did get out
        // of the tools cgroup.
        let moved = {
            let procs = elsewhere.dirs[0].join("cgroup.procs");
            tokio::spawn(async move {
                eventually(|| std::fs::read_to_string(&procs).is_ok_and(|p| !p.trim().is_empty()))
                    .await
            })
        };
        let out = shell::run(&ctx, "step_1", &cmd).await;
        assert!(moved.await.unwrap(), "the tool's process never moved");
        let err = error_of(&out);
        assert!(err.contains("timed out after 500 ms"), "{err}");
        assert!(err.contains("tools cgroup"), "{err}");
        assert!(err.contains("every process of the tool user"), "{err}");
        assert!(!err.contains("survived"), "{err}");
        assert!(
            eventually(|| with_cmdline(&m).is_empty()).await,
            "sleep {m} survived outside the tools cgroup"
        );
    }

    #[tokio::test]
    async fn a_tool_that_cannot_join_its_cgroup_does_not_run() {
        let dir = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        // A `cgroup.procs` no one can write: a folder.
        std::fs::create_dir_all(root.path().join("tools/memory/cgroup.procs")).unwrap();
        let ctx = ctx(dir.path(), root.path(), 5000);
        let out = shell::run(&ctx, "step_1", "touch ran").await;
        let err = error_of(&out);
        assert!(err.contains("could not join its cgroup"), "{err}");
        // Which file, and why.
        assert!(err.contains("tools/memory/cgroup.procs"), "{err}");
        assert!(err.contains("Is a directory"), "{err}");
        assert!(
            !dir.path().join("ran").exists(),
            "the command ran outside its cgroup"
        );
        // Positive control: without the tools folder it runs.
        let ctx2 = ToolContext {
            cgroup_root: CgroupRoot(root.path().join("none")),
            ..ctx
        };
        assert!(!shell::run(&ctx2, "step_2", "touch ran").await.is_error());
        assert!(dir.path().join("ran").exists());
        // An empty tools folder is a broken layout, not "no cgroups".
        let empty = tempfile::tempdir().unwrap();
        std::fs::create_dir(empty.path().join("tools")).unwrap();
        let ctx3 = ToolContext {
            cgroup_root: CgroupRoot(empty.path().to_path_buf()),
            ..ctx2
        };
        assert!(shell::run(&ctx3, "step_3", "true").await.is_error());
    }

    #[test]
    fn mcp_servers_run_as_their_own_uid() {
        assert_eq!(Slot::Mcp.user(Some((1001, 1000))), Some((MCP_UID, 1000)));
        assert_eq!(Slot::Tools.user(Some((1001, 1000))), Some((1001, 1000)));
        assert_eq!(Slot::Mcp.user(None), None);
    }
}
