//! The `asbx` command. Thin: parse arguments, set up logging, pick the
//! subcommand, turn the final error into an exit code.
//!
//! `agent` and `jail` run before any async runtime exists: the jail must be a
//! single-threaded process when it creates namespaces.

mod cli;
mod providers;
mod render;
mod sandbox_cmd;
mod serve;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Agent => sandbox_cmd::agent(),
        Command::Jail(args) => sandbox_cmd::jail(args.policy, args.check, &args.profile),
        Command::EnvVars => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            for var in cli::env_vars() {
                if writeln!(out, "{var}").is_err() {
                    break;
                }
            }
            ExitCode::SUCCESS
        }
        command => {
            init_tracing();
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("asbx: could not start the async runtime: {e}");
                    return ExitCode::from(1);
                }
            };
            match rt.block_on(serve::run(command)) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("asbx: {e}");
                    for cause in e.chain().skip(1) {
                        eprintln!("  caused by: {cause}");
                    }
                    ExitCode::from(1)
                }
            }
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ASBX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
