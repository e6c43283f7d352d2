//! How tool processes start and how they end.
//!
//! **Start.** Every process the agent starts for a tool (`shell`, skill
//! scripts, the setup script) or a stdio MCP server gets a clean
//! environment ([`base_env`]), its own process group, the tool user (MCP
//! servers: [`MCP_UID`], so a tool can't read a server's environment from
//! `/proc`), and joins the sandbox's child cgroup for its kind ([`Slot`]):
//! `{TOOL_CGROUP_IN_JAIL}/{tools|mcp}/*/cgroup.procs`. The agent crate has no
//! `unsafe`, so instead of a `pre_exec` hook the process joins itself: it
//! starts as `bash -c JOIN_SCRIPT`, already under the tool's uid, writes `0`
//! to each `cgroup.procs` and only then `exec`s the real command (same pid,
//! nothing started yet). When the folder exists but a write fails, the
//! wrapper exits [`JOIN_FAILED_EXIT`] with [`JOIN_FAILED_MARKER`] on stderr
//! and the tool fails: it never runs outside its cgroup. No folder (the
//! `namespaces` or `unconfined` profile, tests outside a jail) means no
//! wrapper.
//!
//! **End.** [`Reaper::kill`] kills the tool and everything it started. With
//! a cgroup: v2 writes `cgroup.kill`; v1 freezes (`freezer.state` =
//! `FROZEN`), sends SIGKILL to every pid in `cgroup.procs`, thaws, and
//! repeats until the cgroup is empty (a frozen process can't fork away).
//! Without one: SIGKILL to the process group, to every descendant of the
//! tool's process, and, when tools run as their own uid, to every process of
//! that uid the agent can see; repeated until none is left. The result
//! ([`Killed`]) says which way it went, for the step's error.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use asbx_protocol::jail::{CGROUP_CHILDREN, MCP_UID, TOOL_CGROUP_IN_JAIL};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// The `PATH` tools get.
pub(crate) const TOOL_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Exit status of the join wrapper when a `cgroup.procs` write fails.
pub(crate) const JOIN_FAILED_EXIT: i32 = 125;
/// What the join wrapper prints on stderr before exiting [`JOIN_FAILED_EXIT`].
pub(crate) const JOIN_FAILED_MARKER: &str = "asbx: cannot join the tool cgroup: ";

/// `bash -c JOIN_SCRIPT asbx-join N procs_1 .. procs_N program args..`.
const JOIN_SCRIPT: &str = r#"n=$1; shift
while [ "$n" -gt 0 ]; do
  { printf 0 > "$1"; } 2>/dev/null || { printf '%s%s\n' "$ASBX_JOIN_MARKER" "$1" >&2; exit 125; }
  shift; n=$((n-1))
done
unset ASBX_JOIN_MARKER
exec "$@""#;

/// How long [`Reaper::kill`] keeps trying.
const KILL_PATIENCE: Duration = Duration::from_secs(3);

/// Builds the minimal environment for tool processes (also the setup script).
pub(crate) fn base_env(workdir: &Path) -> Vec<(String, String)> {
    vec![
        ("PATH".into(), TOOL_PATH.into()),
        ("HOME".into(), workdir.display().to_string()),
        ("LANG".into(), "C.UTF-8".into()),
        ("TMPDIR".into(), "/tmp".into()),
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
            if p.exists() {
                procs.push(p);
            }
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
    armed: bool,
}

impl Reaper {
    pub(crate) fn new(pid: Option<u32>, cgroup: Option<ChildCgroup>, uid: Option<u32>) -> Self {
        let own = nix::unistd::getuid().as_raw();
        Reaper {
            pid: pid.and_then(|p| i32::try_from(p).ok()),
            cgroup,
            uid: uid.filter(|u| *u != own),
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
        let mut known: HashSet<i32> = HashSet::new();
        loop {
            let (left, error) = self.pass(&mut known);
            if left == 0 || started.elapsed() > KILL_PATIENCE {
                return Killed {
                    how: self.how(),
                    left,
                    error,
                };
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn how(&self) -> &'static str {
        match (&self.cgroup, self.uid) {
            (Some(c), _) => c.how(),
            (None, Some(_)) => "its process group and every process of the tool user",
            (None, None) => "its process group and its descendants",
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
        }
    }
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
/// user, joining the slot's cgroup under `root` first when there is one.
/// Returns the cgroup it joins, for [`Reaper`].
pub(crate) fn command(
    program: &str,
    args: &[String],
    slot: Slot,
    tool_user: Option<(u32, u32)>,
    root: &CgroupRoot,
) -> Result<(tokio::process::Command, Option<ChildCgroup>), String> {
    let cgroup = ChildCgroup::find(root, slot)?;
    let mut cmd = match &cgroup {
        Some(cg) => {
            let mut c = tokio::process::Command::new("bash");
            c.arg("-c")
                .arg(JOIN_SCRIPT)
                .arg("asbx-join")
                .arg(cg.procs.len().to_string())
                .args(&cg.procs)
                .arg(program)
                .args(args);
            c
        }
        None => {
            let mut c = tokio::process::Command::new(program);
            c.args(args);
            c
        }
    };
    cmd.process_group(0).kill_on_drop(true);
    if let Some((uid, gid)) = slot.user(tool_user) {
        cmd.uid(uid).gid(gid);
    }
    Ok((cmd, cgroup))
}

/// Sets the variables a command built by [`command`] needs, after the
/// caller's `env_clear`.
pub(crate) fn join_env(cmd: &mut tokio::process::Command, cgroup: Option<&ChildCgroup>) {
    if cgroup.is_some() {
        cmd.env("ASBX_JOIN_MARKER", JOIN_FAILED_MARKER);
    }
}

/// The join failure a wrapper reported, if `exit_code` and `stderr` say so.
pub(crate) fn join_failure(exit_code: Option<i32>, stderr: &[u8]) -> Option<String> {
    if exit_code != Some(JOIN_FAILED_EXIT) {
        return None;
    }
    let text = String::from_utf8_lossy(stderr);
    text.lines()
        .find_map(|l| l.strip_prefix(JOIN_FAILED_MARKER))
        .map(|path| format!("the tool could not join its cgroup ({path}); it did not run"))
}
