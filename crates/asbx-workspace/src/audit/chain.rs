//! The hash chain (CONTRACT §10): a record's `hash` is the SHA-256 (hex) of
//! the record without `hash`, serialized canonically (object keys sorted
//! by their UTF-8 bytes, no spaces); `prevHash` is the workspace's previous
//! record's `hash` (`""` for the first one ever).
//!
//! Why our own serializer: `serde_json`'s `preserve_order` feature is on in
//! this build (utoipa asks for it), so a `Map` keeps insertion order and
//! `to_string` would not sort.

use std::borrow::Cow;

use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};

/// `value` serialized with every object's keys sorted and no spaces.
pub(crate) fn canonical(value: &Value) -> String {
    let mut out = String::with_capacity(256);
    write(value, &mut out);
    out
}

fn write(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_unstable();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_scalar(&Value::String(key.clone()), out);
                out.push(':');
                if let Some(v) = map.get(key) {
                    write(v, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(item, out);
            }
            out.push(']');
        }
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {
            write_scalar(value, out);
        }
    }
}

fn write_scalar(value: &Value, out: &mut String) {
    // A scalar's serialization has no spaces and no keys to sort.
    out.push_str(&value.to_string());
}

/// The SHA-256 (hex) of `record`'s canonical form without its `hash`.
pub(crate) fn hash_of(record: &Map<String, Value>) -> String {
    let mut without = record.clone();
    without.remove("hash");
    hex::encode(Sha256::digest(
        canonical(&Value::Object(without)).as_bytes(),
    ))
}

/// Seals `record` (which must not have `hash`) after `prev_hash`: sets
/// `prevHash` and `hash`; the canonical text to store and the hash.
pub(crate) fn seal(mut record: Map<String, Value>, prev_hash: &str) -> (String, String) {
    record.insert("prevHash".to_owned(), Value::String(prev_hash.to_owned()));
    let hash = hash_of(&record);
    record.insert("hash".to_owned(), Value::String(hash.clone()));
    (canonical(&Value::Object(record)), hash)
}

/// Why a stored record breaks the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Broken {
    /// Not a JSON object, or missing a chain field.
    Unreadable,
    /// Its `id`, `workspace` or `runId` differ from the row's.
    Misfiled,
    /// Its `hash` is not the hash of its content.
    Hash,
    /// Its `prevHash` is not the previous record's `hash`.
    Link,
    /// The chain head's hash is not the last record's (records were taken
    /// off the end).
    Head,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Broken::Unreadable => "is not a readable record",
            Broken::Misfiled => "has an id, workspace or run other than its row's",
            Broken::Hash => "does not match its hash (edited)",
            Broken::Link => "does not follow the previous record (prevHash)",
            Broken::Head => "is not the chain's head (records were removed from the end)",
        })
    }
}

/// The fields [`check`] reads, borrowed from the text when it has no
/// escapes; the rest is skipped, not built.
#[derive(serde::Deserialize)]
struct Fields<'a> {
    id: i64,
    #[serde(borrow)]
    workspace: Cow<'a, str>,
    #[serde(rename = "prevHash", borrow)]
    prev_hash: Cow<'a, str>,
    #[serde(borrow)]
    hash: Cow<'a, str>,
}

/// Checks one stored record: its text parses, it names `id` and
/// `workspace`, its `prevHash` is `prev_hash` and its `hash` is right.
/// Returns its hash.
///
/// The stored text is canonical (written by [`seal`]), so the record
/// without `hash` is the text with its `"hash":"…"` member cut out: that
/// is hashed as it stands, without building the record or serializing it
/// again ([`hash_of_text`]). Any other text (not canonical, unusual
/// fields, a mismatch) gets the full check ([`check_parsed`]), so the
/// verdict is the same either way: a text whose cut-out form hashes to
/// its `hash` is, but for a SHA-256 collision, the text [`seal`] wrote.
pub(crate) fn check(
    text: &str,
    id: i64,
    workspace: &str,
    prev_hash: &str,
) -> Result<String, Broken> {
    let Ok(f) = serde_json::from_str::<Fields<'_>>(text) else {
        return check_parsed(text, id, workspace, prev_hash);
    };
    if f.id != id || f.workspace != workspace {
        return Err(Broken::Misfiled);
    }
    if !hash_of_text(text, &f.hash) {
        return check_parsed(text, id, workspace, prev_hash);
    }
    if f.prev_hash != prev_hash {
        return Err(Broken::Link);
    }
    Ok(f.hash.into_owned())
}

/// Whether the canonical `text` without its top-level `"hash":"{hash}"`
/// member hashes to `hash`, fed to SHA-256 in the two parts around it.
fn hash_of_text(text: &str, hash: &str) -> bool {
    const KEY: &str = "\"hash\":\"";
    if hash.len() != 64 {
        return false;
    }
    // The member and one comma beside it: `,"hash":"…"` after another
    // member, `"hash":"…",` when first.
    let member_len = KEY.len() + hash.len() + 1;
    let mut from = 0;
    while let Some(at) = text[from..].find(KEY).map(|i| i + from) {
        from = at + 1;
        let end = at + member_len;
        if text.get(at + KEY.len()..end - 1) != Some(hash) || text.get(end - 1..end) != Some("\"") {
            continue;
        }
        let (cut_from, cut_to) = match (text.get(at - 1..at), text.get(end..=end)) {
            (Some(","), _) => (at - 1, end),
            (Some("{"), Some(",")) => (at, end + 1),
            (Some("{"), Some("}")) => (at, end),
            _ => continue,
        };
        let mut sha = Sha256::new();
        sha.update(&text.as_bytes()[..cut_from]);
        sha.update(&text.as_bytes()[cut_to..]);
        let mut hex = [0u8; 64];
        if hex::encode_to_slice(sha.finalize(), &mut hex).is_err() {
            return false;
        }
        return hex.as_slice() == hash.as_bytes();
    }
    false
}

/// [`check`] the long way: the record parsed and serialized canonically
/// without its `hash`.
fn check_parsed(text: &str, id: i64, workspace: &str, prev_hash: &str) -> Result<String, Broken> {
    let Ok(Value::Object(record)) = serde_json::from_str::<Value>(text) else {
        return Err(Broken::Unreadable);
    };
    let field = |k: &str| record.get(k);
    let Some(Value::String(hash)) = field("hash") else {
        return Err(Broken::Unreadable);
    };
    if field("id").and_then(Value::as_i64) != Some(id)
        || field("workspace").and_then(Value::as_str) != Some(workspace)
    {
        return Err(Broken::Misfiled);
    }
    if hash_of(&record) != *hash {
        return Err(Broken::Hash);
    }
    if field("prevHash").and_then(Value::as_str) != Some(prev_hash) {
        return Err(Broken::Link);
    }
    Ok(hash.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: i64) -> Map<String, Value> {
        let Value::Object(m) = serde_json::json!({"z": 1, "id": id, "workspace": "w", "kind": "x", "a": {"y": [1, {"b": 2, "a": 1}]}})
        else {
            unreachable!()
        };
        m
    }

    #[test]
    fn canonical_sorts_keys_at_every_depth() {
        let text = canonical(&Value::Object(record(1)));
        assert_eq!(
            text,
            r#"{"a":{"y":[1,{"a":1,"b":2}]},"id":1,"kind":"x","workspace":"w","z":1}"#
        );
    }

    #[test]
    fn a_chain_checks_and_an_edit_or_a_gap_breaks_it() {
        let (t1, h1) = seal(record(1), "");
        let (t2, h2) = seal(record(2), &h1);
        assert_eq!(check(&t1, 1, "w", ""), Ok(h1.clone()));
        assert_eq!(check(&t2, 2, "w", &h1), Ok(h2));
        assert_eq!(check(&t2, 2, "w", ""), Err(Broken::Link));
        assert_eq!(
            check(&t2.replace("\"z\":1", "\"z\":2"), 2, "w", &h1),
            Err(Broken::Hash)
        );
        assert_eq!(check(&t1, 1, "v", ""), Err(Broken::Misfiled));
        assert_eq!(check("nope", 1, "w", ""), Err(Broken::Unreadable));
    }

    #[test]
    fn the_text_fast_path_agrees_with_the_parsed_check() {
        let (t1, h1) = seal(record(1), "");
        let (t2, h2) = seal(record(2), &h1);
        for (text, id, prev) in [(&t1, 1, ""), (&t2, 2, h1.as_str())] {
            let fields: Fields<'_> = serde_json::from_str(text).unwrap();
            assert!(hash_of_text(text, &fields.hash), "{text}");
            assert_eq!(
                check(text, id, "w", prev),
                check_parsed(text, id, "w", prev)
            );
        }
        // The same record with its keys in another order is not the text
        // `seal` wrote, yet the same record: the long way says so.
        let text = t2
            .replacen(",\"z\":1}", "}", 1)
            .replacen("{\"a\"", "{\"z\":1,\"a\"", 1);
        assert_ne!(text, t2);
        assert_eq!(check(&text, 2, "w", &h1), Ok(h2.clone()));
        // A `hash` member inside a nested object is not the record's.
        let nested = t2.replacen("\"y\":[", &format!("\"y\":[{{\"hash\":\"{h2}\"}},"), 1);
        assert_eq!(check(&nested, 2, "w", &h1), Err(Broken::Hash));
        // Edits, links and ids are caught the fast way as the long way.
        let edited = t2.replace("\"z\":1", "\"z\":2");
        assert_eq!(check(&edited, 2, "w", &h1), Err(Broken::Hash));
        assert_eq!(check(&t2, 2, "w", "x"), Err(Broken::Link));
        assert_eq!(check(&t2, 3, "w", &h1), Err(Broken::Misfiled));
        // An escape the record did not have reads the same the long way.
        let escaped = t2.replace("\"workspace\":\"w\"", "\"workspace\":\"\\u0077\"");
        assert_eq!(check(&escaped, 2, "w", &h1), Ok(h2));
    }
}
