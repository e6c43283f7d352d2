//! `scripted`: a deterministic built-in model. It is NOT a real model.
//!
//! It exists so the whole system (runner, jail, tools, writeback, consumers)
//! can be exercised without a provider. It needs no gateway.
//!
//! It reads the prompt like any model: from the request, as the last user
//! message of the conversation. If that prompt, trimmed, starts with a JSON
//! object whose `script` is an array (text after the object is ignored), the
//! model follows it; each model call consumes elements until one of them
//! produces an answer:
//!
//! - `{"tool": "<name>", "args": {..}}`: one tool call.
//! - `{"tools": [{"tool": .., "args": ..}, ..]}`: several tool calls at once.
//! - `{"say": "text"}`: the final answer (ends the loop). With
//!   `"stream_ms": N` it streams word by word (one `delta` line per word,
//!   N ms apart), as a real model streams tokens.
//! - `{"fail": "message"}`: the call fails (`error` line `model_error` with
//!   that message; never retried).
//! - `{"sleep_ms": N}`: waits N ms, then goes on with the next element within
//!   the same call.
//! - `{"crash": N}`: prints `scripted crash` to stderr and exits the agent
//!   process at once with code N (for the runner's `sandbox_crashed` tests).
//!
//! When the script runs out the answer is `Done.`. Any other prompt runs a
//! demo: `shell` with `uname -sr && ls -la`, then `write_file` of
//! `out/hello.txt`, then an answer starting "This is the scripted model, not
//! a real model." Token usage is estimated as bytes / 4.

use std::sync::Mutex;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::model::{
    DeltaSink, Message, ModelError, ModelRequest, ModelTurn, Provider, ToolCallRequest, Usage,
};

/// The provider name of the scripted model.
pub(crate) const NAME: &str = "scripted";

/// The demo's shell command.
pub(crate) const DEMO_COMMAND: &str = "uname -sr && ls -la";

/// The opening of the demo's final answer.
pub(crate) const DEMO_PREFIX: &str = "This is the scripted model, not a real model.";

#[derive(Debug)]
enum Mode {
    Script(Vec<Value>),
    Demo,
}

#[derive(Debug, Default)]
struct State {
    /// Read from the first request.
    mode: Option<Mode>,
    next: usize,
    calls: u64,
}

/// The scripted model for one run.
#[derive(Debug, Default)]
pub(crate) struct Scripted {
    state: Mutex<State>,
}

enum Action {
    Answer(ModelTurn),
    /// An answer streamed word by word, this many ms apart.
    Stream(ModelTurn, u64),
    Sleep(u64),
}

impl Scripted {
    /// The mode the prompt (the last user message) asks for.
    fn mode_of(req: &ModelRequest) -> Mode {
        let prompt = req.messages.iter().rev().find_map(|m| match m {
            Message::User(text) => Some(text.as_str()),
            Message::Assistant { .. } | Message::ToolResult { .. } => None,
        });
        // The prompt may go on after the object (a chat appends the list of
        // attached files): only the first JSON value counts.
        let first = prompt.and_then(|p| {
            serde_json::Deserializer::from_str(p.trim())
                .into_iter::<Value>()
                .next()
        });
        match first {
            Some(Ok(Value::Object(mut o))) => match o.remove("script") {
                Some(Value::Array(steps)) => Mode::Script(steps),
                _ => Mode::Demo,
            },
            _ => Mode::Demo,
        }
    }

    /// Decides the next action; never holds the lock across an await.
    fn next_action(&self, req: &ModelRequest) -> Result<Action, ModelError> {
        let mut st = self
            .state
            .lock()
            .map_err(|_| ModelError::Provider("scripted: state poisoned".into()))?;
        let st = &mut *st;
        let mode = st.mode.get_or_insert_with(|| Self::mode_of(req));
        match mode {
            Mode::Demo => {
                let stage = st.next;
                st.next += 1;
                st.calls += 1;
                let id = format!("call_{}", st.calls);
                Ok(Action::Answer(match stage {
                    0 => tool_turn(vec![ToolCallRequest {
                        id,
                        name: "shell".into(),
                        args: json!({ "command": DEMO_COMMAND }),
                    }]),
                    1 => tool_turn(vec![ToolCallRequest {
                        id,
                        name: "write_file".into(),
                        args: json!({
                            "path": "out/hello.txt",
                            "content": "Hello from the asbx scripted model (not a real model).\n",
                        }),
                    }]),
                    _ => text_turn(demo_summary(req)),
                }))
            }
            Mode::Script(steps) => {
                let Some(step) = steps.get(st.next) else {
                    return Ok(Action::Answer(text_turn("Done.".into())));
                };
                st.next += 1;
                if let Some(ms) = step.get("sleep_ms") {
                    return Ok(Action::Sleep(ms.as_u64().unwrap_or(0)));
                }
                if let Some(code) = step.get("crash") {
                    let code = code.as_i64().unwrap_or(1) as i32;
                    eprintln!("scripted crash");
                    std::process::exit(code);
                }
                if let Some(text) = step.get("say") {
                    let turn = text_turn(value_text(text));
                    return Ok(match step.get("stream_ms").and_then(Value::as_u64) {
                        Some(ms) => Action::Stream(turn, ms),
                        None => Action::Answer(turn),
                    });
                }
                if let Some(msg) = step.get("fail") {
                    return Err(ModelError::Provider(value_text(msg)));
                }
                if step.get("tool").is_some() {
                    st.calls += 1;
                    let call = to_call(step, st.calls)?;
                    return Ok(Action::Answer(tool_turn(vec![call])));
                }
                if let Some(Value::Array(tools)) = step.get("tools") {
                    let mut calls = Vec::with_capacity(tools.len());
                    for t in tools {
                        st.calls += 1;
                        calls.push(to_call(t, st.calls)?);
                    }
                    return Ok(Action::Answer(tool_turn(calls)));
                }
                Err(ModelError::Provider(format!(
                    "scripted: unknown script element {step}"
                )))
            }
        }
    }
}

impl Provider for Scripted {
    fn turn<'a>(
        &'a self,
        req: &'a ModelRequest,
        sink: &'a DeltaSink,
    ) -> BoxFuture<'a, Result<ModelTurn, ModelError>> {
        Box::pin(async move {
            loop {
                match self.next_action(req)? {
                    Action::Sleep(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                    Action::Stream(mut turn, ms) => {
                        for (i, word) in words(&turn.text).enumerate() {
                            if i > 0 {
                                tokio::time::sleep(Duration::from_millis(ms)).await;
                            }
                            sink.delta(word).await;
                        }
                        turn.usage = Usage {
                            input_tokens: estimate_input(req),
                            output_tokens: estimate_output(&turn),
                        };
                        return Ok(turn);
                    }
                    Action::Answer(mut turn) => {
                        sink.delta(&turn.text).await;
                        turn.usage = Usage {
                            input_tokens: estimate_input(req),
                            output_tokens: estimate_output(&turn),
                        };
                        return Ok(turn);
                    }
                }
            }
        })
    }
}

/// `text` cut after each run of whitespace: the pieces join back to `text`.
fn words(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let word_end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let end = rest[word_end..]
            .find(|c: char| !c.is_whitespace())
            .map_or(rest.len(), |i| word_end + i);
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn to_call(step: &Value, n: u64) -> Result<ToolCallRequest, ModelError> {
    let name = step
        .get("tool")
        .and_then(Value::as_str)
        .ok_or_else(|| ModelError::Provider(format!("scripted: bad tool element {step}")))?;
    Ok(ToolCallRequest {
        id: format!("call_{n}"),
        name: name.to_owned(),
        args: step.get("args").cloned().unwrap_or_else(|| json!({})),
    })
}

fn tool_turn(tool_calls: Vec<ToolCallRequest>) -> ModelTurn {
    ModelTurn {
        text: String::new(),
        tool_calls,
        usage: Usage::default(),
    }
}

fn text_turn(text: String) -> ModelTurn {
    ModelTurn {
        text,
        tool_calls: Vec::new(),
        usage: Usage::default(),
    }
}

fn demo_summary(req: &ModelRequest) -> String {
    let mut parts = Vec::new();
    for m in &req.messages {
        if let Message::ToolResult {
            name,
            content,
            is_error,
            ..
        } = m
        {
            let first = content
                .lines()
                .find(|l| !l.trim().is_empty() && !l.ends_with(':'))
                .unwrap_or("");
            let status = if *is_error { "failed" } else { "ok" };
            parts.push(format!("`{name}` ({status}): {first}"));
        }
    }
    format!(
        "{DEMO_PREFIX} It ran `{DEMO_COMMAND}` with the shell tool and wrote out/hello.txt \
         with write_file. Results: {}.",
        parts.join("; ")
    )
}

fn estimate_input(req: &ModelRequest) -> u64 {
    let mut bytes = req.system.as_ref().map_or(0, String::len);
    for m in &req.messages {
        bytes += match m {
            Message::User(t) => t.len(),
            Message::Assistant { text, tool_calls } => {
                text.len()
                    + tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.args.to_string().len())
                        .sum::<usize>()
            }
            Message::ToolResult { content, .. } => content.len(),
        };
    }
    (bytes as u64).div_ceil(4)
}

fn estimate_output(turn: &ModelTurn) -> u64 {
    let bytes = turn.text.len()
        + turn
            .tool_calls
            .iter()
            .map(|c| c.name.len() + c.args.to_string().len())
            .sum::<usize>();
    (bytes as u64).div_ceil(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request whose conversation ends with `prompt`, as the loop sends it.
    fn req(prompt: &str) -> ModelRequest {
        ModelRequest {
            model: "x".into(),
            system: None,
            messages: vec![
                Message::User("an earlier turn".into()),
                Message::User(prompt.into()),
            ],
            tools: vec![],
        }
    }

    #[tokio::test]
    async fn follows_a_script() {
        let r = req(
            r#" {"script":[{"sleep_ms":1},{"tool":"shell","args":{"command":"ls"}},
                {"tools":[{"tool":"a","args":{}},{"tool":"b"}]},{"say":"hi"}]} "#,
        );
        let s = Scripted::default();
        let sink = DeltaSink::none();
        let t = s.turn(&r, &sink).await.unwrap();
        assert_eq!(t.tool_calls.len(), 1);
        assert_eq!(t.tool_calls[0].args, json!({"command":"ls"}));
        let t = s.turn(&r, &sink).await.unwrap();
        assert_eq!(t.tool_calls.len(), 2);
        assert_eq!(t.tool_calls[1].name, "b");
        assert_ne!(t.tool_calls[0].id, t.tool_calls[1].id);
        assert_eq!(s.turn(&r, &sink).await.unwrap().text, "hi");
        assert_eq!(s.turn(&r, &sink).await.unwrap().text, "Done.");
    }

    #[tokio::test]
    async fn the_prompt_is_the_last_user_message() {
        // A script in an earlier user turn is not this turn's prompt.
        let mut r = req("hello there");
        r.messages[0] = Message::User(r#"{"script":[{"say":"old"}]}"#.into());
        let t = Scripted::default()
            .turn(&r, &DeltaSink::none())
            .await
            .unwrap();
        assert_eq!(t.tool_calls[0].name, "shell", "{t:?}");
    }

    #[tokio::test]
    async fn fail_is_a_provider_error() {
        let s = Scripted::default();
        let e = s
            .turn(&req(r#"{"script":[{"fail":"boom"}]}"#), &DeltaSink::none())
            .await
            .unwrap_err();
        assert!(matches!(e, ModelError::Provider(m) if m == "boom"));
    }

    #[test]
    fn words_join_back() {
        for text in ["", "one", "a b  c", " lead and trail ", "héllo wörld\nnext"] {
            assert_eq!(words(text).collect::<String>(), text);
        }
        assert_eq!(words("a b  c").collect::<Vec<_>>(), ["a ", "b  ", "c"]);
    }

    #[tokio::test]
    async fn demo_without_script() {
        let s = Scripted::default();
        let r = req("hello there");
        let sink = DeltaSink::none();
        let t = s.turn(&r, &sink).await.unwrap();
        assert_eq!(t.tool_calls[0].name, "shell");
        let t = s.turn(&r, &sink).await.unwrap();
        assert_eq!(t.tool_calls[0].name, "write_file");
        let t = s.turn(&r, &sink).await.unwrap();
        assert!(t.text.starts_with(DEMO_PREFIX));
    }
}
