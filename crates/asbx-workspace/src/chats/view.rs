//! Read side of chats: the list, one chat with its thread and bag; and
//! uploads to a bag.

use crate::AppState;
use crate::chats::lease::takeover::recover_lost_turn;
use crate::chats::store::{self as chats, ChatRow};
use crate::error::WorkspaceError;
use crate::files::file_info;
use crate::files::store::{self as files, FileOrigin, FileRow};
use crate::tokens;
use crate::validate;
use asbx_protocol::FieldError;

use crate::wire::{
    CHAT_PAGE_DEFAULT, CHAT_PAGE_MAX, ChatDetail, ChatPageQuery, ChatSummary, FileInfo,
};

/// Largest upload to a bag: what one turn can attach (a larger file could
/// never be attached, issue 28), so `413` above it.
pub(crate) const MAX_UPLOAD_BYTES: usize = crate::chats::turn::MAX_ATTACHMENT_BYTES as usize;

fn summary(c: &ChatRow, now_ms: i64) -> ChatSummary {
    ChatSummary {
        id: c.id.clone(),
        title: c.title.clone(),
        created_at: c.created_at,
        updated_at: c.updated_at,
        active_turn_id: c.active_turn(now_ms).map(str::to_owned),
        forked_from: c.forked_from.clone(),
    }
}

pub(crate) async fn list(
    state: &AppState,
    workspace_id: &str,
) -> Result<Vec<ChatSummary>, WorkspaceError> {
    let mut rows = chats::list(state.store.pool(), workspace_id).await?;
    let mut recovered = false;
    for c in &rows {
        recovered |= recover_lost_turn(state, c).await?;
    }
    if recovered {
        rows = chats::list(state.store.pool(), workspace_id).await?;
    }
    let now = state.now_ms();
    Ok(rows.iter().map(|c| summary(c, now)).collect())
}

pub(crate) async fn detail(
    state: &AppState,
    workspace_id: &str,
    chat_id: &str,
    page: &ChatPageQuery,
) -> Result<ChatDetail, WorkspaceError> {
    let limit = match page.limit.as_deref() {
        None => CHAT_PAGE_DEFAULT,
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=CHAT_PAGE_MAX).contains(n))
            .ok_or_else(|| {
                WorkspaceError::invalid_fields(vec![FieldError::new(
                    "limit",
                    format!("must be a whole number from 1 to {CHAT_PAGE_MAX}"),
                )])
            })?,
    };
    let before = page
        .before
        .as_deref()
        .map(|v| {
            v.parse::<i64>().map_err(|_| {
                WorkspaceError::invalid_fields(vec![FieldError::new(
                    "before",
                    "must be the cursor of a previous page",
                )])
            })
        })
        .transpose()?;
    let mut chat = chats::get(state.store.pool(), chat_id, workspace_id)
        .await?
        .ok_or_else(|| WorkspaceError::NotFound(format!("chat {chat_id}")))?;
    if recover_lost_turn(state, &chat).await? {
        chat = chats::get(state.store.pool(), chat_id, workspace_id)
            .await?
            .ok_or_else(|| WorkspaceError::NotFound(format!("chat {chat_id}")))?;
    }
    let (messages, before) =
        chats::messages_page(state.store.pool(), chat_id, before, limit).await?;
    let files = files::list_for_chat(state.store.pool(), chat_id, workspace_id).await?;
    let settings = crate::environments::chat_settings_view(state, workspace_id, chat_id).await?;
    Ok(ChatDetail {
        chat: summary(&chat, state.now_ms()),
        messages,
        before,
        files: files.iter().map(file_info).collect(),
        settings,
    })
}

/// Stores an upload in the workspace's bag (in a chat's bag with `chat_id`).
pub(crate) async fn upload(
    state: &AppState,
    workspace_id: &str,
    name: &str,
    chat_id: Option<&str>,
    mime_type: Option<&str>,
    bytes: &[u8],
) -> Result<FileInfo, WorkspaceError> {
    let mut errors = Vec::new();
    if let Err(m) = validate::relative_path(name) {
        errors.push(asbx_protocol::FieldError::new("name", m));
    }
    let mime = match mime_type.map(|m| m.trim()).filter(|m| !m.is_empty()) {
        Some(m) => match validate::mime_type(m) {
            Ok(()) => m.to_owned(),
            Err(msg) => {
                errors.push(asbx_protocol::FieldError::new("content-type", msg));
                String::new()
            }
        },
        None => mime_guess::from_path(name)
            .first_or_octet_stream()
            .essence_str()
            .to_owned(),
    };
    if !errors.is_empty() {
        return Err(WorkspaceError::invalid_fields(errors));
    }
    if let Some(chat_id) = chat_id {
        chats::get(state.store.pool(), chat_id, workspace_id)
            .await?
            .ok_or_else(|| WorkspaceError::NotFound(format!("chat {chat_id}")))?;
    }
    let stored = state.blobs.put(bytes).await?;
    let row = FileRow {
        id: tokens::random_id(),
        workspace_id: workspace_id.to_owned(),
        run_id: None,
        chat_id: chat_id.map(str::to_owned),
        origin: FileOrigin::Upload,
        path: name.to_owned(),
        mime_type: mime,
        size: i64::try_from(bytes.len()).unwrap_or(i64::MAX),
        sha256: stored.sha256.clone(),
        created_at: state.now_ms(),
    };
    let inserted = insert_upload(state, &row).await;
    state.blobs.release(stored).await;
    inserted?;
    Ok(file_info(&row))
}

/// Stores an upload's row if the workspace's `storage-mb` has room.
async fn insert_upload(state: &AppState, row: &FileRow) -> Result<(), WorkspaceError> {
    let mut tx = crate::quota::admit::begin_upload(state, &row.workspace_id, row.size).await?;
    files::insert(&mut *tx, row).await?;
    tx.commit().await?;
    Ok(())
}
