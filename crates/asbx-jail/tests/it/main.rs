//! Integration tests of the jail: real programs in real sandboxes, through
//! this very binary acting as `asbx jail` (`it __jail <policy-json>`, and
//! `it jail --zygote` for the zygote).
//!
//! - `cargo test -p asbx-jail --test it` runs every case (root needed;
//!   cases skip with a message when the host lacks a feature);
//! - `... -- NAME` runs the cases whose name contains NAME.
//!
//! Start-up and memory figures live with the other benchmarks:
//! `asbx-bench jail-startup N`.

// A harness = false test binary: clippy does not know it is test code.
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    unreachable_pub
)]

mod harness;
mod suite;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("__jail") {
        harness::jail_main(&args);
    }
    if args.get(1).map(String::as_str) == Some("jail")
        && args.get(2).map(String::as_str) == Some("--zygote")
    {
        std::process::exit(asbx_jail::serve_zygote(None));
    }
    if args.get(1).map(String::as_str) == Some("__parent") {
        harness::parent_main(&args);
    }
    let filters: Vec<&str> = args[1..]
        .iter()
        .filter(|a| !a.starts_with('-'))
        .map(String::as_str)
        .collect();
    std::process::exit(harness::run_all(suite::cases(), &filters));
}
