//! Node's `crypto.webcrypto`, with no other library, agrees a key with the
//! runner's side and opens its lines; a tampered, a reordered and a
//! relabelled line, and a line under a wrong key, fail to open there too.
//! It verifies the identity key's `r || s` signatures, and no altered one.

use std::io::Write;
use std::process::{Command, Stdio};

use asbx_crypto::{IdentityKey, ServerSession};
use serde_json::{Value, json};

/// Node: make a P-256 key, print K, read `{init, sessionId, lines}`, and print
/// for each line the opened fields or `null` when it fails to open.
const NODE_CLIENT: &str = r#"
const { webcrypto } = require('node:crypto');
const subtle = webcrypto.subtle;
const b64 = (b) => Buffer.from(b).toString('base64url');
const unb64 = (s) => new Uint8Array(Buffer.from(s, 'base64url'));
(async () => {
  const pair = await subtle.generateKey({ name: 'ECDH', namedCurve: 'P-256' }, false, ['deriveBits']);
  const raw = new Uint8Array(await subtle.exportKey('raw', pair.publicKey));
  process.stdout.write(b64(raw) + '\n');
  let input = '';
  for await (const chunk of process.stdin) input += chunk;
  const { init, sessionId, lines, wrongKey } = JSON.parse(input);
  const server = await subtle.importKey('raw', unb64(init.serverPublicKey), { name: 'ECDH', namedCurve: 'P-256' }, false, []);
  const own = wrongKey
    ? (await subtle.generateKey({ name: 'ECDH', namedCurve: 'P-256' }, false, ['deriveBits'])).privateKey
    : pair.privateKey;
  const secret = await subtle.deriveBits({ name: 'ECDH', public: server }, own, 256);
  const ikm = await subtle.importKey('raw', secret, 'HKDF', false, ['deriveKey']);
  const key = await subtle.deriveKey(
    { name: 'HKDF', hash: 'SHA-256', salt: unb64(init.salt), info: new TextEncoder().encode('asbx-e2e-v1:' + sessionId) },
    ikm, { name: 'AES-GCM', length: 256 }, false, ['decrypt']);
  const out = [];
  for (const line of lines) {
    const aad = new TextEncoder().encode(line.sessionId + '.' + line.seq + '.' + line.type);
    try {
      const plain = await subtle.decrypt(
        { name: 'AES-GCM', iv: unb64(line.encrypted.iv), additionalData: aad },
        key, unb64(line.encrypted.ciphertext));
      out.push(JSON.parse(new TextDecoder().decode(plain)));
    } catch (e) {
      out.push(null);
    }
  }
  process.stdout.write(JSON.stringify(out) + '\n');
})();
"#;

fn node_available() -> bool {
    Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs the Node client against a fresh server session; what it opened.
fn node_opens(
    make_lines: impl FnOnce(&ServerSession) -> Vec<Value>,
    wrong_key: bool,
) -> Vec<Value> {
    let mut child = Command::new("node")
        .args(["-e", NODE_CLIENT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut k = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut k).unwrap();
    let server = ServerSession::new(k.trim(), "sess-1", &IdentityKey::generate()).unwrap();
    let input = json!({
        "init": server.init(),
        "sessionId": "sess-1",
        "lines": make_lines(&server),
        "wrongKey": wrong_key,
    });
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.to_string().as_bytes()).unwrap();
    drop(stdin);
    let mut out = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut out).unwrap();
    assert!(child.wait().unwrap().success());
    serde_json::from_str(&out).unwrap()
}

fn encrypted(server: &ServerSession, line: Value) -> Value {
    let enc = server.encrypt_line(line.to_string().as_bytes()).unwrap();
    serde_json::from_slice(&enc).unwrap()
}

#[test]
fn node_webcrypto_opens_what_the_runner_seals_and_nothing_altered() {
    if !node_available() {
        asbx_test_support::skip(
            "node_webcrypto_opens_what_the_runner_seals_and_nothing_altered",
            "node is not installed",
        );
        return;
    }
    let opened = node_opens(
        |s| {
            let delta = encrypted(
                s,
                json!({"seq": 2, "ts": 1, "sessionId": "sess-1", "type": "delta", "text": "héllo"}),
            );
            let result = encrypted(
                s,
                json!({"seq": 3, "ts": 2, "sessionId": "sess-1", "type": "result", "message": "done"}),
            );
            let mut reordered = result.clone();
            reordered["seq"] = 2.into();
            let mut relabelled = result.clone();
            relabelled["type"] = "error".into();
            let mut tampered = delta.clone();
            let ct = tampered["encrypted"]["ciphertext"]
                .as_str()
                .unwrap()
                .to_owned();
            let flipped = if ct.starts_with('A') { "B" } else { "A" };
            tampered["encrypted"]["ciphertext"] = format!("{flipped}{}", &ct[1..]).into();
            vec![delta, result, reordered, relabelled, tampered]
        },
        false,
    );
    assert_eq!(opened[0], json!({"text": "héllo"}));
    assert_eq!(opened[1], json!({"message": "done"}));
    assert_eq!(opened[2], Value::Null, "a reordered line opened");
    assert_eq!(opened[3], Value::Null, "a relabelled line opened");
    assert_eq!(opened[4], Value::Null, "a tampered line opened");

    let wrong = node_opens(
        |s| {
            vec![encrypted(
                s,
                json!({"seq": 2, "ts": 1, "sessionId": "sess-1", "type": "delta", "text": "x"}),
            )]
        },
        true,
    );
    assert_eq!(wrong, vec![Value::Null], "opened under a wrong key");
}

/// Node: read `{publicKey, message, signatures}`, print whether each verifies.
const NODE_VERIFY: &str = r#"
const { webcrypto } = require('node:crypto');
const subtle = webcrypto.subtle;
const unb64 = (s) => new Uint8Array(Buffer.from(s, 'base64url'));
(async () => {
  let input = '';
  for await (const chunk of process.stdin) input += chunk;
  const { publicKey, message, signatures } = JSON.parse(input);
  const key = await subtle.importKey('raw', unb64(publicKey), { name: 'ECDSA', namedCurve: 'P-256' }, false, ['verify']);
  const out = [];
  for (const sig of signatures) {
    out.push(await subtle.verify({ name: 'ECDSA', hash: 'SHA-256' }, key, unb64(sig), new TextEncoder().encode(message)));
  }
  process.stdout.write(JSON.stringify(out) + '\n');
})();
"#;

#[test]
fn node_webcrypto_verifies_the_identity_keys_signatures_and_no_altered_one() {
    if !node_available() {
        asbx_test_support::skip(
            "node_webcrypto_verifies_the_identity_keys_signatures_and_no_altered_one",
            "node is not installed",
        );
        return;
    }
    let identity = IdentityKey::generate();
    let message = asbx_crypto::signed_message("sess-1", "BServerKey", "c2FsdA");
    let good = identity.sign_init("sess-1", "BServerKey", "c2FsdA");
    let moved = identity.sign_init("sess-2", "BServerKey", "c2FsdA");
    let foreign = IdentityKey::generate().sign(message.as_bytes());
    let mut child = Command::new("node")
        .args(["-e", NODE_VERIFY])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let input = json!({
        "publicKey": identity.public_key(),
        "message": message,
        "signatures": [good, moved, foreign],
    });
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.to_string().as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let got: Vec<bool> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got, vec![true, false, false]);
}
