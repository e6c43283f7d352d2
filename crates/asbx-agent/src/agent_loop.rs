//! The agent loop: call the model, run the tools it asks for through the
//! [`Toolbox`] (each one a `step`, or a `tool_call` pair for a client
//! tool), feed the results back, until it answers without tool calls.
//!
//! Limits: `max_steps` bounds model calls (a final answer must come within
//! that many calls), `max_tool_calls` bounds tool calls over the run; the
//! run's `max_duration` is enforced by the caller around this loop.

use crate::bootstrap::Limits;
use crate::emit::Emitter;
use crate::error::AgentError;
use crate::providers::{DeltaSink, Message, ModelRequest, Provider, Usage};
use crate::tools::Toolbox;

/// Running totals, kept by the caller so they survive a duration timeout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) usage: Usage,
    pub(crate) model_calls: u32,
    pub(crate) tool_calls: u32,
}

/// Runs the loop to a final answer.
pub(crate) async fn run(
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
            let out = tools
                .call(emitter, counters.tool_calls, &call)
                .await
                .map_err(AgentError::Output)?;
            let is_error = out.is_error();
            req.messages.push(Message::ToolResult {
                call_id: call.id,
                name: call.name,
                content: out.model_text,
                is_error,
            });
        }
    }
}
