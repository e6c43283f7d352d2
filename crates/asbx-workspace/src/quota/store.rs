//! The quotas' SQL: the operator's overrides, the workspace lock a
//! dispatch takes, each usage figure read from the rows it counts, and the
//! per-minute request windows. Sums are cast to `BIGINT` (PostgreSQL's
//! `SUM` of a `BIGINT` is `NUMERIC`).

use sqlx::{Any, Executor, Row as _};

use crate::error::WorkspaceError;
use crate::quota::{Limits, Quota, QuotaDefaults, day_start};

/// The overrides stored for a workspace: `(quota, value)`, `None` unlimited.
pub(crate) async fn overrides<'c, E>(
    db: E,
    workspace_id: &str,
) -> Result<Vec<(Quota, Option<u64>)>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let rows = sqlx::query("SELECT name, value FROM workspace_quotas WHERE workspace_id = $1")
        .bind(workspace_id)
        .fetch_all(db)
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let name: String = r.try_get("name")?;
        // A name this version doesn't know (a newer node's) is skipped.
        let Ok(quota) = name.parse::<Quota>() else {
            continue;
        };
        let value: Option<i64> = r.try_get("value")?;
        out.push((quota, value.map(|v| u64::try_from(v).unwrap_or(0))));
    }
    Ok(out)
}

/// A workspace's limits: `defaults` with its overrides applied.
pub(crate) async fn limits<'c, E>(
    db: E,
    defaults: &QuotaDefaults,
    workspace_id: &str,
) -> Result<Limits, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let mut limits = *defaults;
    for (quota, value) in overrides(db, workspace_id).await? {
        limits.set(quota, value);
    }
    Ok(limits)
}

/// Stores an override (`Some(None)`: unlimited), or removes it (`None`:
/// back to the default).
pub(crate) async fn set<'c, E>(
    db: E,
    workspace_id: &str,
    quota: Quota,
    value: Option<Option<u64>>,
    now_ms: i64,
) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    match value {
        None => {
            sqlx::query("DELETE FROM workspace_quotas WHERE workspace_id = $1 AND name = $2")
                .bind(workspace_id)
                .bind(quota.name())
                .execute(db)
                .await?;
        }
        Some(v) => {
            let v = v.map(|v| i64::try_from(v).unwrap_or(i64::MAX));
            sqlx::query(
                "INSERT INTO workspace_quotas (workspace_id, name, value, updated_at) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (workspace_id, name) \
                 DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            )
            .bind(workspace_id)
            .bind(quota.name())
            .bind(v)
            .bind(now_ms)
            .execute(db)
            .await?;
        }
    }
    Ok(())
}

/// Locks the workspace's row until the transaction ends (PostgreSQL: a row
/// lock; SQLite: the database's write lock), so dispatches of one
/// workspace are admitted one at a time, on every node. False when there
/// is no such workspace.
pub(crate) async fn lock_workspace(
    conn: &mut sqlx::AnyConnection,
    workspace_id: &str,
) -> Result<bool, WorkspaceError> {
    let done = sqlx::query("UPDATE workspaces SET name = name WHERE id = $1")
        .bind(workspace_id)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

async fn one_i64<'c, E>(
    db: E,
    sql: &str,
    workspace_id: &str,
    now_ms: i64,
) -> Result<i64, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(sql)
        .bind(workspace_id)
        .bind(day_start(now_ms))
        .bind(now_ms)
        .fetch_one(db)
        .await?;
    Ok(row.try_get::<i64, _>(0)?)
}

/// The workspace's running runs (each holds a sandbox).
pub(crate) async fn running<'c, E>(db: E, workspace_id: &str) -> Result<i64, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row =
        sqlx::query("SELECT COUNT(*) FROM runs WHERE workspace_id = $1 AND status = 'running'")
            .bind(workspace_id)
            .fetch_one(db)
            .await?;
    Ok(row.try_get::<i64, _>(0)?)
}

/// Runs running now in every workspace (the fleet's share of them the
/// workspace knows of).
pub(crate) async fn running_total<'c, E>(db: E) -> Result<i64, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query("SELECT COUNT(*) FROM runs WHERE status = 'running'")
        .fetch_one(db)
        .await?;
    Ok(row.try_get::<i64, _>(0)?)
}

/// Milliseconds of sandbox time the workspace's runs used today (UTC):
/// each run's part of the day, running ones up to `now_ms`.
pub(crate) async fn sandbox_ms_today<'c, E>(
    db: E,
    workspace_id: &str,
    now_ms: i64,
) -> Result<i64, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    one_i64(
        db,
        "SELECT CAST(COALESCE(SUM(COALESCE(ended_at, $3) - \
         CASE WHEN created_at > $2 THEN created_at ELSE $2 END), 0) AS BIGINT) \
         FROM runs WHERE workspace_id = $1 AND (status = 'running' OR ended_at >= $2)",
        workspace_id,
        now_ms,
    )
    .await
}

/// Model tokens (input + output) of the workspace's runs that ended today,
/// and of its running ones so far (their tally of the runner's reports).
pub(crate) async fn tokens_today<'c, E>(
    db: E,
    workspace_id: &str,
    now_ms: i64,
) -> Result<i64, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    one_i64(
        db,
        "SELECT CAST(COALESCE(SUM(tokens), 0) AS BIGINT) FROM runs \
         WHERE workspace_id = $1 AND (status = 'running' OR (ended_at >= $2 AND ended_at <= $3))",
        workspace_id,
        now_ms,
    )
    .await
}

/// Adds `tokens` to a running run's tally; false when it is not running.
pub(crate) async fn add_tokens<'c, E>(
    db: E,
    run_id: &str,
    tokens: u64,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done =
        sqlx::query("UPDATE runs SET tokens = tokens + $1 WHERE id = $2 AND status = 'running'")
            .bind(i64::try_from(tokens).unwrap_or(i64::MAX))
            .bind(run_id)
            .execute(db)
            .await?;
    Ok(done.rows_affected() == 1)
}

/// Whether run `run_id` is still running.
pub(crate) async fn is_running<'c, E>(db: E, run_id: &str) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query("SELECT 1 FROM runs WHERE id = $1 AND status = 'running'")
        .bind(run_id)
        .fetch_optional(db)
        .await?;
    Ok(row.is_some())
}

/// Bytes the workspace stores: its live files, its runs' kept lines, and
/// the distinct blobs its chats' restorable working directories name
/// (each counted once however many turns or forks name it; a turn past
/// `ASBX_WORKDIR_KEEP_TURNS` no longer counts).
pub(crate) async fn storage_bytes<'c, E>(db: E, workspace_id: &str) -> Result<i64, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(
        "SELECT CAST(COALESCE((SELECT SUM(size) FROM files \
         WHERE workspace_id = $1 AND deleted_at IS NULL), 0) + \
         COALESCE((SELECT SUM(LENGTH(e.line)) FROM run_events e \
         JOIN runs r ON r.id = e.run_id WHERE r.workspace_id = $1), 0) + \
         COALESCE((SELECT SUM(k.size) FROM (SELECT DISTINCT b.sha256, b.size \
         FROM workdir_blobs b JOIN workdir_snapshots s ON s.id = b.snapshot_id \
         WHERE s.workspace_id = $1) k), 0) AS BIGINT)",
    )
    .bind(workspace_id)
    .fetch_one(db)
    .await?;
    Ok(row.try_get::<i64, _>(0)?)
}

/// One minute, the window of `requests-per-minute`.
pub(crate) const MINUTE_MS: i64 = 60_000;

/// Counts one request of `subject` in the minute of `now_ms` if it had
/// fewer than `limit` there (one statement: exact on every node); false
/// when refused. The subject's older windows go when a new one starts.
pub(crate) async fn hit(
    pool: &sqlx::AnyPool,
    subject: &str,
    now_ms: i64,
    limit: u64,
) -> Result<bool, WorkspaceError> {
    let window = now_ms - now_ms.rem_euclid(MINUTE_MS);
    let row = sqlx::query(
        "INSERT INTO rate_windows (subject, window_start, hits) VALUES ($1, $2, 1) \
         ON CONFLICT (subject, window_start) DO UPDATE SET hits = rate_windows.hits + 1 \
         WHERE rate_windows.hits < $3 RETURNING hits",
    )
    .bind(subject)
    .bind(window)
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_optional(pool)
    .await?;
    let Some(row) = row else {
        return Ok(false);
    };
    if row.try_get::<i64, _>(0)? == 1 {
        sqlx::query("DELETE FROM rate_windows WHERE subject = $1 AND window_start < $2")
            .bind(subject)
            .bind(window)
            .execute(pool)
            .await?;
    }
    Ok(true)
}

/// The requests `subject` made in the minute of `now_ms`.
pub(crate) async fn hits<'c, E>(db: E, subject: &str, now_ms: i64) -> Result<i64, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let window = now_ms - now_ms.rem_euclid(MINUTE_MS);
    let row = sqlx::query("SELECT hits FROM rate_windows WHERE subject = $1 AND window_start = $2")
        .bind(subject)
        .bind(window)
        .fetch_optional(db)
        .await?;
    Ok(row
        .map(|r| r.try_get::<i64, _>(0))
        .transpose()?
        .unwrap_or(0))
}
