//! The public view of a run: its row and the files it wrote back.

use crate::AppState;
use crate::error::WorkspaceError;
use crate::files::file_info;
use crate::files::store as files;
use crate::runs::store as runs;
use crate::wire::{RunError, RunRecord};

/// Loads a run of `workspace_id`; another workspace's run is not found.
pub(crate) async fn load(
    state: &AppState,
    workspace_id: &str,
    id: &str,
) -> Result<RunRecord, WorkspaceError> {
    let not_found = || WorkspaceError::NotFound(format!("run {id}"));
    let run = runs::get(state.store.pool(), id)
        .await?
        .filter(|r| r.workspace_id == workspace_id)
        .ok_or_else(not_found)?;
    let files = files::list_for_run(state.store.pool(), id).await?;
    let error = match (run.error_code, run.error_message) {
        (Some(code), message) => Some(RunError {
            code,
            message: message.unwrap_or_default(),
        }),
        (None, _) => None,
    };
    Ok(RunRecord {
        id: run.id,
        kind: run.kind,
        chat_id: run.chat_id,
        agent_id: run.agent_id,
        status: run.status,
        prompt: run.prompt,
        model: run.model,
        result: run.result,
        error,
        files: files.iter().map(file_info).collect(),
        created_at: run.created_at,
        ended_at: run.ended_at,
        termination: run
            .termination
            .as_deref()
            .and_then(|t| serde_json::from_str(t).ok()),
    })
}
