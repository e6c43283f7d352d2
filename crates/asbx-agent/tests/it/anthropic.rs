//! The Anthropic Messages provider through the gateway and the mock server.

use asbx_protocol::gateway::ProviderKind;
use asbx_test_support::Tape;
use serde_json::json;

use crate::harness::{Harness, KEY};

#[tokio::test]
async fn tool_use_round_trip() {
    let mut h = Harness::with_mock(ProviderKind::Anthropic).await;
    h.gw.config.system_prompt = Some("Be brief.".into());
    h.mock().push(Tape::ToolCalls {
        text: Some("Let me look.".into()),
        calls: vec![
            asbx_test_support::MockToolCall {
                id: "toolu_1".into(),
                name: "write_file".into(),
                args: json!({"path": "out/x.txt", "content": "xyz"}),
            },
            asbx_test_support::MockToolCall {
                id: "toolu_2".into(),
                name: "list_files".into(),
                args: json!({"path": "out"}),
            },
        ],
    });
    h.mock().push(Tape::text("Wrote x.txt."));
    let o = h.run().await;
    assert_eq!(o.result(), "Wrote x.txt.");
    let steps = o.finished_steps();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[1].result.as_ref().unwrap(), &json!("x.txt"));
    assert_eq!(o.gateway.results()[0].files[0].path, "x.txt");

    let reqs = o.mock.as_ref().unwrap().requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].path, "/messages");
    assert_eq!(reqs[0].header("x-api-key"), Some(KEY));
    assert_eq!(reqs[0].header("anthropic-version"), Some("2023-06-01"));
    let b0 = &reqs[0].body;
    assert_eq!(b0["stream"], true);
    assert_eq!(b0["system"], "Be brief.");
    assert!(b0["max_tokens"].as_u64().unwrap() > 0);
    let tool = &b0["tools"][0];
    assert_eq!(tool["name"], "shell");
    assert_eq!(tool["input_schema"]["type"], "object");

    let msgs = reqs[1].body["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3);
    assert_eq!(msgs[1]["role"], "assistant");
    assert_eq!(
        msgs[1]["content"][0],
        json!({"type": "text", "text": "Let me look."})
    );
    assert_eq!(msgs[1]["content"][1]["type"], "tool_use");
    assert_eq!(
        msgs[1]["content"][1]["input"],
        json!({"path": "out/x.txt", "content": "xyz"})
    );
    assert_eq!(msgs[2]["role"], "user");
    let results = msgs[2]["content"].as_array().unwrap();
    assert_eq!(results.len(), 2, "both tool results in one user message");
    assert_eq!(results[0]["type"], "tool_result");
    assert_eq!(results[0]["tool_use_id"], "toolu_1");
    assert_eq!(results[1]["tool_use_id"], "toolu_2");
    assert_eq!(results[1]["content"], "x.txt");
    assert_eq!(results[1]["is_error"], false);
    eprintln!(
        "recorded anthropic request body: {}",
        serde_json::to_string(&reqs[1].body).unwrap()
    );
}

#[tokio::test]
async fn overloaded_then_cut_stream_then_success() {
    let h = Harness::with_mock(ProviderKind::Anthropic).await;
    h.mock().push(Tape::status(529, "overloaded"));
    h.mock().push(Tape::disconnect());
    h.mock().push(Tape::text("Finally."));
    let o = h.run().await;
    assert_eq!(o.result(), "Finally.");
    assert_eq!(o.mock.as_ref().unwrap().requests().len(), 3);
}

#[tokio::test]
async fn utf8_split_is_reassembled() {
    let h = Harness::with_mock(ProviderKind::Anthropic).await;
    h.mock().push(Tape::utf8_split("Grüße, 世界! 🦀"));
    let o = h.run().await;
    assert_eq!(o.result(), "Grüße, 世界! 🦀");
}

/// Issue 28, defect 12: a shell command that exits 3 is a failed step whose
/// `error` names the exit code and whose `result` keeps what it printed;
/// the model gets the output and the exit code, flagged as an error.
#[tokio::test]
async fn a_command_exiting_non_zero_fails_its_step_and_the_model_sees_its_output() {
    let h = Harness::with_mock(ProviderKind::Anthropic).await;
    h.mock().push(Tape::ToolCalls {
        text: None,
        calls: vec![asbx_test_support::MockToolCall {
            id: "toolu_1".into(),
            name: "shell".into(),
            args: json!({"command": "echo partial-output; echo oops >&2; exit 3"}),
        }],
    });
    h.mock().push(Tape::text("It failed."));
    let o = h.run().await;
    assert_eq!(o.result(), "It failed.");
    let steps = o.finished_steps();
    assert_eq!(steps.len(), 1);
    assert_eq!(
        steps[0].status,
        asbx_protocol::StepStatus::Failed,
        "{steps:?}"
    );
    let error = steps[0].error.as_deref().unwrap_or_default();
    assert!(error.contains("exited with code 3"), "{error}");
    let result = steps[0].result.as_ref().expect("the output is kept");
    assert_eq!(result["exitCode"], 3);
    assert_eq!(result["stdout"], "partial-output\n");
    assert_eq!(result["stderr"], "oops\n");

    let reqs = o.mock.as_ref().unwrap().requests();
    let msgs = reqs[1].body["messages"].as_array().unwrap();
    let seen = &msgs[2]["content"][0];
    assert_eq!(seen["type"], "tool_result");
    assert_eq!(seen["is_error"], true, "{seen}");
    let text = seen["content"].as_str().unwrap();
    assert!(
        text.contains("exit code: 3") && text.contains("partial-output") && text.contains("oops"),
        "{text}"
    );
}
