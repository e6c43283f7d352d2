//! A stand-in agent for throughput benchmarks: reads its bootstrap, then
//! writes `ASBX_FIREHOSE_LINES` valid `log` lines as fast as it can, then a
//! `result`. Measures the runner, not the agent.

use std::io::{Read, Write};

fn main() -> std::io::Result<()> {
    let mut bootstrap = Vec::new();
    std::io::stdin().read_to_end(&mut bootstrap)?;
    let n: u64 = std::env::var("ASBX_FIREHOSE_LINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let line = br#"{"type":"log","level":"debug","message":"tick tock the firehose is flowing"}"#;
    let mut block = Vec::with_capacity(64 * 1024);
    let per_block = (64 * 1024) / (line.len() + 1);
    let mut out = std::io::stdout().lock();
    let mut left = n;
    while left > 0 {
        block.clear();
        let k = left.min(per_block as u64);
        for _ in 0..k {
            block.extend_from_slice(line);
            block.push(b'\n');
        }
        out.write_all(&block)?;
        left -= k;
    }
    out.write_all(b"{\"type\":\"result\",\"message\":\"done\"}\n")?;
    out.flush()
}
