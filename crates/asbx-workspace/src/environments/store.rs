//! Named environments, one row each (variables, secrets and allowed hosts as
//! JSON text), and the `settings` column of chats.
//!
//! Every query takes the caller's workspace id, so another workspace's
//! environment (or chat) is simply not found; deleted ones are never found.

use sqlx::any::AnyRow;
use sqlx::{Any, Executor, Row as _};

use crate::error::WorkspaceError;

/// A stored environment. `secrets` is never answered (see `Debug`, too).
#[derive(Clone)]
pub(crate) struct EnvironmentRow {
    pub id: String,
    pub workspace_id: String,
    pub name: String,
    /// JSON object.
    pub variables: String,
    /// JSON object; write-only.
    pub secrets: String,
    /// JSON object: secret name to its binding (`InjectSpec`), no value.
    pub secret_inject: String,
    pub setup_script: Option<String>,
    /// JSON array.
    pub allowed_hosts: String,
    pub created_at: i64,
    pub updated_at: i64,
}

impl std::fmt::Debug for EnvironmentRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvironmentRow")
            .field("id", &self.id)
            .field("workspace_id", &self.workspace_id)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

const COLUMNS: &str = "id, workspace_id, name, variables, secrets, secret_inject, setup_script, \
                       allowed_hosts, created_at, updated_at";

/// Inserts a new environment; [`WorkspaceError::Conflict`] when a live one
/// of the workspace has its name.
pub(crate) async fn insert<'c, E>(db: E, env: &EnvironmentRow) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    sqlx::query(
        "INSERT INTO environments (id, workspace_id, name, variables, secrets, setup_script, \
         allowed_hosts, created_at, updated_at, deleted_at, secret_inject) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, NULL, $10)",
    )
    .bind(&env.id)
    .bind(&env.workspace_id)
    .bind(&env.name)
    .bind(&env.variables)
    .bind(&env.secrets)
    .bind(&env.setup_script)
    .bind(&env.allowed_hosts)
    .bind(env.created_at)
    .bind(env.updated_at)
    .bind(&env.secret_inject)
    .execute(db)
    .await
    .map_err(|e| name_taken(e, &env.name))?;
    Ok(())
}

/// The environment `id` of `workspace_id`, unless deleted.
pub(crate) async fn get<'c, E>(
    db: E,
    workspace_id: &str,
    id: &str,
) -> Result<Option<EnvironmentRow>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM environments \
         WHERE id = $1 AND workspace_id = $2 AND deleted_at IS NULL"
    ))
    .bind(id)
    .bind(workspace_id)
    .fetch_optional(db)
    .await?;
    row.map(|r| from_row(&r)).transpose()
}

/// The live environment of `workspace_id` with this id, or else this name.
pub(crate) async fn find<'c, E>(
    db: E,
    workspace_id: &str,
    id_or_name: &str,
) -> Result<Option<EnvironmentRow>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM environments \
         WHERE workspace_id = $1 AND deleted_at IS NULL AND (id = $2 OR name = $2)"
    ))
    .bind(workspace_id)
    .bind(id_or_name)
    .fetch_all(db)
    .await?;
    let rows = rows.iter().map(from_row).collect::<Result<Vec<_>, _>>()?;
    // An id match wins over another environment named like that id.
    let by_id = rows.iter().position(|r| r.id == id_or_name);
    Ok(match by_id {
        Some(i) => rows.into_iter().nth(i),
        None => rows.into_iter().next(),
    })
}

/// Every live environment of `workspace_id`, by name.
pub(crate) async fn list<'c, E>(
    db: E,
    workspace_id: &str,
) -> Result<Vec<EnvironmentRow>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM environments WHERE workspace_id = $1 AND deleted_at IS NULL \
         ORDER BY name, id"
    ))
    .bind(workspace_id)
    .fetch_all(db)
    .await?;
    rows.iter().map(from_row).collect()
}

/// Replaces a live environment's fields (`env.id` in `env.workspace_id`);
/// false when there is none, [`WorkspaceError::Conflict`] when the new name
/// is another live environment's.
pub(crate) async fn update<'c, E>(db: E, env: &EnvironmentRow) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done = sqlx::query(
        "UPDATE environments SET name = $1, variables = $2, secrets = $3, setup_script = $4, \
         allowed_hosts = $5, updated_at = $6, secret_inject = $9 \
         WHERE id = $7 AND workspace_id = $8 AND deleted_at IS NULL",
    )
    .bind(&env.name)
    .bind(&env.variables)
    .bind(&env.secrets)
    .bind(&env.setup_script)
    .bind(&env.allowed_hosts)
    .bind(env.updated_at)
    .bind(&env.id)
    .bind(&env.workspace_id)
    .bind(&env.secret_inject)
    .execute(db)
    .await
    .map_err(|e| name_taken(e, &env.name))?;
    Ok(done.rows_affected() == 1)
}

/// Marks a live environment deleted; false when there is none.
pub(crate) async fn delete<'c, E>(
    db: E,
    workspace_id: &str,
    id: &str,
    now_ms: i64,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done = sqlx::query(
        "UPDATE environments SET deleted_at = $1 \
         WHERE id = $2 AND workspace_id = $3 AND deleted_at IS NULL",
    )
    .bind(now_ms)
    .bind(id)
    .bind(workspace_id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// A live chat's stored settings: `None` when there is no such chat,
/// `Some(None)` when it has none.
pub(crate) async fn chat_settings<'c, E>(
    db: E,
    workspace_id: &str,
    chat_id: &str,
) -> Result<Option<Option<String>>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(
        "SELECT settings FROM chats WHERE id = $1 AND workspace_id = $2 AND deleted_at IS NULL",
    )
    .bind(chat_id)
    .bind(workspace_id)
    .fetch_optional(db)
    .await?;
    row.map(|r| r.try_get::<Option<String>, _>("settings"))
        .transpose()
        .map_err(Into::into)
}

/// Stores a live chat's settings; false when there is no such chat.
pub(crate) async fn set_chat_settings<'c, E>(
    db: E,
    workspace_id: &str,
    chat_id: &str,
    settings: &str,
    now_ms: i64,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done = sqlx::query(
        "UPDATE chats SET settings = $1, updated_at = $2 \
         WHERE id = $3 AND workspace_id = $4 AND deleted_at IS NULL",
    )
    .bind(settings)
    .bind(now_ms)
    .bind(chat_id)
    .bind(workspace_id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

fn name_taken(e: sqlx::Error, name: &str) -> WorkspaceError {
    match &e {
        sqlx::Error::Database(d) if d.is_unique_violation() => WorkspaceError::Conflict(format!(
            "an environment named {name:?} already exists in this workspace"
        )),
        _ => e.into(),
    }
}

fn from_row(r: &AnyRow) -> Result<EnvironmentRow, WorkspaceError> {
    Ok(EnvironmentRow {
        id: r.try_get("id")?,
        workspace_id: r.try_get("workspace_id")?,
        name: r.try_get("name")?,
        variables: r.try_get("variables")?,
        secrets: r.try_get("secrets")?,
        secret_inject: r.try_get("secret_inject")?,
        setup_script: r.try_get("setup_script")?,
        allowed_hosts: r.try_get("allowed_hosts")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
    })
}

/// One environment's stored secrets, deleted or not (for resealing).
#[derive(Clone)]
pub(crate) struct StoredSecrets {
    pub id: String,
    /// JSON object, names to sealed (or, from before sealing, clear) values.
    pub secrets: String,
    pub deleted: bool,
}

/// Every environment's secrets that are not `{}`, deleted ones included.
pub(crate) async fn all_secrets<'c, E>(db: E) -> Result<Vec<StoredSecrets>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let rows = sqlx::query(
        "SELECT id, secrets, deleted_at FROM environments WHERE secrets <> '{}' ORDER BY id",
    )
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(StoredSecrets {
                id: r.try_get("id")?,
                secrets: r.try_get("secrets")?,
                deleted: r.try_get::<Option<i64>, _>("deleted_at")?.is_some(),
            })
        })
        .collect()
}

/// Replaces an environment's secrets if they are still `old`; whether
/// they were.
pub(crate) async fn replace_secrets<'c, E>(
    db: E,
    id: &str,
    old: &str,
    new: &str,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done = sqlx::query("UPDATE environments SET secrets = $1 WHERE id = $2 AND secrets = $3")
        .bind(new)
        .bind(id)
        .bind(old)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Chats (deleted ones too) whose settings may hold an MCP server's `env`:
/// id and settings text.
pub(crate) async fn settings_with_env<'c, E>(db: E) -> Result<Vec<(String, String)>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let rows = sqlx::query(
        "SELECT id, settings FROM chats WHERE settings IS NOT NULL AND settings LIKE '%\"env\"%'",
    )
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| Ok((r.try_get("id")?, r.try_get("settings")?)))
        .collect()
}

/// Replaces a chat's settings if they are still `old` (not touching
/// `updated_at`: nothing a user sees changed); whether they were.
pub(crate) async fn replace_chat_settings<'c, E>(
    db: E,
    chat_id: &str,
    old: &str,
    new: &str,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done = sqlx::query("UPDATE chats SET settings = $1 WHERE id = $2 AND settings = $3")
        .bind(new)
        .bind(chat_id)
        .bind(old)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}
