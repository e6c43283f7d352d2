//! Runs: one row per dispatch to the runner, keyed by the session id.

use sqlx::any::AnyRow;
use sqlx::{Any, Executor, Row as _};

use crate::error::WorkspaceError;
use crate::wire::{RunKind, RunStatus};

fn parse_status(s: &str) -> Result<RunStatus, WorkspaceError> {
    RunStatus::parse(s).ok_or_else(|| WorkspaceError::Corrupt(format!("run status {s:?}")))
}

fn parse_kind(s: &str) -> Result<RunKind, WorkspaceError> {
    RunKind::parse(s).ok_or_else(|| WorkspaceError::Corrupt(format!("run kind {s:?}")))
}

/// A new run, before it is dispatched.
#[derive(Debug, Clone)]
pub(crate) struct NewRun<'a> {
    pub(crate) id: &'a str,
    pub(crate) workspace_id: &'a str,
    pub(crate) kind: RunKind,
    pub(crate) chat_id: Option<&'a str>,
    pub(crate) agent_id: Option<&'a str>,
    pub(crate) prompt: &'a str,
    pub(crate) model: &'a str,
    pub(crate) env_json: &'a str,
    /// The secrets `/env` adds, by name (`environments::SecretRefs` as JSON).
    pub(crate) env_secrets: Option<&'a str>,
    pub(crate) config_json: &'a str,
    /// The runner it is dispatched to.
    pub(crate) sandbox_url: &'a str,
    /// The chat whose kept working directory it starts from.
    pub(crate) workdir_from: Option<&'a str>,
    pub(crate) now_ms: i64,
}

/// A stored run.
#[derive(Debug, Clone)]
pub(crate) struct RunRow {
    pub(crate) id: String,
    pub(crate) workspace_id: String,
    pub(crate) kind: RunKind,
    pub(crate) chat_id: Option<String>,
    pub(crate) agent_id: Option<String>,
    pub(crate) status: RunStatus,
    pub(crate) prompt: String,
    pub(crate) model: String,
    pub(crate) env_json: String,
    /// The secrets `/env` adds, by name (`environments::SecretRefs` as JSON).
    pub(crate) env_secrets: Option<String>,
    pub(crate) config_json: String,
    pub(crate) result: Option<String>,
    pub(crate) error_code: Option<String>,
    pub(crate) error_message: Option<String>,
    pub(crate) created_at: i64,
    pub(crate) ended_at: Option<i64>,
    /// The `session_ended` fields as JSON, once ended (protocol 2, not encrypted).
    pub(crate) termination: Option<String>,
    /// The runner it was dispatched to (absent for runs older than protocol 2).
    pub(crate) sandbox_url: Option<String>,
    /// The lowest `seq` still kept in `run_events`.
    pub(crate) events_from: i64,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Succeeded { message: String },
    Failed { code: String, message: String },
}

const COLUMNS: &str = "id, workspace_id, kind, chat_id, agent_id, status, prompt, model, env_json, \
    config_json, result, error_code, error_message, created_at, ended_at, termination, sandbox_url, \
    events_from, env_secrets";

pub(crate) async fn insert<'c, E>(db: E, run: &NewRun<'_>) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    sqlx::query(
        "INSERT INTO runs (id, workspace_id, kind, chat_id, agent_id, status, prompt, model, \
         env_json, config_json, created_at, sandbox_url, env_secrets, workdir_from) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
    )
    .bind(run.id)
    .bind(run.workspace_id)
    .bind(run.kind.as_str())
    .bind(run.chat_id)
    .bind(run.agent_id)
    .bind(RunStatus::Running.as_str())
    .bind(run.prompt)
    .bind(run.model)
    .bind(run.env_json)
    .bind(run.config_json)
    .bind(run.now_ms)
    .bind(run.sandbox_url)
    .bind(run.env_secrets)
    .bind(run.workdir_from)
    .execute(db)
    .await?;
    Ok(())
}

/// Records the runner a running run went to instead (a fleet's dispatch
/// that moved on from a full or down runner).
pub(crate) async fn set_sandbox_url<'c, E>(
    db: E,
    id: &str,
    sandbox_url: &str,
) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    sqlx::query("UPDATE runs SET sandbox_url = $1 WHERE id = $2 AND status = $3")
        .bind(sandbox_url)
        .bind(id)
        .bind(RunStatus::Running.as_str())
        .execute(db)
        .await?;
    Ok(())
}

pub(crate) async fn get<'c, E>(db: E, id: &str) -> Result<Option<RunRow>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(&format!("SELECT {COLUMNS} FROM runs WHERE id = $1"))
        .bind(id)
        .fetch_optional(db)
        .await?;
    row.map(|r| from_row(&r)).transpose()
}

/// The newest run (turn) of a chat.
pub(crate) async fn latest_for_chat<'c, E>(
    db: E,
    chat_id: &str,
) -> Result<Option<RunRow>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM runs WHERE chat_id = $1 ORDER BY created_at DESC, id DESC LIMIT 1"
    ))
    .bind(chat_id)
    .fetch_optional(db)
    .await?;
    row.map(|r| from_row(&r)).transpose()
}

/// Records how a run ended (and its `session_ended` fields as JSON, when
/// known); only a running run changes, so the first recorded outcome wins.
pub(crate) async fn finish<'c, E>(
    db: E,
    id: &str,
    outcome: &Outcome,
    termination: Option<&str>,
    now_ms: i64,
) -> Result<bool, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let (status, result, code, message) = match outcome {
        Outcome::Succeeded { message } => {
            (RunStatus::Succeeded, Some(message.as_str()), None, None)
        }
        Outcome::Failed { code, message } => (
            RunStatus::Failed,
            None,
            Some(code.as_str()),
            Some(message.as_str()),
        ),
    };
    // `tokens-per-day` sums what each run's `session_ended` counted, or the
    // tally of the runner's reports while it ran when that is more (no
    // `session_ended`, or one the workspace made up on a cancel:
    // `quota::enforce::tokens_used`).
    let tokens = termination
        .and_then(|t| serde_json::from_str::<asbx_protocol::session::Termination>(t).ok())
        .map(|t| {
            let s = t.stats;
            i64::try_from(s.input_tokens.saturating_add(s.output_tokens)).unwrap_or(i64::MAX)
        });
    let done = sqlx::query(
        "UPDATE runs SET status = $1, result = $2, error_code = $3, error_message = $4, \
         ended_at = $5, termination = $7, tokens = CASE WHEN $8 > tokens THEN $8 ELSE tokens END WHERE id = $6 AND status = 'running'",
    )
    .bind(status.as_str())
    .bind(result)
    .bind(code)
    .bind(message)
    .bind(now_ms)
    .bind(id)
    .bind(termination)
    .bind(tokens)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Clears the `/env` payload of every run that can no longer redeem its
/// setup token (used, or expired before `now_ms`): earlier versions copied
/// a named environment's secret values into it. How many were cleared.
pub(crate) async fn clear_spent_env<'c, E>(db: E, now_ms: i64) -> Result<u64, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let done = sqlx::query(
        "UPDATE runs SET env_json = '{}' WHERE env_json <> '{}' AND env_secrets IS NULL \
         AND NOT EXISTS (SELECT 1 FROM tokens WHERE tokens.session_id = runs.id \
         AND tokens.kind = 'setup' AND tokens.used_at IS NULL AND tokens.expires_at > $1)",
    )
    .bind(now_ms)
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}

fn from_row(r: &AnyRow) -> Result<RunRow, WorkspaceError> {
    Ok(RunRow {
        id: r.try_get("id")?,
        workspace_id: r.try_get("workspace_id")?,
        kind: parse_kind(&r.try_get::<String, _>("kind")?)?,
        chat_id: r.try_get("chat_id")?,
        agent_id: r.try_get("agent_id")?,
        status: parse_status(&r.try_get::<String, _>("status")?)?,
        prompt: r.try_get("prompt")?,
        model: r.try_get("model")?,
        env_json: r.try_get("env_json")?,
        env_secrets: r.try_get("env_secrets")?,
        config_json: r.try_get("config_json")?,
        result: r.try_get("result")?,
        error_code: r.try_get("error_code")?,
        error_message: r.try_get("error_message")?,
        created_at: r.try_get("created_at")?,
        ended_at: r.try_get("ended_at")?,
        termination: r.try_get("termination")?,
        sandbox_url: r.try_get("sandbox_url")?,
        events_from: r.try_get("events_from")?,
    })
}
