//! The agent loop: call the model, run the tools it asks for (each one a
//! `step`), feed the results back, until it answers without tool calls.
//!
//! A call of a client tool (protocol 2) goes to the client instead
//! ([`crate::client_tools`]): a `tool_call` / `tool_result_applied` pair, no
//! `step` lines.
//!
//! Limits: `max_steps` bounds model calls (a final answer must come within
//! that many calls), `max_tool_calls` bounds tool calls over the run; the
//! run's `max_duration` is enforced by the caller around this loop.

use std::time::Instant;

use crate::bootstrap::Limits;
use crate::emit::Emitter;
use crate::error::AgentError;
use crate::providers::{DeltaSink, Message, ModelRequest, Provider, Usage};
use crate::tools::Toolbox;

/// What a successful loop produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoopOutcome {
    /// The final answer.
    pub text: String,
    pub usage: Usage,
    pub model_calls: u32,
    pub tool_calls: u32,
}

/// Running totals, kept by the caller so they survive a duration timeout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub usage: Usage,
    pub model_calls: u32,
    pub tool_calls: u32,
}

fn step_id(n: u32) -> String {
    format!("step_{n}_{:08x}", rand::random::<u32>())
}

fn io(e: std::io::Error) -> AgentError {
    AgentError::Output(e)
}

/// Runs the loop to a final answer.
pub async fn run(
    provider: &dyn Provider,
    mut req: ModelRequest,
    limits: &Limits,
    tools: &Toolbox,
    emitter: &Emitter,
    counters: &mut Counters,
) -> Result<String, AgentError> {
    let sink = DeltaSink::new(emitter);
    loop {
        if counters.model_calls >= limits.max_steps {
            return Err(AgentError::StepLimit(limits.max_steps));
        }
        counters.model_calls += 1;
        let turn = provider.turn(&req, &sink).await?;
        counters.usage.input_tokens += turn.usage.input_tokens;
        counters.usage.output_tokens += turn.usage.output_tokens;
        if turn.tool_calls.is_empty() {
            return Ok(turn.text);
        }
        req.messages.push(Message::Assistant {
            text: turn.text.clone(),
            tool_calls: turn.tool_calls.clone(),
        });
        for call in turn.tool_calls {
            if counters.tool_calls >= limits.max_tool_calls {
                return Err(AgentError::ToolLimit(limits.max_tool_calls));
            }
            counters.tool_calls += 1;
            if tools.client.offers(&call.name) {
                let out = tools
                    .client
                    .call(
                        emitter,
                        counters.tool_calls,
                        &call.name,
                        &call.args,
                        tools.ctx.output_bytes,
                    )
                    .await
                    .map_err(io)?;
                let is_error = out.is_error();
                req.messages.push(Message::ToolResult {
                    call_id: call.id,
                    name: call.name,
                    content: out.model_text,
                    is_error,
                });
                continue;
            }
            let id = step_id(counters.tool_calls);
            let step_name = tools.step_name(&call.name, &call.args);
            emitter
                .step_running(&id, &step_name, call.args.clone())
                .await
                .map_err(io)?;
            let started = Instant::now();
            let out = tools.run(&id, &call.name, &call.args).await;
            let ms = started.elapsed().as_millis() as u64;
            let is_error = out.is_error();
            emitter
                .step_finished(&id, &step_name, out.display, ms)
                .await
                .map_err(io)?;
            req.messages.push(Message::ToolResult {
                call_id: call.id,
                name: call.name,
                content: out.model_text,
                is_error,
            });
        }
    }
}
