//! JSON Schemas generated from the wire types, checked in under `schemas/`.
//!
//! `cargo test -p asbx-protocol` fails when a checked-in schema drifts from
//! the types; run it with `ASBX_UPDATE_SCHEMAS=1` to rewrite them.

use schemars::{JsonSchema, Schema, schema_for};

/// Every published schema: file stem and schema.
pub fn all() -> Vec<(&'static str, Schema)> {
    fn s<T: JsonSchema>() -> Schema {
        schema_for!(T)
    }
    vec![
        ("line", s::<crate::line::Line>()),
        ("error-code", s::<crate::ErrorCode>()),
        ("dispatch-request", s::<crate::dispatch::DispatchRequest>()),
        ("problem", s::<crate::problem::Problem>()),
        ("problem-code", s::<crate::problem::ProblemCode>()),
        ("env-response", s::<crate::callback::EnvResponse>()),
        ("config-response", s::<crate::callback::ConfigResponse>()),
        ("results-request", s::<crate::callback::ResultsRequest>()),
        ("results-response", s::<crate::callback::ResultsResponse>()),
        ("session-info", s::<crate::session::SessionInfo>()),
        ("agent-bootstrap", s::<crate::gateway::AgentBootstrap>()),
        ("jail-policy", s::<crate::jail::JailPolicy>()),
        ("runner-audit-batch", s::<crate::audit::RunnerAuditBatch>()),
    ]
}

/// Every published schema and every type they name, keyed by type name and
/// ready for an OpenAPI 3.1 document's `components.schemas`: each schema's
/// `$defs` are hoisted beside it, `#/$defs/X` becomes
/// `#/components/schemas/X`, and `$schema` is dropped (OpenAPI 3.1 schema
/// objects are JSON Schema 2020-12, what schemars writes).
///
/// Boolean schemas (`true`: anything) become `{}`, which many OpenAPI tools
/// read where they do not read `true`.
///
/// Two schemas naming the same type with different definitions is an error.
pub fn components() -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let mut out = serde_json::Map::new();
    for (stem, schema) in all() {
        let mut root = serde_json::to_value(&schema).map_err(|e| format!("{stem}: {e}"))?;
        let defs = match root.as_object_mut() {
            Some(obj) => {
                obj.remove("$schema");
                obj.remove("$defs")
            }
            None => return Err(format!("{stem}: the schema is not an object")),
        };
        let title = root
            .get("title")
            .and_then(|t| t.as_str())
            .ok_or_else(|| format!("{stem}: the schema has no title"))?
            .to_owned();
        let mut entries = vec![(title, root)];
        if let Some(serde_json::Value::Object(defs)) = defs {
            entries.extend(defs);
        }
        for (name, mut value) in entries {
            rewrite_refs(&mut value);
            match out.get(&name) {
                Some(have) if *have != value => {
                    return Err(format!("{stem}: two different schemas named {name}"));
                }
                Some(_) => {}
                None => {
                    out.insert(name, value);
                }
            }
        }
    }
    hoist_variants(&mut out);
    Ok(out)
}

/// Drops the `components.schemas` of an OpenAPI document that no operation
/// reaches (the protocol's schemas include the sandbox's own, such as the
/// jail policy, which neither service's API carries).
pub fn prune_components(doc: &mut serde_json::Value) {
    fn refs(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(obj) => {
                for (k, v) in obj {
                    match (k.as_str(), v) {
                        ("$ref", serde_json::Value::String(r)) => {
                            if let Some(name) = r.strip_prefix("#/components/schemas/") {
                                out.push(name.to_owned());
                            }
                        }
                        _ => refs(v, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut todo = Vec::new();
    refs(&doc["paths"], &mut todo);
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(|s| s.as_object_mut())
    else {
        return;
    };
    let mut keep = std::collections::BTreeSet::new();
    while let Some(name) = todo.pop() {
        if keep.insert(name.clone())
            && let Some(s) = schemas.get(&name)
        {
            refs(s, &mut todo);
        }
    }
    schemas.retain(|name, _| keep.contains(name));
    schemas.sort_keys();
}

/// Serializes an OpenAPI document (`api`, utoipa's) and fills the stand-ins
/// among its `components.schemas` (a reference to themselves, where the
/// code names a protocol type) with the protocol's [`components`]; a name
/// the code's own schemas took stays theirs (each service's tests check
/// none clash). The schemas are fixed at build time and checked by a test;
/// an error here would leave the references dangling, which those tests
/// catch.
pub fn document_with_components(api: &impl serde::Serialize) -> serde_json::Value {
    let mut doc = serde_json::to_value(api).unwrap_or_default();
    let protocol = components().unwrap_or_default();
    if let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(|s| s.as_object_mut())
    {
        for (name, schema) in protocol {
            let stand_in = serde_json::json!({ "$ref": format!("#/components/schemas/{name}") });
            match schemas.get(&name) {
                Some(have) if *have != stand_in => {}
                _ => {
                    schemas.insert(name, schema);
                }
            }
        }
    }
    doc
}

/// Wraps the schema of every `text/event-stream` response of an OpenAPI
/// document in the schema of one server-sent event: the SSE fields
/// (`event`, `id`, `retry`) and `data`, a string of JSON whose own schema is
/// `contentSchema` (JSON Schema 2020-12's way to describe encoded content).
/// That is what an SSE response carries item by item, and what tools that
/// check streamed events (schemathesis, OpenAPI 3.2's `itemSchema`) read.
pub fn sse_envelopes(doc: &mut serde_json::Value) {
    let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) else {
        return;
    };
    for item in paths.values_mut() {
        let Some(ops) = item.as_object_mut() else {
            continue;
        };
        for op in ops.values_mut() {
            let Some(responses) = op.get_mut("responses").and_then(|r| r.as_object_mut()) else {
                continue;
            };
            for response in responses.values_mut() {
                let Some(schema) = response
                    .pointer_mut("/content/text~1event-stream/schema")
                    .filter(|s| s.pointer("/properties/data/contentSchema").is_none())
                else {
                    continue;
                };
                let inner = schema.take();
                *schema = serde_json::json!({
                    "type": "object",
                    "description": "One server-sent event; `data` is JSON text (contentSchema).",
                    "properties": {
                        "event": { "type": "string" },
                        "id": { "type": "string" },
                        "retry": { "type": "integer", "minimum": 0 },
                        "data": {
                            "type": "string",
                            "contentMediaType": "application/json",
                            "contentSchema": inner,
                        },
                    },
                    "required": ["data"],
                });
            }
        }
    }
}

/// Moves every inline object member of a component's `oneOf` or `anyOf`
/// into a component of its own and references it, so a client generator
/// names each variant (`LineLog`, `McpStdioServer`) instead of numbering
/// them (`Line_type_0`), which some generators cannot do for nested
/// members (openapi-python-client's duplicate `McpServerType0Env`).
///
/// A member is named by its `title` (an untagged enum's variants carry
/// one), else by its parent and its tag, the one property holding a single
/// constant (`Line` + `type: "session_init"` = `LineSessionInit`), else by
/// its parent and position. The wire is unchanged: only where the schema
/// is written moves.
pub fn name_variants(doc: &mut serde_json::Value) {
    if let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(|s| s.as_object_mut())
    {
        hoist_variants(schemas);
    }
}

/// [`name_variants`] over a map of schemas by name ([`components`] gives
/// the protocol's schemas with their variants named already).
fn hoist_variants(schemas: &mut serde_json::Map<String, serde_json::Value>) {
    let mut hoisted = Vec::new();
    for (parent, schema) in schemas.iter_mut() {
        for key in ["oneOf", "anyOf"] {
            let Some(members) = schema.get_mut(key).and_then(|m| m.as_array_mut()) else {
                continue;
            };
            for (i, member) in members.iter_mut().enumerate() {
                let inline_object = member.get("$ref").is_none()
                    && (member.get("type").and_then(|t| t.as_str()) == Some("object")
                        || member.get("properties").is_some());
                if !inline_object {
                    continue;
                }
                let name = variant_name(parent, i, member);
                let body = member.take();
                *member = serde_json::json!({ "$ref": format!("#/components/schemas/{name}") });
                hoisted.push((name, body));
            }
        }
    }
    for (name, body) in hoisted {
        // Names are the parent's plus a tag or title: a clash would be two
        // variants of one enum with the same tag, which serde refuses.
        schemas.insert(name, body);
    }
    schemas.sort_keys();
}

/// The component name of the `i`th variant of `parent` (see [`name_variants`]).
fn variant_name(parent: &str, i: usize, member: &serde_json::Value) -> String {
    if let Some(title) = member.get("title").and_then(|t| t.as_str())
        && !title.is_empty()
    {
        return title.to_owned();
    }
    let tag = member
        .get("properties")
        .and_then(|p| p.as_object())
        .and_then(|props| {
            props.values().find_map(|p| {
                p.get("const").and_then(|c| c.as_str()).or_else(|| {
                    match p.get("enum").and_then(|e| e.as_array()).map(Vec::as_slice) {
                        Some([only]) => only.as_str(),
                        _ => None,
                    }
                })
            })
        });
    match tag {
        Some(tag) => format!("{parent}{}", pascal_case(tag)),
        None => format!("{parent}{i}"),
    }
}

/// `session_init` → `SessionInit`.
fn pascal_case(s: &str) -> String {
    s.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

fn rewrite_refs(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(obj) => {
            for (key, v) in obj.iter_mut() {
                if key == "properties"
                    && let serde_json::Value::Object(props) = v
                {
                    for p in props.values_mut() {
                        if *p == serde_json::Value::Bool(true) {
                            *p = serde_json::json!({});
                        }
                    }
                }
                if key == "items" && *v == serde_json::Value::Bool(true) {
                    *v = serde_json::json!({});
                }
                if key == "$ref"
                    && let serde_json::Value::String(r) = v
                    && let Some(name) = r.strip_prefix("#/$defs/")
                {
                    *r = format!("#/components/schemas/{name}");
                } else {
                    rewrite_refs(v);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(rewrite_refs),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sse_responses_get_the_event_envelope_once() {
        let mut doc = serde_json::json!({"paths": {"/a": {"get": {"responses": {
            "200": {"content": {
                "text/event-stream": {"schema": {"$ref": "#/components/schemas/Line"}},
                "application/x-ndjson": {"schema": {"$ref": "#/components/schemas/Line"}}
            }},
            "404": {"content": {"application/problem+json": {"schema": {"type": "object"}}}}
        }}}}});
        super::sse_envelopes(&mut doc);
        let once = doc.clone();
        super::sse_envelopes(&mut doc);
        assert_eq!(doc, once, "wrapping twice must not nest");
        let sse = &doc["paths"]["/a"]["get"]["responses"]["200"]["content"]["text/event-stream"]["schema"];
        assert_eq!(sse["required"], serde_json::json!(["data"]));
        assert_eq!(
            sse["properties"]["data"]["contentSchema"]["$ref"],
            "#/components/schemas/Line"
        );
        // Other media types are left as they are.
        assert_eq!(
            doc["paths"]["/a"]["get"]["responses"]["200"]["content"]["application/x-ndjson"]["schema"]
                ["$ref"],
            "#/components/schemas/Line"
        );
    }

    #[test]
    fn union_variants_become_named_components() {
        let mut doc = serde_json::json!({"components": {"schemas": {
            "Line": {"oneOf": [
                {"type": "object", "properties": {"type": {"type": "string", "const": "session_init"}, "n": {"type": "integer"}}},
                {"type": "object", "properties": {"type": {"type": "string", "enum": ["log"]}}},
                {"$ref": "#/components/schemas/Other"},
                {"type": "string"}
            ]},
            "McpServer": {"anyOf": [
                {"type": "object", "title": "McpStdioServer", "properties": {"command": {"type": "string"}}},
                {"type": "object", "properties": {"url": {"type": "string"}}}
            ]},
            "Other": {"type": "object"}
        }}});
        super::name_variants(&mut doc);
        let s = &doc["components"]["schemas"];
        let refs = |name: &str, key: &str| -> Vec<serde_json::Value> {
            s[name][key]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["$ref"].clone())
                .collect()
        };
        assert_eq!(
            refs("Line", "oneOf"),
            [
                "#/components/schemas/LineSessionInit".into(),
                "#/components/schemas/LineLog".into(),
                "#/components/schemas/Other".into(),
                serde_json::Value::Null,
            ]
        );
        assert_eq!(s["LineSessionInit"]["properties"]["n"]["type"], "integer");
        assert_eq!(s["Line"]["oneOf"][3]["type"], "string");
        assert_eq!(
            refs("McpServer", "anyOf"),
            [
                serde_json::Value::from("#/components/schemas/McpStdioServer"),
                "#/components/schemas/McpServer1".into()
            ]
        );
        assert_eq!(s["McpServer1"]["properties"]["url"]["type"], "string");
    }

    #[test]
    fn components_are_self_contained() {
        let components = super::components().unwrap();
        assert!(components.contains_key("Line"));
        assert!(components.contains_key("Termination"));
        let text = serde_json::to_string(&components).unwrap();
        assert!(!text.contains("#/$defs/"), "a $defs reference was left");
        for name in text.split("#/components/schemas/").skip(1) {
            let name = name.split('"').next().unwrap();
            assert!(
                components.contains_key(name),
                "{name} is referenced, not defined"
            );
        }
    }

    use std::path::PathBuf;

    #[test]
    fn checked_in_schemas_match_the_types() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
        let update = std::env::var_os("ASBX_UPDATE_SCHEMAS").is_some();
        if update {
            std::fs::create_dir_all(&dir).unwrap();
        }
        let mut drifted = Vec::new();
        for (name, schema) in super::all() {
            let path = dir.join(format!("{name}.json"));
            let want = serde_json::to_string_pretty(&schema).unwrap() + "\n";
            if update {
                std::fs::write(&path, &want).unwrap();
                continue;
            }
            let have = std::fs::read_to_string(&path).unwrap_or_default();
            if have != want {
                drifted.push(name);
            }
        }
        assert!(
            drifted.is_empty(),
            "schemas drifted from the types: {drifted:?}; rerun with ASBX_UPDATE_SCHEMAS=1"
        );
    }
}
