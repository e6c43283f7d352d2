//! The fold of a turn's lines into the assistant message (docs/protocol.md §7), so a
//! reloaded thread renders like the live stream. The message types are
//! `wire::PersistedMessage` and `wire::ContentBlock`.

use asbx_protocol::{Event, Line, StepStatus};

use crate::wire::ContentBlock;

/// Folds a turn's lines into content blocks: steps merged by id in order of
/// first appearance, then the result text or the error.
#[derive(Debug, Default, Clone)]
pub(crate) struct TraceBuilder {
    blocks: Vec<ContentBlock>,
    deltas: String,
    terminal: bool,
}

impl TraceBuilder {
    pub(crate) fn push(&mut self, line: &Line) {
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
    pub(crate) fn push_error(&mut self, code: &str, message: &str) {
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

    /// The blocks; steps still `running` at the end are marked `failed`, so
    /// history never shows a step spinning forever.
    pub(crate) fn finish(mut self) -> Vec<ContentBlock> {
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
    use crate::wire::PersistedMessage;
    use asbx_protocol::callback::Role;
    use serde_json::{Value, json};

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
