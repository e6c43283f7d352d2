//! The sandbox callback routes (docs/protocol.md §3): `/env` and `/config`
//! redeem their one-time token for the payload stored at dispatch;
//! `/results` (the `writeback` module) stores the files a run sends back.
//!
//! Uses `runs` (the run row) and `files` (where written-back files go).

pub(crate) mod api;
pub(crate) mod writeback;

use asbx_protocol::callback::{ConfigResponse, EnvResponse};
use serde::de::DeserializeOwned;

use crate::AppState;
use crate::error::WorkspaceError;
use crate::runs::store as runs;
use crate::tokens::store as token_store;
use crate::tokens::{self, TokenKind};

/// A callback payload stored on the run row.
pub(crate) trait Payload: DeserializeOwned {
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
pub(crate) async fn redeem_payload<P: Payload>(
    state: &AppState,
    session_id: &str,
    token: &str,
    kind: TokenKind,
) -> Result<P, WorkspaceError> {
    if kind != P::KIND || !asbx_protocol::dispatch::is_valid_session_id(session_id) {
        return Err(WorkspaceError::OtpRejected);
    }
    token_store::redeem(
        state.store.pool(),
        &tokens::hash(token),
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
