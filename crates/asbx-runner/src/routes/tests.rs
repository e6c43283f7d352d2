//! The service routes through `oneshot`: the problem+json answers that need
//! no sandbox.

use asbx_test_support::asbx_snapshot;
use axum::body::Body;
use axum::http::{Request, header};
use tower::ServiceExt;

use crate::{Runner, RunnerConfig};

fn runner(token: Option<&str>) -> (Runner, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = RunnerConfig::new("/nonexistent/asbx".into(), dir.path().to_owned());
    config.token = token.map(str::to_owned);
    config.warm_pool = 0;
    (Runner::new(config).unwrap(), dir)
}

async fn send(r: &Runner, req: Request<Body>) -> (u16, String, serde_json::Value) {
    let res = r.router().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let ct = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        ct,
        serde_json::from_slice(&body).unwrap_or_default(),
    )
}

fn stream(body: impl Into<Body>, token: Option<&str>) -> Request<Body> {
    let mut b = Request::post("/stream").header(header::CONTENT_TYPE, "application/json");
    if let Some(t) = token {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    b.body(body.into()).unwrap()
}

fn dispatch_body(session: &str, agent_url: &str) -> String {
    serde_json::json!({
        "agent_url": agent_url, "otp_setup": "s", "otp_run": "r",
        "prompt": "hi", "session_id": session,
    })
    .to_string()
}

fn assert_problem(got: &(u16, String, serde_json::Value), status: u16, code: &str) {
    assert_eq!(got.0, status, "{:?}", got.2);
    assert_eq!(got.1, "application/problem+json");
    assert_eq!(got.2["status"], status);
    assert_eq!(got.2["code"], code, "{:?}", got.2);
}

#[tokio::test]
async fn stream_needs_the_token_before_reading_anything() {
    let (r, _d) = runner(Some("t0ken"));
    let body = dispatch_body("s1", "http://127.0.0.1:1/ws");
    for token in [None, Some("wrong"), Some("t0ke"), Some("t0kenn")] {
        let got = send(&r, stream(body.clone(), token)).await;
        assert_problem(&got, 401, "unauthorized");
        asbx_snapshot!("stream_401", got.2);
    }
    for path in ["/v1/sessions", "/v1/sessions/x", "/v1/sessions/x/events"] {
        let req = Request::get(path).body(Body::empty()).unwrap();
        assert_problem(&send(&r, req).await, 401, "unauthorized");
    }
    // Positive control: the right token gets past auth (to the 404 behind it).
    let req = Request::get("/v1/sessions/x")
        .header(header::AUTHORIZATION, "Bearer t0ken")
        .body(Body::empty())
        .unwrap();
    assert_problem(&send(&r, req).await, 404, "not_found");
    let healthz = Request::get("/healthz").body(Body::empty()).unwrap();
    assert_eq!(send(&r, healthz).await.0, 200, "healthz needs no token");
}

#[tokio::test]
async fn identity_is_public_and_kept_across_restarts() {
    let (r, dir) = runner(Some("t0ken"));
    let got = send(
        &r,
        Request::get("/v1/identity").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(got.0, 200, "the identity needs no token: {:?}", got.2);
    assert_eq!(got.2["algorithm"], "ECDSA-P256-SHA256");
    assert_eq!(got.2["publicKey"], r.identity_key());
    assert_eq!(got.2["publicKey"].as_str().unwrap().len(), 87);
    // The same state folder, a new runner: the same key.
    drop(r);
    let mut config = RunnerConfig::new("/nonexistent/asbx".into(), dir.path().to_owned());
    config.warm_pool = 0;
    let again = Runner::new(config).unwrap();
    assert_eq!(again.identity_key(), got.2["publicKey"]);
}

#[tokio::test]
async fn healthz_reports_capacity_for_a_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = RunnerConfig::new("/nonexistent/asbx".into(), dir.path().to_owned());
    config.warm_pool = 0;
    config.max_sandboxes = 3;
    let r = Runner::new(config).unwrap();
    let got = send(&r, Request::get("/healthz").body(Body::empty()).unwrap()).await;
    assert_eq!(got.0, 200);
    assert_eq!(got.2["status"], "ok");
    assert_eq!(got.2["sessions"], 0);
    assert_eq!(got.2["warm"], 0);
    assert_eq!(got.2["capacity"], 3);
    assert_eq!(got.2["free"], 3);
    // A permit taken (a sandbox running) is one fewer free.
    let _permit = std::sync::Arc::clone(&r.inner.capacity)
        .try_acquire_owned()
        .unwrap();
    let got = send(&r, Request::get("/healthz").body(Body::empty()).unwrap()).await;
    assert_eq!(got.2["free"], 2);
    assert_eq!(got.2["capacity"], 3);
}

#[tokio::test]
async fn stream_refuses_bad_bodies_with_problems() {
    let (r, _d) = runner(None);
    let got = send(&r, stream("{", None)).await;
    assert_problem(&got, 400, "invalid_request");
    let got = send(&r, stream(r#"{"prompt": 1}"#, None)).await;
    assert_problem(&got, 400, "invalid_request");
    let fields: Vec<&str> = got.2["errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["field"].as_str())
        .collect();
    assert!(fields.contains(&"agent_url"), "{fields:?}");
    asbx_snapshot!("stream_400_fields", got.2);
    let huge = vec![b'x'; (2 << 20) + 1];
    let got = send(&r, stream(huge, None)).await;
    assert_problem(&got, 413, "body_too_large");
    asbx_snapshot!("stream_413", got.2);
    let got = send(
        &r,
        stream(dispatch_body("s1", "http://169.254.169.254/x"), None),
    )
    .await;
    assert_problem(&got, 400, "invalid_request");
    assert_eq!(got.2["errors"][0]["field"], "agent_url");
    asbx_snapshot!("stream_400_agent_url", got.2);
}

#[tokio::test]
async fn a_taken_session_id_is_409_and_unknown_sessions_404() {
    let (r, _d) = runner(None);
    r.inner
        .sessions
        .insert(
            "taken",
            asbx_protocol::Protocol::V1,
            std::time::Duration::from_secs(1),
        )
        .unwrap();
    let got = send(
        &r,
        stream(dispatch_body("taken", "http://127.0.0.1:1/ws"), None),
    )
    .await;
    assert_problem(&got, 409, "session_exists");
    assert_eq!(got.2["sessionId"], "taken");
    asbx_snapshot!("stream_409", got.2);
    for (method, path) in [
        ("GET", "/v1/sessions/nope"),
        ("DELETE", "/v1/sessions/nope"),
        ("GET", "/v1/sessions/nope/events"),
    ] {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap();
        let got = send(&r, req).await;
        assert_problem(&got, 404, "not_found");
        asbx_snapshot!("sessions_404", got.2);
    }
    let req = Request::get("/v1/sessions/taken")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        send(&r, req).await.0,
        200,
        "positive control: a known session"
    );
}

/// Issue 28, defect 10: a path no route has and a method a route does not
/// serve are problems too, with stable codes (they were empty bodies).
#[tokio::test]
async fn unknown_paths_and_methods_are_problems() {
    let (r, _d) = runner(None);
    for path in ["/nope", "/v1/sessions/x/y/z", "/stream/extra"] {
        let req = Request::get(path).body(Body::empty()).unwrap();
        assert_problem(&send(&r, req).await, 404, "not_found");
    }
    for (method, path) in [
        ("GET", "/stream"),
        ("PUT", "/v1/sessions/x"),
        ("POST", "/healthz"),
        ("DELETE", "/openapi.json"),
    ] {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap();
        let res = r.router().oneshot(req).await.unwrap();
        let allow = res.headers().get(header::ALLOW).cloned();
        assert!(allow.is_some(), "{method} {path}: no Allow header");
        let req = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap();
        let got = send(&r, req).await;
        assert_problem(&got, 405, "method_not_allowed");
        assert!(
            got.2["detail"].as_str().unwrap_or("").contains(method),
            "{:?}",
            got.2
        );
    }
    // Positive control: a served method on the same route.
    let req = Request::get("/healthz").body(Body::empty()).unwrap();
    assert_eq!(send(&r, req).await.0, 200);
}
