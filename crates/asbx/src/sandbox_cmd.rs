//! The two commands that run per sandbox, shared by `asbx` and the lean
//! `asbx-sandbox` binary: `jail` (before any runtime exists) and `agent`.

use std::process::ExitCode;

use asbx_protocol::exit;
use asbx_protocol::jail::{JailPolicy, JailProfile};

/// `agent`: seal the capabilities tools must not inherit, then run the loop.
pub(crate) fn agent() -> ExitCode {
    ExitCode::from(agent_in_jail())
}

/// The agent as a jail's main process: `asbx agent`, or forked in process
/// for a policy with `entry: agent` (no `execve`).
fn agent_in_jail() -> u8 {
    // Inside a jail the agent holds CAP_SETUID/CAP_SETGID (to start tools as
    // their own uid); sealing keeps them from its tools.
    if let Err(e) = asbx_jail::seal_agent() {
        eprintln!("asbx agent: {e}");
        return exit::SETUP_FAILED;
    }
    asbx_agent::agent_main()
}

/// `jail --zygote`: fork supervisors for the runner, each running a policy
/// the runner sends, until the runner closes the socket (`asbx_jail::Zygote`).
pub(crate) fn zygote() -> ExitCode {
    ExitCode::from(u8::try_from(asbx_jail::serve_zygote(Some(agent_in_jail))).unwrap_or(1))
}

/// `jail --policy JSON` or `jail --check [--profile NAME]`.
pub(crate) fn jail(policy: Option<String>, check: bool, profile: &str) -> ExitCode {
    let Some(profile) = JailProfile::parse(profile) else {
        eprintln!("asbx jail: unknown jail profile {profile:?}: strict or namespaces");
        return ExitCode::from(exit::SETUP_FAILED);
    };
    if check {
        let report = asbx_jail::check(profile);
        let ok = report.missing().is_empty();
        match serde_json::to_string(&report) {
            Ok(s) => {
                use std::io::Write;
                let _ = writeln!(std::io::stdout(), "{s}");
            }
            Err(e) => eprintln!("asbx jail: {e}"),
        }
        return if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        };
    }
    let Some(policy) = policy else {
        eprintln!("asbx jail: --policy or --check is required");
        return ExitCode::from(exit::SETUP_FAILED);
    };
    let policy: JailPolicy = match serde_json::from_str(&policy) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("asbx jail: invalid policy: {e}");
            return ExitCode::from(exit::SETUP_FAILED);
        }
    };
    match asbx_jail::run_jail_with(&policy, Some(agent_in_jail)) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(255)),
        Err(e) => {
            eprintln!("asbx jail: {e}");
            ExitCode::from(exit::SETUP_FAILED)
        }
    }
}
