//! Bootstrap (docs/protocol.md §3): redeem the setup token at `/callback/env`
//! and the run token at `/callback/config`, run the setup script, and work
//! out the run's limits.
//!
//! A token the gateway refuses (401 or 403) ends the turn with
//! `otp_rejected` before any model call; any other failure is
//! `bootstrap_failed`; a setup script exiting non-zero is `setup_failed`.

use std::time::Duration;

use asbx_protocol::callback::{ConfigResponse, EnvResponse, RunLimits};
use asbx_protocol::gateway::{CALLBACK_CONFIG, CALLBACK_ENV, MaxLimits};
use http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::AgentError;
use crate::gateway_client::{GatewayClient, GatewayError};
use crate::tools::{ToolContext, shell};

/// How long one callback may take.
pub(crate) const CALLBACK_TIMEOUT: Duration = Duration::from_secs(60);

/// Bytes of the setup script's output tail kept for the error message.
pub(crate) const SETUP_TAIL_BYTES: usize = 4096;

/// The limits of this run, after clamping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Model calls per run.
    pub max_steps: u32,
    pub max_tool_calls: u32,
    pub tool_timeout: Duration,
    pub tool_output_bytes: usize,
    pub max_duration: Duration,
}

/// `/config` limits clamped to the runner's maximums, which are also the
/// defaults for any limit `/config` leaves out.
pub(crate) fn clamp_limits(max: &MaxLimits, cfg: Option<&RunLimits>) -> Limits {
    let cfg = cfg.copied().unwrap_or_default();
    Limits {
        max_steps: cfg
            .max_steps
            .map_or(max.max_steps, |v| v.min(max.max_steps)),
        max_tool_calls: cfg
            .max_tool_calls
            .map_or(max.max_tool_calls, |v| v.min(max.max_tool_calls)),
        tool_timeout: Duration::from_millis(
            cfg.tool_timeout_ms
                .map_or(max.tool_timeout_ms, |v| v.min(max.tool_timeout_ms)),
        ),
        tool_output_bytes: usize::try_from(
            cfg.tool_output_bytes
                .map_or(max.tool_output_bytes, |v| v.min(max.tool_output_bytes)),
        )
        .unwrap_or(usize::MAX),
        max_duration: Duration::from_millis(
            cfg.max_duration_ms
                .map_or(max.max_duration_ms, |v| v.min(max.max_duration_ms)),
        ),
    }
}

async fn redeem<T: DeserializeOwned>(
    gw: &GatewayClient,
    path: &str,
    token: &str,
    which: &'static str,
) -> Result<T, AgentError> {
    match tokio::time::timeout(CALLBACK_TIMEOUT, gw.get_json::<T>(path, token)).await {
        Err(_) => Err(AgentError::Bootstrap(format!(
            "{path} timed out after {CALLBACK_TIMEOUT:?}"
        ))),
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(map_callback_error(e, path, which)),
    }
}

fn map_callback_error(e: GatewayError, path: &str, which: &'static str) -> AgentError {
    match e.status() {
        Some(StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => AgentError::OtpRejected(which),
        Some(_) | None => AgentError::Bootstrap(format!("{path}: {e}")),
    }
}

/// `GET /callback/env` with the setup token.
pub(crate) async fn redeem_env(
    gw: &GatewayClient,
    otp_setup: &str,
) -> Result<EnvResponse, AgentError> {
    redeem(gw, CALLBACK_ENV, otp_setup, "setup").await
}

/// `GET /callback/config` with the run token.
pub(crate) async fn redeem_config(
    gw: &GatewayClient,
    otp_run: &str,
) -> Result<ConfigResponse, AgentError> {
    redeem(gw, CALLBACK_CONFIG, otp_run, "run").await
}

/// Runs the setup script with bash in the working directory, with the `/env`
/// variables, bounded by `timeout`.
pub(crate) async fn run_setup(
    ctx: &ToolContext,
    script: &str,
    timeout: Duration,
) -> Result<(), AgentError> {
    let out = shell::run_process(ctx, script, timeout, (SETUP_TAIL_BYTES, true), None)
        .await
        .map_err(|e| AgentError::SetupFailed {
            status: "not started".into(),
            tail: e.to_string(),
        })?;
    if out.exit_code == Some(0) {
        return Ok(());
    }
    let status = match (out.killed.is_some(), out.exit_code, out.signal) {
        (true, _, _) => format!("timed out after {} ms", timeout.as_millis()),
        (false, Some(c), _) => format!("exit code {c}"),
        (false, None, Some(s)) => format!("killed by signal {s}"),
        (false, None, None) => "unknown status".into(),
    };
    let mut tail = String::new();
    if !out.stdout.is_empty() {
        tail.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    if !out.stderr.is_empty() {
        if !tail.is_empty() && !tail.ends_with('\n') {
            tail.push('\n');
        }
        tail.push_str(&String::from_utf8_lossy(&out.stderr));
    }
    let tail = tail.trim_end();
    let tail = if tail.is_empty() {
        "(no output)".to_owned()
    } else {
        tail.to_owned()
    };
    Err(AgentError::SetupFailed { status, tail })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_clamped_and_defaulted() {
        let max = MaxLimits::default();
        let l = clamp_limits(&max, None);
        assert_eq!(l.max_steps, max.max_steps);
        let cfg = RunLimits {
            max_steps: Some(5),
            max_tool_calls: Some(1_000_000),
            tool_timeout_ms: None,
            tool_output_bytes: Some(10),
            max_duration_ms: Some(u64::MAX),
        };
        let l = clamp_limits(&max, Some(&cfg));
        assert_eq!(l.max_steps, 5);
        assert_eq!(l.max_tool_calls, max.max_tool_calls);
        assert_eq!(l.tool_timeout, Duration::from_millis(max.tool_timeout_ms));
        assert_eq!(l.tool_output_bytes, 10);
        assert_eq!(l.max_duration, Duration::from_millis(max.max_duration_ms));
    }
}
