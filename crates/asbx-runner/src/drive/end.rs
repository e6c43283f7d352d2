//! How a turn ended, as the runner saw it, and everything that follows
//! from that one value: how long the sandbox may take to exit, the
//! `error` line the runner writes, the `session_ended` reason and the
//! dispatch metric's labels.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use asbx_protocol::codes;
use asbx_protocol::session::{EndReason, TerminatedBy};

use crate::session::CancelCause;

/// How long an agent may linger after its terminal line.
pub(super) const EXIT_GRACE: Duration = Duration::from_secs(5);
/// How long a sandbox whose stdout closed gets to report its exit.
const CRASH_GRACE: Duration = Duration::from_secs(2);

/// How the turn ended, as the runner saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// The agent wrote `result`.
    Result,
    /// The agent wrote `error`.
    AgentError,
    /// The agent's stdout closed without a terminal line.
    Crashed,
    Cancelled(CancelCause),
    Cap,
}

impl End {
    /// How long the sandbox may take to end on its own before it is
    /// killed; `None`: killed at once.
    pub(super) fn exit_grace(self) -> Option<Duration> {
        match self {
            End::Result | End::AgentError => Some(EXIT_GRACE),
            End::Crashed => Some(CRASH_GRACE),
            End::Cancelled(_) | End::Cap => None,
        }
    }

    /// The `code` of the `error` line the runner writes itself (the agent
    /// wrote its own terminal line otherwise).
    pub(super) fn runner_code(self) -> Option<&'static str> {
        match self {
            End::Result | End::AgentError => None,
            End::Crashed => Some(codes::SANDBOX_CRASHED),
            End::Cancelled(_) => Some(codes::CANCELLED),
            End::Cap => Some(codes::RUNTIME_CAP_EXCEEDED),
        }
    }

    /// The termination's `message`: the agent's error, or what the runner
    /// saw (the exit and the last stderr line of a crash).
    pub(super) fn message(
        self,
        agent_error: Option<&str>,
        exit_code: Option<i32>,
        signal: Option<i32>,
        last_stderr: Option<&str>,
    ) -> Option<String> {
        match self {
            End::Result => None,
            End::AgentError => Some(
                agent_error
                    .unwrap_or("the agent reported an error")
                    .to_owned(),
            ),
            End::Crashed => Some(crash_message(exit_code, signal, last_stderr)),
            End::Cancelled(CancelCause::ClientGone) => Some("the client went away".to_owned()),
            End::Cancelled(CancelCause::Deleted) => Some("the session was cancelled".to_owned()),
            End::Cap => Some("the sandbox ran past the runtime cap and was killed".to_owned()),
        }
    }

    /// The termination's reason and who ended the session.
    pub(super) fn reason(self) -> (EndReason, TerminatedBy) {
        match self {
            End::Result => (EndReason::Completed, TerminatedBy::Agent),
            End::AgentError | End::Crashed => (EndReason::Error, TerminatedBy::Agent),
            End::Cancelled(_) | End::Cap => (EndReason::Terminated, TerminatedBy::Daemon),
        }
    }

    /// The dispatch metric's `outcome` and `code` labels; `agent_code` is
    /// the agent's error line's [`metric_code`].
    pub(super) fn metric_labels(self, agent_code: &'static str) -> (&'static str, &'static str) {
        let outcome = match self {
            End::Result => "completed",
            End::AgentError => "agent_error",
            End::Crashed => "crashed",
            End::Cancelled(_) => "cancelled",
            End::Cap => "runtime_cap",
        };
        let code = match self {
            End::Result => "none",
            End::AgentError => agent_code,
            End::Crashed | End::Cancelled(_) | End::Cap => self.runner_code().unwrap_or("none"),
        };
        (outcome, code)
    }
}

/// The `code` label of an agent's error: one of the [`asbx_protocol::ErrorCode`]s,
/// [`OTHER_CODE`] for any other (an agent may use its own codes; the label
/// set stays bounded).
pub(super) fn metric_code(code: Option<&str>) -> &'static str {
    code.and_then(asbx_protocol::ErrorCode::parse)
        .map_or(OTHER_CODE, asbx_protocol::ErrorCode::as_str)
}

/// [`metric_code`] of a code that is none of ours.
pub(super) const OTHER_CODE: &str = "other";

/// The exit code and signal of the sandbox's supervisor.
pub(super) fn decode_status(
    status: Option<std::process::ExitStatus>,
) -> (Option<i32>, Option<i32>) {
    match status {
        None => (None, None),
        Some(s) => match (s.code(), s.signal()) {
            // `asbx jail` reports a sandbox killed by signal N as 128 + N.
            (Some(c), _) if (129..=128 + 64).contains(&c) => (None, Some(c - 128)),
            (Some(c), _) => (Some(c), None),
            (None, sig) => (None, sig),
        },
    }
}

fn crash_message(code: Option<i32>, signal: Option<i32>, last: Option<&str>) -> String {
    let how = match (code, signal) {
        (Some(c), _) if c == i32::from(asbx_protocol::exit::SETUP_FAILED) => {
            format!("could not be set up (exit code {c})")
        }
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        (None, None) => "ended".to_owned(),
    };
    match last {
        Some(l) if !l.is_empty() => {
            format!("the sandbox {how} before finishing the turn; last stderr line: {l}")
        }
        _ => format!("the sandbox {how} before finishing the turn"),
    }
}
