//! Checks shared by the runner's and the workspace's OpenAPI tests.

use std::collections::BTreeSet;

use serde_json::Value;

/// Gives every schema under `schema` without a type, a reference or a
/// composition the list of all types (utoipa's parser needs a `type`).
pub fn typed(schema: &mut Value) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    let keys = ["type", "$ref", "oneOf", "anyOf", "allOf", "enum", "const"];
    if !keys.iter().any(|k| obj.contains_key(*k)) {
        obj.insert(
            "type".into(),
            serde_json::json!(["object", "array", "string", "number", "boolean", "null"]),
        );
    }
    for (k, v) in obj.iter_mut() {
        match (k.as_str(), v) {
            ("properties", Value::Object(props)) => props.values_mut().for_each(typed),
            ("items" | "additionalProperties", v) => typed(v),
            ("oneOf" | "anyOf" | "allOf", Value::Array(all)) => all.iter_mut().for_each(typed),
            _ => {}
        }
    }
}

/// Backticked words of problem descriptions that name a field or a
/// parameter, not a code.
const FIELDS: &[&str] = &[
    "after",
    "before",
    "limit",
    "encrypted",
    "error",
    "errors",
    "result",
];

/// The backticked snake_case words of the problem responses' descriptions
/// but the fields and parameters they name: the codes the document says
/// its routes answer.
pub fn documented_codes(doc: &Value) -> BTreeSet<String> {
    let values = |v: &Value| -> Vec<Value> {
        v.as_object()
            .map(|o| o.values().cloned().collect())
            .unwrap_or_default()
    };
    let mut codes = BTreeSet::new();
    for item in values(&doc["paths"]) {
        for op in values(&item) {
            for resp in values(&op["responses"]) {
                if resp["content"].get("application/problem+json").is_none() {
                    continue;
                }
                let text = resp["description"].as_str().unwrap_or_default();
                for (i, word) in text.split('`').enumerate() {
                    let code_like = !word.is_empty()
                        && word
                            .chars()
                            .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit());
                    if i % 2 == 1 && code_like && !FIELDS.contains(&word) {
                        codes.insert(word.to_owned());
                    }
                }
            }
        }
    }
    codes
}
