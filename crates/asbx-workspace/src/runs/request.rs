//! `POST /api/runs` bodies: validation and the dispatch they turn into.

use std::collections::{BTreeMap, BTreeSet};

use asbx_protocol::FieldError;
use asbx_protocol::callback::{ConfigResponse, EnvResponse, McpServer, Skill};
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
/// Most skills, MCP servers, or files in one skill.
pub const MAX_ITEMS: usize = 256;
/// Most bytes of all of one skill's files together.
pub const MAX_SKILL_BYTES: usize = 4 << 20;

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
    check_script(
        request.system_prompt.as_deref(),
        "systemPrompt",
        &mut errors,
    );
    check_environment(
        &request.variables,
        request.setup_script.as_deref(),
        &request.allowed_hosts,
        "",
        &mut errors,
    );
    check_skills(&request.skills, "skills", &mut errors);
    check_mcp_servers(&request.mcp_servers, "mcpServers", &mut errors);
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

/// A system prompt or setup script: at most [`MAX_SCRIPT_BYTES`].
pub fn check_script(value: Option<&str>, field: &str, errors: &mut Vec<FieldError>) {
    if value.is_some_and(|v| v.len() > MAX_SCRIPT_BYTES) {
        errors.push(FieldError::new(
            field,
            format!("longer than {MAX_SCRIPT_BYTES} bytes"),
        ));
    }
}

/// What `/env` carries: variables, setup script, allowed hosts. Field names
/// are `{prefix}variables.NAME`, `{prefix}setupScript`, `{prefix}allowedHosts[i]`.
pub fn check_environment(
    variables: &BTreeMap<String, String>,
    setup_script: Option<&str>,
    allowed_hosts: &[String],
    prefix: &str,
    errors: &mut Vec<FieldError>,
) {
    check_script(setup_script, &format!("{prefix}setupScript"), errors);
    if variables.len() > MAX_VARIABLES {
        errors.push(FieldError::new(
            &format!("{prefix}variables"),
            format!("more than {MAX_VARIABLES} variables"),
        ));
    }
    for (name, value) in variables {
        let field = format!("{prefix}variables.{name}");
        if let Err(msg) = paths::check_env_name(name) {
            errors.push(FieldError::new(&field, msg));
        }
        if value.contains('\0') {
            errors.push(FieldError::new(&field, "value must not contain NUL"));
        }
    }
    if allowed_hosts.len() > MAX_HOSTS {
        errors.push(FieldError::new(
            &format!("{prefix}allowedHosts"),
            format!("more than {MAX_HOSTS} hosts"),
        ));
    }
    for (i, host) in allowed_hosts.iter().enumerate() {
        if let Err(msg) = paths::check_host(host) {
            errors.push(FieldError::new(&format!("{prefix}allowedHosts[{i}]"), msg));
        }
    }
}

/// Skill bundles: unique names `^[A-Za-z0-9_.-]{1,64}$` (not `.` or `..`),
/// relative file paths, bounded sizes.
pub fn check_skills(skills: &[Skill], field: &str, errors: &mut Vec<FieldError>) {
    if skills.len() > MAX_ITEMS {
        errors.push(FieldError::new(
            field,
            format!("more than {MAX_ITEMS} skills"),
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, skill) in skills.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let name_ok = is_name(&skill.name, b"_.-") && skill.name != "." && skill.name != "..";
        if !name_ok {
            errors.push(FieldError::new(
                &format!("{at}.name"),
                "must match ^[A-Za-z0-9_.-]{1,64}$ and not be . or ..",
            ));
        } else if !seen.insert(skill.name.as_str()) {
            errors.push(FieldError::new(&format!("{at}.name"), "is a duplicate"));
        }
        if skill.files.len() > MAX_ITEMS {
            errors.push(FieldError::new(
                &format!("{at}.files"),
                format!("more than {MAX_ITEMS} files"),
            ));
        }
        let total: usize = skill.files.iter().map(|(p, c)| p.len() + c.len()).sum();
        if total > MAX_SKILL_BYTES {
            errors.push(FieldError::new(
                &format!("{at}.files"),
                format!("larger than {MAX_SKILL_BYTES} bytes"),
            ));
        }
        for path in skill.files.keys() {
            if let Err(msg) = paths::check_relative_path(path) {
                errors.push(FieldError::new(&format!("{at}.files.{path}"), msg));
            }
        }
    }
}

/// MCP servers: unique names `^[A-Za-z0-9_-]{1,64}$` (they are path
/// segments of the gateway), a command for stdio, an http(s) URL otherwise.
pub fn check_mcp_servers(servers: &[McpServer], field: &str, errors: &mut Vec<FieldError>) {
    if servers.len() > MAX_ITEMS {
        errors.push(FieldError::new(
            field,
            format!("more than {MAX_ITEMS} MCP servers"),
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, server) in servers.iter().enumerate() {
        let at = format!("{field}[{i}]");
        if !is_name(server.name(), b"_-") {
            errors.push(FieldError::new(
                &format!("{at}.name"),
                "must match ^[A-Za-z0-9_-]{1,64}$",
            ));
        } else if !seen.insert(server.name()) {
            errors.push(FieldError::new(&format!("{at}.name"), "is a duplicate"));
        }
        match server {
            McpServer::Stdio {
                command, args, env, ..
            } => {
                if command.trim().is_empty() {
                    errors.push(FieldError::new(
                        &format!("{at}.command"),
                        "must not be empty",
                    ));
                }
                if command.contains('\0') || args.iter().any(|a| a.contains('\0')) {
                    errors.push(FieldError::new(
                        &format!("{at}.args"),
                        "must not contain NUL",
                    ));
                }
                for (name, value) in env {
                    let f = format!("{at}.env.{name}");
                    if let Err(msg) = paths::check_env_name(name) {
                        errors.push(FieldError::new(&f, msg));
                    }
                    if value.contains('\0') {
                        errors.push(FieldError::new(&f, "value must not contain NUL"));
                    }
                }
            }
            McpServer::Http { url, .. } => {
                if let Err(msg) = dispatch::parse_sandbox_url(url) {
                    errors.push(FieldError::new(&format!("{at}.url"), msg));
                }
            }
        }
    }
}

/// 1 to 64 ASCII letters, digits, or one of `extra`.
fn is_name(name: &str, extra: &[u8]) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
}
