//! End-to-end encryption of protocol 2 sessions (`docs/protocol.md` §4).
//!
//! The client sends an ephemeral P-256 public key K with its dispatch. The
//! runner makes its own ephemeral key S and a 32-byte salt T, announces both
//! in the clear in `session_init`, and derives the session key
//! `HKDF-SHA-256(ikm = ECDH(S, K).x, salt = T, info = "asbx-e2e-v1:" + sessionId)`.
//! Every later line keeps `type`, `seq`, `ts`, `sessionId` in the clear and
//! carries the rest of its fields as `"encrypted": {"iv", "ciphertext"}`:
//! AES-256-GCM with a fresh 12-byte nonce and additional data
//! `sessionId.seq.type`, so a line moved, replayed under another `seq` or
//! relabelled fails to open. A client's tool result travels back the same way
//! with additional data `sessionId.tool-result.callId`.
//!
//! - [`ServerSession`]: the runner's side (seals lines, opens tool results).
//! - [`ClientSession`]: the client's side (opens lines, seals tool results),
//!   for the workspace's tests, the SDKs' reference and the CLI.
//! - [`IdentityKey`] (module `identity`): the runner's long-term key, which
//!   signs `sessionId.serverPublicKey.salt` so a client that pinned it can
//!   tell the handshake came from that runner ([`verify_init`]).
//!
//! Everything is base64url without padding. Written with the RustCrypto
//! crates (`p256`, `hkdf`, `aes-gcm`) so a browser's WebCrypto and Node's
//! `crypto.webcrypto` can decrypt with nothing else (a test checks Node).

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hkdf::Hkdf;
use p256::PublicKey;
use p256::ecdh::EphemeralSecret;
use p256::elliptic_curve::sec1::ToEncodedPoint;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sha2::Sha256;
use std::collections::BTreeMap;

/// The `algorithm` named in `session_init.encryption`.
pub const ALGORITHM: &str = "ECDH-P256+HKDF-SHA256+AES-256-GCM";
/// The HKDF info prefix; the session id follows it.
pub const INFO_PREFIX: &str = "asbx-e2e-v1:";
/// Fields of a line that stay in the clear.
pub const CLEAR_FIELDS: [&str; 4] = ["type", "seq", "ts", "sessionId"];

/// What can go wrong.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CryptoError {
    #[error("the client public key is not base64url: {0}")]
    KeyEncoding(String),
    #[error("the client public key is not a 65-byte uncompressed P-256 point")]
    KeyPoint,
    #[error("the {0} is not base64url")]
    Encoding(&'static str),
    #[error("the nonce must be 12 bytes")]
    NonceLength,
    #[error("decryption failed: wrong key, or the line was altered, moved or relabelled")]
    Open,
    #[error("the line is not a JSON object with type, seq and sessionId: {0}")]
    Line(String),
    #[error("the identity key is not a P-256 key")]
    IdentityKey,
    #[error(
        "the session's signature does not verify: the handshake was altered or not signed by the runner"
    )]
    Signature,
    #[error("the session is signed by another identity key than the pinned one")]
    UnpinnedIdentity,
}

mod identity;
pub use identity::{
    IdentityKey, SIGNATURE_ALGORITHM, SIGNATURE_PREFIX, signed_message, verify, verify_init,
};

pub use asbx_protocol::line::{EncryptionInit, Sealed};

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn unb64(s: &str, what: &'static str) -> Result<Vec<u8>, CryptoError> {
    URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| CryptoError::Encoding(what))
}

/// Parses K: base64url of a 65-byte uncompressed SEC1 point on P-256.
pub fn parse_public_key(k: &str) -> Result<PublicKey, CryptoError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(k)
        .map_err(|e| CryptoError::KeyEncoding(e.to_string()))?;
    if bytes.len() != 65 || bytes[0] != 0x04 {
        return Err(CryptoError::KeyPoint);
    }
    PublicKey::from_sec1_bytes(&bytes).map_err(|_| CryptoError::KeyPoint)
}

/// base64url of the uncompressed SEC1 point of `key`.
pub fn encode_public_key(key: &PublicKey) -> String {
    b64(key.to_encoded_point(false).as_bytes())
}

/// The additional data of line `seq` of type `kind`.
pub fn line_aad(session_id: &str, seq: u64, kind: &str) -> String {
    format!("{session_id}.{seq}.{kind}")
}

/// The additional data of a tool result for `call_id`.
pub fn tool_result_aad(session_id: &str, call_id: &str) -> String {
    format!("{session_id}.tool-result.{call_id}")
}

/// One session's AES-256-GCM key, bound to its session id.
struct SessionKey {
    cipher: Aes256Gcm,
    session_id: String,
}

impl SessionKey {
    fn derive(
        secret: &EphemeralSecret,
        peer: &PublicKey,
        salt: &[u8],
        session_id: &str,
    ) -> SessionKey {
        let shared = secret.diffie_hellman(peer);
        let hk = Hkdf::<Sha256>::new(Some(salt), shared.raw_secret_bytes().as_slice());
        let mut key = [0u8; 32];
        let info = format!("{INFO_PREFIX}{session_id}");
        // 32 bytes is far below HKDF-SHA-256's 8160-byte limit: expand can't fail.
        let _ = hk.expand(info.as_bytes(), &mut key);
        let cipher = Aes256Gcm::new(&key.into());
        SessionKey {
            cipher,
            session_id: session_id.to_owned(),
        }
    }

    fn seal(&self, aad: &str, plaintext: &[u8]) -> Sealed {
        let iv: [u8; 12] = rand::random();
        let ciphertext = self
            .cipher
            .encrypt(
                Nonce::from_slice(&iv),
                Payload {
                    msg: plaintext,
                    aad: aad.as_bytes(),
                },
            )
            // AES-GCM encryption fails only past 64 GiB per message.
            .unwrap_or_default();
        Sealed {
            iv: b64(&iv),
            ciphertext: b64(&ciphertext),
        }
    }

    fn open(&self, aad: &str, sealed: &Sealed) -> Result<Vec<u8>, CryptoError> {
        let iv = unb64(&sealed.iv, "iv")?;
        if iv.len() != 12 {
            return Err(CryptoError::NonceLength);
        }
        let ct = unb64(&sealed.ciphertext, "ciphertext")?;
        self.cipher
            .decrypt(
                Nonce::from_slice(&iv),
                Payload {
                    msg: &ct,
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| CryptoError::Open)
    }
}

/// The runner's side of one encrypted session.
pub struct ServerSession {
    key: SessionKey,
    init: EncryptionInit,
}

impl std::fmt::Debug for ServerSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerSession")
            .field("session_id", &self.key.session_id)
            .finish_non_exhaustive()
    }
}

impl ServerSession {
    /// Agrees a key with the client's public key K for `session_id`, and
    /// signs the handshake with the runner's `identity`.
    pub fn new(
        client_public_key: &str,
        session_id: &str,
        identity: &IdentityKey,
    ) -> Result<ServerSession, CryptoError> {
        let peer = parse_public_key(client_public_key)?;
        let secret = EphemeralSecret::random(&mut p256::elliptic_curve::rand_core::OsRng);
        let salt: [u8; 32] = rand::random();
        let key = SessionKey::derive(&secret, &peer, &salt, session_id);
        let server_public_key = encode_public_key(&secret.public_key());
        let salt = b64(&salt);
        let init = EncryptionInit {
            algorithm: ALGORITHM.to_owned(),
            signature: identity.sign_init(session_id, &server_public_key, &salt),
            identity_key: identity.public_key(),
            server_public_key,
            salt,
        };
        Ok(ServerSession { key, init })
    }

    /// What `session_init.encryption` carries.
    pub fn init(&self) -> &EncryptionInit {
        &self.init
    }

    /// Seals the fields of line `seq` of type `kind` (a JSON object's bytes).
    pub fn seal_line(&self, seq: u64, kind: &str, fields_json: &[u8]) -> Sealed {
        self.key
            .seal(&line_aad(&self.key.session_id, seq, kind), fields_json)
    }

    /// Rewrites one stamped line (a JSON object, no newline) into its
    /// encrypted form: the clear fields, then `encrypted`.
    ///
    /// Each field's value is carried as its original bytes (never parsed
    /// into numbers or trees), so what opens is exactly what was stamped.
    pub fn encrypt_line(&self, line: &[u8]) -> Result<Vec<u8>, CryptoError> {
        let bad = |e: serde_json::Error| CryptoError::Line(e.to_string());
        let fields: BTreeMap<String, &RawValue> = serde_json::from_slice(line).map_err(bad)?;
        let kind: String = fields
            .get("type")
            .map(|v| serde_json::from_str(v.get()))
            .transpose()
            .map_err(bad)?
            .ok_or_else(|| CryptoError::Line("no type".into()))?;
        let seq: u64 = fields
            .get("seq")
            .map(|v| serde_json::from_str(v.get()))
            .transpose()
            .map_err(bad)?
            .ok_or_else(|| CryptoError::Line("no seq".into()))?;
        let mut clear = Vec::with_capacity(line.len() / 4 + 128);
        let mut rest = Vec::with_capacity(line.len());
        clear.push(b'{');
        rest.push(b'{');
        for (name, value) in &fields {
            let out = if CLEAR_FIELDS.contains(&name.as_str()) {
                &mut clear
            } else {
                &mut rest
            };
            if out.len() > 1 {
                out.push(b',');
            }
            serde_json::to_writer(&mut *out, name).map_err(bad)?;
            out.push(b':');
            out.extend_from_slice(value.get().as_bytes());
        }
        rest.push(b'}');
        let sealed = self.seal_line(seq, &kind, &rest);
        if clear.len() > 1 {
            clear.push(b',');
        }
        clear.extend_from_slice(b"\"encrypted\":");
        serde_json::to_writer(&mut clear, &sealed).map_err(bad)?;
        clear.push(b'}');
        Ok(clear)
    }

    /// Opens a client's encrypted tool result for `call_id`: the JSON bytes
    /// of `{"result": ..}` or `{"error": ".."}`.
    pub fn open_tool_result(&self, call_id: &str, sealed: &Sealed) -> Result<Vec<u8>, CryptoError> {
        self.key
            .open(&tool_result_aad(&self.key.session_id, call_id), sealed)
    }
}

/// The client's side of one encrypted session.
pub struct ClientSession {
    secret: EphemeralSecret,
    key: Option<SessionKey>,
}

impl std::fmt::Debug for ClientSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSession")
            .field("agreed", &self.key.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for ClientSession {
    fn default() -> Self {
        ClientSession::new()
    }
}

impl ClientSession {
    /// A fresh ephemeral key.
    pub fn new() -> ClientSession {
        ClientSession {
            secret: EphemeralSecret::random(&mut p256::elliptic_curve::rand_core::OsRng),
            key: None,
        }
    }

    /// K, for the dispatch's `encryption.client_public_key`.
    pub fn public_key(&self) -> String {
        encode_public_key(&self.secret.public_key())
    }

    /// Derives the key from `session_init.encryption`.
    pub fn agree(&mut self, init: &EncryptionInit, session_id: &str) -> Result<(), CryptoError> {
        let server = parse_public_key(&init.server_public_key)?;
        let salt = unb64(&init.salt, "salt")?;
        self.key = Some(SessionKey::derive(&self.secret, &server, &salt, session_id));
        Ok(())
    }

    fn key(&self) -> Result<&SessionKey, CryptoError> {
        self.key.as_ref().ok_or(CryptoError::Open)
    }

    /// Opens the fields of line `seq` of type `kind`.
    pub fn open_line(&self, seq: u64, kind: &str, sealed: &Sealed) -> Result<Vec<u8>, CryptoError> {
        let key = self.key()?;
        key.open(&line_aad(&key.session_id, seq, kind), sealed)
    }

    /// Turns one encrypted line back into the plain line (clear fields and
    /// the opened ones).
    pub fn decrypt_line(&self, line: &[u8]) -> Result<Map<String, Value>, CryptoError> {
        let mut obj: Map<String, Value> =
            serde_json::from_slice(line).map_err(|e| CryptoError::Line(e.to_string()))?;
        let Some(enc) = obj.remove("encrypted") else {
            return Ok(obj);
        };
        let sealed: Sealed =
            serde_json::from_value(enc).map_err(|e| CryptoError::Line(e.to_string()))?;
        let kind = obj.get("type").and_then(Value::as_str).unwrap_or_default();
        let seq = obj.get("seq").and_then(Value::as_u64).unwrap_or_default();
        let plain = self.open_line(seq, kind, &sealed)?;
        let fields: Map<String, Value> =
            serde_json::from_slice(&plain).map_err(|e| CryptoError::Line(e.to_string()))?;
        obj.extend(fields);
        Ok(obj)
    }

    /// Seals a tool result (`{"result": ..}` or `{"error": ..}` as JSON bytes).
    pub fn seal_tool_result(&self, call_id: &str, json: &[u8]) -> Result<Sealed, CryptoError> {
        let key = self.key()?;
        Ok(key.seal(&tool_result_aad(&key.session_id, call_id), json))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(session: &str) -> (ServerSession, ClientSession) {
        let mut client = ClientSession::new();
        let server =
            ServerSession::new(&client.public_key(), session, &IdentityKey::generate()).unwrap();
        client.agree(server.init(), session).unwrap();
        (server, client)
    }

    #[test]
    fn a_line_round_trips_with_its_clear_fields_kept() {
        let (server, client) = pair("s1");
        let line = br#"{"seq":3,"ts":5,"sessionId":"s1","type":"delta","text":"secret words"}"#;
        let enc = server.encrypt_line(line).unwrap();
        let text = String::from_utf8(enc.clone()).unwrap();
        assert!(!text.contains("secret words"), "{text}");
        assert!(text.contains(r#""type":"delta""#) && text.contains(r#""seq":3"#));
        let plain = client.decrypt_line(&enc).unwrap();
        let want: Map<String, Value> = serde_json::from_slice(line).unwrap();
        assert_eq!(plain, want);
    }

    #[test]
    fn field_values_are_sealed_byte_for_byte() {
        let (server, client) = pair("s1");
        // Numbers no f64 holds, escapes and nesting come out as they went in.
        let line = br#"{"seq":7,"ts":5,"sessionId":"s1","type":"step","args":{"n":1e400,"big":123456789012345678901234567890,"s":"a\"\u00e9"}}"#;
        let enc: Map<String, Value> =
            serde_json::from_slice(&server.encrypt_line(line).unwrap()).unwrap();
        let sealed: Sealed = serde_json::from_value(enc["encrypted"].clone()).unwrap();
        let plain = client.open_line(7, "step", &sealed).unwrap();
        assert_eq!(
            std::str::from_utf8(&plain).unwrap(),
            r#"{"args":{"n":1e400,"big":123456789012345678901234567890,"s":"a\"\u00e9"}}"#
        );
        let mut keys: Vec<&str> = enc.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["encrypted", "seq", "sessionId", "ts", "type"]);
        assert!(
            server
                .encrypt_line(br#"{"seq":1,"sessionId":"s1"}"#)
                .is_err()
        );
        assert!(server.encrypt_line(b"[1]").is_err());
    }

    #[test]
    fn moved_relabelled_or_tampered_lines_fail_to_open() {
        let (server, client) = pair("s1");
        let sealed = server.seal_line(4, "result", br#"{"message":"m"}"#);
        assert!(client.open_line(4, "result", &sealed).is_ok());
        assert_eq!(
            client.open_line(5, "result", &sealed),
            Err(CryptoError::Open)
        );
        assert_eq!(
            client.open_line(4, "error", &sealed),
            Err(CryptoError::Open)
        );
        let mut ct = unb64(&sealed.ciphertext, "ciphertext").unwrap();
        ct[0] ^= 1;
        let tampered = Sealed {
            iv: sealed.iv.clone(),
            ciphertext: b64(&ct),
        };
        assert_eq!(
            client.open_line(4, "result", &tampered),
            Err(CryptoError::Open)
        );
        // Another session's key (a wrong key) opens nothing.
        let (_, other) = pair("s1");
        assert_eq!(
            other.open_line(4, "result", &sealed),
            Err(CryptoError::Open)
        );
    }

    #[test]
    fn tool_results_travel_back_bound_to_their_call() {
        let (server, client) = pair("s9");
        let sealed = client.seal_tool_result("c1", br#"{"result":42}"#).unwrap();
        assert_eq!(
            server.open_tool_result("c1", &sealed).unwrap(),
            br#"{"result":42}"#
        );
        assert_eq!(
            server.open_tool_result("c2", &sealed),
            Err(CryptoError::Open)
        );
    }

    #[test]
    fn bad_client_keys_are_refused() {
        assert!(matches!(
            ServerSession::new("not base64!", "s", &IdentityKey::generate()),
            Err(CryptoError::KeyEncoding(_))
        ));
        assert_eq!(
            ServerSession::new(&b64(&[4u8; 65]), "s", &IdentityKey::generate()).err(),
            Some(CryptoError::KeyPoint)
        );
        let compressed = {
            let c = ClientSession::new();
            let k = unb64(&c.public_key(), "k").unwrap();
            b64(&k[..33])
        };
        assert_eq!(
            ServerSession::new(&compressed, "s", &IdentityKey::generate()).err(),
            Some(CryptoError::KeyPoint)
        );
    }
}
