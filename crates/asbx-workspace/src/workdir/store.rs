//! The rows of kept working directories (`migrations/0015_workdir_snapshots.sql`,
//! `0018_workdir_runs.sql`): one per turn that ended on its own, its
//! manifest, and the blobs it names (with their sizes) while it is
//! restorable.

use std::collections::BTreeMap;

use asbx_protocol::workdir::{SnapshotReport, WorkdirEntry, WorkdirManifest};
use sqlx::{Any, Executor, Row as _};

use crate::error::WorkspaceError;

/// Who a snapshot belongs to.
pub(crate) struct Owner<'a> {
    pub(crate) workspace_id: &'a str,
    pub(crate) chat_id: &'a str,
    pub(crate) run_id: Option<&'a str>,
}

/// Stores a turn's report as snapshot `id`, and the blobs its manifest
/// names, on `conn` (the caller's transaction).
pub(crate) async fn insert(
    conn: &mut sqlx::AnyConnection,
    id: &str,
    owner: &Owner<'_>,
    report: &SnapshotReport,
    now: i64,
) -> Result<(), WorkspaceError> {
    let (status, manifest_json, entries, bytes) = match &report.manifest {
        Some(m) => (
            "ok",
            Some(
                serde_json::to_string(m)
                    .map_err(|e| WorkspaceError::Corrupt(format!("manifest: {e}")))?,
            ),
            m.entries.len() as i64,
            i64::try_from(m.bytes()).unwrap_or(i64::MAX),
        ),
        None => ("refused", None, 0, 0),
    };
    sqlx::query(
        "INSERT INTO workdir_snapshots (id, workspace_id, chat_id, run_id, status, error, \
         manifest, entries, bytes, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(id)
    .bind(owner.workspace_id)
    .bind(owner.chat_id)
    .bind(owner.run_id)
    .bind(status)
    .bind(report.error.as_deref())
    .bind(manifest_json)
    .bind(entries)
    .bind(bytes)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    if let Some(m) = &report.manifest {
        let backend = crate::store::Backend::of(conn);
        let blobs: Vec<(&str, u64)> = sizes(m).into_iter().collect();
        // One statement for a turn's blobs, not one each.
        for batch in blobs.chunks(BLOB_ROWS) {
            let mut sql = String::with_capacity(64 + batch.len() * 12);
            sql.push_str("INSERT INTO workdir_blobs (snapshot_id, sha256, size) VALUES ");
            crate::store::push_values(&mut sql, backend, batch.len(), 3);
            let mut q = sqlx::query(&sql);
            for (sha, size) in batch {
                q = q
                    .bind(id)
                    .bind(*sha)
                    .bind(i64::try_from(*size).unwrap_or(i64::MAX));
            }
            q.execute(&mut *conn).await?;
        }
    }
    Ok(())
}

/// Blob rows in one `INSERT` at the most (3 parameters each).
const BLOB_ROWS: usize = 300;

/// Each distinct blob of `m` and its size.
fn sizes(m: &WorkdirManifest) -> BTreeMap<&str, u64> {
    m.entries
        .iter()
        .filter_map(|e| match e {
            WorkdirEntry::File { sha256, size, .. } => Some((sha256.as_str(), *size)),
            WorkdirEntry::Dir { .. } | WorkdirEntry::Symlink { .. } => None,
        })
        .collect()
}

/// Retires the restorable snapshots of a chat older than its `keep`
/// latest kept ones: their blob rows go (the manifest stays) and
/// `released_at` is set to `now`; the hashes they named (to free).
pub(crate) async fn retire_old(
    conn: &mut sqlx::AnyConnection,
    chat_id: &str,
    keep: u32,
    now: i64,
) -> Result<Vec<String>, WorkspaceError> {
    let old = sqlx::query(
        "SELECT s.id FROM workdir_snapshots s WHERE s.chat_id = $1 AND s.status = 'ok' \
         AND s.released_at IS NULL AND (SELECT COUNT(*) FROM workdir_snapshots n \
         WHERE n.chat_id = s.chat_id AND n.status = 'ok' AND n.created_at > s.created_at) >= $2",
    )
    .bind(chat_id)
    .bind(i64::from(keep))
    .fetch_all(&mut *conn)
    .await?;
    let mut hashes = Vec::new();
    for row in old {
        let id: String = row.try_get(0)?;
        let named = sqlx::query("SELECT sha256 FROM workdir_blobs WHERE snapshot_id = $1")
            .bind(&id)
            .fetch_all(&mut *conn)
            .await?;
        for r in named {
            hashes.push(r.try_get::<String, _>(0)?);
        }
        sqlx::query("DELETE FROM workdir_blobs WHERE snapshot_id = $1")
            .bind(&id)
            .execute(&mut *conn)
            .await?;
        sqlx::query("UPDATE workdir_snapshots SET released_at = $1 WHERE id = $2")
            .bind(now)
            .bind(&id)
            .execute(&mut *conn)
            .await?;
    }
    hashes.sort();
    hashes.dedup();
    Ok(hashes)
}

/// A kept directory: its manifest, or why it was not kept.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) id: String,
    pub(crate) run_id: Option<String>,
    pub(crate) error: Option<String>,
    pub(crate) entries: i64,
    pub(crate) bytes: i64,
    pub(crate) created_at: i64,
    pub(crate) manifest: Option<WorkdirManifest>,
    pub(crate) restorable: bool,
}

fn from_row(r: &sqlx::any::AnyRow) -> Result<Snapshot, WorkspaceError> {
    let manifest: Option<String> = r.try_get("manifest")?;
    Ok(Snapshot {
        id: r.try_get("id")?,
        run_id: r.try_get("run_id")?,
        error: r.try_get("error")?,
        entries: r.try_get("entries")?,
        bytes: r.try_get("bytes")?,
        created_at: r.try_get("created_at")?,
        manifest: manifest
            .map(|m| serde_json::from_str(&m))
            .transpose()
            .map_err(|e| WorkspaceError::Corrupt(format!("manifest: {e}")))?,
        restorable: r.try_get::<i64, _>("restorable")? > 0,
    })
}

const COLUMNS: &str = "s.id, s.run_id, s.error, s.manifest, s.entries, s.bytes, s.created_at, \
    CAST(CASE WHEN s.released_at IS NULL THEN 1 ELSE 0 END AS BIGINT) AS restorable";

/// The chat's latest kept directory, if any turn kept one.
pub(crate) async fn latest<'c, E>(db: E, chat_id: &str) -> Result<Option<Snapshot>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM workdir_snapshots s WHERE s.chat_id = $1 AND s.status = 'ok' \
         ORDER BY s.created_at DESC LIMIT 1"
    ))
    .bind(chat_id)
    .fetch_optional(db)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// Every snapshot row of a chat, oldest first (kept and refused).
pub(crate) async fn list<'c, E>(db: E, chat_id: &str) -> Result<Vec<Snapshot>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM workdir_snapshots s WHERE s.chat_id = $1 ORDER BY s.created_at"
    ))
    .bind(chat_id)
    .fetch_all(db)
    .await?;
    rows.iter().map(from_row).collect()
}

/// Whether a restorable snapshot of `chat_id` names the blob `sha`.
pub(crate) async fn chat_names_blob<'c, E>(
    db: E,
    chat_id: &str,
    sha: &str,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(
        "SELECT 1 FROM workdir_blobs b JOIN workdir_snapshots s ON s.id = b.snapshot_id \
         WHERE s.chat_id = $1 AND b.sha256 = $2 LIMIT 1",
    )
    .bind(chat_id)
    .bind(sha)
    .fetch_optional(db)
    .await?;
    Ok(row.is_some())
}

/// Deletes a chat's snapshots; the hashes they named (to free).
pub(crate) async fn delete_chat(
    conn: &mut sqlx::AnyConnection,
    chat_id: &str,
) -> Result<Vec<String>, WorkspaceError> {
    let sub = "SELECT id FROM workdir_snapshots WHERE chat_id = $1";
    let rows = sqlx::query(&format!(
        "SELECT DISTINCT sha256 FROM workdir_blobs WHERE snapshot_id IN ({sub})"
    ))
    .bind(chat_id)
    .fetch_all(&mut *conn)
    .await?;
    sqlx::query(&format!(
        "DELETE FROM workdir_blobs WHERE snapshot_id IN ({sub})"
    ))
    .bind(chat_id)
    .execute(&mut *conn)
    .await?;
    sqlx::query("DELETE FROM workdir_snapshots WHERE chat_id = $1")
        .bind(chat_id)
        .execute(&mut *conn)
        .await?;
    rows.iter()
        .map(|r| r.try_get::<String, _>(0).map_err(Into::into))
        .collect()
}

/// The directory a chat had when the turn `run_id` ended: that turn's own
/// snapshot, else (refused, cancelled) the latest kept before `at`.
pub(crate) async fn at_turn<'c, E>(
    db: E,
    chat_id: &str,
    run_id: Option<&str>,
    at: i64,
) -> Result<Option<String>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(
        "SELECT id FROM workdir_snapshots WHERE chat_id = $1 AND status = 'ok' \
         AND (run_id = $2 OR created_at <= COALESCE((SELECT created_at FROM workdir_snapshots \
         WHERE chat_id = $1 AND run_id = $2), $3)) \
         ORDER BY CASE WHEN run_id = $2 THEN 0 ELSE 1 END, created_at DESC LIMIT 1",
    )
    .bind(chat_id)
    .bind(run_id)
    .bind(at)
    .fetch_optional(db)
    .await?;
    row.map(|r| r.try_get::<String, _>(0).map_err(Into::into))
        .transpose()
}

/// Copies snapshot `from` (and the blobs it names) into chat `chat_id` as
/// snapshot `id`, stamped `now` (restorable: the caller checked `from`
/// is).
pub(crate) async fn copy(
    conn: &mut sqlx::AnyConnection,
    from: &str,
    id: &str,
    chat_id: &str,
    now: i64,
) -> Result<(), WorkspaceError> {
    sqlx::query(
        "INSERT INTO workdir_snapshots (id, workspace_id, chat_id, run_id, status, error, \
         manifest, entries, bytes, created_at) SELECT $1, workspace_id, $2, NULL, status, error, \
         manifest, entries, bytes, $3 FROM workdir_snapshots WHERE id = $4",
    )
    .bind(id)
    .bind(chat_id)
    .bind(now)
    .bind(from)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO workdir_blobs (snapshot_id, sha256, size) SELECT $1, sha256, size \
         FROM workdir_blobs WHERE snapshot_id = $2",
    )
    .bind(id)
    .bind(from)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The snapshot `id`.
pub(crate) async fn get<'c, E>(db: E, id: &str) -> Result<Option<Snapshot>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM workdir_snapshots s WHERE s.id = $1"
    ))
    .bind(id)
    .fetch_optional(db)
    .await?;
    row.as_ref().map(from_row).transpose()
}
