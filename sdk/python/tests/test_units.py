"""Pieces that need no workspace: the crypto against a server side written
here from docs/protocol.md §4, SSE framing, problem+json mapping."""

from __future__ import annotations

import json
import os

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

import asbx
from asbx import _crypto
from asbx._core import SseDecoder, StreamState


def sign_raw(identity: ec.EllipticCurvePrivateKey, message: bytes) -> str:
    """The runner's signature: ECDSA P-256 SHA-256 as the 64 bytes `r || s`, base64url."""
    r, s = decode_dss_signature(identity.sign(message, ec.ECDSA(hashes.SHA256())))
    return _crypto.b64(r.to_bytes(32, "big") + s.to_bytes(32, "big"))


class Server:
    """The runner's side: its key S, salt T, and lines sealed as `asbx-crypto` seals them;
    with an `identity`, `session_init.encryption` is signed as docs/protocol.md §4 says."""

    def __init__(
        self, client_public_key: str, session_id: str, identity: ec.EllipticCurvePrivateKey | None = None
    ) -> None:
        self.session_id = session_id
        private = ec.generate_private_key(ec.SECP256R1())
        salt = os.urandom(32)
        peer = _crypto.parse_public_key(client_public_key)
        self.key = _crypto.derive_key(private, peer, salt, session_id)
        self.init = {
            "algorithm": _crypto.ALGORITHM,
            "serverPublicKey": _crypto.encode_public_key(private.public_key()),
            "salt": _crypto.b64(salt),
        }
        if identity is not None:
            self.init["identityKey"] = _crypto.encode_public_key(identity.public_key())
            self.init["signature"] = sign_raw(
                identity,
                _crypto.signed_message(session_id, self.init["serverPublicKey"], self.init["salt"]),
            )

    def encrypt_line(self, line: dict) -> dict:
        clear = {k: v for k, v in line.items() if k in _crypto.CLEAR_FIELDS}
        rest = {k: v for k, v in line.items() if k not in _crypto.CLEAR_FIELDS}
        aad = _crypto.line_aad(self.session_id, line["seq"], line["type"])
        clear["encrypted"] = _crypto.seal(self.key, aad, json.dumps(rest).encode())
        return clear


def pair(session_id: str = "s1") -> tuple[Server, asbx.ClientSession]:
    client = asbx.ClientSession()
    server = Server(client.public_key, session_id)
    client.agree(server.init, session_id)
    return server, client


def test_the_public_key_is_an_unpadded_65_byte_uncompressed_point() -> None:
    k = asbx.ClientSession().public_key
    assert "=" not in k and len(k) == 87
    raw = _crypto.unb64(k, "key")
    assert len(raw) == 65 and raw[0] == 4
    with pytest.raises(asbx.DecryptionError):
        _crypto.parse_public_key(_crypto.b64(b"\x04" + b"\x00" * 64))


def test_a_line_round_trips_and_keeps_its_clear_fields() -> None:
    server, client = pair()
    line = {"seq": 3, "ts": 5, "sessionId": "s1", "type": "delta", "text": "secret words"}
    enc = server.encrypt_line(line)
    assert "secret words" not in json.dumps(enc)
    assert sorted(enc) == ["encrypted", "seq", "sessionId", "ts", "type"]
    assert client.decrypt_line(enc) == line


@pytest.mark.parametrize("change", ["seq", "type", "ciphertext", "key"])
def test_moved_relabelled_tampered_or_foreign_lines_fail_to_open(change: str) -> None:
    server, client = pair()
    enc = server.encrypt_line({"seq": 4, "ts": 1, "sessionId": "s1", "type": "result", "message": "m"})
    assert client.decrypt_line(enc)["message"] == "m"  # positive control
    if change == "seq":
        enc["seq"] = 5
    elif change == "type":
        enc["type"] = "error"
    elif change == "ciphertext":
        ct = bytearray(_crypto.unb64(enc["encrypted"]["ciphertext"], "ct"))
        ct[0] ^= 1
        enc["encrypted"]["ciphertext"] = _crypto.b64(bytes(ct))
    else:
        _, client = pair()
    with pytest.raises(asbx.DecryptionError):
        client.decrypt_line(enc)


def test_a_tool_result_is_sealed_to_its_call() -> None:
    server, client = pair("s9")
    sealed = client.seal_tool_result("c1", {"result": 42})
    aad = _crypto.tool_result_aad("s9", "c1")
    assert json.loads(_crypto.open_sealed(server.key, aad, sealed)) == {"result": 42}
    with pytest.raises(asbx.DecryptionError):
        _crypto.open_sealed(server.key, _crypto.tool_result_aad("s9", "c2"), sealed)


def test_a_pinned_runner_key_accepts_its_signature_and_refuses_substitutes() -> None:
    runner = ec.generate_private_key(ec.SECP256R1())
    pin = _crypto.encode_public_key(runner.public_key())
    client = asbx.ClientSession(runner_public_key=pin)
    server = Server(client.public_key, "s1", identity=runner)
    client.agree(server.init, "s1")  # positive control
    assert client.agreed
    # A relay's own ephemeral key in place of the runner's.
    relay = Server(client.public_key, "s1")
    substituted = {**server.init, "serverPublicKey": relay.init["serverPublicKey"]}
    with pytest.raises(asbx.SignatureError) as e:
        asbx.ClientSession(runner_public_key=pin).agree(substituted, "s1")
    assert e.value.code == "signature_invalid"
    # A relay that re-signs with a key of its own, naming it as identityKey.
    forger = ec.generate_private_key(ec.SECP256R1())
    forged = Server(client.public_key, "s1", identity=forger).init
    asbx.ClientSession().agree(forged, "s1")  # unpinned, it is self-consistent
    with pytest.raises(asbx.SignatureError):
        asbx.ClientSession(runner_public_key=pin).agree(forged, "s1")
    # Moved to another session, or unsigned, under a pin.
    with pytest.raises(asbx.SignatureError):
        asbx.ClientSession(runner_public_key=pin).agree(server.init, "s2")
    unsigned = {k: v for k, v in server.init.items() if k != "signature"}
    with pytest.raises(asbx.SignatureError):
        asbx.ClientSession(runner_public_key=pin).agree(unsigned, "s1")


def test_sse_frames_ids_comments_and_multiline_data() -> None:
    dec = SseDecoder()
    text = (
        ': heartbeat\n\nid: 7\nevent: delta\ndata: {"seq":7,\ndata: "text":"hi"}\n\nevent: done\ndata: {}\n\n'
    )
    frames = [f for f in (dec.feed(line) for line in text.split("\n")) if f]
    assert frames == [("delta", '{"seq":7,\n"text":"hi"}', "7"), ("done", "{}", None)]
    st = StreamState()
    evs = [st.accept_sse(f) for f in frames]
    assert isinstance(evs[0], asbx.Delta) and evs[0].text == "hi" and evs[0].seq == 7
    assert isinstance(evs[1], asbx.Done) and st.done
    assert st.accept_sse(frames[0]) is None, "a replayed seq is skipped"


def test_unknown_types_arrive_as_unknown_events() -> None:
    ev = StreamState().accept_ndjson('{"seq":1,"ts":1,"sessionId":"s","type":"future_thing","x":1}')
    assert isinstance(ev, asbx.UnknownEvent) and ev.raw["x"] == 1


def test_problem_json_maps_to_subclasses() -> None:
    body = json.dumps(
        {
            "code": "invalid_request",
            "status": 400,
            "detail": "bad",
            "errors": [{"field": "f", "message": "m"}],
        }
    ).encode()
    e = asbx.AsbxError.from_problem(400, body)
    assert isinstance(e, asbx.BadRequestError) and e.errors == [asbx.FieldError("f", "m")]
    e = asbx.AsbxError.from_problem(409, b'{"code":"turn_in_flight","detail":"busy"}')
    assert isinstance(e, asbx.TurnInFlightError) and isinstance(e, asbx.ConflictError)
    e = asbx.AsbxError.from_problem(502, b"<html>bad gateway</html>")
    assert isinstance(e, asbx.ServerError) and e.code == "http_error" and "bad gateway" in e.detail
