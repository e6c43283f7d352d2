//! `asbx-sandbox`: the lean binary the runner starts for every sandbox.
//!
//! `asbx-sandbox jail --policy JSON`, `asbx-sandbox jail --check --profile P`,
//! `asbx-sandbox jail --zygote` and `asbx-sandbox agent`, the same as the hidden `asbx` subcommands, but
//! without the workspace, the runner or clap linked in: every sandbox
//! process maps and relocates a much smaller image.

#[path = "../sandbox_cmd.rs"]
mod sandbox_cmd;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("agent") if args.len() == 1 => sandbox_cmd::agent(),
        // `--zygote` and the room for its children's titles.
        Some("jail") if args.len() <= 3 && args.get(1).is_some_and(|a| a == "--zygote") => {
            sandbox_cmd::zygote()
        }
        Some("jail") => {
            let mut policy = None;
            let mut check = false;
            let mut profile = asbx_protocol::jail::JailProfile::Strict.as_str().to_owned();
            let mut rest = args[1..].iter();
            while let Some(a) = rest.next() {
                match a.as_str() {
                    "--policy" => policy = rest.next().cloned(),
                    "--check" => check = true,
                    "--profile" => profile = rest.next().cloned().unwrap_or_default(),
                    other => {
                        eprintln!("asbx-sandbox: unknown argument {other:?}");
                        return ExitCode::from(asbx_protocol::exit::SETUP_FAILED);
                    }
                }
            }
            sandbox_cmd::jail(policy, check, &profile)
        }
        _ => {
            eprintln!(
                "usage: asbx-sandbox agent | jail --policy JSON | jail --check [--profile P] | jail --zygote"
            );
            ExitCode::from(asbx_protocol::exit::USAGE)
        }
    }
}
