//! Fuzzes the workspace callback payloads the agent and the gateway parse
//! (`asbx_protocol::callback`: `/env`, `/config`, `/results`) and the shared
//! rules applied to what parsed (`rules::skills`, `rules::mcp`, `rules::names`,
//! `rules::truncate_with_marker`).
//!
//! Invariants: nothing panics; each payload that parses re-serializes and
//! re-parses to the same value; a rule that refuses says why.
#![no_main]

use asbx_protocol::callback::{ConfigResponse, EnvResponse, ResultsRequest};
use asbx_protocol::rules::{self, mcp, names, skills};
use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(v: &T) {
    let bytes = serde_json::to_vec(v).unwrap_or_else(|e| panic!("serialize: {e}"));
    let again: T = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("re-parse of {:?}: {e}", String::from_utf8_lossy(&bytes)));
    assert_eq!(&again, v, "round trip changed the payload");
}

fn said_why(r: Result<(), String>) {
    if let Err(why) = r {
        assert!(!why.is_empty(), "a refusal without a reason");
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(env) = serde_json::from_slice::<EnvResponse>(data) {
        round_trip(&env);
        for name in env.variables.keys() {
            said_why(names::check_env_name(name));
        }
        for host in &env.allowed_hosts {
            said_why(names::check_host(host));
        }
    }
    if let Ok(config) = serde_json::from_slice::<ConfigResponse>(data) {
        round_trip(&config);
        let mut errors = Vec::new();
        skills::check_skills(&config.skills, "skills", &mut errors);
        mcp::check_servers(&config.mcp_servers, "mcp_servers", &mut errors);
        for e in &errors {
            assert!(!e.message.is_empty(), "a field error without a message");
        }
        for s in &config.skills {
            let _ = skills::bundle_bytes(s);
            said_why(skills::check(s));
        }
        for s in &config.mcp_servers {
            said_why(mcp::check(s));
        }
        said_why(names::check_model(&config.model));
        if let Some(prompt) = &config.system_prompt {
            let max = data.len() % (prompt.len() + 2);
            let cut = rules::truncate_with_marker(prompt, max);
            if prompt.len() <= max {
                assert_eq!(&cut, prompt);
            } else {
                assert!(cut.ends_with("bytes]"), "a cut text without its marker");
                let kept = cut.len() - rules::truncation_marker(prompt.len() - max).len();
                assert!(kept <= max, "kept more than the limit");
            }
        }
    }
    if let Ok(results) = serde_json::from_slice::<ResultsRequest>(data) {
        round_trip(&results);
        for f in &results.files {
            said_why(names::check_relative_path(&f.path));
        }
    }
});
