//! Which kept directory a request means: a chat's latest, or the one its
//! chat had when the turn of one assistant message ended. Forks,
//! `workdir.tar` and runs that start from a chat (`POST /api/runs` with
//! `workdir.from`) all pick theirs here, and all refuse one whose bytes are
//! no longer kept (`410 workdir_gone`).

use asbx_protocol::workdir::WorkdirManifest;
use sqlx::Row as _;

use crate::error::WorkspaceError;
use crate::workdir::store::{self, Snapshot};

/// The assistant message `message_id` of `chat_id`: its position, and the
/// kept directory the chat had when its turn ended.
pub(crate) async fn at_message(
    conn: &mut sqlx::AnyConnection,
    chat_id: &str,
    message_id: &str,
) -> Result<(i64, Option<String>), WorkspaceError> {
    let after = sqlx::query(
        "SELECT position, role, turn_id, created_at FROM messages WHERE id = $1 AND chat_id = $2",
    )
    .bind(message_id)
    .bind(chat_id)
    .fetch_optional(&mut *conn)
    .await?;
    let not_assistant = || {
        WorkspaceError::invalid_fields(vec![asbx_protocol::FieldError::new(
            "afterMessageId",
            "not an assistant message of this chat",
        )])
    };
    let after = after.ok_or_else(not_assistant)?;
    if after.try_get::<String, _>("role")? != "assistant" {
        return Err(not_assistant());
    }
    let position: i64 = after.try_get("position")?;
    let turn_id: Option<String> = after.try_get("turn_id")?;
    let at: i64 = after.try_get("created_at")?;
    let from = store::at_turn(&mut *conn, chat_id, turn_id.as_deref(), at).await?;
    Ok((position, from))
}

fn at(after_message_id: Option<&str>) -> String {
    after_message_id
        .map(|m| format!(" after message {m}"))
        .unwrap_or_default()
}

/// Refuses a snapshot whose bytes are no longer kept.
pub(crate) fn restorable(
    snapshot: Snapshot,
    chat_id: &str,
    after_message_id: Option<&str>,
) -> Result<Snapshot, WorkspaceError> {
    if snapshot.restorable {
        return Ok(snapshot);
    }
    Err(WorkspaceError::WorkdirGone {
        chat_id: chat_id.to_owned(),
        at: at(after_message_id),
    })
}

/// The directory a run starts from: chat `chat_id` of `workspace_id`
/// (another workspace's is not found), its latest kept directory or the
/// one after `after_message_id`'s turn. A chat that kept none is `409
/// workdir_not_kept`, one no longer kept `410 workdir_gone`.
pub(crate) async fn for_run(
    pool: &sqlx::AnyPool,
    workspace_id: &str,
    chat_id: &str,
    after_message_id: Option<&str>,
) -> Result<WorkdirManifest, WorkspaceError> {
    let mut conn = pool.acquire().await?;
    let owned = sqlx::query("SELECT 1 FROM chats WHERE id = $1 AND workspace_id = $2")
        .bind(chat_id)
        .bind(workspace_id)
        .fetch_optional(&mut *conn)
        .await?;
    if owned.is_none() {
        return Err(WorkspaceError::NotFound(format!("chat {chat_id}")));
    }
    let snapshot = match after_message_id {
        Some(m) => match at_message(&mut conn, chat_id, m).await?.1 {
            Some(id) => store::get(&mut *conn, &id).await?,
            None => None,
        },
        None => store::latest(&mut *conn, chat_id).await?,
    };
    let not_kept = || WorkspaceError::WorkdirNotKept {
        chat_id: chat_id.to_owned(),
        at: at(after_message_id),
    };
    let snapshot = restorable(snapshot.ok_or_else(not_kept)?, chat_id, after_message_id)?;
    snapshot.manifest.ok_or_else(not_kept)
}
