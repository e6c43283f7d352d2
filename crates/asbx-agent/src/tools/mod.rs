//! The built-in tools: `shell`, `read_file`, `write_file`, `list_files`,
//! and the [`Toolbox`] that adds the run's skills (`load_skill`), MCP tools
//! and (protocol 2) client tools to them.
//!
//! Each call returns a [`ToolOutput`]: the text the model sees (bounded by
//! `tool_output_bytes`) and the value shown in the `step` line (bounded to
//! about 2 KiB for display). Truncation is always explicit, with a
//! `…[truncated N bytes]` marker. A tool that cannot do its job (bad
//! arguments, refused path, timeout, spawn failure) gives a failed step; the
//! model is told the error and may carry on.

pub mod files;
pub mod shell;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::client_tools::ClientTools;
use crate::emit::Emitter;
use crate::mcp::McpHub;
use crate::providers::ToolSpec;
use crate::skills::{LOAD_SKILL, Skills};

/// Bytes of a tool's output shown in a `step` line.
pub const DISPLAY_BYTES: usize = 2048;

/// Everything a tool call needs to know about its sandbox.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub workdir: PathBuf,
    /// The `/env` variables, passed to `shell`.
    pub variables: BTreeMap<String, String>,
    /// Uid and gid tools run as.
    pub tool_user: Option<(u32, u32)>,
    pub timeout: Duration,
    /// The most output bytes the model gets from one call.
    pub output_bytes: usize,
    pub emitter: Emitter,
}

/// What one tool call produced.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    /// What the model sees.
    pub model_text: String,
    /// What the `step` line shows: a result, or the failure message.
    pub display: Result<Value, String>,
}

impl ToolOutput {
    pub fn failed(message: impl Into<String>) -> Self {
        let message = message.into();
        ToolOutput {
            model_text: format!("error: {message}"),
            display: Err(message),
        }
    }

    pub fn is_error(&self) -> bool {
        self.display.is_err()
    }
}

/// The specs of the built-in tools, as sent to the model.
pub fn specs() -> Vec<ToolSpec> {
    let path_only = |what: &str| {
        json!({
            "type": "object",
            "properties": {"path": {"type": "string", "description": what}},
            "required": ["path"],
            "additionalProperties": false
        })
    };
    vec![
        ToolSpec {
            name: "shell".into(),
            description: "Run a bash command in the working directory. Returns the exit \
                          code, stdout and stderr (truncated when long)."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The bash command line."}},
                "required": ["command"],
                "additionalProperties": false
            }),
        },
        ToolSpec {
            name: "read_file".into(),
            description: "Read a text file, path relative to the working directory.".into(),
            parameters: path_only("File path relative to the working directory."),
        },
        ToolSpec {
            name: "write_file".into(),
            description: "Write a text file (replacing it), creating parent directories. \
                          Files under out/ are returned to the user."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path relative to the working directory."},
                    "content": {"type": "string", "description": "The full new content."}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
        },
        ToolSpec {
            name: "list_files".into(),
            description: "List a directory, path relative to the working directory.".into(),
            parameters: path_only(
                "Directory path relative to the working directory; \".\" for the root.",
            ),
        },
    ]
}

/// Every tool of one run: the built-ins, `load_skill` when there are skills,
/// the MCP servers' tools and the client tools.
///
/// Client tools are not run here: the loop sends them to the client
/// ([`ClientTools::call`]), as they have no `step` lines.
#[derive(Debug)]
pub struct Toolbox {
    pub ctx: ToolContext,
    pub skills: Skills,
    pub mcp: McpHub,
    pub client: ClientTools,
}

impl Toolbox {
    /// Only the built-in tools.
    pub fn builtin(ctx: ToolContext) -> Self {
        Toolbox {
            ctx,
            skills: Skills::default(),
            mcp: McpHub::default(),
            client: ClientTools::default(),
        }
    }

    /// The specs sent to the model: built-ins, `load_skill`, MCP tools,
    /// client tools.
    pub fn specs(&self) -> Vec<ToolSpec> {
        let mut v = specs();
        v.extend(self.skills.spec());
        v.extend(self.mcp.specs());
        v.extend(self.client.specs());
        v
    }

    /// The name of the `step` for a call: `shell` running a skill's script is
    /// `<skill>/<path>`, an MCP tool is `<server>/<tool>`, anything else is
    /// the tool's name.
    pub fn step_name(&self, name: &str, args: &Value) -> String {
        if name == "shell"
            && let Some(cmd) = args.get("command").and_then(Value::as_str)
            && let Some(n) = self.skills.step_name_for_command(&self.ctx.workdir, cmd)
        {
            return n;
        }
        if let Some(t) = self.mcp.find(name) {
            return t.step_name();
        }
        name.to_owned()
    }

    /// Runs one call by name, bounded by the tool timeout.
    pub async fn run(&self, step_id: &str, name: &str, args: &Value) -> ToolOutput {
        if name == LOAD_SKILL && !self.skills.is_empty() {
            return self.skills.load(args, self.ctx.output_bytes);
        }
        if let Some(t) = self.mcp.find(name) {
            return self.mcp.call(&self.ctx, t, args).await;
        }
        run(&self.ctx, step_id, name, args).await
    }
}

/// Runs one built-in tool call by name, bounded by the tool timeout.
pub async fn run(ctx: &ToolContext, step_id: &str, name: &str, args: &Value) -> ToolOutput {
    // `shell` enforces the timeout itself (and kills its process group);
    // this bound is for the file tools, whose blocking I/O cannot be killed.
    let grace = std::time::Duration::from_secs(1);
    match tokio::time::timeout(ctx.timeout + grace, dispatch(ctx, step_id, name, args)).await {
        Ok(out) => out,
        Err(_) => ToolOutput::failed(format!(
            "{name} timed out after {} ms",
            ctx.timeout.as_millis()
        )),
    }
}

async fn dispatch(ctx: &ToolContext, step_id: &str, name: &str, args: &Value) -> ToolOutput {
    let str_arg = |key: &str| args.get(key).and_then(Value::as_str);
    match name {
        "shell" => match str_arg("command") {
            Some(cmd) => shell::run(ctx, step_id, cmd).await,
            None => ToolOutput::failed("shell needs a string argument `command`"),
        },
        "read_file" => match str_arg("path") {
            Some(p) => files::read_file(ctx, p).await,
            None => ToolOutput::failed("read_file needs a string argument `path`"),
        },
        "write_file" => match (str_arg("path"), str_arg("content")) {
            (Some(p), Some(c)) => files::write_file(ctx, p, c).await,
            _ => ToolOutput::failed("write_file needs string arguments `path` and `content`"),
        },
        "list_files" => files::list_files(ctx, str_arg("path").unwrap_or(".")).await,
        other => ToolOutput::failed(format!("unknown tool {other:?}")),
    }
}

/// Lossy text of the first `max` bytes of `shown` (cut on a char boundary),
/// with a marker naming how many of `total` bytes were left out.
pub fn cut(shown: &[u8], total: usize, max: usize) -> String {
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
        s.push_str(&format!("…[truncated {} bytes]", total - end));
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
