//! The agent loop that runs inside a sandbox.
//!
//! [`run_agent`] is what `asbx agent` calls: it reads one
//! [`AgentBootstrap`] from stdin, then [`run`] does the turn and writes
//! unstamped NDJSON [`Event`]s to stdout: `sandbox started` first, then
//! steps, then exactly one `result` or `error`. All HTTP goes through the
//! gateway's Unix socket; the agent holds no provider key.
//!
//! Order of a turn: `/callback/env` (setup token), the setup script,
//! `/callback/config` (run token), skills written into the sandbox and MCP
//! servers started, client tools picked (protocol 2), the loop (bounded by the run's duration limit), MCP
//! servers shut down, writeback of `out/` (upload token), `result`.
//!
//! The run's `max_duration` counts from the start of [`run`], bootstrap and
//! setup included; writeback happens after the loop and is not counted.
//!
//! Environment read by [`run_agent`] (and only there, before any thread):
//! - `ASBX_MODEL_STALL_TIMEOUT_MS`: how long a model response may stay
//!   silent before the call fails with `model_timeout` (default 60000).

pub mod agent_loop;
pub mod bootstrap;
pub mod client_tools;
pub mod egress_relay;
pub mod emit;
pub mod error;
pub mod gateway_client;
pub mod mcp;
pub mod providers;
pub mod skills;
pub mod tools;
pub mod writeback;

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use asbx_protocol::gateway::AgentBootstrap;
use asbx_protocol::line::ResultLine;
use asbx_protocol::{Event, LogLevel, Protocol, codes};
use tokio::io::AsyncWrite;

pub use emit::Emitter;
pub use error::AgentError;
pub use providers::{HttpSettings, RetryPolicy};

use crate::agent_loop::Counters;
use crate::gateway_client::GatewayClient;
use crate::providers::{Message, ModelRequest};
use crate::tools::{ToolContext, Toolbox};

/// The environment variable naming the model stall timeout in ms.
pub const STALL_TIMEOUT_ENV: &str = "ASBX_MODEL_STALL_TIMEOUT_MS";

/// Tunables that are not part of the bootstrap.
#[derive(Debug, Clone, Default)]
pub struct AgentOptions {
    pub http: HttpSettings,
}

impl AgentOptions {
    /// Defaults, with [`STALL_TIMEOUT_ENV`] applied when set.
    pub fn from_env() -> Self {
        let mut o = AgentOptions::default();
        if let Some(ms) = std::env::var(STALL_TIMEOUT_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|ms| *ms > 0)
        {
            o.http.stall_timeout = Duration::from_millis(ms);
        }
        o
    }
}

/// `asbx agent`: read the bootstrap from stdin, run the turn, exit.
///
/// Exit code 0 once the terminal line is written; non-zero only when the
/// bootstrap is unreadable or stdout is gone.
pub fn run_agent() -> ExitCode {
    let options = AgentOptions::from_env();
    let mut input = Vec::new();
    let read = std::io::stdin().lock().read_to_end(&mut input);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("asbx agent: cannot start the runtime: {e}");
            return ExitCode::from(70);
        }
    };
    rt.block_on(async move {
        let bootstrap = read.map_err(|e| e.to_string()).and_then(|_| {
            serde_json::from_slice::<AgentBootstrap>(&input).map_err(|e| e.to_string())
        });
        match bootstrap {
            Ok(b) => match run(b, options, tokio::io::stdout()).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("asbx agent: cannot write to stdout: {e}");
                    ExitCode::from(74)
                }
            },
            Err(e) => {
                eprintln!("asbx agent: invalid bootstrap on stdin: {e}");
                let emitter = Emitter::new(tokio::io::stdout(), Default::default());
                let _ = emitter
                    .emit(&Event::error(
                        codes::BOOTSTRAP_FAILED,
                        format!("invalid bootstrap: {e}"),
                    ))
                    .await;
                ExitCode::from(2)
            }
        }
    })
}

/// Runs one turn, writing NDJSON lines to `out`.
///
/// Returns `Ok` once `result` or `error` is written; `Err` only when `out`
/// fails.
pub async fn run(
    bootstrap: AgentBootstrap,
    options: AgentOptions,
    out: impl AsyncWrite + Send + Unpin + 'static,
) -> std::io::Result<()> {
    let started = Instant::now();
    let emitter = Emitter::new(out, bootstrap.protocol);
    emitter.log(LogLevel::Info, "sandbox started").await?;
    let mut counters = Counters::default();
    let outcome = turn(&bootstrap, &options, &emitter, started, &mut counters).await;
    let final_line = match outcome {
        Ok(text) => Event::Result(ResultLine { message: text }),
        Err(AgentError::Output(e)) => return Err(e),
        Err(e) => Event::error(e.code(), e.to_string()),
    };
    if counters.model_calls > 0 {
        // Token counts for the runner's session_ended stats; best effort.
        let usage = asbx_protocol::gateway::Usage {
            input_tokens: counters.usage.input_tokens,
            output_tokens: counters.usage.output_tokens,
        };
        if let Ok(body) = serde_json::to_vec(&usage) {
            let _ = GatewayClient::new(&bootstrap.gateway_socket)
                .send_collect(
                    hyper::Method::POST,
                    asbx_protocol::gateway::USAGE,
                    &[("content-type", "application/json")],
                    bytes::Bytes::from(body),
                )
                .await;
        }
        emitter
            .log(
                LogLevel::Info,
                format!(
                    "usage: {} model call(s), {} tool call(s), {} input tokens, {} output tokens",
                    counters.model_calls,
                    counters.tool_calls,
                    counters.usage.input_tokens,
                    counters.usage.output_tokens
                ),
            )
            .await?;
    }
    emitter.emit(&final_line).await
}

async fn turn(
    b: &AgentBootstrap,
    options: &AgentOptions,
    emitter: &Emitter,
    started: Instant,
    counters: &mut Counters,
) -> Result<String, AgentError> {
    let gw = GatewayClient::new(&b.gateway_socket);
    let env = bootstrap::redeem_env(&gw, &b.otp_setup).await?;
    let workdir = PathBuf::from(&b.workdir);
    let mut variables = env.variables.clone();
    // Held until the turn ends; dropping it stops the relay.
    let _relay = match &b.proxy_socket {
        Some(sock) => match egress_relay::EgressRelay::start(sock).await {
            Ok(relay) => {
                variables.extend(relay.env());
                Some(relay)
            }
            Err(e) => {
                emitter
                    .log(
                        LogLevel::Warn,
                        format!("no network for tools: cannot start the egress relay: {e}"),
                    )
                    .await
                    .map_err(AgentError::Output)?;
                None
            }
        },
        None => None,
    };
    let mut ctx = ToolContext {
        workdir: workdir.clone(),
        variables,
        tool_user: b.tool_user,
        timeout: Duration::from_millis(b.max_limits.tool_timeout_ms),
        output_bytes: usize::try_from(b.max_limits.tool_output_bytes).unwrap_or(usize::MAX),
        emitter: emitter.clone(),
    };
    if let Some(script) = env.setup_script.as_deref().filter(|s| !s.trim().is_empty()) {
        emitter
            .log(LogLevel::Info, "running setup script")
            .await
            .map_err(AgentError::Output)?;
        let t = Instant::now();
        bootstrap::run_setup(
            &ctx,
            script,
            Duration::from_millis(b.max_limits.max_duration_ms),
        )
        .await?;
        emitter
            .log(
                LogLevel::Info,
                format!("setup script finished in {} ms", t.elapsed().as_millis()),
            )
            .await
            .map_err(AgentError::Output)?;
    }
    let config = bootstrap::redeem_config(&gw, &b.otp_run).await?;
    let limits = bootstrap::clamp_limits(&b.max_limits, config.limits.as_ref());
    ctx.timeout = limits.tool_timeout;
    ctx.output_bytes = limits.tool_output_bytes;

    let (provider, model) =
        providers::build(&config.model, &b.providers, &gw, &b.prompt, &options.http)?;
    let mut messages: Vec<Message> = config
        .conversation
        .iter()
        .map(|t| match t.role {
            asbx_protocol::callback::Role::User => Message::User(t.content.clone()),
            asbx_protocol::callback::Role::Assistant => Message::Assistant {
                text: t.content.clone(),
                tool_calls: Vec::new(),
            },
        })
        .collect();
    messages.push(Message::User(b.prompt.clone()));
    let skills = skills::Skills::install(&workdir, &config.skills, emitter)
        .await
        .map_err(AgentError::Output)?;
    let deadline = started + limits.max_duration;
    let mcp = if config.mcp_servers.is_empty() {
        mcp::McpHub::default()
    } else {
        let builtin: std::collections::HashSet<String> = tools::specs()
            .into_iter()
            .map(|t| t.name)
            .chain(skills.spec().map(|t| t.name))
            .collect();
        let timeout = mcp::START_TIMEOUT.min(deadline.saturating_duration_since(Instant::now()));
        mcp::McpHub::start(
            &config.mcp_servers,
            &ctx,
            &b.gateway_socket,
            timeout,
            &builtin,
        )
        .await
        .map_err(AgentError::Output)?
    };
    let system = match (
        config.system_prompt.clone().filter(|s| !s.is_empty()),
        skills.prompt_section(),
    ) {
        (Some(p), Some(s)) => Some(format!("{p}\n\n{s}")),
        (p, s) => p.or(s),
    };
    let client = client_tools(b, &gw, &skills, &mcp, emitter)
        .await
        .map_err(AgentError::Output)?;
    let toolbox = Toolbox {
        ctx,
        skills,
        mcp,
        client,
    };
    let req = ModelRequest {
        model,
        system,
        messages,
        tools: toolbox.specs(),
    };
    let looped = tokio::time::timeout_at(
        deadline.into(),
        agent_loop::run(provider.as_ref(), req, &limits, &toolbox, emitter, counters),
    )
    .await;
    toolbox.mcp.shutdown().await;
    let text = match looped {
        Ok(r) => r?,
        Err(_) => {
            return Err(AgentError::DurationLimit(
                limits.max_duration.as_millis() as u64
            ));
        }
    };
    writeback::writeback(&gw, b.otp_upload.as_deref(), &workdir, emitter)
        .await
        .map_err(AgentError::Output)?;
    Ok(text)
}

/// The client tools to offer: protocol 2 only, none whose name another tool
/// has (each one left out gets a `warn` line).
async fn client_tools(
    b: &AgentBootstrap,
    gw: &GatewayClient,
    skills: &skills::Skills,
    mcp: &mcp::McpHub,
    emitter: &Emitter,
) -> std::io::Result<client_tools::ClientTools> {
    if b.client_tools.is_empty() {
        return Ok(client_tools::ClientTools::default());
    }
    if b.protocol != Protocol::V2 {
        emitter
            .log(
                LogLevel::Warn,
                format!(
                    "{} client tool(s) ignored: client tools need protocol 2",
                    b.client_tools.len()
                ),
            )
            .await?;
        return Ok(client_tools::ClientTools::default());
    }
    let taken: std::collections::HashSet<String> = tools::specs()
        .into_iter()
        .chain(skills.spec())
        .chain(mcp.specs())
        .map(|t| t.name)
        .collect();
    let (client, warnings) = client_tools::ClientTools::select(gw.clone(), &b.client_tools, &taken);
    for w in warnings {
        emitter.log(LogLevel::Warn, w).await?;
    }
    Ok(client)
}
