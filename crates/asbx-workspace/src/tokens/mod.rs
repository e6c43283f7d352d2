//! One-time tokens and other secrets: minting, hashing, bearer parsing.
//!
//! A token is 32 random bytes, base64url without padding, behind a prefix
//! that names what it is (`asbx_otp_`, `asbx_key_`, `asbx_ws_`, ...). Only
//! its SHA-256 (hex) is ever stored; the plaintext exists in memory while it
//! is minted and sent, and nowhere else.

pub(crate) mod store;

use asbx_protocol::callback::{RunLimits, SETUP_TOKEN_TTL_SECS};
use axum::http::{HeaderMap, header};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore as _;
use sha2::{Digest, Sha256};

/// Prefix of one-time callback tokens.
pub(crate) const OTP_PREFIX: &str = "asbx_otp_";
/// Prefix of a session's in-sandbox workspace API bearer
/// (`EnvResponse.workspace.token`, docs/protocol.md §3).
pub(crate) const WORKSPACE_PREFIX: &str = "asbx_ws_";
/// Prefix of a dispatch's working-directory token (runner only).
pub(crate) const WORKDIR_PREFIX: &str = "asbx_wd_";

/// How long after its runtime cap a run's tokens stay valid: the runner
/// ends a sandbox at its cap, so nothing legitimate calls back later.
const CAP_GRACE_MS: u64 = 60_000;

/// What a token may be redeemed for (docs/protocol.md §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenKind {
    /// `GET {agent_url}/env`, once.
    Setup,
    /// `GET {agent_url}/config`, once.
    Run,
    /// `POST {agent_url}/results`, once.
    Upload,
    /// `{agent_url}/workspace/...`, any number of times until the run
    /// settles (minted when `/env` is redeemed).
    Workspace,
    /// The runner's `{agent_url}/workdir/...` (CONTRACT §11), any number
    /// of times until the run settles; a chat turn's dispatch carries it
    /// and the runner never hands it to the sandbox.
    Workdir,
}

impl TokenKind {
    /// The one-time tokens a dispatch carries.
    pub(crate) const ONE_TIME: [TokenKind; 3] =
        [TokenKind::Setup, TokenKind::Run, TokenKind::Upload];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TokenKind::Setup => "setup",
            TokenKind::Run => "run",
            TokenKind::Upload => "upload",
            TokenKind::Workspace => "workspace",
            TokenKind::Workdir => "workdir",
        }
    }

    /// The token's lifetime in milliseconds for a run whose runtime cap is
    /// `cap_ms` ([`runtime_cap_ms`]): as long as its dispatch may live, the
    /// cap plus the grace after it (docs/protocol.md §3), so no token
    /// outlives its dispatch and a long setup script never outlives the run
    /// token. The setup token is redeemed first thing: at most its contract
    /// TTL (10 min) within that.
    pub(crate) fn ttl_ms(self, cap_ms: u64) -> i64 {
        let run_can = cap_ms.saturating_add(CAP_GRACE_MS);
        let ms = match self {
            TokenKind::Setup => SETUP_TOKEN_TTL_SECS.saturating_mul(1000).min(run_can),
            TokenKind::Run | TokenKind::Upload | TokenKind::Workspace | TokenKind::Workdir => {
                run_can
            }
        };
        i64::try_from(ms).unwrap_or(i64::MAX)
    }
}

/// A run's runtime cap: its `limits.maxDurationMs` clamped by its runner's
/// cap (`runner_cap_ms`, from the runner's `/healthz`, `runs::caps`), which
/// stands alone when the run names none. A runner whose cap is unknown
/// counts as the protocol's default (8 h), the longest any run may last.
pub(crate) fn runtime_cap_ms(limits: Option<&RunLimits>, runner_cap_ms: Option<u64>) -> u64 {
    let runner = runner_cap_ms
        .unwrap_or_else(|| asbx_protocol::gateway::MaxLimits::default().max_duration_ms);
    limits
        .and_then(|l| l.max_duration_ms)
        .map_or(runner, |ms| ms.min(runner))
}

/// A freshly minted secret: the plaintext to hand out and the hash to store.
#[derive(Clone)]
pub(crate) struct Minted {
    pub plaintext: String,
    pub hash: String,
}

impl std::fmt::Debug for Minted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Minted")
            .field("hash", &self.hash)
            .finish_non_exhaustive()
    }
}

/// Mints a secret with the given prefix.
pub(crate) fn mint(prefix: &str) -> Minted {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let plaintext = format!("{prefix}{}", URL_SAFE_NO_PAD.encode(bytes));
    let hash = hash(&plaintext);
    Minted { plaintext, hash }
}

/// The stored form of a secret: lowercase hex SHA-256 of the plaintext.
pub(crate) fn hash(plaintext: &str) -> String {
    hex::encode(Sha256::digest(plaintext.as_bytes()))
}

/// A random id of 128 bits as 32 lowercase hex characters; matches
/// `^[A-Za-z0-9_-]{1,64}$`, so it is also a valid session id.
pub(crate) fn random_id() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// The token of an `Authorization: Bearer <token>` header, if well formed.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    let ok = scheme.eq_ignore_ascii_case("bearer")
        && !token.is_empty()
        && token.len() <= asbx_protocol::dispatch::MAX_TOKEN_BYTES
        && token.bytes().all(|b| b.is_ascii_graphic());
    ok.then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_are_unique_and_hash_matches() {
        let a = mint(OTP_PREFIX);
        let b = mint(OTP_PREFIX);
        assert_ne!(a.plaintext, b.plaintext);
        assert!(a.plaintext.starts_with(OTP_PREFIX));
        // 32 bytes -> 43 base64url characters.
        assert_eq!(a.plaintext.len(), OTP_PREFIX.len() + 43);
        assert_eq!(a.hash, hash(&a.plaintext));
        assert_eq!(a.hash.len(), 64);
        assert!(!format!("{a:?}").contains(&a.plaintext));
    }

    #[test]
    fn bearer_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "bearer  abc ".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer(&h), None);
    }

    #[test]
    fn ttls_follow_the_contract_and_the_runtime_cap() {
        // A short run: every token for the cap + 60 s.
        assert_eq!(TokenKind::Setup.ttl_ms(60_000), 120_000);
        assert_eq!(TokenKind::Run.ttl_ms(60_000), 120_000);
        assert_eq!(TokenKind::Upload.ttl_ms(60_000), 120_000);
        assert_eq!(TokenKind::Workspace.ttl_ms(60_000), 120_000);
        // A two-hour run: everything used late lives as long as the run can.
        let cap = 2 * 3_600_000;
        assert_eq!(TokenKind::Setup.ttl_ms(cap), 600_000);
        assert_eq!(TokenKind::Run.ttl_ms(cap), 7_260_000);
        assert_eq!(TokenKind::Upload.ttl_ms(cap), 7_260_000);
        assert_eq!(TokenKind::Workspace.ttl_ms(cap), 7_260_000);
        assert_eq!(TokenKind::Workspace.ttl_ms(u64::MAX), i64::MAX);
        // No cap named: the runner's default (8 h).
        assert_eq!(runtime_cap_ms(None, None), 28_800_000);
        let limits = RunLimits {
            max_duration_ms: Some(5_000),
            ..RunLimits::default()
        };
        assert_eq!(runtime_cap_ms(Some(&limits), None), 5_000);
        // The runner's cap stands alone, and clamps a longer run's.
        assert_eq!(runtime_cap_ms(None, Some(2_000)), 2_000);
        assert_eq!(runtime_cap_ms(Some(&limits), Some(2_000)), 2_000);
        assert_eq!(runtime_cap_ms(Some(&limits), Some(9_000)), 5_000);
    }
}
