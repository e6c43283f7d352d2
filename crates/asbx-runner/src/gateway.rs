//! The per-sandbox gateway: HTTP on a Unix socket mounted into the sandbox.
//!
//! It is the sandbox's only way out. It forwards
//! - `/callback/{env,config,results}` to this dispatch's `agent_url` and
//!   nowhere else, passing the agent's `Authorization` header through;
//! - `POST /model/{provider}/{path}` to that provider's base URL, adding the
//!   provider's key, so keys never enter the sandbox: only the kind's one
//!   path ([`ProviderKind::path`]) and only the model the workspace's
//!   `/config` answer named, so a sandbox can't spend the key on another;
//!   each call, and the tokens the provider's answer reports ([`tap`]), is
//!   counted for the session's stats;
//! - `/mcp/{name}` (GET, POST, DELETE) to the streamable-HTTP MCP server of
//!   that name, learned from the `/config` answer as it passes, resolved
//!   once, checked like egress (no internal address unless the operator
//!   allows it) and pinned to that address;
//! - `GET /client-tool/{callId}` (protocol 2): held open until the client
//!   answers the call through `POST /v1/sessions/{id}/tool-result`;
//! - `/workspace/{rest}` (GET, POST, PUT, DELETE) to
//!   `{agent_url}/workspace/{rest}`, the in-sandbox workspace API: the path
//!   is checked segment by segment (no `..`, no percent-encoding, so it
//!   can't leave that prefix), the agent's `Authorization` passes through,
//!   bodies stream both ways, a request body is capped at 16 MiB + 64 KiB.
//!
//! Routes come from the constants in `asbx_protocol::gateway`; everything
//! else gets 404. No forward follows a redirect.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use asbx_protocol::callback::REQUEST_ID_HEADER;
use asbx_protocol::gateway::{
    CALLBACK_CONFIG, CALLBACK_ENV, CALLBACK_RESULTS, CLIENT_TOOL_PREFIX, MCP_PREFIX, MODEL_PREFIX,
    ProviderKind, USAGE, WORKSPACE_PREFIX,
};
use asbx_protocol::{Problem, ProblemCode};
use axum::Router;
use axum::body::Body;
use axum::extract::{Extension, Path, Request};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::TryStreamExt;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use crate::config::ProviderConfig;
use crate::egress::inject::{CA_VARIABLES, Injections};
use crate::egress::{AllowList, EgressSettings, Refusal};
use crate::session::{Session, ToolAnswer, WaitError};

/// Largest body the agent may send through the gateway (results uploads).
const MAX_GATEWAY_BODY: usize = 96 << 20;
/// Largest `/env` answer the gateway reads to learn `allowed_hosts`.
const MAX_ENV_BODY: usize = 4 << 20;
/// Largest `/config` answer the gateway reads (skills travel in it).
const MAX_CONFIG_BODY: usize = 32 << 20;
/// Largest model request (the conversation so far).
const MAX_MODEL_BODY: usize = 32 << 20;
/// Largest request body to the workspace API: a bag file and some room.
const MAX_WORKSPACE_BODY: usize = asbx_protocol::rules::limits::MAX_WORKSPACE_REQUEST_BYTES;
/// Headers of the workspace API's answer passed back to the agent.
const WORKSPACE_ANSWER_HEADERS: [&str; 5] = [
    "content-type",
    "content-length",
    "x-asbx-sha256",
    "retry-after",
    "location",
];

/// Everything the gateway refuses or fails at, each with a stable code.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GatewayError {
    #[error("no such gateway route")]
    NoRoute,
    #[error("no such provider {0}")]
    UnknownProvider(String),
    #[error("provider {provider} takes only /{allowed}")]
    ModelPath {
        provider: String,
        allowed: &'static str,
    },
    #[error("this dispatch may use model {pinned} only, not {asked}")]
    ModelNotAllowed { pinned: String, asked: String },
    #[error("bad model request: {0}")]
    BadModelRequest(String),
    #[error("no such MCP server {0}")]
    UnknownMcpServer(String),
    #[error("MCP server {name}: {refusal}")]
    McpRefused { name: String, refusal: Refusal },
    #[error("the session ended before an answer")]
    SessionEnded,
    #[error("this session holds too many open client-tool calls")]
    TooManyCalls,
    #[error("bad usage report: {0}")]
    BadUsage(String),
    #[error("{0} answer too large")]
    AnswerTooLarge(&'static str),
    #[error("upstream unreachable: {0}")]
    Unreachable(String),
    #[error("invalid upstream response")]
    UpstreamInvalid,
    #[error("bad workspace path: {0}")]
    BadWorkspacePath(&'static str),
    #[error("request body over {0} bytes")]
    TooLarge(usize),
}

impl GatewayError {
    fn problem(&self) -> Problem {
        let (status, code, title) = match self {
            GatewayError::NoRoute => (404, ProblemCode::NotFound, "Not found"),
            GatewayError::UnknownProvider(_) => {
                (404, ProblemCode::UnknownProvider, "Unknown provider")
            }
            GatewayError::ModelPath { .. } => {
                (403, ProblemCode::ModelPathNotAllowed, "Path not allowed")
            }
            GatewayError::ModelNotAllowed { .. } => {
                (403, ProblemCode::ModelNotAllowed, "Model not allowed")
            }
            GatewayError::BadModelRequest(_) | GatewayError::BadUsage(_) => {
                (400, ProblemCode::InvalidRequest, "Invalid request")
            }
            GatewayError::UnknownMcpServer(_) => {
                (404, ProblemCode::UnknownMcpServer, "Unknown MCP server")
            }
            GatewayError::McpRefused { refusal, .. } => {
                let p = refusal.problem();
                return Problem::new(p.status, &p.code, &p.title, self.to_string());
            }
            GatewayError::SessionEnded => (410, ProblemCode::SessionEnded, "Session ended"),
            GatewayError::TooManyCalls => (429, ProblemCode::TooManyCalls, "Too many open calls"),
            GatewayError::AnswerTooLarge(_) | GatewayError::UpstreamInvalid => {
                (502, ProblemCode::UpstreamInvalid, "Invalid upstream answer")
            }
            GatewayError::Unreachable(_) => (
                502,
                ProblemCode::UpstreamUnreachable,
                "Upstream unreachable",
            ),
            GatewayError::BadWorkspacePath(_) => {
                (400, ProblemCode::InvalidRequest, "Invalid request")
            }
            GatewayError::TooLarge(_) => (413, ProblemCode::BodyTooLarge, "Request body too large"),
        };
        Problem::of(status, code, title, self.to_string())
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        tracing::debug!(error = %self, "gateway refused");
        crate::error::problem_response(&self.problem())
    }
}

/// An HTTP MCP server as `/config` named it: pinned to the addresses it
/// resolved to then, or refused.
#[derive(Debug)]
enum McpTarget {
    Pinned {
        url: String,
        client: reqwest::Client,
    },
    Refused(Refusal),
}

/// The model `/config` named: `provider:model`.
#[derive(Debug)]
struct PinnedModel {
    provider: String,
    model: String,
}

#[derive(Debug)]
struct GatewayState {
    session: Arc<Session>,
    agent_url: String,
    providers: Arc<Vec<ProviderConfig>>,
    client: reqwest::Client,
    allow: Arc<AllowList>,
    inject: Arc<OnceLock<Injections>>,
    ca_file: Option<CaFile>,
    egress: EgressSettings,
    /// Where model calls are reported (`crate::audit`).
    audit: Option<Arc<crate::audit::AuditLog>>,
    /// Streamable-HTTP MCP servers by name, from the `/config` answer.
    mcp: OnceLock<HashMap<String, McpTarget>>,
    model: OnceLock<PinnedModel>,
}

/// What one dispatch's gateway is given.
pub(crate) struct GatewaySpec {
    pub(crate) session: Arc<Session>,
    pub(crate) agent_url: String,
    pub(crate) providers: Arc<Vec<ProviderConfig>>,
    pub(crate) client: reqwest::Client,
    pub(crate) allow: Arc<AllowList>,
    /// The secrets bound to hosts, for the egress proxy.
    pub(crate) inject: Arc<OnceLock<Injections>>,
    /// Where the sandbox's CA bundle goes, when it has bound secrets.
    pub(crate) ca_file: Option<CaFile>,
    pub(crate) egress: EgressSettings,
    /// Where model calls are reported, when the dispatch carried an audit
    /// token.
    pub(crate) audit: Option<Arc<crate::audit::AuditLog>>,
}

/// The sandbox's CA bundle (`inject::CA_FILE` in its run folder): its path
/// on the host, and as the sandbox sees it.
#[derive(Debug, Clone)]
pub(crate) struct CaFile {
    pub(crate) host: std::path::PathBuf,
    pub(crate) sandbox: String,
}

fn state(spec: GatewaySpec) -> Arc<GatewayState> {
    Arc::new(GatewayState {
        session: spec.session,
        agent_url: spec.agent_url.trim_end_matches('/').to_owned(),
        providers: spec.providers,
        client: spec.client,
        allow: spec.allow,
        inject: spec.inject,
        ca_file: spec.ca_file,
        egress: spec.egress,
        audit: spec.audit,
        mcp: OnceLock::new(),
        model: OnceLock::new(),
    })
}

/// The gateway's routes, built once per runner process and shared by every
/// sandbox's gateway (a clone is a reference count): each connection's
/// requests carry their sandbox's [`GatewayState`] (and, with traces on,
/// the dispatch's span) as extensions. One route table per sandbox cost
/// about 7 KiB each.
fn routes() -> Router {
    static ROUTES: OnceLock<Router> = OnceLock::new();
    ROUTES
        .get_or_init(|| {
            let router = Router::new()
                .route(CALLBACK_ENV, get(callback_env))
                .route(CALLBACK_CONFIG, get(callback_config))
                .route(CALLBACK_RESULTS, post(callback_results))
                .route(
                    &format!("{MODEL_PREFIX}{{provider}}/{{*path}}"),
                    post(model),
                )
                .route(
                    &format!("{MCP_PREFIX}{{name}}"),
                    get(mcp).post(mcp).delete(mcp),
                )
                .route(
                    &format!("{CLIENT_TOOL_PREFIX}{{call_id}}"),
                    get(client_tool),
                )
                .route(USAGE, post(usage))
                .route(
                    &format!("{WORKSPACE_PREFIX}{{*rest}}"),
                    get(workspace)
                        .post(workspace)
                        .put(workspace)
                        .delete(workspace),
                )
                .fallback(|| async { GatewayError::NoRoute });
            // Traces on: each request a span under its dispatch's.
            if crate::otel::enabled() {
                return router.layer(axum::middleware::from_fn(crate::otel::gateway));
            }
            router
        })
        .clone()
}

/// Serves the gateway on `listener` until `stop` is cancelled; with traces
/// on, each request is a span under `trace`, the dispatch's.
pub(crate) fn spawn(
    listener: UnixListener,
    spec: GatewaySpec,
    stop: CancellationToken,
    trace: tracing::Span,
) {
    let state = state(spec);
    let app = tower::ServiceBuilder::new()
        .map_request(move |mut req: Request| {
            req.extensions_mut().insert(Arc::clone(&state));
            req.extensions_mut().insert(trace.clone());
            req
        })
        .service(routes());
    tokio::spawn(async move {
        let listener = crate::limit::LimitedListener::new(listener, crate::limit::MAX_CONNECTIONS);
        let serve = axum::serve(listener, axum::ServiceExt::into_make_service(app))
            .with_graceful_shutdown(stop.cancelled_owned());
        if let Err(e) = serve.await {
            tracing::warn!(error = %e, "gateway stopped");
        }
    });
}

/// Relays `/env` and keeps its `allowed_hosts` for the egress proxy: the list
/// comes from the workspace's answer, never from the sandbox.
///
/// The answer's runner-only `injected_secrets` (docs/protocol.md §3) go to
/// the egress proxy and are removed before the agent sees the answer; with
/// any, the sandbox's CA bundle is written and named by the usual
/// variables. An answer that names them and can't be rewritten is not
/// passed on (fails closed).
async fn callback_env(Extension(s): Extension<Arc<GatewayState>>, req: Request) -> Response {
    let res = forward_callback(&s, CALLBACK_ENV, req).await;
    if !res.status().is_success() {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_ENV_BODY).await else {
        return GatewayError::AnswerTooLarge("/env").into_response();
    };
    // Without the field's name (nor an escape that could spell it), the
    // answer passes as it came.
    if memchr::memmem::find(&bytes, b"injected_secrets").is_none()
        && memchr::memmem::find(&bytes, b"\\u").is_none()
    {
        if let Ok(env) = serde_json::from_slice::<asbx_protocol::callback::EnvResponse>(&bytes) {
            s.allow.set(env.allowed_hosts);
        }
        return Response::from_parts(parts, Body::from(bytes));
    }
    // As a map, so fields this runner doesn't know pass unchanged.
    let Ok(mut env) = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes)
    else {
        return GatewayError::UpstreamInvalid.into_response();
    };
    let secrets: Vec<asbx_protocol::callback::InjectedSecret> = match env
        .remove("injected_secrets")
        .map(serde_json::from_value)
        .transpose()
    {
        Ok(list) => list.unwrap_or_default(),
        Err(_) => return GatewayError::UpstreamInvalid.into_response(),
    };
    let mut hosts: Vec<String> = env
        .get("allowed_hosts")
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    match bind_secrets(&s, &secrets, &mut env) {
        Ok(Some(inj)) => {
            // A bound host is also an allowed host.
            for h in inj.hosts() {
                if !hosts.iter().any(|x| x == h) {
                    hosts.push(h.to_owned());
                }
            }
            let _ = s.inject.set(inj);
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(error = %e, "could not set up secrets at the egress proxy");
            return GatewayError::Unreachable("egress secrets: could not set up".into())
                .into_response();
        }
    }
    s.allow.set(hosts);
    drop(secrets);
    let Ok(out) = serde_json::to_vec(&env) else {
        return GatewayError::UpstreamInvalid.into_response();
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(out))
}

/// The bindings of `secrets` and this sandbox's CA; writes its bundle and
/// points the CA variables of `env` at it.
fn bind_secrets(
    s: &GatewayState,
    secrets: &[asbx_protocol::callback::InjectedSecret],
    env: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<Option<Injections>, String> {
    let Some(inj) = Injections::new(secrets)? else {
        return Ok(None);
    };
    let Some(ca) = &s.ca_file else {
        return Err("no run folder for the CA bundle".to_owned());
    };
    let tls = s.egress.upstream_tls()?;
    write_ca_bundle(&ca.host, &tls.bundle(inj.ca_pem()))?;
    let vars = env
        .entry("variables")
        .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
    let serde_json::Value::Object(vars) = vars else {
        return Err("variables is not an object".to_owned());
    };
    for k in CA_VARIABLES {
        vars.insert(k.to_owned(), serde_json::Value::String(ca.sandbox.clone()));
    }
    Ok(Some(inj))
}

/// Writes the CA bundle, readable by every uid of the sandbox (it holds no
/// secret: certificates only).
fn write_ca_bundle(path: &std::path::Path, pem: &[u8]) -> Result<(), String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(pem)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Relays `/config`; keeps the model it names and pins the URLs of its
/// streamable-HTTP MCP servers, which the sandbox then reaches by name only.
async fn callback_config(Extension(s): Extension<Arc<GatewayState>>, req: Request) -> Response {
    let res = forward_callback(&s, CALLBACK_CONFIG, req).await;
    if !res.status().is_success() {
        return res;
    }
    let (parts, body) = res.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_CONFIG_BODY).await else {
        return GatewayError::AnswerTooLarge("/config").into_response();
    };
    let cfg = serde_json::from_slice::<asbx_protocol::callback::ConfigResponse>(&bytes);
    // The session's effective limits are known from here (`session_init`).
    s.session
        .set_run_limits(cfg.as_ref().ok().and_then(|c| c.limits));
    if let Ok(cfg) = cfg {
        if let Some((provider, model)) = cfg.model.split_once(':') {
            let _ = s.model.set(PinnedModel {
                provider: provider.to_owned(),
                model: model.to_owned(),
            });
        }
        let mut servers = HashMap::new();
        for m in cfg.mcp_servers {
            if let asbx_protocol::callback::McpServer::Http { name, url } = m {
                let target = pin_mcp(&s, &url).await;
                servers.insert(name, target);
            }
        }
        let _ = s.mcp.set(servers);
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// Resolves an MCP server's host once, checks every address like egress
/// does, and returns a client that connects to those addresses only.
async fn pin_mcp(s: &GatewayState, raw: &str) -> McpTarget {
    let url = match url::Url::parse(raw) {
        Ok(u) if matches!(u.scheme(), "http" | "https") => u,
        _ => return McpTarget::Refused(Refusal::Bad("MCP URL is not http(s)".into())),
    };
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
        return McpTarget::Refused(Refusal::Bad("MCP URL has no host".into()));
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let addrs = match s.egress.resolve_checked(&host, port).await {
        Ok(a) => a,
        Err(refusal) => return McpTarget::Refused(refusal),
    };
    let mut builder = reqwest::Client::builder()
        .connect_timeout(s.egress.connect_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy();
    if host.parse::<std::net::IpAddr>().is_err() {
        builder = builder.resolve_to_addrs(&host, &addrs);
    }
    match builder.build() {
        Ok(client) => McpTarget::Pinned {
            url: url.into(),
            client,
        },
        Err(e) => McpTarget::Refused(Refusal::Connect(host, e.to_string())),
    }
}

/// Protocol 2: the agent waits here for the client's answer to a call it
/// announced with a `tool_call` line.
async fn client_tool(
    Extension(s): Extension<Arc<GatewayState>>,
    Path(call_id): Path<String>,
) -> Result<Response, GatewayError> {
    match s.session.wait_call(&call_id).await {
        Ok(ToolAnswer::Result(v)) => {
            Ok(axum::Json(serde_json::json!({ "result": v })).into_response())
        }
        Ok(ToolAnswer::Error(e)) => {
            Ok(axum::Json(serde_json::json!({ "error": e })).into_response())
        }
        Err(WaitError::Ended) => Err(GatewayError::SessionEnded),
        Err(WaitError::TooManyCalls) => Err(GatewayError::TooManyCalls),
    }
}

/// The agent's token counts, kept for the session's stats (beside the
/// gateway's own, [`Session::stats_usage`]). The token metrics count what
/// the gateway read in the providers' answers ([`tap`]), not this report.
async fn usage(
    Extension(s): Extension<Arc<GatewayState>>,
    body: axum::body::Bytes,
) -> Result<StatusCode, GatewayError> {
    let u = serde_json::from_slice::<asbx_protocol::gateway::Usage>(&body)
        .map_err(|e| GatewayError::BadUsage(e.to_string()))?;
    s.session.set_usage(u);
    Ok(StatusCode::NO_CONTENT)
}

/// Forwards one streamable-HTTP MCP request to the named server.
async fn mcp(
    Extension(s): Extension<Arc<GatewayState>>,
    Path(name): Path<String>,
    req: Request,
) -> Result<Response, GatewayError> {
    let (url, client) = match s.mcp.get().and_then(|m| m.get(&name)) {
        None => return Err(GatewayError::UnknownMcpServer(name)),
        Some(McpTarget::Refused(refusal)) => {
            tracing::warn!(server = %name, %refusal, "MCP server refused");
            return Err(GatewayError::McpRefused {
                name,
                refusal: refusal.clone(),
            });
        }
        Some(McpTarget::Pinned { url, client }) => (url.clone(), client.clone()),
    };
    let mut headers = HeaderMap::new();
    for h in [
        header::CONTENT_TYPE.as_str(),
        header::ACCEPT.as_str(),
        "mcp-session-id",
        "mcp-protocol-version",
        "last-event-id",
    ] {
        if let (Some(v), Ok(n)) = (
            req.headers().get(h),
            header::HeaderName::from_bytes(h.as_bytes()),
        ) {
            headers.insert(n, v.clone());
        }
    }
    forward(&client, req.method().clone(), url, headers, req.into_body()).await
}

async fn callback_results(Extension(s): Extension<Arc<GatewayState>>, req: Request) -> Response {
    forward_callback(&s, CALLBACK_RESULTS, req).await
}

/// Forwards to this dispatch's own `agent_url` and nowhere else, with a
/// fresh request id ([`REQUEST_ID_HEADER`]): one per callback the agent
/// makes, the same on its retry, never one of the sandbox's.
async fn forward_callback(s: &GatewayState, route: &str, req: Request) -> Response {
    let name = route.rsplit('/').next().unwrap_or(route);
    let url = format!("{}/{name}", s.agent_url);
    let mut headers = HeaderMap::new();
    for h in [header::AUTHORIZATION, header::CONTENT_TYPE, header::ACCEPT] {
        if let Some(v) = req.headers().get(&h) {
            headers.insert(h, v.clone());
        }
    }
    if let Ok(id) = HeaderValue::from_str(&hex::encode(rand::random::<[u8; 16]>())) {
        headers.insert(REQUEST_ID_HEADER, id);
    }
    if route == CALLBACK_ENV {
        // This gateway removes `injected_secrets` before the agent sees them.
        headers.insert(
            asbx_protocol::gateway::STRIPS_INJECTED_SECRETS,
            HeaderValue::from_static("1"),
        );
    }
    // The workspace's handler joins the dispatch's trace.
    crate::otel::inject(&mut headers);
    let method = req.method().clone();
    if method != Method::GET {
        return forward(&s.client, method, url, headers, req.into_body())
            .await
            .unwrap_or_else(IntoResponse::into_response);
    }
    // `/env` and `/config` carry no body, so one whose connection was lost
    // before its whole answer came (none sent, or the answer broken off) is
    // tried once more: behind a load balancer the node that took it may have
    // died mid-request, and another node answers. If that node had already
    // redeemed the token, the workspace knows the retry by its request id
    // and answers it once more (docs/protocol.md §3).
    match get_whole(s, url.clone(), headers.clone()).await {
        Err(GatewayError::Unreachable(first)) => {
            tracing::info!(route, error = %first, "callback could not reach the workspace; trying once more");
            tokio::time::sleep(CALLBACK_RETRY_AFTER).await;
            get_whole(s, url, headers)
                .await
                .unwrap_or_else(IntoResponse::into_response)
        }
        answered => answered.unwrap_or_else(IntoResponse::into_response),
    }
}

/// `GET url` with its whole answer read (at most [`MAX_CONFIG_BODY`], the
/// largest callback answer): an answer that broke off is
/// [`GatewayError::Unreachable`], like a request that got none.
async fn get_whole(
    s: &GatewayState,
    url: String,
    headers: HeaderMap,
) -> Result<Response, GatewayError> {
    let res = forward(&s.client, Method::GET, url, headers, Body::empty()).await?;
    let (parts, body) = res.into_parts();
    match axum::body::to_bytes(body, MAX_CONFIG_BODY).await {
        Ok(bytes) => Ok(Response::from_parts(parts, Body::from(bytes))),
        Err(e)
            if std::error::Error::source(&e)
                .is_some_and(|src| src.is::<http_body_util::LengthLimitError>()) =>
        {
            Err(GatewayError::AnswerTooLarge("callback"))
        }
        Err(e) => Err(GatewayError::Unreachable(format!("answer broke off: {e}"))),
    }
}

/// The pause before a callback's second try.
const CALLBACK_RETRY_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

/// `{agent_url}/workspace/{rest}?{query}` for a request to
/// `/workspace/{rest}?{query}`, or why not. Only the raw path counts (an
/// absolute-form request's authority is ignored); each segment of `rest`
/// is unreserved characters only (`[A-Za-z0-9._~-]`, no `%`, not `.` or
/// `..`), so neither a dot segment nor its encoding can climb out of the
/// prefix once the workspace decodes the path.
fn workspace_url(agent_url: &str, uri: &http::Uri) -> Result<String, GatewayError> {
    let rest = uri
        .path()
        .strip_prefix(WORKSPACE_PREFIX)
        .ok_or(GatewayError::NoRoute)?;
    for seg in rest.split('/') {
        if seg.is_empty() {
            return Err(GatewayError::BadWorkspacePath("empty segment"));
        }
        if seg == "." || seg == ".." {
            return Err(GatewayError::BadWorkspacePath("dot segment"));
        }
        if !seg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
        {
            return Err(GatewayError::BadWorkspacePath(
                "segments take [A-Za-z0-9._~-] only",
            ));
        }
    }
    let mut url = format!("{agent_url}{WORKSPACE_PREFIX}{rest}");
    if let Some(q) = uri.query() {
        url.push('?');
        url.push_str(q);
    }
    Ok(url)
}

/// The in-sandbox workspace API: forwarded to this dispatch's `agent_url`
/// with the agent's own bearer, nothing added; bodies streamed both ways.
async fn workspace(
    Extension(s): Extension<Arc<GatewayState>>,
    req: Request,
) -> Result<Response, GatewayError> {
    let url = workspace_url(&s.agent_url, req.uri())?;
    let method = req.method().clone();
    let mut headers = HeaderMap::new();
    for h in [
        header::AUTHORIZATION,
        header::CONTENT_TYPE,
        header::CONTENT_LENGTH,
        header::ACCEPT,
    ] {
        if let Some(v) = req.headers().get(&h) {
            headers.insert(h, v.clone());
        }
    }
    crate::otel::inject(&mut headers);
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_WORKSPACE_BODY as u64) {
        return Err(GatewayError::TooLarge(MAX_WORKSPACE_BODY));
    }
    let over = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = Arc::clone(&over);
    let limited = http_body_util::Limited::new(req.into_body(), MAX_WORKSPACE_BODY);
    let stream = http_body_util::BodyDataStream::new(limited).map_err(move |e| {
        if e.is::<http_body_util::LengthLimitError>() {
            flag.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        std::io::Error::other(e)
    });
    let sent = s
        .client
        .request(method, &url)
        .headers(headers)
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await;
    let too_large = || over.load(std::sync::atomic::Ordering::Relaxed);
    let upstream = match sent {
        Ok(_) | Err(_) if too_large() => return Err(GatewayError::TooLarge(MAX_WORKSPACE_BODY)),
        Ok(u) => u,
        Err(e) => {
            tracing::debug!(error = %e, "workspace API unreachable");
            return Err(GatewayError::Unreachable(e.to_string()));
        }
    };
    let mut res = Response::builder().status(upstream.status().as_u16());
    for name in WORKSPACE_ANSWER_HEADERS {
        if let Some(v) = upstream.headers().get(name) {
            res = res.header(name, v.as_bytes());
        }
    }
    let body = Body::from_stream(upstream.bytes_stream().map_err(std::io::Error::other));
    res.body(body).map_err(|_| GatewayError::UpstreamInvalid)
}

#[derive(serde::Deserialize)]
struct ModelField<'a> {
    #[serde(borrow)]
    model: std::borrow::Cow<'a, str>,
}

async fn model(
    Extension(s): Extension<Arc<GatewayState>>,
    Path((provider, path)): Path<(String, String)>,
    req: Request,
) -> Result<Response, GatewayError> {
    let Some(p) = s.providers.iter().find(|p| p.name == provider) else {
        return Err(GatewayError::UnknownProvider(provider));
    };
    if path != p.kind.path() {
        return Err(GatewayError::ModelPath {
            provider,
            allowed: p.kind.path(),
        });
    }
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, MAX_MODEL_BODY)
        .await
        .map_err(|e| GatewayError::BadModelRequest(e.to_string()))?;
    let asked = serde_json::from_slice::<ModelField<'_>>(&body)
        .map_err(|e| GatewayError::BadModelRequest(e.to_string()))?
        .model;
    match s.model.get() {
        Some(pin) if pin.provider == provider && pin.model == asked => {}
        pin => {
            return Err(GatewayError::ModelNotAllowed {
                pinned: pin
                    .map(|m| format!("{}:{}", m.provider, m.model))
                    .unwrap_or_else(|| "(none: /config has not passed)".into()),
                asked: format!("{provider}:{}", asked.chars().take(128).collect::<String>()),
            });
        }
    }
    crate::metrics::METRICS.model_call(&provider);
    s.session.count_model_call();
    let url = format!("{}/{path}", p.base_url.trim_end_matches('/'));
    let mut headers = HeaderMap::new();
    for h in [header::CONTENT_TYPE, header::ACCEPT] {
        if let Some(v) = parts.headers.get(&h) {
            headers.insert(h, v.clone());
        }
    }
    // Anthropic's version and beta headers are chosen by the agent; nothing
    // else from the sandbox is passed on, above all no credentials.
    for h in ["anthropic-version", "anthropic-beta"] {
        if let Some(v) = parts.headers.get(h) {
            headers.insert(h, v.clone());
        }
    }
    match (p.kind, &p.api_key) {
        (ProviderKind::Openai, Some(key)) => {
            if let Ok(v) = HeaderValue::from_str(&format!("Bearer {key}")) {
                headers.insert(header::AUTHORIZATION, v);
            }
        }
        (ProviderKind::Anthropic, Some(key)) => {
            if let Ok(v) = HeaderValue::from_str(key) {
                headers.insert("x-api-key", v);
            }
            headers
                .entry("anthropic-version")
                .or_insert(HeaderValue::from_static("2023-06-01"));
        }
        (_, None) => {}
    }
    let asked = asked.into_owned();
    let res = match forward(&s.client, Method::POST, url, headers, Body::from(body)).await {
        Ok(res) => res,
        Err(e) => {
            if let Some(log) = &s.audit {
                log.push(asbx_protocol::audit::AuditEvent::ModelCall {
                    provider,
                    model: asked,
                    input_tokens: None,
                    output_tokens: None,
                    status: 0,
                });
            }
            return Err(e);
        }
    };
    let audit = s.audit.as_ref().map(|log| {
        let status = res.status().as_u16();
        (Arc::clone(log), asked, status)
    });
    Ok(count_tokens(res, &s.session, provider, audit))
}

/// The model's answer, its tokens counted on the way ([`tap`]).
fn count_tokens(
    res: Response,
    session: &Arc<Session>,
    provider: String,
    audit: Option<(Arc<crate::audit::AuditLog>, String, u16)>,
) -> Response {
    let content_type = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let counter = tap::Counter {
        session: Arc::clone(session),
        provider,
        audit,
    };
    let reader = tap::UsageReader::new(content_type.as_deref(), counter);
    let (parts, body) = res.into_parts();
    let body = Body::from_stream(tap::Tapped::new(body.into_data_stream(), reader));
    Response::from_parts(parts, body)
}

async fn forward(
    client: &reqwest::Client,
    method: Method,
    url: String,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, GatewayError> {
    let limited = http_body_util::Limited::new(body, MAX_GATEWAY_BODY);
    let stream = http_body_util::BodyDataStream::new(limited);
    let upstream = client
        .request(method, &url)
        .headers(headers)
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .map_err(|e| {
            tracing::debug!(%url, error = %e, "gateway upstream failed");
            GatewayError::Unreachable(e.to_string())
        })?;
    let status = upstream.status();
    let mut res = Response::builder().status(status.as_u16());
    for name in [
        header::CONTENT_TYPE.as_str(),
        header::RETRY_AFTER.as_str(),
        "mcp-session-id",
    ] {
        if let Some(v) = upstream.headers().get(name) {
            res = res.header(name, v.as_bytes());
        }
    }
    let body = Body::from_stream(upstream.bytes_stream().map_err(std::io::Error::other));
    res.body(body).map_err(|_| GatewayError::UpstreamInvalid)
}

mod tap;
#[cfg(test)]
mod tests;
