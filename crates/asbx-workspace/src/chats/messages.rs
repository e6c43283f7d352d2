//! Persisted chat messages (seed 003) and the fold of a turn's lines into
//! the assistant message, so a reloaded thread renders like the live stream.

use asbx_protocol::callback::{ChatTurn, Role};
use asbx_protocol::{Event, Line, StepStatus};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One message of a chat.
///
/// - `id`: stable message id.
/// - `role`: `user` or `assistant`.
/// - `content`: the content blocks, in display order.
/// - `fileAttachments`: bag files the user attached to this message.
/// - `createdAt`: Unix epoch ms.
/// - `turnId`: the turn (run) this message belongs to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PersistedMessage {
    pub id: String,
    pub role: Role,
    pub content: Vec<ContentBlock>,
    #[serde(default)]
    pub file_attachments: Vec<FileAttachment>,
    pub created_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
}

/// A content block.
///
/// - `text`: message text (the user's message, or the `result` line).
/// - `step`: one step of the trace, its `running` and final line merged;
///   `result` is the tool's structured output.
/// - `error`: the turn failed with this code and message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "type",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub enum ContentBlock {
    Text {
        text: String,
    },
    Step {
        id: String,
        name: String,
        status: StepStatus,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        args: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duration_ms: Option<u64>,
    },
    Error {
        code: String,
        message: String,
    },
}

/// A bag file attached to a user message, denormalized so history renders
/// the chip without another lookup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileAttachment {
    pub id: String,
    pub name: String,
    pub mime_type: String,
    pub size: i64,
}

impl PersistedMessage {
    /// The text this message contributes to the replayed conversation.
    pub fn replay_text(&self) -> String {
        let mut text = String::new();
        let mut error = None;
        for block in &self.content {
            match block {
                ContentBlock::Text { text: t } => {
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(t);
                }
                ContentBlock::Error { code, message } => error = Some((code, message)),
                ContentBlock::Step { .. } => {}
            }
        }
        if !self.file_attachments.is_empty() {
            let names: Vec<_> = self
                .file_attachments
                .iter()
                .map(|f| f.name.as_str())
                .collect();
            text.push_str(&format!("\n[attached: {}]", names.join(", ")));
        }
        match (text.is_empty(), error) {
            (true, Some((code, message))) => format!("(this turn failed: {code}: {message})"),
            _ => text,
        }
    }

    pub fn to_chat_turn(&self) -> ChatTurn {
        ChatTurn {
            role: self.role,
            content: self.replay_text(),
            ts: u64::try_from(self.created_at).unwrap_or(0),
        }
    }
}

/// Folds a turn's lines into content blocks: steps merged by id in order of
/// first appearance, then the result text or the error.
#[derive(Debug, Default, Clone)]
pub struct TraceBuilder {
    blocks: Vec<ContentBlock>,
    deltas: String,
    terminal: bool,
}

impl TraceBuilder {
    pub fn push(&mut self, line: &Line) {
        match &line.event {
            Event::Step(step) => {
                let existing = self.blocks.iter_mut().find_map(|b| match b {
                    ContentBlock::Step {
                        id,
                        name,
                        status,
                        args,
                        result,
                        error,
                        duration_ms,
                    } if *id == step.id => Some((name, status, args, result, error, duration_ms)),
                    _ => None,
                });
                match existing {
                    Some((name, status, args, result, error, duration_ms)) => {
                        name.clone_from(&step.name);
                        *status = step.status;
                        if step.args.is_some() {
                            args.clone_from(&step.args);
                        }
                        if step.result.is_some() {
                            result.clone_from(&step.result);
                        }
                        if step.error.is_some() {
                            error.clone_from(&step.error);
                        }
                        if step.duration_ms.is_some() {
                            *duration_ms = step.duration_ms;
                        }
                    }
                    None => self.blocks.push(ContentBlock::Step {
                        id: step.id.clone(),
                        name: step.name.clone(),
                        status: step.status,
                        args: step.args.clone(),
                        result: step.result.clone(),
                        error: step.error.clone(),
                        duration_ms: step.duration_ms,
                    }),
                }
            }
            Event::Delta(d) => self.deltas.push_str(&d.text),
            Event::Result(r) if !self.terminal => {
                self.terminal = true;
                self.blocks.push(ContentBlock::Text {
                    text: r.message.clone(),
                });
            }
            Event::Error(e) if !self.terminal => {
                self.terminal = true;
                self.push_error(&e.code, &e.message);
            }
            Event::Result(_)
            | Event::Error(_)
            | Event::Log(_)
            | Event::SessionInit(_)
            | Event::Stdout(_)
            | Event::ToolCall(_)
            | Event::ToolResultApplied(_)
            | Event::Heartbeat(_)
            | Event::SessionEnded(_) => {}
        }
    }

    /// Records a failure the workspace saw itself (cancelled, runner gone).
    pub fn push_error(&mut self, code: &str, message: &str) {
        self.terminal = true;
        if !self.deltas.is_empty() {
            let text = std::mem::take(&mut self.deltas);
            self.blocks.push(ContentBlock::Text { text });
        }
        self.blocks.push(ContentBlock::Error {
            code: code.to_owned(),
            message: message.to_owned(),
        });
    }

    pub fn is_terminal(&self) -> bool {
        self.terminal
    }

    /// The blocks; steps still `running` at the end are marked `failed`, so
    /// history never shows a step spinning forever.
    pub fn finish(mut self) -> Vec<ContentBlock> {
        if !self.terminal && !self.deltas.is_empty() {
            let text = std::mem::take(&mut self.deltas);
            self.blocks.push(ContentBlock::Text { text });
        }
        for block in &mut self.blocks {
            if let ContentBlock::Step { status, error, .. } = block
                && *status == StepStatus::Running
            {
                *status = StepStatus::Failed;
                error.get_or_insert_with(|| "the turn ended before this step finished".into());
            }
        }
        self.blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn line(v: Value) -> Line {
        let mut v = v;
        v["seq"] = 1.into();
        v["ts"] = 1.into();
        v["sessionId"] = "s".into();
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn steps_merge_by_id_and_result_becomes_text() {
        let mut t = TraceBuilder::default();
        t.push(&line(json!({"type":"step","id":"a","name":"shell","status":"running","args":{"command":"ls"}})));
        t.push(&line(
            json!({"type":"step","id":"b","name":"read_file","status":"running"}),
        ));
        t.push(&line(json!({"type":"log","level":"info","message":"x"})));
        t.push(&line(json!({"type":"step","id":"a","name":"shell","status":"succeeded","result":{"exitCode":0},"durationMs":3})));
        t.push(&line(json!({"type":"result","message":"done"})));
        let blocks = t.finish();
        let v = serde_json::to_value(&blocks).unwrap();
        assert_eq!(
            v,
            json!([
                {"type":"step","id":"a","name":"shell","status":"succeeded","args":{"command":"ls"},"result":{"exitCode":0},"durationMs":3},
                {"type":"step","id":"b","name":"read_file","status":"failed","error":"the turn ended before this step finished"},
                {"type":"text","text":"done"}
            ])
        );
    }

    #[test]
    fn replay_text_of_a_failed_turn() {
        let m = PersistedMessage {
            id: "m".into(),
            role: Role::Assistant,
            content: vec![ContentBlock::Error {
                code: "cancelled".into(),
                message: "stopped".into(),
            }],
            file_attachments: vec![],
            created_at: 5,
            turn_id: None,
        };
        assert_eq!(m.replay_text(), "(this turn failed: cancelled: stopped)");
        assert_eq!(m.to_chat_turn().ts, 5);
    }
}
