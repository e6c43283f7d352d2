//! Pins (`blob_pins`, `migrations/0010_blob_gc.sql`): an upload's hold on
//! a blob between storing it and storing the file row that refers to it,
//! and the check freeing makes: does a live file row or a fresh pin refer
//! to a blob?

use std::collections::HashSet;

use sqlx::{Any, AnyPool, Executor, Row as _};

use crate::error::WorkspaceError;

/// Pins the blob `sha` as `pin` (a random id), now.
pub(super) async fn insert<'c, E>(db: E, pin: &str, sha: &str) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    sqlx::query("INSERT INTO blob_pins (id, sha256, created_at) VALUES ($1, $2, $3)")
        .bind(pin)
        .bind(sha)
        .bind(super::now_ms())
        .execute(db)
        .await?;
    Ok(())
}

/// Removes the pin `pin`.
pub(super) async fn release(pool: &AnyPool, pin: &str) -> Result<(), WorkspaceError> {
    sqlx::query("DELETE FROM blob_pins WHERE id = $1")
        .bind(pin)
        .execute(pool)
        .await?;
    Ok(())
}

/// Removes the pins of the blobs session `session_id`'s working
/// directory sent (`wd:{session_id}:...`, `BlobStore::workdir_pin`).
pub(super) async fn release_workdir(
    pool: &AnyPool,
    session_id: &str,
) -> Result<(), WorkspaceError> {
    let escaped = session_id
        .replace('\\', "\\\\")
        .replace('_', "\\_")
        .replace('%', "\\%");
    sqlx::query("DELETE FROM blob_pins WHERE id LIKE $1 ESCAPE '\\'")
        .bind(format!("wd:{escaped}:%"))
        .execute(pool)
        .await?;
    Ok(())
}

/// Whether a live file row, a kept working directory (`workdir_blobs`),
/// or a pin made at or after `pinned_since`
/// (epoch ms), refers to the blob `sha`.
pub(super) async fn referenced<'c, E>(
    db: E,
    sha: &str,
    pinned_since: i64,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(
        "SELECT (SELECT COUNT(*) FROM files WHERE sha256 = $1 AND deleted_at IS NULL) \
         + (SELECT COUNT(*) FROM blob_pins WHERE sha256 = $1 AND created_at >= $2) \
         + (SELECT COUNT(*) FROM workdir_blobs WHERE sha256 = $1)",
    )
    .bind(sha)
    .bind(pinned_since)
    .fetch_one(db)
    .await?;
    Ok(row.try_get::<i64, _>(0)? > 0)
}

/// Removes the pins made before `before` (epoch ms): crashed uploads'.
pub(super) async fn prune(pool: &AnyPool, before: i64) -> Result<u64, WorkspaceError> {
    let done = sqlx::query("DELETE FROM blob_pins WHERE created_at < $1")
        .bind(before)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

/// The blobs live file rows and kept working directories refer to (a sweep's first cut; freeing checks
/// each candidate again).
pub(super) async fn live_files(pool: &AnyPool) -> Result<HashSet<String>, WorkspaceError> {
    let rows = sqlx::query(
        "SELECT sha256 FROM files WHERE deleted_at IS NULL \
         UNION SELECT sha256 FROM workdir_blobs",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| r.try_get::<String, _>(0).map_err(Into::into))
        .collect()
}
