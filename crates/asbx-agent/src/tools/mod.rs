//! Every tool source of a run, behind one [`Toolbox`]: it lists the specs
//! for the model and runs a call by name.
//!
//! - [`builtin`]: `shell` ([`shell`]), `read_file`, `write_file`,
//!   `list_files` ([`files`]);
//! - [`skills`]: bundles from `/config`, read with `load_skill`, their
//!   scripts run through `shell`;
//! - [`mcp`]: the tools of the run's MCP servers;
//! - [`client`]: protocol 2 client tools, executed by the client;
//! - [`workspace`]: the in-sandbox workspace API's tools and the
//!   `asbx_files` skill, when the session has workspace access.
//!
//! Each source sees only [`context`] (what a call needs and produces) and
//! [`process`] (how tool processes start and end); only this module knows
//! them all, so there is no import cycle.
//!
//! A call of a local tool is one `step` (running, then succeeded or
//! failed); a client tool call is a `tool_call` / `tool_result_applied`
//! pair instead. Each call gives a [`ToolOutput`]: the text the model sees
//! (bounded by `tool_output_bytes`) and the value shown in the `step` line
//! (about 2 KiB). Truncation is always explicit, with the shared
//! `…[truncated N bytes]` marker. A tool that cannot do its job (bad
//! arguments, refused path, timeout, spawn failure) gives a failed step; the
//! model is told the error and may carry on.

mod builtin;
pub(crate) mod client;
pub(crate) mod context;
mod files;
mod mcp;
pub(crate) mod process;
pub(crate) mod shell;
mod skills;
pub(crate) mod workspace;

use std::collections::HashSet;
use std::time::Instant;

use asbx_protocol::callback::{ConfigResponse, WorkspaceAccess};
use asbx_protocol::dispatch::ClientTool;
use asbx_protocol::{LogLevel, Protocol};
use serde_json::Value;

pub(crate) use context::{ToolContext, ToolOutput};

use crate::emit::Emitter;
use crate::gateway_client::GatewayClient;
use crate::providers::{ToolCallRequest, ToolSpec};
use client::ClientTools;
use mcp::McpHub;
use skills::{LOAD_SKILL, Skills};
use workspace::{WorkspaceApi, WorkspaceTools};

/// Every tool of one run.
#[derive(Debug)]
pub(crate) struct Toolbox {
    ctx: ToolContext,
    skills: Skills,
    mcp: McpHub,
    client: ClientTools,
    workspace: Option<WorkspaceTools>,
}

/// What [`Toolbox::assemble`] needs besides the tool context.
#[derive(Debug)]
pub(crate) struct Sources<'a> {
    pub(crate) config: &'a ConfigResponse,
    pub(crate) client_tools: &'a [ClientTool],
    pub(crate) protocol: Protocol,
    pub(crate) gateway: &'a GatewayClient,
    pub(crate) gateway_socket: &'a str,
    /// MCP servers must be up before this.
    pub(crate) deadline: Instant,
    /// The session's workspace API, if it has one.
    pub(crate) workspace: Option<&'a WorkspaceAccess>,
}

impl Toolbox {
    /// Installs the skills, starts the MCP servers and picks the client
    /// tools (protocol 2 only, none whose name another tool has), with a log
    /// line for each one left out. `Err` only when stdout fails.
    pub(crate) async fn assemble(ctx: ToolContext, src: Sources<'_>) -> std::io::Result<Toolbox> {
        let emitter = ctx.emitter.clone();
        let workspace = src
            .workspace
            .map(|w| WorkspaceTools::new(WorkspaceApi::new(src.gateway.clone(), w)));
        let skills = if workspace.is_some()
            && !src
                .config
                .skills
                .iter()
                .any(|s| s.name == workspace::SKILL_NAME)
        {
            let mut bundles = src.config.skills.clone();
            bundles.push(workspace::default_skill());
            Skills::install(&ctx.workdir, &bundles, &emitter).await?
        } else {
            Skills::install(&ctx.workdir, &src.config.skills, &emitter).await?
        };
        let mut taken: HashSet<String> = builtin::NAMES.iter().map(|n| (*n).to_owned()).collect();
        if workspace.is_some() {
            taken.extend(workspace::NAMES.iter().map(|n| (*n).to_owned()));
        }
        taken.extend(skills.spec().map(|t| t.name));
        let mcp = if src.config.mcp_servers.is_empty() {
            McpHub::default()
        } else {
            let timeout =
                mcp::START_TIMEOUT.min(src.deadline.saturating_duration_since(Instant::now()));
            McpHub::start(
                &src.config.mcp_servers,
                &ctx,
                src.gateway_socket,
                timeout,
                &taken,
            )
            .await?
        };
        taken.extend(mcp.specs().map(|t| t.name));
        let client = if src.client_tools.is_empty() {
            ClientTools::default()
        } else if src.protocol != Protocol::V2 {
            emitter
                .log(
                    LogLevel::Warn,
                    format!(
                        "{} client tool(s) ignored: client tools need protocol 2",
                        src.client_tools.len()
                    ),
                )
                .await?;
            ClientTools::default()
        } else {
            let (client, warnings) =
                ClientTools::select(src.gateway.clone(), src.client_tools, &taken);
            for w in warnings {
                emitter.log(LogLevel::Warn, w).await?;
            }
            client
        };
        Ok(Toolbox {
            ctx,
            skills,
            mcp,
            client,
            workspace,
        })
    }

    /// The part of the system prompt the tools add (the skills), if any.
    pub(crate) fn prompt_section(&self) -> Option<String> {
        self.skills.prompt_section()
    }

    /// The specs sent to the model: built-ins, the workspace tools,
    /// `load_skill`, MCP tools, client tools.
    pub(crate) fn specs(&self) -> Vec<ToolSpec> {
        let mut v = builtin::specs();
        if let Some(w) = &self.workspace {
            v.extend(w.specs());
        }
        v.extend(self.skills.spec());
        v.extend(self.mcp.specs());
        v.extend(self.client.specs());
        v
    }

    /// The name of the `step` for a call: `shell` running a skill's script is
    /// `<skill>/<path>`, an MCP tool is `<server>/<tool>`, anything else is
    /// the tool's name.
    fn step_name(&self, name: &str, args: &Value) -> String {
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

    /// Runs call number `n` of the run, writing its `step` lines (or, for a
    /// client tool, its `tool_call` / `tool_result_applied` pair). `Err`
    /// only when stdout fails.
    pub(crate) async fn call(
        &self,
        emitter: &Emitter,
        n: u32,
        call: &ToolCallRequest,
    ) -> std::io::Result<ToolOutput> {
        if self.client.offers(&call.name) {
            return self
                .client
                .call(emitter, n, &call.name, &call.args, self.ctx.output_bytes)
                .await;
        }
        let id = format!("step_{n}_{:08x}", rand::random::<u32>());
        let step_name = self.step_name(&call.name, &call.args);
        emitter
            .step_running(&id, &step_name, call.args.clone())
            .await?;
        let started = Instant::now();
        let out = self.run(&id, &call.name, &call.args).await;
        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (result, error) = match &out.display {
            Ok(v) => (Some(v.clone()), None),
            Err(f) => (f.result.clone(), Some(f.error.clone())),
        };
        emitter
            .step_finished(&id, &step_name, result, error, ms)
            .await?;
        Ok(out)
    }

    /// Runs one local call by name, bounded by the tool timeout.
    async fn run(&self, step_id: &str, name: &str, args: &Value) -> ToolOutput {
        if name == LOAD_SKILL && !self.skills.is_empty() {
            return self.skills.load(args, self.ctx.output_bytes);
        }
        if let Some(w) = self.workspace.as_ref().filter(|w| w.offers(name)) {
            return w.call(&self.ctx, name, args).await;
        }
        if let Some(t) = self.mcp.find(name) {
            return self.mcp.call(&self.ctx, t, args).await;
        }
        builtin::run(&self.ctx, step_id, name, args).await
    }

    /// Stops the MCP servers and everything they started.
    pub(crate) async fn shutdown(self) {
        self.mcp.shutdown().await;
    }
}
