//! The long-running subcommands (`up`, `runner`, `workspace`), `run`, and the
//! `jail` glue.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use asbx_protocol::jail::{IsolationProfile, JailProfile, LayerReport, ResourceLimits};
use asbx_runner::{Runner, RunnerConfig};
use asbx_workspace::{Workspace, WorkspaceConfig};
use tokio::net::TcpListener;

use crate::cli::{Command, RunnerOpts};
use crate::listen::{Limits, serve};

pub(crate) async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Up(mut args) => {
            let data = absolute_data_dir(&args.data)?;
            // The runner is never open to every local process: without an
            // operator's token, `up` makes a fresh one that only its own
            // workspace holds.
            let operator_token = args.runner.token.as_deref().is_some_and(|t| !t.is_empty());
            if !operator_token {
                args.runner.token = Some(hex::encode(rand::random::<[u8; 32]>()));
            }
            let runner_listener = crate::listen::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
                .context("binding the runner to a loopback port")?;
            let runner_url = format!("http://{}", runner_listener.local_addr()?);
            let listener = crate::listen::bind(args.listen).with_context(|| {
                format!("binding {} (set --listen or ASBX_LISTEN)", args.listen)
            })?;
            let addr = listener.local_addr()?;
            // Sandboxes call this workspace back: its origin is the runner's.
            let runner = start_runner(&args.runner, &data, Some(format!("http://{addr}")))?;
            let mut config =
                WorkspaceConfig::new(data.join("workspace"), format!("http://{addr}").parse()?);
            apply_workspace_opts(&mut config, &args.workspace);
            apply_secret_key(&mut config, &args.secrets);
            let (model, models) = up_models(args.model.as_deref(), &config.models, &args.runner);
            config.models = models;
            config.sandbox_url = Some(runner_url.parse()?);
            config.default_model = model.clone();
            config.listen = Some(addr);
            config.runner_token = args.runner.token.clone();
            let workspace = Workspace::open(config)
                .await
                .context("opening the workspace")?;
            let profile = runner.profile();
            // The runner's own routes (protocol 2 sessions, events) answer
            // only its bearer: the operator's ASBX_RUNNER_TOKEN if set, else
            // the one `up` made, which only this workspace holds.
            let bearer = match operator_token {
                true => "bearer: ASBX_RUNNER_TOKEN",
                false => "bearer: private to this workspace; set ASBX_RUNNER_TOKEN to call it",
            };
            let banner = format!(
                "asbx is up (isolation: {profile}, model: {model})\n  open    http://{addr}\n  try     asbx run \"what is in your sandbox?\"\n  runner  {runner_url} ({bearer})\n  data    {}",
                data.display()
            );
            print_line(&banner);
            runner.warm_up();
            let stop = shutdown_signal();
            // One connection budget for the process, its two listeners together.
            let limits = Limits::new(&args.conns, sandbox_fds(&args.runner));
            let runner_srv = serve(
                runner_listener,
                runner.router(),
                stop.clone(),
                limits.clone(),
            );
            let ws_srv = serve(listener, workspace.router(), stop, limits);
            let served = tokio::try_join!(runner_srv, ws_srv);
            runner.shutdown().await;
            served?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Runner(args) => {
            let data = absolute_data_dir(&args.data)?;
            let runner = start_runner(&args.runner, &data, None)?;
            runner.check_listen(args.listen)?;
            let listener = bind(args.listen).await?;
            print_line(&format!(
                "asbx runner listening on http://{} (isolation: {})",
                listener.local_addr()?,
                runner.profile()
            ));
            runner.warm_up();
            let limits = Limits::new(&args.conns, sandbox_fds(&args.runner));
            let served = serve(listener, runner.router(), shutdown_signal(), limits).await;
            runner.shutdown().await;
            served?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Workspace(args) => {
            if args.sandbox_url.is_empty() && args.assistant_sandbox_url.is_none() {
                bail!(
                    "SANDBOX_URL is not set: `asbx workspace` needs its runner's URL \
                     (SANDBOX_URL, or --sandbox-url; `asbx up` starts one itself)"
                );
            }
            let data = absolute_data_dir(&args.data)?;
            let listener = bind(args.listen).await?;
            let addr = listener.local_addr()?;
            let public_url = match args.public_url {
                Some(u) => u,
                None => format!("http://{addr}").parse()?,
            };
            let mut config = WorkspaceConfig::new(data.join("workspace"), public_url);
            apply_workspace_opts(&mut config, &args.opts);
            apply_secret_key(&mut config, &args.secrets);
            let model = args
                .model
                .or_else(|| config.models.first().cloned())
                .unwrap_or_else(|| "scripted:demo".to_owned());
            config.database_url = args.database_url;
            config.blob_store = args
                .blob_store
                .as_deref()
                .map(str::parse)
                .transpose()
                .map_err(anyhow::Error::msg)?;
            config.sandbox_url = args
                .sandbox_url
                .first()
                .cloned()
                .or(args.assistant_sandbox_url);
            config.sandbox_urls = args.sandbox_url;
            config.default_model = model;
            config.listen = Some(addr);
            config.runner_token = args.runner_token;
            let workspace = Workspace::open(config)
                .await
                .context("opening the workspace")?;
            print_line(&format!("asbx workspace listening on http://{addr}"));
            raise_nofile(0);
            let limits = Limits::new(&args.conns, 0);
            serve(listener, workspace.router(), shutdown_signal(), limits).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(args) => crate::render::run(args).await,
        Command::Key(args) => {
            let data = absolute_data_dir(&args.data)?;
            let mut config =
                WorkspaceConfig::new(data.join("workspace"), "http://127.0.0.1/".parse()?);
            config.database_url = args.database_url;
            apply_secret_key(&mut config, &args.secrets);
            let workspace = Workspace::open(config)
                .await
                .context("opening the workspace")?;
            let id = match &args.new_workspace {
                Some(name) => workspace.create_workspace(name).await?,
                None => args.workspace.clone(),
            };
            let key = workspace
                .create_api_key(&id, &args.name)
                .await
                .with_context(|| format!("minting a key for workspace {id}"))?;
            print_line(&format!(
                "workspace {id}\nkey       {key}\n(shown once: only its hash is stored)"
            ));
            Ok(ExitCode::SUCCESS)
        }
        Command::Gc(args) => {
            let data = absolute_data_dir(&args.data)?;
            let mut config =
                WorkspaceConfig::new(data.join("workspace"), "http://127.0.0.1/".parse()?);
            config.database_url = args.database_url;
            config.blob_store = args
                .blob_store
                .as_deref()
                .map(str::parse)
                .transpose()
                .map_err(anyhow::Error::msg)?;
            apply_secret_key(&mut config, &args.secrets);
            let workspace = Workspace::open(config)
                .await
                .context("opening the workspace")?;
            let freed = workspace.collect_garbage().await?;
            print_line(&format!("freed {freed} blobs no file refers to"));
            Ok(ExitCode::SUCCESS)
        }
        Command::Agent | Command::Jail(_) | Command::EnvVars => {
            bail!("internal subcommand reached the runtime")
        }
    }
}

fn apply_workspace_opts(config: &mut WorkspaceConfig, opts: &crate::cli::WorkspaceOpts) {
    config.require_auth = opts.require_auth;
    config.detach_grace = Duration::from_millis(opts.detach_grace_ms);
    config.metrics_token = opts.metrics_token.clone().filter(|t| !t.is_empty());
    config.models = opts
        .models
        .iter()
        .map(|m| m.trim().to_owned())
        .filter(|m| !m.is_empty())
        .collect();
    // Listed by the operator: runs and agents are held to the list too.
    config.restrict_models = !config.models.is_empty();
    config.allowed_sandbox_urls = opts.allowed_sandbox_urls.clone();
}

fn apply_secret_key(config: &mut WorkspaceConfig, opts: &crate::cli::SecretKeyOpts) {
    config.secret_key = opts.secret_key.clone().filter(|k| !k.is_empty());
    config.secret_key_old = opts.secret_key_old.clone().filter(|k| !k.is_empty());
}

/// `up`'s default model and the models a chat may choose: `ASBX_MODELS`
/// when set (its first the default unless `ASBX_MODEL` names one), else
/// [`provider_models`] and [`default_model`].
fn up_models(
    explicit: Option<&str>,
    listed: &[String],
    opts: &RunnerOpts,
) -> (String, Vec<String>) {
    match (explicit, listed.first()) {
        (_, None) => (default_model(explicit, opts), provider_models(opts)),
        (None, Some(first)) => (first.clone(), listed.to_vec()),
        (Some(m), Some(_)) => (m.to_owned(), listed.to_vec()),
    }
}

/// The models `up` offers without `ASBX_MODELS`: those of the providers it
/// configures the runner with (the default first, as [`default_model`]
/// picks it), and the scripted model, always there.
fn provider_models(opts: &RunnerOpts) -> Vec<String> {
    let mut out = Vec::new();
    if opts.openai_api_key.is_some() {
        out.push("openai:gpt-4.1-mini".to_owned());
    }
    if opts.anthropic_api_key.is_some() {
        out.push("anthropic:claude-sonnet-4-5".to_owned());
    }
    out.push("scripted:demo".to_owned());
    out
}

/// Prints a line; a closed stdout (a reader that went away) is not an error.
fn print_line(s: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{s}").and_then(|()| out.flush());
}

async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    crate::listen::bind(addr).with_context(|| format!("binding {addr}"))
}

/// Cancelled on SIGTERM or Ctrl-C.
fn shutdown_signal() -> tokio_util::sync::CancellationToken {
    let token = tokio_util::sync::CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = term => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        t.cancel();
    });
    token
}

fn absolute_data_dir(data: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(data)
        .with_context(|| format!("creating the data folder {}", data.display()))?;
    data.canonicalize()
        .with_context(|| format!("resolving {}", data.display()))
}

fn default_model(explicit: Option<&str>, opts: &RunnerOpts) -> String {
    match explicit {
        Some(m) => m.to_owned(),
        None if opts.openai_api_key.is_some() => "openai:gpt-4.1-mini".to_owned(),
        None if opts.anthropic_api_key.is_some() => "anthropic:claude-sonnet-4-5".to_owned(),
        None => "scripted:demo".to_owned(),
    }
}

/// The binary sandboxes run: the lean `asbx-sandbox` beside this one when it
/// is there, else this binary (its hidden `jail` and `agent` subcommands).
fn sandbox_exe() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("locating the asbx binary")?;
    let lean = me.with_file_name("asbx-sandbox");
    Ok(if lean.is_file() { lean } else { me })
}

/// Descriptors the runner holds per live sandbox (pipes, sockets, the
/// client's connection: about eight), with room.
const FDS_PER_SANDBOX: u64 = 10;

/// Descriptors the runner's sandboxes may hold: kept out of the
/// connection budget.
fn sandbox_fds(opts: &RunnerOpts) -> usize {
    opts.max_sandboxes.saturating_mul(FDS_PER_SANDBOX as usize)
}

/// Raises the open-file limit to fit `max_sandboxes` live sandboxes: the
/// soft limit to the hard one, and the hard one too when it is lower than
/// they need and this process may (`CAP_SYS_RESOURCE`; at most
/// `fs.nr_open`), as systemd's `LimitNOFILE=` would. Returns the limit.
fn raise_nofile(max_sandboxes: usize) -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, mut hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 0;
    };
    let want = (max_sandboxes as u64)
        .saturating_mul(FDS_PER_SANDBOX)
        .saturating_add(1024);
    if hard < want {
        let ceiling = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(1 << 20);
        let to = want.min(ceiling).max(hard);
        match setrlimit(Resource::RLIMIT_NOFILE, to, to) {
            Ok(()) => hard = to,
            Err(e) => tracing::warn!(
                error = %e,
                hard,
                sandboxes = hard / FDS_PER_SANDBOX,
                "the open-file limit fits fewer sandboxes than ASBX_MAX_SANDBOXES: \
                 raise its hard limit (LimitNOFILE) or run the runner as root"
            ),
        }
    }
    if soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::warn!(error = %e, "could not raise the open-file limit");
        return soft;
    }
    hard
}

fn start_runner(
    opts: &RunnerOpts,
    data: &Path,
    workspace_origin: Option<String>,
) -> anyhow::Result<Runner> {
    raise_nofile(opts.max_sandboxes);
    let exe = sandbox_exe()?;
    let isolation = IsolationProfile::parse(&opts.profile).with_context(|| {
        format!(
            "unknown profile {:?}: use strict, namespaces or unconfined",
            opts.profile
        )
    })?;
    match isolation {
        IsolationProfile::Jail(profile) => check_isolation(&exe, profile, &opts.profile)?,
        IsolationProfile::Unconfined => tracing::warn!(
            "isolation profile `unconfined`: sandboxes are NOT isolated from this host; use it for development only"
        ),
    }
    if isolation != IsolationProfile::Jail(JailProfile::Strict) {
        tracing::warn!(
            profile = isolation.as_str(),
            "running with a weaker isolation profile"
        );
    }
    let mut config = RunnerConfig::new(exe, data.join("runner"));
    config.isolation = isolation;
    config.workspace_origins = opts.workspace_origins.clone();
    config.workspace_origins.extend(workspace_origin);
    for range in &opts.allow_internal {
        config.allow_internal.push(
            asbx_runner::Cidr::parse(range).with_context(|| {
                format!("ASBX_ALLOW_INTERNAL: {range:?} is not an address range")
            })?,
        );
    }
    if let Some(path) = &opts.egress_extra_ca {
        std::fs::metadata(path)
            .with_context(|| format!("ASBX_EGRESS_EXTRA_CA: cannot read {}", path.display()))?;
    }
    config.egress_extra_ca = opts.egress_extra_ca.clone();
    config.token = opts.token.clone();
    config.max_runtime = Duration::from_secs(opts.max_runtime_sec());
    config.runtime_grace = Duration::from_secs(opts.runtime_grace_sec);
    config.max_sandboxes = opts.max_sandboxes.max(1);
    config.warm_pool = opts.warm_pool;
    config.warm_pool_max = opts.warm_pool_max;
    config.resources = ResourceLimits {
        memory_bytes: Some(opts.memory_mb << 20),
        pids: Some(opts.pids),
        cpu_percent: Some(opts.cpu_percent),
        disk_bytes: Some(opts.disk_mb << 20),
        nofile: ResourceLimits::default().nofile,
    };
    config.providers = crate::providers::load(opts)?;
    if let Ok(v) = std::env::var("ASBX_MODEL_STALL_TIMEOUT_MS") {
        config
            .agent_env
            .push(("ASBX_MODEL_STALL_TIMEOUT_MS".to_owned(), v));
    }
    Runner::new(config).context("starting the runner")
}

/// Fails closed: every layer the profile needs must be present.
fn check_isolation(exe: &Path, profile: JailProfile, name: &str) -> anyhow::Result<()> {
    let out = std::process::Command::new(exe)
        .args(["jail", "--check", "--profile", name])
        .output()
        .context("running `asbx jail --check`")?;
    let report: LayerReport = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "reading the layer report: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let missing: Vec<String> = report
        .missing()
        .into_iter()
        .map(|l| match &l.detail {
            Some(d) => format!("{} ({d})", l.name),
            None => l.name.clone(),
        })
        .collect();
    if !missing.is_empty() {
        bail!(
            "isolation profile `{name}` needs layers this host lacks: {}. Refusing to start. \
             Pick a weaker profile by name (--profile namespaces, or --profile unconfined) if you accept that.",
            missing.join(", ")
        );
    }
    tracing::info!(profile = ?profile, "isolation layers checked");
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    fn runner_opts(args: &[&str]) -> RunnerOpts {
        let argv = ["asbx", "up"].iter().chain(args).copied();
        match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Up(up)) => up.runner,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn up_lists_its_providers_models_unless_told_which() {
        let with_openai = runner_opts(&["--openai-api-key", "k", "--anthropic-api-key", "k"]);
        let (default, models) = up_models(None, &[], &with_openai);
        assert_eq!(default, "openai:gpt-4.1-mini");
        assert_eq!(
            models,
            [
                "openai:gpt-4.1-mini",
                "anthropic:claude-sonnet-4-5",
                "scripted:demo"
            ]
        );
        let listed = vec!["ollama:llama3".to_owned(), "scripted:demo".to_owned()];
        assert_eq!(
            up_models(None, &listed, &with_openai),
            ("ollama:llama3".to_owned(), listed.clone())
        );
        assert_eq!(
            up_models(Some("scripted:demo"), &listed, &with_openai).0,
            "scripted:demo"
        );
    }

    /// The soft open-file limit rises to the hard one, and with
    /// `CAP_SYS_RESOURCE` the hard one rises to fit `--max-sandboxes` (here more than it held before).
    #[test]
    fn the_open_file_limit_fits_the_most_sandboxes() {
        use nix::sys::resource::{Resource, getrlimit};
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let sandboxes = (hard / FDS_PER_SANDBOX + 100) as usize;
        let want = sandboxes as u64 * FDS_PER_SANDBOX + 1024;
        let got = raise_nofile(sandboxes);
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (got, got));
        let nr_open: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // CAP_SYS_RESOURCE (bit 24 of the effective set) raises a hard
        // limit; root on some hosts (this test's own) does not have it.
        let may_raise = std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|caps| caps & (1 << 24) != 0);
        if !may_raise {
            assert_eq!(got, hard);
        } else if want <= nr_open {
            assert_eq!(got, want);
        } else {
            assert_eq!(got, nr_open.max(hard));
        }
    }
}
