//! `POST /api/runs` bodies: validation and the dispatch they turn into.

use asbx_protocol::FieldError;
use asbx_protocol::callback::{ConfigResponse, EnvResponse};
use asbx_protocol::dispatch::MAX_PROMPT_BYTES;

use crate::dispatch::{self, RunSpec};
use crate::error::WorkspaceError;
use crate::paths;
use crate::store::runs::RunKind;
use crate::token;
use crate::wire::CreateRunRequest;

/// Longest system prompt or setup script, in bytes.
pub const MAX_SCRIPT_BYTES: usize = 1 << 20;
/// Most environment variables.
pub const MAX_VARIABLES: usize = 256;
/// Most allowed hosts.
pub const MAX_HOSTS: usize = 256;

/// Checks a request field by field and turns it into a dispatch.
pub fn to_spec(
    request: CreateRunRequest,
    workspace_id: &str,
    default_model: &str,
    server_sandbox_url: Option<&url::Url>,
) -> Result<RunSpec, WorkspaceError> {
    let mut errors = Vec::new();
    check_prompt(&request.prompt, "prompt", &mut errors);
    if let Some(Err(msg)) = request.model.as_deref().map(paths::check_model) {
        errors.push(FieldError::new("model", msg));
    }
    for (name, value) in [
        ("systemPrompt", &request.system_prompt),
        ("setupScript", &request.setup_script),
    ] {
        if value.as_ref().is_some_and(|v| v.len() > MAX_SCRIPT_BYTES) {
            errors.push(FieldError::new(
                name,
                format!("longer than {MAX_SCRIPT_BYTES} bytes"),
            ));
        }
    }
    if request.variables.len() > MAX_VARIABLES {
        errors.push(FieldError::new(
            "variables",
            format!("more than {MAX_VARIABLES} variables"),
        ));
    }
    for (name, value) in &request.variables {
        if let Err(msg) = paths::check_env_name(name) {
            errors.push(FieldError::new(&format!("variables.{name}"), msg));
        }
        if value.contains('\0') {
            errors.push(FieldError::new(
                &format!("variables.{name}"),
                "value must not contain NUL",
            ));
        }
    }
    if request.allowed_hosts.len() > MAX_HOSTS {
        errors.push(FieldError::new(
            "allowedHosts",
            format!("more than {MAX_HOSTS} hosts"),
        ));
    }
    for (i, host) in request.allowed_hosts.iter().enumerate() {
        if let Err(msg) = paths::check_host(host) {
            errors.push(FieldError::new(&format!("allowedHosts[{i}]"), msg));
        }
    }
    let sandbox_url = match request.sandbox_url.as_deref() {
        Some(raw) => match dispatch::parse_sandbox_url(raw) {
            Ok(u) => Some(u),
            Err(msg) => {
                errors.push(FieldError::new("sandboxUrl", msg));
                None
            }
        },
        None => None,
    };
    if !errors.is_empty() {
        return Err(WorkspaceError::invalid_fields(errors));
    }
    let sandbox_url = sandbox_url
        .or_else(|| server_sandbox_url.cloned())
        .ok_or(WorkspaceError::SandboxUrlMissing)?;
    Ok(RunSpec {
        id: token::random_id(),
        workspace_id: workspace_id.to_owned(),
        kind: RunKind::Run,
        chat_id: None,
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

/// A prompt: non-empty, at most [`MAX_PROMPT_BYTES`].
pub fn check_prompt(prompt: &str, field: &str, errors: &mut Vec<FieldError>) {
    if prompt.trim().is_empty() {
        errors.push(FieldError::new(field, "must not be empty"));
    } else if prompt.len() > MAX_PROMPT_BYTES {
        errors.push(FieldError::new(
            field,
            format!("longer than {MAX_PROMPT_BYTES} bytes"),
        ));
    }
}
