//! OpenAI-compatible chat completions, streamed (`stream: true` with
//! `stream_options.include_usage`).
//!
//! Tool calls arrive as deltas keyed by `index` and are assembled here; one
//! response may hold several. A turn is returned only when the stream says it
//! is complete (`[DONE]` or a `finish_reason`); a body that ends earlier is a
//! cut stream and is retried from scratch.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::model::{
    DeltaSink, Message, ModelError, ModelRequest, ModelTurn, Provider, ToolCallRequest, Usage,
};
use super::settings::HttpSettings;
use super::sse;
use crate::gateway_client::GatewayClient;

/// An OpenAI-compatible provider reached at `/model/{name}/chat/completions`.
#[derive(Debug)]
pub(crate) struct OpenAi {
    gateway: GatewayClient,
    path: String,
    settings: HttpSettings,
}

impl OpenAi {
    pub(crate) fn new(gateway: GatewayClient, name: String, settings: HttpSettings) -> Self {
        OpenAi {
            gateway,
            path: format!("/model/{name}/chat/completions"),
            settings,
        }
    }
}

#[derive(Debug, Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<ChatMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<ChatTool<'a>>,
    stream: bool,
    stream_options: StreamOptions,
}

#[derive(Debug, Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Debug, Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum ChatMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: &'a str,
    },
    Assistant {
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ChatToolCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: &'a str,
    },
}

#[derive(Debug, Serialize)]
struct ChatToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionCall<'a>,
}

#[derive(Debug, Serialize)]
struct FunctionCall<'a> {
    name: &'a str,
    arguments: String,
}

#[derive(Debug, Serialize)]
struct ChatTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionDef<'a>,
}

#[derive(Debug, Serialize)]
struct FunctionDef<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

fn body(req: &ModelRequest) -> Result<Bytes, ModelError> {
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if let Some(s) = &req.system {
        messages.push(ChatMessage::System { content: s });
    }
    for m in &req.messages {
        messages.push(match m {
            Message::User(t) => ChatMessage::User { content: t },
            Message::Assistant { text, tool_calls } => ChatMessage::Assistant {
                content: (!text.is_empty() || tool_calls.is_empty()).then_some(text.as_str()),
                tool_calls: tool_calls
                    .iter()
                    .map(|c| ChatToolCall {
                        id: &c.id,
                        kind: "function",
                        function: FunctionCall {
                            name: &c.name,
                            arguments: match &c.args {
                                Value::String(raw) => raw.clone(),
                                other => other.to_string(),
                            },
                        },
                    })
                    .collect(),
            },
            Message::ToolResult {
                call_id, content, ..
            } => ChatMessage::Tool {
                tool_call_id: call_id,
                content,
            },
        });
    }
    let body = ChatRequest {
        model: &req.model,
        messages,
        tools: req
            .tools
            .iter()
            .map(|t| ChatTool {
                kind: "function",
                function: FunctionDef {
                    name: &t.name,
                    description: &t.description,
                    parameters: &t.parameters,
                },
            })
            .collect(),
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
    };
    serde_json::to_vec(&body)
        .map(Bytes::from)
        .map_err(|e| ModelError::Protocol(e.to_string()))
}

#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<ChunkUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Option<ChoiceDelta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ChoiceDelta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCallDelta>,
}

#[derive(Debug, Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<usize>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Debug, Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ChunkUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Parses tool arguments; keeps the raw text as a string when it is not JSON.
pub(crate) fn parse_args(raw: &str) -> Value {
    if raw.trim().is_empty() {
        return Value::Object(Default::default());
    }
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))
}

async fn attempt(p: &OpenAi, body: Bytes, sink: &DeltaSink) -> Result<ModelTurn, ModelError> {
    let mut reader = sse::open(
        &p.gateway,
        &p.path,
        &[("accept", "text/event-stream")],
        body,
        p.settings.stall_timeout,
    )
    .await?;
    let mut text = String::new();
    let mut calls: BTreeMap<usize, PartialCall> = BTreeMap::new();
    let mut usage = Usage::default();
    let mut finished = false;
    let mut done = false;
    while let Some(ev) = reader.next_event().await? {
        let data = ev.data.trim();
        if data == "[DONE]" {
            done = true;
            break;
        }
        if data.is_empty() {
            continue;
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| ModelError::Protocol(format!("bad chunk: {e}")))?;
        if let Some(err) = chunk.error {
            let msg = err
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| err.to_string(), str::to_owned);
            return Err(ModelError::Provider(msg));
        }
        if let Some(u) = chunk.usage {
            usage = Usage {
                input_tokens: u.prompt_tokens,
                output_tokens: u.completion_tokens,
            };
        }
        for choice in chunk.choices {
            if choice.finish_reason.is_some() {
                finished = true;
            }
            let Some(delta) = choice.delta else { continue };
            if let Some(t) = delta.content.filter(|t| !t.is_empty()) {
                sink.delta(&t).await;
                text.push_str(&t);
            }
            for (pos, tc) in delta.tool_calls.into_iter().enumerate() {
                let slot = calls.entry(tc.index.unwrap_or(pos)).or_default();
                if let Some(id) = tc.id {
                    slot.id.push_str(&id);
                }
                if let Some(f) = tc.function {
                    if let Some(n) = f.name {
                        slot.name.push_str(&n);
                    }
                    if let Some(a) = f.arguments {
                        slot.arguments.push_str(&a);
                    }
                }
            }
        }
    }
    if !done && !finished {
        return Err(ModelError::StreamCut(
            "the response ended without a finish_reason".into(),
        ));
    }
    let tool_calls = calls
        .into_iter()
        .map(|(i, c)| ToolCallRequest {
            id: if c.id.is_empty() {
                format!("call_{i}")
            } else {
                c.id
            },
            name: c.name,
            args: parse_args(&c.arguments),
        })
        .collect();
    Ok(ModelTurn {
        text,
        tool_calls,
        usage,
    })
}

impl Provider for OpenAi {
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
