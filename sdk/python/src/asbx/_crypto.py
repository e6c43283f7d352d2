"""End-to-end encryption of protocol 2 runs, the client's side (docs/protocol.md §4).

The same construction as the Rust `asbx-crypto` crate: an ephemeral P-256
key K (sent as the base64url, unpadded, of its 65-byte uncompressed point),
the runner's key S and salt T from `session_init.encryption`, the session
key `HKDF-SHA-256(ikm = ECDH.x, salt = T, info = "asbx-e2e-v1:" + sessionId)`,
and AES-256-GCM per line with additional data `sessionId.seq.type` (tool
results: `sessionId.tool-result.callId`), a 12-byte nonce, the tag appended.

The runner signs `"asbx-e2e-v1-sig:" + sessionId + "." + serverPublicKey + "." + salt`
with its long-term ECDSA P-256 identity key (`GET /v1/identity`); the signature is
the 64 bytes `r || s`. A session pinned to a runner key (`runner_public_key`) is
refused with `SignatureError` unless that key verifies it.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ._errors import DecryptionError, SignatureError

ALGORITHM = "ECDH-P256+HKDF-SHA256+AES-256-GCM"
INFO_PREFIX = "asbx-e2e-v1:"
SIGNATURE_PREFIX = "asbx-e2e-v1-sig:"
CLEAR_FIELDS = ("type", "seq", "ts", "sessionId")


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64(text: str, what: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError) as e:
        raise DecryptionError(f"the {what} is not base64url", code="decryption_failed") from e


def encode_public_key(key: ec.EllipticCurvePublicKey) -> str:
    return b64(key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint))


def parse_public_key(text: str) -> ec.EllipticCurvePublicKey:
    raw = unb64(text, "public key")
    if len(raw) != 65 or raw[0] != 4:
        raise DecryptionError(
            "the public key is not a 65-byte uncompressed P-256 point", code="decryption_failed"
        )
    try:
        return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), raw)
    except ValueError as e:
        raise DecryptionError("the public key is not a point on P-256", code="decryption_failed") from e


def signed_message(session_id: str, server_public_key: str, salt: str) -> bytes:
    """What the runner's identity key signs for one session's handshake."""
    return f"{SIGNATURE_PREFIX}{session_id}.{server_public_key}.{salt}".encode()


def verify_signature(public_key: str, message: bytes, signature: str) -> None:
    """Checks a base64url `r || s` ECDSA P-256 SHA-256 signature; `SignatureError` if it fails."""
    try:
        key = parse_public_key(public_key)
        raw = unb64(signature, "signature")
    except DecryptionError as e:
        raise SignatureError(
            f"the runner key or signature is malformed: {e.detail}", code="signature_invalid"
        ) from e
    if len(raw) != 64:
        raise SignatureError("the signature is not 64 bytes (r || s)", code="signature_invalid")
    der = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
    try:
        key.verify(der, message, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature as e:
        raise SignatureError(
            "the session's signature does not verify: its keys were substituted on the way, "
            "or it was signed by another runner",
            code="signature_invalid",
        ) from e


def verify_init(init: dict[str, Any], session_id: str, runner_public_key: str | None) -> None:
    """Checks `session_init.encryption`'s signature under the pinned key (without a pin,
    under the `identityKey` it names, when it carries one: that proves only that nothing
    altered it on the way)."""
    signature = init.get("signature")
    key = runner_public_key or init.get("identityKey")
    if key is None:
        return
    if not isinstance(signature, str):
        raise SignatureError("session_init.encryption carries no signature", code="signature_invalid")
    verify_signature(
        str(key),
        signed_message(session_id, str(init.get("serverPublicKey", "")), str(init.get("salt", ""))),
        signature,
    )


def derive_key(
    private: ec.EllipticCurvePrivateKey, peer: ec.EllipticCurvePublicKey, salt: bytes, session_id: str
) -> bytes:
    shared = private.exchange(ec.ECDH(), peer)
    return HKDF(
        algorithm=hashes.SHA256(), length=32, salt=salt, info=(INFO_PREFIX + session_id).encode()
    ).derive(shared)


def line_aad(session_id: str, seq: int, kind: str) -> str:
    return f"{session_id}.{seq}.{kind}"


def tool_result_aad(session_id: str, call_id: str) -> str:
    return f"{session_id}.tool-result.{call_id}"


def seal(key: bytes, aad: str, plaintext: bytes) -> dict[str, str]:
    iv = os.urandom(12)
    return {"iv": b64(iv), "ciphertext": b64(AESGCM(key).encrypt(iv, plaintext, aad.encode()))}


def open_sealed(key: bytes, aad: str, sealed: dict[str, Any]) -> bytes:
    iv = unb64(str(sealed.get("iv", "")), "iv")
    if len(iv) != 12:
        raise DecryptionError("the nonce must be 12 bytes", code="decryption_failed")
    ct = unb64(str(sealed.get("ciphertext", "")), "ciphertext")
    try:
        return AESGCM(key).decrypt(iv, ct, aad.encode())
    except InvalidTag as e:
        raise DecryptionError(
            "decryption failed: wrong key, or the line was altered, moved or relabelled",
            code="decryption_failed",
        ) from e


class ClientSession:
    """One encrypted run, the client's side: a fresh key K, then the agreed session key.

    With `runner_public_key` (the runner's `GET /v1/identity` key), `agree` refuses a
    `session_init` that key did not sign (`SignatureError`).
    """

    def __init__(self, runner_public_key: str | None = None) -> None:
        self._private = ec.generate_private_key(ec.SECP256R1())
        self._key: bytes | None = None
        self.session_id: str | None = None
        self.runner_public_key = runner_public_key

    @property
    def public_key(self) -> str:
        """K, for the run's `encryption.clientPublicKey`."""
        return encode_public_key(self._private.public_key())

    @property
    def agreed(self) -> bool:
        return self._key is not None

    def agree(self, init: dict[str, Any], session_id: str) -> None:
        """Derives the session key from `session_init.encryption`."""
        if init.get("algorithm") != ALGORITHM:
            raise DecryptionError(f"unknown algorithm {init.get('algorithm')!r}", code="decryption_failed")
        verify_init(init, session_id, self.runner_public_key)
        peer = parse_public_key(str(init.get("serverPublicKey", "")))
        salt = unb64(str(init.get("salt", "")), "salt")
        self._key = derive_key(self._private, peer, salt, session_id)
        self.session_id = session_id

    def _require(self) -> tuple[bytes, str]:
        if self._key is None or self.session_id is None:
            raise DecryptionError("a sealed line came before session_init", code="decryption_failed")
        return self._key, self.session_id

    def decrypt_line(self, obj: dict[str, Any]) -> dict[str, Any]:
        """The plain line: the clear fields and the opened ones (a line without `encrypted` as it is)."""
        sealed = obj.get("encrypted")
        if not isinstance(sealed, dict):
            return obj
        key, sid = self._require()
        plain = open_sealed(key, line_aad(sid, int(obj.get("seq", 0)), str(obj.get("type", ""))), sealed)
        fields = json.loads(plain)
        out = {k: v for k, v in obj.items() if k != "encrypted"}
        out.update(fields)
        return out

    def seal_tool_result(self, call_id: str, payload: dict[str, Any]) -> dict[str, str]:
        """Seals `{"result": ..}` or `{"error": ..}` for `call_id`."""
        key, sid = self._require()
        return seal(key, tool_result_aad(sid, call_id), json.dumps(payload, separators=(",", ":")).encode())
