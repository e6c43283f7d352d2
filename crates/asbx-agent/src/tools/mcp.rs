//! MCP servers from `/config`, through the official Rust SDK (`rmcp`, client
//! side).
//!
//! - **stdio** (`{name, command, args, env}`): started inside the sandbox
//!   with rmcp's child-process transport, in the working directory, under
//!   the rules of [`super::process`] with [`Slot::Mcp`]: as
//!   [`asbx_protocol::jail::MCP_UID`] (not the tools' uid, so a tool can't
//!   read the server's environment from `/proc`) when tools have their own
//!   user, in its own process group and the `mcp` child cgroup, with the tools'
//!   clean environment (`PATH`, `HOME`, ..., the `/env` variables, then the
//!   server's own `env`). Its stderr goes to the agent's stderr (prefixed
//!   `[mcp <name>]`), never to stdout, which is the NDJSON channel; its tail
//!   is quoted when the server fails to start.
//! - **streamable HTTP** (`{name, url}`): reached at `http://gateway/mcp/<name>`
//!   over the gateway's Unix socket (rmcp's Unix-socket streamable-HTTP
//!   client); the runner's gateway forwards to the URL. The agent never
//!   connects to the URL itself.
//!
//! Entries are checked against the shared rules
//! ([`asbx_protocol::rules::mcp`]) first. All servers start at once, after `/config` and before the first model
//! call. A server that fails to start or to list its tools is left out, with
//! a `warn` log line naming it and the reason; the run goes on without it.
//!
//! Tool names: the model sees `<server>__<tool>` ([`wire_name`]), made
//! wire-safe for every provider (`^[a-zA-Z0-9_-]{1,64}$`, other characters
//! become `_`, clashes get a `_2`, `_3`... suffix); the `step` of a call is
//! named `<server>/<tool>`. Tools with a name over [`MAX_TOOL_NAME_BYTES`]
//! or a schema over [`MAX_SCHEMA_BYTES`] are left out (`warn`). A call is
//! bounded by the tool timeout and its text by `tool_output_bytes`; a result
//! with `isError` is a failed step.
//!
//! At the end of the run each session is closed (briefly) and each stdio
//! server, with everything it started, is killed.

use std::collections::HashSet;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use asbx_protocol::LogLevel;
use asbx_protocol::callback::McpServer;
use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ContentBlock,
    Implementation, ProtocolVersion, ResourceContents,
};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess, UnixSocketHttpClient};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use asbx_protocol::rules::{mcp as rules, truncate_with_marker};

use super::context::{DISPLAY_BYTES, ToolContext, ToolOutput, cut};
use super::process::{self, Reaper, Slot};
use crate::providers::ToolSpec;

/// How long a server may take to start and list its tools.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long closing a session may take at the end of the run.
pub(crate) const CLOSE_TIMEOUT: Duration = Duration::from_millis(1500);
/// Most tools taken from one server.
pub(crate) const MAX_TOOLS_PER_SERVER: usize = 128;
/// Longest tool name taken from a server.
pub(crate) const MAX_TOOL_NAME_BYTES: usize = 128;
/// Largest input schema (serialized) taken from a server.
pub(crate) const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// Bytes of a failed server's stderr quoted in the warning.
pub(crate) const STDERR_TAIL_BYTES: usize = 1024;
/// Longest line of server stderr copied to the agent's stderr.
const STDERR_LINE_BYTES: usize = 4096;

type Client = RunningService<RoleClient, ClientConfig>;

/// One MCP tool offered to the model.
#[derive(Debug, Clone)]
pub(crate) struct McpTool {
    /// The name the model sees and calls.
    pub(crate) wire: String,
    pub(crate) server: String,
    /// The tool's own name on its server.
    pub(crate) tool: String,
    pub(crate) spec: ToolSpec,
}

impl McpTool {
    /// The `step` name of a call: `server/tool`.
    pub(crate) fn step_name(&self) -> String {
        format!("{}/{}", self.server, self.tool)
    }
}

struct Connected {
    name: String,
    client: Client,
    /// Kills the stdio server and what it started on shutdown or drop.
    group: Option<Reaper>,
}

/// The connected servers of this run and their tools.
#[derive(Default)]
pub(crate) struct McpHub {
    servers: Vec<Connected>,
    tools: Vec<McpTool>,
}

impl std::fmt::Debug for McpHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHub")
            .field(
                "servers",
                &self.servers.iter().map(|s| &s.name).collect::<Vec<_>>(),
            )
            .field("tools", &self.tools)
            .finish()
    }
}

/// The wire-safe name of `server`'s `tool`, unique among `taken`.
pub(crate) fn wire_name(server: &str, tool: &str, taken: &HashSet<String>) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    let mut base = format!("{}__{}", clean(server), clean(tool));
    base.truncate(64);
    if !taken.contains(&base) {
        return base;
    }
    for n in 2u32.. {
        let suffix = format!("_{n}");
        let mut cand = base.clone();
        cand.truncate(64 - suffix.len());
        cand.push_str(&suffix);
        if !taken.contains(&cand) {
            return cand;
        }
    }
    base
}

fn client_info() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("asbx-agent", env!("CARGO_PKG_VERSION")),
    )
    .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
}

/// Copies a server's stderr to the agent's stderr line by line (prefixed,
/// long lines cut), keeping a tail for error messages.
async fn pump_stderr(name: String, mut r: impl AsyncRead + Unpin, tail: Arc<Mutex<Vec<u8>>>) {
    let mut buf = vec![0u8; 8192];
    let mut line: Vec<u8> = Vec::new();
    let mut err = tokio::io::stderr();
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Ok(mut t) = tail.lock() {
            t.extend_from_slice(&buf[..n]);
            let excess = t.len().saturating_sub(STDERR_TAIL_BYTES);
            t.drain(..excess);
        }
        for &b in &buf[..n] {
            if b == b'\n' {
                let text = format!("[mcp {name}] {}\n", String::from_utf8_lossy(&line));
                let _ = err.write_all(text.as_bytes()).await;
                line.clear();
            } else if line.len() < STDERR_LINE_BYTES {
                line.push(b);
            }
        }
    }
    if !line.is_empty() {
        let text = format!("[mcp {name}] {}\n", String::from_utf8_lossy(&line));
        let _ = err.write_all(text.as_bytes()).await;
    }
}

/// What one started server produced.
struct Started {
    connected: Connected,
    tools: Vec<rmcp::model::Tool>,
}

async fn start_stdio(
    ctx: &ToolContext,
    name: &str,
    command: &str,
    args: &[String],
    env: &std::collections::BTreeMap<String, String>,
    timeout: Duration,
) -> Result<Started, String> {
    let (mut cmd, cgroup) =
        process::command(command, args, Slot::Mcp, ctx.tool_user, &ctx.cgroup_root)?;
    cmd.current_dir(&ctx.workdir)
        .env_clear()
        .envs(process::base_env(&ctx.workdir))
        .envs(&ctx.variables)
        .envs(env);
    let (proc, stderr) = crate::orphans::spawn(
        || {
            TokioChildProcess::builder(cmd)
                .stderr(Stdio::piped())
                .spawn()
        },
        |(proc, _)| proc.id(),
    )
    .map_err(|e| {
        process::join_failure(&e, cgroup.as_ref())
            .unwrap_or_else(|| format!("cannot start `{command}`: {e}"))
    })?;
    let uid = Slot::Mcp.user(ctx.tool_user).map(|(uid, _)| uid);
    let group = Reaper::new(proc.id(), cgroup, uid);
    let tail = Arc::new(Mutex::new(Vec::new()));
    let pump = stderr.map(|s| tokio::spawn(pump_stderr(name.to_owned(), s, tail.clone())));
    let started = tokio::time::timeout(timeout, async {
        let client = client_info()
            .serve(proc)
            .await
            .map_err(|e| format!("initialize failed: {e}"))?;
        let tools = client
            .list_all_tools()
            .await
            .map_err(|e| format!("tools/list failed: {e}"))?;
        Ok::<_, String>((client, tools))
    })
    .await;
    let result = match started {
        Ok(Ok((client, tools))) => {
            return Ok(Started {
                connected: Connected {
                    name: name.to_owned(),
                    client,
                    group: Some(group),
                },
                tools,
            });
        }
        Ok(Err(e)) => e,
        Err(_) => format!("no answer within {} ms", timeout.as_millis()),
    };
    // Kill it, then quote what it said on stderr.
    drop(group);
    if let Some(p) = pump {
        let _ = tokio::time::timeout(Duration::from_millis(500), p).await;
    }
    let tail = tail
        .lock()
        .map(|t| String::from_utf8_lossy(&t).trim().to_owned())
        .unwrap_or_default();
    if tail.is_empty() {
        Err(result)
    } else {
        Err(format!("{result}; stderr: {tail}"))
    }
}

async fn start_http(
    gateway_socket: &str,
    name: &str,
    timeout: Duration,
) -> Result<Started, String> {
    let uri = format!("http://gateway/mcp/{name}");
    let client = UnixSocketHttpClient::new(gateway_socket, &uri);
    let transport = StreamableHttpClientTransport::with_client(
        client,
        StreamableHttpClientTransportConfig::with_uri(uri),
    );
    let started = tokio::time::timeout(timeout, async {
        let client = client_info()
            .serve(transport)
            .await
            .map_err(|e| format!("initialize failed: {e}"))?;
        let tools = client
            .list_all_tools()
            .await
            .map_err(|e| format!("tools/list failed: {e}"))?;
        Ok::<_, String>((client, tools))
    })
    .await;
    match started {
        Ok(Ok((client, tools))) => Ok(Started {
            connected: Connected {
                name: name.to_owned(),
                client,
                group: None,
            },
            tools,
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

async fn start_one(
    s: &McpServer,
    dup: bool,
    ctx: &ToolContext,
    gateway_socket: &str,
    timeout: Duration,
) -> (String, Result<Started, String>) {
    let name = s.name().to_owned();
    if let Err(why) = rules::check(s) {
        return (name, Err(why));
    }
    if dup {
        return (
            name,
            Err("a server of that name is already configured".into()),
        );
    }
    let r = match s {
        McpServer::Stdio {
            command, args, env, ..
        } => start_stdio(ctx, &name, command, args, env, timeout).await,
        McpServer::Http { .. } => start_http(gateway_socket, &name, timeout).await,
    };
    (name, r)
}

/// Whether a server's tool may be offered: a name of 1 to
/// [`MAX_TOOL_NAME_BYTES`] bytes without control characters, a schema of at
/// most [`MAX_SCHEMA_BYTES`].
fn acceptable_tool(tool: &rmcp::model::Tool) -> bool {
    let n = &tool.name;
    !n.is_empty()
        && n.len() <= MAX_TOOL_NAME_BYTES
        && !n.chars().any(char::is_control)
        && serde_json::to_vec(&*tool.input_schema).is_ok_and(|v| v.len() <= MAX_SCHEMA_BYTES)
}

fn spec_of(server: &str, wire: &str, tool: &rmcp::model::Tool) -> ToolSpec {
    let mut schema = Value::Object((*tool.input_schema).clone());
    if schema.get("type").is_none() {
        schema["type"] = json!("object");
    }
    if schema.get("properties").is_none() {
        schema["properties"] = json!({});
    }
    let desc = tool.description.as_deref().unwrap_or("").trim();
    let desc = truncate_with_marker(desc, 2048);
    ToolSpec {
        name: wire.to_owned(),
        description: if desc.is_empty() {
            format!("Tool `{}` of the MCP server `{server}`.", tool.name)
        } else {
            format!("(MCP server `{server}`) {desc}")
        },
        parameters: schema,
    }
}

impl McpHub {
    /// Starts every server at once, each within `timeout`; logs one line per
    /// server (`info` with its tool count, or `warn` with the reason).
    /// `taken` holds the names of the other tools, which MCP names avoid.
    pub(crate) async fn start(
        servers: &[McpServer],
        ctx: &ToolContext,
        gateway_socket: &str,
        timeout: Duration,
        taken: &HashSet<String>,
    ) -> std::io::Result<McpHub> {
        let mut seen = HashSet::new();
        let starts = servers.iter().map(|s| {
            let dup = !seen.insert(s.name().to_owned());
            start_one(s, dup, ctx, gateway_socket, timeout)
        });
        let results = futures::future::join_all(starts).await;
        let mut hub = McpHub::default();
        let mut taken = taken.clone();
        for (name, r) in results {
            match r {
                Ok(started) => {
                    let (tools, refused): (Vec<_>, Vec<_>) =
                        started.tools.into_iter().partition(acceptable_tool);
                    if !refused.is_empty() {
                        let names: Vec<String> = refused
                            .iter()
                            .map(|t| truncate_with_marker(&t.name, 64))
                            .collect();
                        ctx.emitter
                            .log(
                                LogLevel::Warn,
                                format!(
                                    "mcp server {name}: {} tool(s) left out (name longer than \
                                     {MAX_TOOL_NAME_BYTES} bytes or schema larger than \
                                     {MAX_SCHEMA_BYTES} bytes): {}",
                                    refused.len(),
                                    names.join(", ")
                                ),
                            )
                            .await?;
                    }
                    let total = tools.len();
                    for tool in tools.into_iter().take(MAX_TOOLS_PER_SERVER) {
                        let wire = wire_name(&name, &tool.name, &taken);
                        taken.insert(wire.clone());
                        hub.tools.push(McpTool {
                            spec: spec_of(&name, &wire, &tool),
                            wire,
                            server: name.clone(),
                            tool: tool.name.to_string(),
                        });
                    }
                    let kept = total.min(MAX_TOOLS_PER_SERVER);
                    let mut msg = format!(
                        "mcp server {name}: {kept} tool{}",
                        if kept == 1 { "" } else { "s" }
                    );
                    if total > kept {
                        msg.push_str(&format!(" (of {total}; the rest left out)"));
                    }
                    ctx.emitter.log(LogLevel::Info, msg).await?;
                    hub.servers.push(started.connected);
                }
                Err(reason) => {
                    let reason = truncate_with_marker(&reason, 2048);
                    ctx.emitter
                        .log(
                            LogLevel::Warn,
                            format!(
                                "mcp server {} unavailable, going on without it: {reason}",
                                truncate_with_marker(&name, 64)
                            ),
                        )
                        .await?;
                }
            }
        }
        Ok(hub)
    }

    /// The tools offered to the model.
    pub(crate) fn specs(&self) -> impl Iterator<Item = ToolSpec> + '_ {
        self.tools.iter().map(|t| t.spec.clone())
    }

    /// The tool called `name`: its wire name, or `server/tool`.
    pub(crate) fn find(&self, name: &str) -> Option<&McpTool> {
        self.tools
            .iter()
            .find(|t| t.wire == name)
            .or_else(|| self.tools.iter().find(|t| t.step_name() == name))
    }

    /// Calls `tool`, bounded by the tool timeout.
    pub(crate) async fn call(&self, ctx: &ToolContext, tool: &McpTool, args: &Value) -> ToolOutput {
        let Some(server) = self.servers.iter().find(|s| s.name == tool.server) else {
            return ToolOutput::failed(format!("mcp server {} is not connected", tool.server));
        };
        let mut params = CallToolRequestParams::new(tool.tool.clone());
        match args {
            Value::Object(m) => params = params.with_arguments(m.clone()),
            Value::Null => {}
            other => {
                return ToolOutput::failed(format!(
                    "{} needs a JSON object of arguments, got {}",
                    tool.step_name(),
                    truncate_with_marker(&other.to_string(), 200)
                ));
            }
        }
        match tokio::time::timeout(ctx.timeout, server.client.call_tool(params)).await {
            Err(_) => ToolOutput::failed(format!(
                "{} timed out after {} ms",
                tool.step_name(),
                ctx.timeout.as_millis()
            )),
            Ok(Err(e)) => ToolOutput::failed(format!("{} failed: {e}", tool.step_name())),
            Ok(Ok(result)) => output_of(&result, ctx.output_bytes),
        }
    }

    /// Closes every session and kills every stdio server's process group.
    pub(crate) async fn shutdown(self) {
        let closes = self.servers.into_iter().map(|mut s| async move {
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, s.client.close()).await;
            if let Some(mut g) = s.group.take() {
                g.kill().await;
            }
        });
        futures::future::join_all(closes).await;
    }
}

/// The text of a tool result: its text blocks, a note for other blocks, or
/// the structured content when there is nothing else.
pub(crate) fn result_text(r: &CallToolResult) -> String {
    let mut parts = Vec::new();
    for block in &r.content {
        parts.push(match block {
            ContentBlock::Text(t) => t.text.clone(),
            ContentBlock::Image(i) => {
                format!("[image {}, {} base64 bytes]", i.mime_type, i.data.len())
            }
            ContentBlock::Audio(a) => {
                format!("[audio {}, {} base64 bytes]", a.mime_type, a.data.len())
            }
            ContentBlock::Resource(res) => match &res.resource {
                ResourceContents::TextResourceContents { uri, text, .. } => {
                    format!("[resource {uri}]\n{text}")
                }
                ResourceContents::BlobResourceContents { uri, blob, .. } => {
                    format!("[resource {uri}, {} base64 bytes]", blob.len())
                }
                // The enum is non-exhaustive.
                _ => "[resource]".to_owned(),
            },
            ContentBlock::ResourceLink(l) => format!("[resource link {}]", l.uri),
            // The enum is non-exhaustive.
            _ => "[unsupported content]".to_owned(),
        });
    }
    if parts.is_empty()
        && let Some(v) = &r.structured_content
    {
        return v.to_string();
    }
    parts.join("\n")
}

fn output_of(r: &CallToolResult, output_bytes: usize) -> ToolOutput {
    let text = result_text(r);
    if r.is_error == Some(true) {
        let shown = if text.trim().is_empty() {
            "the tool reported an error".to_owned()
        } else {
            text
        };
        return ToolOutput {
            model_text: format!(
                "error: {}",
                cut(shown.as_bytes(), shown.len(), output_bytes)
            ),
            display: Err(cut(shown.as_bytes(), shown.len(), DISPLAY_BYTES).into()),
        };
    }
    let display = match &r.structured_content {
        Some(v) if v.to_string().len() <= DISPLAY_BYTES => v.clone(),
        Some(_) | None => json!(cut(text.as_bytes(), text.len(), DISPLAY_BYTES)),
    };
    ToolOutput {
        model_text: cut(text.as_bytes(), text.len(), output_bytes),
        display: Ok(display),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_are_safe_and_unique() {
        let mut taken: HashSet<String> = ["shell".to_owned()].into();
        assert_eq!(wire_name("calc", "add", &taken), "calc__add");
        assert_eq!(
            wire_name("my.srv", "do it/now", &taken),
            "my_srv__do_it_now"
        );
        let long = "x".repeat(100);
        let n = wire_name(&long, "t", &taken);
        assert_eq!(n.len(), 64);
        taken.insert(n.clone());
        let n2 = wire_name(&long, "t", &taken);
        assert_eq!(n2.len(), 64);
        assert!(n2.ends_with("_2"));
        taken.insert("a__b".into());
        assert_eq!(wire_name("a", "b", &taken), "a__b_2");
        for n in [n, n2] {
            assert!(
                n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            );
        }
    }
}
