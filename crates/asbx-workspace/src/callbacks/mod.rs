//! The sandbox callback routes (docs/protocol.md §3): `/env` and `/config`
//! redeem their one-time token for the payload stored at dispatch (`/env`
//! also mints the session's workspace API bearer); `/results` (the
//! `writeback` module) stores the files a run sends back.
//!
//! A redemption that carries the gateway's request id can be answered once
//! more to that request's retry, on any node (the `replay` module).
//!
//! Uses `runs` (the run row), `files` (where written-back files go),
//! `environments` (the secrets `/env` adds, read when it is redeemed) and
//! `callback_replays` (what a retry is answered with).

pub(crate) mod api;
pub(crate) mod replay;
pub(crate) mod writeback;

use asbx_protocol::callback::{ConfigResponse, EnvResponse};
use serde::de::DeserializeOwned;

use self::replay::{EnvReplay, RequestId};
use crate::AppState;
use crate::environments::{self, SecretRefs};
use crate::error::WorkspaceError;
use crate::runs::store as runs;
use crate::secrets::Sealer;
use crate::tokens::store as token_store;
use crate::tokens::{self, TokenKind, WORKSPACE_PREFIX};

/// A callback payload stored on the run row.
pub(crate) trait Payload: DeserializeOwned {
    const KIND: TokenKind;
    /// The route it is redeemed at, as the audit log names it.
    const ROUTE: &'static str;
    fn stored(run: &runs::RunRow) -> &str;
    /// Opens what is stored sealed.
    fn open(&mut self, sealer: &Sealer) -> Result<(), WorkspaceError>;
}

impl Payload for ConfigResponse {
    const KIND: TokenKind = TokenKind::Run;
    const ROUTE: &'static str = "config";
    fn stored(run: &runs::RunRow) -> &str {
        &run.config_json
    }
    fn open(&mut self, sealer: &Sealer) -> Result<(), WorkspaceError> {
        sealer.open_servers(&mut self.mcp_servers)
    }
}

/// Redeems `token` (which must be of `kind`, for `session_id`, unused and
/// unexpired) and returns the payload of that session; or answers the retry
/// of `request` once more ([`replay`]).
pub(crate) async fn redeem_payload<P: Payload>(
    state: &AppState,
    session_id: &str,
    token: &str,
    kind: TokenKind,
    request: Option<&RequestId>,
) -> Result<P, WorkspaceError> {
    if kind != P::KIND || !asbx_protocol::dispatch::is_valid_session_id(session_id) {
        return Err(WorkspaceError::OtpRejected);
    }
    let now = state.now_ms();
    let hash = tokens::hash(token);
    let mut tx = crate::store::begin_write(state.store.pool()).await?;
    let replayed = replay::redeem_or_take(&mut tx, &hash, kind, session_id, request, now).await?;
    if let (None, Some(request)) = (&replayed, request) {
        replay::record(&mut tx, &hash, request, "{}", now).await?;
    }
    let run = runs::get(&mut *tx, session_id)
        .await?
        .ok_or_else(|| WorkspaceError::NotFound(format!("run {session_id}")))?;
    crate::audit::callback(&mut tx, now, &run.workspace_id, session_id, P::ROUTE).await?;
    tx.commit().await?;
    let mut payload: P = serde_json::from_str(P::stored(&run))
        .map_err(|e| WorkspaceError::Corrupt(format!("stored payload of run {session_id}: {e}")))?;
    payload.open(&state.sealer)?;
    Ok(payload)
}

/// Redeems the setup token of `session_id` for its `/env`, with a freshly
/// minted workspace API bearer in `workspace.token` (docs/protocol.md §3):
/// the redemption and the bearer's hash are stored in one transaction, and
/// the plaintext exists only in this answer. The bearer lives for the run's
/// runtime cap (clamped by its runner's, `runs::caps`) + 60 s and is
/// revoked when the run settles.
///
/// The retry of `request` is answered once more ([`replay`]): the same
/// payload, with a fresh bearer; the lost answer's bearer is revoked.
/// `strips`: the gateway relaying the answer removes `injected_secrets`
/// before the sandbox sees it (its `STRIPS_INJECTED_SECRETS` header).
pub(crate) async fn redeem_env(
    state: &AppState,
    session_id: &str,
    token: &str,
    request: Option<&RequestId>,
    strips: bool,
) -> Result<EnvResponse, WorkspaceError> {
    if !asbx_protocol::dispatch::is_valid_session_id(session_id) {
        return Err(WorkspaceError::OtpRejected);
    }
    let now = state.now_ms();
    let hash = tokens::hash(token);
    let mut tx = crate::store::begin_write(state.store.pool()).await?;
    let replayed =
        replay::redeem_or_take(&mut tx, &hash, TokenKind::Setup, session_id, request, now).await?;
    let run = runs::get(&mut *tx, session_id)
        .await?
        .ok_or_else(|| WorkspaceError::NotFound(format!("run {session_id}")))?;
    let corrupt = |e: serde_json::Error| {
        WorkspaceError::Corrupt(format!("stored payload of run {session_id}: {e}"))
    };
    let mut env: EnvResponse = serde_json::from_str(&run.env_json).map_err(corrupt)?;
    if let Some(refs) = run.env_secrets.as_deref() {
        let refs: SecretRefs = serde_json::from_str(refs).map_err(corrupt)?;
        environments::with_secrets(
            &mut tx,
            &state.sealer,
            &run.workspace_id,
            &refs,
            strips,
            &mut env,
        )
        .await?;
    }
    let mut new_bearer = None;
    if let Some(access) = env.workspace.as_mut() {
        let config: ConfigResponse = serde_json::from_str(&run.config_json).map_err(corrupt)?;
        // The runner's cap as this node last learnt it (no request inside
        // the transaction); unknown, the default's.
        let runner_cap = run
            .sandbox_url
            .as_deref()
            .and_then(|u| url::Url::parse(u).ok())
            .and_then(|u| state.dispatcher.caps.cached(&u));
        let cap_ms = tokens::runtime_cap_ms(config.limits.as_ref(), runner_cap);
        let minted = tokens::mint(WORKSPACE_PREFIX);
        token_store::insert(
            &mut *tx,
            &minted,
            TokenKind::Workspace,
            session_id,
            cap_ms,
            now,
        )
        .await?;
        access.token = minted.plaintext;
        new_bearer = Some(minted.hash);
    }
    match (replayed, request) {
        (Some(answer), _) => {
            let lost: EnvReplay = serde_json::from_str(&answer).map_err(corrupt)?;
            if let Some(lost) = lost.bearer_hash {
                replay::revoke_bearer(&mut *tx, &lost, session_id, now).await?;
            }
        }
        (None, Some(request)) => {
            let answer = EnvReplay {
                bearer_hash: new_bearer,
            };
            let answer = serde_json::to_string(&answer).map_err(corrupt)?;
            replay::record(&mut tx, &hash, request, &answer, now).await?;
        }
        (None, None) => {}
    }
    crate::audit::callback(&mut tx, now, &run.workspace_id, session_id, "env").await?;
    tx.commit().await?;
    Ok(env)
}
