//! The session registry: live sessions and the last ended ones, for
//! `GET /v1/sessions`, cancellation and `409` on a taken id.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use asbx_protocol::Protocol;
use asbx_protocol::session::{SessionInfo, SessionStatus, Termination};
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
}

#[derive(Debug, Default)]
struct SessionState {
    cancel_cause: Option<CancelCause>,
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
        let mut st = self.lock();
        st.ended_at = Some(asbx_protocol::now_ms());
        st.last_seq = last_seq;
        st.termination = Some(termination);
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
            termination: st.termination.clone(),
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
    pub(crate) fn insert(&self, id: &str, protocol: Protocol) -> Result<Arc<Session>, RunnerError> {
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
