//! `asbx key`: mint a workspace API key (shown once; only its hash is
//! stored), in a new workspace if asked; or revoke one (`--revoke`).

use std::process::ExitCode;

use anyhow::Context;
use asbx_workspace::Workspace;

use crate::cli::KeyArgs;
use crate::cmd::shared::{one_off_config, print_line};

pub(super) async fn run(args: KeyArgs) -> anyhow::Result<ExitCode> {
    let config = one_off_config(&args.data, args.database_url, &args.secrets)?;
    let workspace = Workspace::open(config)
        .await
        .context("opening the workspace")?;
    if let Some(key) = &args.revoke {
        let revoked = workspace
            .revoke_api_key(&args.workspace, key)
            .await
            .with_context(|| format!("revoking a key of workspace {}", args.workspace))?;
        let Some(name) = revoked else {
            anyhow::bail!(
                "workspace {} has no unrevoked key matching {key} (or several do)",
                args.workspace
            );
        };
        print_line(&format!(
            "revoked key {name:?} of workspace {}",
            args.workspace
        ));
        return Ok(ExitCode::SUCCESS);
    }
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
