//! The subcommands that run on the async runtime, one file each: `up`,
//! `runner`, `workspace`, `run`, `key`, `gc`, `quota`, `audit`; [`shared`] holds what they
//! share. `agent` and `jail` run before any runtime exists
//! (`crate::sandbox_cmd`).

mod audit;
mod gc;
mod key;
mod quota;
mod run;
mod runner;
mod shared;
mod up;
mod workspace;

pub(crate) use runner::{layer_report, sandbox_exe};
pub(crate) use shared::FDS_PER_SANDBOX;

use std::process::ExitCode;

use anyhow::bail;

use crate::cli::Command;

/// Runs one of the runtime's subcommands to its end.
pub(crate) async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Up(args) => up::run(args).await,
        Command::Runner(args) => runner::run(args).await,
        Command::Workspace(args) => workspace::run(args).await,
        Command::Run(args) => run::run(args).await,
        Command::Key(args) => key::run(args).await,
        Command::Gc(args) => gc::run(args).await,
        Command::Quota(args) => quota::run(args).await,
        Command::Audit(command) => audit::run(command).await,
        Command::Agent | Command::Jail(_) | Command::EnvVars | Command::Doctor(_) => {
            bail!("internal subcommand reached the runtime")
        }
    }
}
