//! The small HTTP helpers every feature's handlers share: the JSON body
//! extractor and body reading. (The router is in `lib.rs`, above every
//! feature.)
//!
//! Handlers (in each feature's `api` module) stay thin: extract, call one
//! function of the feature, answer. Every error is a [`WorkspaceError`].

use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, header};
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::error::WorkspaceError;

/// Largest JSON body of the ordinary API routes.
pub(crate) const MAX_JSON_BODY: usize = 8 * 1024 * 1024;
/// Largest body of a route that carries skill bundles (`POST /api/runs`,
/// stored agents): room for `asbx_protocol::rules::skills::MAX_TOTAL_BYTES`
/// of bundles twice over (JSON escaping), plus the rest of the definition,
/// so the API never refuses by size what the agent would install.
pub(crate) const MAX_DEFINITION_BODY: usize =
    2 * asbx_protocol::rules::skills::MAX_TOTAL_BYTES + MAX_JSON_BODY;

/// The body bytes, or 413 / 400 as problem+json.
pub(crate) fn body_bytes(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Bytes, WorkspaceError> {
    body.map_err(|rejection| {
        if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            WorkspaceError::BodyTooLarge { limit }
        } else {
            WorkspaceError::invalid(format!("could not read the body: {rejection}"))
        }
    })
}

/// A JSON request body: `Content-Type: application/json` (else `415`,
/// before the body is read), at most the route's body limit (else `413`),
/// parsed into `T` (else `400` naming the problem).
#[derive(Debug)]
///
/// `LIMIT` is the route's body limit in bytes (default [`MAX_JSON_BODY`]).
pub(crate) struct JsonBody<T, const LIMIT: usize = MAX_JSON_BODY>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned, const LIMIT: usize> FromRequest<S>
    for JsonBody<T, LIMIT>
{
    type Rejection = WorkspaceError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        require_json(req.headers())?;
        // This extractor's own limit (the router's `DefaultBodyLimit` only
        // binds axum's own body extractors).
        let body = http_body_util::Limited::new(req.into_body(), LIMIT);
        let bytes = http_body_util::BodyExt::collect(body)
            .await
            .map(http_body_util::Collected::to_bytes)
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    WorkspaceError::BodyTooLarge { limit: LIMIT }
                } else {
                    WorkspaceError::invalid(format!("could not read the body: {e}"))
                }
            })?;

        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| WorkspaceError::invalid(format!("invalid JSON body: {e}")))
    }
}

/// `415` unless the request says its body is `application/json` (with
/// parameters such as `charset` allowed).
pub(crate) fn require_json(headers: &HeaderMap) -> Result<(), WorkspaceError> {
    let found = match headers.get(header::CONTENT_TYPE) {
        None => "no content type".to_owned(),
        Some(v) => {
            let text = v.to_str().unwrap_or("(not text)");
            let essence = text.split(';').next().unwrap_or("").trim();
            if essence.eq_ignore_ascii_case("application/json") {
                return Ok(());
            }
            text.chars().filter(|c| !c.is_control()).take(100).collect()
        }
    };
    Err(WorkspaceError::UnsupportedMediaType { found })
}
