//! The OpenAI-compatible provider through the gateway and the mock server.

use asbx_protocol::gateway::ProviderKind;
use asbx_protocol::line::StepStatus;
use asbx_test_support::Tape;
use serde_json::{Value, json};

use crate::harness::{Harness, KEY};

#[tokio::test]
async fn tool_call_round_trip() {
    let mut h = Harness::with_mock(ProviderKind::Openai).await;
    h.gw.config.system_prompt = Some("You are terse.".into());
    h.gw.config.conversation = vec![
        asbx_protocol::callback::ChatTurn {
            role: asbx_protocol::callback::Role::User,
            content: "earlier question".into(),
            ts: 1,
        },
        asbx_protocol::callback::ChatTurn {
            role: asbx_protocol::callback::Role::Assistant,
            content: "earlier answer".into(),
            ts: 2,
        },
    ];
    h.mock().push(Tape::tool_call(
        "shell",
        json!({"command": "echo hi-from-tool"}),
    ));
    h.mock().push(Tape::text("All done: hi."));
    let o = h.run().await;
    assert_eq!(o.result(), "All done: hi.");
    let steps = o.finished_steps();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].status, StepStatus::Succeeded);

    let reqs = o.mock.as_ref().unwrap().requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].path, "/chat/completions");
    assert_eq!(
        reqs[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    let b0 = &reqs[0].body;
    assert_eq!(b0["model"], "test-model");
    assert_eq!(b0["stream"], true);
    assert_eq!(b0["stream_options"]["include_usage"], true);
    let tools: Vec<&str> = b0["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            assert_eq!(t["type"], "function");
            t["function"]["name"].as_str().unwrap()
        })
        .collect();
    assert_eq!(tools, ["shell", "read_file", "write_file", "list_files"]);
    let roles: Vec<&str> = b0["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert_eq!(b0["messages"][3]["content"], "Please do the thing.");

    let msgs = reqs[1].body["messages"].as_array().unwrap();
    let assistant = &msgs[msgs.len() - 2];
    assert_eq!(assistant["role"], "assistant");
    let call = &assistant["tool_calls"][0];
    assert_eq!(call["function"]["name"], "shell");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"command": "echo hi-from-tool"}));
    let tool_msg = msgs.last().unwrap();
    assert_eq!(tool_msg["role"], "tool");
    assert_eq!(tool_msg["tool_call_id"], call["id"]);
    let content = tool_msg["content"].as_str().unwrap();
    assert!(content.contains("exit code: 0"), "{content}");
    assert!(content.contains("hi-from-tool"), "{content}");
    eprintln!(
        "recorded openai request body: {}",
        serde_json::to_string(&reqs[1].body).unwrap()
    );
}

#[tokio::test]
async fn two_tool_calls_in_one_response_are_two_steps_in_order() {
    let h = Harness::with_mock(ProviderKind::Openai).await;
    h.mock().push(Tape::tool_calls(vec![
        (
            "write_file",
            json!({"path": "notes/a.txt", "content": "alpha"}),
        ),
        ("read_file", json!({"path": "notes/a.txt"})),
    ]));
    h.mock().push(Tape::text("ok"));
    let o = h.run().await;
    assert_eq!(o.result(), "ok");
    let steps = o.finished_steps();
    assert_eq!(
        steps.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["write_file", "read_file"]
    );
    assert_eq!(steps[1].result.as_ref().unwrap(), &json!("alpha"));
    let reqs = o.mock.as_ref().unwrap().requests();
    let msgs = reqs[1].body["messages"].as_array().unwrap();
    let tail: Vec<&str> = msgs[msgs.len() - 3..]
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(tail, ["assistant", "tool", "tool"]);
    assert_eq!(
        msgs[msgs.len() - 3]["tool_calls"].as_array().unwrap().len(),
        2
    );
}

#[tokio::test]
async fn provider_error_is_model_error_with_its_message() {
    let h = Harness::with_mock(ProviderKind::Openai).await;
    h.mock()
        .push(Tape::status(400, "model `test-model` does not exist"));
    let o = h.run().await;
    let (code, msg) = o.error();
    assert_eq!(code, "model_error");
    assert!(msg.contains("does not exist"), "{msg}");
    assert_eq!(
        o.mock.as_ref().unwrap().requests().len(),
        1,
        "400 is not retried"
    );
}

#[tokio::test]
async fn unknown_provider_is_model_error() {
    let mut h = Harness::with_mock(ProviderKind::Openai).await;
    h.gw.config.model = "nowhere:x".into();
    let o = h.run().await;
    let (code, msg) = o.error();
    assert_eq!(code, "model_error");
    assert!(msg.contains("nowhere"), "{msg}");
}
