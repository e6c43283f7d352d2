//! The scripted model end to end: demo, scripts, writeback.

use asbx_protocol::Event;
use asbx_protocol::line::StepStatus;
use base64::Engine;
use serde_json::json;

use crate::harness::{Harness, script};

#[tokio::test]
async fn demo_turn_runs_shell_writes_out_and_writes_back() {
    let o = Harness::scripted("hello").run().await;
    o.first_is_sandbox_started();
    let steps = o.finished_steps();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0].name, "shell");
    assert_eq!(steps[0].status, StepStatus::Succeeded);
    assert_eq!(steps[0].result.as_ref().unwrap()["exitCode"], 0);
    assert_eq!(steps[1].name, "write_file");
    assert_eq!(steps[1].status, StepStatus::Succeeded);
    assert!(
        o.result()
            .starts_with("This is the scripted model, not a real model.")
    );
    // running args are the model's arguments
    let running: Vec<_> = o
        .steps()
        .into_iter()
        .filter(|s| s.status == StepStatus::Running)
        .collect();
    assert_eq!(
        running[0].args.as_ref().unwrap(),
        &json!({"command": "uname -sr && ls -la"})
    );
    let results = o.gateway.results();
    assert_eq!(results.len(), 1, "one results POST");
    let f = &results[0].files;
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].path, "hello.txt");
    assert_eq!(f[0].mime_type.as_deref(), Some("text/plain"));
    let content = base64::engine::general_purpose::STANDARD
        .decode(&f[0].content_base64)
        .unwrap();
    assert!(
        String::from_utf8(content)
            .unwrap()
            .contains("scripted model")
    );
    assert_eq!(o.gateway.env_redemptions(), 1);
    assert_eq!(o.gateway.config_redemptions(), 1);
}

#[tokio::test]
async fn script_with_nested_out_files_skips_symlinks() {
    let o = Harness::scripted(&script(json!([
        {"tool": "shell", "args": {"command": "mkdir -p out/sub && printf 'a,b\\n' > out/sub/data.csv && ln -s /etc/hostname out/link && mkfifo out/fifo"}},
        {"tool": "write_file", "args": {"path": "out/report.md", "content": "# hi"}},
        {"say": "finished"}
    ])))
    .run()
    .await;
    assert_eq!(o.result(), "finished");
    let results = o.gateway.results();
    assert_eq!(results.len(), 1);
    let paths: Vec<_> = results[0].files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, vec!["report.md", "sub/data.csv"]);
    // result comes after the writeback log line
    let wb = o
        .events
        .iter()
        .position(|e| matches!(e, Event::Log(l) if l.message.starts_with("wrote back 2")))
        .expect("writeback log line");
    assert!(wb < o.events.len() - 1);
}

#[tokio::test]
async fn no_upload_token_or_no_files_means_no_post() {
    let mut h = Harness::scripted(&script(json!([{"say": "x"}])));
    h.otp_upload = None;
    let o = h.run().await;
    assert_eq!(o.result(), "x");
    assert!(o.gateway.results().is_empty());
    let o = Harness::scripted(&script(json!([{"say": "y"}])))
        .run()
        .await;
    assert_eq!(o.result(), "y");
    assert!(o.gateway.results().is_empty());
}

#[tokio::test]
async fn fail_gives_model_error_with_the_message() {
    let o = Harness::scripted(&script(json!([{"fail": "the model fell over"}])))
        .run()
        .await;
    let (code, msg) = o.error();
    assert_eq!(code, "model_error");
    assert!(msg.contains("the model fell over"), "{msg}");
}

#[tokio::test]
async fn sleep_then_several_tools_then_done() {
    let o = Harness::scripted(&script(json!([
        {"sleep_ms": 10},
        {"tools": [
            {"tool": "write_file", "args": {"path": "a.txt", "content": "A"}},
            {"tool": "read_file", "args": {"path": "a.txt"}}
        ]}
    ])))
    .run()
    .await;
    let steps = o.finished_steps();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0].name, "write_file");
    assert_eq!(steps[1].name, "read_file");
    assert_eq!(steps[1].result.as_ref().unwrap(), &json!("A"));
    assert_eq!(o.result(), "Done.");
}

#[tokio::test]
async fn unknown_tool_is_a_failed_step_not_the_end() {
    let o = Harness::scripted(&script(json!([
        {"tool": "teleport", "args": {}},
        {"say": "ok"}
    ])))
    .run()
    .await;
    let steps = o.finished_steps();
    assert_eq!(steps[0].status, StepStatus::Failed);
    assert!(steps[0].error.as_ref().unwrap().contains("unknown tool"));
    assert_eq!(o.result(), "ok");
}

#[tokio::test]
async fn conversation_and_env_variables_reach_tools() {
    let mut h = Harness::scripted(&script(json!([
        {"tool": "shell", "args": {"command": "echo \"$GREETING from $HOME\"; env | sort | cut -d= -f1 | tr '\\n' ' '"}},
        {"say": "ok"}
    ])));
    h.gw.env.variables.insert("GREETING".into(), "hej".into());
    let workdir = h.workdir.clone();
    let o = h.run().await;
    let steps = o.finished_steps();
    let stdout = steps[0].result.as_ref().unwrap()["stdout"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        stdout.contains(&format!("hej from {}", workdir.display())),
        "{stdout}"
    );
    // A clean environment: nothing of the test process leaks in.
    assert!(!stdout.contains("CARGO"), "{stdout}");
}
