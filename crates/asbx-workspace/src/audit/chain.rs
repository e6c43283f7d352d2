//! The hash chain (CONTRACT §10): a record's `hash` is the SHA-256 (hex) of
//! the record without `hash`, serialized canonically (object keys sorted
//! by their UTF-8 bytes, no spaces); `prevHash` is the workspace's previous
//! record's `hash` (`""` for the first one ever).
//!
//! Why our own serializer: `serde_json`'s `preserve_order` feature is on in
//! this build (utoipa asks for it), so a `Map` keeps insertion order and
//! `to_string` would not sort.

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

/// Checks one stored record: its text parses, it names `id` and
/// `workspace`, its `prevHash` is `prev_hash` and its `hash` is right.
/// Returns its hash.
pub(crate) fn check(
    text: &str,
    id: i64,
    workspace: &str,
    prev_hash: &str,
) -> Result<String, Broken> {
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
}
