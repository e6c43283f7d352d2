//! Real model wire formats through the runner's gateway (issue 2, 3): the
//! in-repo mock provider drives tool calls; the runner adds the key, which
//! never enters the sandbox.

use std::time::Duration;

use asbx_protocol::{Event, LineDecoder, StepStatus};
use asbx_test_support::{MockProvider, Tape, descendants_of};
use futures::StreamExt;
use serde_json::json;

use crate::harness::*;

async fn key_never_enters_the_sandbox(kind: &str) {
    let key = format!("sk-e2e-{}", hex::encode(rand::random::<[u8; 8]>()));
    let mock = MockProvider::start().await;
    let (base_var, key_var, model) = match kind {
        "openai" => ("OPENAI_BASE_URL", "OPENAI_API_KEY", "openai:test-model"),
        _ => (
            "ANTHROPIC_BASE_URL",
            "ANTHROPIC_API_KEY",
            "anthropic:test-model",
        ),
    };
    let runner = RunnerProc::start(&[(base_var, mock.base_url.as_str()), (key_var, key.as_str())]);
    mock.push(Tape::tool_call(
        "shell",
        json!({"command": "env; sleep 1.5; echo tool-finished"}),
    ));
    mock.push(Tape::text("the model is done"));
    let ws = FakeWorkspace::start(scripted(model)).await;
    let t = ws.mint(&session_id(kind));
    let res = post_stream(&runner.url, &ws.body(&t, "run env please")).await;
    let mut stream = Box::pin(res.bytes_stream());
    let mut decoder = LineDecoder::default();
    let mut lines = Vec::new();
    let mut scanned = false;
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .expect("stream in time")
    {
        for l in decoder.push(&chunk.unwrap()) {
            let l = l.unwrap();
            let running = matches!(&l.event, Event::Step(s) if s.status == StepStatus::Running);
            lines.push(l);
            if running && !scanned {
                // While the tool runs: every process of the sandbox, read from the host.
                tokio::time::sleep(Duration::from_millis(300)).await;
                let pids = descendants_of(runner.pid());
                let agents = pids_with("asbx-agent").len();
                assert!(
                    pids.len() >= 4 && agents >= 1,
                    "supervisor, init, agent, tool: {pids:?}"
                );
                for pid in &pids {
                    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
                    let env = String::from_utf8_lossy(&env);
                    assert!(
                        !env.contains(&key),
                        "the key is in the environment of pid {pid}"
                    );
                }
                scanned = true;
            }
        }
    }
    assert!(scanned, "the tool ran");
    assert_well_formed(&lines);
    assert!(matches!(terminal(&lines), Event::Result(r) if r.message == "the model is done"));
    let all = serde_json::to_string(&lines).unwrap();
    assert!(all.contains("tool-finished"));
    assert!(!all.contains(&key), "the key leaked into the stream");
    // The runner, not the sandbox, added the key.
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 2, "a tool call, then the final answer");
    for r in &reqs {
        match kind {
            "openai" => assert_eq!(
                r.header("authorization"),
                Some(format!("Bearer {key}").as_str())
            ),
            _ => assert_eq!(r.header("x-api-key"), Some(key.as_str())),
        }
    }
    // The tool's result went back to the model.
    assert!(reqs[1].body.to_string().contains("tool-finished"));
    runner.assert_clean().await;
}

#[tokio::test]
async fn openai_tool_call_through_the_gateway_with_the_key_kept_outside() {
    key_never_enters_the_sandbox("openai").await;
}

#[tokio::test]
async fn anthropic_tool_call_through_the_gateway_with_the_key_kept_outside() {
    key_never_enters_the_sandbox("anthropic").await;
}

#[tokio::test]
async fn a_provider_error_reaches_the_error_line() {
    let mock = MockProvider::start().await;
    let runner = RunnerProc::start(&[
        ("OPENAI_BASE_URL", mock.base_url.as_str()),
        ("OPENAI_API_KEY", "k"),
    ]);
    mock.push(Tape::status(400, "model `nope` does not exist"));
    let ws = FakeWorkspace::start(scripted("openai:nope")).await;
    let t = ws.mint(&session_id("moderr"));
    let (_, lines, _) = dispatch(&runner.url, &ws.body(&t, "hi")).await;
    assert_well_formed(&lines);
    match terminal(&lines) {
        Event::Error(e) => {
            assert_eq!(e.code, "model_error");
            assert!(e.message.contains("does not exist"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    runner.assert_clean().await;
}

#[tokio::test]
async fn a_named_provider_from_the_providers_file() {
    let mock = MockProvider::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("providers.toml");
    std::fs::write(
        &file,
        format!(
            "[[provider]]\nname = \"local\"\nkind = \"openai\"\nbase_url = \"{}\"\napi_key_env = \"LOCAL_LLM_KEY\"\n",
            mock.base_url
        ),
    )
    .unwrap();
    let runner = RunnerProc::start(&[
        ("ASBX_PROVIDERS", file.to_str().unwrap()),
        ("LOCAL_LLM_KEY", "sk-local-123"),
    ]);
    mock.push(Tape::text("hello from a local model"));
    let ws = FakeWorkspace::start(scripted("local:llama-3")).await;
    let t = ws.mint(&session_id("named"));
    let (_, lines, _) = dispatch(&runner.url, &ws.body(&t, "hi")).await;
    assert_well_formed(&lines);
    assert!(
        matches!(terminal(&lines), Event::Result(r) if r.message == "hello from a local model")
    );
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].header("authorization"), Some("Bearer sk-local-123"));
    assert_eq!(reqs[0].body["model"], "llama-3");
    runner.assert_clean().await;
}

/// One scripted turn against the mock with `var=base`; the path the mock saw.
async fn path_the_provider_saw(kind: &str, base: &str) -> String {
    let mock = MockProvider::start().await;
    let base = base.replace("{mock}", &mock.base_url);
    let (base_var, key_var, model) = match kind {
        "openai" => ("OPENAI_BASE_URL", "OPENAI_API_KEY", "openai:m"),
        _ => ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "anthropic:m"),
    };
    let runner = RunnerProc::start(&[(base_var, base.as_str()), (key_var, "k")]);
    mock.push(Tape::text("ok"));
    let ws = FakeWorkspace::start(scripted(model)).await;
    let t = ws.mint(&session_id("conv"));
    let (_, lines, _) = dispatch(&runner.url, &ws.body(&t, "hi")).await;
    assert!(
        matches!(terminal(&lines), Event::Result(r) if r.message == "ok"),
        "{base_var}={base}: {lines:?}"
    );
    runner.assert_clean().await;
    let reqs = mock.requests();
    assert_eq!(reqs.len(), 1, "{base_var}={base}");
    reqs[0].path.clone()
}

#[tokio::test]
async fn base_urls_work_as_each_providers_own_sdks_take_them() {
    // Anthropic's SDKs: ANTHROPIC_BASE_URL without /v1; with it works too.
    assert_eq!(
        path_the_provider_saw("anthropic", "{mock}").await,
        "/v1/messages"
    );
    assert_eq!(
        path_the_provider_saw("anthropic", "{mock}/v1/").await,
        "/v1/messages"
    );
    // OpenAI's SDKs: OPENAI_BASE_URL with /v1.
    assert_eq!(
        path_the_provider_saw("openai", "{mock}/v1").await,
        "/v1/chat/completions"
    );
}

/// Issue 28, defect 3: a session cancelled while its tool runs reports the
/// model call and the tokens it made, counted by the runner's gateway (the
/// agent reports its usage only at its very end, which never came), for
/// either wire format.
#[tokio::test]
async fn a_cancelled_session_reports_the_model_calls_and_tokens_it_made() {
    let mock = MockProvider::start().await;
    let runner = RunnerProc::start(&[
        ("OPENAI_BASE_URL", mock.base_url.as_str()),
        ("OPENAI_API_KEY", "sk-test"),
        ("ANTHROPIC_BASE_URL", mock.base_url.as_str()),
        ("ANTHROPIC_API_KEY", "sk-test"),
    ]);
    for kind in ["openai", "anthropic"] {
        let marker = format!("1000.{}", rand::random::<u32>());
        mock.push(Tape::tool_call(
            "shell",
            json!({"command": format!("sleep {marker}")}),
        ));
        let ws = FakeWorkspace::start(scripted(&format!("{kind}:test-model"))).await;
        let t = ws.mint(&session_id(&format!("cancel-{kind}")));
        let mut body = ws.body(&t, "run it");
        body["protocol"] = json!(2);
        let res = post_stream(&runner.url, &body).await;
        let mut stream = Box::pin(res.bytes_stream());
        let mut decoder = LineDecoder::default();
        let mut lines = Vec::new();
        let mut cancelled = false;
        while let Some(chunk) = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("stream in time")
        {
            for l in decoder.push(&chunk.unwrap()) {
                let l = l.unwrap();
                let running = matches!(&l.event, Event::Step(s) if s.status == StepStatus::Running);
                lines.push(l);
                if running && !cancelled {
                    cancelled = true;
                    let res = reqwest::Client::new()
                        .delete(format!("{}/v1/sessions/{}", runner.url, t.session))
                        .send()
                        .await
                        .unwrap();
                    assert!(res.status().is_success(), "{}", res.status());
                }
            }
        }
        assert!(cancelled, "{kind}: the tool never ran: {lines:?}");
        let ended = match &lines.last().unwrap().event {
            Event::SessionEnded(e) => e.clone(),
            other => panic!("{kind}: last line {other:?}"),
        };
        assert_eq!(
            ended.reason,
            asbx_protocol::session::EndReason::Terminated,
            "{kind}: {ended:?}"
        );
        let stats = ended.stats;
        assert_eq!(stats.steps, 1, "{kind}: one model call: {stats:?}");
        assert_eq!(stats.tool_calls, 1, "{kind}: {stats:?}");
        assert!(
            stats.input_tokens > 0 && stats.output_tokens > 0,
            "{kind}: the tokens of the call: {stats:?}"
        );
        assert!(
            !lines
                .iter()
                .any(|l| matches!(&l.event, Event::Log(g) if g.message.starts_with("usage: "))),
            "{kind}: the agent never reported its usage"
        );
    }
    runner.assert_clean().await;
}
