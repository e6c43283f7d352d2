//! The session registry: live sessions and the last ended ones, for
//! `GET /v1/sessions`, cancellation and `409` on a taken id.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use asbx_crypto::ServerSession;
use asbx_protocol::Protocol;
use asbx_protocol::callback::RunLimits;
use asbx_protocol::session::{SessionInfo, SessionStatus, Termination};
use bytes::Bytes;
use tokio::sync::{Notify, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::error::RunnerError;

/// How many ended sessions stay visible.
const KEEP_ENDED: usize = 1000;

/// Why the runner cancelled a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CancelCause {
    /// The client dropped the stream.
    ClientGone,
    /// `DELETE /v1/sessions/{id}`.
    Deleted,
}

#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) id: String,
    pub(crate) protocol: Protocol,
    pub(crate) created_at: u64,
    pub(crate) cancel: CancellationToken,
    state: Mutex<SessionState>,
    /// Protocol 2: the lines sent so far, for resume (bounded).
    log: Mutex<EventLog>,
    /// The last `seq` in the log; `u64::MAX` once the session ended.
    tail: watch::Sender<u64>,
    /// Protocol 2: clients attached (the `/stream` body and event readers).
    readers: AtomicUsize,
    /// Bumped whenever the last reader leaves, so an old grace timer can
    /// tell that someone came back and left again.
    detach_epoch: AtomicU64,
    /// Protocol 2: how long the session outlives its last reader.
    pub(crate) detach_grace: Duration,
    /// Protocol 2: client-tool calls by id.
    calls: Mutex<HashMap<String, Call>>,
    /// Protocol 2 with `encryption`: this session's key (`docs/protocol.md` §4).
    crypto: OnceLock<Arc<ServerSession>>,
    /// The `limits` of the `/config` answer, once it passed the gateway.
    run_limits: OnceLock<Option<RunLimits>>,
    /// Wakes the drive task when `run_limits` is set.
    config_seen: Notify,
    /// The workspace's audit token of this dispatch (`crate::audit`);
    /// never handed to the sandbox.
    audit_token: OnceLock<String>,
}

/// Most bytes of lines a protocol 2 session keeps for resume.
const LOG_MAX_BYTES: usize = 8 << 20;

#[derive(Debug, Default)]
struct EventLog {
    lines: VecDeque<LoggedLine>,
    bytes: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct LoggedLine {
    pub(crate) seq: u64,
    pub(crate) kind: &'static str,
    /// The stamped line, with its newline.
    pub(crate) bytes: Bytes,
}

/// The answer to a client-tool call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ToolAnswer {
    Result(serde_json::Value),
    Error(String),
}

/// Most client-tool calls one session holds unanswered; a sandbox can't
/// grow the call map past this (or past [`MAX_CALLS`] in all).
pub(crate) const MAX_OPEN_CALLS: usize = 64;
/// Most calls one session remembers, answered ones included (a late
/// duplicate answer must still get 409).
pub(crate) const MAX_CALLS: usize = 1024;

#[derive(Debug, Default)]
struct Call {
    /// Seen in one of the agent's `tool_call` lines.
    announced: bool,
    answer: Option<ToolAnswer>,
    waiter: Option<oneshot::Sender<ToolAnswer>>,
}

/// The call `call_id`, made if the bounds leave room for it.
fn call_slot<'a>(calls: &'a mut HashMap<String, Call>, call_id: &str) -> Option<&'a mut Call> {
    if !calls.contains_key(call_id) {
        let open = calls.values().filter(|c| c.answer.is_none()).count();
        if open >= MAX_OPEN_CALLS || calls.len() >= MAX_CALLS {
            return None;
        }
    }
    Some(calls.entry(call_id.to_owned()).or_default())
}

/// Why the agent's wait for an answer ended without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitError {
    /// The session ended first.
    Ended,
    /// The session already holds [`MAX_OPEN_CALLS`] unanswered calls.
    TooManyCalls,
}

/// Why a tool result was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AnswerError {
    Unknown,
    AlreadyAnswered,
    /// The session ended before this answer came.
    SessionEnded,
}

/// What a reader asking for `seq > after` gets.
#[derive(Debug)]
pub(crate) enum Backlog {
    Lines(Vec<LoggedLine>),
    /// Lines after `after` were dropped; the oldest kept is `oldest`.
    Gone {
        oldest: u64,
    },
}

#[derive(Debug, Default)]
struct SessionState {
    cancel_cause: Option<CancelCause>,
    /// Token counts the agent reported.
    usage: asbx_protocol::gateway::Usage,
    /// What the gateway counted itself: model calls forwarded, tokens read
    /// from the providers' answers.
    counted: asbx_protocol::gateway::Usage,
    ended_at: Option<u64>,
    last_seq: u64,
    termination: Option<Termination>,
}

impl Session {
    fn lock(&self) -> std::sync::MutexGuard<'_, SessionState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn cancel(&self, cause: CancelCause) {
        self.lock().cancel_cause.get_or_insert(cause);
        self.cancel.cancel();
    }

    /// The cause of a cancellation; a dropped stream when none was recorded.
    pub(crate) fn cancel_cause(&self) -> CancelCause {
        self.lock().cancel_cause.unwrap_or(CancelCause::ClientGone)
    }

    pub(crate) fn end(&self, last_seq: u64, termination: Termination) {
        {
            let mut st = self.lock();
            st.ended_at = Some(asbx_protocol::now_ms());
            st.last_seq = last_seq;
            st.termination = Some(termination);
        }
        // Waiting tool calls learn that no answer will come; answered ones
        // stay answered (a late duplicate still gets 409).
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        for call in calls.values_mut() {
            call.waiter = None;
        }
        calls.retain(|_, c| c.announced);
    }

    /// Encrypts this session from now on (set once, before it starts).
    pub(crate) fn set_crypto(&self, crypto: ServerSession) {
        let _ = self.crypto.set(Arc::new(crypto));
    }

    /// Sets the dispatch's audit token (once).
    pub(crate) fn set_audit_token(&self, token: String) {
        let _ = self.audit_token.set(token);
    }

    /// The dispatch's audit token, when the workspace sent one.
    pub(crate) fn audit_token(&self) -> Option<&str> {
        self.audit_token.get().map(String::as_str)
    }

    /// The session's key, when the client asked for encryption.
    pub(crate) fn crypto(&self) -> Option<&Arc<ServerSession>> {
        self.crypto.get()
    }

    /// The gateway relayed the `/config` answer, whose `limits` these are.
    pub(crate) fn set_run_limits(&self, limits: Option<RunLimits>) {
        if self.run_limits.set(limits).is_ok() {
            self.config_seen.notify_one();
        }
    }

    /// The `/config` limits, once `/config` has passed.
    pub(crate) fn run_limits(&self) -> Option<Option<RunLimits>> {
        self.run_limits.get().copied()
    }

    /// Resolves once `/config` has passed the gateway.
    pub(crate) async fn config_seen(&self) {
        if self.run_limits.get().is_none() {
            self.config_seen.notified().await;
        }
    }

    pub(crate) fn set_usage(&self, usage: asbx_protocol::gateway::Usage) {
        self.lock().usage = usage;
    }

    /// The gateway forwarded a model call.
    pub(crate) fn count_model_call(&self) {
        let mut st = self.lock();
        st.counted.model_calls = st.counted.model_calls.saturating_add(1);
    }

    /// The gateway read more tokens in a provider's answer.
    pub(crate) fn count_tokens(&self, input: u64, output: u64) {
        let mut st = self.lock();
        st.counted.input_tokens = st.counted.input_tokens.saturating_add(input);
        st.counted.output_tokens = st.counted.output_tokens.saturating_add(output);
    }

    /// The usage `session_ended.stats` reports: per count, the larger of the
    /// gateway's own and the agent's report. The agent reports only at its
    /// very end (never when it is cancelled, crashes or hits the cap) and
    /// can't be trusted to; the gateway sees every call through a provider
    /// (but not the `scripted` test provider's, which runs in the agent).
    pub(crate) fn stats_usage(&self) -> asbx_protocol::gateway::Usage {
        let st = self.lock();
        asbx_protocol::gateway::Usage {
            input_tokens: st.usage.input_tokens.max(st.counted.input_tokens),
            output_tokens: st.usage.output_tokens.max(st.counted.output_tokens),
            model_calls: st.usage.model_calls.max(st.counted.model_calls),
        }
    }

    /// Marks the log complete: readers drain it and stop.
    pub(crate) fn close_log(&self) {
        self.tail.send_replace(u64::MAX);
    }

    /// Appends sent lines to the resume log (protocol 2), dropping the
    /// oldest past the byte bound, and wakes readers.
    pub(crate) fn record(&self, lines: Vec<LoggedLine>) {
        // Protocol 1 keeps no log: its chunks come with no lines, and the
        // line path must not take a lock for them.
        if lines.is_empty() {
            return;
        }
        let mut last = None;
        {
            let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
            for l in lines {
                log.bytes += l.bytes.len();
                last = Some(l.seq);
                log.lines.push_back(l);
            }
            while log.bytes > LOG_MAX_BYTES {
                match log.lines.pop_front() {
                    Some(old) => log.bytes -= old.bytes.len(),
                    None => break,
                }
            }
        }
        if let Some(seq) = last {
            self.tail.send_replace(seq);
        }
    }

    /// The logged lines with `seq > after`, or `Gone` if some were dropped.
    pub(crate) fn backlog(&self, after: u64) -> Backlog {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        match log.lines.front() {
            Some(first) if first.seq > after + 1 && first.seq > 1 => {
                Backlog::Gone { oldest: first.seq }
            }
            _ => Backlog::Lines(
                log.lines
                    .iter()
                    .filter(|l| l.seq > after)
                    .cloned()
                    .collect(),
            ),
        }
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.tail.subscribe()
    }

    /// A client attached (protocol 2).
    pub(crate) fn attach(&self) {
        self.readers.fetch_add(1, Ordering::AcqRel);
    }

    /// A client left; with none left, the session is cancelled unless one
    /// comes back within the detach grace.
    pub(crate) fn detach(self: &Arc<Self>) {
        if self.readers.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let epoch = self.detach_epoch.fetch_add(1, Ordering::AcqRel) + 1;
        let session = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(session.detach_grace).await;
            let nobody = session.readers.load(Ordering::Acquire) == 0;
            let same_absence = session.detach_epoch.load(Ordering::Acquire) == epoch;
            if nobody && same_absence {
                session.cancel(CancelCause::ClientGone);
            }
        });
    }

    /// The agent announced a client-tool call (its `tool_call` line).
    /// `false` when the session already holds too many calls: the line is
    /// then dropped.
    pub(crate) fn announce_call(&self, call_id: &str) -> bool {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        match call_slot(&mut calls, call_id) {
            Some(call) => {
                call.announced = true;
                true
            }
            None => false,
        }
    }

    /// The client's answer to an announced call.
    pub(crate) fn answer_call(&self, call_id: &str, answer: ToolAnswer) -> Result<(), AnswerError> {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        let call = match calls.get_mut(call_id) {
            Some(c) if c.announced => c,
            _ => return Err(AnswerError::Unknown),
        };
        if call.answer.is_some() {
            return Err(AnswerError::AlreadyAnswered);
        }
        if self.lock().ended_at.is_some() {
            return Err(AnswerError::SessionEnded);
        }
        call.answer = Some(answer.clone());
        if let Some(w) = call.waiter.take() {
            let _ = w.send(answer);
        }
        Ok(())
    }

    /// The agent waits for the answer to `call_id`; `None` if the session
    /// ends first.
    pub(crate) async fn wait_call(&self, call_id: &str) -> Result<ToolAnswer, WaitError> {
        let rx = {
            let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
            let call = call_slot(&mut calls, call_id).ok_or(WaitError::TooManyCalls)?;
            if let Some(a) = &call.answer {
                return Ok(a.clone());
            }
            let (tx, rx) = oneshot::channel();
            call.waiter = Some(tx);
            rx
        };
        tokio::select! {
            a = rx => a.map_err(|_| WaitError::Ended),
            _ = self.cancel.cancelled() => Err(WaitError::Ended),
        }
    }

    pub(crate) fn info(&self) -> SessionInfo {
        let st = self.lock();
        SessionInfo {
            id: self.id.clone(),
            status: if st.ended_at.is_some() {
                SessionStatus::Ended
            } else {
                SessionStatus::Running
            },
            protocol: self.protocol.into(),
            created_at: self.created_at,
            ended_at: st.ended_at,
            last_seq: st.last_seq,
            termination: st.termination.clone().map(|mut t| {
                // An encrypted session's words travel only sealed, in its
                // `session_ended` line (docs/protocol.md §4): the listing
                // keeps how it ended and its counts, not its message or
                // stderr, which a relay holding the runner token could read.
                if self.crypto.get().is_some() {
                    t.message = None;
                    t.stderr = None;
                }
                t
            }),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Sessions {
    inner: Mutex<Registry>,
}

#[derive(Debug, Default)]
struct Registry {
    all: HashMap<String, Arc<Session>>,
    ended: VecDeque<String>,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a new session; `409` when the id is taken.
    pub(crate) fn insert(
        &self,
        id: &str,
        protocol: Protocol,
        detach_grace: Duration,
    ) -> Result<Arc<Session>, RunnerError> {
        let mut reg = self.lock();
        if reg.all.contains_key(id) {
            return Err(RunnerError::SessionTaken(id.to_owned()));
        }
        let session = Arc::new(Session {
            id: id.to_owned(),
            protocol,
            created_at: asbx_protocol::now_ms(),
            cancel: CancellationToken::new(),
            state: Mutex::new(SessionState::default()),
            log: Mutex::new(EventLog::default()),
            tail: watch::channel(0).0,
            readers: AtomicUsize::new(0),
            detach_epoch: AtomicU64::new(0),
            detach_grace,
            calls: Mutex::new(HashMap::new()),
            crypto: OnceLock::new(),
            run_limits: OnceLock::new(),
            config_seen: Notify::new(),
            audit_token: OnceLock::new(),
        });
        reg.all.insert(id.to_owned(), Arc::clone(&session));
        Ok(session)
    }

    /// Forgets a session that never started.
    pub(crate) fn remove(&self, id: &str) {
        self.lock().all.remove(id);
    }

    /// Moves an ended session to the bounded list of ended ones.
    pub(crate) fn retire(&self, id: &str) {
        let mut reg = self.lock();
        reg.ended.push_back(id.to_owned());
        while reg.ended.len() > KEEP_ENDED {
            if let Some(old) = reg.ended.pop_front() {
                reg.all.remove(&old);
            }
        }
    }

    pub(crate) fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.lock().all.get(id).cloned()
    }

    pub(crate) fn list(&self) -> Vec<SessionInfo> {
        let sessions: Vec<Arc<Session>> = self.lock().all.values().cloned().collect();
        let mut infos: Vec<SessionInfo> = sessions.iter().map(|s| s.info()).collect();
        infos.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        infos
    }

    pub(crate) fn running(&self) -> usize {
        let reg = self.lock();
        reg.all.len() - reg.ended.len()
    }
}

// The response-body guards: what a client going away does to its session.

/// What dropping the response body (client gone) does to the session.
pub(crate) struct CancelOnDrop(pub(crate) Arc<Session>);

impl CancelOnDrop {
    pub(crate) fn into_guard(self) -> SessionGuard {
        if self.0.protocol == asbx_protocol::Protocol::V2 {
            self.0.attach();
        }
        SessionGuard(Some(self.0))
    }
}

/// Protocol 1: cancels at once. Protocol 2: detaches; the session lives on
/// for its detach grace so a client can resume from `/events`.
pub(crate) struct SessionGuard(pub(crate) Option<Arc<Session>>);

impl Drop for SessionGuard {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            match s.protocol {
                asbx_protocol::Protocol::V1 => s.cancel(CancelCause::ClientGone),
                asbx_protocol::Protocol::V2 => s.detach(),
            }
        }
    }
}

/// The response body: the drive task's chunks, cancelling on drop.
pub(crate) struct GuardedStream {
    pub(crate) rx: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    pub(crate) _guard: SessionGuard,
}

impl futures::Stream for GuardedStream {
    type Item = Result<bytes::Bytes, std::convert::Infallible>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|o| o.map(Ok))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(seq: u64, len: usize) -> LoggedLine {
        LoggedLine {
            seq,
            kind: "log",
            bytes: Bytes::from(vec![b'x'; len]),
        }
    }

    #[tokio::test]
    async fn the_log_keeps_the_newest_lines_and_reports_what_is_gone() {
        let sessions = Sessions::default();
        let s = sessions
            .insert("s", Protocol::V2, Duration::from_secs(1))
            .unwrap();
        // 10 MiB of 1 KiB lines: the oldest ~2 MiB are dropped.
        s.record((1..=10_240).map(|seq| line(seq, 1024)).collect());
        match s.backlog(0) {
            Backlog::Gone { oldest } => assert!(oldest > 1 && oldest < 3000, "{oldest}"),
            Backlog::Lines(l) => panic!("kept {} lines", l.len()),
        }
        match s.backlog(10_000) {
            Backlog::Lines(l) => {
                assert_eq!(
                    l.iter().map(|l| l.seq).collect::<Vec<_>>(),
                    (10_001..=10_240).collect::<Vec<_>>()
                )
            }
            Backlog::Gone { .. } => panic!("recent lines are kept"),
        }
        assert_eq!(*s.subscribe().borrow(), 10_240);
    }

    #[tokio::test]
    async fn tool_answers_need_an_announced_call_and_come_once() {
        let sessions = Sessions::default();
        let s = sessions
            .insert("s", Protocol::V2, Duration::from_secs(1))
            .unwrap();
        let answer = ToolAnswer::Result(serde_json::json!({"ok": true}));
        assert_eq!(
            s.answer_call("c1", answer.clone()),
            Err(AnswerError::Unknown)
        );
        let waiter = {
            let s = Arc::clone(&s);
            tokio::spawn(async move { s.wait_call("c1").await })
        };
        tokio::task::yield_now().await;
        // The agent may ask before its tool_call line is processed: still unknown to clients.
        assert_eq!(
            s.answer_call("c1", answer.clone()),
            Err(AnswerError::Unknown)
        );
        assert!(s.announce_call("c1"));
        assert_eq!(s.answer_call("c1", answer.clone()), Ok(()));
        assert_eq!(
            s.answer_call("c1", answer.clone()),
            Err(AnswerError::AlreadyAnswered)
        );
        assert_eq!(waiter.await.unwrap(), Ok(answer));
    }

    #[tokio::test]
    async fn a_session_holds_a_bounded_number_of_open_calls() {
        let sessions = Sessions::default();
        let s = sessions
            .insert("s", Protocol::V2, Duration::from_secs(1))
            .unwrap();
        for i in 0..MAX_OPEN_CALLS {
            assert!(s.announce_call(&format!("c{i}")), "call {i}");
        }
        // A flood of announcements or waits for unknown ids is refused...
        assert!(!s.announce_call("one-too-many"));
        assert_eq!(s.wait_call("waits-too").await, Err(WaitError::TooManyCalls));
        // ...but known calls still work, and an answer frees a slot.
        assert!(s.announce_call("c0"), "a known call is not a new one");
        let answer = ToolAnswer::Result(serde_json::json!(1));
        assert_eq!(s.answer_call("c0", answer.clone()), Ok(()));
        assert_eq!(s.wait_call("c0").await, Ok(answer));
        assert!(s.announce_call("next"));
        assert!(!s.announce_call("and-no-more"));
    }
}
