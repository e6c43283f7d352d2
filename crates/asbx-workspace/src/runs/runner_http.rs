//! Requests to a runner: its routes joined to its URL
//! ([`runner_url::join`]), the runner token sent to the operator's runners
//! only, and no request at all to a runner the operator does not allow
//! (any more). Used by the dispatch and by re-attaching (`runs::reattach`),
//! using neither.

use std::time::Duration;

use asbx_protocol::DispatchRequest;
use url::Url;

use crate::AppState;
use crate::error::WorkspaceError;
use crate::runner_url;

/// `POST {runner}/stream` with `request`. The runner token goes to the
/// operator's runners only: a stored agent's own SANDBOX_URL is the agent
/// author's choice, not a place the operator's secret may go.
pub(crate) fn post_request(
    state: &AppState,
    runner: &Url,
    request: &DispatchRequest,
    audit_token: &str,
) -> Result<reqwest::RequestBuilder, WorkspaceError> {
    let mut post = state
        .dispatcher
        .client
        .post(stream_endpoint(runner)?)
        .headers(crate::otel::headers())
        .header(http::header::ACCEPT, "application/x-ndjson")
        .json(request);
    if let Some(token) = &state.dispatcher.runner_token
        && state.config.is_operator_runner(runner)
    {
        post = post.bearer_auth(token);
    }
    // Likewise the audit token: only the operator's runners report into
    // the chain (a runner the agent author named is not the operator's).
    if state.config.is_operator_runner(runner) {
        post = post.header(asbx_protocol::audit::AUDIT_TOKEN_HEADER, audit_token);
    }
    Ok(post)
}

/// A request to the runner at `sandbox_url`, its route `segments` joined
/// to the URL's path ([`runner_url::join`]), with the runner token when
/// that runner is the operator's. A runner the operator does not allow
/// (any more) gets no request: `sandbox_url_not_allowed`.
pub(crate) fn runner_request(
    state: &AppState,
    method: reqwest::Method,
    sandbox_url: &str,
    segments: &[&str],
) -> Result<reqwest::RequestBuilder, WorkspaceError> {
    Ok(runner_stream_request(state, method, sandbox_url, segments)?
        .timeout(Duration::from_secs(30)))
}

/// [`runner_request`] without an overall timeout: for a stream that may
/// last as long as its session.
pub(crate) fn runner_stream_request(
    state: &AppState,
    method: reqwest::Method,
    sandbox_url: &str,
    segments: &[&str],
) -> Result<reqwest::RequestBuilder, WorkspaceError> {
    let base = Url::parse(sandbox_url)
        .map_err(|e| WorkspaceError::Corrupt(format!("stored sandbox URL: {e}")))?;
    if !state.config.is_allowed_runner(&base) {
        return Err(WorkspaceError::SandboxUrlNotAllowed {
            field: "sandboxUrl".to_owned(),
        });
    }
    let url = runner_url::join(&base, segments)
        .map_err(|e| WorkspaceError::Corrupt(format!("stored sandbox URL: {e}")))?;
    let mut req = state
        .dispatcher
        .client
        .request(method, url)
        .headers(crate::otel::headers());
    if let Some(token) = &state.dispatcher.runner_token
        && state.config.is_operator_runner(&base)
    {
        req = req.bearer_auth(token);
    }
    Ok(req)
}

/// `{sandbox_url}/stream`.
pub(crate) fn stream_endpoint(sandbox_url: &Url) -> Result<Url, WorkspaceError> {
    runner_url::join(sandbox_url, &["stream"])
        .map_err(|e| WorkspaceError::Config(format!("runner URL {sandbox_url}: {e}")))
}
