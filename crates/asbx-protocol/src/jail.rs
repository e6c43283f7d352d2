//! The policy the runner hands `asbx jail`: everything one sandbox needs,
//! as a value. The jail reads it, sets the sandbox up in stages, then execs.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where the working directory appears inside every sandbox.
pub const WORKDIR_IN_JAIL: &str = "/work";
/// Where the runner's files (gateway socket) appear inside every sandbox.
pub const RUN_DIR_IN_JAIL: &str = "/run/asbx";

/// Uid the sandbox's main process (the agent) runs as inside the sandbox.
/// Maps to host uid `JailPolicy::host_uid`.
pub const AGENT_UID: u32 = 1000;
/// Gid of the agent and of its tools inside the sandbox (host gid `host_uid`).
pub const AGENT_GID: u32 = 1000;
/// Uid tools spawned by the agent run as (host uid `host_uid + 1`). The agent
/// keeps `CAP_SETUID`/`CAP_SETGID` to switch to it and `CAP_KILL` to end
/// every process of a timed-out tool (and nothing else).
pub const TOOL_UID: u32 = 1001;
/// Gid tools run as; shared with the agent so both can write the working directory.
pub const TOOL_GID: u32 = 1000;
/// Uid stdio MCP servers run as (host uid `host_uid + 2`): not the tools'
/// uid, so a tool can't read a server's environment (its tokens) from `/proc`.
pub const MCP_UID: u32 = 1002;
/// Host uids (and gids) one sandbox uses: `host_uid .. host_uid + HOST_IDS_PER_SANDBOX`
/// (agent, tools, MCP servers); the runner leases ranges of this size.
pub const HOST_IDS_PER_SANDBOX: u32 = 3;

/// Where the sandbox's child cgroups appear inside it. Tools and stdio MCP
/// servers run in child cgroups of the sandbox's cgroup, with their own
/// limits below the sandbox's, so a tool's memory or tmpfs use can't get the
/// agent OOM-killed, and the agent can kill every process of a timed-out tool.
///
/// Layout: `{TOOL_CGROUP_IN_JAIL}/{child}/{controller}/` on cgroup v1, with
/// `child` one of [`CGROUP_CHILDREN`] and `controller` one of `memory`,
/// `pids`, `freezer` (each the child cgroup of that hierarchy, holding its
/// `cgroup.procs`, and `freezer.state` under `freezer`);
/// `{TOOL_CGROUP_IN_JAIL}/{child}/unified/` on cgroup v2 (`cgroup.procs`,
/// `cgroup.kill`, `cgroup.freeze`). A process joins by writing `0` to each
/// `cgroup.procs` of its child before it execs, under its own uid (each
/// child's files are writable by the one user it is for: `tools` by
/// [`TOOL_UID`], `mcp` by [`MCP_UID`]); absent folders mean the profile has
/// no cgroups.
///
/// On cgroup v1 a child's `memory` folder is empty until the child's memory
/// cgroup is made, on request ([`CGROUP_REQUEST_FD_ENV`]): a memory cgroup
/// costs the host about 0.3 MiB of kernel memory, and an idle sandbox, which
/// runs no tool, needs none.
pub const TOOL_CGROUP_IN_JAIL: &str = "/run/asbx-cgroup";
/// Set in the main process's environment when its child cgroups' memory
/// cgroups are made on request (cgroup v1): the number of its descriptor of
/// a stream socket to its supervisor. Write one byte per request, `t` for
/// `tools` or `m` for `mcp`, and read one byte back: `+` once the child's
/// `memory` folder holds its cgroup (made now, or before), `-` if it could
/// not be made. Anything else written is answered `-`.
pub const CGROUP_REQUEST_FD_ENV: &str = "ASBX_CGROUP_REQUEST_FD";
/// The child cgroups: `tools` (shell and skill scripts) and `mcp` (stdio MCP servers).
pub const CGROUP_CHILDREN: [&str; 2] = ["tools", "mcp"];

/// One sandbox.
///
/// - `workdir`: host folder, fresh per dispatch, mounted read-write at [`WORKDIR_IN_JAIL`].
/// - `binds`: extra host paths made visible inside (the `asbx` binary, the gateway socket dir).
/// - `argv`, `env`: what to exec inside, with exactly this environment.
/// - `host_uid`: first host uid of this sandbox's range (unprivileged, one range per sandbox).
/// - `limits`: cgroup and rlimit bounds.
/// - `cgroup`: a unique name for this sandbox's cgroups.
/// - `profile`: how strict; `strict` unless the operator chose otherwise.
/// - `entry`: what the main process runs: `exec` (`argv`, the default) or
///   `agent` (the agent loop of the binary that runs the jail, started
///   without an `execve`; `argv` is then only its name).
/// - `guard`: start a cleanup guard process beside the supervisor, which
///   removes the cgroups should the supervisor be SIGKILLed (default
///   `true`). A caller that removes them itself once the supervisor ended
///   (the runner does, [`remove_cgroups`](https://docs.rs/asbx-jail)) sets
///   `false` and saves a process per sandbox.
/// - `background`: boot at the lowest CPU weight of the sandbox's cgroup
///   (`cpu.shares` 2 on cgroup v1, `cpu.weight` 1 on v2) until the caller
///   restores the default (`asbx_jail::foreground`): a sandbox booted ahead
///   of time yields the CPU to the ones serving a dispatch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JailPolicy {
    pub workdir: String,
    #[serde(default)]
    pub binds: Vec<BindMount>,
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: Vec<(String, String)>,
    pub host_uid: u32,
    pub limits: ResourceLimits,
    pub cgroup: String,
    #[serde(default)]
    pub profile: JailProfile,
    #[serde(default)]
    pub entry: JailEntry,
    #[serde(default = "yes")]
    pub guard: bool,
    #[serde(default)]
    pub background: bool,
}

fn yes() -> bool {
    true
}

/// What a sandbox's main process runs; see [`JailPolicy`].
///
/// `Agent` forks the agent from the sandbox's init once every layer is in
/// place, with no `execve`: it shares the pages the binary mapped and
/// relocated once (copy on write) instead of mapping and relocating its own
/// image, which saves both start-up time and memory per sandbox. The binary
/// that runs the jail must supply the agent (`asbx-sandbox` does); others
/// refuse such a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum JailEntry {
    #[default]
    Exec,
    Agent,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BindMount {
    pub source: String,
    pub target: String,
    #[serde(default)]
    pub writable: bool,
}

/// Per-sandbox resource bounds. `None` leaves a bound unset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ResourceLimits {
    /// Memory (and memory+swap) in bytes.
    pub memory_bytes: Option<u64>,
    /// Most processes and threads at once.
    pub pids: Option<u64>,
    /// CPU quota in percent of one core (100 = one full core).
    pub cpu_percent: Option<u32>,
    /// Size cap of the writable working directory, `/tmp` and `/dev/shm`
    /// together (one tmpfs), in bytes.
    pub disk_bytes: Option<u64>,
    /// Most open files per process.
    pub nofile: Option<u64>,
}

impl ResourceLimits {
    /// The default memory cap, in MiB (`ASBX_SANDBOX_MEMORY_MB`).
    pub const DEFAULT_MEMORY_MB: u64 = 512;
    /// The default most processes (`ASBX_SANDBOX_PIDS`).
    pub const DEFAULT_PIDS: u64 = 256;
    /// The default CPU quota, in percent of one core (`ASBX_SANDBOX_CPU_PERCENT`).
    pub const DEFAULT_CPU_PERCENT: u32 = 100;
    /// The default disk cap, in MiB (`ASBX_SANDBOX_DISK_MB`).
    pub const DEFAULT_DISK_MB: u64 = 256;
    /// The default most open files per process.
    pub const DEFAULT_NOFILE: u64 = 1024;
}

impl Default for ResourceLimits {
    fn default() -> Self {
        ResourceLimits {
            memory_bytes: Some(Self::DEFAULT_MEMORY_MB << 20),
            pids: Some(Self::DEFAULT_PIDS),
            cpu_percent: Some(Self::DEFAULT_CPU_PERCENT),
            disk_bytes: Some(Self::DEFAULT_DISK_MB << 20),
            nofile: Some(Self::DEFAULT_NOFILE),
        }
    }
}

/// How strict a sandbox is. The runner refuses to start if a layer of the
/// chosen profile is missing on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JailProfile {
    /// Every layer: namespaces, pivot_root, cgroups, seccomp, Landlock, separate tool uid.
    #[default]
    Strict,
    /// Strict without Landlock and cgroups, for hosts that lack them.
    Namespaces,
}

impl JailProfile {
    /// The operator's name for this profile.
    pub const fn as_str(self) -> &'static str {
        match self {
            JailProfile::Strict => "strict",
            JailProfile::Namespaces => "namespaces",
        }
    }

    pub fn parse(name: &str) -> Option<JailProfile> {
        match IsolationProfile::parse(name)? {
            IsolationProfile::Jail(p) => Some(p),
            IsolationProfile::Unconfined => None,
        }
    }
}

/// How the runner isolates dispatches (`ASBX_PROFILE`): a jail profile, or
/// none at all (`unconfined`, development only, reported on every start and
/// in `/healthz`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IsolationProfile {
    Jail(JailProfile),
    Unconfined,
}

impl IsolationProfile {
    /// Every profile, strictest first.
    pub const ALL: [IsolationProfile; 3] = [
        IsolationProfile::Jail(JailProfile::Strict),
        IsolationProfile::Jail(JailProfile::Namespaces),
        IsolationProfile::Unconfined,
    ];

    /// The operator's name: `strict`, `namespaces` or `unconfined`.
    pub const fn as_str(self) -> &'static str {
        match self {
            IsolationProfile::Jail(p) => p.as_str(),
            IsolationProfile::Unconfined => "unconfined",
        }
    }

    pub fn parse(name: &str) -> Option<IsolationProfile> {
        IsolationProfile::ALL
            .into_iter()
            .find(|p| p.as_str() == name)
    }
}

impl std::fmt::Display for IsolationProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for IsolationProfile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        IsolationProfile::parse(s)
            .ok_or_else(|| format!("unknown profile {s:?}: strict, namespaces or unconfined"))
    }
}

/// What `asbx jail --check` reports: each layer and whether this host has it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LayerReport {
    pub layers: Vec<Layer>,
}

impl LayerReport {
    /// The required layers this host lacks; empty means the profile can run.
    pub fn missing(&self) -> Vec<&Layer> {
        self.layers
            .iter()
            .filter(|l| l.required && !l.available)
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Layer {
    pub name: String,
    pub available: bool,
    /// Whether the profile that was checked needs this layer.
    #[serde(default)]
    pub required: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}
