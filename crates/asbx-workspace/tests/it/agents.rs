//! Stored agents: CRUD, validation, workspace isolation, and
//! `POST /api/agents/{id}/runs` (NDJSON relay, `SANDBOX_URL` resolution,
//! the stored definition and environment reaching `/config` and `/env`).

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Db, FakeRunner, Mode, TestWorkspace, client, on_both, problem, settled_run};

fn definition() -> Value {
    json!({
        "name": "triage",
        "description": "sorts incoming tickets",
        "systemPrompt": "You sort tickets.",
        "model": "openai:gpt-4.1-mini",
        "skills": [{"name": "tickets", "description": "ticket tools",
                    "files": {"SKILL.md": "# Tickets", "scripts/list.sh": "echo list"}}],
        "mcpServers": [
            {"name": "search", "url": "http://127.0.0.1:9/mcp"},
            {"name": "local", "command": "mcp-local", "args": ["--stdio"], "env": {"MODE": "ro"}}
        ],
        "environment": {
            "name": "staging",
            "variables": {"REGION": "eu", "TICKET_QUEUE": "inbox"},
            "setupScript": "echo setting up",
            "allowedHosts": ["pypi.org"]
        },
        "limits": {"max_steps": 7}
    })
}

async fn create(ws: &TestWorkspace, body: &Value) -> Value {
    let resp = client()
        .post(ws.url("/api/agents"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    resp.json().await.unwrap()
}

async fn run(ws: &TestWorkspace, agent: &str, body: Value) -> reqwest::Response {
    client()
        .post(ws.url(&format!("/api/agents/{agent}/runs")))
        .json(&body)
        .send()
        .await
        .unwrap()
}

fn fields(p: &Value) -> Vec<String> {
    p["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap().to_owned())
        .collect()
}

on_both!(an_agent_run_streams_ndjson_with_the_stored_definition);
async fn an_agent_run_streams_ndjson_with_the_stored_definition(db: Db) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let agent = create(&ws, &definition()).await;
    let id = agent["id"].as_str().unwrap().to_owned();

    let resp = run(&ws, &id, json!({"prompt": "sort today's tickets"})).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    assert_eq!(resp.headers()["x-asbx-agent-id"], id.as_str());
    let run_id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let body = resp.bytes().await.unwrap();
    // Straight through: byte for byte what the runner sent, log lines included.
    assert_eq!(body.as_ref(), runner.sent().as_slice());
    let lines: Vec<Value> = body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    let types: Vec<_> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["step", "log", "step", "result"]);
    assert!(lines.iter().all(|l| l["sessionId"] == run_id.as_str()));

    // The sandbox got the stored environment and definition.
    let d = runner.next_dispatch(0).await;
    assert_eq!(d.prompt, "sort today's tickets");
    assert_eq!(d.session_id.as_deref(), Some(run_id.as_str()));
    assert!(
        d.agent_url
            .ends_with(&format!("/api/assistant/sandbox/{run_id}"))
    );
    let callbacks = runner.callbacks();
    let (route, status, env) = &callbacks[0];
    assert_eq!((route.as_str(), *status), ("env", 200));
    assert_eq!(
        crate::support::env_without_access(env).0,
        json!({"variables": {"REGION": "eu", "TICKET_QUEUE": "inbox"},
                "setup_script": "echo setting up", "allowed_hosts": ["pypi.org"]})
    );
    let (route, status, config) = &callbacks[1];
    assert_eq!((route.as_str(), *status), ("config", 200));
    let want = definition();
    assert_eq!(config["system_prompt"], "You sort tickets.");
    assert_eq!(config["model"], "openai:gpt-4.1-mini");
    assert_eq!(config["skills"], want["skills"]);
    assert_eq!(config["mcp_servers"], want["mcpServers"]);
    assert_eq!(config["limits"], json!({"max_steps": 7}));
    assert!(config.get("conversation").is_none(), "{config}");

    // Recorded as a run of kind agent.
    let record = settled_run(&ws, &run_id).await;
    assert_eq!(record["kind"], "agent");
    assert_eq!(record["agentId"], id.as_str());
    assert_eq!(record["status"], "succeeded");
    assert_eq!(record["result"], "done: sort today's tickets");
    assert_eq!(record["model"], "openai:gpt-4.1-mini");
    assert_eq!(record["prompt"], "sort today's tickets");
}

on_both!(agents_are_created_listed_updated_and_deleted);
async fn agents_are_created_listed_updated_and_deleted(db: Db) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let a = create(&ws, &definition()).await;
    let id = a["id"].as_str().unwrap().to_owned();
    // As stored, but a stdio MCP server's `env` values masked (write-only).
    let mut shown = definition();
    shown["mcpServers"][1]["env"]["MODE"] = "********".into();
    for (k, v) in shown.as_object().unwrap() {
        assert_eq!(&a[k], v, "{k}");
    }
    assert!(a["createdAt"].is_i64() && a["updatedAt"] == a["createdAt"]);
    ws.clock.advance(Duration::from_millis(1));
    let minimal = create(&ws, &json!({"name": "minimal"})).await;
    assert_eq!(minimal["skills"], json!([]));
    assert_eq!(minimal["environment"]["variables"], json!({}));
    assert!(minimal.get("model").is_none());

    let got: Value = client()
        .get(ws.url(&format!("/api/agents/{id}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got, a);
    let list: Value = client()
        .get(ws.url("/api/agents"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let names: Vec<_> = list["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["triage", "minimal"]);

    // PUT replaces the whole definition.
    ws.clock.advance(Duration::from_secs(1));
    let resp = client()
        .put(ws.url(&format!("/api/agents/{id}")))
        .json(&json!({"name": "triage v2", "systemPrompt": "Be brief."}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let updated: Value = resp.json().await.unwrap();
    assert_eq!(updated["name"], "triage v2");
    assert_eq!(updated["systemPrompt"], "Be brief.");
    assert_eq!(updated["skills"], json!([]));
    assert_eq!(updated["createdAt"], a["createdAt"]);
    assert!(updated["updatedAt"].as_i64() > a["updatedAt"].as_i64());

    // A run uses the updated definition; no model given: the server default.
    let resp = run(&ws, &id, json!({"prompt": "x"})).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    let config = &runner.callbacks()[1].2;
    assert_eq!(config["system_prompt"], "Be brief.");
    assert_eq!(config["model"], "scripted:demo");

    // Deleted: gone from every route, its runs stay.
    let resp = client()
        .delete(ws.url(&format!("/api/agents/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    for resp in [
        client().get(ws.url(&format!("/api/agents/{id}"))),
        client()
            .put(ws.url(&format!("/api/agents/{id}")))
            .json(&json!({"name": "again"})),
        client().delete(ws.url(&format!("/api/agents/{id}"))),
        client()
            .post(ws.url(&format!("/api/agents/{id}/runs")))
            .json(&json!({"prompt": "x"})),
    ] {
        let p = problem(resp.send().await.unwrap(), 404).await;
        assert_eq!(p["code"], "not_found");
    }
    assert_eq!(runner.dispatches().len(), 1);
    let list: Value = client()
        .get(ws.url("/api/agents"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["agents"].as_array().unwrap().len(), 1);
}

on_both!(sandbox_url_is_resolved_environment_then_server_never_request);
async fn sandbox_url_is_resolved_environment_then_server_never_request(db: Db) {
    let from_request = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let from_env = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let from_server = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(from_server.url.clone()), |c| {
        c.allowed_sandbox_urls = vec![from_env.url.clone()];
    })
    .await;
    let mut with_env = definition();
    with_env["environment"]["variables"]["SANDBOX_URL"] = from_env.url.as_str().into();
    let with_env = create(&ws, &with_env).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let plain = create(&ws, &json!({"name": "plain"})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // Issue 13, item 2: a run request naming a runner is refused (400,
    // nothing dispatched anywhere), whatever the agent.
    for agent in [&with_env, &plain] {
        let body = json!({"prompt": "x", "sandboxUrl": from_request.url.as_str()});
        let p = problem(run(&ws, agent, body).await, 400).await;
        assert!(p["detail"].as_str().unwrap().contains("sandboxUrl"), "{p}");
    }
    assert!(
        [&from_request, &from_env, &from_server]
            .iter()
            .all(|r| r.dispatches().is_empty())
    );
    let cases = [(&with_env, &from_env), (&plain, &from_server)];
    for (i, (agent, expected)) in cases.into_iter().enumerate() {
        let before = [&from_request, &from_env, &from_server].map(|r| r.dispatches().len());
        let resp = run(&ws, agent, json!({"prompt": "x"})).await;
        assert_eq!(resp.status(), 200, "case {i}");
        resp.bytes().await.unwrap();
        let after = [&from_request, &from_env, &from_server].map(|r| r.dispatches().len());
        for (j, r) in [&from_request, &from_env, &from_server].iter().enumerate() {
            let want = usize::from(std::ptr::eq(*r, expected));
            assert_eq!(after[j] - before[j], want, "case {i}, runner {j}");
        }
    }
}

on_both!(an_agent_run_with_no_sandbox_url_fails_fast);
async fn an_agent_run_with_no_sandbox_url_fails_fast(db: Db) {
    let ws = TestWorkspace::start_on(db, None, |_| {}).await;
    let id = create(&ws, &json!({"name": "nowhere"})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let p = problem(run(&ws, &id, json!({"prompt": "x"})).await, 503).await;
    assert_eq!(p["code"], "sandbox_url_missing");
    assert_eq!(p["agentId"], id.as_str());
    let detail = p["detail"].as_str().unwrap();
    for hint in ["agent's environment", "SANDBOX_URL"] {
        assert!(detail.contains(hint), "{hint} missing in {p}");
    }
    // Nothing was recorded or minted.
    let pool = ws.db().await;
    let (runs,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM runs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(runs, 0);
    pool.close().await;
}

on_both!(agents_of_one_workspace_are_invisible_from_another);
async fn agents_of_one_workspace_are_invisible_from_another(db: Db) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |c| c.require_auth = true).await;
    let a = ws.workspace.create_workspace("a").await.unwrap();
    let b = ws.workspace.create_workspace("b").await.unwrap();
    let key_a = ws.workspace.create_api_key(&a, "ka").await.unwrap();
    let key_b = ws.workspace.create_api_key(&b, "kb").await.unwrap();
    let c = client();

    let p = problem(c.get(ws.url("/api/agents")).send().await.unwrap(), 401).await;
    assert_eq!(p["code"], "unauthorized");
    let p = problem(
        c.post(ws.url("/api/agents"))
            .json(&definition())
            .send()
            .await
            .unwrap(),
        401,
    )
    .await;
    assert_eq!(p["code"], "unauthorized");

    let resp = c
        .post(ws.url("/api/agents"))
        .bearer_auth(&key_a)
        .json(&definition())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let id = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let resp = c
        .post(ws.url(&format!("/api/agents/{id}/runs")))
        .bearer_auth(&key_a)
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let run_id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    resp.bytes().await.unwrap();

    // B sees none of it and can change none of it.
    let list: Value = c
        .get(ws.url("/api/agents"))
        .bearer_auth(&key_b)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list, json!({"agents": []}));
    for req in [
        c.get(ws.url(&format!("/api/agents/{id}"))),
        c.put(ws.url(&format!("/api/agents/{id}")))
            .json(&json!({"name": "stolen"})),
        c.delete(ws.url(&format!("/api/agents/{id}"))),
        c.post(ws.url(&format!("/api/agents/{id}/runs")))
            .json(&json!({"prompt": "x"})),
        c.get(ws.url(&format!("/api/runs/{run_id}"))),
    ] {
        let p = problem(req.bearer_auth(&key_b).send().await.unwrap(), 404).await;
        assert_eq!(p["code"], "not_found");
    }
    assert_eq!(runner.dispatches().len(), 1);

    // A's agent is untouched.
    let got: Value = c
        .get(ws.url(&format!("/api/agents/{id}")))
        .bearer_auth(&key_a)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["name"], "triage");
    let list: Value = c
        .get(ws.url("/api/agents"))
        .bearer_auth(&key_a)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["agents"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn bad_agent_bodies_name_every_bad_field() {
    let ws = TestWorkspace::start(None).await;
    let bad = json!({
        "name": "",
        "systemPrompt": "x".repeat((1 << 20) + 1),
        "model": "nocolon",
        "skills": [{"name": "../x", "files": {"/etc/passwd": "x"}}, {"name": "ok"}, {"name": "ok"}],
        "mcpServers": [{"name": "a b", "url": "ftp://x"}, {"name": "s", "command": " "}],
        "environment": {
            "variables": {"1BAD": "x", "SANDBOX_URL": "not a url"},
            "allowedHosts": ["http://x"]
        }
    });
    let expected = [
        "name",
        "systemPrompt",
        "model",
        "skills[0].name",
        "skills[0].files./etc/passwd",
        "skills[2].name",
        "mcpServers[0].name",
        "mcpServers[0].url",
        "mcpServers[1].command",
        "environment.variables.1BAD",
        "environment.allowedHosts[0]",
        "environment.variables.SANDBOX_URL",
    ];
    let p = problem(
        client()
            .post(ws.url("/api/agents"))
            .json(&bad)
            .send()
            .await
            .unwrap(),
        400,
    )
    .await;
    assert_eq!(p["code"], "invalid_request");
    assert_eq!(fields(&p), expected, "{p}");

    // The same checks on update; nothing is stored by a bad body.
    let id = create(&ws, &json!({"name": "good"})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let p = problem(
        client()
            .put(ws.url(&format!("/api/agents/{id}")))
            .json(&bad)
            .send()
            .await
            .unwrap(),
        400,
    )
    .await;
    assert_eq!(fields(&p), expected, "{p}");
    let list: Value = client()
        .get(ws.url("/api/agents"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["agents"].as_array().unwrap().len(), 1);
    assert_eq!(list["agents"][0]["name"], "good");

    // Unknown fields, missing name, broken JSON.
    for (body, needle) in [
        (json!({"name": "x", "bogus": 1}).to_string(), "bogus"),
        (
            json!({"name": "x", "environment": {"vars": {}}}).to_string(),
            "vars",
        ),
        (json!({}).to_string(), "name"),
        ("{".to_owned(), "invalid JSON"),
    ] {
        let p = problem(
            client()
                .post(ws.url("/api/agents"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap(),
            400,
        )
        .await;
        assert!(p["detail"].as_str().unwrap().contains(needle), "{p}");
    }

    // A bad run request names its fields too.
    let p = problem(run(&ws, &id, json!({"prompt": " "})).await, 400).await;
    assert_eq!(fields(&p), ["prompt"], "{p}");
    let p = problem(
        run(&ws, &id, json!({"prompt": "x", "model": "a:b"})).await,
        400,
    )
    .await;
    assert!(p["detail"].as_str().unwrap().contains("model"), "{p}");
}

#[tokio::test]
async fn client_disconnect_cancels_the_agent_run_upstream() {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;
    let id = create(&ws, &json!({"name": "long"})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let dropped = runner.shared.dropped.notified();
    let mut resp = run(&ws, &id, json!({"prompt": "x"})).await;
    assert_eq!(resp.status(), 200);
    let run_id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("running"));
    drop(resp);
    tokio::time::timeout(Duration::from_secs(20), dropped)
        .await
        .expect("upstream dropped");
    let record = settled_run(&ws, &run_id).await;
    assert_eq!(record["kind"], "agent");
    assert_eq!(record["status"], "failed");
    assert_eq!(record["error"]["code"], "cancelled");
}

/// Task A: a stored agent that is accepted (`201`) runs with everything it
/// was accepted with. A definition at the shared limits
/// (`asbx_protocol::rules`) is stored, and what the sandbox's `/config`
/// receives is that definition, passing the very checks the agent applies;
/// definitions the agent would refuse are refused at the API with `400`
/// naming the field, and nothing is stored.
#[tokio::test]
async fn an_accepted_agent_runs_with_everything_it_was_accepted_with() {
    use asbx_protocol::callback::{McpServer, Skill};
    use asbx_protocol::rules::{mcp, skills};

    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;

    // At the limits: the most skills; one with the most files; one with
    // the largest file under the longest path; names of the longest length;
    // the most MCP servers, stdio and HTTP.
    let longest_path = format!("d/{}", "p".repeat(skills::MAX_PATH_BYTES - 2));
    let mut at_limits: Vec<Value> = (0..skills::MAX_SKILLS)
        .map(|i| json!({"name": format!("skill-{i}"), "description": "d", "files": {"SKILL.md": "# x"}}))
        .collect();
    at_limits[0]["name"] = "s".repeat(skills::MAX_NAME_BYTES).into();
    at_limits[1]["files"] = (0..skills::MAX_FILES_PER_SKILL)
        .map(|i| (format!("f/{i}.txt"), Value::from("x")))
        .collect::<serde_json::Map<_, _>>()
        .into();
    at_limits[2]["files"] = json!({ longest_path.clone(): "y".repeat(skills::MAX_FILE_BYTES) });
    // Near the total: 14 MiB of bundles, more than an ordinary JSON body.
    for skill in &mut at_limits[3..16] {
        skill["files"]["big.txt"] = "b".repeat(skills::MAX_FILE_BYTES).into();
    }
    let servers: Vec<Value> = (0..mcp::MAX_SERVERS)
        .map(|i| {
            if i % 2 == 0 {
                json!({"name": format!("stdio_{i}"), "command": "server", "args": ["--x"], "env": {"TOKEN_1": "v"}})
            } else {
                json!({"name": format!("http-{i}"), "url": "https://mcp.example.com/mcp"})
            }
        })
        .collect();
    let mut servers = servers;
    servers[0]["name"] = "m".repeat(mcp::MAX_NAME_BYTES).into();
    let definition = json!({"name": "at-limits", "skills": at_limits, "mcpServers": servers});
    let created = create(&ws, &definition).await;
    let id = created["id"].as_str().unwrap().to_owned();

    let resp = run(&ws, &id, json!({"prompt": "go"})).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    let config = runner
        .callbacks()
        .into_iter()
        .find(|(route, _, _)| route == "config")
        .expect("the sandbox fetched /config");
    assert_eq!(config.1, 200);
    let got_skills: Vec<Skill> = serde_json::from_value(config.2["skills"].clone()).unwrap();
    let got_servers: Vec<McpServer> =
        serde_json::from_value(config.2["mcp_servers"].clone()).unwrap();
    let mut errors = Vec::new();
    skills::check_skills(&got_skills, "skills", &mut errors);
    mcp::check_servers(&got_servers, "mcpServers", &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    // Everything it was accepted with, nothing dropped on the way.
    let sent_skills: Vec<Skill> = serde_json::from_value(definition["skills"].clone()).unwrap();
    let sent_servers: Vec<McpServer> =
        serde_json::from_value(definition["mcpServers"].clone()).unwrap();
    assert_eq!(got_skills, sent_skills);
    assert_eq!(got_servers, sent_servers);
    assert_eq!(
        got_skills[2].files[&longest_path].len(),
        skills::MAX_FILE_BYTES
    );

    // What the agent would refuse, refused at the API, naming the field.
    let long = "q".repeat(300);
    let cases = [
        (
            json!({"name": "a", "skills": [{"name": ".hidden", "files": {}}]}),
            "skills[0].name".to_owned(),
        ),
        (
            json!({"name": "a", "skills": [{"name": "p", "files": { long.clone(): "x" }}]}),
            format!("skills[0].files.{long}"),
        ),
        (
            json!({"name": "a", "skills": [{"name": "big", "files": {"a.bin": "z".repeat(2 << 20)}}]}),
            "skills[0].files.a.bin".to_owned(),
        ),
        (
            json!({"name": "a", "skills": (0..=skills::MAX_SKILLS)
                .map(|i| json!({"name": format!("s{i}")}))
                .collect::<Vec<_>>()}),
            "skills".to_owned(),
        ),
        (
            json!({"name": "a", "mcpServers": [{"name": "dot.name", "url": "https://x.example/mcp"}]}),
            "mcpServers[0].name".to_owned(),
        ),
    ];
    for (body, field) in cases {
        let resp = client()
            .post(ws.url("/api/agents"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let p = problem(resp, 400).await;
        assert_eq!(fields(&p), vec![field], "{p}");
    }
    let list: Value = client()
        .get(ws.url("/api/agents"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["agents"].as_array().unwrap().len(), 1);
}
