//! MCP servers: a stdio server (Python) started in the sandbox and a
//! streamable-HTTP server reached through the gateway; their tools called by
//! the model, failures, timeouts and shutdown.

use asbx_protocol::callback::{McpServer, RunLimits};
use asbx_protocol::gateway::ProviderKind;
use asbx_protocol::line::StepStatus;
use asbx_protocol::{Event, LogLevel};
use asbx_test_support::{McpHttpServer, Tape, echo_server_path};
use serde_json::{Value, json};

use crate::harness::{Harness, script};

fn stdio(name: &str, extra: &[&str]) -> McpServer {
    let mut args = vec![echo_server_path().to_owned()];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    McpServer::Stdio {
        name: name.into(),
        command: "python3".into(),
        args,
        env: [("ECHO_GREETING".to_owned(), "hej".to_owned())].into(),
    }
}

fn logs(events: &[Event], level: LogLevel) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Log(l) if l.level == level => Some(l.message.clone()),
            _ => None,
        })
        .collect()
}

fn pid_gone(pid: i32) -> bool {
    // Reaping may lag a little behind the kill.
    for _ in 0..100 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(s) if s.contains(") Z ") => return true,
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
    false
}

#[tokio::test]
async fn stdio_server_tools_called_from_a_script() {
    let mut h = Harness::scripted(&script(json!([
        {"tool": "calc__add", "args": {"a": 2, "b": 3}},
        {"tool": "calc/info", "args": {}},
        {"say": "five"}
    ])));
    h.gw.config.mcp_servers = vec![stdio("calc", &[])];
    let workdir = h.workdir.clone();
    let o = h.run().await;
    assert_eq!(o.result(), "five");
    assert!(
        logs(&o.events, LogLevel::Info).contains(&"mcp server calc: 4 tools".to_owned()),
        "{:?}",
        o.events
    );
    let steps = o.finished_steps();
    let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["calc/add", "calc/info"]);
    assert!(steps.iter().all(|s| s.status == StepStatus::Succeeded));
    assert_eq!(steps[0].result.as_ref().unwrap(), &json!({"sum": 5}));
    let info: Value =
        serde_json::from_str(steps[1].result.as_ref().unwrap().as_str().unwrap()).unwrap();
    assert_eq!(info["cwd"], workdir.display().to_string());
    assert_eq!(info["greeting"], "hej");
    let pid = i32::try_from(info["pid"].as_i64().unwrap()).unwrap();
    assert!(pid_gone(pid), "the server must be gone after the run");
}

#[tokio::test]
async fn stdio_tool_offered_to_an_openai_model_and_called() {
    let mut h = Harness::with_mock(ProviderKind::Openai).await;
    // `my.calc` breaks the shared server-name rule: left out with a warning.
    h.gw.config.mcp_servers = vec![stdio("my-calc", &[]), stdio("my.calc", &[])];
    h.mock()
        .push(Tape::tool_call("my-calc__add", json!({"a": 40, "b": 2})));
    h.mock().push(Tape::text("42"));
    let o = h.run().await;
    assert_eq!(o.result(), "42");
    let steps = o.finished_steps();
    assert_eq!(steps[0].name, "my-calc/add");
    assert!(
        logs(&o.events, LogLevel::Warn)
            .iter()
            .any(|l| l.contains("my.calc") && l.contains("name")),
        "{:?}",
        o.events
    );
    assert_eq!(steps[0].status, StepStatus::Succeeded);
    let reqs = o.mock.as_ref().unwrap().requests();
    let tools = reqs[0].body["tools"].as_array().unwrap();
    let add = tools
        .iter()
        .find(|t| t["function"]["name"] == "my-calc__add")
        .expect("the MCP tool is offered");
    assert_eq!(add["function"]["parameters"]["required"], json!(["a", "b"]));
    assert!(
        add["function"]["description"]
            .as_str()
            .unwrap()
            .contains("Add two numbers.")
    );
    for t in tools {
        let n = t["function"]["name"].as_str().unwrap();
        assert!(
            n.len() <= 64
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
            "{n}"
        );
    }
    let msgs = reqs[1].body["messages"].as_array().unwrap();
    assert_eq!(msgs.last().unwrap()["content"], "42");
}

#[tokio::test]
async fn http_server_through_the_gateway() {
    let server = McpHttpServer::start().await;
    let mut h = Harness::scripted(&script(json!([
        {"tool": "remote__add", "args": {"a": 1.5, "b": 2}},
        {"tool": "remote__fail", "args": {"message": "remote says no"}},
        {"say": "ok"}
    ])));
    h.gw.config.mcp_servers = vec![McpServer::Http {
        name: "remote".into(),
        url: server.url.clone(),
    }];
    let o = h.run().await;
    assert_eq!(o.result(), "ok");
    let steps = o.finished_steps();
    assert_eq!(steps[0].name, "remote/add");
    assert_eq!(steps[0].status, StepStatus::Succeeded);
    assert_eq!(steps[0].result.as_ref().unwrap(), &json!({"sum": 3.5}));
    assert_eq!(steps[1].name, "remote/fail");
    assert_eq!(steps[1].status, StepStatus::Failed);
    assert_eq!(steps[1].error.as_deref(), Some("remote says no"));
    assert!(o.gateway.mcp_calls() >= 4);
    let reqs = server.requests();
    let rpc: Vec<&str> = reqs
        .iter()
        .filter_map(|r| r.rpc_method.as_deref())
        .collect();
    for m in [
        "initialize",
        "notifications/initialized",
        "tools/list",
        "tools/call",
    ] {
        assert!(rpc.contains(&m), "{m} missing from {rpc:?}");
    }
    let call = reqs
        .iter()
        .find(|r| r.rpc_method.as_deref() == Some("tools/call"))
        .unwrap();
    assert_eq!(
        call.session_id.as_deref(),
        Some(asbx_test_support::mcp_server::SESSION_ID),
        "the session id passes through the gateway"
    );
    assert!(
        reqs.iter()
            .any(|r| r.http_method == "DELETE" && r.session_id.is_some()),
        "the session is closed at the end of the run"
    );
}

#[tokio::test]
async fn servers_that_fail_to_start_are_logged_and_left_out() {
    let mut h = Harness::scripted(&script(json!([
        {"tool": "calc__add", "args": {"a": 1, "b": 1}},
        {"tool": "crashy__add", "args": {"a": 1, "b": 1}},
        {"say": "still here"}
    ])));
    h.gw.config.mcp_servers = vec![
        McpServer::Stdio {
            name: "missing".into(),
            command: "/nonexistent/mcp-server".into(),
            args: vec![],
            env: Default::default(),
        },
        stdio("crashy", &["--crash"]),
        McpServer::Http {
            name: "unreachable".into(),
            // Loopback port 1: nothing listens there.
            url: "http://127.0.0.1:1/mcp".into(),
        },
        McpServer::Stdio {
            name: "bad/name".into(),
            command: "python3".into(),
            args: vec![],
            env: Default::default(),
        },
        stdio("calc", &[]),
    ];
    let o = h.run().await;
    assert_eq!(o.result(), "still here");
    let warns = logs(&o.events, LogLevel::Warn);
    assert_eq!(warns.len(), 4, "{warns:#?}");
    let find = |name: &str| {
        warns
            .iter()
            .find(|w| w.starts_with(&format!("mcp server {name} unavailable")))
            .unwrap_or_else(|| panic!("no warning for {name}: {warns:#?}"))
    };
    assert!(find("missing").contains("/nonexistent/mcp-server"));
    assert!(find("crashy").contains("crashing on purpose"), "{warns:#?}");
    find("unreachable");
    find("bad/name");
    let steps = o.finished_steps();
    assert_eq!(steps[0].name, "calc/add");
    assert_eq!(steps[0].status, StepStatus::Succeeded);
    assert_eq!(steps[1].name, "crashy__add");
    assert_eq!(steps[1].status, StepStatus::Failed);
    assert!(steps[1].error.as_ref().unwrap().contains("unknown tool"));
}

#[tokio::test]
async fn is_error_result_is_a_failed_step_and_the_run_goes_on() {
    let mut h = Harness::scripted(&script(json!([
        {"tool": "calc__fail", "args": {"message": "division by zero"}},
        {"tool": "calc__add", "args": "not an object"},
        {"say": "recovered"}
    ])));
    h.gw.config.mcp_servers = vec![stdio("calc", &[])];
    let o = h.run().await;
    assert_eq!(o.result(), "recovered");
    let steps = o.finished_steps();
    assert_eq!(steps[0].name, "calc/fail");
    assert_eq!(steps[0].status, StepStatus::Failed);
    assert_eq!(steps[0].error.as_deref(), Some("division by zero"));
    assert_eq!(steps[1].status, StepStatus::Failed);
    assert!(
        steps[1]
            .error
            .as_ref()
            .unwrap()
            .contains("JSON object of arguments")
    );
}

#[tokio::test]
async fn calls_honour_the_tool_timeout() {
    let mut h = Harness::scripted(&script(json!([
        {"tool": "calc__sleep", "args": {"seconds": 30}},
        {"say": "gave up waiting"}
    ])));
    h.gw.config.mcp_servers = vec![stdio("calc", &[])];
    h.limits(RunLimits {
        tool_timeout_ms: Some(300),
        ..Default::default()
    });
    let o = h.run().await;
    assert_eq!(o.result(), "gave up waiting");
    let steps = o.finished_steps();
    assert_eq!(steps[0].name, "calc/sleep");
    assert_eq!(steps[0].status, StepStatus::Failed);
    assert!(
        steps[0].error.as_ref().unwrap().contains("timed out"),
        "{:?}",
        steps[0].error
    );
}

#[tokio::test]
async fn stdio_server_shipped_as_a_skill_file() {
    // How a jailed run can get the test server: the repository is not
    // visible there, but skills are written before MCP servers start.
    let mut h = Harness::scripted(&script(json!([
        {"tool": "kit__add", "args": {"a": 20, "b": 22}},
        {"say": "ok"}
    ])));
    h.gw.config.skills = vec![asbx_protocol::callback::Skill {
        name: "mcpkit".into(),
        description: "ships an MCP server".into(),
        files: [(
            "server.py".to_owned(),
            asbx_test_support::echo_server_source().to_owned(),
        )]
        .into(),
    }];
    h.gw.config.mcp_servers = vec![McpServer::Stdio {
        name: "kit".into(),
        command: "python3".into(),
        args: vec![".skills/mcpkit/server.py".into()],
        env: Default::default(),
    }];
    let o = h.run().await;
    assert_eq!(o.result(), "ok");
    let steps = o.finished_steps();
    assert_eq!(steps[0].name, "kit/add");
    assert_eq!(steps[0].result.as_ref().unwrap(), &json!({"sum": 42}));
}
