//! Authentication of the runner's routes: the [`Authorized`] extractor.
//!
//! When a token is configured every route but `/healthz` and `/v1/identity`
//! (a public key) needs `Authorization: Bearer <token>`, compared in
//! constant time.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

use crate::Inner;
use crate::error::RunnerError;

/// Proof that a request carried the runner's token (or that none is set).
/// Put it first among a handler's arguments so it runs before the body is
/// read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Authorized;

impl FromRequestParts<Arc<Inner>> for Authorized {
    type Rejection = RunnerError;

    async fn from_request_parts(
        parts: &mut Parts,
        inner: &Arc<Inner>,
    ) -> Result<Self, Self::Rejection> {
        let Some(want) = &inner.config.token else {
            return Ok(Authorized);
        };
        let got = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match got {
            Some(g) if constant_time_eq(g.as_bytes(), want.as_bytes()) => Ok(Authorized),
            _ => Err(RunnerError::Unauthorized),
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
