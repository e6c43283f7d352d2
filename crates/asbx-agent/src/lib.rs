//! The agent loop that runs inside a sandbox.
//!
//! [`run_agent`] is what `asbx agent` calls: it reads one
//! [`AgentBootstrap`] from stdin, then [`run`] does the turn and writes
//! unstamped NDJSON [`Event`]s to stdout: `sandbox started` first, then
//! steps, then exactly one `result` or `error`. All HTTP goes through the
//! gateway's Unix socket; the agent holds no provider key.
//!
//! A turn is three calls: `prepare` (`/callback/env` with the setup
//! token, the egress relay, the workspace relay (`ASBX_WORKSPACE_URL` for
//! tools), the setup script, `/callback/config` with the
//! run token, the limits, the provider and the conversation ending with the
//! prompt), `Toolbox::assemble` (skills written into the sandbox, MCP
//! servers started, client tools picked), and the loop
//! (`agent_loop::run`, bounded by the run's duration limit). Then MCP
//! servers are shut down, `out/` is written back (upload token), `result`.
//!
//! The run's `max_duration` counts from the start of [`run`], bootstrap and
//! setup included; writeback happens after the loop and is not counted.
//!
//! Environment read by [`run_agent`] (and only there, before any thread):
//! - `ASBX_MODEL_STALL_TIMEOUT_MS`: how long a model response may stay
//!   silent before the call fails with `model_timeout` (default 60000).

mod agent_loop;
mod bootstrap;
mod egress_relay;
mod emit;
mod error;
mod gateway_client;
mod orphans;
mod providers;
mod tools;
mod workspace_relay;
mod writeback;

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use asbx_protocol::gateway::AgentBootstrap;
use asbx_protocol::line::ResultLine;
use asbx_protocol::{ErrorCode, Event, LogLevel};
use tokio::io::AsyncWrite;

pub use providers::{HttpSettings, RetryPolicy};

use crate::agent_loop::Counters;
use crate::bootstrap::Limits;
use crate::egress_relay::EgressRelay;
use crate::emit::Emitter;
use crate::error::AgentError;
use crate::gateway_client::GatewayClient;
use crate::providers::{Message, ModelRequest, Provider};
use crate::tools::process::CgroupRoot;
use crate::tools::{Sources, ToolContext, Toolbox};
use crate::workspace_relay::WorkspaceRelay;
use crate::writeback::WritebackError;

/// The environment variable naming the model stall timeout in ms.
pub(crate) const STALL_TIMEOUT_ENV: &str = "ASBX_MODEL_STALL_TIMEOUT_MS";

/// Tunables that are not part of the bootstrap.
#[derive(Debug, Clone, Default)]
pub struct AgentOptions {
    pub http: HttpSettings,
}

impl AgentOptions {
    /// Defaults, with [`STALL_TIMEOUT_ENV`] applied when set.
    pub(crate) fn from_env() -> Self {
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
    ExitCode::from(agent_main())
}

/// [`run_agent`] as a plain exit status, for a jail that runs the agent in
/// its main process without an `execve` (`asbx_jail::run_jail_with`).
pub fn agent_main() -> u8 {
    // Before any process starts: the socket for the child memory cgroups
    // becomes close-on-exec, so no tool inherits it.
    asbx_jail::take_cgroup_requests();
    let options = AgentOptions::from_env();
    let mut input = Vec::new();
    // Read before the runtime exists: a warm sandbox waits here, one thread.
    let read = std::io::stdin().lock().read_to_end(&mut input);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("asbx agent: cannot start the runtime: {e}");
            return 70;
        }
    };
    rt.block_on(async move {
        if orphans::is_init() {
            tokio::spawn(orphans::reap_orphans());
        }
        let bootstrap = read.map_err(|e| e.to_string()).and_then(|_| {
            serde_json::from_slice::<AgentBootstrap>(&input).map_err(|e| e.to_string())
        });
        match bootstrap {
            Ok(b) => match run(b, options, stdout()).await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("asbx agent: cannot write to stdout: {e}");
                    74
                }
            },
            Err(e) => {
                eprintln!("asbx agent: invalid bootstrap on stdin: {e}");
                let emitter = Emitter::new(stdout(), Default::default());
                let _ = emitter
                    .emit(&Event::error(
                        ErrorCode::BootstrapFailed.as_str(),
                        format!("invalid bootstrap: {e}"),
                    ))
                    .await;
                2
            }
        }
    })
}

/// Standard output for the emitter: when it is a pipe (as the runner gives
/// it), written without blocking on the runtime's own thread, so no blocking
/// thread is started for it (`tokio::io::stdout` starts one at the first
/// write); anything else through `tokio::io::stdout`.
fn stdout() -> Box<dyn AsyncWrite + Send + Unpin> {
    use std::os::fd::AsFd;
    let pipe = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .and_then(|fd| tokio::net::unix::pipe::Sender::from_owned_fd(fd).ok());
    match pipe {
        Some(p) => Box::new(p),
        None => Box::new(tokio::io::stdout()),
    }
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
        Err(e) => Event::error(e.code().as_str(), e.to_string()),
    };
    if counters.model_calls > 0 {
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

/// What [`prepare`] sets up for the rest of the turn.
struct Prepared {
    gw: GatewayClient,
    ctx: ToolContext,
    config: asbx_protocol::callback::ConfigResponse,
    limits: Limits,
    provider: Box<dyn Provider>,
    /// The model request of the first call: system prompt, conversation
    /// ending with the user's prompt; tools are added once assembled.
    request: ModelRequest,
    /// The in-sandbox workspace API (`/env`), if this session has one.
    workspace: Option<asbx_protocol::callback::WorkspaceAccess>,
    /// Held until the turn ends; dropping it stops the relay.
    _relay: Option<EgressRelay>,
    /// The workspace API for tools (`ASBX_WORKSPACE_URL`), held likewise.
    _workspace_relay: Option<WorkspaceRelay>,
}

async fn turn(
    b: &AgentBootstrap,
    options: &AgentOptions,
    emitter: &Emitter,
    started: Instant,
    counters: &mut Counters,
) -> Result<String, AgentError> {
    let p = prepare(b, options, emitter).await?;
    let deadline = started + p.limits.max_duration;
    let sources = Sources {
        config: &p.config,
        client_tools: &b.client_tools,
        protocol: b.protocol,
        gateway: &p.gw,
        gateway_socket: &b.gateway_socket,
        deadline,
        workspace: p.workspace.as_ref(),
    };
    let toolbox = Toolbox::assemble(p.ctx, sources)
        .await
        .map_err(AgentError::Output)?;
    let mut req = p.request;
    req.system = match (req.system.take(), toolbox.prompt_section()) {
        (Some(p), Some(s)) => Some(format!("{p}\n\n{s}")),
        (p, s) => p.or(s),
    };
    req.tools = toolbox.specs();
    let looped = tokio::time::timeout_at(
        deadline.into(),
        agent_loop::run(
            p.provider.as_ref(),
            req,
            &p.limits,
            &toolbox,
            emitter,
            counters,
        ),
    )
    .await;
    toolbox.shutdown().await;
    let outcome = looped.unwrap_or_else(|_| {
        Err(AgentError::DurationLimit(
            u64::try_from(p.limits.max_duration.as_millis()).unwrap_or(u64::MAX),
        ))
    });
    // Files written before a failure are written back all the same; the
    // token counts go to the runner at the same time.
    let workdir = PathBuf::from(&b.workdir);
    let (written, ()) = tokio::join!(
        writeback::writeback(&p.gw, b.otp_upload.as_deref(), &workdir, emitter),
        report_usage(&p.gw, counters),
    );
    match (outcome, written) {
        (Err(AgentError::Output(e)), _) | (_, Err(WritebackError::Output(e))) => {
            Err(AgentError::Output(e))
        }
        (Ok(text), Ok(())) => Ok(text),
        (Err(e), Ok(())) => Err(e),
        (Ok(_), Err(WritebackError::Failed(w))) => Err(AgentError::Writeback(w)),
        (Err(e), Err(WritebackError::Failed(w))) => Err(AgentError::AndWriteback {
            error: Box::new(e),
            writeback: w,
        }),
    }
}

/// Token counts for the runner's `session_ended` stats; best effort, and
/// only once a model was called.
async fn report_usage(gw: &GatewayClient, counters: &Counters) {
    if counters.model_calls == 0 {
        return;
    }
    let usage = asbx_protocol::gateway::Usage {
        input_tokens: counters.usage.input_tokens,
        output_tokens: counters.usage.output_tokens,
        model_calls: counters.model_calls,
    };
    if let Ok(body) = serde_json::to_vec(&usage) {
        let _ = gw
            .send_collect(
                hyper::Method::POST,
                asbx_protocol::gateway::USAGE,
                &[("content-type", "application/json")],
                bytes::Bytes::from(body),
            )
            .await;
    }
}

/// Redeems the tokens, starts the egress relay, runs the setup script, and
/// builds the provider and the first model request.
async fn prepare(
    b: &AgentBootstrap,
    options: &AgentOptions,
    emitter: &Emitter,
) -> Result<Prepared, AgentError> {
    let gw = GatewayClient::new(&b.gateway_socket);
    // `/config` at the same time as `/env`, before anything slow: the
    // runner learns the run's effective limits from it for `session_init`
    // (docs/protocol.md §4), a long setup script can't outlive the run
    // token, and the turn waits for one round trip, not two. A refused
    // setup token is the error even when `/config` answered.
    let (env, config) = tokio::join!(
        bootstrap::redeem_env(&gw, &b.otp_setup),
        bootstrap::redeem_config(&gw, &b.otp_run),
    );
    let (env, config) = (env?, config?);
    let mut variables = env.variables.clone();
    let relay = start_relay(b, emitter, &mut variables).await?;
    let workspace_relay =
        start_workspace_relay(&gw, env.workspace.as_ref(), emitter, &mut variables).await?;
    let mut ctx = ToolContext {
        workdir: PathBuf::from(&b.workdir),
        variables,
        tool_user: b.tool_user,
        timeout: Duration::from_millis(b.max_limits.tool_timeout_ms),
        output_bytes: usize::try_from(b.max_limits.tool_output_bytes).unwrap_or(usize::MAX),
        emitter: emitter.clone(),
        cgroup_root: CgroupRoot::default(),
    };
    if let Some(ws) = env.workspace.as_ref().filter(|w| !w.attachments.is_empty()) {
        fetch_attachments(&gw, ws, &ctx).await?;
    }
    if let Some(script) = env.setup_script.as_deref().filter(|s| !s.trim().is_empty()) {
        run_setup_script(b, &ctx, script).await?;
    }
    let limits = bootstrap::clamp_limits(&b.max_limits, config.limits.as_ref());
    ctx.timeout = limits.tool_timeout;
    ctx.output_bytes = limits.tool_output_bytes;
    let (provider, model) = providers::build(&config.model, &b.providers, &gw, &options.http)?;
    let request = first_request(b, &config, model);
    Ok(Prepared {
        gw,
        ctx,
        config,
        limits,
        provider,
        request,
        workspace: env.workspace,
        _relay: relay,
        _workspace_relay: workspace_relay,
    })
}

/// Starts the egress relay when the runner gave a proxy socket, its
/// variables added to the tools' environment; without it tools have no
/// network (a warning, not an error).
async fn start_relay(
    b: &AgentBootstrap,
    emitter: &Emitter,
    variables: &mut std::collections::BTreeMap<String, String>,
) -> Result<Option<EgressRelay>, AgentError> {
    let Some(sock) = &b.proxy_socket else {
        return Ok(None);
    };
    match EgressRelay::start(sock).await {
        Ok(relay) => {
            variables.extend(relay.env());
            Ok(Some(relay))
        }
        Err(e) => {
            emitter
                .log(
                    LogLevel::Warn,
                    format!("no network for tools: cannot start the egress relay: {e}"),
                )
                .await
                .map_err(AgentError::Output)?;
            Ok(None)
        }
    }
}

/// Tools and skill scripts reach this session's workspace API with
/// `ASBX_WORKSPACE_URL` and `ASBX_WORKSPACE_TOKEN` (docs/protocol.md §3).
async fn start_workspace_relay(
    gw: &GatewayClient,
    workspace: Option<&asbx_protocol::callback::WorkspaceAccess>,
    emitter: &Emitter,
    variables: &mut std::collections::BTreeMap<String, String>,
) -> Result<Option<WorkspaceRelay>, AgentError> {
    let Some(ws) = workspace else {
        return Ok(None);
    };
    match WorkspaceRelay::start(gw.clone()).await {
        Ok(relay) => {
            variables.extend(relay.env(&ws.token));
            Ok(Some(relay))
        }
        Err(e) => {
            emitter
                .log(
                    LogLevel::Warn,
                    format!("no workspace API for tools: cannot start its relay: {e}"),
                )
                .await
                .map_err(AgentError::Output)?;
            Ok(None)
        }
    }
}

/// Fetches the turn's attachments into the working directory.
async fn fetch_attachments(
    gw: &GatewayClient,
    ws: &asbx_protocol::callback::WorkspaceAccess,
    ctx: &ToolContext,
) -> Result<(), AgentError> {
    let api = tools::workspace::WorkspaceApi::new(gw.clone(), ws);
    let t = Instant::now();
    let total = tools::workspace::fetch_attachments(&api, ctx, &ws.attachments)
        .await
        .map_err(|(path, reason)| AgentError::Attachment { path, reason })?;
    ctx.emitter
        .log(
            LogLevel::Info,
            format!(
                "fetched {} attachment(s), {total} bytes, in {} ms",
                ws.attachments.len(),
                t.elapsed().as_millis()
            ),
        )
        .await
        .map_err(AgentError::Output)
}

/// Runs the environment's setup script, bounded by the run's duration.
async fn run_setup_script(
    b: &AgentBootstrap,
    ctx: &ToolContext,
    script: &str,
) -> Result<(), AgentError> {
    let emitter = &ctx.emitter;
    emitter
        .log(LogLevel::Info, "running setup script")
        .await
        .map_err(AgentError::Output)?;
    let t = Instant::now();
    bootstrap::run_setup(
        ctx,
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
        .map_err(AgentError::Output)
}

/// The first model request: the earlier conversation, then the prompt.
fn first_request(
    b: &AgentBootstrap,
    config: &asbx_protocol::callback::ConfigResponse,
    model: String,
) -> ModelRequest {
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
    ModelRequest {
        model,
        system: config.system_prompt.clone().filter(|s| !s.is_empty()),
        messages,
        tools: Vec::new(),
    }
}
