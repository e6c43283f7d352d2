//! One sandbox: namespaces, a pivoted minimal root, cgroups, rlimits,
//! capabilities, Landlock and seccomp, then `exec`. Synchronous; no tokio,
//! no HTTP (architecture invariant).
//!
//! [`run_jail`] is called in a fresh single-threaded process (`asbx jail
//! --policy <json>`), or in a fork of the runner's [`Zygote`] (`asbx jail
//! --zygote`, which forks one supervisor per request as the runner's child;
//! see `zygote`). The process layout of a running sandbox:
//!
//! ```text
//! asbx jail (supervisor, host root)          ── cleanup guard (host, see supervisor;
//!   │                                             not with `guard: false`)
//!   └─ init (pid 1 of the sandbox, uid 1000, no exec)
//!        └─ main process: policy.argv (uid 1000)
//!
//! asbx jail (supervisor) with `entry: agent`:
//!   └─ the agent: init itself, in process (pid 1, uid 1000,
//!      CAP_SETUID+CAP_SETGID+CAP_KILL only; reaps its tools' orphans)
//!        ├─ tools (uid 1001, no capabilities, cgroup `tools`)
//!        └─ stdio MCP servers (uid 1002, no capabilities, cgroup `mcp`)
//! ```
//!
//! Modules, in the order a run uses them: `supervisor` (host side),
//! `cgroup`, `init` (sandbox side), `rootfs`, `ids`, `fsrules`
//! (Landlock), `seccomp`, `sys` (raw system calls), [`check`]; and
//! `spawn`, for the agent: a tool process that joins its child cgroup
//! between `fork` and `exec`; `zygote`, for the runner: supervisors
//! forked, not `exec`ed.
//!
//! What the runner must do: see the README section of [`run_jail`].

// The jail is the one crate that must talk to the kernel directly: clone with
// namespace flags, capability sets, ioctls. Each unsafe block is in `sys`
// (the only module that allows `unsafe_code`) with a SAFETY note.

mod cgroup;
mod check;
mod detached;
mod fsrules;
mod ids;
mod init;
mod rootfs;
mod seccomp;
mod spawn;
mod supervisor;
mod sys;
mod zygote;

use std::ffi::CString;
use std::path::PathBuf;

pub use detached::DetachedDir;
pub use spawn::{join_cgroups_on_spawn, join_failure, request_memory_cgroup, take_cgroup_requests};
pub use zygote::{Zygote, serve as serve_zygote};

use asbx_protocol::jail::{
    HOST_IDS_PER_SANDBOX, JailEntry, JailPolicy, JailProfile, LayerReport, TOOL_CGROUP_IN_JAIL,
};

/// Everything that can go wrong building or running a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error("invalid policy: {0}")]
    Policy(String),
    #[error("the jail must run as root")]
    NotRoot,
    #[error("host: {0}")]
    Host(String),
    #[error("cgroup: {0}")]
    Cgroup(String),
    #[error("seccomp: {0}")]
    Seccomp(String),
    #[error("landlock: {0}")]
    Landlock(String),
    #[error("sandbox set-up: {0}")]
    Setup(String),
}

/// Build the sandbox `policy` describes, run `policy.argv` in it with exactly
/// `policy.env` and the inherited stdin/stdout/stderr, wait, tear down.
///
/// Returns the code the supervisor should exit with: the main process's exit
/// code, or 128 + signal if it was killed (also when the supervisor killed
/// the sandbox because it got `SIGTERM`/`SIGINT`/`SIGHUP`: 128 + that
/// signal). Set-up failures are `Err`, and nothing was `exec`ed.
///
/// The runner must:
/// - run this as root, in a fresh single-threaded process;
/// - give each live sandbox its own `host_uid` range of
///   [`HOST_IDS_PER_SANDBOX`] ids (agent, tools, MCP servers, all ≥ 10000
///   and used by nothing else),
///   and a unique `cgroup` name (`[A-Za-z0-9_.-]`);
/// - put input files in `policy.workdir` before starting: they are copied
///   into the sandbox's `/work` (a tmpfs of `limits.disk_bytes`); nothing is
///   copied back;
/// - make the gateway socket connectable by host uid `host_uid` (or mode 0666);
/// - bind targets that do not exist must be outside the read-only system
///   folders (`/run/...`, `/opt/...`), e.g. the `asbx` binary at
///   `/run/asbx/bin/asbx` inside the bound run folder, or on its own path;
/// - bind sources show in the sandbox's `/proc/self/mountinfo` as their path
///   inside their file system: share folders and the binary through a
///   [`DetachedDir`] (root `/`, no host path) where the kernel allows;
/// - call [`seal_agent`] first thing in `asbx agent`;
/// - after a supervisor was SIGKILLed, its cleanup guard removes the
///   cgroups; if the guard was killed too, the runner removes what is left
///   under `/sys/fs/cgroup/*/asbx/<cgroup>`, child cgroups (`tools`, `mcp`)
///   first;
/// - with `guard: false`, remove the cgroups ([`remove_cgroups`]) after
///   every run: after a clean end (exit code 0) the supervisor leaves them
///   (empty) and exits as soon as the sandbox's init is reaped, unless its
///   parent died.
pub fn run_jail(policy: &JailPolicy) -> Result<i32, JailError> {
    supervisor::run(policy, None)
}

/// The agent a binary runs in place of `exec` when a policy says
/// `entry: agent`: called in the sandbox's main process once every layer is
/// in place; its return value is the process's exit code.
pub type AgentEntry = fn() -> u8;

/// [`run_jail`] for a binary that can run the agent in process: with a
/// policy of `entry: agent`, init runs `agent` itself instead of forking a
/// main process that `exec`s `argv`
/// (see [`asbx_protocol::jail::JailEntry`]). With `agent` `None`, such a
/// policy is refused.
pub fn run_jail_with(policy: &JailPolicy, agent: Option<AgentEntry>) -> Result<i32, JailError> {
    supervisor::run(policy, agent)
}

/// Remove the cgroups of the sandbox named `cgroup` (a policy's `cgroup`),
/// the `tools` and `mcp` children first, killing what is still in them:
/// what the cleanup guard does. For a caller that runs its jails with
/// `guard: false`, once a supervisor ended (it leaves them to its caller,
/// or was SIGKILLed). Nothing to remove is not an error.
pub fn remove_cgroups(cgroup: &str) -> Result<(), JailError> {
    if !cgroup::valid_name(cgroup) {
        return Err(JailError::Policy(format!("invalid cgroup name {cgroup:?}")));
    }
    let root = std::path::Path::new(cgroup::CGROUP_ROOT);
    let Ok(layout) = cgroup::Layout::detect(root) else {
        return Ok(()); // no cgroups on this host: nothing was made
    };
    let dirs = cgroup::Cgroups::dirs_named(&layout, cgroup)?;
    cgroup::destroy_dirs(&layout, &dirs)
}

/// Removes the sandbox cgroups no process is in that were made at least
/// `min_age` ago (a runner killed together with its supervisors leaves
/// them; nothing else would remove them). Kills nothing. Returns how many
/// sandboxes' cgroups went; 0 on a host without cgroups.
pub fn sweep_stale_cgroups(min_age: std::time::Duration) -> usize {
    let root = std::path::Path::new(cgroup::CGROUP_ROOT);
    match cgroup::Layout::detect(root) {
        Ok(layout) => cgroup::sweep_stale(&layout, min_age),
        Err(_) => 0,
    }
}

/// Give the sandbox whose policy named `cgroup` the default CPU weight,
/// after a boot with `background: true`. A host without cgroups has
/// nothing to change.
pub fn foreground(cgroup: &str) -> Result<(), JailError> {
    let root = std::path::Path::new(cgroup::CGROUP_ROOT);
    let Ok(layout) = cgroup::Layout::detect(root) else {
        return Ok(());
    };
    cgroup::Cgroups::foreground(&layout, cgroup)
}

/// Probe each layer `profile` needs on this host. The runner refuses to
/// start when [`LayerReport::missing`] is not empty.
pub fn check(profile: JailProfile) -> LayerReport {
    check::check(profile)
}

/// For the agent, first thing after start: drop the ambient and inheritable
/// capability sets, so `CAP_SETUID`/`CAP_SETGID`/`CAP_KILL` stay with the
/// agent process but nothing it `exec`s (its tools) inherits them. Harmless outside a jail.
pub fn seal_agent() -> Result<(), JailError> {
    let err = |e: std::io::Error| JailError::Host(format!("capabilities: {e}"));
    sys::ambient_clear().map_err(err)?;
    let (effective, permitted, _) = sys::capget().map_err(err)?;
    sys::capset(effective, permitted, 0).map_err(err)
}

/// What the sandbox side needs, computed by the supervisor before `clone`.
pub(crate) struct Plan {
    root: rootfs::RootPlan,
    argv: Vec<CString>,
    env: Vec<CString>,
    filters: seccomp::Filters,
    landlock: bool,
    writable: Vec<PathBuf>,
    /// The sandbox cgroups' `cgroup.procs`: the supervisor writes init's pid
    /// into each while init builds the first half of its root.
    cgroup_procs: Vec<PathBuf>,
    /// [`TOOL_CGROUP_IN_JAIL`] when the sandbox has child cgroups.
    cgroup_dir: Option<PathBuf>,
    nofile: Option<u64>,
    /// Per-process bounds for a profile without cgroups; see [`init::RlimitBounds`].
    rlimits: Option<init::RlimitBounds>,
    /// Run in the main process instead of `exec`ing `argv` (`entry: agent`).
    entry: Option<AgentEntry>,
    /// A fresh network namespace made ahead of time, its `lo` up (the
    /// zygote's, see `zygote`): init joins it instead of `clone` making one.
    netns: Option<std::os::fd::OwnedFd>,
    /// The sandbox's end of the socket on which its main process asks the
    /// supervisor for its child memory cgroups
    /// ([`asbx_protocol::jail::CGROUP_REQUEST_FD_ENV`]): kept open, and
    /// inherited, by the main process alone.
    cgroup_request: Option<std::os::fd::OwnedFd>,
    /// Init writes the main process's end (its exit code, or 128 + the
    /// signal, as 4 bytes little-endian) here before it exits itself, when
    /// the supervisor reports ends early (`supervisor::MadeAhead::report`).
    status: Option<std::os::fd::OwnedFd>,
}

/// The lowest host uid a sandbox may be mapped to.
const MIN_HOST_UID: u32 = 10_000;

fn cstring(s: &str, what: &str) -> Result<CString, JailError> {
    CString::new(s).map_err(|_| JailError::Policy(format!("{what} contains a NUL byte")))
}

impl Plan {
    /// The child cgroups to show in the sandbox, and let it write.
    fn set_child_cgroups(&mut self, mounts: Vec<cgroup::ChildMount>) {
        self.cgroup_dir = (!mounts.is_empty()).then(|| PathBuf::from(TOOL_CGROUP_IN_JAIL));
        self.root.cgroup_mounts = mounts;
    }

    fn new(policy: &JailPolicy, agent: Option<AgentEntry>) -> Result<Plan, JailError> {
        if policy.argv.is_empty() {
            return Err(JailError::Policy("argv is empty".into()));
        }
        let entry = match policy.entry {
            JailEntry::Exec => None,
            JailEntry::Agent => Some(agent.ok_or_else(|| {
                JailError::Policy("entry \"agent\": this binary has no in-process agent".into())
            })?),
        };
        if policy.host_uid < MIN_HOST_UID
            || policy.host_uid >= u32::MAX - HOST_IDS_PER_SANDBOX
            || (policy.host_uid..policy.host_uid + HOST_IDS_PER_SANDBOX).contains(&65534)
        {
            return Err(JailError::Policy(format!(
                "host_uid {} must be at least {MIN_HOST_UID}",
                policy.host_uid
            )));
        }
        if !cgroup::valid_name(&policy.cgroup) {
            return Err(JailError::Policy(format!(
                "invalid cgroup name {:?}",
                policy.cgroup
            )));
        }
        let argv = policy
            .argv
            .iter()
            .map(|a| cstring(a, "argv"))
            .collect::<Result<Vec<_>, _>>()?;
        let env = policy
            .env
            .iter()
            .map(|(k, v)| {
                if k.is_empty() || k.contains('=') {
                    return Err(JailError::Policy(format!("invalid environment name {k:?}")));
                }
                cstring(&format!("{k}={v}"), "env")
            })
            .collect::<Result<Vec<_>, _>>()?;
        let root = rootfs::RootPlan::new(policy)?;
        let writable = rootfs::writable_roots(&root);
        Ok(Plan {
            root,
            argv,
            env,
            filters: seccomp::build()?,
            landlock: matches!(policy.profile, JailProfile::Strict),
            writable,
            cgroup_procs: Vec::new(),
            cgroup_dir: None,
            nofile: policy.limits.nofile,
            rlimits: match policy.profile {
                JailProfile::Strict => None,
                JailProfile::Namespaces => Some(init::RlimitBounds::from(&policy.limits)),
            },
            entry,
            netns: None,
            cgroup_request: None,
            status: None,
        })
    }
}
