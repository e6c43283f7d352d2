//! The fold of a turn's lines into the assistant message (docs/protocol.md §7), so a
//! reloaded thread renders like the live stream. The message types are
//! `wire::PersistedMessage` and `wire::ContentBlock`.

use std::collections::HashMap;

use asbx_protocol::session::{EndReason, Termination};
use asbx_protocol::{Event, Line, StepStatus};

use crate::wire::{ContentBlock, STEP_OUTPUT_LIVE_BYTES, StepOutput};

/// What the live stream does with a line once the trace has seen it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LiveAction {
    /// Sent as it is (an SSE event named after its type).
    Send,
    /// Not sent as an event (`log`); chat threads hide it.
    Hide,
    /// A `heartbeat`: an SSE comment, so proxies keep the stream open.
    Comment,
    /// A `stdout` line past its step's budget: sent with its chunk cut to the
    /// first `keep` bytes and marked `truncated`, the last of its step.
    Truncate { keep: usize },
    /// A `stdout` line of a step already truncated: not sent.
    Drop,
}

/// Folds a turn's lines into content blocks: steps merged by id in order of
/// first appearance (with what they printed), then the result text or the
/// error with the session's termination fields.
#[derive(Debug, Default, Clone)]
pub(crate) struct TraceBuilder {
    blocks: Vec<ContentBlock>,
    /// Step id to its index in `blocks`.
    steps: HashMap<String, usize>,
    deltas: String,
    terminal: bool,
    termination: Option<Termination>,
}

impl TraceBuilder {
    /// Folds one line in and says how the live stream relays it, so what the
    /// browser saw and what a reload shows are the same.
    pub(crate) fn push(&mut self, line: &Line) -> LiveAction {
        match &line.event {
            Event::Step(step) => {
                self.step(step);
                LiveAction::Send
            }
            Event::Stdout(out) => self.stdout(out),
            Event::Delta(d) => {
                self.deltas.push_str(&d.text);
                LiveAction::Send
            }
            Event::Result(r) => {
                if !self.terminal {
                    self.terminal = true;
                    self.deltas.clear();
                    self.blocks.push(ContentBlock::Text {
                        text: r.message.clone(),
                    });
                }
                LiveAction::Send
            }
            Event::Error(e) => {
                if !self.terminal {
                    self.push_error(&e.code, &e.message, false);
                }
                LiveAction::Send
            }
            Event::SessionEnded(t) => {
                if t.reason != EndReason::Completed {
                    self.termination = Some(t.clone());
                }
                LiveAction::Send
            }
            Event::Log(_) => LiveAction::Hide,
            Event::Heartbeat(_) => LiveAction::Comment,
            Event::SessionInit(_) | Event::ToolCall(_) | Event::ToolResultApplied(_) => {
                LiveAction::Send
            }
        }
    }

    /// A `step` line: merged into its step's block by id (the fields it
    /// carries replace the block's), or a new block at its first appearance.
    fn step(&mut self, step: &asbx_protocol::line::Step) {
        match self
            .steps
            .get(&step.id)
            .and_then(|&i| self.blocks.get_mut(i))
        {
            Some(ContentBlock::Step {
                name,
                status,
                args,
                result,
                error,
                duration_ms,
                ..
            }) => {
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
            _ => {
                self.steps.insert(step.id.clone(), self.blocks.len());
                self.blocks.push(ContentBlock::Step {
                    id: step.id.clone(),
                    name: step.name.clone(),
                    status: step.status,
                    args: step.args.clone(),
                    result: step.result.clone(),
                    error: step.error.clone(),
                    duration_ms: step.duration_ms,
                    output: None,
                });
            }
        }
    }

    /// A `stdout` line: kept under its step up to the step's budget
    /// ([`STEP_OUTPUT_LIVE_BYTES`]), the line that crosses it cut and the
    /// rest dropped.
    fn stdout(&mut self, out: &asbx_protocol::line::Stdout) -> LiveAction {
        let Some(ContentBlock::Step { output, .. }) = self
            .steps
            .get(&out.step_id)
            .and_then(|&i| self.blocks.get_mut(i))
        else {
            // Output of a step never announced: nothing to show it under.
            return LiveAction::Drop;
        };
        let output = output.get_or_insert_with(StepOutput::default);
        if output.truncated {
            return LiveAction::Drop;
        }
        let room = STEP_OUTPUT_LIVE_BYTES.saturating_sub(output.text.len());
        if out.chunk.len() <= room {
            output.text.push_str(&out.chunk);
            return LiveAction::Send;
        }
        let keep = floor_char_boundary(&out.chunk, room);
        output.text.push_str(&out.chunk[..keep]);
        output.truncated = true;
        LiveAction::Truncate { keep }
    }

    /// Whether a terminal line (`result` or `error`) was seen.
    pub(crate) fn has_terminal(&self) -> bool {
        self.terminal
    }

    /// Records a failure the workspace saw itself (cancelled, runner gone);
    /// `interrupted` when the turn was lost rather than ended.
    pub(crate) fn push_error(&mut self, code: &str, message: &str, interrupted: bool) {
        self.terminal = true;
        if !self.deltas.is_empty() {
            let text = std::mem::take(&mut self.deltas);
            self.blocks.push(ContentBlock::Text { text });
        }
        self.blocks.push(ContentBlock::Error {
            code: code.to_owned(),
            message: message.to_owned(),
            termination: None,
            interrupted,
        });
    }

    /// Marks the last error as an interruption (the turn was lost).
    pub(crate) fn mark_interrupted(&mut self) {
        if let Some(ContentBlock::Error { interrupted, .. }) = self
            .blocks
            .iter_mut()
            .rev()
            .find(|b| matches!(b, ContentBlock::Error { .. }))
        {
            *interrupted = true;
        }
    }

    /// The blocks; steps still `running` at the end are marked `failed`, so
    /// history never shows a step spinning forever. The session's
    /// termination fields go on the error block.
    pub(crate) fn finish(mut self) -> Vec<ContentBlock> {
        if let Some(t) = self.termination.take() {
            let has_error = self
                .blocks
                .iter()
                .any(|b| matches!(b, ContentBlock::Error { .. }));
            if !has_error {
                let code = match t.reason {
                    EndReason::Terminated => asbx_protocol::codes::CANCELLED,
                    EndReason::Error | EndReason::Completed => asbx_protocol::codes::INTERNAL,
                };
                let message = t
                    .message
                    .clone()
                    .unwrap_or_else(|| "the session ended without an answer".to_owned());
                self.push_error(code, &message, false);
            }
            if let Some(ContentBlock::Error { termination, .. }) = self
                .blocks
                .iter_mut()
                .rev()
                .find(|b| matches!(b, ContentBlock::Error { .. }))
            {
                *termination = Some(t);
            }
        }
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

/// The largest char boundary of `s` at or below `at`.
fn floor_char_boundary(s: &str, at: usize) -> usize {
    if at >= s.len() {
        return s.len();
    }
    (0..=at).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0)
}

/// The SSE data of a `stdout` line cut to its first `keep` bytes: the line's
/// own fields plus `"truncated": true`.
pub(crate) fn truncated_stdout(line: &Line, keep: usize) -> Option<String> {
    let Event::Stdout(out) = &line.event else {
        return None;
    };
    let value = serde_json::json!({
        "type": "stdout",
        "seq": line.seq,
        "ts": line.ts,
        "sessionId": line.session_id,
        "stepId": out.step_id,
        "stream": out.stream,
        "chunk": out.chunk.get(..keep).unwrap_or(""),
        "truncated": true,
    });
    serde_json::to_string(&value).ok()
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
                termination: None,
                interrupted: false,
            }],
            file_attachments: vec![],
            created_at: 5,
            turn_id: None,
        };
        assert_eq!(m.replay_text(), "(this turn failed: cancelled: stopped)");
        assert_eq!(m.to_chat_turn().ts, 5);
    }

    #[test]
    fn step_output_is_bounded_once_and_kept() {
        let mut t = TraceBuilder::default();
        t.push(&line(
            json!({"type":"step","id":"a","name":"shell","status":"running"}),
        ));
        let stdout = |chunk: &str| {
            line(json!({"type":"stdout","stepId":"a","stream":"stdout","chunk":chunk}))
        };
        assert_eq!(t.push(&stdout("hello\n")), LiveAction::Send);
        let big = "é".repeat(STEP_OUTPUT_LIVE_BYTES);
        let cut = t.push(&stdout(&big));
        let LiveAction::Truncate { keep } = cut else {
            panic!("{cut:?}")
        };
        // Cut on a character boundary, within the budget.
        assert!(big.is_char_boundary(keep));
        assert!(keep <= STEP_OUTPUT_LIVE_BYTES - 6);
        assert!(keep + 2 > STEP_OUTPUT_LIVE_BYTES - 6);
        assert_eq!(t.push(&stdout("more")), LiveAction::Drop);
        // Another step has its own budget; unknown steps show nothing.
        t.push(&line(
            json!({"type":"step","id":"b","name":"shell","status":"running"}),
        ));
        let other = line(json!({"type":"stdout","stepId":"b","stream":"stderr","chunk":"x"}));
        assert_eq!(t.push(&other), LiveAction::Send);
        let stray = line(json!({"type":"stdout","stepId":"zz","stream":"stdout","chunk":"x"}));
        assert_eq!(t.push(&stray), LiveAction::Drop);

        let data: Value =
            serde_json::from_str(&truncated_stdout(&stdout(&big), keep).unwrap()).unwrap();
        assert_eq!(data["truncated"], true);
        assert_eq!(data["chunk"].as_str().unwrap().len(), keep);

        let blocks = serde_json::to_value(t.finish()).unwrap();
        let out = &blocks[0]["output"];
        assert_eq!(out["truncated"], true);
        let text = out["text"].as_str().unwrap();
        assert_eq!(text.len(), 6 + keep);
        assert!(text.starts_with("hello\n"));
        assert_eq!(blocks[1]["output"], json!({"text": "x"}));
    }

    #[test]
    fn termination_goes_on_the_error_and_deltas_give_way_to_the_result() {
        let ended = |reason: &str| {
            line(
                json!({"type":"session_ended","reason":reason,"terminatedBy":"agent",
                "exitCode":3,"stderr":{"tail":"scripted crash","truncated":false,"totalLines":1},
                "stats":{"durationMs":5,"steps":1,"toolCalls":0,"inputTokens":1,"outputTokens":1}}),
            )
        };
        let mut t = TraceBuilder::default();
        t.push(&line(json!({"type":"delta","text":"par"})));
        t.push(&line(
            json!({"type":"error","code":"sandbox_crashed","message":"gone"}),
        ));
        assert_eq!(t.push(&ended("error")), LiveAction::Send);
        let v = serde_json::to_value(t.finish()).unwrap();
        assert_eq!(v[0], json!({"type":"text","text":"par"}));
        assert_eq!(v[1]["code"], "sandbox_crashed");
        assert_eq!(v[1]["termination"]["exitCode"], 3);
        assert_eq!(v[1]["termination"]["stderr"]["tail"], "scripted crash");

        // A completed session adds nothing; the result replaces the deltas.
        let mut t = TraceBuilder::default();
        t.push(&line(json!({"type":"delta","text":"Hel"})));
        t.push(&line(json!({"type":"delta","text":"lo"})));
        t.push(&line(json!({"type":"result","message":"Hello"})));
        t.push(&ended("completed"));
        assert_eq!(
            serde_json::to_value(t.finish()).unwrap(),
            json!([{"type":"text","text":"Hello"}])
        );

        // A terminated session without an error line still shows why.
        let mut t = TraceBuilder::default();
        t.push(&ended("terminated"));
        let v = serde_json::to_value(t.finish()).unwrap();
        assert_eq!(v[0]["type"], "error");
        assert_eq!(v[0]["code"], "cancelled");
        assert_eq!(v[0]["termination"]["reason"], "terminated");

        // Heartbeats are comments, logs hidden.
        let mut t = TraceBuilder::default();
        assert_eq!(
            t.push(&line(json!({"type":"heartbeat"}))),
            LiveAction::Comment
        );
        assert_eq!(
            t.push(&line(json!({"type":"log","level":"info","message":"x"}))),
            LiveAction::Hide
        );
    }
}
