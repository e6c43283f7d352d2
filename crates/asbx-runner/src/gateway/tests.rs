//! The gateway's routes through `oneshot`, against a fake workspace and
//! provider on loopback.

use std::sync::Mutex;
use std::time::Duration;

use asbx_protocol::Protocol;
use asbx_protocol::callback::{ConfigResponse, McpServer};
use axum::http::Request as HttpRequest;
use tower::ServiceExt;

use super::*;
use crate::egress::Cidr;
use crate::session::Sessions;

/// Paths the fake upstream saw, with the `authorization` header.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

async fn upstream(config: ConfigResponse) -> (String, Seen) {
    let seen: Seen = Arc::default();
    let s = Arc::clone(&seen);
    let config = Arc::new(config);
    let app = Router::new()
        .route(
            "/ws/config",
            get(move || async move { axum::Json((*config).clone()) }),
        )
        .route(
            "/ws/env",
            get(|| async { (StatusCode::FOUND, [(header::LOCATION, "/secret")]) }),
        )
        .fallback(move |req: Request| async move {
            let auth = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            s.lock().unwrap().push((req.uri().path().to_owned(), auth));
            "upstream"
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (base, seen)
}

fn gateway(base: &str, allow_internal: &[&str]) -> Router {
    let session = Sessions::default()
        .insert("s", Protocol::V1, Duration::from_secs(1))
        .unwrap();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    app(GatewaySpec {
        session,
        agent_url: format!("{base}/ws"),
        providers: Arc::new(vec![ProviderConfig {
            name: "openai".into(),
            kind: ProviderKind::Openai,
            base_url: format!("{base}/v1"),
            api_key: Some("sk-test".into()),
        }]),
        client,
        allow: Arc::default(),
        egress: EgressSettings::new(
            allow_internal
                .iter()
                .map(|c| Cidr::parse(c).unwrap())
                .collect(),
        ),
    })
}

async fn call(app: &Router, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let res = app
        .clone()
        .oneshot(
            HttpRequest::builder()
                .method(method)
                .uri(path)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_owned()))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = res.status().as_u16();
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .unwrap();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, v)
}

fn config(mcp_url: &str) -> ConfigResponse {
    ConfigResponse {
        model: "openai:gpt-pinned".into(),
        mcp_servers: vec![McpServer::Http {
            name: "remote".into(),
            url: mcp_url.to_owned(),
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn model_calls_take_the_kinds_path_and_the_pinned_model_only() {
    let (base, seen) = upstream(config("http://127.0.0.1:1/mcp")).await;
    let gw = gateway(&base, &[]);
    let ask = |model: &str| format!(r#"{{"model":"{model}","messages":[]}}"#);
    // Before /config passed, no model is pinned: refused.
    let (status, p) = call(
        &gw,
        "POST",
        "/model/openai/chat/completions",
        &ask("gpt-pinned"),
    )
    .await;
    assert_eq!(
        (status, p["code"].as_str()),
        (403, Some("model_not_allowed")),
        "{p}"
    );
    let (status, _) = call(&gw, "GET", CALLBACK_CONFIG, "").await;
    assert_eq!(status, 200);
    // Another path of the provider, even a harmless-looking one.
    for path in [
        "/model/openai/completions",
        "/model/openai/embeddings",
        "/model/openai/chat/completions/x",
    ] {
        let (status, p) = call(&gw, "POST", path, &ask("gpt-pinned")).await;
        assert_eq!(
            (status, p["code"].as_str()),
            (403, Some("model_path_not_allowed")),
            "{path}: {p}"
        );
    }
    // Another model on the operator's key.
    let (status, p) = call(
        &gw,
        "POST",
        "/model/openai/chat/completions",
        &ask("gpt-expensive"),
    )
    .await;
    assert_eq!(
        (status, p["code"].as_str()),
        (403, Some("model_not_allowed")),
        "{p}"
    );
    assert!(
        seen.lock().unwrap().is_empty(),
        "nothing reached the provider"
    );
    // Positive control: the pinned model on the kind's path, with the key added.
    let (status, body) = call(
        &gw,
        "POST",
        "/model/openai/chat/completions",
        &ask("gpt-pinned"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        [(
            "/v1/chat/completions".to_owned(),
            Some("Bearer sk-test".to_owned())
        )]
    );
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let (base, seen) = upstream(ConfigResponse::default()).await;
    let gw = gateway(&base, &[]);
    let (status, _) = call(&gw, "GET", CALLBACK_ENV, "").await;
    assert_eq!(status, 302, "the agent sees the redirect");
    assert!(
        seen.lock().unwrap().is_empty(),
        "the gateway did not follow it"
    );
    // Positive control: the target is reachable, so "not followed" is real.
    reqwest::get(format!("{base}/secret")).await.unwrap();
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn mcp_servers_on_internal_addresses_need_the_operators_allow() {
    let (mcp_base, mcp_seen) = upstream(ConfigResponse::default()).await;
    let (base, _) = upstream(config(&format!("{mcp_base}/mcp"))).await;
    let gw = gateway(&base, &[]);
    let (status, _) = call(&gw, "GET", CALLBACK_CONFIG, "").await;
    assert_eq!(status, 200);
    let (status, p) = call(&gw, "POST", "/mcp/remote", "{}").await;
    assert_eq!(
        (status, p["code"].as_str()),
        (403, Some("egress_internal_address")),
        "{p}"
    );
    assert!(mcp_seen.lock().unwrap().is_empty());
    let (status, p) = call(&gw, "POST", "/mcp/other", "{}").await;
    assert_eq!(
        (status, p["code"].as_str()),
        (404, Some("unknown_mcp_server")),
        "{p}"
    );
    // Positive control: the operator allows loopback.
    let gw = gateway(&base, &["127.0.0.0/8"]);
    call(&gw, "GET", CALLBACK_CONFIG, "").await;
    let (status, body) = call(&gw, "POST", "/mcp/remote", "{}").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(mcp_seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn unknown_routes_are_problem_404() {
    let (base, _) = upstream(ConfigResponse::default()).await;
    let gw = gateway(&base, &[]);
    let (status, p) = call(&gw, "GET", "/callback/secrets", "").await;
    assert_eq!(
        (status, p["code"].as_str()),
        (404, Some("not_found")),
        "{p}"
    );
}
