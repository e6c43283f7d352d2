//! Client tools (protocol 2): `tool_call`, the wait on the gateway's
//! `GET /client-tool/{callId}`, `tool_result_applied`, the answer fed to the
//! model. Every line is checked by the runner's validator in the harness.

use asbx_protocol::callback::RunLimits;
use asbx_protocol::dispatch::ClientTool;
use asbx_protocol::gateway::ProviderKind;
use asbx_protocol::line::StepStatus;
use asbx_protocol::{Event, LogLevel, Protocol};
use asbx_test_support::{ClientToolAnswer, Tape};
use serde_json::{Value, json};

use crate::harness::{Harness, Live, Outcome, script};

fn pick_color() -> ClientTool {
    ClientTool {
        name: "pick_color".into(),
        description: "Ask the user to pick a color.".into(),
        parameters: json!({
            "type": "object",
            "properties": {"hint": {"type": "string"}},
            "required": ["hint"]
        }),
    }
}

fn count(events: &[Event], ty: &str) -> usize {
    events.iter().filter(|e| e.type_name() == ty).count()
}

fn position(events: &[Event], f: impl Fn(&Event) -> bool) -> usize {
    events
        .iter()
        .position(f)
        .unwrap_or_else(|| panic!("line not found in {events:#?}"))
}

fn warnings(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Log(l) if l.level == LogLevel::Warn => Some(l.message.clone()),
            _ => None,
        })
        .collect()
}

fn id_ok(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Reads up to the next `tool_call`, checks the agent is waiting on its
/// gateway call, and returns its call id, tool name and args.
async fn next_call(live: &mut Live) -> (String, String, Value) {
    let Event::ToolCall(c) = live.until("tool_call").await else {
        unreachable!()
    };
    assert!(id_ok(&c.call_id), "bad call id {}", c.call_id);
    assert!(
        live.gateway.wait_for_client_tool(&c.call_id).await,
        "the agent must wait on GET /client-tool/{}",
        c.call_id
    );
    (c.call_id, c.tool_name, c.args)
}

/// `tool_call` id, then `tool_result_applied` with the same id, then the
/// terminal line; no step lines.
fn assert_pair(o: &Outcome, id: &str) {
    let call = position(
        &o.events,
        |e| matches!(e, Event::ToolCall(c) if c.call_id == id),
    );
    let applied = position(
        &o.events,
        |e| matches!(e, Event::ToolResultApplied(a) if a.call_id == id),
    );
    assert!(call < applied, "tool_call before tool_result_applied");
    assert!(
        applied < o.events.len() - 1,
        "applied before the terminal line"
    );
    assert_eq!(count(&o.events, "step"), 0, "client calls have no steps");
}

#[tokio::test]
async fn scripted_client_call_waits_for_the_answer() {
    let mut h = Harness::scripted(&script(json!([
        {"tool": "pick_color", "args": {"hint": "warm"}},
        {"say": "done"}
    ])));
    h.protocol = Protocol::V2;
    h.client_tools = vec![pick_color()];
    let mut live = h.start().await;
    let (id, name, args) = next_call(&mut live).await;
    assert_eq!(name, "pick_color");
    assert_eq!(args, json!({"hint": "warm"}));
    // The agent is blocked on the gateway: nothing after the tool_call yet.
    assert_eq!(
        live.gateway.client_tools_waiting(),
        std::slice::from_ref(&id)
    );
    assert!(matches!(live.events.last(), Some(Event::ToolCall(_))));

    live.gateway
        .answer_client_tool(&id, ClientToolAnswer::Result(json!({"color": "red"})));
    let Event::ToolResultApplied(a) = live.until("tool_result_applied").await else {
        unreachable!()
    };
    assert_eq!(a.call_id, id);
    let o = live.finish().await;
    assert_eq!(o.result(), "done");
    assert_pair(&o, &id);
    assert_eq!(o.gateway.client_tool_requests(), [id]);
}

#[tokio::test]
async fn openai_gets_the_client_result_as_the_tool_message() {
    let mut h = Harness::with_mock(ProviderKind::Openai).await;
    h.protocol = Protocol::V2;
    h.client_tools = vec![pick_color()];
    h.mock()
        .push(Tape::tool_call("pick_color", json!({"hint": "cool"})));
    h.mock().push(Tape::text("You picked teal."));
    let mut live = h.start().await;
    let (id, _, args) = next_call(&mut live).await;
    assert_eq!(args, json!({"hint": "cool"}));
    live.gateway.answer_client_tool(
        &id,
        ClientToolAnswer::Result(json!({"color": "teal", "n": 1})),
    );
    let o = live.finish().await;
    assert_eq!(o.result(), "You picked teal.");
    assert_pair(&o, &id);

    let reqs = o.mock.as_ref().unwrap().requests();
    assert_eq!(reqs.len(), 2);
    // Offered like a built-in tool, after them.
    let tools = reqs[0].body["tools"].as_array().unwrap();
    let names: Vec<&str> = tools
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "shell",
            "read_file",
            "write_file",
            "list_files",
            "pick_color"
        ]
    );
    let f = &tools[4]["function"];
    assert_eq!(f["description"], "Ask the user to pick a color.");
    assert_eq!(f["parameters"], pick_color().parameters);

    let msgs = reqs[1].body["messages"].as_array().unwrap();
    let assistant = &msgs[msgs.len() - 2];
    let model_call_id = &assistant["tool_calls"][0]["id"];
    let tool_msg = msgs.last().unwrap();
    assert_eq!(tool_msg["role"], "tool");
    assert_eq!(&tool_msg["tool_call_id"], model_call_id);
    let content: Value = serde_json::from_str(tool_msg["content"].as_str().unwrap()).unwrap();
    assert_eq!(content, json!({"color": "teal", "n": 1}));
}

#[tokio::test]
async fn client_error_reaches_the_model_and_the_run_goes_on() {
    let mut h = Harness::with_mock(ProviderKind::Openai).await;
    h.protocol = Protocol::V2;
    h.client_tools = vec![pick_color()];
    h.mock()
        .push(Tape::tool_call("pick_color", json!({"hint": "any"})));
    h.mock().push(Tape::tool_call(
        "shell",
        json!({"command": "echo carry-on"}),
    ));
    h.mock().push(Tape::text("Fine, no color."));
    let mut live = h.start().await;
    let (id, _, _) = next_call(&mut live).await;
    live.gateway
        .answer_client_tool(&id, ClientToolAnswer::Error("user declined".into()));
    let o = live.finish().await;
    assert_eq!(o.result(), "Fine, no color.");
    // The client's error is an answer: applied, then the loop goes on.
    assert_eq!(count(&o.events, "tool_result_applied"), 1);
    let steps = o.finished_steps();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].name, "shell");
    assert_eq!(steps[0].status, StepStatus::Succeeded);

    let reqs = o.mock.as_ref().unwrap().requests();
    assert_eq!(reqs.len(), 3);
    let msgs = reqs[1].body["messages"].as_array().unwrap();
    let tool_msg = msgs.last().unwrap();
    assert_eq!(tool_msg["role"], "tool");
    assert_eq!(tool_msg["content"], "error: user declined");
}

#[tokio::test]
async fn gateway_refusal_is_a_failed_call_without_applied() {
    let mut h = Harness::with_mock(ProviderKind::Openai).await;
    h.protocol = Protocol::V2;
    h.client_tools = vec![pick_color()];
    h.mock()
        .push(Tape::tool_call("pick_color", json!({"hint": "any"})));
    h.mock().push(Tape::text("The session is ending."));
    let mut live = h.start().await;
    let (id, _, _) = next_call(&mut live).await;
    live.gateway
        .answer_client_tool(&id, ClientToolAnswer::Status(410, "session ending".into()));
    let o = live.finish().await;
    assert_eq!(o.result(), "The session is ending.");
    assert_eq!(count(&o.events, "tool_call"), 1);
    assert_eq!(count(&o.events, "tool_result_applied"), 0);
    let w = warnings(&o.events);
    assert!(
        w.iter().any(|m| m.contains(&id) && m.contains("410")),
        "{w:?}"
    );
    let reqs = o.mock.as_ref().unwrap().requests();
    let tool_msg = reqs[1].body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    let content = tool_msg["content"].as_str().unwrap();
    assert!(content.starts_with("error: "), "{content}");
    assert!(content.contains("410"), "{content}");
}

#[tokio::test]
async fn protocol1_never_offers_client_tools() {
    // The harness also asserts every line is a protocol 1 type.
    let mut h = Harness::with_mock(ProviderKind::Openai).await;
    h.client_tools = vec![pick_color()];
    h.mock().push(Tape::text("plain"));
    let o = h.run().await;
    assert_eq!(o.result(), "plain");
    let reqs = o.mock.as_ref().unwrap().requests();
    let names: Vec<&str> = reqs[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["shell", "read_file", "write_file", "list_files"]);
    assert!(
        warnings(&o.events)
            .iter()
            .any(|m| m.contains("need protocol 2")),
        "{:?}",
        warnings(&o.events)
    );
}

#[tokio::test]
async fn protocol1_call_by_a_client_tool_name_is_an_unknown_tool() {
    let mut h = Harness::scripted(&script(json!([
        {"tool": "pick_color", "args": {"hint": "warm"}},
        {"say": "done"}
    ])));
    h.client_tools = vec![pick_color()];
    let o = h.run().await;
    assert_eq!(o.result(), "done");
    let steps = o.finished_steps();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].status, StepStatus::Failed);
    assert!(o.gateway.client_tool_requests().is_empty());
}

#[tokio::test]
async fn a_client_tool_named_like_a_builtin_is_left_out() {
    let mut h = Harness::with_mock(ProviderKind::Openai).await;
    h.protocol = Protocol::V2;
    h.client_tools = vec![
        ClientTool {
            name: "shell".into(),
            description: "the client's shell".into(),
            parameters: json!({"type": "object"}),
        },
        pick_color(),
    ];
    h.mock().push(Tape::text("ok"));
    let o = h.run().await;
    assert_eq!(o.result(), "ok");
    let reqs = o.mock.as_ref().unwrap().requests();
    let tools = reqs[0].body["tools"].as_array().unwrap();
    let shells: Vec<&Value> = tools
        .iter()
        .filter(|t| t["function"]["name"] == "shell")
        .collect();
    assert_eq!(shells.len(), 1);
    assert_ne!(shells[0]["function"]["description"], "the client's shell");
    assert!(tools.iter().any(|t| t["function"]["name"] == "pick_color"));
    let w = warnings(&o.events);
    assert!(
        w.iter()
            .any(|m| m.contains("\"shell\"") && m.contains("taken")),
        "{w:?}"
    );
}

#[tokio::test]
async fn client_calls_count_toward_max_tool_calls() {
    let mut h = Harness::scripted(&script(json!([
        {"tools": [
            {"tool": "pick_color", "args": {"hint": "a"}},
            {"tool": "pick_color", "args": {"hint": "b"}}
        ]},
        {"say": "never"}
    ])));
    h.protocol = Protocol::V2;
    h.client_tools = vec![pick_color()];
    h.limits(RunLimits {
        max_tool_calls: Some(1),
        ..Default::default()
    });
    let mut live = h.start().await;
    let (id, _, _) = next_call(&mut live).await;
    live.gateway
        .answer_client_tool(&id, ClientToolAnswer::Result(json!("blue")));
    let o = live.finish().await;
    assert_eq!(o.error().0, "tool_limit_exceeded");
    assert_eq!(count(&o.events, "tool_call"), 1);
    assert_eq!(count(&o.events, "tool_result_applied"), 1);
}

#[tokio::test]
async fn waiting_outlasts_the_tool_timeout() {
    // A human may be answering: the tool timeout does not bound the wait.
    let mut h = Harness::scripted(&script(json!([
        {"tool": "pick_color", "args": {"hint": "slow"}},
        {"say": "done"}
    ])));
    h.protocol = Protocol::V2;
    h.client_tools = vec![pick_color()];
    h.limits(RunLimits {
        tool_timeout_ms: Some(50),
        ..Default::default()
    });
    let mut live = h.start().await;
    let (id, _, _) = next_call(&mut live).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    live.gateway
        .answer_client_tool(&id, ClientToolAnswer::Result(json!("green")));
    let o = live.finish().await;
    assert_eq!(o.result(), "done");
    assert_pair(&o, &id);
}

#[tokio::test]
async fn an_unanswered_call_ends_at_the_run_deadline() {
    let mut h = Harness::scripted(&script(json!([
        {"tool": "pick_color", "args": {"hint": "never answered"}},
        {"say": "never"}
    ])));
    h.protocol = Protocol::V2;
    h.client_tools = vec![pick_color()];
    h.limits(RunLimits {
        max_duration_ms: Some(300),
        ..Default::default()
    });
    let o = h.run().await;
    assert_eq!(o.error().0, "duration_limit_exceeded");
    assert_eq!(count(&o.events, "tool_call"), 1);
    assert_eq!(count(&o.events, "tool_result_applied"), 0);
    assert_eq!(o.gateway.client_tool_requests().len(), 1);
}
