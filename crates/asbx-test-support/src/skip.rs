//! Skipping a check out loud.
//!
//! libtest captures what `println!`/`eprintln!` print in a passing test, so
//! a test that returns early after `eprintln!("skipped")` is silent. [`skip`]
//! writes to the process's stderr directly (not through the captured macros),
//! so the skip shows in every run's output; with `ASBX_TEST_NO_SKIP=1` (CI
//! sets it where every prerequisite is installed) a skip fails the test.

use std::io::Write;

/// Reports that `test` skipped a check because of `why`. Panics when
/// `ASBX_TEST_NO_SKIP` is `1`.
pub fn skip(test: &str, why: &str) {
    let strict = std::env::var("ASBX_TEST_NO_SKIP").is_ok_and(|v| v == "1");
    if strict {
        panic!("{test}: would skip ({why}), and ASBX_TEST_NO_SKIP=1 forbids skipping");
    }
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test}: {why}");
}
