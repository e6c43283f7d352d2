//! Dispatch: mint the three one-time tokens, record the run (its `/env`
//! with the workspace API's access, the bearer minted when `/env` is
//! redeemed), `POST {SANDBOX_URL}/stream`.
//!
//! When `SANDBOX_URL` lists several runners (a fleet, [`super::fleet`]) a
//! dispatch to the operator's runner tries them in the fleet's order: a
//! runner answering `503` (full) or refusing the connection has started
//! nothing (docs/protocol.md §4), so the same request, tokens included (only
//! a sandbox redeems them), goes to the next one, each runner at most once.
//! The run records the runner that served it (`runs.sandbox_url`); every
//! later call for the run goes there.
//!
//! Every dispatch speaks protocol 2 (docs/protocol.md §4) with the same
//! detach grace (`WorkspaceConfig::runner_detach_grace`, 60 s by default):
//! a stream that broke is re-attached by its node (`runs::reattach`), a
//! node that died leaves its chat turns to another node
//! (`chats::lease::takeover`). Runs and turns are cancelled with `DELETE`.
//! Callers that want more pass [`RunOptions`] (filter, client tools,
//! encryption).
//!
//! A dispatch whose connection broke after it was sent (no answer, or a
//! reset) may have started its session: it is re-attached from the start
//! (`after=0`); a runner that does not know the session never took it, and
//! the same request goes again (its tokens unredeemed).
//!
//! The runner's response is returned unread when it is a stream (`200`), so
//! the caller relays it; anything else is read (bounded) and handed back for
//! pass-through. A run that never streamed is settled here as failed and its
//! tokens are revoked.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use asbx_protocol::callback::{ConfigResponse, EnvResponse};
use asbx_protocol::dispatch::{ClientTool, EncryptionRequest};
use asbx_protocol::session::Termination;
use asbx_protocol::{DispatchRequest, Filter, Problem, Protocol};
use axum::http::{HeaderValue, StatusCode};
use bytes::Bytes;
use url::Url;

use crate::AppState;
use crate::environments::SecretRefs;
use crate::error::WorkspaceError;
use crate::quota::admit;
use crate::runner_url;
use crate::runs::caps::RunnerCaps;
use crate::runs::fleet::Fleet;
pub(crate) use crate::runs::runner_http::{post_request, runner_request};
use crate::runs::store::{self as runs, NewRun, Outcome};
use crate::tokens::store as token_store;
use crate::tokens::{self, OTP_PREFIX, TokenKind};
use crate::wire::RunKind;

/// The HTTP client that talks to runners, and the runner token it sends.
#[derive(Clone)]
pub(crate) struct Dispatcher {
    pub(crate) client: reqwest::Client,
    /// `Authorization: Bearer {runner_token}` on every request to a runner
    /// the operator configured.
    pub(crate) runner_token: Option<String>,
    /// The operator's runners, built on first use from the configuration.
    fleet: OnceLock<Arc<Fleet>>,
    /// Each runner's runtime cap, for token lifetimes, and capacity.
    pub(crate) caps: Arc<RunnerCaps>,
    /// This node's dispatches waiting for their fair share of the fleet.
    pub(crate) fair: Arc<crate::quota::fair::FairQueue>,
    /// This node's runs stopped for a quota, not yet settled.
    pub(crate) stops: Arc<crate::quota::enforce::Stops>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("runner_token", &self.runner_token.as_ref().map(|_| "<set>"))
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    pub(crate) fn new(runner_token: Option<&str>) -> Result<Dispatcher, WorkspaceError> {
        // No overall timeout: a turn may legitimately stream for hours (the
        // runner enforces the cap). Proxies from the environment are ignored:
        // runners are addressed directly. A redirect is never followed: a
        // runner answers itself, and a 3xx would send the request (and its
        // tokens) somewhere no one configured.
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| WorkspaceError::Config(format!("http client: {e}")))?;
        Ok(Dispatcher {
            client,
            runner_token: runner_token.filter(|t| !t.is_empty()).map(str::to_owned),
            fleet: OnceLock::new(),
            caps: Arc::default(),
            fair: Default::default(),
            stops: Default::default(),
        })
    }

    fn fleet(&self, config: &crate::WorkspaceConfig) -> &Arc<Fleet> {
        self.fleet
            .get_or_init(|| Arc::new(Fleet::new(&config.fleet_urls(), self.client.clone())))
    }
}

/// Everything one dispatch needs.
#[derive(Debug, Clone)]
pub(crate) struct RunSpec {
    /// The session id, `^[A-Za-z0-9_-]{1,64}$`.
    pub id: String,
    pub workspace_id: String,
    pub kind: RunKind,
    pub chat_id: Option<String>,
    /// The stored agent of a `RunKind::Agent` run.
    pub agent_id: Option<String>,
    pub prompt: String,
    /// `/env` without secret values.
    pub env: EnvResponse,
    /// The named environment's secrets `/env` adds, by name.
    pub secrets: Option<SecretRefs>,
    /// `/config`, stdio MCP `env` values sealed (`secrets`).
    pub config: ConfigResponse,
    pub sandbox_url: Url,
    /// A run that starts from a chat's kept working directory (CONTRACT
    /// §11): that chat and the directory, restored and never captured.
    pub workdir_from: Option<WorkdirFrom>,
}

/// The chat a run's working directory starts from, and what it kept.
#[derive(Debug, Clone)]
pub(crate) struct WorkdirFrom {
    pub chat_id: String,
    pub manifest: asbx_protocol::workdir::WorkdirManifest,
}

/// The protocol 2 choices of a dispatch (docs/protocol.md §4); the default
/// is none of them: every line, no client tools, no encryption.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunOptions {
    pub filter: Option<Filter>,
    pub client_tools: Vec<ClientTool>,
    pub encryption: Option<EncryptionRequest>,
}

/// What the runner answered.
#[derive(Debug)]
pub(crate) enum Started {
    /// `200`: the NDJSON stream, unread.
    Streaming { response: reqwest::Response },
    /// Anything else, for pass-through; the run is already settled as failed.
    Rejected {
        status: StatusCode,
        content_type: Option<HeaderValue>,
        body: Bytes,
    },
}

/// Records the run, mints its tokens and posts the dispatch.
/// `notify` is told if it waits for its fair share ([`crate::quota::notice`]).
pub(crate) async fn start_with(
    state: &AppState,
    spec: &RunSpec,
    options: &RunOptions,
    notify: crate::quota::notice::Notify,
) -> Result<Started, WorkspaceError> {
    let route = route(state, &spec.sandbox_url).await;
    let limits = admit::limits(state, &spec.workspace_id).await?;
    let capacity = fleet_capacity(state, &spec.sandbox_url).await;
    let mut share =
        admit::ShareWait::new(state, &limits, &spec.workspace_id, capacity).notify(notify);
    loop {
        share.turn().await?;
        let mut tx = crate::store::begin_write(state.store.pool()).await?;
        let now = state.now_ms();
        match admit::dispatch(&mut tx, &limits, &spec.workspace_id, now, capacity).await {
            // Another dispatch took the room first: wait again.
            Err(e) if share.retry(&e) => continue,
            admitted => admitted?,
        }
        let recorded = record(&mut tx, spec, &route, now).await?;
        tx.commit().await?;
        let started = post(state, spec, options, route, recorded).await?;
        if matches!(started, Started::Streaming { .. }) {
            crate::quota::enforce::watch_seconds(state, &limits, &spec.workspace_id, &spec.id);
        }
        return Ok(started);
    }
}

/// The capacity of the operator's runners (their `/healthz` `capacity`
/// summed) when a run of `sandbox_url` goes to them; `None` for another
/// runner or when one's is unknown: no fair share then.
pub(crate) async fn fleet_capacity(state: &AppState, sandbox_url: &Url) -> Option<u64> {
    if state.config.sandbox_url.as_ref() != Some(sandbox_url) {
        return None;
    }
    let d = &state.dispatcher;
    d.caps.capacity(&d.client, &state.config.fleet_urls()).await
}

/// The runners a run may go to, in the order to try them; worked out
/// before the run is recorded (it may ask the fleet, over the network).
pub(crate) struct Route {
    candidates: Vec<Url>,
    fleet: Option<Arc<Fleet>>,
    /// The runtime cap of the runners it may go to (`None`: unknown).
    runner_cap_ms: Option<u64>,
}

/// The runners to try for a run of `sandbox_url`, in order: the fleet's
/// when it goes to the operator's runner and there are several, else that
/// runner alone.
pub(crate) async fn route(state: &AppState, sandbox_url: &Url) -> Route {
    let fleet = (state.config.sandbox_url.as_ref() == Some(sandbox_url))
        .then(|| state.dispatcher.fleet(&state.config))
        .filter(|fleet| fleet.len() > 1);
    let (candidates, fleet) = match fleet {
        Some(fleet) => (fleet.order().await, Some(Arc::clone(fleet))),
        None => (vec![sandbox_url.clone()], None),
    };
    let d = &state.dispatcher;
    let runner_cap_ms = d.caps.of(&d.client, &candidates).await;
    Route {
        candidates,
        fleet,
        runner_cap_ms,
    }
}

/// A run recorded in the caller's transaction: the plaintexts of its
/// tokens, which only its dispatch carries.
pub(crate) struct Recorded {
    minted: [(TokenKind, tokens::Minted); 3],
    /// A chat turn's working-directory token (CONTRACT §11).
    workdir: Option<tokens::Minted>,
}

/// Stores the run's row and the hashes of its freshly minted tokens on
/// `conn`, inside the caller's transaction (a chat turn's also holds its
/// lease and its user message: one commit); [`post`] once it committed.
pub(crate) async fn record(
    conn: &mut sqlx::AnyConnection,
    spec: &RunSpec,
    route: &Route,
    now: i64,
) -> Result<Recorded, WorkspaceError> {
    // Every run gets the in-sandbox workspace API (docs/protocol.md §3). Its
    // bearer is minted when `/env` is redeemed (`callbacks`), so the stored
    // payload never holds one: only its hash is ever stored.
    let mut env = spec.env.clone();
    env.workspace.get_or_insert_with(Default::default).token = String::new();
    let env_json =
        serde_json::to_string(&env).map_err(|e| WorkspaceError::Corrupt(format!("env: {e}")))?;
    drop(env);
    let env_secrets = spec
        .secrets
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| WorkspaceError::Corrupt(format!("env secrets: {e}")))?;
    let cap_ms = tokens::runtime_cap_ms(spec.config.limits.as_ref(), route.runner_cap_ms);
    let config_json = serde_json::to_string(&spec.config)
        .map_err(|e| WorkspaceError::Corrupt(format!("config: {e}")))?;
    let minted = TokenKind::ONE_TIME.map(|kind| (kind, tokens::mint(OTP_PREFIX)));
    let first = route.candidates.first().unwrap_or(&spec.sandbox_url);
    runs::insert(
        &mut *conn,
        &NewRun {
            id: &spec.id,
            workspace_id: &spec.workspace_id,
            kind: spec.kind,
            chat_id: spec.chat_id.as_deref(),
            agent_id: spec.agent_id.as_deref(),
            prompt: &spec.prompt,
            model: &spec.config.model,
            env_json: &env_json,
            env_secrets: env_secrets.as_deref(),
            config_json: &config_json,
            sandbox_url: first.as_str(),
            workdir_from: spec.workdir_from.as_ref().map(|w| w.chat_id.as_str()),
            now_ms: now,
        },
    )
    .await?;
    let rows = minted.each_ref().map(|(kind, m)| (*kind, m));
    token_store::insert_all(&mut *conn, &rows, &spec.id, cap_ms, now).await?;
    let workdir = match (spec.kind, &spec.chat_id) {
        _ if spec.workdir_from.is_some() => {
            let m = tokens::mint(tokens::WORKDIR_PREFIX);
            token_store::insert(&mut *conn, &m, TokenKind::Workdir, &spec.id, cap_ms, now).await?;
            Some(m)
        }
        (RunKind::Chat, Some(_)) => {
            let m = tokens::mint(tokens::WORKDIR_PREFIX);
            token_store::insert(&mut *conn, &m, TokenKind::Workdir, &spec.id, cap_ms, now).await?;
            Some(m)
        }
        _ => None,
    };
    Ok(Recorded { minted, workdir })
}

/// A chat turn's `workdir`: its token and the chat's latest kept
/// directory to restore (none when it is empty: no restore to pay for).
async fn workdir_dispatch(
    state: &AppState,
    chat_id: &str,
    token: tokens::Minted,
) -> Result<asbx_protocol::workdir::WorkdirDispatch, WorkspaceError> {
    let latest = crate::workdir::store::latest(state.store.pool(), chat_id).await?;
    let restore = latest
        .and_then(|s| s.manifest.filter(|_| s.restorable))
        .filter(|m| !m.entries.is_empty());
    Ok(asbx_protocol::workdir::WorkdirDispatch {
        token: token.plaintext,
        restore,
        max_entries: asbx_protocol::workdir::DEFAULT_MAX_ENTRIES,
        max_bytes: asbx_protocol::workdir::DEFAULT_MAX_BYTES,
        capture: true,
    })
}

/// A run's `workdir` when it starts from a chat's directory: restored,
/// never captured (the chat's directory is the chat's turns' alone).
fn workdir_restore_only(
    from: &WorkdirFrom,
    token: tokens::Minted,
) -> asbx_protocol::workdir::WorkdirDispatch {
    asbx_protocol::workdir::WorkdirDispatch {
        token: token.plaintext,
        restore: Some(from.manifest.clone()).filter(|m| !m.entries.is_empty()),
        max_entries: asbx_protocol::workdir::DEFAULT_MAX_ENTRIES,
        max_bytes: asbx_protocol::workdir::DEFAULT_MAX_BYTES,
        capture: false,
    }
}

/// Posts the dispatch of a run [`record`]ed and committed, to the first of
/// its runners that takes it.
pub(crate) async fn post(
    state: &AppState,
    spec: &RunSpec,
    options: &RunOptions,
    route: Route,
    recorded: Recorded,
) -> Result<Started, WorkspaceError> {
    let Route {
        candidates,
        fleet,
        runner_cap_ms,
    } = route;
    let cap_ms = tokens::runtime_cap_ms(spec.config.limits.as_ref(), runner_cap_ms);
    let audit_token = crate::audit::runner::mint(state, &spec.id, cap_ms).await?;
    let [(_, setup), (_, run), (_, upload)] = recorded.minted;
    let workdir = match (recorded.workdir, &spec.workdir_from, &spec.chat_id) {
        (Some(token), Some(from), _) => Some(workdir_restore_only(from, token)),
        (Some(token), None, Some(chat_id)) => Some(workdir_dispatch(state, chat_id, token).await?),
        _ => None,
    };
    let request = DispatchRequest {
        agent_url: agent_url(&state.config.public_url, &spec.id),
        otp_setup: setup.plaintext,
        otp_run: run.plaintext,
        otp_upload: Some(upload.plaintext),
        prompt: spec.prompt.clone(),
        protocol: Protocol::V2,
        session_id: Some(spec.id.clone()),
        filter: options.filter.clone(),
        client_tools: options.client_tools.clone(),
        // The sandbox waits this long for its relay to re-attach
        // (`runs::reattach`) or another node to take it over.
        detach_grace_ms: Some(grace_ms(state)),
        encryption: options.encryption.clone(),
        workdir,
    };
    let response = send(
        state,
        &spec.id,
        &candidates,
        fleet.as_deref(),
        &request,
        &audit_token,
    )
    .await?;
    drop(request);
    if response.status() == reqwest::StatusCode::OK {
        return Ok(Started::Streaming { response });
    }
    Ok(rejected(state, &spec.id, response).await)
}

/// The detach grace of every dispatch, in ms.
pub(crate) fn grace_ms(state: &AppState) -> u64 {
    u64::try_from(state.config.runner_detach_grace.as_millis()).unwrap_or(u64::MAX)
}

/// Posts `request` to the first of `candidates` that takes it: one that
/// can't be reached, or is full (`503`), passes it on to the next; the last
/// one's answer is the answer. A runner no longer allowed, a failure of the
/// last one, or a redirect settles the run as failed.
async fn send(
    state: &AppState,
    run_id: &str,
    candidates: &[Url],
    fleet: Option<&Fleet>,
    request: &DispatchRequest,
    audit_token: &str,
) -> Result<reqwest::Response, WorkspaceError> {
    for (i, runner) in candidates.iter().enumerate() {
        let last = i + 1 == candidates.len();
        if !state.config.is_allowed_runner(runner) {
            // Checked where the URL was given; checked again here, since
            // the operator's list may have changed since.
            let refused = WorkspaceError::SandboxUrlNotAllowed {
                field: "sandboxUrl".to_owned(),
            };
            settle(state, run_id, &failed(&refused)).await;
            return Err(refused);
        }
        if i > 0 {
            runs::set_sandbox_url(state.store.pool(), run_id, runner.as_str()).await?;
        }
        match post_request(state, runner, request, audit_token)?
            .send()
            .await
        {
            // Sent, but the answer was lost: the session may have started.
            Err(e) if !e.is_connect() && request.session_id.is_some() => {
                tracing::warn!(run = %run_id, runner = %runner, error = %crate::error::error_chain(&e), "the dispatch's connection broke; re-attaching");
                if let Some(r) =
                    crate::runs::reattach::resend(state, runner, request, audit_token).await
                {
                    return Ok(r);
                }
                let failure = WorkspaceError::Upstream(crate::error::error_chain(&e));
                settle(state, run_id, &failed(&failure)).await;
                return Err(failure);
            }
            // Refused before anything started: the next runner may take it.
            Err(e) if e.is_connect() && !last => {
                tracing::warn!(run = %run_id, runner = %runner, error = %crate::error::error_chain(&e), "runner down, trying the next");
                if let Some(f) = fleet {
                    f.mark_down(runner);
                }
            }
            Err(e) => {
                if e.is_connect()
                    && let Some(f) = fleet
                {
                    f.mark_down(runner);
                }
                let failure = WorkspaceError::Upstream(crate::error::error_chain(&e));
                settle(state, run_id, &failed(&failure)).await;
                return Err(failure);
            }
            Ok(r) if r.status().is_redirection() => {
                let failure = WorkspaceError::Upstream(format!(
                    "the runner answered {} (a redirect, not followed)",
                    r.status()
                ));
                settle(state, run_id, &failed(&failure)).await;
                return Err(failure);
            }
            Ok(r) if r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE => {
                if let Some(f) = fleet {
                    f.mark_full(runner);
                }
                if last {
                    return Ok(r);
                }
                tracing::info!(run = %run_id, runner = %runner, "runner full, trying the next");
            }
            Ok(r) => {
                if r.status() == reqwest::StatusCode::OK
                    && let Some(f) = fleet
                {
                    f.took_one(runner);
                }
                return Ok(r);
            }
        }
    }
    // Unreachable: the last candidate always leaves the loop with an answer
    // or an error; an empty list is the only way here.
    Err(WorkspaceError::Config(
        "no runner to dispatch to".to_owned(),
    ))
}

/// A runner's refusal before streaming: the run settled as failed with the
/// problem's code (`upstream_failed` when the body is none), and the answer
/// kept to pass on.
async fn rejected(state: &AppState, run_id: &str, response: reqwest::Response) -> Started {
    let status =
        StatusCode::from_u16(response.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let content_type = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok());
    let body = runner_url::read_bounded(response, runner_url::MAX_ANSWER_BYTES).await;
    let (code, message) = match serde_json::from_slice::<Problem>(&body) {
        Ok(p) => (p.code, p.detail),
        Err(_) => (
            crate::error::ProblemCode::UpstreamFailed
                .as_str()
                .to_owned(),
            format!("runner answered {status}"),
        ),
    };
    settle(state, run_id, &Outcome::Failed { code, message }).await;
    Started::Rejected {
        status,
        content_type,
        body,
    }
}

/// A run that failed with `error`: its problem's code, the error's text.
fn failed(error: &WorkspaceError) -> Outcome {
    Outcome::Failed {
        code: error.problem().code,
        message: error.to_string(),
    }
}

/// Records the outcome of a run and revokes its unused tokens: once the
/// stream is over, the sandbox is gone and nothing may call back any more.
/// Failures are logged, not returned: the client's stream is already over.
pub(crate) async fn settle(state: &AppState, run_id: &str, outcome: &Outcome) {
    settle_ended(state, run_id, outcome, None).await;
}

/// [`settle`], also recording the `session_ended` fields when known.
pub(crate) async fn settle_ended(
    state: &AppState,
    run_id: &str,
    outcome: &Outcome,
    termination: Option<&Termination>,
) {
    // A sandbox is free: the next waiter for a fair share looks again.
    state.dispatcher.fair.wake_next();
    let now = state.now_ms();
    let termination = termination.and_then(|t| serde_json::to_string(t).ok());
    if let Err(e) = runs::finish(
        state.store.pool(),
        run_id,
        outcome,
        termination.as_deref(),
        now,
    )
    .await
    {
        tracing::error!(run = run_id, error = %crate::error::error_chain(&e), "recording run outcome failed");
    }
    if let Err(e) = token_store::revoke_session(state.store.pool(), run_id, now).await {
        tracing::error!(run = run_id, error = %crate::error::error_chain(&e), "revoking run tokens failed");
    }
}

/// How long a cancelled run's last lines are awaited after the runner took
/// the cancel.
pub(crate) const CANCEL_WIND_DOWN: Duration = Duration::from_secs(10);

/// Asks the runner to end a run's session, a chat turn's included (`DELETE
/// /v1/sessions/{id}`, docs/protocol.md §4); true when it accepted, so its
/// `session_ended` line (terminated by the daemon) is on its way.
pub(crate) async fn cancel_on_runner(state: &AppState, run_id: &str) -> bool {
    // The runner that serves this run: with a fleet, not always the first
    // of `SANDBOX_URL`.
    let url = match runs::get(state.store.pool(), run_id).await {
        Ok(Some(run)) => run.sandbox_url,
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(run = run_id, error = %crate::error::error_chain(&e), "cannot read the run");
            None
        }
    };
    let Some(url) = url.or_else(|| state.config.sandbox_url.as_ref().map(|u| u.to_string())) else {
        return false;
    };
    let path = ["v1", "sessions", run_id];
    let request = match runner_request(state, reqwest::Method::DELETE, &url, &path) {
        Ok(r) => r.timeout(Duration::from_secs(5)),
        Err(e) => {
            tracing::warn!(run = run_id, error = %crate::error::error_chain(&e), "cannot ask the runner to cancel");
            return false;
        }
    };
    match request.send().await {
        Ok(r) if r.status().is_success() => true,
        Ok(r) => {
            tracing::info!(run = run_id, status = %r.status(), "the runner did not take the cancel; dropping the stream");
            false
        }
        Err(e) => {
            tracing::warn!(run = run_id, error = %crate::error::error_chain(&e), "asking the runner to cancel failed");
            false
        }
    }
}

/// `{public_url}/api/assistant/sandbox/{session_id}`.
pub(crate) fn agent_url(public_url: &Url, session_id: &str) -> String {
    format!(
        "{}/api/assistant/sandbox/{session_id}",
        public_url.as_str().trim_end_matches('/')
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_joined_without_double_slashes() {
        let base = Url::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            agent_url(&base, "abc"),
            "http://127.0.0.1:8080/api/assistant/sandbox/abc"
        );
        let base = Url::parse("http://h/prefix/").unwrap();
        assert_eq!(
            agent_url(&base, "s"),
            "http://h/prefix/api/assistant/sandbox/s"
        );
        assert_eq!(
            crate::runs::runner_http::stream_endpoint(&base)
                .unwrap()
                .as_str(),
            "http://h/prefix/stream"
        );
    }
}
