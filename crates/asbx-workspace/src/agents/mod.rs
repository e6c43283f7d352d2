//! Stored agents (the Agents block of seeds 000 and 001): validation, CRUD,
//! and the dispatch one run of an agent turns into.
//!
//! An agent is a definition (system prompt, model, skills, MCP servers, a
//! named environment, limits) kept per workspace. A run of it is an ordinary
//! run of kind `agent`: the stored environment is what `/env` returns and the
//! stored definition is what `/config` returns, and the runner's NDJSON is
//! relayed unchanged, as for `POST /api/runs`.
//!
//! `SANDBOX_URL` resolution (CONTRACT section 6): the run request's
//! `sandboxUrl`, then the agent environment's `SANDBOX_URL` variable (the
//! workflow environment), then the server's; with none the run fails before
//! anything is recorded.

use asbx_protocol::FieldError;
use asbx_protocol::callback::{ConfigResponse, EnvResponse};
use url::Url;

use crate::dispatch::{self, RunSpec};
use crate::error::WorkspaceError;
use crate::paths;
use crate::run_request::{self, check_environment, check_mcp_servers, check_script, check_skills};
use crate::state::AppState;
use crate::store::agents::{self as store, AgentRow};
use crate::store::runs::RunKind;
use crate::token;
use crate::wire::{AgentDefinition, AgentRecord, AgentRunRequest};

/// The environment variable that names an agent's runner.
pub const SANDBOX_URL_VARIABLE: &str = "SANDBOX_URL";
/// Longest agent or environment name, in characters.
pub const MAX_NAME_CHARS: usize = 200;
/// Longest description, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 64 * 1024;

/// Every problem of a definition, by field.
pub fn check_definition(d: &AgentDefinition) -> Vec<FieldError> {
    let mut errors = Vec::new();
    check_name(&d.name, "name", true, &mut errors);
    if d.description
        .as_ref()
        .is_some_and(|v| v.len() > MAX_DESCRIPTION_BYTES)
    {
        errors.push(FieldError::new(
            "description",
            format!("longer than {MAX_DESCRIPTION_BYTES} bytes"),
        ));
    }
    check_script(d.system_prompt.as_deref(), "systemPrompt", &mut errors);
    if let Some(Err(msg)) = d.model.as_deref().map(paths::check_model) {
        errors.push(FieldError::new("model", msg));
    }
    check_skills(&d.skills, "skills", &mut errors);
    check_mcp_servers(&d.mcp_servers, "mcpServers", &mut errors);
    let env = &d.environment;
    if let Some(name) = &env.name {
        check_name(name, "environment.name", false, &mut errors);
    }
    check_environment(
        &env.variables,
        env.setup_script.as_deref(),
        &env.allowed_hosts,
        "environment.",
        &mut errors,
    );
    if let Some(Err(msg)) = env
        .variables
        .get(SANDBOX_URL_VARIABLE)
        .map(|raw| dispatch::parse_sandbox_url(raw))
    {
        errors.push(FieldError::new(
            &format!("environment.variables.{SANDBOX_URL_VARIABLE}"),
            msg,
        ));
    }
    errors
}

fn check_name(name: &str, field: &str, required: bool, errors: &mut Vec<FieldError>) {
    if name.trim().is_empty() {
        if required {
            errors.push(FieldError::new(field, "must not be empty"));
        } else {
            errors.push(FieldError::new(field, "must not be blank when given"));
        }
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

fn validated(d: &AgentDefinition) -> Result<String, WorkspaceError> {
    let errors = check_definition(d);
    if !errors.is_empty() {
        return Err(WorkspaceError::invalid_fields(errors));
    }
    serde_json::to_string(d).map_err(|e| WorkspaceError::Corrupt(format!("agent: {e}")))
}

fn record(row: AgentRow) -> Result<AgentRecord, WorkspaceError> {
    let definition = serde_json::from_str(&row.definition)
        .map_err(|e| WorkspaceError::Corrupt(format!("stored agent {}: {e}", row.id)))?;
    Ok(AgentRecord {
        id: row.id,
        definition,
        created_at: row.created_at,
        updated_at: row.updated_at,
    })
}

fn not_found(id: &str) -> WorkspaceError {
    WorkspaceError::NotFound(format!("agent {id}"))
}

/// Stores a new agent in `workspace_id`.
pub async fn create(
    state: &AppState,
    workspace_id: &str,
    definition: AgentDefinition,
) -> Result<AgentRecord, WorkspaceError> {
    let json = validated(&definition)?;
    let now = state.now_ms();
    let row = AgentRow {
        id: token::random_id(),
        workspace_id: workspace_id.to_owned(),
        name: definition.name.clone(),
        definition: json,
        created_at: now,
        updated_at: now,
    };
    store::insert(state.store.pool(), &row).await?;
    record(row)
}

/// Every agent of `workspace_id`, oldest first.
pub async fn list(
    state: &AppState,
    workspace_id: &str,
) -> Result<Vec<AgentRecord>, WorkspaceError> {
    store::list(state.store.pool(), workspace_id)
        .await?
        .into_iter()
        .map(record)
        .collect()
}

/// One agent of `workspace_id`; another workspace's is not found.
pub async fn get(
    state: &AppState,
    workspace_id: &str,
    id: &str,
) -> Result<AgentRecord, WorkspaceError> {
    let row = store::get(state.store.pool(), workspace_id, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    record(row)
}

/// Replaces an agent's definition.
pub async fn update(
    state: &AppState,
    workspace_id: &str,
    id: &str,
    definition: AgentDefinition,
) -> Result<AgentRecord, WorkspaceError> {
    let json = validated(&definition)?;
    let updated = store::update(
        state.store.pool(),
        workspace_id,
        id,
        &definition.name,
        &json,
        state.now_ms(),
    )
    .await?;
    if !updated {
        return Err(not_found(id));
    }
    get(state, workspace_id, id).await
}

/// Deletes an agent: it is never found again; its runs stay.
pub async fn delete(state: &AppState, workspace_id: &str, id: &str) -> Result<(), WorkspaceError> {
    if store::delete(state.store.pool(), workspace_id, id, state.now_ms()).await? {
        Ok(())
    } else {
        Err(not_found(id))
    }
}

/// The runner of a run, first set wins: the request's, the environment's
/// `SANDBOX_URL` variable, the server's.
pub fn resolve_sandbox_url(
    request: Option<Url>,
    environment: Option<Url>,
    server: Option<&Url>,
) -> Option<Url> {
    request.or(environment).or_else(|| server.cloned())
}

/// Checks a run request and turns the agent `id` into a dispatch.
pub async fn run_spec(
    state: &AppState,
    workspace_id: &str,
    id: &str,
    request: AgentRunRequest,
) -> Result<RunSpec, WorkspaceError> {
    let agent = get(state, workspace_id, id).await?;
    let mut errors = Vec::new();
    run_request::check_prompt(&request.prompt, "prompt", &mut errors);
    let requested = match request
        .sandbox_url
        .as_deref()
        .map(dispatch::parse_sandbox_url)
    {
        Some(Ok(u)) => Some(u),
        Some(Err(msg)) => {
            errors.push(FieldError::new("sandboxUrl", msg));
            None
        }
        None => None,
    };
    if !errors.is_empty() {
        return Err(WorkspaceError::invalid_fields(errors));
    }
    let d = agent.definition;
    // Checked when stored; a value that no longer parses counts as unset.
    let from_environment = d
        .environment
        .variables
        .get(SANDBOX_URL_VARIABLE)
        .and_then(|raw| dispatch::parse_sandbox_url(raw).ok());
    let sandbox_url = resolve_sandbox_url(
        requested,
        from_environment,
        state.config.sandbox_url.as_ref(),
    )
    .ok_or_else(|| WorkspaceError::AgentSandboxUrlMissing {
        agent_id: agent.id.clone(),
    })?;
    Ok(RunSpec {
        id: token::random_id(),
        workspace_id: workspace_id.to_owned(),
        kind: RunKind::Agent,
        chat_id: None,
        agent_id: Some(agent.id),
        prompt: request.prompt,
        env: EnvResponse {
            variables: d.environment.variables,
            setup_script: d.environment.setup_script,
            allowed_hosts: d.environment.allowed_hosts,
        },
        config: ConfigResponse {
            system_prompt: d.system_prompt,
            model: d
                .model
                .unwrap_or_else(|| state.config.default_model.clone()),
            skills: d.skills,
            mcp_servers: d.mcp_servers,
            conversation: Vec::new(),
            limits: d.limits,
        },
        sandbox_url,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::AgentEnvironment;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn sandbox_url_resolution_order() {
        let (r, e, s) = (url("http://r/"), url("http://e/"), url("http://s/"));
        assert_eq!(
            resolve_sandbox_url(Some(r.clone()), Some(e.clone()), Some(&s)),
            Some(r)
        );
        assert_eq!(
            resolve_sandbox_url(None, Some(e.clone()), Some(&s)),
            Some(e)
        );
        assert_eq!(resolve_sandbox_url(None, None, Some(&s)), Some(s));
        assert_eq!(resolve_sandbox_url(None, None, None), None);
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
        assert!(check_definition(&good).is_empty());
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
        let fields: Vec<_> = check_definition(&bad)
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
