//! One dispatch from spawn to teardown: the task that reads the agent's
//! stdout, validates and stamps each line, enforces the step rules, the
//! runtime cap and cancellation, and records how the session ended.
//!
//! One task owns all of a session's state, so the line path takes no lock.

use std::collections::{HashMap, HashSet};
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::child::SandboxChild;
use asbx_protocol::line::{SessionInit, SessionLimits, Step};
use asbx_protocol::raw::{AgentEvent, AgentKind};
use asbx_protocol::session::{EndReason, SessionStats, TerminatedBy, Termination};
use asbx_protocol::{Event, Filter, LogLevel, Protocol, StepStatus, codes};
use bytes::{Buf, Bytes, BytesMut};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::session::{CancelCause, Session};
use crate::stamp::Stamper;
use crate::stderr::StderrCapture;

/// Warnings about dropped lines sent per session before they are only counted.
const MAX_DROP_WARNINGS: u32 = 16;
/// How long an agent may linger after its terminal line.
const EXIT_GRACE: Duration = Duration::from_secs(5);
/// How long a supervisor gets between SIGTERM and SIGKILL.
const KILL_GRACE: Duration = Duration::from_millis(500);
/// Protocol 2: a heartbeat after this long without another line.
pub(crate) const HEARTBEAT: Duration = Duration::from_millis(5000);
/// Read buffer sizes: an idle sandbox costs little, a busy one reads big.
const MIN_READ: usize = 1024;
const MAX_READ: usize = 256 * 1024;
/// The agent's stdout pipe while a dispatch reads it.
const PIPE_SIZE: i32 = 1024 * 1024;
/// Most distinct step ids one session may open.
const MAX_STEPS_TRACKED: usize = 100_000;
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
}

/// How the turn ended, as the runner saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The agent wrote `result`.
    Result,
    /// The agent wrote `error`.
    AgentError,
    /// The agent's stdout closed without a terminal line.
    Crashed,
    Cancelled(CancelCause),
    Cap,
}

/// The outcome handed back for teardown.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) termination: Termination,
}

struct State {
    session: Arc<Session>,
    stamper: Stamper,
    protocol: Protocol,
    filter: Option<Filter>,
    /// Running steps: name, start, span (`Span::none()` with traces off).
    open_steps: HashMap<String, (String, Instant, tracing::Span)>,
    seen_steps: HashSet<String>,
    dropped: u32,
    terminal: Option<End>,
    stats: SessionStats,
    /// Discarding the rest of an over-long line.
    skipping: bool,
    max_line: usize,
    /// Protocol 2: `session_init` until it is written (its limits the
    /// runner's ceilings, clamped by `/config` when it has passed).
    init: Option<SessionInit>,
    /// The message of the agent's `error` line.
    agent_error: Option<String>,
    /// Its `code` as a metric label ([`metric_code`]).
    agent_code: &'static str,
    /// For the metrics: when the dispatch started, whether a line went
    /// out yet, and the `seq` counted so far.
    started: Instant,
    first_sent: bool,
    counted_seq: u64,
    trace: tracing::Span,
    bootstrap: Option<tracing::Span>,
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
        } = self;
        let started = Instant::now();
        let mut stamper = Stamper::new(&session.id);
        if protocol == Protocol::V2 {
            stamper.keep_marks();
        }
        let mut st = State {
            session: Arc::clone(&session),
            stamper,
            protocol,
            filter,
            open_steps: HashMap::new(),
            seen_steps: HashSet::new(),
            dropped: 0,
            terminal: None,
            stats: SessionStats::default(),
            skipping: false,
            max_line,
            init: (protocol == Protocol::V2).then(|| SessionInit {
                protocol_version: 2,
                limits: session_limits,
                encryption: session.crypto().map(|c| c.init().clone()),
            }),
            agent_error: None,
            agent_code: OTHER_CODE,
            started,
            first_sent: false,
            counted_seq: 0,
            trace,
            bootstrap,
        };
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

        // Learn how the sandbox ended: as soon as its supervisor reports it
        // (before the sandbox's namespaces are down), or from its exit.
        let status = match end {
            End::Result | End::AgentError => {
                match tokio::time::timeout(EXIT_GRACE, child.ended()).await {
                    Ok(s) => s.ok(),
                    Err(_) => kill_tree(&mut child).await,
                }
            }
            End::Crashed => {
                match tokio::time::timeout(Duration::from_secs(2), child.ended()).await {
                    Ok(s) => s.ok(),
                    Err(_) => kill_tree(&mut child).await,
                }
            }
            End::Cancelled(_) | End::Cap => kill_tree(&mut child).await,
        };
        // The supervisor may still hold stderr: what the sandbox wrote is
        // in the pipe by now.
        let captured = stderr.finish().await;
        let (exit_code, signal) = decode_status(status);

        // Lines the runner owes the client: session_init if still held,
        // open steps closed, then the terminal line.
        st.emit_init();
        let message = match end {
            End::Result => None,
            End::AgentError => Some(
                st.agent_error
                    .clone()
                    .unwrap_or_else(|| "the agent reported an error".to_owned()),
            ),
            End::Crashed => Some(crash_message(exit_code, signal, captured.last_line())),
            End::Cancelled(CancelCause::ClientGone) => Some("the client went away".to_owned()),
            End::Cancelled(CancelCause::Deleted) => Some("the session was cancelled".to_owned()),
            End::Cap => Some("the sandbox ran past the runtime cap and was killed".to_owned()),
        };
        if let Some(msg) = message.as_ref().filter(|_| end != End::AgentError) {
            st.close_open_steps("the sandbox ended before the step finished");
            let code = match end {
                End::Crashed => codes::SANDBOX_CRASHED,
                End::Cap => codes::RUNTIME_CAP_EXCEEDED,
                _ => codes::CANCELLED,
            };
            st.emit(Event::error(code, msg.clone()));
        }
        st.stats.duration_ms = started.elapsed().as_millis() as u64;
        let usage = session.stats_usage();
        st.stats.steps = usage.model_calls;
        st.stats.input_tokens = usage.input_tokens;
        st.stats.output_tokens = usage.output_tokens;
        let (reason, by) = match end {
            End::Result => (EndReason::Completed, TerminatedBy::Agent),
            End::AgentError | End::Crashed => (EndReason::Error, TerminatedBy::Agent),
            End::Cancelled(_) | End::Cap => (EndReason::Terminated, TerminatedBy::Daemon),
        };
        let termination = Termination {
            reason,
            terminated_by: by,
            message,
            exit_code,
            signal,
            stderr: captured.finish(),
            stats: st.stats.clone(),
        };
        if protocol == Protocol::V2 {
            st.emit(Event::SessionEnded(termination.clone()));
        }
        // Recorded before the last lines go out, so a client that reads the
        // end of the stream and then asks `GET /v1/sessions/{id}` finds it.
        session.end(st.stamper.seq(), termination.clone());
        match tx.take() {
            Some(tx) => flush(&mut st, &tx).await,
            None => {
                // Nobody attached to the stream: the log still gets the end.
                let (_, lines) = st.take();
                session.record(lines);
            }
        }
        session.close_log();
        // Now make sure the sandbox is gone (its supervisor reaped), before
        // the caller removes what is left of it.
        if tokio::time::timeout(EXIT_GRACE, child.wait())
            .await
            .is_err()
        {
            kill_tree(&mut child).await;
        }
        let (outcome, code) = match end {
            End::Result => ("completed", "none"),
            End::AgentError => ("agent_error", st.agent_code),
            End::Crashed => ("crashed", codes::SANDBOX_CRASHED),
            End::Cancelled(_) => ("cancelled", codes::CANCELLED),
            End::Cap => ("runtime_cap", codes::RUNTIME_CAP_EXCEEDED),
        };
        crate::metrics::METRICS.dispatch_ended(outcome, code, started.elapsed());
        Outcome { termination }
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
                        st.emit_init();
                        st.lines(&mut buf);
                        if !buf.is_empty() && !st.skipping {
                            // A last line without its newline still counts.
                            let rest = buf.split().freeze();
                            st.line(&rest);
                        }
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
            let (chunk, lines) = st.take();
            session.record(lines);
            if let Some(t) = tx.as_ref() {
                tokio::select! {
                    biased;
                    _ = session.cancel.cancelled() => return End::Cancelled(session.cancel_cause()),
                    sent = t.send(chunk) => {
                        if sent.is_err() {
                            if st.protocol == Protocol::V1 {
                                session.cancel(CancelCause::ClientGone);
                                return End::Cancelled(CancelCause::ClientGone);
                            }
                            // Protocol 2: the session outlives its client for
                            // the detach grace; readers resume from the log.
                            *tx = None;
                        }
                    }
                }
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

async fn flush(st: &mut State, tx: &mpsc::Sender<Bytes>) {
    if st.stamper.has_output() {
        let (chunk, lines) = st.take();
        st.session.record(lines);
        let _ = tx.send(chunk).await;
    }
}

impl State {
    /// Takes what the stamper wrote, counting its lines and bytes (once per
    /// chunk, not per line) and the time to the first line.
    fn take(&mut self) -> (Bytes, Vec<crate::session::LoggedLine>) {
        let (chunk, lines) = self.stamper.take();
        let seq = self.stamper.seq();
        let m = &crate::metrics::METRICS;
        m.streamed(seq - self.counted_seq, chunk.len());
        self.counted_seq = seq;
        if !self.first_sent && !chunk.is_empty() {
            self.first_sent = true;
            m.first_line(self.started.elapsed());
        }
        (chunk, lines)
    }

    /// Writes `session_init` if it is still held: its limits are the
    /// runner's ceilings clamped by the `/config` limits when those have
    /// passed, and every later line is sealed when the client asked for
    /// encryption (`docs/protocol.md` §4).
    fn emit_init(&mut self) {
        let Some(mut init) = self.init.take() else {
            return;
        };
        if let Some(Some(run)) = self.session.run_limits() {
            let l = &mut init.limits;
            l.max_steps = run.max_steps.map_or(l.max_steps, |v| v.min(l.max_steps));
            l.max_tool_calls = run
                .max_tool_calls
                .map_or(l.max_tool_calls, |v| v.min(l.max_tool_calls));
            l.max_duration_ms = run
                .max_duration_ms
                .map_or(l.max_duration_ms, |v| v.min(l.max_duration_ms));
        }
        self.emit(Event::SessionInit(init));
        if let Some(crypto) = self.session.crypto() {
            self.stamper.encrypt_with(std::sync::Arc::clone(crypto));
        }
    }

    /// Handles every complete line in `buf`, leaving a partial one.
    fn lines(&mut self, buf: &mut BytesMut) {
        if self.skipping {
            match memchr::memchr(b'\n', buf) {
                Some(i) => {
                    buf.advance(i + 1);
                    self.skipping = false;
                }
                None => {
                    buf.clear();
                    return;
                }
            }
        }
        // Lines read together arrived together: one clock read per read,
        // and room for their stamped form reserved once.
        let ts = asbx_protocol::now_ms();
        self.stamper.reserve(buf.len() * 2);
        let mut start = 0;
        while self.terminal.is_none() {
            let Some(i) = memchr::memchr(b'\n', &buf[start..]) else {
                break;
            };
            let end = start + i;
            // Split borrows: the line is read while the stamper writes elsewhere.
            let line = &buf[start..end];
            self.line_inner(line, ts);
            start = end + 1;
        }
        if self.terminal.is_some() {
            buf.clear();
            return;
        }
        buf.advance(start);
        if buf.len() > self.max_line {
            buf.clear();
            self.skipping = true;
            self.reject(&format!("a line longer than {} bytes", self.max_line));
        }
    }

    fn line(&mut self, line: &[u8]) {
        if self.terminal.is_none() {
            self.line_inner(line, asbx_protocol::now_ms());
        }
    }

    fn line_inner(&mut self, line: &[u8], ts: u64) {
        let line = line.trim_ascii();
        if line.is_empty() {
            return;
        }
        // The agent is up: the bootstrap span ends.
        self.bootstrap = None;
        if line.len() > self.max_line {
            self.reject(&format!("a line longer than {} bytes", self.max_line));
            return;
        }
        if line[0] != b'{' {
            self.reject("a line that is not a JSON object");
            return;
        }
        // The commonest shapes (log, delta, result) are validated byte by
        // byte and need no view; the rest goes through serde and its rules.
        let kind = match asbx_protocol::raw::common_kind(line) {
            Some(kind) => {
                if !self.carried(kind) {
                    return;
                }
                kind
            }
            None => match AgentEvent::parse_full(line) {
                Ok((kind, ev)) => {
                    if !self.carried(kind) || !self.rules(kind, &ev) {
                        return;
                    }
                    kind
                }
                Err(e) => {
                    self.reject(&e.to_string());
                    return;
                }
            },
        };
        if kind.is_terminal() {
            self.close_open_steps("the turn ended before the step finished");
            self.terminal = Some(if kind == AgentKind::Result {
                End::Result
            } else {
                End::AgentError
            });
        }
        if self.filter.as_ref().is_none_or(|f| f.passes(kind)) {
            self.stamper.raw(line, ts, kind.as_str());
        } else {
            self.stamper.skip();
        }
    }

    /// Whether the session's protocol carries `kind` (rejecting it if not).
    fn carried(&mut self, kind: AgentKind) -> bool {
        if self.protocol == Protocol::V1 && !kind.in_protocol1() {
            self.reject(&format!(
                "a {} line, which protocol 1 does not carry",
                kind.as_str()
            ));
            return false;
        }
        true
    }

    /// The rules that need the line's fields: step transitions, the agent's
    /// error message, client-tool calls. False if the line is dropped.
    fn rules(&mut self, kind: AgentKind, ev: &AgentEvent<'_>) -> bool {
        if kind == AgentKind::Step && !self.step_transition(ev) {
            return false;
        }
        if kind == AgentKind::Error {
            self.agent_error = ev.message.as_deref().map(str::to_owned);
            self.agent_code = metric_code(ev.code.as_deref());
        }
        if kind == AgentKind::ToolCall
            && let Some(id) = &ev.call_id
        {
            // Known before the client can see it, so its answer is accepted.
            if !self.session.announce_call(id) {
                self.reject(&format!(
                    "a tool_call past the {} open calls a session may hold",
                    crate::session::MAX_OPEN_CALLS
                ));
                return false;
            }
            // A client tool is a tool call too (it writes no step lines).
            self.stats.tool_calls += 1;
        }
        true
    }

    /// Enforces: an id first `running`, then exactly once `succeeded`/`failed`.
    fn step_transition(&mut self, ev: &AgentEvent<'_>) -> bool {
        let (Some(id), Some(name), Some(status)) = (&ev.id, &ev.name, ev.status) else {
            return false;
        };
        match status {
            StepStatus::Running => {
                if self.seen_steps.contains(&**id) || self.seen_steps.len() >= MAX_STEPS_TRACKED {
                    self.reject("a step id that was already used");
                    return false;
                }
                self.seen_steps.insert(id.to_string());
                let span = crate::otel::step_span(&self.trace, id, name);
                self.open_steps
                    .insert(id.to_string(), (name.to_string(), Instant::now(), span));
                self.stats.tool_calls += 1;
                true
            }
            StepStatus::Succeeded | StepStatus::Failed => {
                let Some((name, _, span)) = self.open_steps.remove(&**id) else {
                    self.reject("a step that is not running");
                    return false;
                };
                crate::otel::step_ended(&span, status == StepStatus::Succeeded, ev.duration_ms);
                crate::metrics::METRICS.tool_call(name, status == StepStatus::Succeeded);
                true
            }
        }
    }

    /// Ends every step still running with `failed`.
    fn close_open_steps(&mut self, why: &str) {
        let mut open: Vec<(String, (String, Instant, tracing::Span))> =
            self.open_steps.drain().collect();
        open.sort_by_key(|(_, (_, started, _))| *started);
        for (id, (name, started, span)) in open {
            let duration_ms = started.elapsed().as_millis() as u64;
            crate::otel::step_ended(&span, false, Some(duration_ms));
            crate::metrics::METRICS.tool_call(name.clone(), false);
            self.emit(Event::Step(Step {
                id,
                name,
                status: StepStatus::Failed,
                args: None,
                result: None,
                error: Some(why.to_owned()),
                duration_ms: Some(duration_ms),
            }));
        }
    }

    fn reject(&mut self, why: &str) {
        self.dropped += 1;
        if self.dropped <= MAX_DROP_WARNINGS {
            let mut msg = format!("dropped a line from the sandbox: {why}");
            if self.dropped == MAX_DROP_WARNINGS {
                msg.push_str(" (further dropped lines are only counted)");
            }
            self.emit(Event::log(LogLevel::Warn, msg));
        }
    }

    /// Writes a runner-made line, subject to the filter.
    fn emit(&mut self, event: Event) {
        if self.filter.as_ref().is_none_or(|f| f.passes(event.kind())) {
            self.stamper.event(event);
        } else {
            self.stamper.skip();
        }
    }
}

/// Kills the sandbox: SIGTERM lets `asbx jail` tear the whole pid namespace
/// down and remove its cgroups; SIGKILL on the process group follows if it
/// does not finish in time.
pub(crate) async fn kill_tree(child: &mut SandboxChild) -> Option<std::process::ExitStatus> {
    if let Some(pid) = child.id() {
        let pid = Pid::from_raw(pid as i32);
        let _ = kill(pid, Signal::SIGTERM);
        if let Ok(s) = tokio::time::timeout(KILL_GRACE, child.wait()).await {
            return s.ok();
        }
        let _ = killpg(pid, Signal::SIGKILL);
    }
    child.wait().await.ok()
}

/// The `code` label of an agent's error: one of the [`asbx_protocol::ErrorCode`]s,
/// [`OTHER_CODE`] for any other (an agent may use its own codes; the label
/// set stays bounded).
fn metric_code(code: Option<&str>) -> &'static str {
    code.and_then(asbx_protocol::ErrorCode::parse)
        .map_or(OTHER_CODE, asbx_protocol::ErrorCode::as_str)
}

/// [`metric_code`] of a code that is none of ours.
const OTHER_CODE: &str = "other";

fn decode_status(status: Option<std::process::ExitStatus>) -> (Option<i32>, Option<i32>) {
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

/// A sandbox's stderr, read into a head/tail capture until it closes or
/// the sandbox is known to have ended ([`StderrReader::finish`]).
pub(crate) struct StderrReader {
    task: JoinHandle<StderrCapture>,
    done: tokio_util::sync::CancellationToken,
}

impl StderrReader {
    /// Nothing to read (no pipe).
    pub(crate) fn none() -> StderrReader {
        StderrReader {
            task: tokio::spawn(async { StderrCapture::default() }),
            done: tokio_util::sync::CancellationToken::new(),
        }
    }

    /// The capture, once the sandbox ended: what the pipe holds now is
    /// read (without waiting for its end-of-file, which a supervisor still
    /// tearing the sandbox down holds back), then the reading stops.
    pub(crate) async fn finish(self) -> StderrCapture {
        self.done.cancel();
        match tokio::time::timeout(Duration::from_secs(1), self.task).await {
            Ok(Ok(c)) => c,
            _ => StderrCapture::default(),
        }
    }
}

/// Reads a sandbox's stderr into a head/tail capture; see [`StderrReader`].
pub(crate) fn capture_stderr(mut stderr: tokio::net::unix::pipe::Receiver) -> StderrReader {
    let done = tokio_util::sync::CancellationToken::new();
    let finish = done.clone();
    let task = tokio::spawn(async move {
        let mut cap = StderrCapture::default();
        // Most sandboxes write little or nothing there while they idle:
        // start small, and read big once a read fills the buffer.
        let mut buf = vec![0u8; 256];
        loop {
            tokio::select! {
                biased;
                read = stderr.read(&mut buf) => match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        cap.push(&buf[..n]);
                        if n == buf.len() && buf.len() < 8192 {
                            buf.resize(8192, 0);
                        }
                    }
                },
                _ = finish.cancelled() => {
                    // What is in the pipe now, read directly (the pipe does
                    // not block), whether or not the reactor saw it yet.
                    buf.resize(8192, 0);
                    while let Ok(n) = nix::unistd::read(&stderr, &mut buf) {
                        if n == 0 {
                            break;
                        }
                        cap.push(&buf[..n]);
                    }
                    break;
                }
            }
        }
        cap
    });
    StderrReader { task, done }
}

#[cfg(test)]
mod tests {
    use super::*;
    use asbx_protocol::{Line, LineDecoder};

    fn state(protocol: Protocol, filter: Option<Filter>) -> State {
        let sessions = crate::session::Sessions::default();
        let session = sessions
            .insert("s1", protocol, Duration::from_secs(1))
            .unwrap();
        State {
            session,
            stamper: Stamper::new("s1"),
            protocol,
            filter,
            open_steps: HashMap::new(),
            seen_steps: HashSet::new(),
            dropped: 0,
            terminal: None,
            stats: SessionStats::default(),
            skipping: false,
            max_line: 256,
            init: None,
            agent_error: None,
            agent_code: OTHER_CODE,
            started: Instant::now(),
            first_sent: false,
            counted_seq: 0,
            trace: tracing::Span::none(),
            bootstrap: None,
        }
    }

    fn feed(st: &mut State, chunks: &[&[u8]]) -> Vec<Line> {
        let mut buf = BytesMut::new();
        for c in chunks {
            buf.extend_from_slice(c);
            st.lines(&mut buf);
        }
        let (out, _) = st.stamper.take();
        LineDecoder::default()
            .push(&out)
            .into_iter()
            .map(|l| l.unwrap())
            .collect()
    }

    fn warnings(lines: &[Line]) -> usize {
        lines
            .iter()
            .filter(|l| matches!(&l.event, Event::Log(g) if g.level == LogLevel::Warn))
            .count()
    }

    #[test]
    fn junk_is_dropped_with_a_warning_and_the_stream_goes_on() {
        let mut st = state(Protocol::V1, None);
        let lines = feed(
            &mut st,
            &[
                b"garbage\n[1,2]\n{\"type\":\"result\",\"message\":\"x\",\"seq\":99}\n",
                b"{\"type\":\"heartbeat\"}\n\n   \n{\"type\":\"delta\",\"text\":\"p2 only\"}\n",
                b"{\"type\":\"log\",\"level\":\"info\",\"message\":\"fine\"}\n",
            ],
        );
        assert_eq!(warnings(&lines), 5);
        assert!(matches!(&lines.last().unwrap().event, Event::Log(l) if l.message == "fine"));
        assert_eq!(
            lines.iter().map(|l| l.seq).collect::<Vec<_>>(),
            (1..=6).collect::<Vec<_>>()
        );
        assert!(st.terminal.is_none());
    }

    #[test]
    fn lines_split_across_reads_are_joined() {
        let mut st = state(Protocol::V1, None);
        let lines = feed(
            &mut st,
            &[
                b"{\"type\":\"log\",\"lev",
                b"el\":\"info\",\"message\":\"h\xc3",
                b"\xa9\"}\n",
            ],
        );
        assert_eq!(lines.len(), 1);
        assert!(matches!(&lines[0].event, Event::Log(l) if l.message == "hé"));
    }

    #[test]
    fn an_over_long_line_is_skipped_up_to_its_newline() {
        let mut st = state(Protocol::V1, None);
        let long = vec![b'x'; 300];
        let lines = feed(
            &mut st,
            &[
                &long,
                &long,
                b"tail\n{\"type\":\"result\",\"message\":\"ok\"}\n",
            ],
        );
        assert_eq!(warnings(&lines), 1);
        assert!(matches!(&lines.last().unwrap().event, Event::Result(r) if r.message == "ok"));
        assert_eq!(st.terminal, Some(End::Result));
    }

    #[test]
    fn step_rules_are_enforced_and_open_steps_close_before_the_result() {
        let mut st = state(Protocol::V1, None);
        let lines = feed(
            &mut st,
            &[
                b"{\"type\":\"step\",\"id\":\"a\",\"name\":\"shell\",\"status\":\"succeeded\",\"durationMs\":1}\n",
                b"{\"type\":\"step\",\"id\":\"b\",\"name\":\"shell\",\"status\":\"running\"}\n",
                b"{\"type\":\"step\",\"id\":\"b\",\"name\":\"shell\",\"status\":\"running\"}\n",
                b"{\"type\":\"result\",\"message\":\"done\"}\n",
                b"{\"type\":\"log\",\"level\":\"info\",\"message\":\"after the end\"}\n",
            ],
        );
        // Two rejected step lines, then b running, b failed (closed by the runner), result.
        assert_eq!(warnings(&lines), 2);
        let kinds: Vec<String> = lines
            .iter()
            .filter(|l| !matches!(l.event, Event::Log(_)))
            .map(|l| match &l.event {
                Event::Step(s) => format!("{}:{:?}", s.id, s.status),
                e => e.type_name().to_owned(),
            })
            .collect();
        assert_eq!(kinds, vec!["b:Running", "b:Failed", "result"]);
        assert_eq!(st.stats.tool_calls, 1);
    }

    #[test]
    fn filtered_lines_keep_their_seq_numbers() {
        let f = Filter::Block {
            blocked_types: vec![asbx_protocol::EventKind::Log],
        };
        let mut st = state(Protocol::V2, Some(f));
        let lines = feed(
            &mut st,
            &[
                b"{\"type\":\"log\",\"level\":\"info\",\"message\":\"hidden\"}\n",
                b"{\"type\":\"delta\",\"text\":\"hi\"}\n",
                b"{\"type\":\"log\",\"level\":\"info\",\"message\":\"hidden\"}\n",
                b"{\"type\":\"result\",\"message\":\"done\"}\n",
            ],
        );
        assert_eq!(lines.iter().map(|l| l.seq).collect::<Vec<_>>(), vec![2, 4]);
    }

    #[tokio::test]
    async fn session_init_waits_for_config_and_carries_the_effective_limits() {
        use tokio::io::AsyncWriteExt;
        let mut st = state(Protocol::V2, None);
        st.init = Some(SessionInit {
            protocol_version: 2,
            limits: SessionLimits {
                max_duration_ms: 1000,
                max_steps: 50,
                max_tool_calls: 200,
                heartbeat_interval_ms: 5000,
            },
            encryption: None,
        });
        let session = Arc::clone(&st.session);
        let (mut w, r) = tokio::io::duplex(4096);
        let (tx, mut rx) = mpsc::channel::<Bytes>(16);
        let deadline = Instant::now() + Duration::from_secs(30);
        let pumping = async {
            let mut tx = Some(tx);
            pump(&mut st, r, &mut tx, &session, deadline).await
        };
        let driving = async {
            w.write_all(b"{\"type\":\"log\",\"level\":\"info\",\"message\":\"early\"}\n")
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(rx.try_recv().is_err(), "a line went out before /config");
            session.set_run_limits(Some(asbx_protocol::callback::RunLimits {
                max_steps: Some(3),
                max_tool_calls: Some(1000),
                ..Default::default()
            }));
            let mut out = rx.recv().await.unwrap().to_vec();
            w.write_all(b"{\"type\":\"result\",\"message\":\"done\"}\n")
                .await
                .unwrap();
            drop(w);
            while let Some(c) = rx.recv().await {
                out.extend_from_slice(&c);
            }
            out
        };
        let (end, out) = tokio::join!(pumping, driving);
        assert_eq!(end, End::Result);
        let lines: Vec<Line> = LineDecoder::default()
            .push(&out)
            .into_iter()
            .map(|l| l.unwrap())
            .collect();
        match &lines[0].event {
            Event::SessionInit(i) => {
                assert_eq!(i.limits.max_steps, 3, "lowered by /config");
                assert_eq!(i.limits.max_tool_calls, 200, "clamped to the ceiling");
                assert_eq!(i.limits.max_duration_ms, 1000, "the ceiling");
            }
            other => panic!("first line {other:?}"),
        }
        assert!(matches!(&lines[1].event, Event::Log(l) if l.message == "early"));
        assert!(matches!(&lines[2].event, Event::Result(_)));
        assert_eq!(
            lines.iter().map(|l| l.seq).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
    }

    #[tokio::test]
    async fn without_config_session_init_goes_out_after_one_heartbeat_interval() {
        use tokio::io::AsyncWriteExt;
        let mut st = state(Protocol::V2, None);
        let ceilings = SessionLimits {
            max_duration_ms: 1000,
            max_steps: 50,
            max_tool_calls: 200,
            heartbeat_interval_ms: 5000,
        };
        st.init = Some(SessionInit {
            protocol_version: 2,
            limits: ceilings.clone(),
            encryption: None,
        });
        let session = Arc::clone(&st.session);
        let (mut w, r) = tokio::io::duplex(4096);
        let (tx, mut rx) = mpsc::channel::<Bytes>(16);
        let deadline = Instant::now() + Duration::from_secs(30);
        let started = Instant::now();
        let pumping = async {
            let mut tx = Some(tx);
            pump(&mut st, r, &mut tx, &session, deadline).await
        };
        let driving = async {
            w.write_all(b"{\"type\":\"log\",\"level\":\"info\",\"message\":\"early\"}\n")
                .await
                .unwrap();
            let first = rx.recv().await.unwrap();
            let waited = started.elapsed();
            w.write_all(b"{\"type\":\"result\",\"message\":\"done\"}\n")
                .await
                .unwrap();
            drop(w);
            while rx.recv().await.is_some() {}
            (first, waited)
        };
        let (end, (first, waited)) = tokio::join!(pumping, driving);
        assert_eq!(end, End::Result);
        assert!(
            waited >= HEARTBEAT - Duration::from_millis(50) && waited < HEARTBEAT * 2,
            "{waited:?}"
        );
        let lines: Vec<Line> = LineDecoder::default()
            .push(&first)
            .into_iter()
            .map(|l| l.unwrap())
            .collect();
        assert!(
            matches!(&lines[0].event, Event::SessionInit(i) if i.limits == ceilings),
            "{lines:?}"
        );
        assert!(matches!(&lines[1].event, Event::Log(l) if l.message == "early"));
        assert!(
            !lines.iter().any(|l| matches!(l.event, Event::Heartbeat(_))),
            "session_init stands in for the first heartbeat"
        );
    }

    /// Issue 28, defect 11: the dispatch metric's `code` of an agent error
    /// is the error line's code when it is one of ours, `other` beyond.
    #[test]
    fn an_agent_errors_code_is_its_metric_label() {
        for (line, code) in [
            (
                &b"{\"type\":\"error\",\"code\":\"model_error\",\"message\":\"m\"}\n"[..],
                "model_error",
            ),
            (
                b"{\"type\":\"error\",\"code\":\"step_limit_exceeded\",\"message\":\"m\"}\n",
                "step_limit_exceeded",
            ),
            (
                b"{\"type\":\"error\",\"code\":\"my_own_code\",\"message\":\"m\"}\n",
                "other",
            ),
        ] {
            let mut st = state(Protocol::V1, None);
            feed(&mut st, &[line]);
            assert_eq!(st.terminal, Some(End::AgentError));
            assert_eq!(st.agent_code, code);
        }
    }

    #[test]
    fn exit_statuses_decode_signals_reported_by_the_jail() {
        use std::os::unix::process::ExitStatusExt;
        let st = |raw| Some(std::process::ExitStatus::from_raw(raw));
        assert_eq!(decode_status(st(7 << 8)), (Some(7), None));
        assert_eq!(decode_status(st((128 + 9) << 8)), (None, Some(9)));
        assert_eq!(decode_status(st(9)), (None, Some(9)));
        assert_eq!(decode_status(None), (None, None));
    }
}
