//! `asbx workspace`: the control plane alone, pointed at its runners.

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};
use asbx_workspace::{Workspace, WorkspaceConfig};

use crate::cli::WorkspaceArgs;
use crate::cmd::shared::{
    absolute_data_dir, apply_secret_key, apply_workspace_opts, bind, blob_store, print_line,
    raise_nofile, shutdown_signal,
};
use crate::listen::{Limits, serve};

pub(super) async fn run(args: WorkspaceArgs) -> anyhow::Result<ExitCode> {
    if args.sandbox_url.is_empty() && args.assistant_sandbox_url.is_none() {
        bail!(
            "SANDBOX_URL is not set: `asbx workspace` needs its runner's URL \
             (SANDBOX_URL, or --sandbox-url; `asbx up` starts one itself)"
        );
    }
    let data = absolute_data_dir(&args.data)?;
    let listener = bind(args.listen).await?;
    let addr = listener.local_addr()?;
    let config = workspace_config(&args, &data, addr)?;
    let workspace = Workspace::open(config)
        .await
        .context("opening the workspace")?;
    print_line(&format!("asbx workspace listening on http://{addr}"));
    raise_nofile(0);
    let limits = Limits::new(&args.conns, 0);
    serve(listener, workspace.router(), shutdown_signal(), limits).await?;
    Ok(ExitCode::SUCCESS)
}

/// The workspace's settings from its options; it listens on `addr`.
fn workspace_config(
    args: &WorkspaceArgs,
    data: &Path,
    addr: SocketAddr,
) -> anyhow::Result<WorkspaceConfig> {
    let public_url = match args.public_url.clone() {
        Some(u) => u,
        None => format!("http://{addr}").parse()?,
    };
    let mut config = WorkspaceConfig::new(data.join("workspace"), public_url);
    apply_workspace_opts(&mut config, &args.opts);
    apply_secret_key(&mut config, &args.secrets);
    let model = args
        .model
        .clone()
        .or_else(|| config.models.first().cloned())
        .unwrap_or_else(|| "scripted:demo".to_owned());
    config.database_url = args.database_url.clone();
    config.blob_store = blob_store(args.blob_store.as_deref())?;
    config.sandbox_url = args
        .sandbox_url
        .first()
        .cloned()
        .or_else(|| args.assistant_sandbox_url.clone());
    config.sandbox_urls = args.sandbox_url.clone();
    config.default_model = model;
    config.listen = Some(addr);
    config.runner_token = args.runner_token.clone();
    Ok(config)
}
