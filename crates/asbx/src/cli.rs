//! Command-line arguments.

use std::net::SocketAddr;
use std::path::PathBuf;

use asbx_protocol::jail::ResourceLimits;
use asbx_runner::RunnerConfig;
use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "asbx",
    version,
    about = "Run AI agent turns in ephemeral, isolated sandboxes"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Start the workspace and the runner together, on loopback.
    Up(UpArgs),
    /// Start the sandbox runner alone.
    Runner(RunnerArgs),
    /// Start the workspace (control plane) alone.
    Workspace(WorkspaceArgs),
    /// Dispatch one turn through a running `asbx up` and show it live.
    Run(RunArgs),
    /// Mint a workspace API key (shown once; only its hash is stored).
    Key(KeyArgs),
    /// Free the file bytes no file refers to any more (a running workspace
    /// also does it hourly).
    Gc(GcArgs),
    /// Set or show a workspace's quotas (CONTRACT.md §10).
    Quota(QuotaArgs),
    /// The audit log: check each workspace's hash chain.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Check what this host offers each isolation profile, and print the
    /// command or setting that fixes what is missing.
    Doctor(DoctorArgs),
    /// The agent loop; runs inside a sandbox (internal).
    #[command(hide = true)]
    Agent,
    /// Build one sandbox and exec a command in it (internal).
    #[command(hide = true)]
    Jail(JailArgs),
    /// Print every environment variable the commands read, one a line
    /// (internal: a test checks the README's table against it).
    #[command(hide = true)]
    EnvVars,
}

/// Every environment variable any subcommand reads, sorted, once each.
pub(crate) fn env_vars() -> Vec<String> {
    fn walk(cmd: &clap::Command, out: &mut std::collections::BTreeSet<String>) {
        for arg in cmd.get_arguments() {
            if let Some(env) = arg.get_env() {
                out.insert(env.to_string_lossy().into_owned());
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, out);
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk(&<Cli as clap::CommandFactory>::command(), &mut out);
    out.into_iter().collect()
}

#[derive(Debug, Args)]
pub(crate) struct RunnerOpts {
    /// Isolation profile: strict, namespaces (weaker), or unconfined (none).
    #[arg(long, env = "ASBX_PROFILE", default_value = RunnerConfig::DEFAULT_ISOLATION.as_str())]
    pub(crate) profile: String,
    /// Bearer token required on every runner route.
    #[arg(long, env = "ASBX_RUNNER_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// Hard runtime cap of one sandbox, in seconds [default: 28800].
    #[arg(long, env = "ASBX_MAX_RUNTIME_SEC")]
    pub(crate) max_runtime_sec: Option<u64>,
    /// The seed's name for `ASBX_MAX_RUNTIME_SEC`, used when that is not set.
    #[arg(long, env = "ASSISTANT_SANDBOX_MAX_RUNTIME_SEC", hide = true)]
    pub(crate) assistant_sandbox_max_runtime_sec: Option<u64>,
    /// Grace past the runtime cap, in seconds.
    #[arg(long, env = "ASBX_RUNTIME_GRACE_SEC", default_value_t = RunnerConfig::DEFAULT_RUNTIME_GRACE_SEC)]
    pub(crate) runtime_grace_sec: u64,
    /// Most sandboxes alive at once.
    #[arg(long, env = "ASBX_MAX_SANDBOXES", default_value_t = RunnerConfig::DEFAULT_MAX_SANDBOXES)]
    pub(crate) max_sandboxes: usize,
    /// Sandboxes kept booted ahead of dispatches (0 boots each on demand).
    #[arg(long, env = "ASBX_WARM_POOL", default_value_t = RunnerConfig::DEFAULT_WARM_POOL)]
    pub(crate) warm_pool: usize,
    /// The most sandboxes the warm pool keeps when recent demand is higher
    /// (its memory budget, about 1 MiB of host memory each).
    #[arg(long, env = "ASBX_WARM_POOL_MAX", default_value_t = RunnerConfig::DEFAULT_WARM_POOL_MAX)]
    pub(crate) warm_pool_max: usize,
    /// Origins a dispatch's `agent_url` may point at, comma-separated
    /// (`https://ws.example.com`); loopback origins only when unset.
    #[arg(long, env = "ASBX_WORKSPACE_ORIGINS", value_delimiter = ',')]
    pub(crate) workspace_origins: Vec<String>,
    /// Internal address ranges (CIDR, comma-separated) sandboxes may reach
    /// anyway, through the egress proxy and as HTTP MCP servers.
    #[arg(long, env = "ASBX_ALLOW_INTERNAL", value_delimiter = ',')]
    pub(crate) allow_internal: Vec<String>,
    /// A PEM file of CAs the egress proxy also trusts for TLS to hosts a
    /// secret is bound to, beside the host's trust store.
    #[arg(long, env = "ASBX_EGRESS_EXTRA_CA")]
    pub(crate) egress_extra_ca: Option<std::path::PathBuf>,
    /// Memory cap of one sandbox, in MiB.
    #[arg(long, env = "ASBX_SANDBOX_MEMORY_MB", default_value_t = ResourceLimits::DEFAULT_MEMORY_MB)]
    pub(crate) memory_mb: u64,
    /// Most processes in one sandbox.
    #[arg(long, env = "ASBX_SANDBOX_PIDS", default_value_t = ResourceLimits::DEFAULT_PIDS)]
    pub(crate) pids: u64,
    /// CPU quota of one sandbox, in percent of one core.
    #[arg(long, env = "ASBX_SANDBOX_CPU_PERCENT", default_value_t = ResourceLimits::DEFAULT_CPU_PERCENT)]
    pub(crate) cpu_percent: u32,
    /// Disk cap of a sandbox's working directory, /tmp and /dev/shm together, in MiB.
    #[arg(long, env = "ASBX_SANDBOX_DISK_MB", default_value_t = ResourceLimits::DEFAULT_DISK_MB)]
    pub(crate) disk_mb: u64,
    /// OpenAI-compatible endpoint (any server speaking chat completions).
    #[arg(long, env = "OPENAI_BASE_URL")]
    pub(crate) openai_base_url: Option<String>,
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub(crate) openai_api_key: Option<String>,
    #[arg(long, env = "ANTHROPIC_BASE_URL")]
    pub(crate) anthropic_base_url: Option<String>,
    #[arg(long, env = "ANTHROPIC_API_KEY", hide_env_values = true)]
    pub(crate) anthropic_api_key: Option<String>,
    /// A TOML file naming more providers (`[[provider]]` tables).
    #[arg(long, env = "ASBX_PROVIDERS")]
    pub(crate) providers: Option<PathBuf>,
}

/// Workspace options shared by `up` and `workspace`.
#[derive(Debug, Args)]
pub(crate) struct WorkspaceOpts {
    /// Require a workspace API key (or a browser session made with one) on
    /// every route; without it, requests act in the workspace "default".
    /// Accepts 1/0, true/false, yes/no, on/off; `--require-auth` alone is true.
    #[arg(
        long,
        env = "ASBX_REQUIRE_AUTH",
        value_parser = clap::builder::BoolishValueParser::new(),
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_value = "false",
        default_missing_value = "true"
    )]
    pub(crate) require_auth: bool,
    /// How long a chat turn outlives its gone browser before it is
    /// cancelled, in ms (0 cancels when the stream closes).
    #[arg(long, env = "ASBX_DETACH_GRACE_MS", default_value_t = 30_000)]
    pub(crate) detach_grace_ms: u64,
    /// How long a sandbox waits for the workspace to re-attach after the
    /// connection to its runner broke (the detach grace of every run and
    /// chat turn), in ms.
    #[arg(long, env = "ASBX_RUNNER_DETACH_GRACE_MS", default_value_t = 60_000)]
    pub(crate) runner_detach_grace_ms: u64,
    /// Bearer token `GET /metrics` of the workspace requires; unset, it
    /// answers only while ASBX_REQUIRE_AUTH is off.
    #[arg(long, env = "ASBX_METRICS_TOKEN", hide_env_values = true)]
    pub(crate) metrics_token: Option<String>,
    /// Days audit records are kept (pruned hourly, leaving an anchor so the
    /// chain still verifies); unset keeps them forever.
    #[arg(long, env = "ASBX_AUDIT_RETENTION_DAYS")]
    pub(crate) audit_retention_days: Option<u32>,
    /// Models a chat may choose, comma-separated `provider:model` (the
    /// first is the default when ASBX_MODEL is unset). `up` without it
    /// lists the providers it configures the runner with.
    #[arg(long, env = "ASBX_MODELS", value_delimiter = ',')]
    pub(crate) models: Vec<String>,
    /// Runners besides SANDBOX_URL that a stored agent's environment may
    /// name (its SANDBOX_URL variable), comma-separated; any other runner
    /// URL is refused.
    #[arg(long, env = "ASBX_ALLOWED_SANDBOX_URLS", value_delimiter = ',')]
    pub(crate) allowed_sandbox_urls: Vec<url::Url>,
    /// The longest a run or chat turn waits for its fair share of the
    /// runners (half their capacity per workspace, unless
    /// ASBX_QUOTA_CONCURRENT_SANDBOXES sets a limit), in ms.
    #[arg(long, env = "ASBX_QUEUE_WAIT_MS", default_value_t = 30_000)]
    pub(crate) queue_wait_ms: u64,
    /// How many of a chat's latest kept working directories stay
    /// restorable (forks, `workdir.tar`, runs from the chat); older turns
    /// keep their file list only, their bytes freed. At least 1.
    #[arg(long, env = "ASBX_WORKDIR_KEEP_TURNS", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) workdir_keep_turns: u32,
    #[command(flatten)]
    pub(crate) quotas: QuotaDefaultsOpts,
}

/// Every workspace's quotas unless `asbx quota set` overrides them;
/// unset: unlimited.
#[derive(Debug, Args)]
pub(crate) struct QuotaDefaultsOpts {
    /// Sandboxes (runs and chat turns) a workspace may run at once.
    #[arg(long, env = "ASBX_QUOTA_CONCURRENT_SANDBOXES")]
    pub(crate) quota_concurrent_sandboxes: Option<u64>,
    /// Requests a minute per API key or browser session.
    #[arg(long, env = "ASBX_QUOTA_REQUESTS_PER_MINUTE")]
    pub(crate) quota_requests_per_minute: Option<u64>,
    /// Sandbox seconds a workspace may use a day (UTC).
    #[arg(long, env = "ASBX_QUOTA_SANDBOX_SECONDS_PER_DAY")]
    pub(crate) quota_sandbox_seconds_per_day: Option<u64>,
    /// Model tokens (input + output) a workspace may use a day (UTC).
    #[arg(long, env = "ASBX_QUOTA_TOKENS_PER_DAY")]
    pub(crate) quota_tokens_per_day: Option<u64>,
    /// Megabytes a workspace may store (files and run lines).
    #[arg(long, env = "ASBX_QUOTA_STORAGE_MB")]
    pub(crate) quota_storage_mb: Option<u64>,
}

/// The key sealing secrets at rest (docs/secrets.md).
#[derive(Debug, Args)]
pub(crate) struct SecretKeyOpts {
    /// Base64 of 32 random bytes sealing environment secrets and MCP `env`
    /// values in the database. Unset: a key file under the data folder
    /// (SQLite); required on PostgreSQL.
    #[arg(long, env = "ASBX_SECRET_KEY", hide_env_values = true)]
    pub(crate) secret_key: Option<String>,
    /// The previous key while rotating: read, and what it sealed is
    /// resealed under ASBX_SECRET_KEY at start.
    #[arg(long, env = "ASBX_SECRET_KEY_OLD", hide_env_values = true)]
    pub(crate) secret_key_old: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct KeyArgs {
    /// The workspace the key opens (its id).
    #[arg(long, default_value = "default", conflicts_with = "new_workspace")]
    pub(crate) workspace: String,
    /// Create a new workspace with this name and mint its first key.
    #[arg(long)]
    pub(crate) new_workspace: Option<String>,
    /// A label for the key.
    #[arg(long, default_value = "cli")]
    pub(crate) name: String,
    /// Revoke this key of the workspace instead of minting one: the key
    /// itself, or its `keyId` (the first 12 hex digits of its hash, as the
    /// audit log names it).
    #[arg(long, value_name = "KEY", conflicts_with = "new_workspace")]
    pub(crate) revoke: Option<String>,
    #[arg(long, env = "ASBX_DATA", default_value = ".asbx")]
    pub(crate) data: PathBuf,
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub(crate) database_url: Option<String>,
    #[command(flatten)]
    pub(crate) secrets: SecretKeyOpts,
}

#[derive(Debug, Subcommand)]
pub(crate) enum AuditCommand {
    /// Check every workspace's audit chain (or WORKSPACE's); exits non-zero
    /// naming the first broken record.
    Verify(AuditVerifyArgs),
}

#[derive(Debug, Args)]
pub(crate) struct AuditVerifyArgs {
    /// Only this workspace's chain (its id).
    pub(crate) workspace: Option<String>,
    #[arg(long, env = "ASBX_DATA", default_value = ".asbx")]
    pub(crate) data: PathBuf,
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub(crate) database_url: Option<String>,
    #[command(flatten)]
    pub(crate) secrets: SecretKeyOpts,
}

#[derive(Debug, Args)]
pub(crate) struct QuotaArgs {
    #[command(subcommand)]
    pub(crate) action: QuotaAction,
}

#[derive(Debug, Subcommand)]
pub(crate) enum QuotaAction {
    /// Override quotas of a workspace: a number, `unlimited`, or `default`
    /// (the server's `ASBX_QUOTA_*` again).
    Set(QuotaSetArgs),
    /// Print a workspace's quotas and usage.
    Show(QuotaShowArgs),
}

/// A quota's new value on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuotaValue {
    Limit(u64),
    Unlimited,
    Default,
}

fn quota_value(s: &str) -> Result<QuotaValue, String> {
    match s {
        "unlimited" => Ok(QuotaValue::Unlimited),
        "default" => Ok(QuotaValue::Default),
        n => n
            .parse()
            .map(QuotaValue::Limit)
            .map_err(|_| format!("{s:?}: a number, `unlimited` or `default`")),
    }
}

#[derive(Debug, Args)]
pub(crate) struct QuotaSetArgs {
    /// The workspace's id.
    pub(crate) workspace: String,
    #[arg(long, value_parser = quota_value)]
    pub(crate) concurrent_sandboxes: Option<QuotaValue>,
    #[arg(long, value_parser = quota_value)]
    pub(crate) requests_per_minute: Option<QuotaValue>,
    #[arg(long, value_parser = quota_value)]
    pub(crate) sandbox_seconds_per_day: Option<QuotaValue>,
    #[arg(long, value_parser = quota_value)]
    pub(crate) tokens_per_day: Option<QuotaValue>,
    #[arg(long, value_parser = quota_value)]
    pub(crate) storage_mb: Option<QuotaValue>,
    #[command(flatten)]
    pub(crate) db: OneOffDb,
}

#[derive(Debug, Args)]
pub(crate) struct QuotaShowArgs {
    /// The workspace's id.
    pub(crate) workspace: String,
    #[command(flatten)]
    pub(crate) db: OneOffDb,
}

/// The workspace's database, for a one-off command.
#[derive(Debug, Args)]
pub(crate) struct OneOffDb {
    #[arg(long, env = "ASBX_DATA", default_value = ".asbx")]
    pub(crate) data: PathBuf,
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub(crate) database_url: Option<String>,
    #[command(flatten)]
    pub(crate) secrets: SecretKeyOpts,
}

#[derive(Debug, Args)]
pub(crate) struct GcArgs {
    #[arg(long, env = "ASBX_DATA", default_value = ".asbx")]
    pub(crate) data: PathBuf,
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub(crate) database_url: Option<String>,
    #[arg(long, env = "ASBX_BLOB_STORE", value_parser = ["dir", "db"])]
    pub(crate) blob_store: Option<String>,
    #[command(flatten)]
    pub(crate) secrets: SecretKeyOpts,
}

#[derive(Debug, Args)]
pub(crate) struct UpArgs {
    /// Where the workspace (and its web page) listens.
    #[arg(long, env = "ASBX_LISTEN", default_value = "127.0.0.1:7878")]
    pub(crate) listen: SocketAddr,
    /// Data folder (SQLite database, files, sandbox state).
    #[arg(long, env = "ASBX_DATA", default_value = ".asbx")]
    pub(crate) data: PathBuf,
    /// Model used when a run names none (`provider:model`).
    #[arg(long, env = "ASBX_MODEL")]
    pub(crate) model: Option<String>,
    #[command(flatten)]
    pub(crate) workspace: WorkspaceOpts,
    #[command(flatten)]
    pub(crate) secrets: SecretKeyOpts,
    #[command(flatten)]
    pub(crate) runner: RunnerOpts,
    #[command(flatten)]
    pub(crate) conns: crate::listen::ConnOpts,
}

impl RunnerOpts {
    /// The runtime cap: `ASBX_MAX_RUNTIME_SEC`, else the seed's
    /// `ASSISTANT_SANDBOX_MAX_RUNTIME_SEC`, else 8 hours.
    pub(crate) fn max_runtime_sec(&self) -> u64 {
        self.max_runtime_sec
            .or(self.assistant_sandbox_max_runtime_sec)
            .unwrap_or(RunnerConfig::DEFAULT_MAX_RUNTIME_SEC)
    }
}

#[derive(Debug, Args)]
pub(crate) struct RunnerArgs {
    #[arg(long, env = "ASBX_RUNNER_LISTEN", default_value = "127.0.0.1:7879")]
    pub(crate) listen: SocketAddr,
    /// Folder for per-session state.
    #[arg(long, env = "ASBX_DATA", default_value = ".asbx")]
    pub(crate) data: PathBuf,
    #[command(flatten)]
    pub(crate) runner: RunnerOpts,
    #[command(flatten)]
    pub(crate) conns: crate::listen::ConnOpts,
}

#[derive(Debug, Args)]
pub(crate) struct WorkspaceArgs {
    #[arg(long, env = "ASBX_LISTEN", default_value = "127.0.0.1:7878")]
    pub(crate) listen: SocketAddr,
    /// The runner's base URL, or several, comma-separated (a runner fleet:
    /// each dispatch goes to the one with the most free capacity).
    #[arg(long, env = "SANDBOX_URL", value_delimiter = ',')]
    pub(crate) sandbox_url: Vec<url::Url>,
    /// The seed's name for `SANDBOX_URL`, used when that is not set.
    #[arg(long, env = "ASSISTANT_SANDBOX_URL", hide = true)]
    pub(crate) assistant_sandbox_url: Option<url::Url>,
    /// The URL sandboxes call back (defaults to `http://<listen>`).
    #[arg(long, env = "ASBX_PUBLIC_URL")]
    pub(crate) public_url: Option<url::Url>,
    #[arg(long, env = "ASBX_DATA", default_value = ".asbx")]
    pub(crate) data: PathBuf,
    /// Database URL (sqlite:... or postgres://...); SQLite under the data folder by default.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub(crate) database_url: Option<String>,
    /// Where file bytes live: `dir` (a folder under the data folder, this
    /// node only) or `db` (the database, so every node serves every file).
    /// Default: `db` on PostgreSQL, `dir` on SQLite.
    #[arg(long, env = "ASBX_BLOB_STORE", value_parser = ["dir", "db"])]
    pub(crate) blob_store: Option<String>,
    #[arg(long, env = "ASBX_MODEL")]
    pub(crate) model: Option<String>,
    /// Bearer token sent to the runner (`SANDBOX_URL`) on every dispatch:
    /// the runner's own `ASBX_RUNNER_TOKEN`.
    #[arg(long, env = "ASBX_RUNNER_TOKEN", hide_env_values = true)]
    pub(crate) runner_token: Option<String>,
    #[command(flatten)]
    pub(crate) opts: WorkspaceOpts,
    #[command(flatten)]
    pub(crate) secrets: SecretKeyOpts,
    #[command(flatten)]
    pub(crate) conns: crate::listen::ConnOpts,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// What to ask the agent.
    pub(crate) prompt: String,
    /// Model, as `provider:model` (for example `openai:gpt-4.1-mini`).
    #[arg(long)]
    pub(crate) model: Option<String>,
    /// The workspace's URL.
    #[arg(long, env = "ASBX_URL", default_value = "http://127.0.0.1:7878")]
    pub(crate) url: url::Url,
    /// A workspace API key (`asbx key`), sent as the bearer; needed where
    /// the workspace requires authentication.
    #[arg(long, env = "ASBX_API_KEY", hide_env_values = true)]
    pub(crate) api_key: Option<String>,
    /// Print the raw NDJSON lines instead of rendering them.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// The profile that must be able to run (the exit status says).
    #[arg(long, env = "ASBX_PROFILE", default_value = RunnerConfig::DEFAULT_ISOLATION.as_str())]
    pub(crate) profile: String,
    /// The data folder whose file system is checked.
    #[arg(long, env = "ASBX_DATA", default_value = ".asbx")]
    pub(crate) data: PathBuf,
    /// Runners the workspace dispatches to, checked for reachability
    /// (comma-separated); none: `asbx up` runs its own.
    #[arg(long, env = "SANDBOX_URL", value_delimiter = ',')]
    pub(crate) sandbox_url: Vec<String>,
    /// Most sandboxes alive at once (for `pid_max` and the open-file limit).
    #[arg(long, env = "ASBX_MAX_SANDBOXES", default_value_t = RunnerConfig::DEFAULT_MAX_SANDBOXES)]
    pub(crate) max_sandboxes: usize,
    /// Most processes in one sandbox.
    #[arg(long, env = "ASBX_SANDBOX_PIDS", default_value_t = ResourceLimits::DEFAULT_PIDS)]
    pub(crate) pids: u64,
}

#[derive(Debug, Args)]
pub(crate) struct JailArgs {
    /// The sandbox policy, as JSON.
    #[arg(long, conflicts_with = "check")]
    pub(crate) policy: Option<String>,
    /// Report which isolation layers this host has, as JSON.
    #[arg(long)]
    pub(crate) check: bool,
    /// The profile to check.
    #[arg(long, default_value = "strict")]
    pub(crate) profile: String,
    /// Serve fork requests from the runner on stdin (internal: the runner
    /// starts one per process; see `asbx_jail::Zygote`).
    #[arg(long, hide = true, conflicts_with_all = ["policy", "check"])]
    pub(crate) zygote: bool,
    /// Room for the forked supervisors' titles (internal: spaces).
    #[arg(hide = true, requires = "zygote")]
    pub(crate) title_room: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runner's runtime cap from `args` (the flags of the same names).
    fn runtime_cap(args: &[&str]) -> u64 {
        let argv = ["asbx", "runner"].iter().chain(args);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Runner(r) => r.runner.max_runtime_sec(),
            other => panic!("not the runner: {other:?}"),
        }
    }

    #[test]
    fn the_runtime_cap_is_asbxs_name_else_the_seeds_else_eight_hours() {
        assert_eq!(runtime_cap(&[]), 28_800);
        assert_eq!(
            runtime_cap(&["--assistant-sandbox-max-runtime-sec", "60"]),
            60
        );
        assert_eq!(
            runtime_cap(&[
                "--assistant-sandbox-max-runtime-sec",
                "60",
                "--max-runtime-sec",
                "30"
            ]),
            30
        );
    }
}
