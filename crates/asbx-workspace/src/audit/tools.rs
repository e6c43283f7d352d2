//! Tool calls from a run's stored lines: each `step` line that ends a
//! step (`succeeded`, `failed`) becomes a `tool_call` record (name,
//! status, duration, and a command's `exitCode` from its result), never
//! its arguments or output.

use asbx_protocol::line::{Event, Line, Step};
use asbx_protocol::{StepStatus, audit::AuditEvent};

use crate::AppState;
use crate::error::WorkspaceError;

/// Where the `type` of a line the runner wrote sits: within its first
/// bytes (`seq`, `ts`, `sessionId` come before it).
const TYPE_WITHIN: usize = 160;

/// Appends a `tool_call` record for each finished step among `rows`.
pub(crate) async fn record(state: &AppState, run_id: &str, rows: &[(u64, &[u8])]) {
    let events: Vec<AuditEvent> = rows.iter().filter_map(|(_, raw)| tool_call(raw)).collect();
    if !events.is_empty() {
        super::record_for_run(state, run_id, events).await;
    }
}

/// [`record`] inside the caller's write transaction `tx`, which stores
/// `rows` for run `run_id` of `workspace`: the lines and their records
/// commit together.
pub(crate) async fn record_in(
    tx: &mut sqlx::AnyConnection,
    now_ms: i64,
    workspace: &str,
    run_id: &str,
    rows: &[(u64, &[u8])],
) -> Result<(), WorkspaceError> {
    let events = rows.iter().filter_map(|(_, raw)| tool_call(raw)).collect();
    let pending = super::Scope::run(run_id).pending(workspace, now_ms, events);
    super::store::append_in(tx, workspace, &pending).await
}

/// The `tool_call` of one stored line, if it ends a step. Only lines whose
/// head says `"type":"step"` are decoded.
fn tool_call(raw: &[u8]) -> Option<AuditEvent> {
    let head = &raw[..raw.len().min(TYPE_WITHIN)];
    let needle = br#""type":"step""#;
    if !head.windows(needle.len()).any(|w| w == needle) {
        return None;
    }
    let line: Line = serde_json::from_slice(raw).ok()?;
    let Event::Step(Step {
        name,
        status,
        result,
        duration_ms,
        ..
    }) = line.event
    else {
        return None;
    };
    let status = match status {
        StepStatus::Running => return None,
        StepStatus::Succeeded => "succeeded",
        StepStatus::Failed => "failed",
    };
    let exit_code = result
        .as_ref()
        .and_then(|r| r.get("exitCode"))
        .and_then(serde_json::Value::as_i64);
    Some(AuditEvent::ToolCall {
        name,
        status: status.to_owned(),
        duration_ms,
        exit_code,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_finished_step_is_a_tool_call() {
        let running = br#"{"seq":2,"ts":1,"sessionId":"s","type":"step","id":"a","name":"shell","status":"running","args":{"command":"ls"}}"#;
        let done = br#"{"seq":3,"ts":2,"sessionId":"s","type":"step","id":"a","name":"shell","status":"succeeded","result":{"exitCode":3,"stdout":"x"},"durationMs":12}"#;
        let log = br#"{"seq":4,"ts":2,"sessionId":"s","type":"log","level":"info","message":"\"type\":\"step\""}"#;
        assert_eq!(tool_call(running), None);
        assert_eq!(tool_call(log), None);
        assert_eq!(
            tool_call(done),
            Some(AuditEvent::ToolCall {
                name: "shell".to_owned(),
                status: "succeeded".to_owned(),
                duration_ms: Some(12),
                exit_code: Some(3),
            })
        );
    }
}
