//! The checks request bodies share, before they are stored or dispatched:
//! stored agents, environments, chat settings, run bodies, prompts,
//! scripts, paths, MIME types, runner URLs. A feature's own parsing
//! (`runs::request`, `chats::turn`, `callbacks::writeback`, `sandbox_api`)
//! names the errors of the fields it reads itself, with the same
//! [`FieldError`].
//!
//! Rules the agent must agree with (skills, MCP servers, environment variable
//! names, egress hosts, relative paths, model names) are not written here:
//! they are `asbx_protocol::rules`, the same functions the agent applies to
//! what it receives, so a definition accepted with `201` is exactly what the
//! run installs. What is only the workspace's business (size limits of its
//! own bodies, MIME types of uploads, runner URLs, agent names) is here.
//!
//! Each check pushes [`FieldError`]s naming the field, so a `400` names
//! every problem at once.

use std::collections::BTreeMap;

use asbx_protocol::FieldError;
use asbx_protocol::dispatch::MAX_PROMPT_BYTES;
use asbx_protocol::rules::{mcp, names, skills};
use url::Url;

use crate::config::WorkspaceConfig;
use crate::error::WorkspaceError;
use crate::runner_url;
use crate::wire::{
    AgentDefinition, AgentEnvironment, AgentRunRequest, ChatSettings, CreateRunRequest,
    EnvironmentBody,
};

/// Longest system prompt or setup script, in bytes.
pub(crate) const MAX_SCRIPT_BYTES: usize = 1 << 20;
/// Most environment variables.
pub(crate) const MAX_VARIABLES: usize = 256;
/// Most allowed hosts.
pub(crate) const MAX_HOSTS: usize = 256;
/// Longest agent or environment name, in characters.
pub(crate) const MAX_NAME_CHARS: usize = 200;
/// Longest agent description, in bytes.
pub(crate) const MAX_DESCRIPTION_BYTES: usize = 64 * 1024;
/// The agent environment variable that names an agent's runner.
pub(crate) const SANDBOX_URL_VARIABLE: &str = "SANDBOX_URL";

/// `POST /api/runs`: every problem, by field.
pub(crate) fn run_request(r: &CreateRunRequest) -> Vec<FieldError> {
    let mut errors = Vec::new();
    prompt(&r.prompt, "prompt", &mut errors);
    model(r.model.as_deref(), &mut errors);
    script(r.system_prompt.as_deref(), "systemPrompt", &mut errors);
    environment(
        &r.variables,
        r.setup_script.as_deref(),
        &r.allowed_hosts,
        "",
        &mut errors,
    );
    skills::check_skills(&r.skills, "skills", &mut errors);
    mcp::check_servers(&r.mcp_servers, "mcpServers", &mut errors);
    errors
}

/// `POST /api/agents/{id}/runs`: every problem, by field.
pub(crate) fn agent_run_request(r: &AgentRunRequest) -> Vec<FieldError> {
    let mut errors = Vec::new();
    prompt(&r.prompt, "prompt", &mut errors);
    errors
}

/// A stored agent's definition: every problem, by field.
pub(crate) fn agent_definition(d: &AgentDefinition) -> Vec<FieldError> {
    let mut errors = Vec::new();
    display_name(&d.name, "name", true, &mut errors);
    if d.description
        .as_ref()
        .is_some_and(|v| v.len() > MAX_DESCRIPTION_BYTES)
    {
        errors.push(FieldError::new(
            "description",
            format!("longer than {MAX_DESCRIPTION_BYTES} bytes"),
        ));
    }
    script(d.system_prompt.as_deref(), "systemPrompt", &mut errors);
    model(d.model.as_deref(), &mut errors);
    skills::check_skills(&d.skills, "skills", &mut errors);
    mcp::check_servers(&d.mcp_servers, "mcpServers", &mut errors);
    agent_environment(&d.environment, &mut errors);
    errors
}

/// A named environment (`/api/environments`): every problem, by field.
/// `secrets` is the set the environment ends up with (the body's on `POST`;
/// the stored ones changed by the body's on `PUT`); a secret `null` in a
/// `POST` body is refused.
pub(crate) fn named_environment(
    body: &EnvironmentBody,
    secrets: &BTreeMap<String, String>,
    creating: bool,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    display_name(&body.name, "name", true, &mut errors);
    environment(
        &body.variables,
        body.setup_script.as_deref(),
        &body.allowed_hosts,
        "",
        &mut errors,
    );
    if creating {
        for (name, _) in body.secrets.iter().flatten().filter(|(_, v)| v.is_none()) {
            errors.push(FieldError::new(
                &format!("secrets.{name}"),
                "must be a string (null deletes a secret on PUT)",
            ));
        }
    }
    if body.variables.len().saturating_add(secrets.len()) > MAX_VARIABLES {
        errors.push(FieldError::new(
            "secrets",
            format!("more than {MAX_VARIABLES} variables and secrets"),
        ));
    }
    for (name, input) in body.secrets.iter().flatten() {
        let Some(crate::wire::SecretInput::Bound(b)) = input else {
            continue;
        };
        let field = format!("secrets.{name}");
        let spec = inject_spec(&b.inject);
        for (sub, msg) in asbx_protocol::rules::inject::check_binding(&spec) {
            errors.push(FieldError::new(&format!("{field}.inject.{sub}"), msg));
        }
        if let Err(msg) = asbx_protocol::rules::inject::check_value(&b.value) {
            errors.push(FieldError::new(&format!("{field}.value"), msg));
        }
    }
    for (name, value) in secrets {
        let field = format!("secrets.{name}");
        if let Err(msg) = names::check_env_name(name) {
            errors.push(FieldError::new(&field, msg));
        }
        if value.contains('\0') {
            errors.push(FieldError::new(&field, "value must not contain NUL"));
        }
        if body.variables.contains_key(name) {
            errors.push(FieldError::new(&field, "also named in variables"));
        }
    }
    errors
}

/// The protocol's form of a stored binding.
pub(crate) fn inject_spec(
    i: &crate::wire::SecretInject,
) -> asbx_protocol::rules::inject::InjectSpec {
    asbx_protocol::rules::inject::InjectSpec {
        hosts: i.hosts.clone(),
        header: i.header.clone(),
        format: i.format.clone(),
    }
}

/// A chat's settings (fields `settings.*`). Whether the model is one of
/// this workspace's ([`allowed_model`]) and the environment's existence
/// are checked by the caller.
pub(crate) fn chat_settings(s: &ChatSettings) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if let Some(Err(msg)) = s.model.as_deref().map(names::check_model) {
        errors.push(FieldError::new("settings.model", msg));
    }
    script(
        s.system_prompt.as_deref(),
        "settings.systemPrompt",
        &mut errors,
    );
    if s.environment_id.as_ref().is_some_and(|id| id.is_empty()) {
        errors.push(FieldError::new(
            "settings.environmentId",
            "must not be empty when given",
        ));
    }
    skills::check_skills(&s.skills, "settings.skills", &mut errors);
    mcp::check_servers(&s.mcp_servers, "settings.mcpServers", &mut errors);
    errors
}

fn agent_environment(env: &AgentEnvironment, errors: &mut Vec<FieldError>) {
    if let Some(name) = &env.name {
        display_name(name, "environment.name", false, errors);
    }
    environment(
        &env.variables,
        env.setup_script.as_deref(),
        &env.allowed_hosts,
        "environment.",
        errors,
    );
    if let Some(Err(msg)) = env
        .variables
        .get(SANDBOX_URL_VARIABLE)
        .map(|raw| sandbox_url(raw))
    {
        errors.push(FieldError::new(
            &format!("environment.variables.{SANDBOX_URL_VARIABLE}"),
            msg,
        ));
    }
}

/// A prompt or chat message: non-empty, at most [`MAX_PROMPT_BYTES`].
pub(crate) fn prompt(prompt: &str, field: &str, errors: &mut Vec<FieldError>) {
    if prompt.trim().is_empty() {
        errors.push(FieldError::new(field, "must not be empty"));
    } else if prompt.len() > MAX_PROMPT_BYTES {
        errors.push(FieldError::new(
            field,
            format!("longer than {MAX_PROMPT_BYTES} bytes"),
        ));
    }
}

/// `provider:model`, when given ([`names::check_model`]).
fn model(model: Option<&str>, errors: &mut Vec<FieldError>) {
    if let Some(Err(msg)) = model.map(names::check_model) {
        errors.push(FieldError::new("model", msg));
    }
}

/// A system prompt or setup script: at most [`MAX_SCRIPT_BYTES`].
fn script(value: Option<&str>, field: &str, errors: &mut Vec<FieldError>) {
    if value.is_some_and(|v| v.len() > MAX_SCRIPT_BYTES) {
        errors.push(FieldError::new(
            field,
            format!("longer than {MAX_SCRIPT_BYTES} bytes"),
        ));
    }
}

/// What `/env` carries: variables, setup script, allowed hosts. Field names
/// are `{prefix}variables.NAME`, `{prefix}setupScript`, `{prefix}allowedHosts[i]`.
fn environment(
    variables: &BTreeMap<String, String>,
    setup_script: Option<&str>,
    allowed_hosts: &[String],
    prefix: &str,
    errors: &mut Vec<FieldError>,
) {
    script(setup_script, &format!("{prefix}setupScript"), errors);
    if variables.len() > MAX_VARIABLES {
        errors.push(FieldError::new(
            &format!("{prefix}variables"),
            format!("more than {MAX_VARIABLES} variables"),
        ));
    }
    for (name, value) in variables {
        let field = format!("{prefix}variables.{name}");
        if let Err(msg) = names::check_env_name(name) {
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
        if let Err(msg) = names::check_host(host) {
            errors.push(FieldError::new(&format!("{prefix}allowedHosts[{i}]"), msg));
        }
    }
}

/// A name shown in lists: non-blank, at most [`MAX_NAME_CHARS`], no control
/// characters.
fn display_name(name: &str, field: &str, required: bool, errors: &mut Vec<FieldError>) {
    if name.trim().is_empty() {
        let msg = if required {
            "must not be empty"
        } else {
            "must not be blank when given"
        };
        errors.push(FieldError::new(field, msg));
    } else if name.chars().count() > MAX_NAME_CHARS {
        errors.push(FieldError::new(
            field,
            format!("longer than {MAX_NAME_CHARS} characters"),
        ));
    } else if name.chars().any(char::is_control) {
        errors.push(FieldError::new(
            field,
            "must not contain control characters",
        ));
    }
}

/// A file path a user uploads or a run writes back
/// ([`names::check_relative_path`], the rule the agent writes files by).
pub(crate) fn relative_path(path: &str) -> Result<(), String> {
    names::check_relative_path(path)
}

/// A MIME type `type/subtype` with optional parameters, printable ASCII.
pub(crate) fn mime_type(mime: &str) -> Result<(), String> {
    let ok = mime.len() <= 255
        && mime.bytes().all(|b| (0x20..0x7f).contains(&b))
        && mime
            .split(';')
            .next()
            .and_then(|essence| essence.trim().split_once('/'))
            .is_some_and(|(t, s)| is_token(t) && is_token(s));
    if ok {
        Ok(())
    } else {
        Err("must be a MIME type like text/plain".to_owned())
    }
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
}

/// A runner base URL: http(s) with a host. Whether the workspace may call
/// it is [`allowed_runner`]'s question.
pub(crate) fn sandbox_url(raw: &str) -> Result<Url, String> {
    let url = Url::parse(raw).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("must be an http(s) URL".to_owned());
    }
    Ok(url)
}

/// The runner URL named at `field`, when it is one the operator configured
/// (`SANDBOX_URL`, `ASBX_ALLOWED_SANDBOX_URLS`; compared as
/// [`runner_url::key`]s); anything else is `sandbox_url_not_allowed`.
pub(crate) fn allowed_runner(
    config: &WorkspaceConfig,
    field: &str,
    raw: &str,
) -> Result<Url, WorkspaceError> {
    let not_allowed = || WorkspaceError::SandboxUrlNotAllowed {
        field: field.to_owned(),
    };
    let url = runner_url::parse(raw).map_err(|_| not_allowed())?;
    if config.is_allowed_runner(&url) {
        Ok(url)
    } else {
        Err(not_allowed())
    }
}

/// The `SANDBOX_URL` of `variables` (field `{prefix}variables.SANDBOX_URL`),
/// if set: [`allowed_runner`].
pub(crate) fn allowed_runner_variable(
    config: &WorkspaceConfig,
    variables: &BTreeMap<String, String>,
    prefix: &str,
) -> Result<Option<Url>, WorkspaceError> {
    variables
        .get(SANDBOX_URL_VARIABLE)
        .map(|raw| {
            allowed_runner(
                config,
                &format!("{prefix}variables.{SANDBOX_URL_VARIABLE}"),
                raw,
            )
        })
        .transpose()
}

/// `model` (named at `field`) is one of the models the operator allows, when
/// it restricts them (`allowed`: [`WorkspaceConfig::allowed_models`], or
/// the chat list); anything else is `model_not_allowed`.
pub(crate) fn allowed_model(
    allowed: Option<Vec<String>>,
    field: &str,
    model: Option<&str>,
) -> Result<(), WorkspaceError> {
    match (allowed, model) {
        (Some(allowed), Some(m)) if !allowed.iter().any(|a| a == m) => {
            Err(WorkspaceError::ModelNotAllowed {
                field: field.to_owned(),
                model: m.to_owned(),
                allowed,
            })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mime_types() {
        for ok in [
            "text/plain",
            "application/vnd.api+json",
            "text/html; charset=utf-8",
        ] {
            assert_eq!(mime_type(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "text",
            "/plain",
            "text/",
            "te xt/plain",
            "text/plain\r\nX: y",
        ] {
            assert!(mime_type(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sandbox_urls() {
        assert!(sandbox_url("http://127.0.0.1:1").is_ok());
        for bad in ["ftp://x", "not a url", "file:///tmp"] {
            assert!(sandbox_url(bad).is_err(), "{bad}");
        }
    }

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn only_the_operators_runners_are_allowed() {
        let mut config = WorkspaceConfig::new("/nonexistent", url("http://127.0.0.1:1/"));
        config.sandbox_url = Some(url("http://runner:7879"));
        config.sandbox_urls = vec![url("http://runner:7879"), url("http://runner-2:7879/")];
        config.allowed_sandbox_urls = vec![url("https://agents.internal/base/")];
        for ok in [
            "http://runner:7879/",
            "http://RUNNER:7879",
            "http://runner-2:7879",
            "https://agents.internal:443/base",
        ] {
            assert!(allowed_runner(&config, "f", ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://runner:7879/?q=",
            "http://runner:7879/stream",
            "http://runner:7880",
            "http://x@runner:7879",
            "http://127.0.0.1:18081/admin/x?q=",
            "https://agents.internal/base/x",
            "not a url",
        ] {
            match allowed_runner(&config, "environment.variables.SANDBOX_URL", bad) {
                Err(WorkspaceError::SandboxUrlNotAllowed { field }) => {
                    assert_eq!(field, "environment.variables.SANDBOX_URL");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        // Allowed, but not the operator's: it never gets the runner token.
        assert!(config.is_operator_runner(&url("http://runner-2:7879")));
        assert!(!config.is_operator_runner(&url("https://agents.internal/base")));
    }

    #[test]
    fn a_model_is_held_to_the_list_when_there_is_one() {
        let list = || Some(vec!["openai:cheap".to_owned()]);
        assert!(allowed_model(list(), "model", Some("openai:cheap")).is_ok());
        assert!(allowed_model(list(), "model", None).is_ok());
        assert!(allowed_model(None, "model", Some("openai:any")).is_ok());
        match allowed_model(list(), "model", Some("openai:dear")) {
            Err(WorkspaceError::ModelNotAllowed { field, allowed, .. }) => {
                assert_eq!(
                    (field.as_str(), allowed),
                    ("model", vec!["openai:cheap".to_owned()])
                );
            }
            other => panic!("{other:?}"),
        }
        let mut config = WorkspaceConfig::new("/nonexistent", url("http://127.0.0.1:1/"));
        config.models = vec!["openai:cheap".to_owned()];
        config.default_model = "openai:cheap".to_owned();
        assert_eq!(config.allowed_models(), None);
        config.restrict_models = true;
        assert_eq!(config.allowed_models(), list());
    }

    #[test]
    fn a_good_definition_passes_and_a_bad_one_names_every_field() {
        let good = AgentDefinition {
            name: "triage".into(),
            model: Some("openai:gpt-4.1-mini".into()),
            environment: AgentEnvironment {
                variables: [("SANDBOX_URL".to_owned(), "http://127.0.0.1:1".to_owned())].into(),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(agent_definition(&good).is_empty());
        let bad = AgentDefinition {
            name: " ".into(),
            model: Some("x".into()),
            environment: AgentEnvironment {
                name: Some(String::new()),
                variables: [("SANDBOX_URL".to_owned(), "ftp://x".to_owned())].into(),
                ..Default::default()
            },
            ..Default::default()
        };
        let fields: Vec<_> = agent_definition(&bad)
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            [
                "name",
                "model",
                "environment.name",
                "environment.variables.SANDBOX_URL"
            ]
        );
    }
}
