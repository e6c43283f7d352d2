//! Chats and their messages: the rows, the thread's pages, soft delete.
//!
//! The chat row also carries the per-chat single-flight lease; its
//! statements are the lease room's (`chats::lease::sql`).

use sqlx::any::AnyRow;
use sqlx::{Any, Executor, Row as _};

use crate::error::WorkspaceError;
use crate::wire::PersistedMessage;

/// A stored chat.
#[derive(Debug, Clone)]
pub(crate) struct ChatRow {
    pub id: String,
    pub workspace_id: String,
    pub title: String,
    pub lease_turn_id: Option<String>,
    pub lease_expires_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
    /// The chat this one was forked from (CONTRACT §11).
    pub forked_from: Option<String>,
}

impl ChatRow {
    /// The turn holding an unexpired lease at `now_ms`.
    pub(crate) fn active_turn(&self, now_ms: i64) -> Option<&str> {
        match (&self.lease_turn_id, self.lease_expires_at) {
            (Some(turn), Some(exp)) if exp > now_ms => Some(turn),
            _ => None,
        }
    }
}

pub(crate) const COLUMNS: &str =
    "id, workspace_id, title, lease_turn_id, lease_expires_at, created_at, updated_at, forked_from";

/// Whether the turn's assistant message is stored.
pub(crate) async fn has_assistant_message<'c, E>(
    db: E,
    chat_id: &str,
    turn_id: &str,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(
        "SELECT COUNT(*) AS n FROM messages WHERE chat_id = $1 AND turn_id = $2 \
         AND role = 'assistant'",
    )
    .bind(chat_id)
    .bind(turn_id)
    .fetch_one(db)
    .await?;
    Ok(row.try_get::<i64, _>("n")? > 0)
}

/// The ids of a turn's user and assistant messages, when stored.
pub(crate) async fn turn_message_ids<'c, E>(
    db: E,
    chat_id: &str,
    turn_id: &str,
) -> Result<(Option<String>, Option<String>), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    // No `ORDER BY position`: with it SQLite walks the chat's whole
    // (chat_id, position) index instead of `messages_turn`; a turn has one
    // or two rows, ordered here.
    let mut rows =
        sqlx::query("SELECT id, role, position FROM messages WHERE chat_id = $1 AND turn_id = $2")
            .bind(chat_id)
            .bind(turn_id)
            .fetch_all(db)
            .await?
            .into_iter()
            .map(|r| -> Result<(i64, String, String), sqlx::Error> {
                Ok((r.try_get("position")?, r.try_get("id")?, r.try_get("role")?))
            })
            .collect::<Result<Vec<_>, _>>()?;
    rows.sort_unstable();
    let (mut user, mut assistant) = (None, None);
    for (_, id, role) in rows {
        match role.as_str() {
            "user" => user = user.or(Some(id)),
            _ => assistant = Some(id),
        }
    }
    Ok((user, assistant))
}

/// A live (not deleted) chat of `workspace_id`.
pub(crate) async fn get<'c, E>(
    db: E,
    id: &str,
    workspace_id: &str,
) -> Result<Option<ChatRow>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM chats WHERE id = $1 AND workspace_id = $2 AND deleted_at IS NULL"
    ))
    .bind(id)
    .bind(workspace_id)
    .fetch_optional(db)
    .await?;
    row.map(|r| from_row(&r)).transpose()
}

/// [`get`] and the chat's stored settings (their JSON text, `None` when it
/// has none), in one read: what a turn's start needs of its chat.
pub(crate) async fn get_with_settings<'c, E>(
    db: E,
    id: &str,
    workspace_id: &str,
) -> Result<Option<(ChatRow, Option<String>)>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS}, settings FROM chats \
         WHERE id = $1 AND workspace_id = $2 AND deleted_at IS NULL"
    ))
    .bind(id)
    .bind(workspace_id)
    .fetch_optional(db)
    .await?;
    row.map(|r| Ok((from_row(&r)?, r.try_get::<Option<String>, _>("settings")?)))
        .transpose()
}

/// Live chats of a workspace, most recently updated first.
pub(crate) async fn list<'c, E>(db: E, workspace_id: &str) -> Result<Vec<ChatRow>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM chats WHERE workspace_id = $1 AND deleted_at IS NULL \
         ORDER BY updated_at DESC, id LIMIT 500"
    ))
    .bind(workspace_id)
    .fetch_all(db)
    .await?;
    rows.iter().map(from_row).collect()
}

/// Soft-deletes a chat and its bag files.
pub(crate) async fn soft_delete(
    pool: &sqlx::AnyPool,
    id: &str,
    workspace_id: &str,
    now_ms: i64,
) -> Result<bool, WorkspaceError> {
    let mut tx = crate::store::begin_write(pool).await?;
    let done = sqlx::query(
        "UPDATE chats SET deleted_at = $1, lease_turn_id = NULL, lease_expires_at = NULL \
         WHERE id = $2 AND workspace_id = $3 AND deleted_at IS NULL",
    )
    .bind(now_ms)
    .bind(id)
    .bind(workspace_id)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() == 1 {
        sqlx::query(
            "UPDATE files SET deleted_at = $1 WHERE chat_id = $2 AND workspace_id = $3 \
             AND deleted_at IS NULL",
        )
        .bind(now_ms)
        .bind(id)
        .bind(workspace_id)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(done.rows_affected() == 1)
}

/// Appends a message at the end of a chat.
///
/// Only the lease holder appends, so the position computed from the current
/// maximum cannot race; the `UNIQUE (chat_id, position)` constraint would
/// refuse it if it ever did. The maximum is read as the newest row of the
/// index (`ORDER BY position DESC LIMIT 1`), one step whatever the chat's
/// length (SQLite's `MAX()` under `COALESCE` walks every row of the chat).
pub(crate) async fn append_message<'c, E>(
    db: E,
    chat_id: &str,
    message: &PersistedMessage,
) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let role = match message.role {
        asbx_protocol::callback::Role::User => "user",
        asbx_protocol::callback::Role::Assistant => "assistant",
    };
    let content = serde_json::to_string(&message.content)
        .map_err(|e| WorkspaceError::Corrupt(format!("message content: {e}")))?;
    let attachments = serde_json::to_string(&message.file_attachments)
        .map_err(|e| WorkspaceError::Corrupt(format!("message attachments: {e}")))?;
    // A turn's assistant message is stored once, whichever node (the one
    // that drove the turn, or one that took it over or found it lost) gets
    // there first.
    sqlx::query(
        "INSERT INTO messages (id, chat_id, position, role, content, attachments, turn_id, \
         created_at) SELECT $1, $2, next.position, $3, $4, $5, $6, $7 \
         FROM (SELECT COALESCE((SELECT position FROM messages WHERE chat_id = $2 \
         ORDER BY position DESC LIMIT 1), 0) + 1 AS position) AS next \
         WHERE $3 <> 'assistant' OR $6 IS NULL OR NOT EXISTS (SELECT 1 FROM messages \
         WHERE chat_id = $2 AND turn_id = $6 AND role = 'assistant')",
    )
    .bind(&message.id)
    .bind(chat_id)
    .bind(role)
    .bind(content)
    .bind(attachments)
    .bind(message.turn_id.as_deref())
    .bind(message.created_at)
    .execute(db)
    .await?;
    Ok(())
}

/// The last `limit` messages of a chat, oldest first.
pub(crate) async fn recent_messages<'c, E>(
    db: E,
    chat_id: &str,
    limit: i64,
) -> Result<Vec<PersistedMessage>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let rows = sqlx::query(
        "SELECT id, role, content, attachments, turn_id, created_at FROM messages \
         WHERE chat_id = $1 ORDER BY position DESC LIMIT $2",
    )
    .bind(chat_id)
    .bind(limit)
    .fetch_all(db)
    .await?;
    let mut out = rows
        .iter()
        .map(message_from_row)
        .collect::<Result<Vec<_>, _>>()?;
    out.reverse();
    Ok(out)
}

/// A page of a chat's thread: the newest `limit` messages with a position
/// below `before` (all, without it), oldest first, and the position to page
/// on from when older ones exist. One indexed range read
/// (`UNIQUE (chat_id, position)`), so its cost does not grow with the chat.
pub(crate) async fn messages_page<'c, E>(
    db: E,
    chat_id: &str,
    before: Option<i64>,
    limit: i64,
) -> Result<(Vec<PersistedMessage>, Option<i64>), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let rows = sqlx::query(
        "SELECT id, role, content, attachments, turn_id, created_at, position FROM messages \
         WHERE chat_id = $1 AND position < $2 ORDER BY position DESC LIMIT $3",
    )
    .bind(chat_id)
    .bind(before.unwrap_or(i64::MAX))
    .bind(limit.saturating_add(1))
    .fetch_all(db)
    .await?;
    let more = rows.len() as i64 > limit;
    let page = &rows[..rows.len().min(usize::try_from(limit).unwrap_or(0))];
    let cursor = if more {
        page.last()
            .map(|r| r.try_get::<i64, _>("position"))
            .transpose()?
    } else {
        None
    };
    let mut messages = page
        .iter()
        .map(message_from_row)
        .collect::<Result<Vec<_>, _>>()?;
    messages.reverse();
    Ok((messages, cursor))
}

fn message_from_row(r: &AnyRow) -> Result<PersistedMessage, WorkspaceError> {
    let role = match r.try_get::<String, _>("role")?.as_str() {
        "user" => asbx_protocol::callback::Role::User,
        "assistant" => asbx_protocol::callback::Role::Assistant,
        other => return Err(WorkspaceError::Corrupt(format!("message role {other:?}"))),
    };
    let content: String = r.try_get("content")?;
    let attachments: String = r.try_get("attachments")?;
    Ok(PersistedMessage {
        id: r.try_get("id")?,
        role,
        content: serde_json::from_str(&content)
            .map_err(|e| WorkspaceError::Corrupt(format!("message content: {e}")))?,
        file_attachments: serde_json::from_str(&attachments)
            .map_err(|e| WorkspaceError::Corrupt(format!("message attachments: {e}")))?,
        created_at: r.try_get("created_at")?,
        turn_id: r.try_get("turn_id")?,
    })
}

pub(crate) fn from_row(r: &AnyRow) -> Result<ChatRow, WorkspaceError> {
    Ok(ChatRow {
        id: r.try_get("id")?,
        workspace_id: r.try_get("workspace_id")?,
        title: r.try_get("title")?,
        lease_turn_id: r.try_get("lease_turn_id")?,
        lease_expires_at: r.try_get("lease_expires_at")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
        forked_from: r.try_get("forked_from")?,
    })
}
