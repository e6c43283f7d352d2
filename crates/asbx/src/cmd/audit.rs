//! `asbx audit verify [WORKSPACE]`: check each workspace's audit chain in
//! the workspace's database; exits non-zero naming the first broken record.

use std::process::ExitCode;

use anyhow::Context;
use asbx_workspace::Workspace;

use crate::cli::{AuditCommand, AuditVerifyArgs};
use crate::cmd::shared::{one_off_config, print_line};

pub(super) async fn run(command: AuditCommand) -> anyhow::Result<ExitCode> {
    match command {
        AuditCommand::Verify(args) => verify(args).await,
    }
}

async fn verify(args: AuditVerifyArgs) -> anyhow::Result<ExitCode> {
    let config = one_off_config(&args.data, args.database_url, &args.secrets)?;
    let workspace = Workspace::open(config)
        .await
        .context("opening the workspace")?;
    let verdicts = workspace
        .verify_audit(args.workspace.as_deref())
        .await
        .context("reading the audit log")?;
    let mut ok = true;
    for v in &verdicts {
        match &v.broken {
            None => print_line(&format!(
                "workspace {}: {} records, chain intact",
                v.workspace, v.records
            )),
            Some((id, why)) => {
                ok = false;
                print_line(&format!(
                    "workspace {}: record {id} {why} ({} records before it verified)",
                    v.workspace, v.records
                ));
            }
        }
    }
    if verdicts.is_empty() {
        print_line("no audit records");
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
