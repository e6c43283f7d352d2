//! The lease's statements: every write to a chat's lease columns
//! (`lease_turn_id`, `lease_expires_at`, `lease_holder`) is one of these,
//! but the soft delete's (which clears them with the chat). Each is one
//! conditional `UPDATE` (or the chat's `INSERT`), so of two nodes racing for
//! a lease one wins.

use sqlx::{Any, Executor};

use crate::chats::store::{COLUMNS, ChatRow, from_row};
use crate::error::WorkspaceError;

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

/// Clears the lease of a turn that has finished (its assistant message is
/// stored) but whose node has not released it yet: it ended by a path that
/// stores the message before the release (marked lost, or the database
/// came back late). A client that got `done` on another node and starts
/// the next turn at once is not told `409 turn_in_flight` for a finished
/// turn. True when it cleared one.
pub(crate) async fn clear_finished_lease<'c, E>(
    db: E,
    chat_id: &str,
    workspace_id: &str,
    now_ms: i64,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done = sqlx::query(
        "UPDATE chats SET lease_turn_id = NULL, lease_expires_at = NULL, lease_holder = NULL, \
         updated_at = $1 WHERE id = $2 AND workspace_id = $3 AND lease_turn_id IS NOT NULL \
         AND EXISTS (SELECT 1 FROM messages WHERE messages.chat_id = chats.id \
         AND messages.turn_id = chats.lease_turn_id AND messages.role = 'assistant')",
    )
    .bind(now_ms)
    .bind(chat_id)
    .bind(workspace_id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
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

#[cfg(test)]
mod tests {
    use sqlx::Row as _;

    use super::*;
    use crate::chats::store::{get, get_with_settings};

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
