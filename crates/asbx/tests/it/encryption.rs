//! End-to-end encryption through the real runner and jail (docs/protocol.md
//! §4): Node's `crypto.webcrypto`, with no other library, opens every line of
//! an encrypted run, and refuses a tampered line, a reordered line and every
//! line under a wrong key; the stream holds no plaintext past `session_init`;
//! a resumed read gives the same sealed bytes; an encrypted client-tool
//! result is opened with the session key and a bad one is refused; the
//! session listing keeps how an encrypted session ended, not its words.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use asbx_crypto::ClientSession;
use futures::StreamExt;
use serde_json::{Map, Value, json};

use crate::harness::*;

/// Node: make a P-256 key, print K, read `{init, sessionId, lines}`, and print
/// `{opened, wrong}`: for each line its opened fields (or `null` when it does
/// not open) under the agreed key, and under a fresh, wrong key.
const NODE_CLIENT: &str = r#"
const { webcrypto } = require('node:crypto');
const subtle = webcrypto.subtle;
const unb64 = (s) => new Uint8Array(Buffer.from(s, 'base64url'));
const curve = { name: 'ECDH', namedCurve: 'P-256' };
(async () => {
  const pair = await subtle.generateKey(curve, false, ['deriveBits']);
  const raw = new Uint8Array(await subtle.exportKey('raw', pair.publicKey));
  process.stdout.write(Buffer.from(raw).toString('base64url') + '\n');
  let input = '';
  for await (const chunk of process.stdin) input += chunk;
  const { init, sessionId, lines } = JSON.parse(input);
  const server = await subtle.importKey('raw', unb64(init.serverPublicKey), curve, false, []);
  const keyOf = async (own) => {
    const secret = await subtle.deriveBits({ name: 'ECDH', public: server }, own, 256);
    const ikm = await subtle.importKey('raw', secret, 'HKDF', false, ['deriveKey']);
    return subtle.deriveKey(
      { name: 'HKDF', hash: 'SHA-256', salt: unb64(init.salt),
        info: new TextEncoder().encode('asbx-e2e-v1:' + sessionId) },
      ikm, { name: 'AES-GCM', length: 256 }, false, ['decrypt']);
  };
  const open = async (key) => {
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
    return out;
  };
  const other = await subtle.generateKey(curve, false, ['deriveBits']);
  const opened = await open(await keyOf(pair.privateKey));
  const wrong = await open(await keyOf(other.privateKey));
  process.stdout.write(JSON.stringify({ opened, wrong }) + '\n');
})();
"#;

fn node_available() -> bool {
    Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn v2(mut body: Value, extra: Value) -> Value {
    body["protocol"] = json!(2);
    if let Some(obj) = extra.as_object() {
        for (k, v) in obj {
            body[k] = v.clone();
        }
    }
    body
}

/// The raw lines of an NDJSON body.
fn raw_lines(bytes: &[u8]) -> Vec<Map<String, Value>> {
    bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect()
}

/// Every line after `session_init` shows only the clear fields and `encrypted`.
fn assert_sealed(lines: &[Map<String, Value>]) {
    assert_eq!(lines[0]["type"], "session_init");
    assert!(lines[0].get("encrypted").is_none());
    for l in &lines[1..] {
        let mut keys: Vec<&str> = l.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            vec!["encrypted", "seq", "sessionId", "ts", "type"],
            "{l:?}"
        );
    }
}

#[tokio::test]
async fn an_encrypted_run_opens_in_node_webcrypto_alone_and_an_altered_line_does_not() {
    if !node_available() {
        asbx_test_support::skip(
            "an_encrypted_run_opens_in_node_webcrypto_alone_and_an_altered_line_does_not",
            "node is not installed",
        );
        return;
    }
    let mut node = Command::new("node")
        .args(["-e", NODE_CLIENT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut node_out = BufReader::new(node.stdout.take().unwrap());
    let mut k = String::new();
    node_out.read_line(&mut k).unwrap();

    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("e2e"));
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "echo tool-plaintext-marker"}},
        {"say": "the answer is plaintext-marker-42", "stream_ms": 1}
    ]));
    let body = v2(
        ws.body(&t, &prompt),
        json!({"encryption": {"client_public_key": k.trim()}}),
    );
    let res = post_stream(&runner.url, &body).await;
    assert_eq!(res.status(), 200);
    let streamed = tokio::time::timeout(Duration::from_secs(60), res.bytes())
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&streamed);
    assert!(
        !text.contains("plaintext-marker") && !text.contains("echo "),
        "plaintext on the wire: {text}"
    );
    let lines = raw_lines(&streamed);
    assert_sealed(&lines);
    let init = &lines[0]["encryption"];
    assert_eq!(init["algorithm"], "ECDH-P256+HKDF-SHA256+AES-256-GCM");
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["seq"], i as u64 + 1);
    }

    // Resume: the log replays the very same sealed bytes.
    let replay = reqwest::get(format!(
        "{}/v1/sessions/{}/events?after=0",
        runner.url, t.session
    ))
    .await
    .unwrap()
    .bytes()
    .await
    .unwrap();
    assert_eq!(
        replay, streamed,
        "a resumed read gives the sealed bytes sent"
    );
    let replay_tail = reqwest::get(format!(
        "{}/v1/sessions/{}/events?after=3",
        runner.url, t.session
    ))
    .await
    .unwrap()
    .bytes()
    .await
    .unwrap();
    assert!(streamed.ends_with(&replay_tail) && replay_tail.len() < streamed.len());
    // The session's listing says how it ended, not what it said.
    let info: Value = reqwest::get(format!("{}/v1/sessions/{}", runner.url, t.session))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["termination"]["reason"], "completed");
    assert!(info["termination"].get("stderr").is_none(), "{info}");
    assert!(!info.to_string().contains("plaintext-marker"), "{info}");

    // Node opens every sealed line; then the altered copies, appended.
    let sealed: Vec<Value> = lines[1..].iter().cloned().map(Value::Object).collect();
    let n = sealed.len();
    let result_at = n - 2;
    let mut tampered = sealed[result_at].clone();
    let ct = tampered["encrypted"]["ciphertext"]
        .as_str()
        .unwrap()
        .to_owned();
    let mid = ct.len() / 2;
    let flipped = if &ct[mid..=mid] == "A" { "B" } else { "A" };
    tampered["encrypted"]["ciphertext"] =
        format!("{}{flipped}{}", &ct[..mid], &ct[mid + 1..]).into();
    // Reordered: the result's sealed body under the previous line's seq.
    let mut reordered = sealed[result_at].clone();
    reordered["seq"] = sealed[result_at - 1]["seq"].clone();
    // Relabelled: the same bytes claimed as another type.
    let mut relabelled = sealed[result_at].clone();
    relabelled["type"] = "error".into();
    let mut all = sealed.clone();
    all.extend([tampered, reordered, relabelled]);
    let input = json!({"init": init, "sessionId": t.session, "lines": all});
    let mut stdin = node.stdin.take().unwrap();
    stdin.write_all(input.to_string().as_bytes()).unwrap();
    drop(stdin);
    let mut out = String::new();
    node_out.read_line(&mut out).unwrap();
    assert!(node.wait().unwrap().success());
    let out: Value = serde_json::from_str(&out).unwrap();
    let opened = out["opened"].as_array().unwrap();
    let wrong = out["wrong"].as_array().unwrap();

    assert!(
        opened[..n].iter().all(|o| o.is_object()),
        "every sealed line opens in Node: {opened:?}"
    );
    let types: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l["type"].as_str().unwrap())
        .collect();
    let texts: String = types
        .iter()
        .zip(opened)
        .filter(|(t, _)| **t == "delta")
        .map(|(_, o)| o["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, "the answer is plaintext-marker-42");
    assert_eq!(types[result_at], "result");
    assert_eq!(
        opened[result_at]["message"],
        "the answer is plaintext-marker-42"
    );
    let out_chunks: String = types
        .iter()
        .zip(opened)
        .filter(|(t, _)| **t == "stdout")
        .map(|(_, o)| o["chunk"].as_str().unwrap())
        .collect();
    assert!(out_chunks.contains("tool-plaintext-marker"), "{out_chunks}");
    assert_eq!(types[n - 1], "session_ended");
    assert_eq!(opened[n - 1]["reason"], "completed");
    assert_eq!(opened[n - 1]["stats"]["steps"], 2);
    assert_eq!(opened[n - 1]["stats"]["toolCalls"], 1);

    assert_eq!(opened[n], Value::Null, "a tampered line opened");
    assert_eq!(opened[n + 1], Value::Null, "a reordered line opened");
    assert_eq!(opened[n + 2], Value::Null, "a relabelled line opened");
    assert!(
        wrong.iter().all(Value::is_null),
        "a line opened under a wrong key: {wrong:?}"
    );
    runner.assert_clean().await;
}

#[tokio::test]
async fn a_key_that_is_not_a_point_is_refused_before_any_sandbox() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("badkey"));
    // The right shape (87 base64url characters, 0x04 first), not on P-256.
    let mut k = vec![4u8];
    k.extend([7u8; 64]);
    use base64::Engine;
    let k = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(k);
    let body = v2(
        ws.body(&t, &script(json!([{"say": "never"}]))),
        json!({"encryption": {"client_public_key": k}}),
    );
    let (status, _, err) = dispatch(&runner.url, &body).await;
    assert_eq!(status, 400, "{err}");
    let p: Value = serde_json::from_str(&err).unwrap();
    assert_eq!(p["code"], "invalid_request");
    assert_eq!(p["errors"][0]["field"], "encryption.client_public_key");
    // Positive control: a real point starts a session.
    let t = ws.mint(&session_id("goodkey"));
    let client = ClientSession::new();
    let body = v2(
        ws.body(&t, &script(json!([{"say": "fine"}]))),
        json!({"encryption": {"client_public_key": client.public_key()}}),
    );
    let res = post_stream(&runner.url, &body).await;
    assert_eq!(res.status(), 200);
    let _ = res.bytes().await.unwrap();
    runner.assert_clean().await;
}

#[tokio::test]
async fn an_encrypted_client_tool_result_is_opened_with_the_session_key() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("e2e-tool"));
    let prompt = script(json!([
        {"tool": "pick_color", "args": {"palette": "warm"}},
        {"say": "picked"}
    ]));
    let tools = json!([{
        "name": "pick_color",
        "description": "Ask the user for a color",
        "parameters": {"type": "object", "properties": {"palette": {"type": "string"}}}
    }]);
    let mut client = ClientSession::new();
    let body = v2(
        ws.body(&t, &prompt),
        json!({"client_tools": tools, "encryption": {"client_public_key": client.public_key()}}),
    );
    let res = post_stream(&runner.url, &body).await;
    let mut stream = Box::pin(res.bytes_stream());
    let mut buf = Vec::new();
    let mut plain: Vec<Map<String, Value>> = Vec::new();
    let mut answered = false;
    let url = format!("{}/v1/sessions/{}/tool-result", runner.url, t.session);
    let http = reqwest::Client::new();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(60), stream.next())
        .await
        .unwrap()
    {
        buf.extend_from_slice(&chunk.unwrap());
        while let Some(i) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            let line = &line[..line.len() - 1];
            let raw: Map<String, Value> = serde_json::from_slice(line).unwrap();
            if raw["type"] == "session_init" {
                let init = serde_json::from_value(raw["encryption"].clone()).unwrap();
                client.agree(&init, &t.session).unwrap();
                plain.push(raw);
                continue;
            }
            assert!(raw.contains_key("encrypted"), "{raw:?}");
            let l = client.decrypt_line(line).unwrap();
            if l["type"] == "tool_call" {
                let call_id = l["callId"].as_str().unwrap().to_owned();
                assert_eq!(l["args"], json!({"palette": "warm"}));
                // Plaintext to an encrypted session: refused.
                let r = http
                    .post(&url)
                    .json(&json!({"callId": call_id, "result": {"color": "forged"}}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 400);
                // Sealed for another call (moved): does not open.
                let moved = client
                    .seal_tool_result("another-call", br#"{"result":{"color":"moved"}}"#)
                    .unwrap();
                let r = http
                    .post(&url)
                    .json(&json!({"callId": call_id, "encrypted": moved}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 400);
                let p: Value = r.json().await.unwrap();
                assert_eq!(p["code"], "decryption_failed");
                // Under a wrong key: does not open either.
                let mut stranger = ClientSession::new();
                let init = serde_json::from_value(plain[0]["encryption"].clone()).unwrap();
                stranger.agree(&init, &t.session).unwrap();
                let foreign = stranger
                    .seal_tool_result(&call_id, br#"{"result":{"color":"foreign"}}"#)
                    .unwrap();
                let r = http
                    .post(&url)
                    .json(&json!({"callId": call_id, "encrypted": foreign}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 400);
                // The real answer.
                let sealed = client
                    .seal_tool_result(&call_id, br#"{"result":{"color":"amber"}}"#)
                    .unwrap();
                let r = http
                    .post(&url)
                    .json(&json!({"callId": call_id, "encrypted": sealed}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
                let again = client
                    .seal_tool_result(&call_id, br#"{"result":{"color":"red"}}"#)
                    .unwrap();
                let r = http
                    .post(&url)
                    .json(&json!({"callId": call_id, "encrypted": again}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 409);
                answered = true;
            }
            plain.push(l);
        }
    }
    assert!(answered, "a tool_call line came: {plain:?}");
    let types: Vec<&str> = plain.iter().map(|l| l["type"].as_str().unwrap()).collect();
    let applied = types.iter().position(|t| *t == "tool_result_applied");
    let result = types.iter().position(|t| *t == "result");
    assert!(applied.is_some() && applied < result, "{types:?}");
    let ended = plain.last().unwrap();
    assert_eq!(ended["type"], "session_ended");
    assert_eq!(
        ended["stats"]["toolCalls"], 1,
        "a client tool is a tool call"
    );
    runner.assert_clean().await;
}

#[tokio::test]
async fn an_encrypted_sessions_listing_keeps_how_it_ended_but_not_its_words() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let info = |id: String| {
        let url = format!("{}/v1/sessions/{id}", runner.url);
        async move {
            reqwest::get(url)
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    // Control: a clear session that crashes lists its message and stderr.
    let t = ws.mint(&session_id("clear-crash"));
    let body = v2(ws.body(&t, &script(json!([{"crash": 3}]))), json!({}));
    let _ = dispatch(&runner.url, &body).await;
    let clear = info(t.session.clone()).await;
    assert!(
        clear["termination"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("scripted crash")),
        "{clear}"
    );
    assert!(clear["termination"]["stderr"].is_object(), "{clear}");

    let t = ws.mint(&session_id("sealed-crash"));
    let mut client = ClientSession::new();
    let body = v2(
        ws.body(&t, &script(json!([{"crash": 3}]))),
        json!({"encryption": {"client_public_key": client.public_key()}}),
    );
    let res = post_stream(&runner.url, &body).await;
    let bytes = res.bytes().await.unwrap();
    assert!(!String::from_utf8_lossy(&bytes).contains("scripted crash"));
    let lines = raw_lines(&bytes);
    assert_sealed(&lines);
    let init = serde_json::from_value(lines[0]["encryption"].clone()).unwrap();
    client.agree(&init, &t.session).unwrap();
    let last = serde_json::to_vec(lines.last().unwrap()).unwrap();
    let ended = client.decrypt_line(&last).unwrap();
    assert_eq!(ended["type"], "session_ended");
    assert!(
        ended["message"]
            .as_str()
            .is_some_and(|m| m.contains("scripted crash")),
        "the client reads why: {ended:?}"
    );
    let sealed = info(t.session.clone()).await;
    assert_eq!(sealed["termination"]["reason"], "error");
    assert_eq!(sealed["termination"]["exitCode"], 3);
    assert!(sealed["termination"].get("message").is_none(), "{sealed}");
    assert!(sealed["termination"].get("stderr").is_none(), "{sealed}");
    runner.assert_clean().await;
}

/// Node: read `{init, sessionId, identityKey, cases}` and print, for each
/// case (`init` fields to replace, and the key to verify under), whether
/// WebCrypto's ECDSA P-256 SHA-256 verifies the signature of
/// `"asbx-e2e-v1-sig:" + sessionId + "." + serverPublicKey + "." + salt`.
const NODE_VERIFY: &str = r#"
const { webcrypto } = require('node:crypto');
const subtle = webcrypto.subtle;
const unb64 = (s) => new Uint8Array(Buffer.from(s, 'base64url'));
(async () => {
  let input = '';
  for await (const chunk of process.stdin) input += chunk;
  const { init, sessionId, cases } = JSON.parse(input);
  const out = [];
  for (const c of cases) {
    const e = { ...init, ...c.replace };
    const key = await subtle.importKey('raw', unb64(c.key), { name: 'ECDSA', namedCurve: 'P-256' }, false, ['verify']);
    const msg = new TextEncoder().encode('asbx-e2e-v1-sig:' + sessionId + '.' + e.serverPublicKey + '.' + e.salt);
    out.push(await subtle.verify({ name: 'ECDSA', hash: 'SHA-256' }, key, unb64(e.signature), msg));
  }
  process.stdout.write(JSON.stringify(out) + '\n');
})();
"#;

/// What Node's WebCrypto says of each case.
fn node_verifies(input: &Value) -> Vec<bool> {
    let mut node = Command::new("node")
        .args(["-e", NODE_VERIFY])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = node.stdin.take().unwrap();
    stdin.write_all(input.to_string().as_bytes()).unwrap();
    drop(stdin);
    let out = node.wait_with_output().unwrap();
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn node_webcrypto_verifies_the_runners_signature_with_the_key_from_v1_identity() {
    if !node_available() {
        asbx_test_support::skip(
            "node_webcrypto_verifies_the_runners_signature_with_the_key_from_v1_identity",
            "node is not installed",
        );
        return;
    }
    let runner = RunnerProc::start(&[]);
    let identity: Value = reqwest::get(format!("{}/v1/identity", runner.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(identity["algorithm"], "ECDSA-P256-SHA256");
    let pinned = identity["publicKey"].as_str().unwrap().to_owned();
    let kept = std::fs::read_to_string(runner.data.path().join("runner/identity.pub")).unwrap();
    assert_eq!(kept.trim(), pinned, "the key kept in the data folder");

    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("signed"));
    let client = ClientSession::new();
    let body = v2(
        ws.body(&t, &script(json!([{"say": "signed"}]))),
        json!({"encryption": {"client_public_key": client.public_key()}}),
    );
    let res = post_stream(&runner.url, &body).await;
    assert_eq!(res.status(), 200);
    let lines = raw_lines(&res.bytes().await.unwrap());
    let init = lines[0]["encryption"].clone();
    assert_eq!(init["identityKey"], pinned.as_str());

    // A relay's substitutes: its own ephemeral key, its own salt, and a
    // signature it made with an identity of its own.
    let relay = asbx_crypto::IdentityKey::generate();
    let relay_key = ClientSession::new().public_key();
    let relay_salt = "c3Vic3RpdHV0ZWQtc2FsdC1vZi10aGlydHktdHdvLWI";
    let relay_sig = relay.sign_init(&t.session, &relay_key, relay_salt);
    let cases = json!([
        {"replace": {}, "key": pinned},
        {"replace": {"serverPublicKey": relay_key}, "key": pinned},
        {"replace": {"salt": relay_salt}, "key": pinned},
        {"replace": {"serverPublicKey": relay_key, "salt": relay_salt, "signature": relay_sig}, "key": pinned},
        // Positive control of the forgery: it verifies under the relay's key.
        {"replace": {"serverPublicKey": relay_key, "salt": relay_salt, "signature": relay_sig}, "key": relay.public_key()},
    ]);
    let got = node_verifies(&json!({"init": init, "sessionId": t.session, "cases": cases}));
    assert_eq!(got, vec![true, false, false, false, true]);
    // The Rust client agrees, and so does a moved session id.
    let init: asbx_crypto::EncryptionInit = serde_json::from_value(init).unwrap();
    asbx_crypto::verify_init(&init, &t.session, Some(&pinned)).unwrap();
    assert!(asbx_crypto::verify_init(&init, "another-session", Some(&pinned)).is_err());
    runner.assert_clean().await;
}
