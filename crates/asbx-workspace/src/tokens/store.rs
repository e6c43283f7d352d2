//! Tokens: insert hashed, redeem a one-time token atomically, look up a
//! session's workspace bearer, revoke.

use sqlx::{Any, Executor, Row as _};

use crate::error::WorkspaceError;
use crate::tokens::{Minted, TokenKind};

/// Stores the hash of a freshly minted token bound to `session_id`, valid
/// for `kind`'s TTL given the run's runtime cap ([`TokenKind::ttl_ms`]).
pub(crate) async fn insert<'c, E>(
    db: E,
    minted: &Minted,
    kind: TokenKind,
    session_id: &str,
    cap_ms: u64,
    now_ms: i64,
) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    insert_all(db, &[(kind, minted)], session_id, cap_ms, now_ms).await
}

/// [`insert`] for each of `minted` (bound to `session_id`), in one
/// statement.
pub(crate) async fn insert_all<'c, E>(
    db: E,
    minted: &[(TokenKind, &Minted)],
    session_id: &str,
    cap_ms: u64,
    now_ms: i64,
) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    use std::fmt::Write as _;
    if minted.is_empty() {
        return Ok(());
    }
    let mut sql = String::from(
        "INSERT INTO tokens (hash, kind, session_id, expires_at, used_at, created_at) VALUES ",
    );
    for i in 0..minted.len() {
        let p = i * 5;
        let _ = write!(
            sql,
            "{}(${}, ${}, ${}, ${}, NULL, ${})",
            if i == 0 { "" } else { ", " },
            p + 1,
            p + 2,
            p + 3,
            p + 4,
            p + 5
        );
    }
    let mut query = sqlx::query(&sql);
    for (kind, m) in minted {
        query = query
            .bind(&m.hash)
            .bind(kind.as_str())
            .bind(session_id)
            .bind(now_ms.saturating_add(kind.ttl_ms(cap_ms)))
            .bind(now_ms);
    }
    query.execute(db).await?;
    Ok(())
}

/// Whether the token could be redeemed now, without redeeming it.
///
/// Used to refuse a bad token before parsing a large body; the redemption
/// itself is [`redeem`], which decides alone.
pub(crate) async fn is_redeemable<'c, E>(
    db: E,
    hash: &str,
    kind: TokenKind,
    session_id: &str,
    now_ms: i64,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(
        "SELECT hash FROM tokens WHERE hash = $1 AND kind = $2 AND session_id = $3 \
         AND used_at IS NULL AND expires_at > $4",
    )
    .bind(hash)
    .bind(kind.as_str())
    .bind(session_id)
    .bind(now_ms)
    .fetch_optional(db)
    .await?;
    Ok(row.is_some())
}

/// Redeems a token: one conditional `UPDATE`, so of two concurrent
/// redemptions exactly one wins. Anything else (unknown, used, expired, other
/// session, other kind) is [`WorkspaceError::OtpRejected`] and changes nothing.
pub(crate) async fn redeem<'c, E>(
    db: E,
    hash: &str,
    kind: TokenKind,
    session_id: &str,
    now_ms: i64,
) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done = sqlx::query(
        "UPDATE tokens SET used_at = $1 WHERE hash = $2 AND kind = $3 AND session_id = $4 \
         AND used_at IS NULL AND expires_at > $1",
    )
    .bind(now_ms)
    .bind(hash)
    .bind(kind.as_str())
    .bind(session_id)
    .execute(db)
    .await?;
    if done.rows_affected() == 1 {
        Ok(())
    } else {
        Err(WorkspaceError::OtpRejected)
    }
}

/// The run a workspace bearer (by hash) opens, when it is one of
/// `session_id`, unexpired, not revoked, and the run still running:
/// `(workspace_id, chat_id)`. A workspace bearer is not spent by use.
pub(crate) async fn workspace_bearer<'c, E>(
    db: E,
    hash: &str,
    session_id: &str,
    now_ms: i64,
) -> Result<Option<(String, Option<String>)>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    bearer_of(db, TokenKind::Workspace, hash, session_id, now_ms).await
}

/// [`workspace_bearer`] for a token of `kind` (not spent by use).
pub(crate) async fn bearer_of<'c, E>(
    db: E,
    kind: TokenKind,
    hash: &str,
    session_id: &str,
    now_ms: i64,
) -> Result<Option<(String, Option<String>)>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(
        "SELECT r.workspace_id, r.chat_id FROM tokens t JOIN runs r ON r.id = t.session_id \
         WHERE t.hash = $1 AND t.kind = $2 AND t.session_id = $3 AND t.used_at IS NULL \
         AND t.expires_at > $4 AND r.status = 'running'",
    )
    .bind(hash)
    .bind(kind.as_str())
    .bind(session_id)
    .bind(now_ms)
    .fetch_optional(db)
    .await?;
    row.map(|r| Ok((r.try_get("workspace_id")?, r.try_get("chat_id")?)))
        .transpose()
}

/// The run a `workdir` bearer (by hash) opens, as [`bearer_of`]:
/// `(workspace_id, chat_id, workdir_from)`, the chat of a chat turn and the
/// chat a run starts from (`POST /api/runs` with `workdir.from`).
pub(crate) async fn workdir_bearer<'c, E>(
    db: E,
    hash: &str,
    session_id: &str,
    now_ms: i64,
) -> Result<Option<(String, Option<String>, Option<String>)>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(
        "SELECT r.workspace_id, r.chat_id, r.workdir_from FROM tokens t \
         JOIN runs r ON r.id = t.session_id \
         WHERE t.hash = $1 AND t.kind = $2 AND t.session_id = $3 AND t.used_at IS NULL \
         AND t.expires_at > $4 AND r.status = 'running'",
    )
    .bind(hash)
    .bind(TokenKind::Workdir.as_str())
    .bind(session_id)
    .bind(now_ms)
    .fetch_optional(db)
    .await?;
    row.map(|r| {
        Ok((
            r.try_get("workspace_id")?,
            r.try_get("chat_id")?,
            r.try_get("workdir_from")?,
        ))
    })
    .transpose()
}

/// Marks every unused token of a session used: once its stream has ended, the
/// sandbox is gone and nothing may redeem them any more.
pub(crate) async fn revoke_session<'c, E>(
    db: E,
    session_id: &str,
    now_ms: i64,
) -> Result<u64, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done =
        sqlx::query("UPDATE tokens SET used_at = $1 WHERE session_id = $2 AND used_at IS NULL")
            .bind(now_ms)
            .bind(session_id)
            .execute(db)
            .await?;
    Ok(done.rows_affected())
}
