//! Fuzzes the SSE framing of relayed lines (`asbx_protocol::sse`).
//!
//! Input: the fuzzer's bytes become an optional id, an event name and the
//! data. Invariants: whatever they hold, a framed event parses back (with a
//! WHATWG-conformant reader, fed whole or cut anywhere) as exactly one event
//! with the same id, name and data; a refusal writes nothing and happens only
//! for what SSE cannot carry. The reader itself never panics on any stream
//! and is independent of how the stream is cut.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use asbx_protocol::sse::{Parser, SseError, SseEvent, write_event};
use libfuzzer_sys::fuzz_target;

fn parse_cut(stream: &[u8], cut: usize) -> Vec<SseEvent> {
    let cut = cut % (stream.len() + 1);
    let mut p = Parser::new();
    let mut evs = p.push(&stream[..cut]);
    evs.extend(p.push(&stream[cut..]));
    evs
}

fuzz_target!(|bytes: &[u8]| {
    let mut u = Unstructured::new(bytes);
    let Ok(id) = Option::<u64>::arbitrary(&mut u) else {
        return;
    };
    let Ok(event) = <&str>::arbitrary(&mut u) else {
        return;
    };
    let Ok(cut) = u16::arbitrary(&mut u) else {
        return;
    };
    let data = u.take_rest();

    let mut out = Vec::new();
    match write_event(&mut out, id, event, data) {
        Ok(()) => {
            let want = vec![SseEvent {
                id: id.map(|n| n.to_string()),
                event: event.to_owned(),
                data: String::from_utf8(data.to_vec())
                    .unwrap_or_else(|e| panic!("framed non-UTF-8: {e}")),
            }];
            assert_eq!(
                Parser::new().push(&out),
                want,
                "frame {:?}",
                String::from_utf8_lossy(&out)
            );
            assert_eq!(parse_cut(&out, usize::from(cut)), want, "cut frame");
        }
        Err(e) => {
            assert!(out.is_empty(), "a refused event wrote bytes");
            let bad_name = event.is_empty() || event.contains(['\r', '\n']);
            let expected = if bad_name {
                SseError::EventName
            } else if data.contains(&b'\r') {
                SseError::CarriageReturn
            } else {
                SseError::NotUtf8
            };
            assert_eq!(e, expected, "refused for the wrong reason");
            if e == SseError::NotUtf8 {
                assert!(std::str::from_utf8(data).is_err(), "refused UTF-8 data");
            }
        }
    }

    // The reader on arbitrary bytes: no panic, and cutting changes nothing.
    let whole = Parser::new().push(bytes);
    assert_eq!(
        parse_cut(bytes, usize::from(cut)),
        whole,
        "reader depends on the cut"
    );
});
