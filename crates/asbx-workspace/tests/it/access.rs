//! Workspace API keys, browser sessions, and cross-workspace isolation.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::support::{Db, FakeRunner, Mode, SseReader, TestWorkspace, client, on_both, problem};

fn authed(
    method: reqwest::Method,
    ws: &TestWorkspace,
    path: &str,
    key: &str,
) -> reqwest::RequestBuilder {
    client().request(method, ws.url(path)).bearer_auth(key)
}

on_both!(nothing_of_one_workspace_is_visible_from_another);
async fn nothing_of_one_workspace_is_visible_from_another(db: Db) {
    let files = vec![json!({"path": "out.txt", "content_base64": STANDARD.encode("secret")})];
    let runner = FakeRunner::start(Mode::Full { files }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |c| c.require_auth = true).await;
    let a = ws.workspace.create_workspace("a").await.unwrap();
    let b = ws.workspace.create_workspace("b").await.unwrap();
    let key_a = ws.workspace.create_api_key(&a, "ka").await.unwrap();
    let key_b = ws.workspace.create_api_key(&b, "kb").await.unwrap();
    assert!(key_a.starts_with("asbx_key_"));
    use reqwest::Method as M;

    // Anonymous and wrong keys are refused.
    let p = problem(
        client()
            .get(ws.url("/api/assistant/chats"))
            .send()
            .await
            .unwrap(),
        401,
    )
    .await;
    assert_eq!(p["code"], "unauthorized");
    let p = problem(
        authed(M::GET, &ws, "/api/assistant/chats", "asbx_key_nope")
            .send()
            .await
            .unwrap(),
        401,
    )
    .await;
    assert_eq!(p["code"], "unauthorized");

    // Workspace A: a chat (whose run writes a file back), an upload, a run.
    let resp = authed(M::POST, &ws, "/api/assistant/chat/stream", &key_a)
        .json(&json!({"message": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let chat = resp.headers()["x-asbx-chat-id"]
        .to_str()
        .unwrap()
        .to_owned();
    SseReader::new(resp).until_done().await;
    let up: Value = authed(M::POST, &ws, "/api/assistant/files?name=a.txt", &key_a)
        .body("a's file")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let upload = up["id"].as_str().unwrap().to_owned();
    let resp = authed(M::POST, &ws, "/api/runs", &key_a)
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    let run = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    resp.text().await.unwrap();
    let written: Value = authed(M::GET, &ws, &format!("/api/runs/{run}"), &key_a)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let written = written["files"][0]["id"].as_str().unwrap().to_owned();

    // A sees its own things.
    for path in [
        format!("/api/assistant/chats/{chat}"),
        format!("/api/files/{upload}"),
        format!("/api/files/{written}"),
        format!("/api/runs/{run}"),
    ] {
        let r = authed(M::GET, &ws, &path, &key_a).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    // B sees and changes none of them.
    let list: Value = authed(M::GET, &ws, "/api/assistant/chats", &key_b)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list, json!([]));
    let attempts = [
        (M::GET, format!("/api/assistant/chats/{chat}")),
        (M::GET, format!("/api/assistant/chats/{chat}/stream")),
        (M::POST, format!("/api/assistant/chats/{chat}/cancel")),
        (M::DELETE, format!("/api/assistant/chats/{chat}")),
        (M::GET, format!("/api/files/{upload}")),
        (M::GET, format!("/api/files/{written}")),
        (M::DELETE, format!("/api/files/{upload}")),
        (M::GET, format!("/api/runs/{run}")),
        (
            M::POST,
            format!("/api/assistant/files?name=x.txt&chatId={chat}"),
        ),
    ];
    for (method, path) in attempts {
        let r = authed(method.clone(), &ws, &path, &key_b)
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{method} {path}");
    }
    let r = authed(M::POST, &ws, "/api/assistant/chat/stream", &key_b)
        .json(&json!({"chatId": chat, "message": "mine now"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = authed(M::POST, &ws, "/api/assistant/chat/stream", &key_b)
        .json(&json!({"message": "attach theirs", "attachmentIds": [upload]}))
        .send()
        .await
        .unwrap();
    assert_eq!(problem(r, 400).await["code"], "invalid_request");

    // Still all there for A.
    let d: Value = authed(M::GET, &ws, &format!("/api/assistant/chats/{chat}"), &key_a)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(d["messages"].as_array().unwrap().len(), 2);
    assert_eq!(
        authed(M::GET, &ws, &format!("/api/files/{upload}"), &key_a)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    // Keys are stored hashed only.
    let pool = ws.db().await;
    let hashes: Vec<(String,)> = sqlx::query_as("SELECT hash FROM api_keys")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    assert_eq!(hashes.len(), 2);
    for (h,) in &hashes {
        assert_ne!(h, &key_a);
        assert_ne!(h, &key_b);
    }
    assert!(
        hashes
            .iter()
            .any(|(h,)| *h == crate::support::sha256_hex(&key_a))
    );
}

#[tokio::test]
async fn a_browser_signs_in_with_a_key_and_keeps_a_cookie() {
    let ws = TestWorkspace::start_with(None, |c| c.require_auth = true).await;
    let a = ws.workspace.create_workspace("Team A").await.unwrap();
    let key = ws.workspace.create_api_key(&a, "browser").await.unwrap();

    let r = client()
        .post(ws.url("/api/session"))
        .json(&json!({"apiKey": "asbx_key_wrong"}))
        .send()
        .await
        .unwrap();
    assert_eq!(problem(r, 401).await["code"], "unauthorized");

    let r = client()
        .post(ws.url("/api/session"))
        .json(&json!({"apiKey": key}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let set_cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Strict"));
    let cookie = set_cookie.split(';').next().unwrap().to_owned();
    assert!(!cookie.contains(&key));
    let info: Value = r.json().await.unwrap();
    assert_eq!(info["workspaceName"], "Team A");

    let me: Value = client()
        .get(ws.url("/api/session"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(me["workspaceId"], a.as_str());
    let r = client()
        .get(ws.url("/api/assistant/chats"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let r = client()
        .delete(ws.url("/api/session"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = client()
        .get(ws.url("/api/assistant/chats"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(problem(r, 401).await["code"], "unauthorized");
}
