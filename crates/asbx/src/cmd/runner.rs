//! `asbx runner`: the sandbox runner alone; and the runner's start from
//! its options, which `asbx up` shares.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use asbx_protocol::jail::{IsolationProfile, JailProfile, LayerReport, ResourceLimits};
use asbx_runner::{Runner, RunnerConfig};

use crate::cli::{RunnerArgs, RunnerOpts};
use crate::cmd::shared::{
    absolute_data_dir, bind, print_line, raise_nofile, sandbox_fds, shutdown_signal,
};
use crate::listen::{Limits, serve};

pub(super) async fn run(args: RunnerArgs) -> anyhow::Result<ExitCode> {
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

/// The binary sandboxes run: the lean `asbx-sandbox` beside this one when it
/// is there, else this binary (its hidden `jail` and `agent` subcommands).
pub(crate) fn sandbox_exe() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("locating the asbx binary")?;
    let lean = me.with_file_name("asbx-sandbox");
    Ok(if lean.is_file() { lean } else { me })
}

/// Starts the runner: the isolation profile checked on this host, then
/// its settings from the options.
pub(super) fn start_runner(
    opts: &RunnerOpts,
    data: &Path,
    workspace_origin: Option<String>,
) -> anyhow::Result<Runner> {
    raise_nofile(opts.max_sandboxes);
    let exe = sandbox_exe()?;
    let isolation = isolation(&exe, &opts.profile)?;
    let mut config = RunnerConfig::new(exe, data.join("runner"));
    config.isolation = isolation;
    apply_runner_opts(&mut config, opts, workspace_origin)?;
    Runner::new(config).context("starting the runner")
}

/// The isolation profile named `name`, its layers checked on this host.
fn isolation(exe: &Path, name: &str) -> anyhow::Result<IsolationProfile> {
    let isolation = IsolationProfile::parse(name).with_context(|| {
        format!("unknown profile {name:?}: use strict, namespaces or unconfined")
    })?;
    match isolation {
        IsolationProfile::Jail(profile) => check_isolation(exe, profile, name)?,
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
    Ok(isolation)
}

/// The runner's settings from its options (and the workspace origin `up`
/// adds).
fn apply_runner_opts(
    config: &mut RunnerConfig,
    opts: &RunnerOpts,
    workspace_origin: Option<String>,
) -> anyhow::Result<()> {
    config.workspace_origins = opts.workspace_origins.clone();
    config.workspace_origins.extend(workspace_origin);
    for range in &opts.allow_internal {
        config.allow_internal.push(
            asbx_runner::Cidr::parse(range).with_context(|| {
                format!("ASBX_ALLOW_INTERNAL: {range:?} is not an address range")
            })?,
        );
    }
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
    if let Some(path) = &opts.egress_extra_ca {
        std::fs::metadata(path)
            .with_context(|| format!("ASBX_EGRESS_EXTRA_CA: cannot read {}", path.display()))?;
    }
    config.egress_extra_ca = opts.egress_extra_ca.clone();
    Ok(())
}

/// The layers this host offers `name` (`asbx jail --check`, run from the
/// sandbox binary: the probes fork and unshare, which a process with
/// threads must not do).
pub(crate) fn layer_report(exe: &Path, name: &str) -> anyhow::Result<LayerReport> {
    let out = std::process::Command::new(exe)
        .args(["jail", "--check", "--profile", name])
        .output()
        .context("running `asbx jail --check`")?;
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "reading the layer report: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Fails closed: every layer the profile needs must be present.
fn check_isolation(exe: &Path, profile: JailProfile, name: &str) -> anyhow::Result<()> {
    let report = layer_report(exe, name)?;
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
             Run `asbx doctor` for what each layer needs and the command that fixes it, \
             or pick a weaker profile by name (--profile namespaces, or --profile unconfined) if you accept that.",
            missing.join(", ")
        );
    }
    tracing::info!(profile = ?profile, "isolation layers checked");
    Ok(())
}
