//! Chats, their messages, and the per-chat single-flight lease.
//!
//! The lease is two columns on the chat row. Taking it is one conditional
//! `UPDATE` (free, or expired); the holder renews it while the turn runs and
//! clears it when the turn settles. A process that dies hard stops renewing,
//! so its lease expires and the next turn takes it over.

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

const COLUMNS: &str =
    "id, workspace_id, title, lease_turn_id, lease_expires_at, created_at, updated_at";

/// A turn taking a chat's lease: the turn, until when, now, and its user
/// message, whose id becomes the chat's conversation id if it has none
/// yet (the first turn's).
pub(crate) struct Lease<'a> {
    pub turn_id: &'a str,
    pub until: i64,
    pub now_ms: i64,
    pub first_message_id: &'a str,
}

/// Creates a chat whose lease is already held by `lease.turn_id`.
pub(crate) async fn create_leased<'c, E>(
    db: E,
    id: &str,
    workspace_id: &str,
    title: &str,
    lease: &Lease<'_>,
) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    sqlx::query(
        "INSERT INTO chats (id, workspace_id, title, conversation_id, lease_turn_id, \
         lease_expires_at, created_at, updated_at, deleted_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $7, NULL)",
    )
    .bind(id)
    .bind(workspace_id)
    .bind(title)
    .bind(lease.first_message_id)
    .bind(lease.turn_id)
    .bind(lease.until)
    .bind(lease.now_ms)
    .execute(db)
    .await?;
    Ok(())
}

/// Takes the lease of a live chat of `workspace_id` if it is free or
/// expired (and sets its conversation id if it has none).
pub(crate) async fn try_lease<'c, E>(
    db: E,
    chat_id: &str,
    workspace_id: &str,
    lease: &Lease<'_>,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done = sqlx::query(
        "UPDATE chats SET lease_turn_id = $1, lease_expires_at = $2, updated_at = $3, \
         lease_holder = NULL, conversation_id = COALESCE(conversation_id, $4) \
         WHERE id = $5 AND workspace_id = $6 AND deleted_at IS NULL \
         AND (lease_turn_id IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= $3)",
    )
    .bind(lease.turn_id)
    .bind(lease.until)
    .bind(lease.now_ms)
    .bind(lease.first_message_id)
    .bind(chat_id)
    .bind(workspace_id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The lease is the turn's (`$3`) and the node asking drives it (`$4`:
/// `""` for the node that started the turn, else the node that took it
/// over): what [`renew_lease`] and [`release_held_lease`] check.
const HELD_BY: &str = "id = $2 AND lease_turn_id = $3 AND COALESCE(lease_holder, '') = $4";

/// Extends the lease while `turn_id` still holds it and `holder` drives it
/// ([`HELD_BY`]); false if it lost it.
pub(crate) async fn renew_lease<'c, E>(
    db: E,
    chat_id: &str,
    turn_id: &str,
    holder: &str,
    lease_until: i64,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done = sqlx::query(&format!(
        "UPDATE chats SET lease_expires_at = $1 WHERE {HELD_BY}"
    ))
    .bind(lease_until)
    .bind(chat_id)
    .bind(turn_id)
    .bind(holder)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Takes over the expired lease `turn_id` still holds (its node stopped
/// renewing it): `holder` drives the turn from now on. One statement, so
/// one node wins.
pub(crate) async fn take_over_lease<'c, E>(
    db: E,
    chat_id: &str,
    turn_id: &str,
    holder: &str,
    lease_until: i64,
    now_ms: i64,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done = sqlx::query(
        "UPDATE chats SET lease_holder = $1, lease_expires_at = $2 \
         WHERE id = $3 AND lease_turn_id = $4 AND lease_expires_at <= $5 AND deleted_at IS NULL",
    )
    .bind(holder)
    .bind(lease_until)
    .bind(chat_id)
    .bind(turn_id)
    .bind(now_ms)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Chats whose lease expired at `now_ms` while a turn held it: the turns a
/// node may take over. At most `limit`.
pub(crate) async fn expired_leases<'c, E>(
    db: E,
    now_ms: i64,
    limit: i64,
) -> Result<Vec<ChatRow>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM chats WHERE lease_turn_id IS NOT NULL \
         AND lease_expires_at <= $1 AND deleted_at IS NULL ORDER BY lease_expires_at LIMIT $2"
    ))
    .bind(now_ms)
    .bind(limit)
    .fetch_all(db)
    .await?;
    rows.iter().map(from_row).collect()
}

/// Clears the lease if `turn_id` holds it.
pub(crate) async fn release_lease<'c, E>(
    db: E,
    chat_id: &str,
    turn_id: &str,
    now_ms: i64,
) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    sqlx::query(
        "UPDATE chats SET lease_turn_id = NULL, lease_expires_at = NULL, updated_at = $1 \
         WHERE id = $2 AND lease_turn_id = $3",
    )
    .bind(now_ms)
    .bind(chat_id)
    .bind(turn_id)
    .execute(db)
    .await?;
    Ok(())
}

/// Releases the lease while `turn_id` still holds it and `holder` drives
/// it ([`HELD_BY`]); false, nothing changed, if it lost it. A turn's end
/// checks and releases in this one statement.
pub(crate) async fn release_held_lease<'c, E>(
    db: E,
    chat_id: &str,
    turn_id: &str,
    holder: &str,
    now_ms: i64,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done = sqlx::query(&format!(
        "UPDATE chats SET lease_turn_id = NULL, lease_expires_at = NULL, updated_at = $1 \
         WHERE {HELD_BY}"
    ))
    .bind(now_ms)
    .bind(chat_id)
    .bind(turn_id)
    .bind(holder)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Clears a lease `turn_id` still holds that expires by `until` (its turn
/// was lost; `i64::MAX`: whenever it expires); true if this call cleared it.
pub(crate) async fn clear_expired_lease<'c, E>(
    db: E,
    chat_id: &str,
    turn_id: &str,
    until: i64,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done = sqlx::query(
        "UPDATE chats SET lease_turn_id = NULL, lease_expires_at = NULL \
         WHERE id = $1 AND lease_turn_id = $2 AND lease_expires_at <= $3",
    )
    .bind(chat_id)
    .bind(turn_id)
    .bind(until)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

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
    let mut tx = pool.begin().await?;
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

fn from_row(r: &AnyRow) -> Result<ChatRow, WorkspaceError> {
    Ok(ChatRow {
        id: r.try_get("id")?,
        workspace_id: r.try_get("workspace_id")?,
        title: r.try_get("title")?,
        lease_turn_id: r.try_get("lease_turn_id")?,
        lease_expires_at: r.try_get("lease_expires_at")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A turn's end releases the lease only while its turn holds it and the
    /// node that drives the turn is the one asking: a turn taken over by
    /// another node, or a lease already given to the next turn, is left as
    /// it is. The first turn's message id becomes the conversation id, and
    /// a later lease keeps it.
    #[tokio::test]
    async fn a_lease_is_released_only_by_its_turn_and_holder() {
        let dir = tempfile::tempdir().unwrap();
        let config =
            crate::WorkspaceConfig::new(dir.path(), url::Url::parse("http://127.0.0.1/").unwrap());
        let ws = crate::Workspace::open(config).await.unwrap();
        let pool = ws.state.store.pool();
        let workspace = crate::DEFAULT_WORKSPACE;
        // Times ahead of the clock: the workspace's own sweep leaves
        // unexpired leases alone.
        let hour = 3_600_000;
        let t = ws.state.now_ms() + hour;
        let lease = |turn_id: &'static str, first_message_id: &'static str| Lease {
            turn_id,
            until: t,
            now_ms: t - hour,
            first_message_id,
        };
        let conversation = || async {
            let row = sqlx::query("SELECT conversation_id FROM chats WHERE id = 'c'")
                .fetch_one(pool)
                .await
                .unwrap();
            row.try_get::<Option<String>, _>("conversation_id").unwrap()
        };
        // Whether `turn`'s `holder` released the lease at `at`.
        let release = |turn: &'static str, holder: &'static str, at: i64| async move {
            release_held_lease(pool, "c", turn, holder, at)
                .await
                .unwrap()
        };
        create_leased(pool, "c", workspace, "t", &lease("turn-1", "m-1"))
            .await
            .unwrap();
        assert_eq!(conversation().await.as_deref(), Some("m-1"));

        // Node b took the expired lease over: node a (holder "") may not
        // release it, node b may.
        assert!(
            take_over_lease(pool, "c", "turn-1", "b", t + 2 * hour, t)
                .await
                .unwrap()
        );
        assert!(!release("turn-1", "", t + 1).await);
        let chat = get(pool, "c", workspace).await.unwrap().unwrap();
        assert_eq!(chat.lease_turn_id.as_deref(), Some("turn-1"));
        assert_eq!(
            chat.lease_expires_at,
            Some(t + 2 * hour),
            "the lease is untouched"
        );
        assert!(release("turn-1", "b", t + 1).await);
        let chat = get(pool, "c", workspace).await.unwrap().unwrap();
        assert_eq!((chat.lease_turn_id, chat.lease_expires_at), (None, None));
        assert_eq!(chat.updated_at, t + 1);

        // The next turn's lease: the old turn can no longer release it, and
        // the conversation id stays the first turn's.
        assert!(
            try_lease(pool, "c", workspace, &lease("turn-2", "m-2"))
                .await
                .unwrap()
        );
        assert!(!release("turn-1", "b", t + 2).await);
        assert!(!release("turn-1", "", t + 2).await);
        let chat = get(pool, "c", workspace).await.unwrap().unwrap();
        assert_eq!(chat.lease_turn_id.as_deref(), Some("turn-2"));
        assert_eq!(conversation().await.as_deref(), Some("m-1"));
        assert!(release("turn-2", "", t + 3).await);
        let (chat, settings) = get_with_settings(pool, "c", workspace)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((chat.lease_turn_id, settings), (None, None));
        assert!(
            get_with_settings(pool, "gone", workspace)
                .await
                .unwrap()
                .is_none()
        );
    }
}
