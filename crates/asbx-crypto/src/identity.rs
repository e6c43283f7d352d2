//! The runner's long-term identity key, which signs each encrypted
//! session's handshake (`docs/protocol.md` §4), so a client that pinned the
//! runner's public key knows `serverPublicKey` and `salt` came from that
//! runner and not from whatever relayed them.
//!
//! ECDSA P-256 with SHA-256, the signature as the 64 bytes `r || s`: the
//! encoding WebCrypto's `ECDSA` verify takes as it is (Python's
//! `cryptography` takes it after `encode_dss_signature(r, s)`). The signed
//! bytes are the UTF-8 of
//! `"asbx-e2e-v1-sig:" + sessionId + "." + serverPublicKey + "." + salt`
//! ([`signed_message`]). Keys travel as base64url (no padding) of the
//! 65-byte uncompressed SEC1 point, like the session keys.

use p256::ecdsa::signature::{Signer, Verifier};
use p256::ecdsa::{Signature, SigningKey, VerifyingKey};

use crate::{CryptoError, EncryptionInit, b64, unb64};

/// The prefix of the signed bytes; `sessionId.serverPublicKey.salt` follows.
pub const SIGNATURE_PREFIX: &str = "asbx-e2e-v1-sig:";
/// The algorithm of the identity key, as `GET /v1/identity` names it.
pub const SIGNATURE_ALGORITHM: &str = "ECDSA-P256-SHA256";

/// What the identity key signs for one session's handshake.
pub fn signed_message(session_id: &str, server_public_key: &str, salt: &str) -> String {
    format!("{SIGNATURE_PREFIX}{session_id}.{server_public_key}.{salt}")
}

/// A runner's long-term ECDSA P-256 signing key.
#[derive(Clone)]
pub struct IdentityKey {
    key: SigningKey,
}

impl std::fmt::Debug for IdentityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityKey")
            .field("public_key", &self.public_key())
            .finish_non_exhaustive()
    }
}

impl IdentityKey {
    /// A fresh random key.
    pub fn generate() -> IdentityKey {
        IdentityKey {
            key: SigningKey::random(&mut p256::elliptic_curve::rand_core::OsRng),
        }
    }

    /// The key whose secret scalar is `text`: base64url of 32 big-endian bytes.
    pub fn from_secret(text: &str) -> Result<IdentityKey, CryptoError> {
        let bytes = unb64(text.trim(), "identity key")?;
        let key = SigningKey::from_slice(&bytes).map_err(|_| CryptoError::IdentityKey)?;
        Ok(IdentityKey { key })
    }

    /// The secret scalar as [`IdentityKey::from_secret`] reads it.
    pub fn secret(&self) -> String {
        b64(&self.key.to_bytes())
    }

    /// The public key: base64url of its uncompressed SEC1 point.
    pub fn public_key(&self) -> String {
        b64(self.key.verifying_key().to_encoded_point(false).as_bytes())
    }

    /// base64url of the 64-byte `r || s` signature of `message`.
    pub fn sign(&self, message: &[u8]) -> String {
        let sig: Signature = self.key.sign(message);
        b64(&sig.to_bytes())
    }

    /// Signs one session's handshake: [`EncryptionInit::signature`].
    pub fn sign_init(&self, session_id: &str, server_public_key: &str, salt: &str) -> String {
        self.sign(signed_message(session_id, server_public_key, salt).as_bytes())
    }
}

/// Checks `signature` (base64url of `r || s`) of `message` under
/// `public_key` (base64url of an uncompressed P-256 point).
pub fn verify(public_key: &str, message: &[u8], signature: &str) -> Result<(), CryptoError> {
    let point = crate::parse_public_key(public_key).map_err(|_| CryptoError::IdentityKey)?;
    let key = VerifyingKey::from(&point);
    let raw = unb64(signature, "signature")?;
    let sig = Signature::from_slice(&raw).map_err(|_| CryptoError::Signature)?;
    key.verify(message, &sig)
        .map_err(|_| CryptoError::Signature)
}

/// Checks that `init` was signed for `session_id` by the runner whose
/// public key is `pinned` (or, without a pin, by the `identityKey` it
/// names, which proves only that nothing altered it on the way).
pub fn verify_init(
    init: &EncryptionInit,
    session_id: &str,
    pinned: Option<&str>,
) -> Result<(), CryptoError> {
    let key = pinned.unwrap_or(&init.identity_key);
    if pinned.is_some_and(|p| p != init.identity_key) {
        return Err(CryptoError::UnpinnedIdentity);
    }
    let message = signed_message(session_id, &init.server_public_key, &init.salt);
    verify(key, message.as_bytes(), &init.signature)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClientSession, ServerSession};

    fn signed_pair(identity: &IdentityKey) -> EncryptionInit {
        let client = ClientSession::new();
        ServerSession::new(&client.public_key(), "sess-1", identity)
            .unwrap()
            .init()
            .clone()
    }

    #[test]
    fn a_signed_handshake_verifies_under_its_pinned_key() {
        let identity = IdentityKey::generate();
        let init = signed_pair(&identity);
        assert_eq!(init.identity_key, identity.public_key());
        assert_eq!(unb64(&init.signature, "s").unwrap().len(), 64, "r || s");
        verify_init(&init, "sess-1", Some(&identity.public_key())).unwrap();
        verify_init(&init, "sess-1", None).unwrap();
    }

    #[test]
    fn a_substituted_key_salt_session_or_signature_fails() {
        let identity = IdentityKey::generate();
        let pin = identity.public_key();
        let init = signed_pair(&identity);
        let other = signed_pair(&identity);
        let mut swapped_key = init.clone();
        swapped_key.server_public_key = other.server_public_key.clone();
        assert_eq!(
            verify_init(&swapped_key, "sess-1", Some(&pin)),
            Err(CryptoError::Signature)
        );
        let mut swapped_salt = init.clone();
        swapped_salt.salt = other.salt.clone();
        assert_eq!(
            verify_init(&swapped_salt, "sess-1", Some(&pin)),
            Err(CryptoError::Signature)
        );
        assert_eq!(
            verify_init(&init, "sess-2", Some(&pin)),
            Err(CryptoError::Signature),
            "a handshake moved to another session"
        );
        let mut tampered = init.clone();
        let mut sig = unb64(&tampered.signature, "s").unwrap();
        sig[10] ^= 1;
        tampered.signature = b64(&sig);
        assert_eq!(
            verify_init(&tampered, "sess-1", Some(&pin)),
            Err(CryptoError::Signature)
        );
    }

    #[test]
    fn a_relay_that_re_signs_with_its_own_key_fails_the_pin() {
        let runner = IdentityKey::generate();
        let relay = IdentityKey::generate();
        let forged = signed_pair(&relay);
        // Consistent with itself, so unpinned it passes...
        verify_init(&forged, "sess-1", None).unwrap();
        // ...but not with the runner's key.
        assert_eq!(
            verify_init(&forged, "sess-1", Some(&runner.public_key())),
            Err(CryptoError::UnpinnedIdentity)
        );
        let mut claimed = forged.clone();
        claimed.identity_key = runner.public_key();
        assert_eq!(
            verify_init(&claimed, "sess-1", Some(&runner.public_key())),
            Err(CryptoError::Signature)
        );
    }

    #[test]
    fn the_secret_round_trips_and_garbage_is_refused() {
        let identity = IdentityKey::generate();
        let again = IdentityKey::from_secret(&identity.secret()).unwrap();
        assert_eq!(again.public_key(), identity.public_key());
        let sig = again.sign(b"m");
        verify(&identity.public_key(), b"m", &sig).unwrap();
        assert_eq!(
            IdentityKey::from_secret(&b64(&[0u8; 32])).err(),
            Some(CryptoError::IdentityKey),
            "zero is no scalar"
        );
        assert!(IdentityKey::from_secret("not base64!").is_err());
        assert_eq!(
            verify(&identity.public_key(), b"m", &b64(&[1u8; 63])),
            Err(CryptoError::Signature)
        );
    }
}
