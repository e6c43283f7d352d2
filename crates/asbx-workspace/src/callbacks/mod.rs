//! Redeeming the setup and run tokens for the payloads stored at dispatch.

use asbx_protocol::callback::{ConfigResponse, EnvResponse};
use serde::de::DeserializeOwned;

use crate::error::WorkspaceError;
use crate::state::AppState;
use crate::store::{runs, tokens};
use crate::token::{self, TokenKind};

/// A callback payload stored on the run row.
pub trait Payload: DeserializeOwned {
    const KIND: TokenKind;
    fn stored(run: &runs::RunRow) -> &str;
}

impl Payload for EnvResponse {
    const KIND: TokenKind = TokenKind::Setup;
    fn stored(run: &runs::RunRow) -> &str {
        &run.env_json
    }
}

impl Payload for ConfigResponse {
    const KIND: TokenKind = TokenKind::Run;
    fn stored(run: &runs::RunRow) -> &str {
        &run.config_json
    }
}

/// Redeems `token` (which must be of `kind`, for `session_id`, unused and
/// unexpired) and returns the payload of that session.
pub async fn redeem_payload<P: Payload>(
    state: &AppState,
    session_id: &str,
    token: &str,
    kind: TokenKind,
) -> Result<P, WorkspaceError> {
    if kind != P::KIND || !asbx_protocol::dispatch::is_valid_session_id(session_id) {
        return Err(WorkspaceError::OtpRejected);
    }
    tokens::redeem(
        state.store.pool(),
        &token::hash(token),
        kind,
        session_id,
        state.now_ms(),
    )
    .await?;
    let run = runs::get(state.store.pool(), session_id)
        .await?
        .ok_or_else(|| WorkspaceError::NotFound(format!("run {session_id}")))?;
    serde_json::from_str(P::stored(&run))
        .map_err(|e| WorkspaceError::Corrupt(format!("stored payload of run {session_id}: {e}")))
}
