//! Skills and MCP servers inside a real jail (issue 4): a skill bundle with a
//! script, a stdio MCP server shipped in it, and a streamable-HTTP MCP server
//! on the host reached only through the runner's gateway.

use asbx_protocol::callback::{ConfigResponse, McpServer, Skill};
use asbx_protocol::{Event, Line, StepStatus};
use asbx_test_support::{McpHttpServer, echo_server_source};
use serde_json::json;

use crate::harness::*;

fn finished_steps(lines: &[Line]) -> Vec<(String, StepStatus, String)> {
    lines
        .iter()
        .filter_map(|l| match &l.event {
            Event::Step(s) if s.status != StepStatus::Running => Some((
                s.name.clone(),
                s.status,
                format!(
                    "{}{}",
                    s.result.clone().unwrap_or_default(),
                    s.error.clone().unwrap_or_default()
                ),
            )),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn skills_and_mcp_servers_work_inside_the_jail() {
    // The HTTP MCP server listens on loopback, which the gateway refuses
    // unless the operator allows it.
    let runner = RunnerProc::start(&[("ASBX_ALLOW_INTERNAL", "127.0.0.1/32")]);
    let http_mcp = McpHttpServer::start().await;
    let skill = Skill {
        name: "mcpkit".into(),
        description: "Arithmetic helpers".into(),
        files: [
            (
                "SKILL.md".to_owned(),
                "# mcpkit\nRun scripts/hello.sh to greet.".to_owned(),
            ),
            (
                "scripts/hello.sh".to_owned(),
                "#!/bin/bash\necho hello from the skill as $(id -u)".to_owned(),
            ),
            ("server.py".to_owned(), echo_server_source().to_owned()),
        ]
        .into(),
    };
    let config = ConfigResponse {
        model: "scripted:test".into(),
        skills: vec![skill],
        mcp_servers: vec![
            McpServer::Stdio {
                name: "kit".into(),
                command: "python3".into(),
                args: vec![".skills/mcpkit/server.py".into()],
                env: Default::default(),
            },
            McpServer::Http {
                name: "remote".into(),
                url: http_mcp.url.clone(),
            },
        ],
        ..Default::default()
    };
    let ws = FakeWorkspace::start(config).await;
    let t = ws.mint(&session_id("skills"));
    let prompt = script(json!([
        {"tool": "load_skill", "args": {"name": "mcpkit"}},
        {"tool": "shell", "args": {"command": ".skills/mcpkit/scripts/hello.sh"}},
        {"tool": "kit__add", "args": {"a": 2, "b": 3}},
        {"tool": "remote__add", "args": {"a": 40, "b": 2}},
        {"say": "all tools ran"}
    ]));
    let (_, lines, _) = dispatch(&runner.url, &ws.body(&t, &prompt)).await;
    assert_well_formed(&lines);
    assert!(
        matches!(terminal(&lines), Event::Result(r) if r.message == "all tools ran"),
        "{lines:?}"
    );
    let steps = finished_steps(&lines);
    let names: Vec<&str> = steps.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "load_skill",
            "mcpkit/scripts/hello.sh",
            "kit/add",
            "remote/add"
        ],
        "{steps:?}"
    );
    assert!(
        steps.iter().all(|s| s.1 == StepStatus::Succeeded),
        "{steps:?}"
    );
    assert!(steps[0].2.contains("Run scripts/hello.sh"), "{steps:?}");
    assert!(
        steps[1].2.contains("hello from the skill as 1001"),
        "tools run as the tool uid: {steps:?}"
    );
    assert!(steps[2].2.contains('5'), "{steps:?}");
    assert!(steps[3].2.contains("42"), "{steps:?}");
    assert!(
        !http_mcp.requests().is_empty(),
        "the HTTP server was reached through the gateway"
    );
    runner.assert_clean().await;
}
