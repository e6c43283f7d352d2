//! Workspaces, their API keys and browser sessions (hashes only).

use sqlx::{Any, Executor, Row as _};

use crate::error::WorkspaceError;

pub(crate) async fn create_workspace<'c, E>(
    db: E,
    id: &str,
    name: &str,
    now_ms: i64,
) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    sqlx::query("INSERT INTO workspaces (id, name, created_at) VALUES ($1, $2, $3)")
        .bind(id)
        .bind(name)
        .bind(now_ms)
        .execute(db)
        .await?;
    Ok(())
}

pub(crate) async fn workspace_name<'c, E>(db: E, id: &str) -> Result<Option<String>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query("SELECT name FROM workspaces WHERE id = $1")
        .bind(id)
        .fetch_optional(db)
        .await?;
    Ok(row.map(|r| r.try_get("name")).transpose()?)
}

pub(crate) async fn insert_key<'c, E>(
    db: E,
    hash: &str,
    workspace_id: &str,
    name: &str,
    now_ms: i64,
) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    sqlx::query(
        "INSERT INTO api_keys (hash, workspace_id, name, created_at, revoked_at) \
         VALUES ($1, $2, $3, $4, NULL)",
    )
    .bind(hash)
    .bind(workspace_id)
    .bind(name)
    .bind(now_ms)
    .execute(db)
    .await?;
    Ok(())
}

/// Revokes the unrevoked key of `workspace_id` whose hash is `hash`, or
/// starts with it (a `keyId`, as the audit log names keys) when exactly
/// one does: its `(hash, name)`; `None` when none (or several) match.
pub(crate) async fn revoke_key(
    db: &sqlx::AnyPool,
    workspace_id: &str,
    hash: &str,
    now_ms: i64,
) -> Result<Option<(String, String)>, WorkspaceError> {
    let rows = sqlx::query(
        "SELECT hash, name FROM api_keys WHERE workspace_id = $1 AND revoked_at IS NULL \
         AND SUBSTR(hash, 1, LENGTH($2)) = $2",
    )
    .bind(workspace_id)
    .bind(hash)
    .fetch_all(db)
    .await?;
    let [row] = rows.as_slice() else {
        return Ok(None);
    };
    let (hash, name): (String, String) = (row.try_get("hash")?, row.try_get("name")?);
    let done =
        sqlx::query("UPDATE api_keys SET revoked_at = $1 WHERE hash = $2 AND revoked_at IS NULL")
            .bind(now_ms)
            .bind(&hash)
            .execute(db)
            .await?;
    Ok((done.rows_affected() == 1).then_some((hash, name)))
}

/// The workspace of an unrevoked key.
pub(crate) async fn key_workspace<'c, E>(
    db: E,
    hash: &str,
) -> Result<Option<String>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row =
        sqlx::query("SELECT workspace_id FROM api_keys WHERE hash = $1 AND revoked_at IS NULL")
            .bind(hash)
            .fetch_optional(db)
            .await?;
    Ok(row.map(|r| r.try_get("workspace_id")).transpose()?)
}

pub(crate) async fn insert_session<'c, E>(
    db: E,
    hash: &str,
    workspace_id: &str,
    now_ms: i64,
    expires_at: i64,
) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    sqlx::query(
        "INSERT INTO web_sessions (hash, workspace_id, created_at, expires_at) \
         VALUES ($1, $2, $3, $4)",
    )
    .bind(hash)
    .bind(workspace_id)
    .bind(now_ms)
    .bind(expires_at)
    .execute(db)
    .await?;
    Ok(())
}

/// The workspace of an unexpired browser session.
pub(crate) async fn session_workspace<'c, E>(
    db: E,
    hash: &str,
    now_ms: i64,
) -> Result<Option<String>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row =
        sqlx::query("SELECT workspace_id FROM web_sessions WHERE hash = $1 AND expires_at > $2")
            .bind(hash)
            .bind(now_ms)
            .fetch_optional(db)
            .await?;
    Ok(row.map(|r| r.try_get("workspace_id")).transpose()?)
}

pub(crate) async fn delete_session<'c, E>(db: E, hash: &str) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    sqlx::query("DELETE FROM web_sessions WHERE hash = $1")
        .bind(hash)
        .execute(db)
        .await?;
    Ok(())
}
