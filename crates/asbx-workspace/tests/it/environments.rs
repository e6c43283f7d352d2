//! Named environments (`/api/environments`), per-chat settings, the models
//! list: CRUD, write-only secrets, validation, workspace isolation, and what
//! a run, an agent run and a chat turn get from `/env` and `/config`.

use serde_json::{Value, json};

use crate::support::{
    Db, FakeRunner, Mode, SseReader, TestWorkspace, client, on_both, post_turn, problem,
};

const SECRET: &str = "s3cret-value-7f2c9a";
const SECRET2: &str = "second-secret-41d0";

fn environment() -> Value {
    json!({
        "name": "staging",
        "variables": {"REGION": "eu", "QUEUE": "inbox"},
        "secrets": {"API_TOKEN": SECRET},
        "setupScript": "echo setting up",
        "allowedHosts": ["pypi.org"]
    })
}

fn fields(p: &Value) -> Vec<String> {
    p["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap().to_owned())
        .collect()
}

/// Every response body a test reads, to search for secrets at the end.
#[derive(Default)]
struct Seen(String);

impl Seen {
    async fn json(&mut self, resp: reqwest::Response, status: u16) -> Value {
        assert_eq!(resp.status().as_u16(), status);
        let text = resp.text().await.unwrap();
        self.0.push_str(&text);
        self.0.push('\n');
        if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap()
        }
    }

    fn assert_no_secret(&self) {
        assert!(!self.0.is_empty());
        for s in [SECRET, SECRET2] {
            assert!(!self.0.contains(s), "a response carried the secret {s}");
        }
    }
}

fn req(ws: &TestWorkspace, m: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
    client().request(m, ws.url(path))
}

async fn create_env(ws: &TestWorkspace, body: &Value) -> Value {
    let resp = req(ws, reqwest::Method::POST, "/api/environments")
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    resp.json().await.unwrap()
}

/// Posts a run and reads its NDJSON to the end; the run id.
async fn run_to_end(ws: &TestWorkspace, body: Value) -> String {
    let resp = req(ws, reqwest::Method::POST, "/api/runs")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let body = resp.text().await.unwrap();
    assert!(!body.contains(SECRET));
    id
}

/// The `/env` and `/config` the fake runner redeemed for its dispatch `n`.
fn env_and_config(runner: &FakeRunner, n: usize) -> (Value, Value) {
    let callbacks = runner.callbacks();
    let nth = |route: &str| {
        let (_, status, body) = callbacks
            .iter()
            .filter(|c| c.0 == route)
            .nth(n)
            .unwrap_or_else(|| panic!("no {route} callback {n}"));
        assert_eq!(*status, 200);
        body.clone()
    };
    (
        crate::support::env_without_access(&nth("env")).0,
        nth("config"),
    )
}

on_both!(crud_answers_secret_names_never_values);
async fn crud_answers_secret_names_never_values(db: Db) {
    use reqwest::Method as M;
    let ws = TestWorkspace::start_on(db, None, |_| {}).await;
    let mut seen = Seen::default();

    let created = seen
        .json(
            req(&ws, M::POST, "/api/environments")
                .json(&environment())
                .send()
                .await
                .unwrap(),
            201,
        )
        .await;
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["name"], "staging");
    assert_eq!(
        created["variables"],
        json!({"REGION": "eu", "QUEUE": "inbox"})
    );
    assert_eq!(created["secretNames"], json!(["API_TOKEN"]));
    assert_eq!(created["setupScript"], "echo setting up");
    assert_eq!(created["allowedHosts"], json!(["pypi.org"]));
    assert!(created.get("secrets").is_none());
    assert!(created["createdAt"].as_i64().unwrap() > 0);

    let list = seen
        .json(
            req(&ws, M::GET, "/api/environments").send().await.unwrap(),
            200,
        )
        .await;
    assert_eq!(list["environments"], json!([created.clone()]));
    let one = seen
        .json(
            req(&ws, M::GET, &format!("/api/environments/{id}"))
                .send()
                .await
                .unwrap(),
            200,
        )
        .await;
    assert_eq!(one, created);

    // PUT without `secrets` keeps them; everything else is replaced.
    let put = seen
        .json(
            req(&ws, M::PUT, &format!("/api/environments/{id}"))
                .json(&json!({"name": "staging-eu", "variables": {"REGION": "eu-west"}}))
                .send()
                .await
                .unwrap(),
            200,
        )
        .await;
    assert_eq!(put["name"], "staging-eu");
    assert_eq!(put["variables"], json!({"REGION": "eu-west"}));
    assert_eq!(put["secretNames"], json!(["API_TOKEN"]));
    assert_eq!(put["setupScript"], Value::Null);
    assert_eq!(put["allowedHosts"], json!([]));
    assert_eq!(put["createdAt"], created["createdAt"]);

    // A name with null deletes that secret, a string sets one.
    let put = seen
        .json(
            req(&ws, M::PUT, &format!("/api/environments/{id}"))
                .json(&json!({"name": "staging-eu",
                              "secrets": {"API_TOKEN": null, "DB_PASSWORD": SECRET2}}))
                .send()
                .await
                .unwrap(),
            200,
        )
        .await;
    assert_eq!(put["secretNames"], json!(["DB_PASSWORD"]));

    // Names are unique among live environments: 409 conflict, on POST and PUT.
    let p = problem(
        req(&ws, M::POST, "/api/environments")
            .json(&json!({"name": "staging-eu"}))
            .send()
            .await
            .unwrap(),
        409,
    )
    .await;
    assert_eq!(p["code"], "conflict");
    let other = create_env(&ws, &json!({"name": "prod"})).await;
    let p = problem(
        req(
            &ws,
            M::PUT,
            &format!("/api/environments/{}", other["id"].as_str().unwrap()),
        )
        .json(&json!({"name": "staging-eu"}))
        .send()
        .await
        .unwrap(),
        409,
    )
    .await;
    assert_eq!(p["code"], "conflict");

    // Delete: gone, and its name is free again.
    let r = req(&ws, M::DELETE, &format!("/api/environments/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    for m in [M::GET, M::DELETE] {
        let p = problem(
            req(&ws, m, &format!("/api/environments/{id}"))
                .send()
                .await
                .unwrap(),
            404,
        )
        .await;
        assert_eq!(p["code"], "not_found");
    }
    let p = problem(
        req(&ws, M::PUT, &format!("/api/environments/{id}"))
            .json(&json!({"name": "x"}))
            .send()
            .await
            .unwrap(),
        404,
    )
    .await;
    assert_eq!(p["code"], "not_found");
    create_env(&ws, &json!({"name": "staging-eu"})).await;
    let list = seen
        .json(
            req(&ws, M::GET, "/api/environments").send().await.unwrap(),
            200,
        )
        .await;
    let names: Vec<_> = list["environments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["prod", "staging-eu"]);
    seen.assert_no_secret();
}

on_both!(bad_environments_name_every_field);
async fn bad_environments_name_every_field(db: Db) {
    let ws = TestWorkspace::start_on(db, None, |_| {}).await;
    let bad = json!({
        "name": " ",
        "variables": {"1BAD": "x", "SHARED": "v"},
        "secrets": {"bad-name": "x", "EMPTY": null, "SHARED": "s", "NUL": "a\u{0}b"},
        "setupScript": "x".repeat((1 << 20) + 1),
        "allowedHosts": ["pypi.org", "not a host"]
    });
    let p = problem(
        req(&ws, reqwest::Method::POST, "/api/environments")
            .json(&bad)
            .send()
            .await
            .unwrap(),
        400,
    )
    .await;
    assert_eq!(p["code"], "invalid_request");
    let mut got = fields(&p);
    got.sort();
    assert_eq!(
        got,
        [
            "allowedHosts[1]",
            "name",
            "secrets.EMPTY",
            "secrets.NUL",
            "secrets.SHARED",
            "secrets.bad-name",
            "setupScript",
            "variables.1BAD"
        ]
    );
    // An unknown field (a typo of `secrets`) is refused, not ignored.
    let p = problem(
        req(&ws, reqwest::Method::POST, "/api/environments")
            .json(&json!({"name": "x", "secret": {"A": "b"}}))
            .send()
            .await
            .unwrap(),
        400,
    )
    .await;
    assert_eq!(p["code"], "invalid_request");
    // Nothing was stored.
    let list: Value = client()
        .get(ws.url("/api/environments"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["environments"], json!([]));
}

on_both!(a_run_gets_a_named_environment_under_its_own_values);
async fn a_run_gets_a_named_environment_under_its_own_values(db: Db) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let env = create_env(&ws, &environment()).await;
    let id = env["id"].as_str().unwrap().to_owned();

    // By name: the secret is a variable in /env; inline values win.
    let run_id = run_to_end(
        &ws,
        json!({"prompt": "hi", "environment": "staging",
               "variables": {"REGION": "us"}, "allowedHosts": ["crates.io"]}),
    )
    .await;
    let (e, _) = env_and_config(&runner, 0);
    assert_eq!(
        e,
        json!({"variables": {"API_TOKEN": SECRET, "QUEUE": "inbox", "REGION": "us"},
               "setup_script": "echo setting up",
               "allowed_hosts": ["pypi.org", "crates.io"]})
    );
    let record = client()
        .get(ws.url(&format!("/api/runs/{run_id}")))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!record.contains(SECRET), "{record}");

    // By id, its own setup script winning; after a PUT that sets another
    // secret and keeps the first.
    let r = client()
        .put(ws.url(&format!("/api/environments/{id}")))
        .json(&json!({"name": "staging", "secrets": {"DB_PASSWORD": SECRET2}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    run_to_end(
        &ws,
        json!({"prompt": "hi", "environment": id, "setupScript": "echo mine"}),
    )
    .await;
    let (e, _) = env_and_config(&runner, 1);
    assert_eq!(
        e,
        json!({"variables": {"API_TOKEN": SECRET, "DB_PASSWORD": SECRET2},
               "setup_script": "echo mine", "allowed_hosts": []})
    );

    // An unknown environment is a field error; nothing is dispatched.
    let p = problem(
        client()
            .post(ws.url("/api/runs"))
            .json(&json!({"prompt": "hi", "environment": "nope"}))
            .send()
            .await
            .unwrap(),
        400,
    )
    .await;
    assert_eq!(fields(&p), ["environment"]);
    assert_eq!(runner.dispatches().len(), 2);
}

on_both!(an_agent_names_an_environment_by_id);
async fn an_agent_names_an_environment_by_id(db: Db) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let env = create_env(&ws, &environment()).await;
    let env_id = env["id"].as_str().unwrap().to_owned();

    // By name is not enough for a stored agent: it keeps the id.
    let p = problem(
        client()
            .post(ws.url("/api/agents"))
            .json(&json!({"name": "a", "environmentId": "staging"}))
            .send()
            .await
            .unwrap(),
        400,
    )
    .await;
    assert_eq!(fields(&p), ["environmentId"]);

    let agent: Value = client()
        .post(ws.url("/api/agents"))
        .json(&json!({"name": "a", "environmentId": env_id,
                      "environment": {"variables": {"REGION": "agent"}}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(agent["environmentId"], env_id.as_str());
    let agent_id = agent["id"].as_str().unwrap();
    let r = client()
        .post(ws.url(&format!("/api/agents/{agent_id}/runs")))
        .json(&json!({"prompt": "go"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    let (e, _) = env_and_config(&runner, 0);
    assert_eq!(
        e["variables"],
        json!({"API_TOKEN": SECRET, "QUEUE": "inbox", "REGION": "agent"})
    );
    assert_eq!(e["setup_script"], "echo setting up");

    // Its environment deleted, the agent's run is a 409, not a 500, and
    // nothing is dispatched.
    let r = client()
        .delete(ws.url(&format!("/api/environments/{env_id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let p = problem(
        client()
            .post(ws.url(&format!("/api/agents/{agent_id}/runs")))
            .json(&json!({"prompt": "go"}))
            .send()
            .await
            .unwrap(),
        409,
    )
    .await;
    assert_eq!(p["code"], "conflict");
    assert_eq!(runner.dispatches().len(), 1);
}

on_both!(another_workspace_can_neither_read_nor_use_an_environment);
async fn another_workspace_can_neither_read_nor_use_an_environment(db: Db) {
    use reqwest::Method as M;
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |c| c.require_auth = true).await;
    let a = ws.workspace.create_workspace("a").await.unwrap();
    let b = ws.workspace.create_workspace("b").await.unwrap();
    let key_a = ws.workspace.create_api_key(&a, "ka").await.unwrap();
    let key_b = ws.workspace.create_api_key(&b, "kb").await.unwrap();
    let authed = |m: M, path: &str, key: &str| req(&ws, m, path).bearer_auth(key);

    let env: Value = authed(M::POST, "/api/environments", &key_a)
        .json(&environment())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = env["id"].as_str().unwrap().to_owned();
    let path = format!("/api/environments/{id}");

    // Without a key: 401 on every route of this feature.
    for (m, p) in [
        (M::GET, "/api/environments".to_owned()),
        (M::POST, "/api/environments".to_owned()),
        (M::GET, path.clone()),
        (M::PUT, path.clone()),
        (M::DELETE, path.clone()),
        (M::GET, "/api/models".to_owned()),
        (M::PUT, "/api/assistant/chats/x/settings".to_owned()),
    ] {
        let r = req(&ws, m.clone(), &p)
            .json(&json!({"name": "x"}))
            .send()
            .await
            .unwrap();
        assert_eq!(problem(r, 401).await["code"], "unauthorized", "{m} {p}");
    }

    // B sees nothing, changes nothing, uses nothing.
    let list: Value = authed(M::GET, "/api/environments", &key_b)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["environments"], json!([]));
    for m in [M::GET, M::PUT, M::DELETE] {
        let r = authed(m.clone(), &path, &key_b)
            .json(&json!({"name": "mine now", "secrets": {"API_TOKEN": null}}))
            .send()
            .await
            .unwrap();
        assert_eq!(problem(r, 404).await["code"], "not_found", "{m}");
    }
    for reference in [id.as_str(), "staging"] {
        let r = authed(M::POST, "/api/runs", &key_b)
            .json(&json!({"prompt": "hi", "environment": reference}))
            .send()
            .await
            .unwrap();
        assert_eq!(fields(&problem(r, 400).await), ["environment"]);
    }
    let r = authed(M::POST, "/api/assistant/chat/stream", &key_b)
        .json(&json!({"message": "hi", "settings": {"environmentId": id}}))
        .send()
        .await
        .unwrap();
    assert_eq!(fields(&problem(r, 400).await), ["settings.environmentId"]);
    let r = authed(M::POST, "/api/agents", &key_b)
        .json(&json!({"name": "x", "environmentId": id}))
        .send()
        .await
        .unwrap();
    assert_eq!(fields(&problem(r, 400).await), ["environmentId"]);
    assert!(runner.dispatches().is_empty());

    // Positive control: A's key reads it, unchanged, and its run gets it.
    let again: Value = authed(M::GET, &path, &key_a)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again, env);
    let r = authed(M::POST, "/api/runs", &key_a)
        .json(&json!({"prompt": "hi", "environment": "staging"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    let (e, _) = env_and_config(&runner, 0);
    assert_eq!(e["variables"]["API_TOKEN"], SECRET);
}

async fn chat_detail(ws: &TestWorkspace, chat_id: &str, seen: &mut Seen) -> Value {
    seen.json(
        client()
            .get(ws.url(&format!("/api/assistant/chats/{chat_id}")))
            .send()
            .await
            .unwrap(),
        200,
    )
    .await
}

/// Runs a turn to its `done`; the chat id.
async fn turn_to_done(ws: &TestWorkspace, body: Value, seen: &mut Seen) -> String {
    let resp = post_turn(ws, body).await;
    assert_eq!(resp.status(), 200);
    let chat_id = resp.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let events = SseReader::new(resp).until_done().await;
    for e in &events {
        seen.0.push_str(&e.data.to_string());
    }
    assert_eq!(events.last().unwrap().data["status"], "succeeded");
    chat_id
}

on_both!(a_chat_turn_uses_the_chats_settings);
async fn a_chat_turn_uses_the_chats_settings(db: Db) {
    use reqwest::Method as M;
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |c| {
        c.models = vec!["scripted:demo".into(), "openai:gpt-4.1-mini".into()];
    })
    .await;
    let mut seen = Seen::default();
    let env = create_env(&ws, &environment()).await;
    let env_id = env["id"].as_str().unwrap().to_owned();
    let skill = json!({"name": "notes", "description": "note tools",
                       "files": {"SKILL.md": "# Notes"}});

    // The first turn chooses the settings.
    let settings = json!({"model": "openai:gpt-4.1-mini", "systemPrompt": "Be brief.",
                          "environmentId": env_id, "skills": [skill]});
    let chat_id = turn_to_done(
        &ws,
        json!({"message": "hello", "settings": settings}),
        &mut seen,
    )
    .await;
    let (e, c) = env_and_config(&runner, 0);
    assert_eq!(
        e,
        json!({"variables": {"API_TOKEN": SECRET, "QUEUE": "inbox", "REGION": "eu"},
               "setup_script": "echo setting up", "allowed_hosts": ["pypi.org"]})
    );
    assert_eq!(c["model"], "openai:gpt-4.1-mini");
    assert_eq!(c["system_prompt"], "Be brief.");
    assert_eq!(c["skills"], json!([skill]));
    let d = chat_detail(&ws, &chat_id, &mut seen).await;
    let mut expected = settings.clone();
    expected["effective"] = json!({"model": "openai:gpt-4.1-mini", "systemPrompt": "Be brief."});
    assert_eq!(d["settings"], expected);

    // The next turn keeps them; settings with a chatId are refused.
    turn_to_done(
        &ws,
        json!({"chatId": chat_id, "message": "again"}),
        &mut seen,
    )
    .await;
    let (e, c) = env_and_config(&runner, 1);
    assert_eq!(e["variables"]["API_TOKEN"], SECRET);
    assert_eq!(c["model"], "openai:gpt-4.1-mini");
    assert_eq!(c["conversation"].as_array().unwrap().len(), 2);
    let p = problem(
        post_turn(
            &ws,
            json!({"chatId": chat_id, "message": "x", "settings": {"model": "scripted:demo"}}),
        )
        .await,
        400,
    )
    .await;
    assert_eq!(fields(&p), ["settings"]);

    // PUT replaces them: no system prompt is the default one, no
    // environment is an empty /env.
    let put = seen
        .json(
            req(
                &ws,
                M::PUT,
                &format!("/api/assistant/chats/{chat_id}/settings"),
            )
            .json(&json!({"model": "scripted:demo"}))
            .send()
            .await
            .unwrap(),
            200,
        )
        .await;
    assert_eq!(put["model"], "scripted:demo");
    assert!(put.get("environmentId").is_none());
    let default_prompt = put["effective"]["systemPrompt"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(default_prompt.contains("attachments/"), "{default_prompt}");
    assert!(default_prompt.contains("workspace_create_file"));
    assert_eq!(chat_detail(&ws, &chat_id, &mut seen).await["settings"], put);
    turn_to_done(
        &ws,
        json!({"chatId": chat_id, "message": "third"}),
        &mut seen,
    )
    .await;
    let (e, c) = env_and_config(&runner, 2);
    assert_eq!(
        e,
        json!({"variables": {}, "setup_script": null, "allowed_hosts": []})
    );
    assert_eq!(c["model"], "scripted:demo");
    assert_eq!(c["system_prompt"], default_prompt.as_str());

    // Bad settings name their fields; an unknown chat is 404.
    let p = problem(
        req(
            &ws,
            M::PUT,
            &format!("/api/assistant/chats/{chat_id}/settings"),
        )
        .json(
            &json!({"model": "anthropic:claude-x", "environmentId": "nope",
                      "skills": [{"name": "bad name", "description": "d", "files": {}}]}),
        )
        .send()
        .await
        .unwrap(),
        400,
    )
    .await;
    let got = fields(&p);
    assert!(got.contains(&"settings.model".to_owned()), "{got:?}");
    assert!(
        got.contains(&"settings.environmentId".to_owned()),
        "{got:?}"
    );
    assert!(
        got.iter().any(|f| f.starts_with("settings.skills")),
        "{got:?}"
    );
    let p = problem(
        req(&ws, M::PUT, "/api/assistant/chats/nope/settings")
            .json(&json!({}))
            .send()
            .await
            .unwrap(),
        404,
    )
    .await;
    assert_eq!(p["code"], "not_found");
    let p = problem(
        post_turn(
            &ws,
            json!({"message": "x", "settings": {"model": "openai:gpt-5"}}),
        )
        .await,
        400,
    )
    .await;
    assert_eq!(p["code"], "model_not_allowed");
    assert_eq!(fields(&p), ["settings.model"]);

    // The chat's environment deleted: its next turn is a 409 conflict and
    // adds nothing to the thread; another environment fixes it.
    let r = req(
        &ws,
        M::PUT,
        &format!("/api/assistant/chats/{chat_id}/settings"),
    )
    .json(&json!({"environmentId": env_id}))
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let r = req(&ws, M::DELETE, &format!("/api/environments/{env_id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let before = chat_detail(&ws, &chat_id, &mut seen).await["messages"]
        .as_array()
        .unwrap()
        .len();
    let p = problem(
        post_turn(&ws, json!({"chatId": chat_id, "message": "fourth"})).await,
        409,
    )
    .await;
    assert_eq!(p["code"], "conflict");
    let after = chat_detail(&ws, &chat_id, &mut seen).await;
    assert_eq!(after["messages"].as_array().unwrap().len(), before);
    assert!(after["activeTurnId"].is_null());
    assert_eq!(runner.dispatches().len(), 3);
    seen.assert_no_secret();
}

on_both!(a_chat_without_settings_gets_the_default_system_prompt);
async fn a_chat_without_settings_gets_the_default_system_prompt(db: Db) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let mut seen = Seen::default();
    let chat_id = turn_to_done(&ws, json!({"message": "hello"}), &mut seen).await;
    let (_, c) = env_and_config(&runner, 0);
    let d = chat_detail(&ws, &chat_id, &mut seen).await;
    assert_eq!(
        d["settings"],
        json!({"effective": {"model": "scripted:demo",
                             "systemPrompt": c["system_prompt"].clone()}})
    );
    let prompt = c["system_prompt"].as_str().unwrap();
    assert!(prompt.contains("attachments/") && prompt.contains("workspace_read_file"));
    assert_eq!(c["model"], "scripted:demo");
}

#[tokio::test]
async fn the_models_list_has_the_default_first_or_marked() {
    let ws = TestWorkspace::start_with(None, |_| {}).await;
    let list: Value = client()
        .get(ws.url("/api/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        list,
        json!({"models": [{"id": "scripted:demo", "provider": "scripted", "default": true}]})
    );

    let ws = TestWorkspace::start_with(None, |c| {
        c.default_model = "anthropic:claude-sonnet-4-5".into();
        c.models = vec![
            "openai:gpt-4.1-mini".into(),
            "scripted:demo".into(),
            "openai:gpt-4.1-mini".into(),
        ];
    })
    .await;
    let list: Value = client()
        .get(ws.url("/api/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        list,
        json!({"models": [
            {"id": "anthropic:claude-sonnet-4-5", "provider": "anthropic", "default": true},
            {"id": "openai:gpt-4.1-mini", "provider": "openai", "default": false},
            {"id": "scripted:demo", "provider": "scripted", "default": false}
        ]})
    );

    // A malformed model in the setting is refused when the workspace opens.
    let dir = tempfile::tempdir().unwrap();
    let mut config = asbx_workspace::WorkspaceConfig::new(
        dir.path(),
        url::Url::parse("http://127.0.0.1:1").unwrap(),
    );
    config.models = vec!["no-provider".into()];
    assert!(asbx_workspace::Workspace::open(config).await.is_err());
}
