//! Named environments and per-chat settings (docs/api-environments.md).
//!
//! An environment is what a run's `/env` carries (variables, secrets, a
//! setup script, allowed hosts), stored once per workspace and picked by a
//! run (`"environment"`), a stored agent (`"environmentId"`) or a chat's
//! settings. Secret values are write-only: no response, log line or page
//! carries them; they reach a sandbox only through `/env` (docs/protocol.md
//! §3), as variables. A secret bound to hosts (`inject`) never reaches the
//! sandbox: its variable holds the placeholder `asbx-secret:NAME` and the
//! value travels in `/env`'s runner-only `injected_secrets`, which the
//! runner's gateway strips before the agent sees the answer (sent only
//! when the gateway says it does so).
//!
//! A chat's settings (model, system prompt, environment, skills, MCP
//! servers) are stored on the chat and turned into each turn's `/env` and
//! `/config` by [`chat_run`].
//!
//! This module uses no other feature: runs, agents and chats use it.

pub(crate) mod api;
pub(crate) mod store;

use std::collections::{BTreeMap, BTreeSet};

use asbx_protocol::FieldError;
use asbx_protocol::callback::{ConfigResponse, EnvResponse};

use crate::AppState;
use crate::config::WorkspaceConfig;
use crate::environments::store::{self as env_store, EnvironmentRow};
use crate::error::WorkspaceError;
use crate::secrets::{self, Sealer};
use crate::tokens;
use crate::validate;
use crate::wire::{
    ChatSettings, ChatSettingsView, EffectiveSettings, EnvironmentBody, EnvironmentRecord,
    ModelInfo, ModelList, SecretInject,
};

/// The Assistant's system prompt when a chat sets none.
pub(crate) const DEFAULT_SYSTEM_PROMPT: &str = "\
You are the asbx Assistant. You work in a private Linux sandbox: a working \
directory of your own, a bash shell tool to run commands in it, and file \
tools to read and write files there. Network access is limited to the hosts \
the chat's environment allows.

Files the user attached to their message are in the `attachments/` folder of \
your working directory: read them there.

The chat's files (its bag) are reachable with these tools, when present:
- `workspace_list_files`: the files of this chat (id, path, type, size).
- `workspace_read_file` {\"id\", \"saveAs\"?}: a file's text, or with \
`saveAs` its bytes written to that relative path.
- `workspace_create_file` {\"path\", \"content\" or \"fromPath\", \"mimeType\"?}: \
put a file in the chat's bag so the user can download it. Give the user \
every file they asked for this way.
- `chat_history` {\"limit\"?}: earlier messages of this chat.

Work step by step: look before you change things, check what your commands \
print, and say plainly what you did, what you found and what failed. Keep \
answers short and concrete; use Markdown.";

/// A stored environment with its secrets: for building `/env` only.
#[derive(Clone)]
pub(crate) struct Environment {
    pub(crate) id: String,
    pub(crate) variables: BTreeMap<String, String>,
    pub(crate) secrets: BTreeMap<String, String>,
    pub(crate) setup_script: Option<String>,
    pub(crate) allowed_hosts: Vec<String>,
}

impl std::fmt::Debug for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Environment")
            .field("id", &self.id)
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

fn corrupt(id: &str, e: serde_json::Error) -> WorkspaceError {
    WorkspaceError::Corrupt(format!("stored environment {id}: {e}"))
}

fn json<T: serde::Serialize>(v: &T) -> Result<String, WorkspaceError> {
    serde_json::to_string(v).map_err(|e| WorkspaceError::Corrupt(format!("environment: {e}")))
}

/// The stored secrets of a row: names to sealed values.
fn secrets_of(row: &EnvironmentRow) -> Result<BTreeMap<String, String>, WorkspaceError> {
    serde_json::from_str(&row.secrets).map_err(|e| corrupt(&row.id, e))
}

/// The stored bindings of a row: secret names to where they are injected.
fn inject_of(row: &EnvironmentRow) -> Result<BTreeMap<String, SecretInject>, WorkspaceError> {
    serde_json::from_str(&row.secret_inject).map_err(|e| corrupt(&row.id, e))
}

fn environment(sealer: &Sealer, row: EnvironmentRow) -> Result<Environment, WorkspaceError> {
    let mut secrets = secrets_of(&row)?;
    for value in secrets.values_mut() {
        *value = sealer.open(value)?;
    }
    Ok(Environment {
        variables: serde_json::from_str(&row.variables).map_err(|e| corrupt(&row.id, e))?,
        secrets,
        allowed_hosts: serde_json::from_str(&row.allowed_hosts).map_err(|e| corrupt(&row.id, e))?,
        setup_script: row.setup_script,
        id: row.id,
    })
}

fn record(row: EnvironmentRow) -> Result<EnvironmentRecord, WorkspaceError> {
    let secret_names = secrets_of(&row)?.into_keys().collect();
    Ok(EnvironmentRecord {
        variables: serde_json::from_str(&row.variables).map_err(|e| corrupt(&row.id, e))?,
        allowed_hosts: serde_json::from_str(&row.allowed_hosts).map_err(|e| corrupt(&row.id, e))?,
        secret_names,
        injected_secrets: inject_of(&row)?,
        id: row.id,
        name: row.name,
        setup_script: row.setup_script,
        created_at: row.created_at,
        updated_at: row.updated_at,
    })
}

fn not_found(id: &str) -> WorkspaceError {
    WorkspaceError::NotFound(format!("environment {id}"))
}

/// A row from a checked body and its final secrets: those named in
/// `fresh` are the body's, in clear, and are sealed once checked; the
/// others are stored ones, sealed already. A `SANDBOX_URL` variable must
/// name a runner the operator configured.
#[allow(clippy::too_many_arguments)]
fn checked_row(
    config: &WorkspaceConfig,
    sealer: &Sealer,
    body: EnvironmentBody,
    mut secrets: BTreeMap<String, String>,
    inject: BTreeMap<String, SecretInject>,
    fresh: &BTreeSet<String>,
    creating: bool,
    id: String,
    workspace_id: &str,
    created_at: i64,
    now: i64,
) -> Result<EnvironmentRow, WorkspaceError> {
    let errors = validate::named_environment(&body, &secrets, creating);
    if !errors.is_empty() {
        return Err(WorkspaceError::invalid_fields(errors));
    }
    validate::allowed_runner_variable(config, &body.variables, "")?;
    for (name, value) in secrets.iter_mut() {
        if fresh.contains(name) {
            *value = sealer.seal(value);
        }
    }
    Ok(EnvironmentRow {
        id,
        workspace_id: workspace_id.to_owned(),
        variables: json(&body.variables)?,
        secrets: json(&secrets)?,
        secret_inject: json(&inject)?,
        allowed_hosts: json(&body.allowed_hosts)?,
        name: body.name,
        setup_script: body.setup_script,
        created_at,
        updated_at: now,
    })
}

/// Stores a new environment in `workspace_id`.
pub(crate) async fn create(
    state: &AppState,
    workspace_id: &str,
    body: EnvironmentBody,
) -> Result<EnvironmentRecord, WorkspaceError> {
    let mut secrets = BTreeMap::new();
    let mut inject = BTreeMap::new();
    for (name, input) in body.secrets.iter().flatten() {
        let Some(input) = input.clone() else { continue };
        let (value, binding) = input.into_parts();
        if let Some(b) = binding {
            inject.insert(name.clone(), b);
        }
        secrets.insert(name.clone(), value);
    }
    let now = state.now_ms();
    let fresh = secrets.keys().cloned().collect();
    let row = checked_row(
        &state.config,
        &state.sealer,
        body,
        secrets,
        inject,
        &fresh,
        true,
        tokens::random_id(),
        workspace_id,
        now,
        now,
    )?;
    env_store::insert(state.store.pool(), &row).await?;
    record(row)
}

/// Every environment of `workspace_id`, by name.
pub(crate) async fn list(
    state: &AppState,
    workspace_id: &str,
) -> Result<Vec<EnvironmentRecord>, WorkspaceError> {
    env_store::list(state.store.pool(), workspace_id)
        .await?
        .into_iter()
        .map(record)
        .collect()
}

/// One environment of `workspace_id`; another workspace's is not found.
pub(crate) async fn get(
    state: &AppState,
    workspace_id: &str,
    id: &str,
) -> Result<EnvironmentRecord, WorkspaceError> {
    let row = env_store::get(state.store.pool(), workspace_id, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    record(row)
}

/// Replaces an environment; its secrets change only as `body.secrets` says
/// (absent: kept; a name with `null`: deleted; with a string: set).
pub(crate) async fn update(
    state: &AppState,
    workspace_id: &str,
    id: &str,
    body: EnvironmentBody,
) -> Result<EnvironmentRecord, WorkspaceError> {
    let old = env_store::get(state.store.pool(), workspace_id, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    let mut secrets = secrets_of(&old)?;
    let mut inject = inject_of(&old)?;
    let mut fresh = BTreeSet::new();
    // Checked with the body: the bindings stay in it for `checked_row`.
    for (name, value) in body.secrets.iter().flatten() {
        match value.clone().map(crate::wire::SecretInput::into_parts) {
            Some((v, binding)) => {
                fresh.insert(name.clone());
                secrets.insert(name.clone(), v);
                match binding {
                    Some(b) => inject.insert(name.clone(), b),
                    None => inject.remove(name),
                };
            }
            None => {
                secrets.remove(name);
                inject.remove(name);
            }
        }
    }
    let row = checked_row(
        &state.config,
        &state.sealer,
        body,
        secrets,
        inject,
        &fresh,
        false,
        old.id,
        workspace_id,
        old.created_at,
        state.now_ms(),
    )?;
    if !env_store::update(state.store.pool(), &row).await? {
        return Err(not_found(id));
    }
    record(row)
}

/// Deletes an environment: never found again. Chats and agents naming it
/// fail their next run with `409 conflict` until they name another.
pub(crate) async fn delete(
    state: &AppState,
    workspace_id: &str,
    id: &str,
) -> Result<(), WorkspaceError> {
    if env_store::delete(state.store.pool(), workspace_id, id, state.now_ms()).await? {
        Ok(())
    } else {
        Err(not_found(id))
    }
}

/// The live environment of `workspace_id` with this id or name.
pub(crate) async fn find(
    state: &AppState,
    workspace_id: &str,
    id_or_name: &str,
) -> Result<Option<Environment>, WorkspaceError> {
    env_store::find(state.store.pool(), workspace_id, id_or_name)
        .await?
        .map(|row| environment(&state.sealer, row))
        .transpose()
}

/// The environment `id` a chat or an agent refers to; `409 conflict` when
/// it was deleted since (`owner` says whose reference it is).
pub(crate) async fn referenced(
    state: &AppState,
    workspace_id: &str,
    id: &str,
    owner: &str,
) -> Result<Environment, WorkspaceError> {
    match env_store::get(state.store.pool(), workspace_id, id).await? {
        Some(row) => environment(&state.sealer, row),
        None => Err(WorkspaceError::Conflict(format!(
            "{owner} uses environment {id}, which no longer exists: choose another environment"
        ))),
    }
}

/// Whether a named environment under `inline` variables stays within
/// [`validate::MAX_VARIABLES`] (each is checked alone when stored).
pub(crate) fn check_merged(
    named: &Environment,
    inline: &BTreeMap<String, String>,
) -> Result<(), String> {
    let extra = named
        .variables
        .keys()
        .chain(named.secrets.keys())
        .filter(|k| !inline.contains_key(*k))
        .count();
    if inline.len().saturating_add(extra) > validate::MAX_VARIABLES {
        return Err(format!(
            "with this request's variables, more than {} variables and secrets",
            validate::MAX_VARIABLES
        ));
    }
    Ok(())
}

/// The secrets a run's `/env` carries, by name: a run stores these, never
/// the values, which [`secret_values`] reads from the environment as it is
/// when `/env` is redeemed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SecretRefs {
    pub(crate) environment_id: String,
    pub(crate) names: Vec<String>,
}

/// `/env` from a named environment under inline values: the inline
/// variables and setup script win on a clash; secrets are variables in the
/// sandbox; allowed hosts are the union. The secrets are not in the
/// payload: it names them ([`SecretRefs`]), for [`with_secrets`] to add.
pub(crate) fn merged_env(
    named: Option<Environment>,
    variables: BTreeMap<String, String>,
    setup_script: Option<String>,
    allowed_hosts: Vec<String>,
) -> (EnvResponse, Option<SecretRefs>) {
    // Field by field: `EnvResponse` gains fields this module doesn't set.
    let mut env = EnvResponse::default();
    let Some(named) = named else {
        env.variables = variables;
        env.setup_script = setup_script;
        env.allowed_hosts = allowed_hosts;
        return (env, None);
    };
    let names: Vec<String> = named
        .secrets
        .into_keys()
        .filter(|k| !variables.contains_key(k))
        .collect();
    let refs = (!names.is_empty()).then_some(SecretRefs {
        environment_id: named.id,
        names,
    });
    let mut all = named.variables;
    all.extend(variables);
    let mut hosts = named.allowed_hosts;
    for h in allowed_hosts {
        if !hosts.contains(&h) {
            hosts.push(h);
        }
    }
    env.variables = all;
    env.setup_script = setup_script.or(named.setup_script);
    env.allowed_hosts = hosts;
    (env, refs)
}

/// `env` with the secrets `refs` names, read now from the live environment
/// of `workspace_id` on `conn`: a secret deleted (or an environment
/// deleted) since the run was dispatched is left out; a value rotated
/// since is the new one. A secret bound to hosts is a placeholder variable
/// and, when the gateway relaying `/env` strips them (`strips`), one of
/// `injected_secrets`; else the sandbox gets the placeholder only and no
/// request carries the secret (fails closed).
pub(crate) async fn with_secrets(
    conn: &mut sqlx::AnyConnection,
    sealer: &Sealer,
    workspace_id: &str,
    refs: &SecretRefs,
    strips: bool,
    env: &mut EnvResponse,
) -> Result<(), WorkspaceError> {
    let Some(row) = env_store::get(&mut *conn, workspace_id, &refs.environment_id).await? else {
        tracing::warn!(
            environment = %refs.environment_id,
            "a run's environment was deleted before its /env: sent without its secrets"
        );
        return Ok(());
    };
    let stored = secrets_of(&row)?;
    let inject = inject_of(&row)?;
    for name in &refs.names {
        if let (Some(sealed), Some(b)) = (stored.get(name), inject.get(name)) {
            let placeholder = asbx_protocol::rules::inject::placeholder(name);
            env.variables.entry(name.clone()).or_insert(placeholder);
            if !strips {
                tracing::warn!(
                    environment = %refs.environment_id,
                    secret = %name,
                    "the gateway relaying /env does not strip injected secrets (an older runner): the secret is not sent"
                );
                continue;
            }
            env.injected_secrets
                .push(asbx_protocol::callback::InjectedSecret {
                    name: name.clone(),
                    value: sealer.open(sealed)?,
                    hosts: b.hosts.clone(),
                    header: b.header.clone(),
                    format: b.format.clone(),
                });
            continue;
        }
        match stored.get(name) {
            Some(sealed) => {
                let value = sealer.open(sealed)?;
                env.variables.entry(name.clone()).or_insert(value);
            }
            None => tracing::warn!(
                environment = %refs.environment_id,
                secret = %name,
                "a run's secret was deleted before its /env: sent without it"
            ),
        }
    }
    Ok(())
}

/// Seals what is clear and reseals what an older key sealed in every
/// environment's secrets; a deleted environment's secrets are dropped.
/// Returns how many rows changed.
pub(crate) async fn reseal_all(state: &AppState) -> Result<u64, WorkspaceError> {
    let mut changed = 0;
    for row in env_store::all_secrets(state.store.pool()).await? {
        let mut secrets: BTreeMap<String, String> =
            serde_json::from_str(&row.secrets).map_err(|e| corrupt(&row.id, e))?;
        let before = secrets.len();
        if row.deleted {
            secrets.clear();
        }
        let mut touched = secrets.len() != before;
        for value in secrets.values_mut() {
            if let Some(v) = state.sealer.reseal(value)? {
                *value = v;
                touched = true;
            }
        }
        if touched
            && env_store::replace_secrets(
                state.store.pool(),
                &row.id,
                &row.secrets,
                &json(&secrets)?,
            )
            .await?
        {
            changed += 1;
        }
    }
    Ok(changed)
}

/// [`reseal_all`] for the stdio MCP servers' `env` in chats' settings.
pub(crate) async fn reseal_chat_settings(state: &AppState) -> Result<u64, WorkspaceError> {
    let mut changed = 0;
    for (chat_id, text) in env_store::settings_with_env(state.store.pool()).await? {
        let mut settings = parse_chat_settings(&chat_id, Some(&text))?;
        if state.sealer.reseal_servers(&mut settings.mcp_servers)?
            && env_store::replace_chat_settings(
                state.store.pool(),
                &chat_id,
                &text,
                &json(&settings)?,
            )
            .await?
        {
            changed += 1;
        }
    }
    Ok(changed)
}

/// `GET /api/models`.
pub(crate) fn models(state: &AppState) -> ModelList {
    let default = &state.config.default_model;
    ModelList {
        models: state
            .config
            .model_list()
            .into_iter()
            .map(|id| ModelInfo {
                provider: id.split_once(':').map(|(p, _)| p).unwrap_or("").to_owned(),
                default: id == *default,
                id,
            })
            .collect(),
    }
}

/// Checks chat settings (fields `settings.*`), the environment among them
/// against this workspace's.
pub(crate) async fn check_chat_settings(
    state: &AppState,
    workspace_id: &str,
    settings: &ChatSettings,
) -> Result<(), WorkspaceError> {
    let mut errors = validate::chat_settings(settings);
    if let Some(id) = settings
        .environment_id
        .as_deref()
        .filter(|id| !id.is_empty())
        && env_store::get(state.store.pool(), workspace_id, id)
            .await?
            .is_none()
    {
        errors.push(FieldError::new(
            "settings.environmentId",
            "no such environment in this workspace",
        ));
    }
    // A chat offers `GET /api/models`, whether or not runs are held to it.
    let model = validate::allowed_model(
        Some(state.config.model_list()),
        "settings.model",
        settings.model.as_deref(),
    );
    if errors.is_empty() {
        return model;
    }
    // With other fields wrong too, one `400` names every bad field.
    if let Err(WorkspaceError::ModelNotAllowed { field, model, .. }) = model
        && !errors.iter().any(|e| e.field == field)
    {
        errors.push(FieldError::new(
            &field,
            format!("{model} is not one of the models this workspace offers"),
        ));
    }
    Err(WorkspaceError::invalid_fields(errors))
}

/// A live chat's settings (the defaults when it has none stored).
pub(crate) async fn chat_settings(
    state: &AppState,
    workspace_id: &str,
    chat_id: &str,
) -> Result<ChatSettings, WorkspaceError> {
    match env_store::chat_settings(state.store.pool(), workspace_id, chat_id).await? {
        None => Err(WorkspaceError::NotFound(format!("chat {chat_id}"))),
        Some(text) => parse_chat_settings(chat_id, text.as_deref()),
    }
}

/// A chat's settings from their stored JSON text (`None`: the defaults).
pub(crate) fn parse_chat_settings(
    chat_id: &str,
    text: Option<&str>,
) -> Result<ChatSettings, WorkspaceError> {
    match text {
        None => Ok(ChatSettings::default()),
        Some(text) => serde_json::from_str(text)
            .map_err(|e| WorkspaceError::Corrupt(format!("settings of chat {chat_id}: {e}"))),
    }
}

/// Stores a chat's settings, unchecked (see [`check_chat_settings`]).
pub(crate) async fn store_chat_settings(
    state: &AppState,
    workspace_id: &str,
    chat_id: &str,
    settings: &ChatSettings,
) -> Result<(), WorkspaceError> {
    let mut conn = state.store.pool().acquire().await?;
    store_chat_settings_on(&mut conn, workspace_id, chat_id, settings, state.now_ms()).await
}

/// [`store_chat_settings`] on `conn` (in the caller's transaction, say).
pub(crate) async fn store_chat_settings_on(
    conn: &mut sqlx::AnyConnection,
    workspace_id: &str,
    chat_id: &str,
    settings: &ChatSettings,
    now_ms: i64,
) -> Result<(), WorkspaceError> {
    let text = json(settings)?;
    if env_store::set_chat_settings(conn, workspace_id, chat_id, &text, now_ms).await? {
        Ok(())
    } else {
        Err(WorkspaceError::NotFound(format!("chat {chat_id}")))
    }
}

/// `PUT /api/assistant/chats/{id}/settings`: checks and replaces them.
pub(crate) async fn put_chat_settings(
    state: &AppState,
    workspace_id: &str,
    chat_id: &str,
    settings: ChatSettings,
) -> Result<ChatSettingsView, WorkspaceError> {
    // A missing chat is 404 before its body's problems.
    let stored = chat_settings(state, workspace_id, chat_id).await?;
    check_chat_settings(state, workspace_id, &settings).await?;
    let settings = seal_chat_settings(state, settings, &stored)?;
    store_chat_settings(state, workspace_id, chat_id, &settings).await?;
    Ok(settings_view(state, settings))
}

/// Checked settings as stored: the stdio MCP servers' `env` values sealed,
/// a masked value keeping the one `stored` has.
pub(crate) fn seal_chat_settings(
    state: &AppState,
    mut settings: ChatSettings,
    stored: &ChatSettings,
) -> Result<ChatSettings, WorkspaceError> {
    let errors = state.sealer.seal_servers(
        &mut settings.mcp_servers,
        &stored.mcp_servers,
        "settings.mcpServers",
    );
    if errors.is_empty() {
        Ok(settings)
    } else {
        Err(WorkspaceError::invalid_fields(errors))
    }
}

/// Settings as answered: stored plus the effective model and system
/// prompt; stdio MCP `env` values masked.
pub(crate) fn settings_view(state: &AppState, mut s: ChatSettings) -> ChatSettingsView {
    secrets::mask_servers(&mut s.mcp_servers);
    let effective = EffectiveSettings {
        model: s
            .model
            .clone()
            .unwrap_or_else(|| state.config.default_model.clone()),
        system_prompt: s
            .system_prompt
            .clone()
            .unwrap_or_else(|| DEFAULT_SYSTEM_PROMPT.to_owned()),
    };
    ChatSettingsView {
        settings: s,
        effective,
    }
}

/// A live chat's settings as answered in `GET /api/assistant/chats/{id}`.
pub(crate) async fn chat_settings_view(
    state: &AppState,
    workspace_id: &str,
    chat_id: &str,
) -> Result<ChatSettingsView, WorkspaceError> {
    let s = chat_settings(state, workspace_id, chat_id).await?;
    Ok(settings_view(state, s))
}

/// What a chat turn's `/env` and `/config` start from.
#[derive(Debug, Clone)]
pub(crate) struct ChatRun {
    pub(crate) env: EnvResponse,
    pub(crate) secrets: Option<SecretRefs>,
    pub(crate) config: ConfigResponse,
}

/// What a chat turn's `/env` and `/config` start from, by its settings
/// (the turn adds attachments and the replayed conversation). A deleted
/// environment is `409 conflict`.
pub(crate) async fn chat_run(
    state: &AppState,
    workspace_id: &str,
    settings: &ChatSettings,
) -> Result<ChatRun, WorkspaceError> {
    let named = match settings.environment_id.as_deref() {
        Some(id) => Some(referenced(state, workspace_id, id, "this chat").await?),
        None => None,
    };
    // Checked when stored; the operator's list may have changed since.
    validate::allowed_model(
        state.config.allowed_models(),
        "settings.model",
        settings.model.as_deref(),
    )?;
    let (env, secrets) = merged_env(named, BTreeMap::new(), None, Vec::new());
    let config = ConfigResponse {
        system_prompt: Some(
            settings
                .system_prompt
                .clone()
                .unwrap_or_else(|| DEFAULT_SYSTEM_PROMPT.to_owned()),
        ),
        model: settings
            .model
            .clone()
            .unwrap_or_else(|| state.config.default_model.clone()),
        skills: settings.skills.clone(),
        mcp_servers: settings.mcp_servers.clone(),
        ..Default::default()
    };
    Ok(ChatRun {
        env,
        secrets,
        config,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named() -> Environment {
        Environment {
            id: "e".into(),
            variables: [("A".to_owned(), "env".to_owned())].into(),
            secrets: [("TOKEN".to_owned(), "s3cret".to_owned())].into(),
            setup_script: Some("echo env".into()),
            allowed_hosts: vec!["a.example".into()],
        }
    }

    #[test]
    fn inline_values_win_and_hosts_are_the_union() {
        let (env, secrets) = merged_env(
            Some(named()),
            [("A".to_owned(), "inline".to_owned())].into(),
            Some("echo inline".into()),
            vec!["b.example".into(), "a.example".into()],
        );
        assert_eq!(env.variables["A"], "inline");
        assert_eq!(env.setup_script.as_deref(), Some("echo inline"));
        assert_eq!(env.allowed_hosts, ["a.example", "b.example"]);
        // The secret by name only: its value is read when `/env` is.
        assert!(!env.variables.contains_key("TOKEN"));
        let refs = secrets.unwrap();
        assert_eq!(
            (refs.environment_id.as_str(), &refs.names[..]),
            ("e", &["TOKEN".to_owned()][..])
        );
        let (env, _) = merged_env(Some(named()), BTreeMap::new(), None, Vec::new());
        assert_eq!(env.setup_script.as_deref(), Some("echo env"));
        // An inline variable of the secret's name wins: no secret to add.
        let (env, secrets) = merged_env(
            Some(named()),
            [("TOKEN".to_owned(), "inline".to_owned())].into(),
            None,
            Vec::new(),
        );
        assert_eq!((env.variables["TOKEN"].as_str(), secrets), ("inline", None));
    }

    #[test]
    fn a_merged_environment_is_bounded() {
        let many: BTreeMap<String, String> = (0..validate::MAX_VARIABLES - 1)
            .map(|i| (format!("V{i}"), String::new()))
            .collect();
        // A and TOKEN are new: one too many.
        assert!(check_merged(&named(), &many).is_err());
        let mut clash = many.clone();
        clash.remove("V0");
        clash.insert("A".into(), String::new());
        // Only TOKEN is new: exactly the maximum.
        assert_eq!(check_merged(&named(), &clash), Ok(()));
    }

    #[test]
    fn debug_never_shows_a_secret() {
        let shown = format!("{:?}", named());
        assert!(
            shown.contains("TOKEN") && !shown.contains("s3cret"),
            "{shown}"
        );
    }
}
