//! Writeback: validating and storing the files a run sends to `/results`.
//!
//! The upload token is checked before the body is read, and redeemed only
//! after the body has been validated in full, so a malformed body is answered
//! with 400 and leaves the token usable for a corrected retry. The
//! redemption and the file rows are one transaction, so a node that dies
//! between them leaves either both or neither.

use std::collections::BTreeSet;

use asbx_protocol::FieldError;
use asbx_protocol::callback::{ResultsRequest, ResultsResponse, StoredFile};
use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

use super::replay::{self, RequestId};
use crate::AppState;
use crate::error::WorkspaceError;
use crate::files::store::{self as files, FileOrigin, FileRow};
use crate::runs::store as runs;
use crate::tokens::store as token_store;
use crate::tokens::{self, TokenKind};
use crate::validate;

/// Largest `/results` body.
pub(crate) const MAX_RESULTS_BODY: usize = asbx_protocol::rules::limits::MAX_WRITEBACK_BYTES;
/// Most files in one `/results` call.
pub(crate) const MAX_RESULT_FILES: usize = asbx_protocol::rules::limits::MAX_WRITEBACK_FILES;

/// Standard base64, padding optional.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

struct Decoded {
    path: String,
    mime_type: String,
    bytes: Vec<u8>,
}

/// Refuses an upload token that could not be redeemed now, without
/// redeeming it: called before the body is read. A retry of `request`
/// whose redemption's answer was lost is answered here, once more, with
/// the files that redemption stored (`Some`), its body never read.
pub(crate) async fn check_upload_token(
    state: &AppState,
    session_id: &str,
    bearer: &str,
    request: Option<&RequestId>,
) -> Result<Option<ResultsResponse>, WorkspaceError> {
    let hash = tokens::hash(bearer);
    if !asbx_protocol::dispatch::is_valid_session_id(session_id) {
        return Err(WorkspaceError::OtpRejected);
    }
    let now = state.now_ms();
    if token_store::is_redeemable(
        state.store.pool(),
        &hash,
        TokenKind::Upload,
        session_id,
        now,
    )
    .await?
    {
        return Ok(None);
    }
    let answer = replay::take(
        state.store.pool(),
        &hash,
        TokenKind::Upload,
        session_id,
        request,
        now,
    )
    .await?;
    stored_answer(&answer, session_id).map(Some)
}

/// A recorded `/results` answer.
fn stored_answer(answer: &str, session_id: &str) -> Result<ResultsResponse, WorkspaceError> {
    serde_json::from_str(answer)
        .map_err(|e| WorkspaceError::Corrupt(format!("recorded results of run {session_id}: {e}")))
}

/// Validates a `/results` body in full, stores the bytes, then redeems the
/// upload token (the redemption alone decides) and stores the file rows in
/// one transaction, with what a retry of `request` is answered
/// ([`replay`]). A redemption the `UPDATE` refuses is that retry's, or
/// `401`; either way no file row is stored.
pub(crate) async fn store_results(
    state: &AppState,
    session_id: &str,
    bearer: &str,
    request: Option<&RequestId>,
    body: &[u8],
) -> Result<ResultsResponse, WorkspaceError> {
    let hash = tokens::hash(bearer);
    let decoded = parse(body)?;
    // The bytes first, pinned, outside the transaction: writing up to
    // 64 MiB must not hold SQLite's one writer.
    let mut blobs = Vec::with_capacity(decoded.len());
    for file in &decoded {
        match state.blobs.put(&file.bytes).await {
            Ok(blob) => blobs.push(blob),
            Err(e) => {
                release_all(state, blobs).await;
                return Err(e);
            }
        }
    }
    let stored = store_rows(state, session_id, &hash, request, decoded, &blobs).await;
    release_all(state, blobs).await;
    stored
}

/// Unpins what an upload stored (its rows stored, or not to be).
async fn release_all(state: &AppState, blobs: Vec<crate::files::blobs::Stored>) {
    for blob in blobs {
        state.blobs.release(blob).await;
    }
}

/// The redemption and the file rows of [`store_results`], in one
/// transaction.
async fn store_rows(
    state: &AppState,
    session_id: &str,
    token_hash: &str,
    request: Option<&RequestId>,
    decoded: Vec<Decoded>,
    blobs: &[crate::files::blobs::Stored],
) -> Result<ResultsResponse, WorkspaceError> {
    let now = state.now_ms();
    let mut tx = crate::store::begin_write(state.store.pool()).await?;
    let replayed = replay::redeem_or_take(
        &mut tx,
        token_hash,
        TokenKind::Upload,
        session_id,
        request,
        now,
    )
    .await?;
    let run = runs::get(&mut *tx, session_id)
        .await?
        .ok_or_else(|| WorkspaceError::NotFound(format!("run {session_id}")))?;
    let workspace = run.workspace_id.as_str();
    if let Some(answer) = replayed {
        // Last before each commit: the chain's head is held only that long.
        crate::audit::callback(&mut tx, now, workspace, session_id, "results").await?;
        tx.commit().await?;
        return stored_answer(&answer, session_id);
    }
    let mut stored = Vec::with_capacity(decoded.len());
    for (file, blob) in decoded.into_iter().zip(blobs) {
        let id = tokens::random_id();
        files::insert(
            &mut *tx,
            &FileRow {
                id: id.clone(),
                workspace_id: run.workspace_id.clone(),
                run_id: Some(run.id.clone()),
                chat_id: run.chat_id.clone(),
                origin: FileOrigin::Writeback,
                path: file.path.clone(),
                mime_type: file.mime_type,
                size: i64::try_from(file.bytes.len()).unwrap_or(i64::MAX),
                sha256: blob.sha256.clone(),
                created_at: now,
            },
        )
        .await?;
        stored.push(StoredFile {
            path: file.path,
            id,
        });
    }
    let answer = ResultsResponse { files: stored };
    if let Some(request) = request {
        let recorded = serde_json::to_string(&answer)
            .map_err(|e| WorkspaceError::Corrupt(format!("results of run {session_id}: {e}")))?;
        replay::record(&mut tx, token_hash, request, &recorded, now).await?;
    }
    crate::audit::callback(&mut tx, now, workspace, session_id, "results").await?;
    tx.commit().await?;
    Ok(answer)
}

/// Parses and validates a body, naming every bad field.
fn parse(body: &[u8]) -> Result<Vec<Decoded>, WorkspaceError> {
    let request: ResultsRequest = serde_json::from_slice(body).map_err(|e| {
        WorkspaceError::invalid(format!("body is not a valid results request: {e}"))
    })?;
    if request.files.len() > MAX_RESULT_FILES {
        return Err(WorkspaceError::invalid_fields(vec![FieldError::new(
            "files",
            format!("more than {MAX_RESULT_FILES} files"),
        )]));
    }
    let mut errors = Vec::new();
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(request.files.len());
    for (i, file) in request.files.into_iter().enumerate() {
        let mut ok = true;
        if let Err(m) = validate::relative_path(&file.path) {
            errors.push(FieldError::new(&format!("files[{i}].path"), m));
            ok = false;
        } else if !seen.insert(file.path.clone()) {
            errors.push(FieldError::new(
                &format!("files[{i}].path"),
                "appears more than once",
            ));
            ok = false;
        }
        let mime_type = match file.mime_type {
            Some(m) => {
                if let Err(msg) = validate::mime_type(&m) {
                    errors.push(FieldError::new(&format!("files[{i}].mime_type"), msg));
                    ok = false;
                }
                m
            }
            None => mime_guess::from_path(&file.path)
                .first_or_octet_stream()
                .essence_str()
                .to_owned(),
        };
        let bytes = match BASE64.decode(file.content_base64.as_bytes()) {
            Ok(b) => b,
            Err(e) => {
                errors.push(FieldError::new(
                    &format!("files[{i}].content_base64"),
                    format!("not valid base64: {e}"),
                ));
                ok = false;
                Vec::new()
            }
        };
        if ok {
            out.push(Decoded {
                path: file.path,
                mime_type,
                bytes,
            });
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(WorkspaceError::invalid_fields(errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bad_file_is_named() {
        let body = serde_json::json!({"files": [
            {"path": "ok.txt", "content_base64": "aGk="},
            {"path": "../x", "content_base64": "aGk="},
            {"path": "b.txt", "content_base64": "!!", "mime_type": "nope"},
            {"path": "ok.txt", "content_base64": "aGk"},
        ]});
        let Err(WorkspaceError::InvalidRequest { errors, .. }) = parse(body.to_string().as_bytes())
        else {
            panic!("expected invalid request");
        };
        let fields: Vec<_> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "files[1].path",
                "files[2].mime_type",
                "files[2].content_base64",
                "files[3].path"
            ]
        );
    }

    #[test]
    fn mime_type_is_guessed_and_padding_optional() {
        let body = serde_json::json!({"files": [
            {"path": "a/report.json", "content_base64": "aGk"},
        ]});
        let files = parse(body.to_string().as_bytes()).unwrap();
        assert_eq!(files[0].mime_type, "application/json");
        assert_eq!(files[0].bytes, b"hi");
    }
}
