//! Client tools (protocol 2, docs/protocol.md §4): tools the client executes.
//!
//! The dispatch's `client_tools` reach the agent in the bootstrap. In
//! protocol 2 they are offered to the model beside the built-in, skill and
//! MCP tools, under their own names; one whose name is taken by another tool,
//! repeated, not wire-safe (`^[A-Za-z0-9_-]{1,64}$`), or whose `parameters`
//! is not a JSON object (or over [`MAX_SCHEMA_BYTES`]) is left out with a
//! `warn` log line. In protocol 1 none is offered.
//!
//! When the model calls one, the agent:
//!
//! 1. writes `{"type":"tool_call","callId":..,"toolName":..,"args":..}`
//!    (flushed), with a fresh call id `call_<n>_<16 hex>`;
//! 2. asks the gateway `GET /client-tool/{callId}` on its Unix socket. The
//!    runner holds that request open until the client answers, then answers
//!    `200` with `{"result": <any JSON>}` or `{"error": "<message>"}`
//!    (`404`: unknown call, `410`: the session is ending);
//! 3. on an answer writes `{"type":"tool_result_applied","callId":..}` and
//!    gives the model the result (a JSON string as its text, anything else
//!    serialized), or `error: <message>` as a failed call.
//!
//! A transport failure, a non-`200` status or an answer that is neither
//! shape is a failed call too (the model sees `error: ...`) and the loop goes
//! on; as no answer from the client reached the agent, there is no
//! `tool_result_applied` line, but a `warn` log line naming the call id.
//!
//! Waiting has no timeout of its own (a human may be answering): only the
//! run's `max_duration` bounds it, through the deadline around the loop.
//! A client call counts toward `max_tool_calls` and writes no `step` lines:
//! the `tool_call` / `tool_result_applied` pair is its trace.

use std::collections::HashSet;

use asbx_protocol::dispatch::ClientTool;
use asbx_protocol::line::{ToolCall, ToolResultApplied};
use asbx_protocol::{Event, LogLevel};
use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::Value;

use asbx_protocol::gateway::CLIENT_TOOL_PREFIX;
use asbx_protocol::rules::truncate_with_marker;

use super::context::ToolOutput;
use super::mcp::MAX_SCHEMA_BYTES;
use crate::emit::Emitter;
use crate::gateway_client::{GatewayClient, GatewayError};
use crate::providers::ToolSpec;

/// Longest client error message passed on to the model.
const ERROR_BYTES: usize = 4096;

/// The client tools offered in one run.
#[derive(Debug, Default)]
pub(crate) struct ClientTools {
    specs: Vec<ToolSpec>,
    gateway: Option<GatewayClient>,
}

/// Whether `name` is a wire-safe tool name for every provider.
pub(crate) use asbx_protocol::rules::names::valid_tool_name as valid_name;

/// A fresh call id: `call_<n>_<16 hex>`, within `^[A-Za-z0-9_-]{1,64}$`.
pub(crate) fn call_id(n: u32) -> String {
    format!("call_{n}_{:016x}", rand::random::<u64>())
}

impl ClientTools {
    /// Picks the client tools to offer; `taken` holds every other tool's
    /// name. Returns the warnings for the tools left out.
    pub(crate) fn select(
        gateway: GatewayClient,
        offered: &[ClientTool],
        taken: &HashSet<String>,
    ) -> (ClientTools, Vec<String>) {
        let mut specs: Vec<ToolSpec> = Vec::new();
        let mut warnings = Vec::new();
        for t in offered {
            let why = if !valid_name(&t.name) {
                Some("its name is not ^[A-Za-z0-9_-]{1,64}$".to_owned())
            } else if taken.contains(&t.name) {
                Some("its name is taken by a built-in, skill or MCP tool".to_owned())
            } else if specs.iter().any(|s| s.name == t.name) {
                Some("a client tool of that name came first".to_owned())
            } else if !t.parameters.is_object() {
                Some("its parameters are not a JSON Schema object".to_owned())
            } else if t.parameters.to_string().len() > MAX_SCHEMA_BYTES {
                Some(format!("its parameters exceed {MAX_SCHEMA_BYTES} bytes"))
            } else {
                None
            };
            match why {
                Some(why) => warnings.push(format!(
                    "client tool {:?} left out: {why}",
                    truncate_with_marker(&t.name, 80)
                )),
                None => specs.push(ToolSpec {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    parameters: t.parameters.clone(),
                }),
            }
        }
        (
            ClientTools {
                specs,
                gateway: Some(gateway),
            },
            warnings,
        )
    }

    pub(crate) fn specs(&self) -> impl Iterator<Item = ToolSpec> + '_ {
        self.specs.iter().cloned()
    }

    /// Whether the model's call of `name` goes to the client.
    pub(crate) fn offers(&self, name: &str) -> bool {
        self.specs.iter().any(|s| s.name == name)
    }

    /// Runs one client call: `tool_call`, wait, `tool_result_applied`.
    ///
    /// `n` numbers the call in the run. `Err` only when stdout fails.
    pub(crate) async fn call(
        &self,
        emitter: &Emitter,
        n: u32,
        name: &str,
        args: &Value,
        output_bytes: usize,
    ) -> std::io::Result<ToolOutput> {
        let id = call_id(n);
        emitter
            .emit(&Event::ToolCall(ToolCall {
                call_id: id.clone(),
                tool_name: name.to_owned(),
                args: args.clone(),
            }))
            .await?;
        let answer = match &self.gateway {
            Some(gw) => wait(gw, &id).await,
            None => Err("no gateway for client tools".to_owned()),
        };
        let answer = match answer {
            Ok(a) => {
                emitter
                    .emit(&Event::ToolResultApplied(ToolResultApplied {
                        call_id: id.clone(),
                    }))
                    .await?;
                a
            }
            Err(why) => {
                let msg = format!("client tool {name} (call {id}) got no answer: {why}");
                emitter.log(LogLevel::Warn, msg.clone()).await?;
                Answer::Failed(msg)
            }
        };
        Ok(match answer {
            Answer::Result(v) => {
                let text = match v {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                let text = truncate_with_marker(&text, output_bytes);
                ToolOutput {
                    model_text: text.clone(),
                    display: Ok(Value::String(text)),
                }
            }
            Answer::Failed(m) => ToolOutput::failed(truncate_with_marker(&m, ERROR_BYTES)),
        })
    }
}

/// What the client answered.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Answer {
    Result(Value),
    Failed(String),
}

/// Parses the gateway's `200` body: `{"result": any}` or `{"error": string}`.
pub(crate) fn parse_answer(body: &[u8]) -> Result<Answer, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("invalid answer: {e}"))?;
    let Value::Object(mut o) = v else {
        return Err("invalid answer: not a JSON object".into());
    };
    match (o.remove("result"), o.remove("error")) {
        (Some(r), None) => Ok(Answer::Result(r)),
        (None, Some(Value::String(e))) => Ok(Answer::Failed(e)),
        (None, Some(other)) => Ok(Answer::Failed(other.to_string())),
        (Some(_), Some(_)) => Err("invalid answer: both `result` and `error`".into()),
        (None, None) => Err("invalid answer: neither `result` nor `error`".into()),
    }
}

/// `GET /client-tool/{callId}`, held open by the gateway until the answer.
async fn wait(gw: &GatewayClient, id: &str) -> Result<Answer, String> {
    let path = format!("{CLIENT_TOOL_PREFIX}{id}");
    match gw.send_collect(Method::GET, &path, &[], Bytes::new()).await {
        Ok(body) => parse_answer(&body),
        Err(GatewayError::Status { status, body }) => Err(match status {
            StatusCode::NOT_FOUND => format!("the runner does not know this call (404): {body}"),
            StatusCode::GONE => format!("the session is ending (410): {body}"),
            s => format!("the gateway answered {s}: {body}"),
        }),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tool(name: &str, parameters: Value) -> ClientTool {
        ClientTool {
            name: name.into(),
            description: format!("the {name} tool"),
            parameters,
        }
    }

    #[test]
    fn call_ids_are_wire_safe_and_distinct() {
        let a = call_id(1);
        let b = call_id(1);
        assert_ne!(a, b);
        assert!(valid_name(&a), "{a}");
        assert!(valid_name(&call_id(u32::MAX)));
    }

    #[test]
    fn select_leaves_out_clashes_and_bad_tools() {
        let obj = json!({"type": "object"});
        let taken: HashSet<String> = ["shell".to_owned(), "srv__x".to_owned()].into();
        let (ct, warnings) = ClientTools::select(
            GatewayClient::new("/nonexistent"),
            &[
                tool("pick_color", obj.clone()),
                tool("shell", obj.clone()),
                tool("srv__x", obj.clone()),
                tool("pick_color", obj.clone()),
                tool("bad name", obj.clone()),
                tool("no_schema", json!("string")),
                tool("confirm", obj),
            ],
            &taken,
        );
        let names: Vec<String> = ct.specs().map(|s| s.name).collect();
        assert_eq!(names, ["pick_color", "confirm"]);
        assert_eq!(warnings.len(), 5, "{warnings:?}");
        assert!(ct.offers("confirm") && !ct.offers("shell"));
        assert_eq!(ClientTools::default().specs().count(), 0);
    }

    #[test]
    fn answers_parse() {
        assert_eq!(
            parse_answer(br#"{"result":{"a":1}}"#),
            Ok(Answer::Result(json!({"a":1})))
        );
        assert_eq!(
            parse_answer(br#"{"result":null}"#),
            Ok(Answer::Result(Value::Null))
        );
        assert_eq!(
            parse_answer(br#"{"error":"no"}"#),
            Ok(Answer::Failed("no".into()))
        );
        assert!(parse_answer(br#"{}"#).is_err());
        assert!(parse_answer(br#"{"result":1,"error":"x"}"#).is_err());
        assert!(parse_answer(b"[1]").is_err());
        assert!(parse_answer(b"nope").is_err());
    }
}
