//! Secrets at rest (docs/secrets.md): environment secrets and stdio MCP
//! `env` values are sealed in the database, a run stores its secrets' names
//! and `/env` reads the values as they are when it is redeemed, MCP `env`
//! values are write-only, clear rows from before are sealed at start, and
//! the data folder and SQLite files are private.

use std::os::unix::fs::PermissionsExt as _;

use serde_json::{Value, json};
use sqlx::Row as _;

use crate::support::{Db, FakeRunner, Mode, TestWorkspace, client, on_both};

fn unique(what: &str) -> String {
    format!("{what}-{}", crate::support::random_hex())
}

/// Every `/env` (or `/config`) the fake runner redeemed, in order.
fn redeemed(runner: &FakeRunner, route: &str) -> Vec<Value> {
    runner
        .callbacks()
        .into_iter()
        .filter(|c| c.0 == route)
        .map(|(_, status, body)| {
            assert_eq!(status, 200);
            body
        })
        .collect()
}

async fn send(ws: &TestWorkspace, m: reqwest::Method, path: &str, body: Value) -> Value {
    let r = client()
        .request(m.clone(), ws.url(path))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{m} {path}: {}", r.status());
    r.json().await.unwrap_or(Value::Null)
}

/// Posts a run and reads it to the end.
async fn run(ws: &TestWorkspace, body: Value) {
    let r = client()
        .post(ws.url("/api/runs"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
}

/// Every text column of `table`'s rows, joined (what a dump would show).
async fn dump(ws: &TestWorkspace, sql: &str) -> String {
    let db = ws.db().await;
    let rows = sqlx::query(sql).fetch_all(&db).await.unwrap();
    let mut out = String::new();
    for row in rows {
        for i in 0..row.len() {
            if let Ok(Some(text)) = row.try_get::<Option<String>, _>(i) {
                out.push_str(&text);
                out.push('\n');
            }
        }
    }
    db.close().await;
    out
}

/// The bytes of the SQLite files in `dir`.
fn sqlite_bytes(dir: &std::path::Path) -> Vec<u8> {
    ["asbx.db", "asbx.db-wal", "asbx.db-shm"]
        .iter()
        .flat_map(|f| std::fs::read(dir.join(f)).unwrap_or_default())
        .collect()
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

on_both!(a_run_stores_secret_names_and_env_reads_the_values_then);
async fn a_run_stores_secret_names_and_env_reads_the_values_then(db: Db) {
    let sqlite = db == Db::Sqlite;
    let (first, second) = (unique("first"), unique("second"));
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let env = send(
        &ws,
        reqwest::Method::POST,
        "/api/environments",
        json!({"name": "prod", "variables": {"REGION": "eu"}, "secrets": {"API_TOKEN": first}}),
    )
    .await;
    let id = env["id"].as_str().unwrap().to_owned();
    run(&ws, json!({"prompt": "hi", "environment": "prod"})).await;
    assert_eq!(
        redeemed(&runner, "env")[0]["variables"]["API_TOKEN"],
        first.as_str()
    );

    // Rotated: the next run's sandbox gets the new value.
    send(
        &ws,
        reqwest::Method::PUT,
        &format!("/api/environments/{id}"),
        json!({"name": "prod", "variables": {"REGION": "eu"}, "secrets": {"API_TOKEN": second}}),
    )
    .await;
    run(&ws, json!({"prompt": "hi", "environment": id})).await;
    assert_eq!(
        redeemed(&runner, "env")[1]["variables"]["API_TOKEN"],
        second.as_str()
    );

    // The runs hold the name, never a value, old or new.
    let runs = dump(&ws, "SELECT env_json, env_secrets, config_json FROM runs").await;
    assert!(runs.contains("API_TOKEN") && runs.contains(&id), "{runs}");
    let environments = dump(&ws, "SELECT secrets FROM environments").await;
    assert!(environments.contains("asbx-sealed:v1:"), "{environments}");
    for secret in [&first, &second] {
        assert!(!runs.contains(secret.as_str()), "a run row holds {secret}");
        assert!(!environments.contains(secret.as_str()), "stored in clear");
    }
    if sqlite {
        let bytes = sqlite_bytes(ws.data_dir.path());
        assert!(contains(&bytes, "API_TOKEN"), "positive control");
        for secret in [&first, &second] {
            assert!(!contains(&bytes, secret), "the SQLite files hold {secret}");
        }
    }
}

on_both!(mcp_env_values_are_write_only_and_reach_config);
async fn mcp_env_values_are_write_only_and_reach_config(db: Db) {
    let token = unique("mcp-token");
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let server =
        |v: &str| json!({"name": "local", "command": "mcp", "args": [], "env": {"TOKEN": v}});
    let agent = send(
        &ws,
        reqwest::Method::POST,
        "/api/agents",
        json!({"name": "a", "mcpServers": [server(&token)]}),
    )
    .await;
    let id = agent["id"].as_str().unwrap().to_owned();
    assert_eq!(agent["mcpServers"], json!([server("********")]));
    let listed = client()
        .get(ws.url("/api/agents"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !listed.contains(&token) && listed.contains("TOKEN"),
        "{listed}"
    );

    // What a client read, sent back with a change elsewhere: kept.
    let mut back = agent.clone();
    back["description"] = "edited".into();
    for k in ["id", "createdAt", "updatedAt"] {
        back.as_object_mut().unwrap().remove(k);
    }
    send(
        &ws,
        reqwest::Method::PUT,
        &format!("/api/agents/{id}"),
        back,
    )
    .await;
    let r = client()
        .post(ws.url(&format!("/api/agents/{id}/runs")))
        .json(&json!({"prompt": "go"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    assert_eq!(
        redeemed(&runner, "config")[0]["mcp_servers"],
        json!([server(&token)]),
        "the sandbox gets the value"
    );

    // A chat's settings: the same.
    let chat = crate::support::post_turn(&ws, json!({"message": "hi"})).await;
    let chat_id = chat.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    chat.bytes().await.unwrap();
    let view = send(
        &ws,
        reqwest::Method::PUT,
        &format!("/api/assistant/chats/{chat_id}/settings"),
        json!({"mcpServers": [server(&token)]}),
    )
    .await;
    assert_eq!(view["mcpServers"], json!([server("********")]));
    let detail = client()
        .get(ws.url(&format!("/api/assistant/chats/{chat_id}")))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!detail.contains(&token), "{detail}");
    // A mask with nothing stored behind it is refused.
    let r = client()
        .put(ws.url(&format!("/api/assistant/chats/{chat_id}/settings")))
        .json(&json!({"mcpServers": [{"name": "other", "command": "x", "env": {"K": "********"}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    let stored = dump(&ws, "SELECT definition FROM agents").await
        + &dump(&ws, "SELECT settings FROM chats WHERE settings IS NOT NULL").await
        + &dump(&ws, "SELECT config_json FROM runs").await;
    assert!(stored.contains("asbx-sealed:v1:"), "{stored}");
    assert!(!stored.contains(&token), "an MCP env value stored in clear");
}

/// Rows as an earlier version stored them, sealed when a node starts.
#[tokio::test]
async fn clear_rows_from_before_are_sealed_at_start() {
    let (secret, mcp) = (unique("old-secret"), unique("old-mcp"));
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let old = TestWorkspace::start(Some(runner.url.clone())).await;
    let db = old.db().await;
    let clear = serde_json::to_string(&json!({"API_TOKEN": secret})).unwrap();
    sqlx::query(
        "INSERT INTO environments (id, workspace_id, name, variables, secrets, setup_script, \
         allowed_hosts, created_at, updated_at) VALUES ('e1', 'default', 'legacy', '{}', $1, \
         NULL, '[]', 1, 1)",
    )
    .bind(&clear)
    .execute(&db)
    .await
    .unwrap();
    let definition =
        json!({"name": "legacy", "mcpServers": [{"name": "m", "command": "c", "env": {"T": mcp}}]});
    sqlx::query(
        "INSERT INTO agents (id, workspace_id, name, definition, created_at, updated_at) \
         VALUES ('a1', 'default', 'legacy', $1, 1, 1)",
    )
    .bind(definition.to_string())
    .execute(&db)
    .await
    .unwrap();
    // A run from before: its `/env` copy of the secret, its token spent.
    let env_json = json!({"variables": {"API_TOKEN": secret}}).to_string();
    sqlx::query(
        "INSERT INTO runs (id, workspace_id, kind, status, prompt, model, env_json, config_json, \
         created_at) VALUES ('r1', 'default', 'run', 'succeeded', 'p', 'm', $1, '{}', 1)",
    )
    .bind(&env_json)
    .execute(&db)
    .await
    .unwrap();
    db.close().await;
    assert!(
        contains(&sqlite_bytes(old.data_dir.path()), &secret),
        "positive control"
    );

    // A node of this version starts on that database.
    let url = old.database_url.clone();
    let ws = TestWorkspace::start_with(Some(runner.url.clone()), |c| {
        c.database_url = Some(url);
        c.data_dir = old.data_dir.path().to_path_buf();
    })
    .await;
    let stored = dump(&ws, "SELECT secrets FROM environments").await
        + &dump(&ws, "SELECT definition FROM agents").await
        + &dump(&ws, "SELECT env_json FROM runs").await;
    assert!(
        !stored.contains(&secret) && !stored.contains(&mcp),
        "{stored}"
    );
    let bytes = sqlite_bytes(old.data_dir.path());
    assert!(
        !contains(&bytes, &secret),
        "the old clear value is still in the file"
    );
    assert!(
        !contains(&bytes, &mcp),
        "the old clear value is still in the file"
    );
    // And they still work.
    run(&ws, json!({"prompt": "hi", "environment": "legacy"})).await;
    assert_eq!(
        redeemed(&runner, "env")[0]["variables"]["API_TOKEN"],
        secret.as_str()
    );
    let r = client()
        .post(ws.url("/api/agents/a1/runs"))
        .json(&json!({"prompt": "go"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    assert_eq!(
        redeemed(&runner, "config")[1]["mcp_servers"][0]["env"]["T"],
        mcp.as_str()
    );
}

#[tokio::test]
async fn the_data_folder_and_the_sqlite_files_are_private() {
    let base = tempfile::tempdir().unwrap();
    let data = base.path().join("data");
    // An earlier version's: made with a common umask.
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(data.join("asbx.db"), b"").unwrap();
    std::fs::set_permissions(data.join("asbx.db"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let ws = TestWorkspace::start_with(None, |c| c.data_dir = data.clone()).await;
    // Something written, so the WAL exists.
    send(
        &ws,
        reqwest::Method::POST,
        "/api/environments",
        json!({"name": "x", "secrets": {"K": "v"}}),
    )
    .await;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700);
    for f in ["asbx.db", "asbx.db-wal", "asbx.db-shm", "secret.key"] {
        assert_eq!(mode(&data.join(f)), 0o600, "{f}");
    }
    // A fresh one too.
    let fresh = base.path().join("fresh");
    let _ws = TestWorkspace::start_with(None, |c| c.data_dir = fresh.clone()).await;
    assert_eq!(mode(&fresh), 0o700);
    assert_eq!(mode(&fresh.join("asbx.db")), 0o600);
}
