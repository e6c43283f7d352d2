//! Runner configuration: a value built once by the binary and passed in.

use std::path::PathBuf;
use std::time::Duration;

use asbx_protocol::FieldError;
use asbx_protocol::gateway::{MaxLimits, ProviderKind};

use crate::RunnerError;
use asbx_protocol::jail::{IsolationProfile, JailProfile, ResourceLimits};

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
    pub isolation: IsolationProfile,
    /// Bearer token required on every route, when set.
    pub token: Option<String>,
    pub providers: Vec<ProviderConfig>,
    /// Most sandboxes alive at once; more get 503.
    pub max_sandboxes: usize,
    /// Sandboxes kept booted ahead of dispatches (see the `pool` module).
    pub warm_pool: usize,
    /// The most the warm pool grows to under load (its memory budget: about
    /// a MiB of host memory per warm sandbox).
    pub warm_pool_max: usize,
    /// Hard runtime cap of one sandbox (`ASBX_MAX_RUNTIME_SEC`).
    pub max_runtime: Duration,
    /// Grace past the cap before the sandbox is killed (60 s by contract).
    pub runtime_grace: Duration,
    pub limits: MaxLimits,
    pub resources: ResourceLimits,
    /// Lowest host uid handed to sandboxes: a jailed runner's uids start
    /// at the first free block of 65,536 at or above it (`uid_locks`).
    pub uid_base: u32,
    /// Where the runners of one host claim their blocks of host uids
    /// (`/run/asbx-uids`; every runner on the host must see the same
    /// folder). `None`: no claim, uids from `uid_base` (one runner per host).
    pub uid_locks: Option<PathBuf>,
    /// Longest line accepted from a sandbox.
    pub max_line_bytes: usize,
    /// Extra environment passed to every agent (never provider keys).
    pub agent_env: Vec<(String, String)>,
    /// Internal address ranges sandboxes may reach anyway, through the
    /// egress proxy and as MCP servers (`ASBX_ALLOW_INTERNAL`); empty by
    /// default.
    pub allow_internal: Vec<crate::Cidr>,
    /// A PEM file of CAs the egress proxy also trusts when it opens TLS to
    /// a host a secret is bound to (`ASBX_EGRESS_EXTRA_CA`), beside the
    /// host's trust store: private registries, tests.
    pub egress_extra_ca: Option<PathBuf>,
    /// Origins (`scheme://host[:port]`) a dispatch's `agent_url` may point
    /// at (`ASBX_WORKSPACE_ORIGINS`); empty means loopback origins only.
    pub workspace_origins: Vec<String>,
}

impl RunnerConfig {
    /// The default isolation profile (`ASBX_PROFILE`).
    pub const DEFAULT_ISOLATION: IsolationProfile = IsolationProfile::Jail(JailProfile::Strict);
    /// The default most sandboxes alive at once (`ASBX_MAX_SANDBOXES`).
    pub const DEFAULT_MAX_SANDBOXES: usize = 1024;
    /// The default warm pool (`ASBX_WARM_POOL`).
    pub const DEFAULT_WARM_POOL: usize = 2;
    /// The default most the warm pool grows to (`ASBX_WARM_POOL_MAX`).
    pub const DEFAULT_WARM_POOL_MAX: usize = 64;
    /// The default runtime cap, in seconds: 8 hours (`ASBX_MAX_RUNTIME_SEC`).
    pub const DEFAULT_MAX_RUNTIME_SEC: u64 = 28_800;
    /// The default grace past the cap, in seconds (`ASBX_RUNTIME_GRACE_SEC`).
    pub const DEFAULT_RUNTIME_GRACE_SEC: u64 = 60;

    /// The defaults, for sandboxes run by `asbx_exe` with their state under
    /// `state_dir`.
    pub fn new(asbx_exe: PathBuf, state_dir: PathBuf) -> Self {
        RunnerConfig {
            asbx_exe,
            state_dir,
            isolation: Self::DEFAULT_ISOLATION,
            token: None,
            providers: Vec::new(),
            max_sandboxes: Self::DEFAULT_MAX_SANDBOXES,
            warm_pool: Self::DEFAULT_WARM_POOL,
            warm_pool_max: Self::DEFAULT_WARM_POOL_MAX,
            max_runtime: Duration::from_secs(Self::DEFAULT_MAX_RUNTIME_SEC),
            runtime_grace: Duration::from_secs(Self::DEFAULT_RUNTIME_GRACE_SEC),
            limits: MaxLimits::default(),
            resources: ResourceLimits::default(),
            uid_base: 1_000_000,
            uid_locks: Some(PathBuf::from("/run/asbx-uids")),
            max_line_bytes: 1 << 20,
            agent_env: Vec::new(),
            allow_internal: Vec::new(),
            egress_extra_ca: None,
            workspace_origins: Vec::new(),
        }
    }

    /// Lowers the ceiling of a run's duration (`limits.max_duration_ms`) to
    /// the runtime cap (`max_runtime`, `ASBX_MAX_RUNTIME_SEC`), so that the
    /// one setting bounds all three: `session_init`'s `maxDurationMs`, the
    /// agent's own limit (its bootstrap's `max_limits`) and the kill at the
    /// cap. [`crate::Runner::new`] calls it.
    pub(crate) fn bound_duration_by_runtime(&mut self) {
        let cap = u64::try_from(self.max_runtime.as_millis()).unwrap_or(u64::MAX);
        self.limits.max_duration_ms = self.limits.max_duration_ms.min(cap);
    }

    /// Refuses to serve on a non-loopback address without a token: anyone
    /// who reaches the runner could start sandboxes on the operator's keys.
    pub fn check_listen(&self, addr: std::net::SocketAddr) -> Result<(), RunnerError> {
        if addr.ip().is_loopback() || self.token.as_deref().is_some_and(|t| !t.is_empty()) {
            Ok(())
        } else {
            Err(RunnerError::TokenRequired(addr))
        }
    }

    /// Whether `agent_url` points at a configured workspace origin (by
    /// default: a loopback one).
    pub(crate) fn check_agent_url(&self, agent_url: &str) -> Result<(), FieldError> {
        let bad = |why: &str| FieldError::new("agent_url", why.to_owned());
        let url = url::Url::parse(agent_url).map_err(|_| bad("must be an http(s) URL"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(bad("must be an http(s) URL"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(bad("must not carry credentials"));
        }
        let origin = url.origin().ascii_serialization();
        let allowed = if self.workspace_origins.is_empty() {
            match url.host() {
                Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
                None => false,
            }
        } else {
            self.workspace_origins.iter().any(|o| {
                url::Url::parse(o)
                    .map(|u| u.origin().ascii_serialization() == origin)
                    .unwrap_or(false)
            })
        };
        if allowed {
            Ok(())
        } else {
            Err(bad(
                "must point at a configured workspace origin (ASBX_WORKSPACE_ORIGINS; loopback by default)",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_required_off_loopback() {
        let mut c = RunnerConfig::new("asbx".into(), "/tmp".into());
        assert!(c.check_listen("127.0.0.1:80".parse().unwrap()).is_ok());
        assert!(c.check_listen("[::1]:80".parse().unwrap()).is_ok());
        for addr in ["0.0.0.0:80", "10.0.0.1:80", "[::]:80"] {
            assert!(
                matches!(
                    c.check_listen(addr.parse().unwrap()),
                    Err(RunnerError::TokenRequired(_))
                ),
                "{addr}"
            );
        }
        c.token = Some(String::new());
        assert!(
            c.check_listen("0.0.0.0:80".parse().unwrap()).is_err(),
            "empty token"
        );
        c.token = Some("t".into());
        assert!(c.check_listen("0.0.0.0:80".parse().unwrap()).is_ok());
    }

    /// Issue 28, defect 2: `ASBX_MAX_RUNTIME_SEC` (here 2 s) bounds the
    /// duration the runner announces and hands the agent; a longer cap
    /// leaves a lower ceiling alone.
    #[test]
    fn the_runtime_cap_bounds_the_duration_ceiling() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = RunnerConfig::new("/nonexistent/asbx".into(), dir.path().to_owned());
        c.warm_pool = 0;
        c.uid_locks = None;
        c.max_runtime = Duration::from_secs(2);
        let r = crate::Runner::new(c.clone()).unwrap();
        assert_eq!(r.inner.config.limits.max_duration_ms, 2000);
        assert_eq!(r.inner.config.max_runtime, Duration::from_secs(2));
        drop(r);
        c.max_runtime = Duration::from_secs(100_000);
        c.limits.max_duration_ms = 5000;
        c.bound_duration_by_runtime();
        assert_eq!(c.limits.max_duration_ms, 5000);
    }

    #[test]
    fn agent_url_must_be_a_workspace_origin() {
        let mut c = RunnerConfig::new("asbx".into(), "/tmp".into());
        for ok in [
            "http://127.0.0.1:8080/api/x",
            "http://localhost/x",
            "http://[::1]:1/x",
            "http://127.9.9.9/",
        ] {
            assert!(c.check_agent_url(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://169.254.169.254/latest",
            "http://10.0.0.1/x",
            "http://evil.test/x",
            "http://u:p@127.0.0.1/x",
            "file:///etc/passwd",
        ] {
            assert_eq!(
                c.check_agent_url(bad).unwrap_err().field,
                "agent_url",
                "{bad}"
            );
        }
        c.workspace_origins = vec![
            "https://ws.example.com".into(),
            "http://10.0.0.5:8080".into(),
        ];
        assert!(c.check_agent_url("https://ws.example.com/api/s/1").is_ok());
        assert!(c.check_agent_url("http://10.0.0.5:8080/api").is_ok());
        assert!(
            c.check_agent_url("http://10.0.0.5:8081/api").is_err(),
            "other port"
        );
        assert!(
            c.check_agent_url("http://ws.example.com/api").is_err(),
            "other scheme"
        );
        assert!(
            c.check_agent_url("http://127.0.0.1/api").is_err(),
            "loopback no longer implied"
        );
    }
}
