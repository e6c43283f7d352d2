//! Stored agents (the Agents block, docs/protocol.md §7): validation, CRUD,
//! and the dispatch one run of an agent turns into.
//!
//! An agent is a definition (system prompt, model, skills, MCP servers, a
//! named environment, limits) kept per workspace. A run of it is an ordinary
//! run of kind `agent`: the stored environment is what `/env` returns and the
//! stored definition is what `/config` returns, and the runner's NDJSON is
//! relayed unchanged, as for `POST /api/runs`.
//!
//! `environmentId` names a stored environment (`crate::environments`): its
//! values go into `/env` under the definition's own `environment`.
//!
//! `SANDBOX_URL` resolution (docs/protocol.md §7): the agent environment's
//! `SANDBOX_URL` variable (the workflow environment), then the server's;
//! with none the run fails before anything is recorded. A run request
//! cannot name a runner (issue 13, item 2: see `wire::CreateRunRequest`).
//! The agent's runner and model must be ones the operator allows
//! (`SANDBOX_URL`, `ASBX_ALLOWED_SANDBOX_URLS`; `ASBX_MODELS`): checked
//! when the agent is stored and again at each run.

pub(crate) mod api;
pub(crate) mod store;

use asbx_protocol::FieldError;
use asbx_protocol::callback::{ConfigResponse, McpServer};
use url::Url;

use crate::AppState;
use crate::agents::store::{self as agent_store, AgentRow};
use crate::environments;
use crate::error::WorkspaceError;
use crate::runs::dispatch::RunSpec;
use crate::secrets;
use crate::tokens;
use crate::validate;
use crate::wire::{AgentDefinition, AgentRecord, AgentRunRequest, RunKind};

/// Checks a definition, its `environmentId` against the workspace's
/// environments; the definition as stored, its stdio MCP servers' `env`
/// values sealed (a masked one keeps the value of `stored`'s server).
async fn validated(
    state: &AppState,
    workspace_id: &str,
    d: &mut AgentDefinition,
    stored: &[McpServer],
) -> Result<String, WorkspaceError> {
    let mut errors = validate::agent_definition(d);
    if let Some(id) = &d.environment_id
        && environments::find(state, workspace_id, id)
            .await?
            .is_none_or(|e| e.id != *id)
    {
        errors.push(FieldError::new(
            "environmentId",
            "no such environment in this workspace",
        ));
    }
    if errors.is_empty() {
        errors = state
            .sealer
            .seal_servers(&mut d.mcp_servers, stored, "mcpServers");
    }
    if !errors.is_empty() {
        return Err(WorkspaceError::invalid_fields(errors));
    }
    allowed(state, d)?;
    serde_json::to_string(d).map_err(|e| WorkspaceError::Corrupt(format!("agent: {e}")))
}

/// The definition's model and runner (its environment's `SANDBOX_URL`) are
/// ones the operator allows; the runner, when it names one. Checked when
/// the agent is stored and again at each run: the lists may have changed.
fn allowed(state: &AppState, d: &AgentDefinition) -> Result<Option<Url>, WorkspaceError> {
    validate::allowed_model(state.config.allowed_models(), "model", d.model.as_deref())?;
    validate::allowed_runner_variable(&state.config, &d.environment.variables, "environment.")
}

/// A record as answered: stdio MCP `env` values masked.
fn masked(mut record: AgentRecord) -> AgentRecord {
    secrets::mask_servers(&mut record.definition.mcp_servers);
    record
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
pub(crate) async fn create(
    state: &AppState,
    workspace_id: &str,
    mut definition: AgentDefinition,
) -> Result<AgentRecord, WorkspaceError> {
    let json = validated(state, workspace_id, &mut definition, &[]).await?;
    let now = state.now_ms();
    let row = AgentRow {
        id: tokens::random_id(),
        workspace_id: workspace_id.to_owned(),
        name: definition.name.clone(),
        definition: json,
        created_at: now,
        updated_at: now,
    };
    agent_store::insert(state.store.pool(), &row).await?;
    record(row).map(masked)
}

/// Every agent of `workspace_id`, oldest first.
pub(crate) async fn list(
    state: &AppState,
    workspace_id: &str,
) -> Result<Vec<AgentRecord>, WorkspaceError> {
    agent_store::list(state.store.pool(), workspace_id)
        .await?
        .into_iter()
        .map(|row| record(row).map(masked))
        .collect()
}

/// One agent of `workspace_id` as answered; another workspace's is not
/// found.
pub(crate) async fn get(
    state: &AppState,
    workspace_id: &str,
    id: &str,
) -> Result<AgentRecord, WorkspaceError> {
    stored(state, workspace_id, id).await.map(masked)
}

/// One agent of `workspace_id` as stored (secrets sealed).
async fn stored(
    state: &AppState,
    workspace_id: &str,
    id: &str,
) -> Result<AgentRecord, WorkspaceError> {
    let row = agent_store::get(state.store.pool(), workspace_id, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    record(row)
}

/// Replaces an agent's definition.
pub(crate) async fn update(
    state: &AppState,
    workspace_id: &str,
    id: &str,
    mut definition: AgentDefinition,
) -> Result<AgentRecord, WorkspaceError> {
    let old = stored(state, workspace_id, id).await?;
    let json = validated(
        state,
        workspace_id,
        &mut definition,
        &old.definition.mcp_servers,
    )
    .await?;
    let updated = agent_store::update(
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
pub(crate) async fn delete(
    state: &AppState,
    workspace_id: &str,
    id: &str,
) -> Result<(), WorkspaceError> {
    if agent_store::delete(state.store.pool(), workspace_id, id, state.now_ms()).await? {
        Ok(())
    } else {
        Err(not_found(id))
    }
}

/// Seals what is clear and reseals what an older key sealed in every
/// agent's stdio MCP servers' `env` (deleted agents too); how many changed.
pub(crate) async fn reseal_all(state: &AppState) -> Result<u64, WorkspaceError> {
    let mut changed = 0;
    for (id, text) in agent_store::definitions_with_env(state.store.pool()).await? {
        let mut d: AgentDefinition = serde_json::from_str(&text)
            .map_err(|e| WorkspaceError::Corrupt(format!("stored agent {id}: {e}")))?;
        if !state.sealer.reseal_servers(&mut d.mcp_servers)? {
            continue;
        }
        let new = serde_json::to_string(&d)
            .map_err(|e| WorkspaceError::Corrupt(format!("agent: {e}")))?;
        if agent_store::replace_definition(state.store.pool(), &id, &text, &new).await? {
            changed += 1;
        }
    }
    Ok(changed)
}

/// The runner of a run, first set wins (CONTRACT §6): the block's
/// `sandboxUrl`, the agent environment's `SANDBOX_URL` variable, the
/// server's.
fn resolve_sandbox_url(
    block: Option<Url>,
    environment: Option<Url>,
    server: Option<&Url>,
) -> Option<Url> {
    block.or(environment).or_else(|| server.cloned())
}

/// Checks a run request and turns the agent `id` into a dispatch.
pub(crate) async fn run_spec(
    state: &AppState,
    workspace_id: &str,
    id: &str,
    request: AgentRunRequest,
) -> Result<RunSpec, WorkspaceError> {
    let agent = stored(state, workspace_id, id).await?;
    let errors = validate::agent_run_request(&request);
    if !errors.is_empty() {
        return Err(WorkspaceError::invalid_fields(errors));
    }
    let d = agent.definition;
    let from_environment = allowed(state, &d)?;
    let block = request
        .sandbox_url
        .as_deref()
        .map(|raw| validate::allowed_runner(&state.config, "sandboxUrl", raw))
        .transpose()?;
    let sandbox_url =
        resolve_sandbox_url(block, from_environment, state.config.sandbox_url.as_ref())
            .ok_or_else(|| WorkspaceError::AgentSandboxUrlMissing {
                agent_id: agent.id.clone(),
            })?;
    // A deleted environment fails the run (409), not silently runs without.
    let named = match &d.environment_id {
        Some(id) => {
            let env =
                environments::referenced(state, workspace_id, id, &format!("agent {}", agent.id))
                    .await?;
            environments::check_merged(&env, &d.environment.variables).map_err(|msg| {
                WorkspaceError::invalid_fields(vec![FieldError::new("environmentId", msg)])
            })?;
            Some(env)
        }
        None => None,
    };
    let (env, secrets) = environments::merged_env(
        named,
        d.environment.variables,
        d.environment.setup_script,
        d.environment.allowed_hosts,
    );
    Ok(RunSpec {
        id: tokens::random_id(),
        workspace_id: workspace_id.to_owned(),
        kind: RunKind::Agent,
        chat_id: None,
        agent_id: Some(agent.id),
        prompt: request.prompt,
        env,
        secrets,
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
        workdir_from: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn sandbox_url_resolution_order() {
        let (b, e, s) = (url("http://b/"), url("http://e/"), url("http://s/"));
        assert_eq!(
            resolve_sandbox_url(Some(b.clone()), Some(e.clone()), Some(&s)),
            Some(b)
        );
        assert_eq!(
            resolve_sandbox_url(None, Some(e.clone()), Some(&s)),
            Some(e)
        );
        assert_eq!(resolve_sandbox_url(None, None, Some(&s)), Some(s));
        assert_eq!(resolve_sandbox_url(None, None, None), None);
    }
}
