//! Who is calling: a workspace API key (`Authorization: Bearer asbx_key_...`),
//! a browser session cookie made by signing in with a key, or nobody.
//!
//! Anonymous callers act in the default workspace unless the workspace is
//! configured with `require_auth`. Every workspace-scoped query filters by
//! the caller's workspace id, so another workspace's chats, files and runs
//! are simply not found.

pub(crate) mod api;
pub(crate) mod store;

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

use crate::AppState;
use crate::auth::store as keys;
use crate::error::WorkspaceError;
use crate::quota;
use crate::tokens;

/// Prefix of workspace API keys.
pub(crate) const KEY_PREFIX: &str = "asbx_key_";
/// Prefix of browser session ids (the cookie value).
pub(crate) const SESSION_PREFIX: &str = "asbx_ses_";
/// The browser session cookie.
pub(crate) const SESSION_COOKIE: &str = "asbx_session";
/// How long a browser session lasts, in milliseconds (7 days).
pub(crate) const SESSION_TTL_MS: i64 = 7 * 24 * 3600 * 1000;

/// The workspace a request acts in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caller {
    pub workspace_id: String,
    /// What `requests-per-minute` counts: the hash of its API key or
    /// browser session, or `anon:<workspace>`.
    pub subject: String,
}

impl FromRequestParts<Arc<AppState>> for Caller {
    type Rejection = WorkspaceError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let caller = identify(parts, state).await?;
        quota::admit::request(state, &caller.subject, &caller.workspace_id).await?;
        Ok(caller)
    }
}

/// The caller's workspace and credential, unchecked against any quota.
async fn identify(parts: &Parts, state: &AppState) -> Result<Caller, WorkspaceError> {
    if parts.headers.contains_key(header::AUTHORIZATION) {
        let key = tokens::bearer(&parts.headers).ok_or(WorkspaceError::Unauthorized)?;
        let hash = tokens::hash(key);
        let workspace_id = keys::key_workspace(state.store.pool(), &hash)
            .await?
            .ok_or(WorkspaceError::Unauthorized)?;
        return Ok(Caller {
            workspace_id,
            subject: hash,
        });
    }
    if let Some(session) = session_cookie(&parts.headers) {
        let hash = tokens::hash(session);
        if let Some(workspace_id) =
            keys::session_workspace(state.store.pool(), &hash, state.now_ms()).await?
        {
            return Ok(Caller {
                workspace_id,
                subject: hash,
            });
        }
    }
    if state.config.require_auth {
        return Err(WorkspaceError::Unauthorized);
    }
    let workspace_id = crate::DEFAULT_WORKSPACE.to_owned();
    Ok(Caller {
        subject: quota::admit::subject(None, &workspace_id),
        workspace_id,
    })
}

/// The value of the session cookie, if any.
pub(crate) fn session_cookie(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value)
}

/// Signs in with an API key: returns the session id to put in the cookie.
pub(crate) async fn sign_in(
    state: &AppState,
    api_key: &str,
) -> Result<(String, String), WorkspaceError> {
    let workspace_id = keys::key_workspace(state.store.pool(), &tokens::hash(api_key))
        .await?
        .ok_or(WorkspaceError::Unauthorized)?;
    let session = tokens::mint(SESSION_PREFIX);
    let now = state.now_ms();
    keys::insert_session(
        state.store.pool(),
        &session.hash,
        &workspace_id,
        now,
        now.saturating_add(SESSION_TTL_MS),
    )
    .await?;
    Ok((session.plaintext, workspace_id))
}

/// The `Set-Cookie` value for a session (empty value: sign out).
pub(crate) fn cookie_header(value: &str, secure: bool) -> String {
    let max_age = if value.is_empty() {
        0
    } else {
        SESSION_TTL_MS / 1000
    };
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{SESSION_COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_is_found_among_others() {
        let mut h = axum::http::HeaderMap::new();
        h.insert(
            header::COOKIE,
            "a=1; asbx_session=xyz; b=2".parse().unwrap(),
        );
        assert_eq!(session_cookie(&h), Some("xyz"));
        assert!(cookie_header("v", true).contains("HttpOnly; SameSite=Strict"));
    }
}
