//! Runs: one row per dispatch to the runner, keyed by the session id.

use sqlx::any::AnyRow;
use sqlx::{Any, Executor, Row as _};

use crate::error::WorkspaceError;

/// What a run is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKind {
    /// `POST /api/runs`.
    Run,
    /// A chat turn.
    Chat,
    /// `POST /api/agents/{id}/runs`: a stored agent (a workflow's Agents block).
    Agent,
}

impl RunKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::Run => "run",
            RunKind::Chat => "chat",
            RunKind::Agent => "agent",
        }
    }
}

/// The state of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Running,
    Succeeded,
    Failed,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Result<Self, WorkspaceError> {
        match s {
            "running" => Ok(RunStatus::Running),
            "succeeded" => Ok(RunStatus::Succeeded),
            "failed" => Ok(RunStatus::Failed),
            other => Err(WorkspaceError::Corrupt(format!("run status {other:?}"))),
        }
    }
}

/// A new run, before it is dispatched.
#[derive(Debug, Clone)]
pub struct NewRun<'a> {
    pub id: &'a str,
    pub workspace_id: &'a str,
    pub kind: RunKind,
    pub chat_id: Option<&'a str>,
    pub agent_id: Option<&'a str>,
    pub prompt: &'a str,
    pub model: &'a str,
    pub env_json: &'a str,
    pub config_json: &'a str,
    pub now_ms: i64,
}

/// A stored run.
#[derive(Debug, Clone)]
pub struct RunRow {
    pub id: String,
    pub workspace_id: String,
    pub kind: String,
    pub chat_id: Option<String>,
    pub agent_id: Option<String>,
    pub status: RunStatus,
    pub prompt: String,
    pub model: String,
    pub env_json: String,
    pub config_json: String,
    pub result: Option<String>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub created_at: i64,
    pub ended_at: Option<i64>,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Succeeded { message: String },
    Failed { code: String, message: String },
}

const COLUMNS: &str = "id, workspace_id, kind, chat_id, agent_id, status, prompt, model, env_json, \
    config_json, result, error_code, error_message, created_at, ended_at";

pub async fn insert<'c, E>(db: E, run: &NewRun<'_>) -> Result<(), WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    sqlx::query(
        "INSERT INTO runs (id, workspace_id, kind, chat_id, agent_id, status, prompt, model, \
         env_json, config_json, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
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
    .execute(db)
    .await?;
    Ok(())
}

pub async fn get<'c, E>(db: E, id: &str) -> Result<Option<RunRow>, WorkspaceError>
where
    E: Executor<'c, Database = Any>,
{
    let row = sqlx::query(&format!("SELECT {COLUMNS} FROM runs WHERE id = $1"))
        .bind(id)
        .fetch_optional(db)
        .await?;
    row.map(|r| from_row(&r)).transpose()
}

/// Records how a run ended; only a running run changes, so the first
/// recorded outcome wins.
pub async fn finish<'c, E>(
    db: E,
    id: &str,
    outcome: &Outcome,
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
    let done = sqlx::query(
        "UPDATE runs SET status = $1, result = $2, error_code = $3, error_message = $4, \
         ended_at = $5 WHERE id = $6 AND status = 'running'",
    )
    .bind(status.as_str())
    .bind(result)
    .bind(code)
    .bind(message)
    .bind(now_ms)
    .bind(id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

fn from_row(r: &AnyRow) -> Result<RunRow, WorkspaceError> {
    Ok(RunRow {
        id: r.try_get("id")?,
        workspace_id: r.try_get("workspace_id")?,
        kind: r.try_get("kind")?,
        chat_id: r.try_get("chat_id")?,
        agent_id: r.try_get("agent_id")?,
        status: RunStatus::parse(&r.try_get::<String, _>("status")?)?,
        prompt: r.try_get("prompt")?,
        model: r.try_get("model")?,
        env_json: r.try_get("env_json")?,
        config_json: r.try_get("config_json")?,
        result: r.try_get("result")?,
        error_code: r.try_get("error_code")?,
        error_message: r.try_get("error_message")?,
        created_at: r.try_get("created_at")?,
        ended_at: r.try_get("ended_at")?,
    })
}
