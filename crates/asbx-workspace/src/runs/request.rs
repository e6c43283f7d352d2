//! `POST /api/runs` bodies: checked by `validate`, turned into a dispatch
//! (with a named environment's `/env` under the request's own values);
//! the protocol 2 choices of any run request checked by [`options`].

use asbx_protocol::callback::ConfigResponse;
use asbx_protocol::dispatch::{ClientTool, EncryptionRequest, FieldError};
use asbx_protocol::{EventKind, Filter};
use serde_json::Value;

use crate::AppState;
use crate::environments;
use crate::error::WorkspaceError;
use crate::runs::dispatch::{RunOptions, RunSpec, WorkdirFrom};
use crate::tokens;
use crate::validate;
use crate::wire::{CreateRunRequest, RunKind};

/// Checks a request field by field and turns it into a dispatch to the
/// server's runner (a request never names its runner: see
/// [`CreateRunRequest`]). A named `environment` goes under the request's
/// own values ([`environments::merged_env`]).
pub(crate) async fn to_spec(
    state: &AppState,
    mut request: CreateRunRequest,
    workspace_id: &str,
) -> Result<(RunSpec, Stream), WorkspaceError> {
    let mut errors = validate::run_request(&request);
    if errors.is_empty() {
        // A run stores its `/config` with MCP `env` values sealed.
        errors = state
            .sealer
            .seal_servers(&mut request.mcp_servers, &[], "mcpServers");
    }
    let named = named_environment(state, workspace_id, &request, &mut errors).await?;
    let stream = options(
        request.protocol.as_ref(),
        request.filter.as_ref(),
        request.client_tools.as_ref(),
        request.encryption.as_ref(),
        &mut errors,
    );
    if !errors.is_empty() {
        return Err(WorkspaceError::invalid_fields(errors));
    }
    validate::allowed_model(
        state.config.allowed_models(),
        "model",
        request.model.as_deref(),
    )?;
    // The variable does not pick the runner here, but no request names one
    // the operator did not configure (docs/api-runs.md).
    validate::allowed_runner_variable(&state.config, &request.variables, "")?;
    let sandbox_url = match request.sandbox_url.as_deref() {
        Some(raw) => validate::allowed_runner(&state.config, "sandboxUrl", raw)?,
        None => state
            .config
            .sandbox_url
            .clone()
            .ok_or(WorkspaceError::SandboxUrlMissing)?,
    };
    let workdir_from = match request.workdir.take() {
        Some(w) => Some(workdir_from(state, workspace_id, w).await?),
        None => None,
    };
    let (env, secrets) = environments::merged_env(
        named,
        request.variables,
        request.setup_script,
        request.allowed_hosts,
    );
    let spec = RunSpec {
        id: tokens::random_id(),
        workspace_id: workspace_id.to_owned(),
        kind: RunKind::Run,
        chat_id: None,
        agent_id: None,
        env,
        secrets,
        config: ConfigResponse {
            system_prompt: request.system_prompt,
            model: request
                .model
                .unwrap_or_else(|| state.config.default_model.clone()),
            skills: request.skills,
            mcp_servers: request.mcp_servers,
            conversation: Vec::new(),
            limits: request.limits,
        },
        prompt: request.prompt,
        sandbox_url,
        workdir_from,
    };
    Ok((spec, stream))
}

/// The named environment `request` asks for (by id or name), if any; a
/// missing one, or one whose variables clash with the request's, is a
/// field error.
async fn named_environment(
    state: &AppState,
    workspace_id: &str,
    request: &CreateRunRequest,
    errors: &mut Vec<FieldError>,
) -> Result<Option<environments::Environment>, WorkspaceError> {
    let Some(name) = request.environment.as_deref() else {
        return Ok(None);
    };
    let found = environments::find(state, workspace_id, name).await?;
    match &found {
        None => errors.push(FieldError::new(
            "environment",
            "no such environment in this workspace (by id or name)",
        )),
        Some(env) => {
            if let Err(msg) = environments::check_merged(env, &request.variables) {
                errors.push(FieldError::new("environment", msg));
            }
        }
    }
    Ok(found)
}

/// The kept working directory a run starts from (`workdir`), read from
/// the caller's workspace only.
async fn workdir_from(
    state: &AppState,
    workspace_id: &str,
    w: crate::wire::RunWorkdir,
) -> Result<WorkdirFrom, WorkspaceError> {
    let manifest = crate::workdir::source::for_run(
        state.store.pool(),
        workspace_id,
        &w.from,
        w.after_message_id.as_deref(),
    )
    .await?;
    Ok(WorkdirFrom {
        chat_id: w.from,
        manifest,
    })
}

/// How a run request wants its stream: the response's protocol and what
/// the runner is asked for.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stream {
    /// `"protocol": 2`: the runner's lines as they are.
    pub(crate) protocol2: bool,
    pub(crate) options: RunOptions,
}

/// Checks `protocol`, `filter`, `clientTools` and `encryption` of a run
/// request, adding every problem to `errors` by field.
pub(crate) fn options(
    protocol: Option<&Value>,
    filter: Option<&Value>,
    client_tools: Option<&Value>,
    encryption: Option<&Value>,
    errors: &mut Vec<FieldError>,
) -> Stream {
    let protocol2 = match protocol {
        None | Some(Value::Null) => false,
        Some(v) if v.as_u64() == Some(1) => false,
        Some(v) if v.as_u64() == Some(2) => true,
        Some(_) => {
            errors.push(FieldError::new("protocol", "must be 1 or 2"));
            false
        }
    };
    let present = |v: Option<&Value>| v.is_some_and(|v| !v.is_null());
    if !protocol2 {
        for (name, v) in [
            ("filter", filter),
            ("clientTools", client_tools),
            ("encryption", encryption),
        ] {
            if present(v) {
                errors.push(FieldError::new(name, "needs \"protocol\": 2"));
            }
        }
    }
    let mut out = RunOptions::default();
    if let Some(v) = filter.filter(|v| !v.is_null()) {
        out.filter = check_filter(v, errors);
    }
    if let Some(v) = client_tools.filter(|v| !v.is_null()) {
        out.client_tools = check_client_tools(v, errors);
    }
    if let Some(v) = encryption.filter(|v| !v.is_null()) {
        out.encryption = check_encryption(v, errors);
    }
    Stream {
        protocol2,
        options: out,
    }
}

fn check_filter(v: &Value, errors: &mut Vec<FieldError>) -> Option<Filter> {
    let shape = "must be {\"types\": [..]} or {\"blockedTypes\": [..]}";
    let Some(obj) = v.as_object().filter(|o| o.len() == 1) else {
        errors.push(FieldError::new("filter", shape));
        return None;
    };
    let (key, list) = obj.iter().next()?;
    let allow = match key.as_str() {
        "types" => true,
        "blockedTypes" | "blocked_types" => false,
        _ => {
            errors.push(FieldError::new("filter", shape));
            return None;
        }
    };
    let field = format!("filter.{key}");
    let Some(items) = list.as_array() else {
        errors.push(FieldError::new(&field, "must be an array of line types"));
        return None;
    };
    let mut kinds = Vec::with_capacity(items.len());
    for item in items {
        match item.as_str().and_then(EventKind::parse) {
            Some(k) => kinds.push(k),
            None => errors.push(FieldError::new(&field, format!("unknown line type {item}"))),
        }
    }
    Some(if allow {
        Filter::Allow { types: kinds }
    } else {
        Filter::Block {
            blocked_types: kinds,
        }
    })
}

fn check_client_tools(v: &Value, errors: &mut Vec<FieldError>) -> Vec<ClientTool> {
    let Some(items) = v.as_array() else {
        errors.push(FieldError::new("clientTools", "must be an array"));
        return Vec::new();
    };
    let mut tools = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let field = format!("clientTools[{i}]");
        let tool = match serde_json::from_value::<ClientTool>(item.clone()) {
            Ok(t) => t,
            Err(e) => {
                errors.push(FieldError::new(&field, e.to_string()));
                continue;
            }
        };
        if !asbx_protocol::rules::names::valid_tool_name(&tool.name) {
            errors.push(FieldError::new(
                &format!("{field}.name"),
                "must match ^[A-Za-z0-9_-]{1,64}$",
            ));
        } else if tools.iter().any(|t: &ClientTool| t.name == tool.name) {
            errors.push(FieldError::new(&format!("{field}.name"), "named twice"));
        }
        if !tool.parameters.is_object() {
            errors.push(FieldError::new(
                &format!("{field}.parameters"),
                "must be a JSON Schema object",
            ));
        }
        tools.push(tool);
    }
    tools
}

fn check_encryption(v: &Value, errors: &mut Vec<FieldError>) -> Option<EncryptionRequest> {
    let Some(obj) = v.as_object() else {
        errors.push(FieldError::new(
            "encryption",
            "must be {\"clientPublicKey\": K}",
        ));
        return None;
    };
    for key in obj.keys().filter(|k| *k != "clientPublicKey") {
        errors.push(FieldError::new(
            &format!("encryption.{key}"),
            "unknown field",
        ));
    }
    match obj.get("clientPublicKey") {
        Some(Value::String(k)) if asbx_protocol::dispatch::is_client_public_key_shape(k) => {
            Some(EncryptionRequest {
                client_public_key: k.clone(),
            })
        }
        Some(_) => {
            errors.push(FieldError::new(
                "encryption.clientPublicKey",
                "must be base64url (no padding) of a 65-byte uncompressed P-256 point",
            ));
            None
        }
        None => {
            errors.push(FieldError::new("encryption.clientPublicKey", "required"));
            None
        }
    }
}
