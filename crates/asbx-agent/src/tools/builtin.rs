//! The built-in tools: `shell`, `read_file`, `write_file`, `list_files`:
//! their specs for the model and the dispatch of a call by name.

use serde_json::{Value, json};

use super::context::{ToolContext, ToolOutput};
use super::{files, shell};
use crate::providers::ToolSpec;

/// The names of the built-in tools.
pub(crate) const NAMES: [&str; 4] = ["shell", "read_file", "write_file", "list_files"];

/// The specs of the built-in tools, as sent to the model.
pub(crate) fn specs() -> Vec<ToolSpec> {
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

/// Runs one built-in tool call by name, bounded by the tool timeout.
pub(crate) async fn run(ctx: &ToolContext, step_id: &str, name: &str, args: &Value) -> ToolOutput {
    // `shell` enforces the timeout itself (and kills what it started); this
    // bound is for the file tools, whose blocking I/O cannot be killed.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_specs() {
        let names: Vec<String> = specs().into_iter().map(|s| s.name).collect();
        assert_eq!(names, NAMES);
    }
}
