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

/// The `(method, path)` of every operation of `doc`, sorted.
pub fn operations(doc: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().into_iter().flatten() {
        for method in item.as_object().into_iter().flatten().map(|(m, _)| m) {
            out.push((method.clone(), path.clone()));
        }
    }
    out.sort();
    out
}

/// Checks that `doc` is OpenAPI 3.1 and self-contained: every reference
/// names a schema it defines, the protocol's schemas are there as schemars
/// wrote them (no type of a service took one's name), and no stand-in (a
/// schema that only refers to itself) is left. Returns a copy whose untyped
/// schemas have a type list ([`typed`]), for parsers that need one.
pub fn assert_self_contained(doc: &Value) -> Value {
    assert_eq!(doc["openapi"], "3.1.0");
    let text = doc.to_string();
    let Some(schemas) = doc["components"]["schemas"].as_object() else {
        panic!("the document has no components.schemas");
    };
    for name in text.split("#/components/schemas/").skip(1) {
        let name = name.split('"').next().unwrap_or_default();
        assert!(
            schemas.contains_key(name),
            "{name} is referenced, not defined"
        );
    }
    let protocol = match asbx_protocol::schema::components() {
        Ok(p) => p,
        Err(e) => panic!("the protocol's schemas: {e}"),
    };
    for (name, schema) in schemas {
        if let Some(want) = protocol.get(name) {
            assert_eq!(schema, want, "{name}: two types share the name");
        }
        assert!(
            schema.get("$ref").is_none(),
            "{name} is only a reference to itself"
        );
    }
    let mut readable = doc.clone();
    if let Some(all) = readable["components"]["schemas"].as_object_mut() {
        all.values_mut().for_each(typed);
    }
    readable
}

/// Every operation but the public ones (`public(path, method)`) names the
/// bearer and documents its `401`.
pub fn assert_bearer_documented(doc: &Value, public: impl Fn(&str, &str) -> bool) {
    let Some(paths) = doc["paths"].as_object() else {
        panic!("the document has no paths");
    };
    for (path, item) in paths {
        let Some(ops) = item.as_object() else {
            continue;
        };
        for (method, op) in ops {
            let public = public(path, method);
            assert_eq!(
                op.get("security").is_none(),
                public,
                "{method} {path}: security"
            );
            if !public {
                assert!(
                    op["responses"].get("401").is_some(),
                    "{method} {path}: no 401"
                );
            }
        }
    }
}

/// The checked-in copy at `relative` (from the crate's manifest folder)
/// is `doc`; with `ASBX_UPDATE_OPENAPI` set, writes it instead.
pub fn assert_checked_in(manifest_dir: &str, relative: &str, doc: &Value) {
    let path = std::path::Path::new(manifest_dir).join(relative);
    let want = match serde_json::to_string_pretty(doc) {
        Ok(s) => s + "\n",
        Err(e) => panic!("serialising the document: {e}"),
    };
    if std::env::var_os("ASBX_UPDATE_OPENAPI").is_some() {
        if let Err(e) = std::fs::write(&path, &want) {
            panic!("writing {}: {e}", path.display());
        }
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{relative} drifted from the code; rerun with ASBX_UPDATE_OPENAPI=1 \
         (cargo test --workspace --lib -- openapi) and commit it"
    );
}
