//! `asbx gc`: free the file bytes no file refers to any more (a running
//! workspace also does it hourly).

use std::process::ExitCode;

use anyhow::Context;
use asbx_workspace::Workspace;

use crate::cli::GcArgs;
use crate::cmd::shared::{blob_store, one_off_config, print_line};

pub(super) async fn run(args: GcArgs) -> anyhow::Result<ExitCode> {
    let mut config = one_off_config(&args.data, args.database_url, &args.secrets)?;
    config.blob_store = blob_store(args.blob_store.as_deref())?;
    let workspace = Workspace::open(config)
        .await
        .context("opening the workspace")?;
    let freed = workspace.collect_garbage().await?;
    print_line(&format!("freed {freed} blobs no file refers to"));
    Ok(ExitCode::SUCCESS)
}
