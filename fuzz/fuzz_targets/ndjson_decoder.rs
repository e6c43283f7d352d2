//! Fuzzes the streaming NDJSON decoder (`asbx_protocol::LineDecoder`).
//!
//! Input: one control byte, two seed bytes, then the stream. The control byte
//! picks the line cap (a tiny one, to reach the too-long path, or the default).
//! Invariant: however the stream is cut into chunks (whole, one byte at a
//! time, or pseudo-random sizes from the seed), the decoder yields exactly the
//! same results, and never panics. (Byte-at-a-time only for streams up to
//! 256 bytes, to keep the target fast.)
#![no_main]

use asbx_protocol::decode::DEFAULT_MAX_LINE;
use asbx_protocol::{DecodeError, Line, LineDecoder};
use libfuzzer_sys::fuzz_target;

fn decode_in(
    stream: &[u8],
    max: usize,
    sizes: &mut dyn FnMut() -> usize,
) -> Vec<Result<Line, DecodeError>> {
    let mut d = LineDecoder::new(max);
    let mut out = Vec::new();
    let mut rest = stream;
    while !rest.is_empty() {
        let n = sizes().clamp(1, rest.len());
        out.extend(d.push(&rest[..n]));
        rest = &rest[n..];
    }
    out.extend(d.finish());
    out
}

fuzz_target!(|data: &[u8]| {
    let [control, s1, s2, stream @ ..] = data else {
        return;
    };
    let max = if control & 0x80 != 0 {
        usize::from(control & 0x7f)
    } else {
        DEFAULT_MAX_LINE
    };
    let whole = decode_in(stream, max, &mut || usize::MAX);
    // One byte at a time is the finest cut; on long streams it dominates the
    // cost, and the random cuts below reach size 1 too (control & 0x3f == 0).
    if stream.len() <= 256 {
        let bytewise = decode_in(stream, max, &mut || 1);
        assert_eq!(whole, bytewise, "byte-at-a-time decoding differs");
    }
    let mut state = u32::from(*s1) << 8 | u32::from(*s2) | 1;
    let limit = usize::from(control & 0x3f) + 1;
    let random = decode_in(stream, max, &mut || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state as usize % limit + 1
    });
    assert_eq!(whole, random, "chunked decoding differs");
    // A fresh decoder after `finish` is reusable: the same stream again
    // gives the same results.
    let mut d = LineDecoder::new(max);
    let mut first = d.push(stream);
    first.extend(d.finish());
    let mut second = d.push(stream);
    second.extend(d.finish());
    assert_eq!(first, second, "a decoder is not reusable after finish");
});
