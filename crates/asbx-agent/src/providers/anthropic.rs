//! Anthropic Messages, streamed (`/messages` with `stream: true`).
//!
//! Content blocks are `text` and `tool_use` (arguments streamed as
//! `input_json_delta`); tool results go back as `tool_result` blocks in a
//! user message. Usage comes from `message_start` and `message_delta`. A
//! turn is returned only after `message_stop`; a body that ends earlier is a
//! cut stream and is retried from scratch.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::model::{
    DeltaSink, Message, ModelError, ModelRequest, ModelTurn, Provider, ToolCallRequest, Usage,
};
use super::openai::parse_args;
use super::settings::HttpSettings;
use super::sse;
use crate::gateway_client::GatewayClient;

/// The `anthropic-version` header sent with each call.
pub(crate) const API_VERSION: &str = "2023-06-01";

/// Output token budget per call.
pub(crate) const MAX_TOKENS: u32 = 8192;

/// An Anthropic provider reached at `/model/{name}/messages`.
#[derive(Debug)]
pub(crate) struct Anthropic {
    gateway: GatewayClient,
    path: String,
    settings: HttpSettings,
}

impl Anthropic {
    pub(crate) fn new(gateway: GatewayClient, name: String, settings: HttpSettings) -> Self {
        Anthropic {
            gateway,
            path: format!("/model/{name}/messages"),
            settings,
        }
    }
}

#[derive(Debug, Serialize)]
struct MessagesRequest<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<&'a str>,
    messages: Vec<ApiMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<ApiTool<'a>>,
    stream: bool,
}

#[derive(Debug, Serialize)]
struct ApiMessage<'a> {
    role: &'static str,
    content: Vec<Block<'a>>,
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Value,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: &'a str,
        is_error: bool,
    },
}

#[derive(Debug, Serialize)]
struct ApiTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
}

/// Appends blocks, merging them into the last message when it has the same
/// role: Anthropic wants alternating roles (several tool results, replayed
/// user turns in a row).
fn push<'a>(messages: &mut Vec<ApiMessage<'a>>, role: &'static str, blocks: Vec<Block<'a>>) {
    if blocks.is_empty() {
        return;
    }
    match messages.last_mut() {
        Some(last) if last.role == role => last.content.extend(blocks),
        _ => messages.push(ApiMessage {
            role,
            content: blocks,
        }),
    }
}

fn body(req: &ModelRequest) -> Result<Bytes, ModelError> {
    let mut messages: Vec<ApiMessage<'_>> = Vec::new();
    for m in &req.messages {
        match m {
            Message::User(t) => {
                if !t.is_empty() {
                    push(&mut messages, "user", vec![Block::Text { text: t }]);
                }
            }
            Message::Assistant { text, tool_calls } => {
                let mut blocks = Vec::new();
                if !text.is_empty() {
                    blocks.push(Block::Text { text });
                }
                for c in tool_calls {
                    blocks.push(Block::ToolUse {
                        id: &c.id,
                        name: &c.name,
                        input: match &c.args {
                            Value::Object(_) => c.args.clone(),
                            _ => Value::Object(Default::default()),
                        },
                    });
                }
                push(&mut messages, "assistant", blocks);
            }
            Message::ToolResult {
                call_id,
                content,
                is_error,
                ..
            } => push(
                &mut messages,
                "user",
                vec![Block::ToolResult {
                    tool_use_id: call_id,
                    content,
                    is_error: *is_error,
                }],
            ),
        }
    }
    let body = MessagesRequest {
        model: &req.model,
        max_tokens: MAX_TOKENS,
        system: req.system.as_deref(),
        messages,
        tools: req
            .tools
            .iter()
            .map(|t| ApiTool {
                name: &t.name,
                description: &t.description,
                input_schema: &t.parameters,
            })
            .collect(),
        stream: true,
    };
    serde_json::to_vec(&body)
        .map(Bytes::from)
        .map_err(|e| ModelError::Protocol(e.to_string()))
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StreamEvent {
    MessageStart {
        message: StartMessage,
    },
    ContentBlockStart {
        index: usize,
        content_block: StartBlock,
    },
    ContentBlockDelta {
        index: usize,
        delta: BlockDelta,
    },
    ContentBlockStop {
        #[allow(dead_code)]
        index: usize,
    },
    MessageDelta {
        #[serde(default)]
        usage: Option<ApiUsage>,
    },
    MessageStop,
    Ping,
    Error {
        error: ApiError,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
struct StartMessage {
    #[serde(default)]
    usage: Option<ApiUsage>,
}

#[derive(Debug, Deserialize)]
struct ApiUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StartBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta {
    TextDelta {
        text: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
struct ApiError {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    message: String,
}

#[derive(Debug)]
enum Partial {
    Text(String),
    Tool {
        id: String,
        name: String,
        json: String,
    },
    Other,
}

async fn attempt(p: &Anthropic, body: Bytes, sink: &DeltaSink) -> Result<ModelTurn, ModelError> {
    let mut reader = sse::open(
        &p.gateway,
        &p.path,
        &[
            ("accept", "text/event-stream"),
            ("anthropic-version", API_VERSION),
        ],
        body,
        p.settings.stall_timeout,
    )
    .await?;
    let mut answer = Answer::default();
    while let Some(ev) = reader.next_event().await? {
        if ev.data.trim().is_empty() {
            continue;
        }
        let parsed: StreamEvent = serde_json::from_str(&ev.data)
            .map_err(|e| ModelError::Protocol(format!("bad event: {e}")))?;
        answer.apply(parsed, sink).await?;
        if answer.stopped {
            break;
        }
    }
    answer.finish()
}

/// One streamed answer as its events arrive: the content blocks by index,
/// the usage, whether `message_stop` came.
#[derive(Default)]
struct Answer {
    blocks: BTreeMap<usize, Partial>,
    usage: Usage,
    stopped: bool,
}

impl Answer {
    /// Takes one event in (text deltas go to `sink` too); an `error` event
    /// ends the attempt.
    async fn apply(&mut self, event: StreamEvent, sink: &DeltaSink) -> Result<(), ModelError> {
        match event {
            StreamEvent::MessageStart { message } => {
                if let Some(u) = message.usage {
                    self.usage.input_tokens = u.input_tokens.unwrap_or(0);
                    self.usage.output_tokens = u.output_tokens.unwrap_or(0);
                }
            }
            StreamEvent::ContentBlockStart {
                index,
                content_block,
            } => {
                let part = match content_block {
                    StartBlock::Text { text } => {
                        sink.delta(&text).await;
                        Partial::Text(text)
                    }
                    StartBlock::ToolUse { id, name } => Partial::Tool {
                        id,
                        name,
                        json: String::new(),
                    },
                    StartBlock::Other => Partial::Other,
                };
                self.blocks.insert(index, part);
            }
            StreamEvent::ContentBlockDelta { index, delta } => {
                match (self.blocks.get_mut(&index), delta) {
                    (Some(Partial::Text(t)), BlockDelta::TextDelta { text }) => {
                        sink.delta(&text).await;
                        t.push_str(&text);
                    }
                    (
                        Some(Partial::Tool { json, .. }),
                        BlockDelta::InputJsonDelta { partial_json },
                    ) => {
                        json.push_str(&partial_json);
                    }
                    (_, _) => {}
                }
            }
            StreamEvent::MessageDelta { usage: Some(u) } => {
                if let Some(i) = u.input_tokens {
                    self.usage.input_tokens = i;
                }
                if let Some(o) = u.output_tokens {
                    self.usage.output_tokens = o;
                }
            }
            StreamEvent::MessageStop => self.stopped = true,
            StreamEvent::Error { error } => {
                let retryable = matches!(error.kind.as_str(), "overloaded_error" | "api_error");
                let message = if error.message.is_empty() {
                    error.kind
                } else {
                    error.message
                };
                return Err(if retryable {
                    ModelError::StreamCut(message)
                } else {
                    ModelError::Provider(message)
                });
            }
            StreamEvent::ContentBlockStop { .. }
            | StreamEvent::MessageDelta { usage: None }
            | StreamEvent::Ping
            | StreamEvent::Other => {}
        }
        Ok(())
    }

    /// The complete turn, once `message_stop` came.
    fn finish(self) -> Result<ModelTurn, ModelError> {
        if !self.stopped {
            return Err(ModelError::StreamCut(
                "the response ended before message_stop".into(),
            ));
        }
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        for (_, b) in self.blocks {
            match b {
                Partial::Text(t) => text.push_str(&t),
                Partial::Tool { id, name, json } => tool_calls.push(ToolCallRequest {
                    id,
                    name,
                    args: parse_args(&json),
                }),
                Partial::Other => {}
            }
        }
        Ok(ModelTurn {
            text,
            tool_calls,
            usage: self.usage,
        })
    }
}

impl Provider for Anthropic {
    fn turn<'a>(
        &'a self,
        req: &'a ModelRequest,
        sink: &'a DeltaSink,
    ) -> BoxFuture<'a, Result<ModelTurn, ModelError>> {
        Box::pin(async move {
            let body = body(req)?;
            self.settings
                .retry
                .run(|| attempt(self, body.clone(), sink))
                .await
        })
    }
}
