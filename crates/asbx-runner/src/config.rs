//! Runner configuration: a value built once by the binary and passed in.

use std::path::PathBuf;
use std::time::Duration;

use asbx_protocol::gateway::{MaxLimits, ProviderKind};
use asbx_protocol::jail::{JailProfile, ResourceLimits};

/// How dispatches are isolated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// A full jail through `asbx jail`, with the given profile.
    Jail(JailProfile),
    /// No isolation at all: the agent runs as a plain child process. For
    /// development on hosts without namespaces; reported on every start and
    /// in `/healthz`.
    Unconfined,
}

impl Isolation {
    pub fn name(self) -> &'static str {
        match self {
            Isolation::Jail(JailProfile::Strict) => "strict",
            Isolation::Jail(JailProfile::Namespaces) => "namespaces",
            Isolation::Unconfined => "unconfined",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "strict" => Some(Isolation::Jail(JailProfile::Strict)),
            "namespaces" => Some(Isolation::Jail(JailProfile::Namespaces)),
            "unconfined" => Some(Isolation::Unconfined),
            _ => None,
        }
    }
}

/// A model provider the gateway forwards to. The key stays in the runner.
#[derive(Clone)]
pub struct ProviderConfig {
    pub name: String,
    pub kind: ProviderKind,
    pub base_url: String,
    pub api_key: Option<String>,
}

impl std::fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// The `asbx` binary, run as `asbx jail` and `asbx agent`.
    pub asbx_exe: PathBuf,
    /// Where per-session folders (working directory, gateway socket) live.
    pub state_dir: PathBuf,
    pub isolation: Isolation,
    /// Bearer token required on every route, when set.
    pub token: Option<String>,
    pub providers: Vec<ProviderConfig>,
    /// Most sandboxes alive at once; more get 503.
    pub max_sandboxes: usize,
    /// Sandboxes kept booted ahead of dispatches (see the `pool` module).
    pub warm_pool: usize,
    /// Hard runtime cap of one sandbox (`ASBX_MAX_RUNTIME_SEC`).
    pub max_runtime: Duration,
    /// Grace past the cap before the sandbox is killed (60 s by contract).
    pub runtime_grace: Duration,
    pub limits: MaxLimits,
    pub resources: ResourceLimits,
    /// First host uid handed to sandboxes.
    pub uid_base: u32,
    /// Longest line accepted from a sandbox.
    pub max_line_bytes: usize,
    /// Extra environment passed to every agent (never provider keys).
    pub agent_env: Vec<(String, String)>,
    /// Internal address ranges sandboxes may reach anyway, through the
    /// egress proxy and as MCP servers (`ASBX_ALLOW_INTERNAL`); empty by
    /// default.
    pub allow_internal: Vec<crate::Cidr>,
}

impl RunnerConfig {
    pub fn new(asbx_exe: PathBuf, state_dir: PathBuf) -> Self {
        RunnerConfig {
            asbx_exe,
            state_dir,
            isolation: Isolation::Jail(JailProfile::Strict),
            token: None,
            providers: Vec::new(),
            max_sandboxes: 1024,
            warm_pool: 2,
            max_runtime: Duration::from_secs(28_800),
            runtime_grace: Duration::from_secs(60),
            limits: MaxLimits::default(),
            resources: ResourceLimits::default(),
            uid_base: 1_000_000,
            max_line_bytes: 1 << 20,
            agent_env: Vec::new(),
            allow_internal: Vec::new(),
        }
    }
}
