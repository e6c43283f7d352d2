//! The `asbx` command. Thin: parse arguments, set up logging, pick the
//! subcommand, turn the final error into an exit code.
//!
//! `agent` and `jail` run before any async runtime exists: the jail must be a
//! single-threaded process when it creates namespaces.

mod cli;
mod cmd;
mod doctor;
mod listen;
mod otel;
mod providers;
mod sandbox_cmd;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Agent => sandbox_cmd::agent(),
        Command::Jail(args) if args.zygote => sandbox_cmd::zygote(),
        Command::Jail(args) => sandbox_cmd::jail(args.policy, args.check, &args.profile),
        // Before any runtime: the layer probes run as a child process.
        Command::Doctor(args) => doctor::run(&args),
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
            let service = match &command {
                Command::Up(_) => Some("asbx"),
                Command::Runner(_) => Some("asbx-runner"),
                Command::Workspace(_) => Some("asbx-workspace"),
                _ => None,
            };
            // The operator's reports print to stdout; their log is what
            // needs attention, not the workspace opening (a new secret key
            // file excepted: it must be backed up).
            let default_log = match &command {
                Command::Quota(_) | Command::Audit(_) => "warn,asbx_workspace::secrets=info",
                _ => "info",
            };
            let traces = init_tracing(rt.handle(), service, default_log);
            let code = match rt.block_on(cmd::run(command)) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("asbx: {e}");
                    for cause in e.chain().skip(1) {
                        eprintln!("  caused by: {cause}");
                    }
                    ExitCode::from(1)
                }
            };
            if let Some(provider) = traces {
                otel::shutdown(&provider);
            }
            code
        }
    }
}

/// Logs to stderr (`ASBX_LOG`, else `default_log`), and, for the servers when the environment
/// asks for it (`otel::wanted`), OpenTelemetry traces of the runner's and
/// the workspace's spans; the provider is returned for the flush at exit.
fn init_tracing(
    rt: &tokio::runtime::Handle,
    service: Option<&'static str>,
    default_log: &'static str,
) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("ASBX_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_log))
    };
    let provider = match service.filter(|_| otel::wanted()) {
        Some(name) => match otel::provider(rt, name) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("asbx: OpenTelemetry traces are off: {e}");
                None
            }
        },
        None => None,
    };
    let Some(provider) = provider else {
        tracing_subscriber::fmt()
            .with_env_filter(filter())
            .with_writer(std::io::stderr)
            .init();
        return None;
    };
    // Each layer its own filter: the log level does not decide which spans
    // are exported, and the exported ones are the runner's and the
    // workspace's own (the spans of a turn), not every library's.
    let spans = tracing_subscriber::filter::Targets::new()
        .with_target("asbx_runner", tracing::Level::INFO)
        .with_target("asbx_workspace", tracing::Level::INFO);
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(filter()),
        )
        .with(otel::layer(&provider).with_filter(spans))
        .init();
    asbx_runner::enable_traces();
    asbx_workspace::enable_traces();
    Some(provider)
}
