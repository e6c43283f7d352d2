//! Callback payloads as configured by /api/runs, and the /results writeback.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::support::{
    Db, FakeRunner, Mode, TestWorkspace, client, env_without_access, on_both, problem, settled_run,
};

on_both!(env_and_config_return_what_the_run_configured);
async fn env_and_config_return_what_the_run_configured(db: Db) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let body = json!({
        "prompt": "build it",
        "model": "openai:gpt-4.1-mini",
        "systemPrompt": "be brief",
        "setupScript": "echo setup",
        "variables": {"FOO": "bar", "N": "1"},
        "allowedHosts": ["pypi.org", "*.example.com"],
        "limits": {"max_steps": 5, "max_duration_ms": 60000},
        "skills": [{"name": "s", "description": "d", "files": {"SKILL.md": "x"}}],
        "mcpServers": [{"name": "m", "url": "http://127.0.0.1:1/mcp"}]
    });
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap();

    let callbacks = runner.callbacks();
    assert_eq!(callbacks.len(), 2);
    let (route, status, env) = &callbacks[0];
    assert_eq!((route.as_str(), *status), ("env", 200));
    let (env, attachments) = env_without_access(env);
    assert_eq!(attachments, json!([]));
    assert_eq!(
        env,
        json!({"variables": {"FOO": "bar", "N": "1"}, "setup_script": "echo setup",
                "allowed_hosts": ["pypi.org", "*.example.com"]})
    );
    let (route, status, config) = &callbacks[1];
    assert_eq!((route.as_str(), *status), ("config", 200));
    assert_eq!(
        config,
        &json!({"system_prompt": "be brief", "model": "openai:gpt-4.1-mini",
                "skills": [{"name": "s", "description": "d", "files": {"SKILL.md": "x"}}],
                "mcp_servers": [{"name": "m", "url": "http://127.0.0.1:1/mcp"}],
                "limits": {"max_steps": 5, "max_duration_ms": 60000}})
    );
    let d = &runner.dispatches()[0];
    assert_eq!(d.prompt, "build it");
    let session = d.session_id.clone().unwrap();
    assert!(asbx_protocol::dispatch::is_valid_session_id(&session));
    assert_eq!(
        d.agent_url,
        ws.url(&format!("/api/assistant/sandbox/{session}"))
    );
}

on_both!(defaults_apply_when_the_run_names_little);
async fn defaults_apply_when_the_run_names_little(db: Db) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    resp.text().await.unwrap();
    let callbacks = runner.callbacks();
    assert_eq!(
        env_without_access(&callbacks[0].2).0,
        json!({"variables": {}, "setup_script": null, "allowed_hosts": []})
    );
    assert_eq!(callbacks[1].2, json!({"model": "scripted:demo"}));
}

on_both!(results_are_stored_and_download_byte_identical);
async fn results_are_stored_and_download_byte_identical(db: Db) {
    let binary: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let files = vec![
        json!({"path": "report.md", "content_base64": STANDARD.encode("# hi\n"), "mime_type": "text/markdown"}),
        json!({"path": "data/blob.bin", "content_base64": STANDARD.encode(&binary)}),
        json!({"path": "page.html", "content_base64": STANDARD.encode("<script>x</script>")}),
    ];
    let runner = FakeRunner::start(Mode::Full { files }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    let run_id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    resp.text().await.unwrap();

    let (route, status, stored) = &runner.callbacks()[2];
    assert_eq!((route.as_str(), *status), ("results", 200));
    let stored = stored["files"].as_array().unwrap();
    let paths: Vec<_> = stored.iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["report.md", "data/blob.bin", "page.html"]);

    let expect: [(&[u8], &str); 3] = [
        (b"# hi\n", "text/markdown"),
        (&binary, "application/octet-stream"),
        (b"<script>x</script>", "text/html"),
    ];
    for (f, (bytes, mime)) in stored.iter().zip(expect) {
        let r = client()
            .get(ws.url(&format!("/api/files/{}", f["id"].as_str().unwrap())))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], mime);
        assert!(
            r.headers()["content-disposition"]
                .to_str()
                .unwrap()
                .starts_with("attachment")
        );
        assert_eq!(r.headers()["x-content-type-options"], "nosniff");
        assert_eq!(r.bytes().await.unwrap().as_ref(), bytes);
    }

    // The run record lists the files written back.
    let run = settled_run(&ws, &run_id).await;
    let listed: Vec<_> = run["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].clone())
        .collect();
    assert_eq!(listed.len(), 3);
    assert!(listed.contains(&json!("data/blob.bin")));

    let r = client()
        .get(ws.url("/api/files/nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(problem(r, 404).await["code"], "not_found");
}

on_both!(bad_results_bodies_are_400_and_leave_the_token_usable);
async fn bad_results_bodies_are_400_and_leave_the_token_usable(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let _resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    let d = runner.next_dispatch(0).await;
    let url = format!("{}/results", d.agent_url);
    let token = d.otp_upload.clone().unwrap();
    let post = |body: String| {
        client()
            .post(&url)
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };

    let cases: Vec<(String, &str)> = vec![
        ("not json".into(), "valid results request"),
        (json!({"nofiles": []}).to_string(), "files"),
        (json!({"files": [{"path": "../etc/passwd", "content_base64": ""}]}).to_string(), "files[0].path"),
        (json!({"files": [{"path": "/abs", "content_base64": ""}]}).to_string(), "absolute"),
        (json!({"files": [{"path": "a", "content_base64": "***"}]}).to_string(), "files[0].content_base64"),
        (json!({"files": [{"path": "a", "content_base64": "", "mime_type": "bad"}]}).to_string(), "files[0].mime_type"),
        (json!({"files": [{"path": "a", "content_base64": ""}, {"path": "a", "content_base64": ""}]}).to_string(), "more than once"),
        (json!({"files": [{"path": "x".repeat(2000), "content_base64": ""}]}).to_string(), "longer than"),
    ];
    for (body, needle) in cases {
        let p: Value = problem(post(body.clone()).await.unwrap(), 400).await;
        assert_eq!(p["code"], "invalid_request");
        assert!(
            p["detail"].as_str().unwrap().contains(needle),
            "{body}: {p}"
        );
    }
    // Too large.
    let huge = format!(
        "{{\"files\":[{{\"path\":\"a\",\"content_base64\":\"{}\"}}]}}",
        "A".repeat(65 * 1024 * 1024)
    );
    let p = problem(post(huge).await.unwrap(), 413).await;
    assert_eq!(p["code"], "body_too_large");

    // None of that redeemed the token.
    let ok = json!({"files": [{"path": "ok.txt", "content_base64": "b2s="}]}).to_string();
    let r = post(ok.clone()).await.unwrap();
    assert_eq!(r.status(), 200);
    let p = problem(post(ok).await.unwrap(), 401).await;
    assert_eq!(p["code"], "otp_rejected");
}

/// Issue 28, defect 13: `POST {agentUrl}/assets/writeback`, the seed's name
/// of `/results`, is the same route: it stores the files with the upload
/// token, which it redeems, and refuses a body as `/results` does.
#[tokio::test]
async fn the_seeds_writeback_path_is_the_results_route() {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    let run_id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let d = runner.next_dispatch(0).await;
    let url = format!("{}/assets/writeback", d.agent_url);
    let token = d.otp_upload.clone().unwrap();
    let post = |body: Value| client().post(&url).bearer_auth(&token).json(&body).send();

    let bad = json!({"files": [{"path": "../x", "content_base64": ""}]});
    let p = problem(post(bad).await.unwrap(), 400).await;
    assert_eq!(p["code"], "invalid_request", "{p}");
    let ok = json!({"files": [{"path": "seed.txt", "content_base64": STANDARD.encode("from the seed")}]});
    let r = post(ok.clone()).await.unwrap();
    assert_eq!(r.status(), 200);
    let stored: Value = r.json().await.unwrap();
    let id = stored["files"][0]["id"].as_str().unwrap().to_owned();
    let bytes = client()
        .get(ws.url(&format!("/api/files/{id}")))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(bytes.as_ref(), b"from the seed");
    // One token, one writeback, whichever path redeemed it.
    let p = problem(
        client()
            .post(format!("{}/results", d.agent_url))
            .bearer_auth(&token)
            .json(&ok)
            .send()
            .await
            .unwrap(),
        401,
    )
    .await;
    assert_eq!(p["code"], "otp_rejected");
    drop(resp);
    settled_run(&ws, &run_id).await;
}
