//! File rows: metadata of written-back and uploaded files (bytes are blobs).

use sqlx::any::AnyRow;
use sqlx::{Any, Executor, Row as _};

use crate::error::WorkspaceError;

/// Where a file came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileOrigin {
    /// Written back by a run through `/results`.
    Writeback,
    /// Uploaded by a user to a chat's bag.
    Upload,
    /// Created by a run through the in-sandbox workspace API.
    Sandbox,
}

impl FileOrigin {
    fn as_str(self) -> &'static str {
        match self {
            FileOrigin::Writeback => "writeback",
            FileOrigin::Upload => "upload",
            FileOrigin::Sandbox => "sandbox",
        }
    }

    fn parse(s: &str) -> Result<Self, WorkspaceError> {
        match s {
            "writeback" => Ok(FileOrigin::Writeback),
            "upload" => Ok(FileOrigin::Upload),
            "sandbox" => Ok(FileOrigin::Sandbox),
            other => Err(WorkspaceError::Corrupt(format!("file origin {other:?}"))),
        }
    }
}

/// A stored file.
#[derive(Debug, Clone)]
pub(crate) struct FileRow {
    pub id: String,
    pub workspace_id: String,
    pub run_id: Option<String>,
    pub chat_id: Option<String>,
    pub origin: FileOrigin,
    pub path: String,
    pub mime_type: String,
    pub size: i64,
    pub sha256: String,
    pub created_at: i64,
}

const COLUMNS: &str =
    "id, workspace_id, run_id, chat_id, origin, path, mime_type, size, sha256, created_at";

pub(crate) async fn insert<'c, E>(db: E, f: &FileRow) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    sqlx::query(
        "INSERT INTO files (id, workspace_id, run_id, chat_id, origin, path, mime_type, size, \
         sha256, created_at, deleted_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL)",
    )
    .bind(&f.id)
    .bind(&f.workspace_id)
    .bind(f.run_id.as_deref())
    .bind(f.chat_id.as_deref())
    .bind(f.origin.as_str())
    .bind(&f.path)
    .bind(&f.mime_type)
    .bind(f.size)
    .bind(&f.sha256)
    .bind(f.created_at)
    .execute(db)
    .await?;
    Ok(())
}

/// Files a run wrote back, oldest first.
pub(crate) async fn list_for_run<'c, E>(db: E, run_id: &str) -> Result<Vec<FileRow>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM files WHERE run_id = $1 AND deleted_at IS NULL \
         ORDER BY created_at, path"
    ))
    .bind(run_id)
    .fetch_all(db)
    .await?;
    rows.iter().map(from_row).collect()
}

pub(crate) fn from_row(r: &AnyRow) -> Result<FileRow, WorkspaceError> {
    Ok(FileRow {
        id: r.try_get("id")?,
        workspace_id: r.try_get("workspace_id")?,
        run_id: r.try_get("run_id")?,
        chat_id: r.try_get("chat_id")?,
        origin: FileOrigin::parse(&r.try_get::<String, _>("origin")?)?,
        path: r.try_get("path")?,
        mime_type: r.try_get("mime_type")?,
        size: r.try_get("size")?,
        sha256: r.try_get("sha256")?,
        created_at: r.try_get("created_at")?,
    })
}

/// A live file of `workspace_id`.
pub(crate) async fn get_in<'c, E>(
    db: E,
    id: &str,
    workspace_id: &str,
) -> Result<Option<FileRow>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM files WHERE id = $1 AND workspace_id = $2 AND deleted_at IS NULL"
    ))
    .bind(id)
    .bind(workspace_id)
    .fetch_optional(db)
    .await?;
    row.map(|r| from_row(&r)).transpose()
}

/// A chat's bag: uploads and files its turns wrote back, oldest first.
pub(crate) async fn list_for_chat<'c, E>(
    db: E,
    chat_id: &str,
    workspace_id: &str,
) -> Result<Vec<FileRow>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM files WHERE chat_id = $1 AND workspace_id = $2 \
         AND deleted_at IS NULL ORDER BY created_at, id"
    ))
    .bind(chat_id)
    .bind(workspace_id)
    .fetch_all(db)
    .await?;
    rows.iter().map(from_row).collect()
}

/// Puts an unattached upload into a chat's bag (a no-op if it is there).
pub(crate) async fn claim_for_chat<'c, E>(
    db: E,
    id: &str,
    workspace_id: &str,
    chat_id: &str,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done = sqlx::query(
        "UPDATE files SET chat_id = $1 WHERE id = $2 AND workspace_id = $3 \
         AND deleted_at IS NULL AND (chat_id IS NULL OR chat_id = $1)",
    )
    .bind(chat_id)
    .bind(id)
    .bind(workspace_id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Soft-deletes one file of a workspace; its blob's SHA-256, `None` when
/// there was no such live file.
pub(crate) async fn soft_delete<'c, E>(
    db: E,
    id: &str,
    workspace_id: &str,
    now_ms: i64,
) -> Result<Option<String>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(
        "UPDATE files SET deleted_at = $1 WHERE id = $2 AND workspace_id = $3 \
         AND deleted_at IS NULL RETURNING sha256",
    )
    .bind(now_ms)
    .bind(id)
    .bind(workspace_id)
    .fetch_optional(db)
    .await?;
    row.map(|r| r.try_get("sha256").map_err(Into::into))
        .transpose()
}

/// The blobs of a chat's files, deleted ones included (to free them once
/// the chat is deleted).
pub(crate) async fn blobs_of_chat<'c, E>(
    db: E,
    chat_id: &str,
    workspace_id: &str,
) -> Result<Vec<String>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let rows =
        sqlx::query("SELECT DISTINCT sha256 FROM files WHERE chat_id = $1 AND workspace_id = $2")
            .bind(chat_id)
            .bind(workspace_id)
            .fetch_all(db)
            .await?;
    rows.iter()
        .map(|r| r.try_get::<String, _>(0).map_err(Into::into))
        .collect()
}
