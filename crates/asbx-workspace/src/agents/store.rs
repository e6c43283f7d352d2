//! Stored agents: one row per agent, its definition as JSON text.
//!
//! Every query takes the caller's workspace id, so another workspace's agent
//! is simply not found; deleted agents are never found.

use sqlx::any::AnyRow;
use sqlx::{Any, Executor, Row as _};

use crate::error::WorkspaceError;

/// A stored agent.
#[derive(Debug, Clone)]
pub(crate) struct AgentRow {
    pub id: String,
    pub workspace_id: String,
    pub name: String,
    pub definition: String,
    pub created_at: i64,
    pub updated_at: i64,
}

const COLUMNS: &str = "id, workspace_id, name, definition, created_at, updated_at";

pub(crate) async fn insert<'c, E>(db: E, agent: &AgentRow) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    sqlx::query(
        "INSERT INTO agents (id, workspace_id, name, definition, created_at, updated_at, \
         deleted_at) VALUES ($1, $2, $3, $4, $5, $6, NULL)",
    )
    .bind(&agent.id)
    .bind(&agent.workspace_id)
    .bind(&agent.name)
    .bind(&agent.definition)
    .bind(agent.created_at)
    .bind(agent.updated_at)
    .execute(db)
    .await?;
    Ok(())
}

/// The agent `id` of `workspace_id`, unless deleted.
pub(crate) async fn get<'c, E>(
    db: E,
    workspace_id: &str,
    id: &str,
) -> Result<Option<AgentRow>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM agents WHERE id = $1 AND workspace_id = $2 AND deleted_at IS NULL"
    ))
    .bind(id)
    .bind(workspace_id)
    .fetch_optional(db)
    .await?;
    row.map(|r| from_row(&r)).transpose()
}

/// Every live agent of `workspace_id`, oldest first.
pub(crate) async fn list<'c, E>(db: E, workspace_id: &str) -> Result<Vec<AgentRow>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM agents WHERE workspace_id = $1 AND deleted_at IS NULL \
         ORDER BY created_at, id"
    ))
    .bind(workspace_id)
    .fetch_all(db)
    .await?;
    rows.iter().map(from_row).collect()
}

/// Replaces the definition of a live agent; false when there is none.
pub(crate) async fn update<'c, E>(
    db: E,
    workspace_id: &str,
    id: &str,
    name: &str,
    definition: &str,
    now_ms: i64,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done = sqlx::query(
        "UPDATE agents SET name = $1, definition = $2, updated_at = $3 \
         WHERE id = $4 AND workspace_id = $5 AND deleted_at IS NULL",
    )
    .bind(name)
    .bind(definition)
    .bind(now_ms)
    .bind(id)
    .bind(workspace_id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Marks a live agent deleted; false when there is none.
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
        "UPDATE agents SET deleted_at = $1 \
         WHERE id = $2 AND workspace_id = $3 AND deleted_at IS NULL",
    )
    .bind(now_ms)
    .bind(id)
    .bind(workspace_id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

fn from_row(r: &AnyRow) -> Result<AgentRow, WorkspaceError> {
    Ok(AgentRow {
        id: r.try_get("id")?,
        workspace_id: r.try_get("workspace_id")?,
        name: r.try_get("name")?,
        definition: r.try_get("definition")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
    })
}

/// Agents (deleted ones too) whose definition may hold an MCP server's
/// `env`: id and definition text.
pub(crate) async fn definitions_with_env<'c, E>(
    db: E,
) -> Result<Vec<(String, String)>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let rows = sqlx::query("SELECT id, definition FROM agents WHERE definition LIKE '%\"env\"%'")
        .fetch_all(db)
        .await?;
    rows.iter()
        .map(|r| Ok((r.try_get("id")?, r.try_get("definition")?)))
        .collect()
}

/// Replaces an agent's definition if it is still `old` (not touching
/// `updated_at`); whether it was.
pub(crate) async fn replace_definition<'c, E>(
    db: E,
    id: &str,
    old: &str,
    new: &str,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done = sqlx::query("UPDATE agents SET definition = $1 WHERE id = $2 AND definition = $3")
        .bind(new)
        .bind(id)
        .bind(old)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}
