//! `POST /api/runs` bodies: checked by `validate`, turned into a dispatch.

use asbx_protocol::callback::{ConfigResponse, EnvResponse};

use crate::error::WorkspaceError;
use crate::runs::dispatch::RunSpec;
use crate::tokens;
use crate::validate;
use crate::wire::{CreateRunRequest, RunKind};

/// Checks a request field by field and turns it into a dispatch to the
/// server's runner (a request never names its runner: see
/// [`CreateRunRequest`]).
pub(crate) fn to_spec(
    request: CreateRunRequest,
    workspace_id: &str,
    default_model: &str,
    server_sandbox_url: Option<&url::Url>,
) -> Result<RunSpec, WorkspaceError> {
    let errors = validate::run_request(&request);
    if !errors.is_empty() {
        return Err(WorkspaceError::invalid_fields(errors));
    }
    let sandbox_url = server_sandbox_url
        .cloned()
        .ok_or(WorkspaceError::SandboxUrlMissing)?;
    Ok(RunSpec {
        id: tokens::random_id(),
        workspace_id: workspace_id.to_owned(),
        kind: RunKind::Run,
        chat_id: None,
        agent_id: None,
        env: EnvResponse {
            variables: request.variables,
            setup_script: request.setup_script,
            allowed_hosts: request.allowed_hosts,
        },
        config: ConfigResponse {
            system_prompt: request.system_prompt,
            model: request.model.unwrap_or_else(|| default_model.to_owned()),
            skills: request.skills,
            mcp_servers: request.mcp_servers,
            conversation: Vec::new(),
            limits: request.limits,
        },
        prompt: request.prompt,
        sandbox_url,
    })
}
