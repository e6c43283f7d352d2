//! Fuzzes the agent-line validator (`asbx_protocol::raw`), the runner's check
//! of every untrusted line an agent writes.
//!
//! Invariants: it never panics; its fast path for common shapes accepts
//! exactly what the full serde validator accepts, with the same view; a line it accepts holds no raw `\n` or `\r`
//! (so no framing downstream, NDJSON or SSE, can be split by it), re-parses
//! with serde into an `Event` of the same type, and once stamped the way the
//! runner stamps it (`{"seq":..,"ts":..,"sessionId":..,` + the bytes after
//! `{`) decodes as a `Line` of that type with the stamp intact.
#![no_main]

use asbx_protocol::decode::decode_line;
use asbx_protocol::raw::AgentEvent;
use asbx_protocol::{Event, Line};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The fast path of common shapes decides exactly as serde does.
    let parsed = AgentEvent::parse(data);
    let full = AgentEvent::parse_full(data);
    assert_eq!(
        parsed.as_ref().map(|(k, e)| (*k, format!("{e:?}"))).ok(),
        full.as_ref().map(|(k, e)| (*k, format!("{e:?}"))).ok(),
        "fast path and serde disagree on {:?}",
        String::from_utf8_lossy(data)
    );
    if let Some(kind) = asbx_protocol::raw::common_kind(data) {
        assert_eq!(
            full.as_ref().map(|(k, _)| *k).ok(),
            Some(kind),
            "common_kind and serde disagree on {:?}",
            String::from_utf8_lossy(data)
        );
    }
    let Ok((kind, _ev)) = parsed else {
        return;
    };
    assert!(
        !data.iter().any(|&b| b == b'\n' || b == b'\r'),
        "accepted a line holding a raw line break: {:?}",
        String::from_utf8_lossy(data)
    );
    let event: Event = serde_json::from_slice(data).unwrap_or_else(|e| {
        panic!(
            "accepted {:?} but serde refuses it as an Event: {e}",
            String::from_utf8_lossy(data)
        )
    });
    assert_eq!(
        event.kind(),
        kind,
        "validator and serde disagree on the type"
    );

    // The runner's path: trim, must start with `{`, stamp by splicing.
    let line = data.trim_ascii();
    if line.first() != Some(&b'{') {
        return;
    }
    let mut stamped = br#"{"seq":7,"ts":1700000000123,"sessionId":"s-1","#.to_vec();
    stamped.extend_from_slice(&line[1..]);
    let decoded: Line = decode_line(&stamped).unwrap_or_else(|e| {
        panic!(
            "stamped line {:?} does not decode: {e}",
            String::from_utf8_lossy(&stamped)
        )
    });
    assert_eq!(decoded.seq, 7);
    assert_eq!(decoded.ts, 1_700_000_000_123);
    assert_eq!(decoded.session_id, "s-1");
    assert_eq!(decoded.event, event, "stamping changed the event");
});
