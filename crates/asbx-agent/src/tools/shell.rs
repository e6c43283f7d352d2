//! `shell`: `bash -c <command>` in the working directory.
//!
//! The command starts under the rules of [`super::process`]: a clean,
//! minimal environment plus the `/env` variables, a null stdin and piped
//! stdout/stderr (the agent's own stdio, the NDJSON channel, is never
//! inherited), its own process group, the tool user and the `tools` cgroup
//! when the jail provides them. On timeout, or when the call is abandoned
//! (the run's duration limit), the command and everything it started are
//! killed ([`Reaper`]) and the step says how. A command that exits non-zero
//! (or is killed by a signal) is a failed step whose `error` names the exit
//! code and whose `result` keeps its output; the model gets that output
//! either way. After a normal exit,
//! background processes are left alone and their pipes are drained for at
//! most [`DRAIN_TIMEOUT`].

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use asbx_protocol::line::OutputStream;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::context::{DISPLAY_BYTES, Failure, ToolContext, ToolOutput, cut};
use super::process::{self, Killed, Reaper, Slot};
use crate::emit::Emitter;

/// How long pipes are drained after the shell exits.
const DRAIN_TIMEOUT: Duration = Duration::from_millis(500);

/// Output of one stream: the first (or last) `cap` bytes and the total seen.
#[derive(Debug, Default)]
struct Capture {
    bytes: Vec<u8>,
    total: usize,
}

/// The result of a child run by [`run_process`].
#[derive(Debug)]
pub(crate) struct ProcessOutput {
    /// `None` when it was killed for timing out.
    pub(crate) exit_code: Option<i32>,
    pub(crate) signal: Option<i32>,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stdout_total: usize,
    pub(crate) stderr: Vec<u8>,
    pub(crate) stderr_total: usize,
    /// Set when it timed out: how it and what it started were killed.
    pub(crate) killed: Option<Killed>,
}

/// Errors starting a child.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpawnError {
    #[error("cannot run as uid {uid} gid {gid}: {source}")]
    User {
        uid: u32,
        gid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start bash: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("{0}")]
    Cgroup(String),
}

/// Runs `bash -c script` under the tool rules, capturing at most `cap` bytes
/// per stream, streaming chunks as `stdout` lines when `stream_to` is set.
pub(crate) async fn run_process(
    ctx: &ToolContext,
    script: &str,
    timeout: Duration,
    (cap, keep_tail): (usize, bool),
    stream_to: Option<(Emitter, String)>,
) -> Result<ProcessOutput, SpawnError> {
    let (mut child, cgroup) = spawn_bash(ctx, script)?;
    let mut reaper = Reaper::new(child.id(), cgroup, ctx.tool_user.map(|(uid, _)| uid));
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
    let (status, killed) = wait_or_kill(&mut child, &mut reaper, timeout).await;
    drain(&mut readers).await;
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
        killed,
    })
}

/// Starts `bash -c script` under the tool rules: its own uid and cgroup,
/// the tool environment, stdout and stderr piped.
fn spawn_bash(
    ctx: &ToolContext,
    script: &str,
) -> Result<(tokio::process::Child, Option<process::ChildCgroup>), SpawnError> {
    let args = ["-c".to_owned(), script.to_owned()];
    let (mut cmd, cgroup) =
        process::command("bash", &args, Slot::Tools, ctx.tool_user, &ctx.cgroup_root)
            .map_err(SpawnError::Cgroup)?;
    cmd.current_dir(&ctx.workdir)
        .env_clear()
        .envs(process::base_env(&ctx.workdir))
        .envs(&ctx.variables)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child =
        crate::orphans::spawn(|| cmd.spawn(), tokio::process::Child::id).map_err(|source| {
            if let Some(why) = process::join_failure(&source, cgroup.as_ref()) {
                return SpawnError::Cgroup(why);
            }
            match ctx.tool_user {
                Some((uid, gid)) if source.kind() == std::io::ErrorKind::PermissionDenied => {
                    SpawnError::User { uid, gid, source }
                }
                Some(_) | None => SpawnError::Spawn(source),
            }
        })?;
    Ok((child, cgroup))
}

/// Waits for the process until `timeout`, then kills its whole tree; the
/// exit status (none after a kill) and what the kill found.
async fn wait_or_kill(
    child: &mut tokio::process::Child,
    reaper: &mut Reaper,
    timeout: Duration,
) -> (
    Option<std::io::Result<std::process::ExitStatus>>,
    Option<Killed>,
) {
    let status = tokio::select! {
        s = child.wait() => Some(s),
        _ = tokio::time::sleep(timeout) => None,
    };
    let killed = match status {
        None => {
            let killed = reaper.kill().await;
            let _ = child.wait().await;
            if killed.left > 0 || killed.error.is_some() || killed.blind {
                tracing::warn!("timed-out tool: {killed}");
            }
            Some(killed)
        }
        Some(_) => {
            reaper.disarm();
            None
        }
    };
    (status, killed)
}

/// Lets the readers finish, at most for [`DRAIN_TIMEOUT`]: grandchildren
/// may hold the pipes open.
async fn drain(readers: &mut [tokio::task::JoinHandle<()>]) {
    let drain = async {
        for r in readers.iter_mut() {
            let _ = r.await;
        }
    };
    if tokio::time::timeout(DRAIN_TIMEOUT, drain).await.is_err() {
        for r in readers.iter() {
            r.abort();
        }
    }
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
fn take_utf8(pending: &mut Vec<u8>) -> String {
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
pub(crate) async fn run(ctx: &ToolContext, step_id: &str, command: &str) -> ToolOutput {
    let stream_to = ctx
        .emitter
        .is_v2()
        .then(|| (ctx.emitter.clone(), step_id.to_owned()));
    let cap = ctx.output_bytes;
    let out = match run_process(ctx, command, ctx.timeout, (cap, false), stream_to).await {
        Ok(o) => o,
        Err(e) => return ToolOutput::failed(e.to_string()),
    };
    if let Some(killed) = &out.killed {
        let what = format!(
            "the tool timed out after {} ms and was killed with everything it started ({killed})",
            ctx.timeout.as_millis()
        );
        let mut msg = what.clone();
        let partial = cut(&out.stdout, out.stdout_total, DISPLAY_BYTES);
        if !partial.is_empty() {
            msg.push_str(&format!("; output so far: {partial}"));
        }
        let model_text = format!(
            "error: {what}\nstdout:\n{}\nstderr:\n{}",
            cut(&out.stdout, out.stdout_total, cap / 2),
            cut(&out.stderr, out.stderr_total, cap / 2),
        );
        return ToolOutput {
            model_text,
            display: Err(msg.into()),
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
    let mut display = json!({
        "exitCode": out.exit_code,
        "stdout": cut(&out.stdout, out.stdout_total, DISPLAY_BYTES.min(cap / 2)),
        "stderr": cut(&out.stderr, out.stderr_total, DISPLAY_BYTES.min(cap / 2)),
    });
    if let Some(sig) = out.signal {
        // Killed by a signal (SIGKILL from the OOM killer, say): say which.
        display["signal"] = json!(sig);
    }
    // A command that did not exit 0 failed: the step says so, naming the
    // exit code (or signal), and still shows what it printed; the model
    // gets the same text as on success, flagged as an error.
    let error = match (out.exit_code, out.signal) {
        (Some(0), _) => None,
        (Some(code), _) => Some(format!("the command exited with code {code}")),
        (None, Some(sig)) => Some(format!("the command was killed by signal {sig}")),
        (None, None) => Some("the command ended without an exit code".to_owned()),
    };
    let display = match error {
        None => Ok(display),
        Some(error) => Err(Failure {
            error,
            result: Some(display),
        }),
    };
    ToolOutput {
        model_text,
        display,
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
