//! The audit tables (`migrations/0013_audit.sql`): appending a batch to a
//! workspace's chain, reading pages, pruning behind an anchor.
//!
//! Concurrency: an append's first statements create the workspace's head
//! row if missing and then `UPDATE` it (taking `n` ids), which locks it
//! until the transaction ends: on PostgreSQL a second writer, on any node,
//! waits and then reads the first one's committed head; on SQLite the
//! write transaction is the database's only one.

use asbx_protocol::audit::AuditEvent;
use serde_json::{Map, Value};
use sqlx::{AnyPool, Row as _};

use crate::audit::chain;
use crate::error::WorkspaceError;

/// Rows per `INSERT` (5 binds each).
const INSERT_ROWS: usize = 200;

/// An event to append, with where and when it happened.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub(crate) workspace: String,
    pub(crate) run_id: Option<String>,
    pub(crate) session_id: Option<String>,
    pub(crate) ts: i64,
    pub(crate) event: AuditEvent,
}

/// Appends `records` (all of `workspace`) in one transaction, in order.
pub(crate) async fn append(
    pool: &AnyPool,
    workspace: &str,
    records: &[Pending],
) -> Result<(), WorkspaceError> {
    if records.is_empty() {
        return Ok(());
    }
    let mut tx = crate::store::begin_write(pool).await?;
    append_in(&mut tx, workspace, records).await?;
    tx.commit().await?;
    Ok(())
}

/// Appends `records` (all of `workspace`) in order inside the caller's
/// write transaction, which holds the chain's head until it commits: what
/// the records describe and the records commit together. Callers make it
/// their last statement before the commit, so the head (one row every
/// writer of the workspace's log waits for) is held no longer, and a
/// transaction holding it waits on nothing else.
pub(crate) async fn append_in(
    tx: &mut sqlx::AnyConnection,
    workspace: &str,
    records: &[Pending],
) -> Result<(), WorkspaceError> {
    if records.is_empty() {
        return Ok(());
    }
    let n = i64::try_from(records.len()).unwrap_or(i64::MAX);
    let backend = crate::store::Backend::of(tx);
    // The head's row, locked until the commit: the chain's order. Made on
    // the workspace's first record (one statement more, that once).
    let take_ids = || {
        sqlx::query(
            "UPDATE audit_heads SET last_id = last_id + $1 WHERE workspace_id = $2 \
             RETURNING last_id, last_hash",
        )
        .bind(n)
        .bind(workspace)
    };
    let head = match take_ids().fetch_optional(&mut *tx).await? {
        Some(head) => head,
        None => {
            sqlx::query(
                "INSERT INTO audit_heads (workspace_id, last_id, last_hash, anchor_id, \
                 anchor_hash) VALUES ($1, 0, '', 0, '') ON CONFLICT (workspace_id) DO NOTHING",
            )
            .bind(workspace)
            .execute(&mut *tx)
            .await?;
            take_ids().fetch_one(&mut *tx).await?
        }
    };
    let last_id: i64 = head.try_get(0)?;
    let mut prev: String = head.try_get(1)?;
    let mut rows = Vec::with_capacity(records.len());
    for (i, p) in records.iter().enumerate() {
        let id = last_id - n + 1 + i64::try_from(i).unwrap_or(0);
        let (text, hash) = chain::seal(fields(p, id)?, &prev);
        rows.push((id, p.run_id.as_deref(), p.ts, text));
        prev = hash;
    }
    for batch in rows.chunks(INSERT_ROWS) {
        insert(&mut *tx, backend, workspace, batch).await?;
    }
    sqlx::query("UPDATE audit_heads SET last_hash = $1 WHERE workspace_id = $2")
        .bind(&prev)
        .bind(workspace)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The record's fields without `prevHash` and `hash`.
fn fields(p: &Pending, id: i64) -> Result<Map<String, Value>, WorkspaceError> {
    let Value::Object(mut m) = serde_json::to_value(&p.event)
        .map_err(|e| WorkspaceError::Corrupt(format!("audit event: {e}")))?
    else {
        return Err(WorkspaceError::Corrupt(
            "audit event is not an object".to_owned(),
        ));
    };
    m.insert("id".to_owned(), Value::from(id));
    m.insert("ts".to_owned(), Value::from(p.ts));
    m.insert("workspace".to_owned(), Value::from(p.workspace.clone()));
    if let Some(run) = &p.run_id {
        m.insert("runId".to_owned(), Value::from(run.clone()));
    }
    if let Some(session) = &p.session_id {
        m.insert("sessionId".to_owned(), Value::from(session.clone()));
    }
    Ok(m)
}

/// One multi-row `INSERT` (anonymous `?` parameters on SQLite, as in
/// `runs::events::insert`).
async fn insert(
    conn: &mut sqlx::AnyConnection,
    backend: crate::store::Backend,
    workspace: &str,
    rows: &[(i64, Option<&str>, i64, String)],
) -> Result<(), WorkspaceError> {
    let mut sql = String::with_capacity(96 + rows.len() * 32);
    sql.push_str("INSERT INTO audit_records (workspace_id, id, run_id, ts, record) VALUES ");
    crate::store::push_values(&mut sql, backend, rows.len(), 5);
    let mut q = sqlx::query(&sql);
    for (id, run, ts, text) in rows {
        q = q
            .bind(workspace)
            .bind(*id)
            .bind(*run)
            .bind(*ts)
            .bind(text.as_str());
    }
    q.execute(conn).await?;
    Ok(())
}

/// The workspace of run `run_id`, if it exists (read here, so the audit
/// log depends on no feature).
pub(crate) async fn run_workspace(
    pool: &AnyPool,
    run_id: &str,
) -> Result<Option<String>, WorkspaceError> {
    let row = sqlx::query("SELECT workspace_id FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_optional(pool)
        .await?;
    row.map(|r| Ok(r.try_get(0)?)).transpose()
}

/// Up to `limit` records of `workspace` after id `after`, oldest first;
/// only `run_id`'s when given.
pub(crate) async fn page(
    pool: &AnyPool,
    workspace: &str,
    run_id: Option<&str>,
    after: i64,
    limit: i64,
) -> Result<Vec<(i64, String)>, WorkspaceError> {
    let rows = match run_id {
        None => {
            sqlx::query(
                "SELECT id, record FROM audit_records WHERE workspace_id = $1 AND id > $2 \
                 ORDER BY id LIMIT $3",
            )
            .bind(workspace)
            .bind(after)
            .bind(limit)
            .fetch_all(pool)
            .await?
        }
        Some(run) => {
            sqlx::query(
                "SELECT id, record FROM audit_records WHERE run_id = $1 AND workspace_id = $2 \
                 AND id > $3 ORDER BY id LIMIT $4",
            )
            .bind(run)
            .bind(workspace)
            .bind(after)
            .bind(limit)
            .fetch_all(pool)
            .await?
        }
    };
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect()
}

/// A chain's head row: `(last_id, last_hash, anchor_id, anchor_hash)`.
pub(crate) async fn head(
    pool: &AnyPool,
    workspace: &str,
) -> Result<Option<(i64, String, i64, String)>, WorkspaceError> {
    let row = sqlx::query(
        "SELECT last_id, last_hash, anchor_id, anchor_hash FROM audit_heads WHERE workspace_id = $1",
    )
    .bind(workspace)
    .fetch_optional(pool)
    .await?;
    row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?)))
        .transpose()
}

/// Every workspace with a chain (a head or any record).
pub(crate) async fn workspaces(pool: &AnyPool) -> Result<Vec<String>, WorkspaceError> {
    let rows = sqlx::query(
        "SELECT workspace_id FROM audit_heads UNION SELECT workspace_id FROM audit_records \
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

/// Drops `workspace`'s records up to the last one older than `before_ms`,
/// leaving its id and hash as the chain's anchor; how many went.
pub(crate) async fn prune(
    pool: &AnyPool,
    workspace: &str,
    before_ms: i64,
) -> Result<u64, WorkspaceError> {
    let mut tx = crate::store::begin_write(pool).await?;
    // Locks the head: no append or other prune in between.
    let locked =
        sqlx::query("UPDATE audit_heads SET anchor_id = anchor_id WHERE workspace_id = $1")
            .bind(workspace)
            .execute(&mut *tx)
            .await?;
    if locked.rows_affected() == 0 {
        return Ok(0);
    }
    let last = sqlx::query(
        "SELECT id, record FROM audit_records WHERE workspace_id = $1 AND id = \
         (SELECT MAX(id) FROM audit_records WHERE workspace_id = $1 AND ts < $2)",
    )
    .bind(workspace)
    .bind(before_ms)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(last) = last else {
        return Ok(0);
    };
    let id: i64 = last.try_get(0)?;
    let text: String = last.try_get(1)?;
    let hash = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v.get("hash").and_then(Value::as_str).map(str::to_owned))
        .ok_or_else(|| {
            WorkspaceError::Corrupt(format!("audit record {id} of {workspace} is unreadable"))
        })?;
    let gone = sqlx::query("DELETE FROM audit_records WHERE workspace_id = $1 AND id <= $2")
        .bind(workspace)
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    sqlx::query("UPDATE audit_heads SET anchor_id = $1, anchor_hash = $2 WHERE workspace_id = $3")
        .bind(id)
        .bind(&hash)
        .bind(workspace)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(gone)
}
