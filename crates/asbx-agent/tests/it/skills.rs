//! Skills: bundles written into the sandbox, only names and descriptions in
//! the system prompt, `load_skill`, scripts run through `shell` as steps
//! named after the script.

use std::os::unix::fs::PermissionsExt;

use asbx_protocol::Event;
use asbx_protocol::LogLevel;
use asbx_protocol::callback::Skill;
use asbx_protocol::gateway::ProviderKind;
use asbx_protocol::line::StepStatus;
use asbx_test_support::Tape;
use serde_json::json;

use crate::harness::{Harness, script};

const BODY: &str = "# Recipes\n\nRun `.skills/recipes/scripts/add-node.sh <type>` to add a node. \
                    SECRET-INSTRUCTIONS-MARKER";

fn recipes() -> Skill {
    Skill {
        name: "recipes".into(),
        description: "Adds nodes to a workflow.".into(),
        files: [
            ("SKILL.md".to_owned(), BODY.to_owned()),
            (
                "scripts/add-node.sh".to_owned(),
                "#!/bin/sh\necho \"node added: $1\"\n".to_owned(),
            ),
        ]
        .into(),
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

#[tokio::test]
async fn skill_loaded_and_its_script_run() {
    let mut h = Harness::scripted(&script(json!([
        {"tool": "load_skill", "args": {"name": "recipes"}},
        {"tool": "shell", "args": {"command": ".skills/recipes/scripts/add-node.sh inference"}},
        {"say": "added"}
    ])));
    h.gw.config.skills = vec![recipes()];
    let o = h.run().await;
    assert_eq!(o.result(), "added");
    assert!(logs(&o.events, LogLevel::Info).contains(&"Loaded 1 skill".to_owned()));
    let steps = o.finished_steps();
    let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["load_skill", "recipes/scripts/add-node.sh"]);
    assert!(steps.iter().all(|s| s.status == StepStatus::Succeeded));
    let loaded = steps[0].result.as_ref().unwrap();
    assert_eq!(loaded["skill"], "recipes");
    assert_eq!(loaded["files"], json!(["SKILL.md", "scripts/add-node.sh"]));
    let shell = steps[1].result.as_ref().unwrap();
    assert_eq!(shell["exitCode"], 0);
    assert_eq!(shell["stdout"], "node added: inference\n");
    // running line has the same name and the model's arguments
    let running = o
        .steps()
        .into_iter()
        .find(|s| s.status == StepStatus::Running && s.id == steps[1].id)
        .unwrap();
    assert_eq!(running.name, "recipes/scripts/add-node.sh");
    assert_eq!(
        running.args.as_ref().unwrap()["command"],
        ".skills/recipes/scripts/add-node.sh inference"
    );
    let dir = o.workdir.join(".skills/recipes");
    assert_eq!(std::fs::read_to_string(dir.join("SKILL.md")).unwrap(), BODY);
    let mode = std::fs::metadata(dir.join("scripts/add-node.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
}

#[tokio::test]
async fn system_prompt_has_names_and_descriptions_not_instructions() {
    let mut h = Harness::with_mock(ProviderKind::Openai).await;
    h.gw.config.system_prompt = Some("You are terse.".into());
    h.gw.config.skills = vec![recipes()];
    h.mock()
        .push(Tape::tool_call("load_skill", json!({"name": "recipes"})));
    h.mock().push(Tape::tool_call(
        "shell",
        json!({"command": "./.skills/recipes/scripts/add-node.sh llm"}),
    ));
    h.mock().push(Tape::text("done"));
    let o = h.run().await;
    assert_eq!(o.result(), "done");
    let names: Vec<String> = o.finished_steps().iter().map(|s| s.name.clone()).collect();
    assert_eq!(names, ["load_skill", "recipes/scripts/add-node.sh"]);

    let reqs = o.mock.as_ref().unwrap().requests();
    assert_eq!(reqs.len(), 3);
    let system = &reqs[0].body["messages"][0];
    assert_eq!(system["role"], "system");
    let text = system["content"].as_str().unwrap();
    assert!(text.starts_with("You are terse."), "{text}");
    assert!(
        text.contains("recipes: Adds nodes to a workflow."),
        "{text}"
    );
    assert!(text.contains("load_skill"), "{text}");
    assert!(!text.contains("SECRET-INSTRUCTIONS-MARKER"), "{text}");
    let tools: Vec<&str> = reqs[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        [
            "shell",
            "read_file",
            "write_file",
            "list_files",
            "load_skill"
        ]
    );
    // The instructions reach the model only through load_skill.
    let msgs = reqs[1].body["messages"].as_array().unwrap();
    let tool_msg = msgs.last().unwrap();
    assert_eq!(tool_msg["role"], "tool");
    assert!(
        tool_msg["content"]
            .as_str()
            .unwrap()
            .contains("SECRET-INSTRUCTIONS-MARKER")
    );
    let msgs = reqs[2].body["messages"].as_array().unwrap();
    assert!(
        msgs.last().unwrap()["content"]
            .as_str()
            .unwrap()
            .contains("node added: llm")
    );
}

#[tokio::test]
async fn invalid_bundles_are_skipped_with_a_warning() {
    let mut h = Harness::scripted(&script(json!([
        {"tool": "load_skill", "args": {"name": "evil"}},
        {"say": "ok"}
    ])));
    h.gw.config.skills = vec![
        Skill {
            name: "evil".into(),
            description: "escapes".into(),
            files: [("../../escaped.txt".to_owned(), "x".to_owned())].into(),
        },
        Skill {
            name: "../up".into(),
            description: "bad name".into(),
            files: Default::default(),
        },
        recipes(),
    ];
    let o = h.run().await;
    assert_eq!(o.result(), "ok");
    let warns = logs(&o.events, LogLevel::Warn);
    assert_eq!(warns.len(), 2, "{warns:?}");
    assert!(
        warns[0].contains("\"evil\"") && warns[0].contains(".."),
        "{warns:?}"
    );
    assert!(warns[1].contains("\"../up\""), "{warns:?}");
    assert!(logs(&o.events, LogLevel::Info).contains(&"Loaded 1 skill".to_owned()));
    let steps = o.finished_steps();
    assert_eq!(steps[0].name, "load_skill");
    assert_eq!(steps[0].status, StepStatus::Failed);
    assert!(steps[0].error.as_ref().unwrap().contains("no skill named"));
    assert!(!o.workdir.parent().unwrap().join("escaped.txt").exists());
    assert!(!o.workdir.join(".skills/evil").exists());
}

#[tokio::test]
async fn no_skills_no_load_skill_tool() {
    let o = Harness::scripted(&script(json!([
        {"tool": "load_skill", "args": {"name": "x"}},
        {"say": "ok"}
    ])))
    .run()
    .await;
    let steps = o.finished_steps();
    assert_eq!(steps[0].status, StepStatus::Failed);
    assert!(steps[0].error.as_ref().unwrap().contains("unknown tool"));
    assert!(!o.workdir.join(".skills").exists());
}
