//! Bootstrap: tokens, setup script, config.

use asbx_protocol::gateway::ProviderKind;
use serde_json::json;

use crate::harness::{Harness, script};

#[tokio::test]
async fn rejected_setup_token_is_otp_rejected_before_any_model_call() {
    let mut h = Harness::with_mock(ProviderKind::Openai).await;
    h.otp_setup = "wrong".into();
    let o = h.run().await;
    o.first_is_sandbox_started();
    let (code, msg) = o.error();
    assert_eq!(code, "otp_rejected");
    // The setup token's refusal is the error, although `/config` (asked
    // at the same time, one round trip for both) answered.
    assert!(msg.contains("setup token"), "{msg}");
    assert_eq!(o.gateway.config_redemptions(), 1);
    assert_eq!(o.gateway.model_calls(), 0);
    assert!(o.mock.as_ref().unwrap().requests().is_empty());
}

#[tokio::test]
async fn rejected_run_token_is_otp_rejected() {
    let mut h = Harness::with_mock(ProviderKind::Openai).await;
    h.otp_run = "wrong".into();
    let o = h.run().await;
    let (code, msg) = o.error();
    assert_eq!(code, "otp_rejected");
    assert!(msg.contains("run token"), "{msg}");
    assert_eq!(o.gateway.model_calls(), 0);
}

#[tokio::test]
async fn setup_script_failure_is_setup_failed_with_tail() {
    let mut h = Harness::scripted(&script(json!([{"say": "never"}])));
    h.gw.env.setup_script = Some("echo preparing; echo 'pip exploded' >&2; exit 3".into());
    let o = h.run().await;
    let (code, msg) = o.error();
    assert_eq!(code, "setup_failed");
    assert!(msg.contains("exit code 3"), "{msg}");
    assert!(msg.contains("pip exploded"), "{msg}");
    // `/config` is redeemed with `/env`, before the setup script
    // (so `session_init` carries the session's limits, docs/protocol.md §4);
    // the model never ran.
    assert_eq!(o.gateway.config_redemptions(), 1);
    assert!(
        !o.events.iter().any(|e| matches!(
            e,
            asbx_protocol::Event::Result(_) | asbx_protocol::Event::Step(_)
        )),
        "{:?}",
        o.events
    );
}

#[tokio::test]
async fn setup_script_runs_in_workdir_with_variables_before_the_model() {
    let mut h = Harness::scripted(&script(json!([
        {"tool": "read_file", "args": {"path": "setup-marker"}},
        {"say": "ok"}
    ])));
    h.gw.env
        .variables
        .insert("TOKEN_NAME".into(), "from-env".into());
    h.gw.env.setup_script = Some("printf %s \"$TOKEN_NAME\" > setup-marker".into());
    let o = h.run().await;
    assert_eq!(o.result(), "ok");
    let steps = o.finished_steps();
    assert_eq!(steps[0].result.as_ref().unwrap(), &json!("from-env"));
}

#[tokio::test]
async fn unreachable_gateway_is_bootstrap_failed() {
    let dir = tempfile::tempdir().unwrap();
    let b = asbx_protocol::gateway::AgentBootstrap {
        session_id: "s".into(),
        protocol: asbx_protocol::Protocol::V1,
        prompt: "hi".into(),
        otp_setup: "a".into(),
        otp_run: "b".into(),
        otp_upload: None,
        gateway_socket: dir.path().join("nope.sock").display().to_string(),
        proxy_socket: None,
        workdir: dir.path().display().to_string(),
        providers: vec![],
        max_limits: Default::default(),
        client_tools: vec![],
        tool_user: None,
    };
    let lines = crate::harness::collect(b, crate::harness::test_options()).await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    let last: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
    assert_eq!(last["type"], "error");
    assert_eq!(last["code"], "bootstrap_failed");
}
