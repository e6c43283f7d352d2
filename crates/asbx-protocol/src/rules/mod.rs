//! Rules that two parts of asbx must agree on, written once.
//!
//! The workspace validates what it accepts with these functions and the agent
//! applies the same ones to what it receives, so a definition the API accepts
//! with `201` is exactly a definition the run installs (see `docs/protocol.md`).
//!
//! - [`names`]: environment variable names, egress hosts, relative paths, model names.
//! - [`skills`]: what a skill bundle may be, with its limits.
//! - [`mcp`]: what an MCP server entry may be.
//! - [`inject`]: secrets bound to hosts, set by the egress proxy.
//! - [`limits`]: sizes and counts both sides of a wire enforce (bag files,
//!   writeback, history, connections per sandbox).
//! - [`truncate_with_marker`]: the one way a cut text says it was cut.

pub mod inject;
pub mod limits;
pub mod mcp;
pub mod names;
pub mod skills;

/// The marker appended to a text that was cut: `…[truncated N bytes]`.
pub fn truncation_marker(cut_bytes: usize) -> String {
    format!("…[truncated {cut_bytes} bytes]")
}

/// Cuts `s` to at most `max` bytes on a char boundary, appending
/// [`truncation_marker`] when anything was cut.
pub fn truncate_with_marker(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + 32);
    out.push_str(&s[..end]);
    out.push_str(&truncation_marker(s.len() - end));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_char_boundaries() {
        assert_eq!(truncate_with_marker("abc", 5), "abc");
        assert_eq!(truncate_with_marker("abcdef", 3), "abc…[truncated 3 bytes]");
        assert_eq!(truncate_with_marker("é", 1), "…[truncated 2 bytes]");
    }
}
