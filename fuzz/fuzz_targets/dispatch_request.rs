//! Fuzzes the dispatch request parser (`asbx_protocol::DispatchRequest::parse`),
//! the first thing the runner does with a `POST /stream` body.
//!
//! Invariants: it never panics; a refusal names at least one field error; an
//! accepted request re-serializes and re-parses to the same value.
#![no_main]

use asbx_protocol::DispatchRequest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match DispatchRequest::parse(data) {
        Err(errors) => assert!(!errors.is_empty(), "refused without naming a field"),
        Ok(req) => {
            let bytes = serde_json::to_vec(&req).unwrap_or_else(|e| panic!("serialize: {e}"));
            match DispatchRequest::parse(&bytes) {
                Ok(again) => assert_eq!(again, req, "round trip changed the request"),
                Err(errors) => panic!(
                    "re-serialized request {:?} refused: {errors:?}",
                    String::from_utf8_lossy(&bytes)
                ),
            }
        }
    }
});
