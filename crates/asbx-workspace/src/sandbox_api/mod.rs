//! The in-sandbox workspace API (docs/protocol.md §3, `EnvResponse.workspace`):
//! what a running session may do in its workspace, through the runner's
//! gateway, at `{agent_url}/workspace/...` with its `asbx_ws_` bearer: list,
//! read and create files of its bag, and read its chat's history.
//!
//! The bag is the chat's files for a chat turn, else the run's own files.
//! The bearer opens exactly one session: its `session_id` must be the one
//! in the path, unexpired, not revoked, and the run still running; anything
//! else is `401 unauthorized`, before any other check. A file outside the
//! bag is `404`, like a file that does not exist.
//!
//! Uses `tokens` (the bearer), `files` (rows and blobs) and `chats` (the
//! history); no feature uses this one.

pub(crate) mod api;

use asbx_protocol::callback::Role;
use asbx_protocol::rules::limits;
use axum::http::HeaderMap;
use serde::Serialize;

use crate::AppState;
use crate::chats::store as chats;
use crate::error::WorkspaceError;
use crate::files::store::{self as files, FileOrigin, FileRow};
use crate::tokens::store as token_store;
use crate::tokens::{self, WORKSPACE_PREFIX};
use crate::validate;

/// Largest file a sandbox creates: a chat's attachment budget, which the
/// runner's gateway also enforces (with some slack, docs/protocol.md §3).
pub(crate) const MAX_FILE_BYTES: usize = limits::MAX_BAG_FILE_BYTES;
/// Most messages of one `history` answer, and the default.
pub(crate) const MAX_HISTORY: usize = limits::MAX_HISTORY_MESSAGES;
pub(crate) const DEFAULT_HISTORY: usize = limits::DEFAULT_HISTORY_MESSAGES;

/// The session a bearer opened.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub id: String,
    pub workspace_id: String,
    /// The chat of a chat turn; `None` for a run without a chat.
    pub chat_id: Option<String>,
}

impl Session {
    /// Whether `file` is in this session's bag.
    fn holds(&self, file: &FileRow) -> bool {
        file.workspace_id == self.workspace_id
            && match &self.chat_id {
                Some(chat) => file.chat_id.as_deref() == Some(chat),
                None => file.run_id.as_deref() == Some(&self.id),
            }
    }
}

/// A file of the bag, as the sandbox sees it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct BagFile {
    pub id: String,
    pub path: String,
    pub mime_type: String,
    pub size: u64,
    pub sha256: String,
    pub created_at: i64,
}

impl From<&FileRow> for BagFile {
    fn from(f: &FileRow) -> Self {
        BagFile {
            id: f.id.clone(),
            path: f.path.clone(),
            mime_type: f.mime_type.clone(),
            size: u64::try_from(f.size).unwrap_or(0),
            sha256: f.sha256.clone(),
            created_at: f.created_at,
        }
    }
}

/// One message of the chat's history.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct HistoryMessage {
    pub role: Role,
    pub text: String,
    pub created_at: i64,
}

/// The session `headers`' bearer opens, if it opens `session_id`.
pub(crate) async fn authorize(
    state: &AppState,
    session_id: &str,
    headers: &HeaderMap,
) -> Result<Session, WorkspaceError> {
    let bearer = tokens::bearer(headers).ok_or(WorkspaceError::Unauthorized)?;
    // Only a workspace bearer: an API key, a callback token or a cookie's
    // secret is never one, even with a matching hash.
    if !bearer.starts_with(WORKSPACE_PREFIX)
        || !asbx_protocol::dispatch::is_valid_session_id(session_id)
    {
        return Err(WorkspaceError::Unauthorized);
    }
    let (workspace_id, chat_id) = token_store::workspace_bearer(
        state.store.pool(),
        &tokens::hash(bearer),
        session_id,
        state.now_ms(),
    )
    .await?
    .ok_or(WorkspaceError::Unauthorized)?;
    Ok(Session {
        id: session_id.to_owned(),
        workspace_id,
        chat_id,
    })
}

/// The bag, oldest first.
pub(crate) async fn list(state: &AppState, s: &Session) -> Result<Vec<FileRow>, WorkspaceError> {
    let rows = match &s.chat_id {
        Some(chat) => files::list_for_chat(state.store.pool(), chat, &s.workspace_id).await?,
        None => files::list_for_run(state.store.pool(), &s.id).await?,
    };
    Ok(rows.into_iter().filter(|f| s.holds(f)).collect())
}

/// One file of the bag; a file elsewhere is not found.
pub(crate) async fn file(
    state: &AppState,
    s: &Session,
    id: &str,
) -> Result<FileRow, WorkspaceError> {
    files::get_in(state.store.pool(), id, &s.workspace_id)
        .await?
        .filter(|f| s.holds(f))
        .ok_or_else(|| WorkspaceError::NotFound(format!("file {id}")))
}

/// Checks a new file's `path` and `content-type` (default
/// `application/octet-stream`) before a byte of its body is read.
pub(crate) fn check_new_file(
    path: Option<&str>,
    content_type: Option<&str>,
) -> Result<(String, String), WorkspaceError> {
    let mut errors = Vec::new();
    let path = match path {
        None => {
            errors.push(asbx_protocol::FieldError::new("path", "required"));
            ""
        }
        Some(p) => {
            if let Err(m) = validate::relative_path(p) {
                errors.push(asbx_protocol::FieldError::new("path", m));
            }
            p
        }
    };
    let mime = match content_type.map(str::trim).filter(|m| !m.is_empty()) {
        None => "application/octet-stream",
        Some(m) => {
            if let Err(msg) = validate::mime_type(m) {
                errors.push(asbx_protocol::FieldError::new("content-type", msg));
            }
            m
        }
    };
    if errors.is_empty() {
        Ok((path.to_owned(), mime.to_owned()))
    } else {
        Err(WorkspaceError::invalid_fields(errors))
    }
}

/// Streams a new file into the blob store (at most [`MAX_FILE_BYTES`],
/// hashed as it arrives) and adds it to the bag.
pub(crate) async fn create<S, E>(
    state: &AppState,
    s: &Session,
    path: String,
    mime_type: String,
    body: S,
) -> Result<FileRow, WorkspaceError>
where
    S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let blob = state.blobs.put_stream(body, MAX_FILE_BYTES).await?;
    let (sha256, size) = (blob.sha256.clone(), blob.size);
    let row = FileRow {
        id: tokens::random_id(),
        workspace_id: s.workspace_id.clone(),
        run_id: Some(s.id.clone()),
        chat_id: s.chat_id.clone(),
        origin: FileOrigin::Sandbox,
        path,
        mime_type,
        size: i64::try_from(size).unwrap_or(i64::MAX),
        sha256,
        created_at: state.now_ms(),
    };
    let inserted = insert_upload(state, &row).await;
    state.blobs.release(blob).await;
    inserted?;
    Ok(row)
}

/// The newest `limit` messages of the session's chat, oldest first (none
/// for a run without a chat).
pub(crate) async fn history(
    state: &AppState,
    s: &Session,
    limit: usize,
) -> Result<Vec<HistoryMessage>, WorkspaceError> {
    let Some(chat) = &s.chat_id else {
        return Ok(Vec::new());
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let messages = chats::recent_messages(state.store.pool(), chat, limit).await?;
    Ok(messages
        .iter()
        .map(|m| HistoryMessage {
            role: m.role,
            text: m.replay_text(),
            created_at: m.created_at,
        })
        .collect())
}

/// Stores an upload's row if the workspace's `storage-mb` has room.
async fn insert_upload(state: &AppState, row: &FileRow) -> Result<(), WorkspaceError> {
    let mut tx = crate::quota::admit::begin_upload(state, &row.workspace_id, row.size).await?;
    files::insert(&mut *tx, row).await?;
    tx.commit().await?;
    Ok(())
}
