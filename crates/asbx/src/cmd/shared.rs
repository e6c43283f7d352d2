//! What the long-running commands share: the data folder, binding,
//! shutdown on a signal, the workspace's settings from its options, the
//! open-file limit, printing a line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use asbx_workspace::{BlobBackend, Quota, WorkspaceConfig};
use tokio::net::TcpListener;

use crate::cli::RunnerOpts;

pub(super) fn apply_workspace_opts(config: &mut WorkspaceConfig, opts: &crate::cli::WorkspaceOpts) {
    config.require_auth = opts.require_auth;
    config.detach_grace = Duration::from_millis(opts.detach_grace_ms);
    config.runner_detach_grace = Duration::from_millis(opts.runner_detach_grace_ms);
    config.metrics_token = opts.metrics_token.clone().filter(|t| !t.is_empty());
    config.audit_retention = opts
        .audit_retention_days
        .map(|d| Duration::from_secs(u64::from(d) * 86_400));
    config.models = opts
        .models
        .iter()
        .map(|m| m.trim().to_owned())
        .filter(|m| !m.is_empty())
        .collect();
    // Listed by the operator: runs and agents are held to the list too.
    config.restrict_models = !config.models.is_empty();
    config.allowed_sandbox_urls = opts.allowed_sandbox_urls.clone();
    config.queue_wait = Duration::from_millis(opts.queue_wait_ms);
    config.workdir_keep_turns = opts.workdir_keep_turns;
    let q = &opts.quotas;
    for (quota, value) in [
        (Quota::ConcurrentSandboxes, q.quota_concurrent_sandboxes),
        (Quota::RequestsPerMinute, q.quota_requests_per_minute),
        (Quota::SandboxSecondsPerDay, q.quota_sandbox_seconds_per_day),
        (Quota::TokensPerDay, q.quota_tokens_per_day),
        (Quota::StorageMb, q.quota_storage_mb),
    ] {
        config.quotas.set(quota, value);
    }
}

pub(super) fn apply_secret_key(config: &mut WorkspaceConfig, opts: &crate::cli::SecretKeyOpts) {
    config.secret_key = opts.secret_key.clone().filter(|k| !k.is_empty());
    config.secret_key_old = opts.secret_key_old.clone().filter(|k| !k.is_empty());
}

/// `ASBX_BLOB_STORE`'s value, parsed.
pub(super) fn blob_store(setting: Option<&str>) -> anyhow::Result<Option<BlobBackend>> {
    setting
        .map(str::parse)
        .transpose()
        .map_err(anyhow::Error::msg)
}

/// A workspace opened for a one-off command (`key`, `gc`): its database,
/// its secret key, no listener.
pub(super) fn one_off_config(
    data: &Path,
    database_url: Option<String>,
    secrets: &crate::cli::SecretKeyOpts,
) -> anyhow::Result<WorkspaceConfig> {
    let data = absolute_data_dir(data)?;
    let mut config = WorkspaceConfig::new(data.join("workspace"), "http://127.0.0.1/".parse()?);
    config.database_url = database_url;
    apply_secret_key(&mut config, secrets);
    Ok(config)
}

/// Prints a line; a closed stdout (a reader that went away) is not an error.
pub(super) fn print_line(s: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{s}").and_then(|()| out.flush());
}

pub(super) async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    crate::listen::bind(addr).with_context(|| format!("binding {addr}"))
}

/// Cancelled on SIGTERM or Ctrl-C.
pub(super) fn shutdown_signal() -> tokio_util::sync::CancellationToken {
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

pub(super) fn absolute_data_dir(data: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(data)
        .with_context(|| format!("creating the data folder {}", data.display()))?;
    data.canonicalize()
        .with_context(|| format!("resolving {}", data.display()))
}

/// Descriptors the runner holds per live sandbox (pipes, sockets, the
/// client's connection: about eight), with room.
pub(crate) const FDS_PER_SANDBOX: u64 = 10;

/// Descriptors the runner's sandboxes may hold: kept out of the
/// connection budget.
pub(super) fn sandbox_fds(opts: &RunnerOpts) -> usize {
    opts.max_sandboxes.saturating_mul(FDS_PER_SANDBOX as usize)
}

/// Raises the open-file limit to fit `max_sandboxes` live sandboxes: the
/// soft limit to the hard one, and the hard one too when it is lower than
/// they need and this process may (`CAP_SYS_RESOURCE`; at most
/// `fs.nr_open`), as systemd's `LimitNOFILE=` would. Returns the limit.
pub(super) fn raise_nofile(max_sandboxes: usize) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

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
