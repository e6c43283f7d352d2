//! One dispatch from spawn to teardown: the task that reads the agent's
//! stdout, validates and stamps each line, enforces the step rules, the
//! runtime cap and cancellation, and records how the session ended.
//!
//! One task owns all of a session's state, so the line path takes no lock.
//! Its stages: [`pump`] the agent's stdout until the turn ends ([`End`]),
//! learn how the sandbox ended ([`sandbox_ended`]), write what the runner
//! owes the client ([`State::finish`]), [`deliver`] the end, [`reap`] the
//! sandbox.

mod end;
mod state;

use std::sync::Arc;
use std::time::{Duration, Instant};

use asbx_protocol::line::SessionLimits;
use asbx_protocol::session::Termination;
use asbx_protocol::{Event, Filter, Protocol};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

use crate::child::SandboxChild;
use crate::session::{CancelCause, Session};
use crate::stderr::StderrReader;
use end::{EXIT_GRACE, End};
use state::State;

/// Protocol 2: a heartbeat after this long without another line.
pub(crate) const HEARTBEAT: Duration = Duration::from_millis(5000);
/// Read buffer sizes: an idle sandbox costs little, a busy one reads big.
const MIN_READ: usize = 1024;
const MAX_READ: usize = 256 * 1024;
/// The agent's stdout pipe while a dispatch reads it.
const PIPE_SIZE: i32 = 1024 * 1024;
/// Protocol 2 holds the agent's first lines until `/config` passed (so
/// `session_init` carries the effective limits), at most this many bytes
/// and at most one heartbeat interval.
const MAX_HELD: usize = 64 * 1024;

/// Everything the task needs, handed over by the `/stream` handler.
pub(crate) struct Drive {
    pub(crate) session: Arc<Session>,
    pub(crate) child: SandboxChild,
    pub(crate) stderr: StderrReader,
    pub(crate) tx: mpsc::Sender<Bytes>,
    pub(crate) protocol: Protocol,
    pub(crate) filter: Option<Filter>,
    pub(crate) deadline: Instant,
    pub(crate) max_line: usize,
    pub(crate) session_limits: SessionLimits,
    /// The dispatch's span (`Span::none()` with traces off) and its
    /// bootstrap child, ended by the agent's first line.
    pub(crate) trace: tracing::Span,
    pub(crate) bootstrap: Option<tracing::Span>,
    /// The working directory to capture when the turn ends (CONTRACT §11).
    pub(crate) workdir: Option<crate::workdir::Workdir>,
}

/// The outcome handed back for teardown.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) termination: Termination,
}

impl Drive {
    pub(crate) async fn run(self) -> Outcome {
        let Drive {
            session,
            mut child,
            stderr,
            tx,
            protocol,
            filter,
            deadline,
            max_line,
            session_limits,
            trace,
            bootstrap,
            workdir,
        } = self;
        let mut st = State::new(
            &session,
            protocol,
            filter,
            max_line,
            session_limits,
            trace,
            bootstrap,
        );
        let mut tx = Some(tx);
        let end = match child.stdout.take() {
            Some(stdout) => {
                // A bigger pipe lets a busy agent run ahead of the runner,
                // whose reads then take more lines per wake-up. Pages are
                // only used while it holds data; best effort.
                let _ = nix::fcntl::fcntl(&stdout, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
                pump(&mut st, stdout, &mut tx, &session, deadline).await
            }
            None => End::Crashed,
        };
        let status = sandbox_ended(end, &mut child).await;
        if let Some(w) = workdir {
            keep_workdir(end, w, &mut child, &session.id).await;
        }
        // The supervisor may still hold stderr: what the sandbox wrote is
        // in the pipe by now.
        let captured = stderr.finish().await;
        let termination = st.finish(end, status, captured);
        deliver(&mut st, tx, &termination).await;
        reap(&mut child).await;
        let (outcome, code) = end.metric_labels(st.agent_code);
        crate::metrics::METRICS.dispatch_ended(outcome, code, st.started.elapsed());
        Outcome { termination }
    }
}

/// Learns how the sandbox ended: as soon as its supervisor reports it
/// (before the sandbox's namespaces are down), or from its exit; killed
/// when the turn was cut short or it takes too long.
async fn sandbox_ended(end: End, child: &mut SandboxChild) -> Option<std::process::ExitStatus> {
    match end.exit_grace() {
        Some(grace) => match tokio::time::timeout(grace, child.ended()).await {
            Ok(s) => s.ok(),
            Err(_) => child.kill_tree().await,
        },
        None => child.kill_tree().await,
    }
}

/// A turn that ended on its own (`result`, or the agent's `error` after
/// it may have written) keeps its working directory: captured once the
/// sandbox's processes are gone, before the end goes out, so the
/// workspace has the snapshot when it learns the turn ended. A cancelled,
/// capped or crashed turn keeps the previous one.
async fn keep_workdir(end: End, w: crate::workdir::Workdir, child: &mut SandboxChild, id: &str) {
    match end {
        // A run that only started from a chat's directory keeps nothing.
        End::Result | End::AgentError if !w.captures() => {}
        End::Result | End::AgentError => {
            reap(child).await;
            if let Err(e) = w.capture_and_send().await {
                tracing::warn!(session = %id, error = %e, "the working directory was not kept");
            }
        }
        End::Crashed | End::Cancelled(_) | End::Cap => {}
    }
}

/// Records the end and sends the last lines: the end is recorded before
/// they go out, so a client that reads the end of the stream and then asks
/// `GET /v1/sessions/{id}` finds it.
async fn deliver(st: &mut State, tx: Option<mpsc::Sender<Bytes>>, termination: &Termination) {
    let session = Arc::clone(&st.session);
    session.end(st.stamper.seq(), termination.clone());
    match tx {
        Some(tx) => flush(st, &tx).await,
        None => {
            // Nobody attached to the stream: the log still gets the end.
            let (_, lines) = st.take();
            session.record(lines);
        }
    }
    session.close_log();
}

/// Makes sure the sandbox is gone (its supervisor reaped), before the
/// caller removes what is left of it.
async fn reap(child: &mut SandboxChild) {
    if tokio::time::timeout(EXIT_GRACE, child.wait())
        .await
        .is_err()
    {
        child.kill_tree().await;
    }
}

/// Reads the agent's stdout until it closes, the turn ends, the client goes
/// away or the cap passes.
async fn pump<R: AsyncRead + Unpin>(
    st: &mut State,
    mut stdout: R,
    tx: &mut Option<mpsc::Sender<Bytes>>,
    session: &Session,
    deadline: Instant,
) -> End {
    // Idle sandboxes are the common case: start small, grow while lines flow.
    let mut chunk = MIN_READ;
    let mut buf = BytesMut::with_capacity(chunk);
    let cap = tokio::time::sleep_until(deadline.into());
    tokio::pin!(cap);
    // Protocol 2: a heartbeat after HEARTBEAT of silence.
    let beats = st.protocol == Protocol::V2;
    let heartbeat = tokio::time::sleep(HEARTBEAT);
    tokio::pin!(heartbeat);
    loop {
        if buf.capacity() - buf.len() < chunk / 2 {
            buf.reserve(chunk);
        }
        tokio::select! {
            biased;
            _ = session.cancel.cancelled() => return End::Cancelled(session.cancel_cause()),
            _ = &mut cap => return End::Cap,
            _ = session.config_seen(), if st.init.is_some() => {
                st.emit_init();
                st.lines(&mut buf);
            }
            _ = &mut heartbeat, if beats => {
                if st.init.is_some() {
                    // `/config` is slow to come: the client hears from the
                    // session all the same, with the runner's ceilings.
                    st.emit_init();
                    st.lines(&mut buf);
                } else {
                    st.emit(Event::Heartbeat(asbx_protocol::line::Heartbeat {}));
                }
            }
            read = stdout.read_buf(&mut buf) => {
                match read {
                    Ok(0) | Err(_) => {
                        // A last line without its newline still counts.
                        st.at_eof(&mut buf);
                        if let Some(t) = tx.as_ref() {
                            flush(st, t).await;
                        }
                        return st.terminal.unwrap_or(End::Crashed);
                    }
                    Ok(n) => {
                        // A read that filled its room means more is waiting.
                        if n >= chunk / 2 {
                            chunk = (chunk * 2).min(MAX_READ);
                        }
                        if st.init.is_some() && buf.len() > MAX_HELD {
                            st.emit_init();
                        }
                        if st.init.is_none() {
                            st.lines(&mut buf);
                        }
                    }
                }
            }
        }
        if st.stamper.has_output() {
            if beats {
                heartbeat
                    .as_mut()
                    .reset(tokio::time::Instant::now() + HEARTBEAT);
            }
            if let Some(end) = send_out(st, tx, session).await {
                return end;
            }
        }
        if let Some(end) = st.terminal {
            if st.protocol == Protocol::V1 {
                // Protocol 1 ends right after `result` or `error`.
                if let Some(t) = tx.take() {
                    flush(st, &t).await;
                }
            }
            return end;
        }
    }
}

/// Records what was stamped and sends it to the client, if one is
/// attached; an end if the session was cancelled meanwhile or (protocol 1)
/// the client went away.
async fn send_out(
    st: &mut State,
    tx: &mut Option<mpsc::Sender<Bytes>>,
    session: &Session,
) -> Option<End> {
    let (chunk, lines) = st.take();
    session.record(lines);
    let t = tx.as_ref()?;
    tokio::select! {
        biased;
        _ = session.cancel.cancelled() => return Some(End::Cancelled(session.cancel_cause())),
        sent = t.send(chunk) => {
            if sent.is_err() {
                if st.protocol == Protocol::V1 {
                    session.cancel(CancelCause::ClientGone);
                    return Some(End::Cancelled(CancelCause::ClientGone));
                }
                // Protocol 2: the session outlives its client for
                // the detach grace; readers resume from the log.
                *tx = None;
            }
        }
    }
    None
}

async fn flush(st: &mut State, tx: &mpsc::Sender<Bytes>) {
    if st.stamper.has_output() {
        let (chunk, lines) = st.take();
        st.session.record(lines);
        let _ = tx.send(chunk).await;
    }
}

#[cfg(test)]
mod tests;
