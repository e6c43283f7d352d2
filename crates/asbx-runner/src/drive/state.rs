//! The drive task's state and its line path: each line the agent writes
//! validated (framing, shape, the protocol's kinds, the step rules),
//! stamped and filtered; the lines the runner owes the client at the end;
//! and the termination the session records.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use asbx_protocol::line::{SessionInit, SessionLimits, Step};
use asbx_protocol::raw::{AgentEvent, AgentKind};
use asbx_protocol::session::{SessionStats, Termination};
use asbx_protocol::{Event, Filter, LogLevel, Protocol, StepStatus};
use bytes::{Buf, Bytes, BytesMut};

use crate::drive::end::{End, OTHER_CODE, decode_status, metric_code};
use crate::session::Session;
use crate::stamp::Stamper;
use crate::stderr::StderrCapture;

/// Warnings about dropped lines sent per session before they are only counted.
const MAX_DROP_WARNINGS: u32 = 16;
/// Most distinct step ids one session may open.
const MAX_STEPS_TRACKED: usize = 100_000;

pub(super) struct State {
    pub(super) session: Arc<Session>,
    pub(super) stamper: Stamper,
    pub(super) protocol: Protocol,
    pub(super) filter: Option<Filter>,
    /// Running steps: name, start, span (`Span::none()` with traces off).
    pub(super) open_steps: HashMap<String, (String, Instant, tracing::Span)>,
    pub(super) seen_steps: HashSet<String>,
    pub(super) dropped: u32,
    pub(super) terminal: Option<End>,
    pub(super) stats: SessionStats,
    /// Discarding the rest of an over-long line.
    pub(super) skipping: bool,
    pub(super) max_line: usize,
    /// Protocol 2: `session_init` until it is written (its limits the
    /// runner's ceilings, clamped by `/config` when it has passed).
    pub(super) init: Option<SessionInit>,
    /// The message of the agent's `error` line.
    pub(super) agent_error: Option<String>,
    /// Its `code` as a metric label ([`metric_code`]).
    pub(super) agent_code: &'static str,
    /// For the metrics: when the dispatch started, whether a line went
    /// out yet, and the `seq` counted so far.
    pub(super) started: Instant,
    pub(super) first_sent: bool,
    pub(super) counted_seq: u64,
    pub(super) trace: tracing::Span,
    pub(super) bootstrap: Option<tracing::Span>,
}

impl State {
    /// A dispatch's state before the agent's first line.
    pub(super) fn new(
        session: &Arc<Session>,
        protocol: Protocol,
        filter: Option<Filter>,
        max_line: usize,
        session_limits: SessionLimits,
        trace: tracing::Span,
        bootstrap: Option<tracing::Span>,
    ) -> State {
        let mut stamper = Stamper::new(&session.id);
        if protocol == Protocol::V2 {
            stamper.keep_marks();
        }
        State {
            session: Arc::clone(session),
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
            started: Instant::now(),
            first_sent: false,
            counted_seq: 0,
            trace,
            bootstrap,
        }
    }

    /// The lines the runner owes the client once the sandbox ended
    /// (`session_init` if still held, open steps closed, its own `error`
    /// line, protocol 2's `session_ended`) and the termination they report.
    pub(super) fn finish(
        &mut self,
        end: End,
        status: Option<std::process::ExitStatus>,
        captured: StderrCapture,
    ) -> Termination {
        let (exit_code, signal) = decode_status(status);
        self.emit_init();
        let message = end.message(
            self.agent_error.as_deref(),
            exit_code,
            signal,
            captured.last_line(),
        );
        if let (Some(code), Some(msg)) = (end.runner_code(), &message) {
            self.close_open_steps("the sandbox ended before the step finished");
            self.emit(Event::error(code, msg.clone()));
        }
        self.stats.duration_ms = self.started.elapsed().as_millis() as u64;
        let usage = self.session.stats_usage();
        self.stats.steps = usage.model_calls;
        self.stats.input_tokens = usage.input_tokens;
        self.stats.output_tokens = usage.output_tokens;
        let (reason, terminated_by) = end.reason();
        let termination = Termination {
            reason,
            terminated_by,
            message,
            exit_code,
            signal,
            stderr: captured.finish(),
            stats: self.stats.clone(),
        };
        if self.protocol == Protocol::V2 {
            self.emit(Event::SessionEnded(termination.clone()));
        }
        termination
    }

    /// At the end of the agent's stdout: what is left in `buf` is handled,
    /// a last line without its newline too.
    pub(super) fn at_eof(&mut self, buf: &mut BytesMut) {
        self.emit_init();
        self.lines(buf);
        if !buf.is_empty() && !self.skipping {
            let rest: Bytes = buf.split().freeze();
            self.line(&rest);
        }
    }

    /// Takes what the stamper wrote, counting its lines and bytes (once per
    /// chunk, not per line) and the time to the first line.
    pub(super) fn take(&mut self) -> (Bytes, Vec<crate::session::LoggedLine>) {
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
    pub(super) fn emit_init(&mut self) {
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
    pub(super) fn lines(&mut self, buf: &mut BytesMut) {
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

    pub(super) fn line(&mut self, line: &[u8]) {
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
    pub(super) fn close_open_steps(&mut self, why: &str) {
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
    pub(super) fn emit(&mut self, event: Event) {
        if self.filter.as_ref().is_none_or(|f| f.passes(event.kind())) {
            self.stamper.event(event);
        } else {
            self.stamper.skip();
        }
    }
}
