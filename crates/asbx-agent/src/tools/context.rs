//! What every tool shares: the sandbox it runs in ([`ToolContext`]), what a
//! call produced ([`ToolOutput`]), and how output is cut ([`cut`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use asbx_protocol::rules::truncation_marker;
use serde_json::Value;

use super::process::CgroupRoot;
use crate::emit::Emitter;

/// Bytes of a tool's output shown in a `step` line.
pub(crate) const DISPLAY_BYTES: usize = 2048;

/// Everything a tool call needs to know about its sandbox.
#[derive(Debug, Clone)]
pub(crate) struct ToolContext {
    pub(crate) workdir: PathBuf,
    /// The `/env` variables (and the egress relay's proxy variables).
    pub(crate) variables: BTreeMap<String, String>,
    /// Uid and gid tools run as.
    pub(crate) tool_user: Option<(u32, u32)>,
    pub(crate) timeout: Duration,
    /// The most output bytes the model gets from one call.
    pub(crate) output_bytes: usize,
    pub(crate) emitter: Emitter,
    /// Where the sandbox's child cgroups are ([`CgroupRoot::default`] in a jail).
    pub(crate) cgroup_root: CgroupRoot,
}

/// What one tool call produced.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolOutput {
    /// What the model sees.
    pub(crate) model_text: String,
    /// What the `step` line shows: a result, or why the step failed.
    pub(crate) display: Result<Value, Failure>,
}

/// A failed step as its `step` line shows it: the `error`, and a `result`
/// when the tool ran and has one to show (a command that exited non-zero:
/// its exit code and output).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Failure {
    pub(crate) error: String,
    pub(crate) result: Option<Value>,
}

impl From<String> for Failure {
    fn from(error: String) -> Self {
        Failure {
            error,
            result: None,
        }
    }
}

impl ToolOutput {
    pub(crate) fn failed(message: impl Into<String>) -> Self {
        let message = message.into();
        ToolOutput {
            model_text: format!("error: {message}"),
            display: Err(message.into()),
        }
    }

    pub(crate) fn is_error(&self) -> bool {
        self.display.is_err()
    }
}

/// Lossy text of the first `max` bytes of `shown` (cut on a char boundary),
/// with the shared truncation marker naming how many of `total` bytes were
/// left out.
pub(crate) fn cut(shown: &[u8], total: usize, max: usize) -> String {
    let mut end = shown.len().min(max);
    // Step back over an incomplete UTF-8 sequence at the cut.
    if end < shown.len() {
        while end > 0 && (shown[end] & 0b1100_0000) == 0b1000_0000 {
            end -= 1;
        }
    }
    let mut s = String::from_utf8_lossy(&shown[..end]).into_owned();
    let total = total.max(shown.len());
    if total > end {
        s.push_str(&truncation_marker(total - end));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_marks_truncation() {
        assert_eq!(cut(b"hello", 5, 10), "hello");
        assert_eq!(cut(b"hello", 5, 2), "he…[truncated 3 bytes]");
        assert_eq!(cut(b"hel", 100, 10), "hel…[truncated 97 bytes]");
        assert_eq!(cut("aé".as_bytes(), 3, 2), "a…[truncated 2 bytes]");
    }
}
