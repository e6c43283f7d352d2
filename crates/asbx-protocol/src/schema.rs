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
        ("dispatch-request", s::<crate::dispatch::DispatchRequest>()),
        ("problem", s::<crate::problem::Problem>()),
        ("env-response", s::<crate::callback::EnvResponse>()),
        ("config-response", s::<crate::callback::ConfigResponse>()),
        ("results-request", s::<crate::callback::ResultsRequest>()),
        ("results-response", s::<crate::callback::ResultsResponse>()),
        ("session-info", s::<crate::session::SessionInfo>()),
        ("agent-bootstrap", s::<crate::gateway::AgentBootstrap>()),
        ("jail-policy", s::<crate::jail::JailPolicy>()),
    ]
}

#[cfg(test)]
mod tests {
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
