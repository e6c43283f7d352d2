//! `asbx quota set WORKSPACE --NAME VALUE ...` and `asbx quota show
//! WORKSPACE`: a workspace's quota overrides, in the same database the
//! workspace uses (CONTRACT.md §10).

use std::process::ExitCode;

use anyhow::{Context, bail};
use asbx_workspace::{Quota, Workspace};

use crate::cli::{OneOffDb, QuotaAction, QuotaArgs, QuotaSetArgs, QuotaValue};
use crate::cmd::shared::{one_off_config, print_line};

pub(super) async fn run(args: QuotaArgs) -> anyhow::Result<ExitCode> {
    match args.action {
        QuotaAction::Set(set) => {
            let workspace = open(&set.db).await?;
            let changes = changes(&set);
            if changes.is_empty() {
                bail!("name at least one quota to set, for example --concurrent-sandboxes 4");
            }
            for (quota, value) in changes {
                let value = match value {
                    QuotaValue::Limit(n) => Some(Some(n)),
                    QuotaValue::Unlimited => Some(None),
                    QuotaValue::Default => None,
                };
                workspace
                    .set_quota(&set.workspace, quota, value)
                    .await
                    .with_context(|| format!("setting {quota} of workspace {}", set.workspace))?;
            }
            show(&workspace, &set.workspace).await
        }
        QuotaAction::Show(args) => show(&open(&args.db).await?, &args.workspace).await,
    }
}

async fn open(db: &OneOffDb) -> anyhow::Result<Workspace> {
    let config = one_off_config(&db.data, db.database_url.clone(), &db.secrets)?;
    Workspace::open(config)
        .await
        .context("opening the workspace")
}

fn changes(set: &QuotaSetArgs) -> Vec<(Quota, QuotaValue)> {
    [
        (Quota::ConcurrentSandboxes, set.concurrent_sandboxes),
        (Quota::RequestsPerMinute, set.requests_per_minute),
        (Quota::SandboxSecondsPerDay, set.sandbox_seconds_per_day),
        (Quota::TokensPerDay, set.tokens_per_day),
        (Quota::StorageMb, set.storage_mb),
    ]
    .into_iter()
    .filter_map(|(q, v)| v.map(|v| (q, v)))
    .collect()
}

/// Prints one line per quota: its name, its stored override (or
/// `default`), and what the workspace used. The server's defaults come
/// from its own environment (`ASBX_QUOTA_*`), which this command doesn't
/// see, so a quota without an override shows `default`.
async fn show(workspace: &Workspace, id: &str) -> anyhow::Result<ExitCode> {
    let (usage, overridden) = workspace
        .quota_report(id)
        .await
        .with_context(|| format!("reading the quotas of workspace {id}"))?;
    print_line(&format!("workspace {id}"));
    for quota in Quota::ALL {
        let name = quota.name();
        let value = if overridden.contains(&quota) {
            match usage["quotas"][name].as_u64() {
                Some(n) => n.to_string(),
                None => "unlimited".to_owned(),
            }
        } else {
            "default".to_owned()
        };
        let used = used_text(quota, usage["used"][name].as_f64().unwrap_or(0.0));
        print_line(&format!("{name:<24} {value:<10} used {used}"));
    }
    Ok(ExitCode::SUCCESS)
}

/// A usage figure as an operator reads it: a count for the counted quotas,
/// megabytes with one decimal for `storage-mb`.
fn used_text(quota: Quota, used: f64) -> String {
    match quota {
        Quota::StorageMb => format!("{used:.1} MB"),
        Quota::ConcurrentSandboxes
        | Quota::RequestsPerMinute
        | Quota::SandboxSecondsPerDay
        | Quota::TokensPerDay => format!("{used:.0}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_prints_counts_and_megabytes_with_one_decimal() {
        assert_eq!(used_text(Quota::StorageMb, 0.0012), "0.0 MB");
        assert_eq!(used_text(Quota::StorageMb, 12.345), "12.3 MB");
        assert_eq!(used_text(Quota::TokensPerDay, 1234.0), "1234");
        assert_eq!(used_text(Quota::SandboxSecondsPerDay, 9.0), "9");
    }
}
