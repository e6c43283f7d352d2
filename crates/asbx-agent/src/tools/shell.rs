//! `shell`: `bash -c <command>` in the working directory.
//!
//! The command gets a clean, minimal environment (`PATH`, `HOME` = the
//! working directory, `LANG`, `TMPDIR`) plus the `/env` variables, a null
//! stdin and piped stdout/stderr: the agent's own stdio (the NDJSON channel)
//! is never inherited. It runs in its own process group, as the tool user when
//! the jail provides one. On timeout, or when the call is abandoned (the run's
//! duration limit), the whole group is killed with SIGKILL. After a normal
//! exit, background processes are left alone and their pipes are drained for
//! at most [`DRAIN_TIMEOUT`].

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use asbx_protocol::line::OutputStream;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::{DISPLAY_BYTES, ToolContext, ToolOutput, cut};
use crate::emit::Emitter;

/// How long pipes are drained after the shell exits.
pub const DRAIN_TIMEOUT: Duration = Duration::from_millis(500);

/// The `PATH` tools get.
pub const TOOL_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Builds the minimal environment for tool processes (also the setup script).
pub fn base_env(ctx_workdir: &std::path::Path) -> Vec<(String, String)> {
    vec![
        ("PATH".into(), TOOL_PATH.into()),
        ("HOME".into(), ctx_workdir.display().to_string()),
        ("LANG".into(), "C.UTF-8".into()),
        ("TMPDIR".into(), "/tmp".into()),
    ]
}

/// Kills a process group when dropped, unless disarmed.
#[derive(Debug)]
pub struct GroupKill {
    pgid: Option<Pid>,
}

impl GroupKill {
    pub fn new(pid: Option<u32>) -> Self {
        GroupKill {
            pgid: pid.and_then(|p| i32::try_from(p).ok()).map(Pid::from_raw),
        }
    }

    pub fn kill(&mut self) {
        if let Some(pgid) = self.pgid.take()
            && let Err(e) = killpg(pgid, Signal::SIGKILL)
        {
            tracing::debug!("killpg {pgid}: {e}");
        }
    }

    pub fn disarm(&mut self) {
        self.pgid = None;
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Output of one stream: the first (or last) `cap` bytes and the total seen.
#[derive(Debug, Default)]
struct Capture {
    bytes: Vec<u8>,
    total: usize,
}

/// The result of a child run by [`run_process`].
#[derive(Debug)]
pub struct ProcessOutput {
    /// `None` when it was killed for timing out.
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stdout_total: usize,
    pub stderr: Vec<u8>,
    pub stderr_total: usize,
    pub timed_out: bool,
}

/// Errors starting a child.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot run as uid {uid} gid {gid}: {source}")]
    User {
        uid: u32,
        gid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start bash: {0}")]
    Spawn(#[source] std::io::Error),
}

/// Runs `bash -c script` under the shell rules, capturing at most `cap` bytes per
/// stream, streaming chunks as `stdout` lines when `stream_to` is set.
pub async fn run_process(
    ctx: &ToolContext,
    script: &str,
    timeout: Duration,
    cap: usize,
    keep_tail: bool,
    stream_to: Option<(Emitter, String)>,
) -> Result<ProcessOutput, SpawnError> {
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg("-c")
        .arg(script)
        .current_dir(&ctx.workdir)
        .env_clear()
        .envs(base_env(&ctx.workdir))
        .envs(&ctx.variables)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some((uid, gid)) = ctx.tool_user {
        cmd.uid(uid).gid(gid);
    }
    let mut child = cmd.spawn().map_err(|source| match ctx.tool_user {
        Some((uid, gid)) if source.kind() == std::io::ErrorKind::PermissionDenied => {
            SpawnError::User { uid, gid, source }
        }
        Some(_) | None => SpawnError::Spawn(source),
    })?;
    let mut group = GroupKill::new(child.id());
    let out = Arc::new(Mutex::new(Capture::default()));
    let err = Arc::new(Mutex::new(Capture::default()));
    let mut readers = Vec::new();
    if let Some(s) = child.stdout.take() {
        readers.push(tokio::spawn(pump(
            s,
            out.clone(),
            (cap, keep_tail),
            stream_to.clone(),
            OutputStream::Stdout,
        )));
    }
    if let Some(s) = child.stderr.take() {
        readers.push(tokio::spawn(pump(
            s,
            err.clone(),
            (cap, keep_tail),
            stream_to,
            OutputStream::Stderr,
        )));
    }
    let status = tokio::select! {
        s = child.wait() => Some(s),
        _ = tokio::time::sleep(timeout) => None,
    };
    let timed_out = status.is_none();
    if timed_out {
        group.kill();
        let _ = child.wait().await;
    } else {
        group.disarm();
    }
    let drain = async {
        for r in &mut readers {
            let _ = r.await;
        }
    };
    if tokio::time::timeout(DRAIN_TIMEOUT, drain).await.is_err() {
        for r in &readers {
            r.abort();
        }
    }
    let (exit_code, signal) = match status {
        Some(Ok(s)) => {
            use std::os::unix::process::ExitStatusExt;
            (s.code(), s.signal())
        }
        Some(Err(_)) | None => (None, None),
    };
    let take = |c: &Arc<Mutex<Capture>>| match c.lock() {
        Ok(mut g) => (std::mem::take(&mut g.bytes), g.total),
        Err(_) => (Vec::new(), 0),
    };
    let (stdout, stdout_total) = take(&out);
    let (stderr, stderr_total) = take(&err);
    Ok(ProcessOutput {
        exit_code,
        signal,
        stdout,
        stdout_total,
        stderr,
        stderr_total,
        timed_out,
    })
}

async fn pump(
    mut r: impl AsyncRead + Unpin,
    capture: Arc<Mutex<Capture>>,
    (cap, keep_tail): (usize, bool),
    stream_to: Option<(Emitter, String)>,
    stream: OutputStream,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    let mut streamed = 0usize;
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let data = &buf[..n];
        if let Ok(mut c) = capture.lock() {
            if keep_tail {
                c.bytes.extend_from_slice(data);
                let excess = c.bytes.len().saturating_sub(cap);
                c.bytes.drain(..excess);
            } else {
                let room = cap.saturating_sub(c.bytes.len());
                c.bytes.extend_from_slice(&data[..room.min(n)]);
            }
            c.total += n;
        }
        // Live output is bounded like the captured output.
        if let Some((emitter, step_id)) = &stream_to
            && streamed < cap
        {
            let take = (cap - streamed).min(n);
            streamed += take;
            pending.extend_from_slice(&data[..take]);
            let text = take_utf8(&mut pending);
            if let Err(e) = emitter.tool_output(step_id, stream, &text).await {
                tracing::debug!("cannot write stdout line: {e}");
            }
        }
    }
    if let Some((emitter, step_id)) = &stream_to
        && !pending.is_empty()
    {
        let text = String::from_utf8_lossy(&pending).into_owned();
        let _ = emitter.tool_output(step_id, stream, &text).await;
    }
}

/// Takes the longest decodable prefix of `pending`, keeping an incomplete
/// trailing UTF-8 sequence for the next chunk; invalid bytes become U+FFFD.
pub fn take_utf8(pending: &mut Vec<u8>) -> String {
    let keep = match std::str::from_utf8(pending) {
        Ok(_) => 0,
        Err(e) if e.error_len().is_none() => pending.len() - e.valid_up_to(),
        Err(_) => {
            // Invalid bytes inside: find an incomplete tail, if any.
            let tail_start = pending.len().saturating_sub(3);
            (tail_start..pending.len())
                .find(|&i| {
                    let b = pending[i];
                    b >= 0xC0
                        && std::str::from_utf8(&pending[i..])
                            .is_err_and(|e| e.error_len().is_none())
                })
                .map_or(0, |i| pending.len() - i)
        }
    };
    let rest = pending.split_off(pending.len() - keep);
    let text = String::from_utf8_lossy(pending).into_owned();
    *pending = rest;
    text
}

/// The `shell` tool.
pub async fn run(ctx: &ToolContext, step_id: &str, command: &str) -> ToolOutput {
    let stream_to = ctx
        .emitter
        .is_v2()
        .then(|| (ctx.emitter.clone(), step_id.to_owned()));
    let cap = ctx.output_bytes;
    let out = match run_process(ctx, command, ctx.timeout, cap, false, stream_to).await {
        Ok(o) => o,
        Err(e) => return ToolOutput::failed(e.to_string()),
    };
    if out.timed_out {
        let mut msg = format!(
            "command timed out after {} ms and was killed",
            ctx.timeout.as_millis()
        );
        let partial = cut(&out.stdout, out.stdout_total, DISPLAY_BYTES);
        if !partial.is_empty() {
            msg.push_str(&format!("; output so far: {partial}"));
        }
        let model_text = format!(
            "error: command timed out after {} ms and was killed\nstdout:\n{}\nstderr:\n{}",
            ctx.timeout.as_millis(),
            cut(&out.stdout, out.stdout_total, cap / 2),
            cut(&out.stderr, out.stderr_total, cap / 2),
        );
        return ToolOutput {
            model_text,
            display: Err(msg),
        };
    }
    let code_text = match (out.exit_code, out.signal) {
        (Some(c), _) => c.to_string(),
        (None, Some(s)) => format!("killed by signal {s}"),
        (None, None) => "unknown".into(),
    };
    // Half the budget each, so a flood on one stream cannot hide the other.
    let model_text = format!(
        "exit code: {code_text}\nstdout:\n{}\nstderr:\n{}",
        cut(&out.stdout, out.stdout_total, cap / 2),
        cut(&out.stderr, out.stderr_total, cap / 2),
    );
    let display = json!({
        "exitCode": out.exit_code,
        "stdout": cut(&out.stdout, out.stdout_total, DISPLAY_BYTES.min(cap / 2)),
        "stderr": cut(&out.stderr, out.stderr_total, DISPLAY_BYTES.min(cap / 2)),
    });
    ToolOutput {
        model_text,
        display: Ok(display),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_carry_over() {
        let bytes = "héllo".as_bytes();
        let mut p = bytes[..2].to_vec();
        assert_eq!(take_utf8(&mut p), "h");
        p.extend_from_slice(&bytes[2..]);
        assert_eq!(take_utf8(&mut p), "éllo");
        assert!(p.is_empty());
        let mut p = vec![b'a', 0xff, b'b'];
        assert_eq!(take_utf8(&mut p), "a\u{fffd}b");
    }
}
