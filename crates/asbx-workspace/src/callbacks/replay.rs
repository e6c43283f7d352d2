//! A redeemed callback answered once more (docs/protocol.md §3): the
//! runner's gateway sends a random request id on every callback
//! (`x-asbx-request-id`, the same on its one retry). When a redemption
//! carries one, its transaction also writes a `callback_replays` row
//! (`migrations/0012_callback_replays.sql`): the hash of the request id and
//! what answering again needs beyond the run's stored data. A later
//! redemption of the same token that the `UPDATE` refuses is answered once
//! more, on any node, if it carries the same request id, the token is of
//! that route and session, the run still runs and the window
//! ([`CALLBACK_REPLAY_WINDOW_MS`]) has not passed; the row is taken, so
//! a request id answers twice at most. Anything else stays `otp_rejected`.
//!
//! Why the request id: the token alone can't tell the gateway's retry (the
//! node that redeemed it died before answering) from a second use. The
//! sandbox can't forge it: the gateway passes on none of the sandbox's own
//! headers but the bearer, and mints the id itself.
//!
//! Nothing secret is stored: the answer is rebuilt from the run row (and
//! `/env`'s secrets opened again); `/env`'s workspace bearer, which exists
//! in plaintext only in its answer, is minted afresh and the lost one
//! revoked ([`EnvReplay`]).

use asbx_protocol::FieldError;
use asbx_protocol::callback::{CALLBACK_REPLAY_WINDOW_MS, REQUEST_ID_HEADER, is_valid_request_id};
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use sqlx::{Any, Executor, Row as _};

use crate::error::WorkspaceError;
use crate::tokens::{self, TokenKind};

/// A callback's request id, hashed (only the hash is stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestId {
    hash: String,
}

impl RequestId {
    /// The request id a callback carries: `None` without the header, `400`
    /// when it is malformed (before anything is redeemed).
    pub(crate) fn from_headers(headers: &HeaderMap) -> Result<Option<RequestId>, WorkspaceError> {
        let Some(value) = headers.get(REQUEST_ID_HEADER) else {
            return Ok(None);
        };
        match value.to_str() {
            Ok(id) if is_valid_request_id(id) => Ok(Some(RequestId {
                hash: tokens::hash(id),
            })),
            _ => Err(WorkspaceError::invalid_fields(vec![FieldError::new(
                REQUEST_ID_HEADER,
                "must be 16 to 64 characters of [A-Za-z0-9_-]",
            )])),
        }
    }
}

/// What `/env`'s retry needs: the hash of the workspace bearer the lost
/// answer carried (`None`: it carried none).
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct EnvReplay {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) bearer_hash: Option<String>,
}

/// The window's length as stored times (epoch ms).
fn window_ms() -> i64 {
    i64::try_from(CALLBACK_REPLAY_WINDOW_MS).unwrap_or(i64::MAX)
}

/// Records that the token `token_hash` was redeemed for `request`, with
/// `answer` (JSON, no secret), for the window from `now_ms`; call it in
/// the redemption's transaction. Rows whose window has passed go too.
pub(crate) async fn record(
    conn: &mut sqlx::AnyConnection,
    token_hash: &str,
    request: &RequestId,
    answer: &str,
    now_ms: i64,
) -> Result<(), WorkspaceError> {
    sqlx::query("DELETE FROM callback_replays WHERE expires_at <= $1")
        .bind(now_ms)
        .execute(&mut *conn)
        .await?;
    sqlx::query(
        "INSERT INTO callback_replays (token_hash, request_hash, answer, expires_at, created_at) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(token_hash)
    .bind(&request.hash)
    .bind(answer)
    .bind(now_ms.saturating_add(window_ms()))
    .bind(now_ms)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Takes the replay of the token `token_hash` (of `kind`, for
/// `session_id`) for `request`, when its window is open and the run still
/// runs: the recorded answer. Anything else (no request id, another one,
/// taken, expired, another route's or session's token, a settled run) is
/// [`WorkspaceError::OtpRejected`]. One statement: of two concurrent
/// retries one wins.
pub(crate) async fn take<'c, E>(
    db: E,
    token_hash: &str,
    kind: TokenKind,
    session_id: &str,
    request: Option<&RequestId>,
    now_ms: i64,
) -> Result<String, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let Some(request) = request else {
        return Err(WorkspaceError::OtpRejected);
    };
    let row = sqlx::query(
        "DELETE FROM callback_replays WHERE token_hash = $1 AND request_hash = $2 \
         AND expires_at > $3 AND EXISTS (SELECT 1 FROM tokens t JOIN runs r ON r.id = t.session_id \
         WHERE t.hash = $1 AND t.kind = $4 AND t.session_id = $5 AND r.status = 'running') \
         RETURNING answer",
    )
    .bind(token_hash)
    .bind(&request.hash)
    .bind(now_ms)
    .bind(kind.as_str())
    .bind(session_id)
    .fetch_optional(db)
    .await?;
    match row {
        Some(row) => Ok(row.try_get("answer")?),
        None => Err(WorkspaceError::OtpRejected),
    }
}

/// Redeems the one-time token `token_hash` in `conn` (a transaction), or,
/// when the redemption is refused, takes its replay for `request`:
/// `None` for a first redemption, `Some(answer)` for a retry answered once
/// more.
pub(crate) async fn redeem_or_take(
    conn: &mut sqlx::AnyConnection,
    token_hash: &str,
    kind: TokenKind,
    session_id: &str,
    request: Option<&RequestId>,
    now_ms: i64,
) -> Result<Option<String>, WorkspaceError> {
    use crate::tokens::store as token_store;
    match token_store::redeem(&mut *conn, token_hash, kind, session_id, now_ms).await {
        Ok(()) => Ok(None),
        Err(WorkspaceError::OtpRejected) => {
            take(&mut *conn, token_hash, kind, session_id, request, now_ms)
                .await
                .map(Some)
        }
        Err(e) => Err(e),
    }
}

/// Revokes the workspace bearer `hash` of `session_id` (the one a lost
/// `/env` answer carried).
pub(crate) async fn revoke_bearer<'c, E>(
    db: E,
    hash: &str,
    session_id: &str,
    now_ms: i64,
) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    sqlx::query(
        "UPDATE tokens SET used_at = $1 WHERE hash = $2 AND kind = $3 AND session_id = $4 \
         AND used_at IS NULL",
    )
    .bind(now_ms)
    .bind(hash)
    .bind(TokenKind::Workspace.as_str())
    .bind(session_id)
    .execute(db)
    .await?;
    Ok(())
}
