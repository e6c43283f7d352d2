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
    routes().layer(Extension(state(GatewaySpec {
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
        inject: Arc::default(),
        ca_file: None,
        audit: None,
        egress: EgressSettings::new(
            allow_internal
                .iter()
                .map(|c| Cidr::parse(c).unwrap())
                .collect(),
        ),
    })))
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

/// What the fake workspace API saw of one request.
#[derive(Debug, Clone)]
struct WsSeen {
    method: String,
    path_and_query: String,
    headers: Vec<(String, String)>,
    body_len: usize,
}

/// A fake workspace API under `/ws/workspace/`: records every request
/// (after reading its body), answers `/ws/workspace/big` with `BIG` bytes
/// and a checksum header, and `/ws/workspace/slow` with one chunk, then the
/// rest once `release` is notified. `/ws/workspace/upload` tells `first`
/// as soon as the first request chunk arrived.
struct WsUpstream {
    base: String,
    seen: Arc<Mutex<Vec<WsSeen>>>,
    release: Arc<tokio::sync::Notify>,
    first: Arc<tokio::sync::Notify>,
}

const BIG: usize = 20 << 20;

async fn ws_upstream() -> WsUpstream {
    use futures::StreamExt;
    let seen: Arc<Mutex<Vec<WsSeen>>> = Arc::default();
    let release = Arc::new(tokio::sync::Notify::new());
    let first = Arc::new(tokio::sync::Notify::new());
    let (s, r, f) = (Arc::clone(&seen), Arc::clone(&release), Arc::clone(&first));
    let app = Router::new().fallback(move |req: Request| {
        let (s, r, f) = (Arc::clone(&s), Arc::clone(&r), Arc::clone(&f));
        async move {
            let path_and_query = req
                .uri()
                .path_and_query()
                .map(|p| p.as_str().to_owned())
                .unwrap_or_default();
            let headers = req
                .headers()
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect();
            let method = req.method().to_string();
            let mut body = req.into_body().into_data_stream();
            let mut body_len = 0;
            while let Some(chunk) = body.next().await {
                let Ok(chunk) = chunk else { break };
                if body_len == 0 && !chunk.is_empty() && path_and_query.ends_with("/upload") {
                    f.notify_one();
                }
                body_len += chunk.len();
            }
            s.lock().unwrap().push(WsSeen {
                method,
                path_and_query: path_and_query.clone(),
                headers,
                body_len,
            });
            if path_and_query == "/ws/workspace/big" {
                return Response::builder()
                    .header(header::CONTENT_TYPE, "application/pdf")
                    .header(header::CONTENT_LENGTH, BIG)
                    .header("x-asbx-sha256", "ab12")
                    .header("set-cookie", "session=upstream")
                    .body(Body::from(vec![7u8; BIG]))
                    .unwrap();
            }
            if path_and_query == "/ws/workspace/slow" {
                let rest = async move {
                    r.notified().await;
                    Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"second"))
                };
                let stream = futures::stream::once(async {
                    Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"first"))
                })
                .chain(futures::stream::once(rest));
                return Response::new(Body::from_stream(stream));
            }
            (StatusCode::CREATED, "stored").into_response()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    WsUpstream {
        base,
        seen,
        release,
        first,
    }
}

async fn send(app: &Router, req: HttpRequest<Body>) -> Response {
    app.clone().oneshot(req).await.unwrap()
}

#[tokio::test]
async fn workspace_calls_go_to_the_agent_url_with_the_agents_bearer_only() {
    let up = ws_upstream().await;
    let gw = gateway(&up.base, &[]);
    let res = send(
        &gw,
        HttpRequest::builder()
            .method("POST")
            .uri("/workspace/files?path=out%2Fa%20b.txt&x=1")
            .header(header::AUTHORIZATION, "Bearer asbx_ws_mine")
            .header(header::CONTENT_TYPE, "text/plain")
            .header("x-api-key", "sk-test")
            .header(header::COOKIE, "asbx_session=stolen")
            .header("x-forwarded-for", "10.0.0.1")
            .header(header::HOST, "evil.example")
            .body(Body::from("hello"))
            .unwrap(),
    )
    .await;
    assert_eq!(res.status(), 201);
    let seen = up.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let s = &seen[0];
    assert_eq!(s.method, "POST");
    assert_eq!(
        s.path_and_query,
        "/ws/workspace/files?path=out%2Fa%20b.txt&x=1"
    );
    assert_eq!(s.body_len, 5);
    let get = |name: &str| {
        s.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(get("authorization"), Some("Bearer asbx_ws_mine"));
    assert_eq!(get("content-type"), Some("text/plain"));
    // The upstream's own Host, never the sandbox's.
    assert_eq!(
        get("host"),
        Some(up.base.trim_start_matches("http://")),
        "{s:?}"
    );
    for (name, value) in &s.headers {
        assert!(
            [
                "authorization",
                "content-type",
                "accept",
                "host",
                // Framing, made by the gateway's client.
                "content-length",
                "transfer-encoding",
            ]
            .contains(&name.as_str()),
            "header {name} was forwarded: {s:?}"
        );
        assert!(!value.contains("sk-test"), "a provider key leaked: {s:?}");
    }
    // An absolute-form request names another host: the path is taken,
    // the host is not.
    let res = send(
        &gw,
        HttpRequest::builder()
            .uri("http://127.0.0.2:9/workspace/files")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(res.status(), 201);
    assert_eq!(
        up.seen.lock().unwrap().last().unwrap().path_and_query,
        "/ws/workspace/files"
    );
}

#[tokio::test]
async fn workspace_paths_cant_climb_out_of_the_prefix() {
    let up = ws_upstream().await;
    let gw = gateway(&up.base, &[]);
    for path in [
        "/workspace/../callback/env",
        "/workspace/files/../../env",
        "/workspace/%2e%2e/config",
        "/workspace/%2E%2E/%2e%2e/results",
        "/workspace/files/..%2f..%2fenv",
        "/workspace/files/a%2fb",
        "/workspace/files/a%5c..%5cb",
        "/workspace/./files",
        "/workspace//evil.example/files",
        "/workspace/files/",
        "/workspace/files%00",
        "/workspace/@evil.example/files",
    ] {
        let res = send(
            &gw,
            HttpRequest::builder()
                .uri(path)
                .header(header::AUTHORIZATION, "Bearer asbx_ws_mine")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        let status = res.status().as_u16();
        assert!(status == 400 || status == 404, "{path} answered {status}");
    }
    assert!(
        up.seen.lock().unwrap().is_empty(),
        "{:?}",
        up.seen.lock().unwrap()
    );
    // Positive control: a plain path reaches the workspace.
    let (status, _) = call(&gw, "GET", "/workspace/files/f_1-a.b~c", "").await;
    assert_eq!(status, 201);
    assert_eq!(
        up.seen.lock().unwrap()[0].path_and_query,
        "/ws/workspace/files/f_1-a.b~c"
    );
}

#[tokio::test]
async fn workspace_bodies_stream_both_ways_and_uploads_are_capped() {
    use futures::StreamExt;
    let up = ws_upstream().await;
    let gw = gateway(&up.base, &[]);
    // Download: headers kept (not the upstream's cookie), every byte.
    let res = send(
        &gw,
        HttpRequest::builder()
            .uri("/workspace/big")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-length"], BIG.to_string().as_str());
    assert_eq!(res.headers()["x-asbx-sha256"], "ab12");
    assert_eq!(res.headers()["content-type"], "application/pdf");
    assert!(res.headers().get("set-cookie").is_none());
    let body = axum::body::to_bytes(res.into_body(), BIG + 1)
        .await
        .unwrap();
    assert_eq!(body.len(), BIG);

    // The answer streams: its first chunk arrives before the upstream has
    // made the second.
    let res = send(
        &gw,
        HttpRequest::builder()
            .uri("/workspace/slow")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    let mut stream = res.into_body().into_data_stream();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the first chunk came before the rest was made")
        .unwrap()
        .unwrap();
    assert_eq!(&first[..], b"first");
    up.release.notify_one();
    let rest = stream.next().await.unwrap().unwrap();
    assert_eq!(&rest[..], b"second");

    // The request streams too: the upstream gets the first chunk while the
    // agent still holds the second.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(1);
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let pending = tokio::spawn(
        gw.clone().oneshot(
            HttpRequest::builder()
                .method("POST")
                .uri("/workspace/upload")
                .body(body)
                .unwrap(),
        ),
    );
    tx.send(Ok(bytes::Bytes::from_static(b"chunk-1")))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), up.first.notified())
        .await
        .expect("the upstream saw the first chunk before the body ended");
    tx.send(Ok(bytes::Bytes::from_static(b"chunk-2")))
        .await
        .unwrap();
    drop(tx);
    assert_eq!(pending.await.unwrap().unwrap().status(), 201);
    assert_eq!(up.seen.lock().unwrap().last().unwrap().body_len, 14);

    // The cap: exactly 16 MiB + 64 KiB passes, one byte more does not,
    // whether the length is declared or not.
    let cap = (16 << 20) + (64 << 10);
    let upload = |len: usize, declared: bool| {
        let mut b = HttpRequest::builder()
            .method("POST")
            .uri("/workspace/files?path=big.bin");
        let body = if declared {
            b = b.header(header::CONTENT_LENGTH, len);
            Body::from(vec![1u8; len])
        } else {
            let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = vec![1u8; len]
                .chunks(1 << 20)
                .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
                .collect();
            Body::from_stream(futures::stream::iter(chunks))
        };
        b.body(body).unwrap()
    };
    let before = up.seen.lock().unwrap().len();
    let res = send(&gw, upload(cap, true)).await;
    assert_eq!(res.status(), 201);
    assert_eq!(up.seen.lock().unwrap().last().unwrap().body_len, cap);
    let res = send(&gw, upload(cap, false)).await;
    assert_eq!(res.status(), 201);
    assert_eq!(up.seen.lock().unwrap().len(), before + 2);
    let res = send(&gw, upload(cap + 1, true)).await;
    assert_eq!(res.status(), 413);
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .unwrap();
    let p: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(p["code"], "body_too_large", "{p}");
    assert_eq!(
        up.seen.lock().unwrap().len(),
        before + 2,
        "a declared oversize body is refused before anything is sent"
    );
    let res = send(&gw, upload(cap + 1, false)).await;
    assert_eq!(res.status(), 413);
    assert!(
        up.seen.lock().unwrap().iter().all(|s| s.body_len <= cap),
        "no more than the cap reached the workspace"
    );
}

/// A TCP front for `backend` that drops its first `drops` connections at
/// once (a workspace node dying mid-request) and forwards the rest; the
/// count of connections it took.
async fn dropping_front(
    backend: String,
    drops: usize,
) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let target = backend.trim_start_matches("http://").to_owned();
    let taken = Arc::new(AtomicUsize::new(0));
    let t = Arc::clone(&taken);
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                return;
            };
            if t.fetch_add(1, Ordering::SeqCst) < drops {
                drop(inbound);
                continue;
            }
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (base, taken)
}

#[tokio::test]
async fn a_callback_that_loses_its_connection_is_tried_once_more() {
    use std::sync::atomic::Ordering;
    let (backend, _) = upstream(config("http://127.0.0.1:9")).await;
    // One dropped connection: the second try is answered.
    let (front, taken) = dropping_front(backend.clone(), 1).await;
    let app = gateway(&front, &[]);
    let (status, body) = call(&app, "GET", CALLBACK_CONFIG, "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(taken.load(Ordering::SeqCst), 2);
    // Two dropped: one retry only, then a clear 502.
    let (front, taken) = dropping_front(backend, 2).await;
    let app = gateway(&front, &[]);
    let (status, body) = call(&app, "GET", CALLBACK_CONFIG, "").await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["code"], "upstream_unreachable");
    assert_eq!(taken.load(Ordering::SeqCst), 2);
}

/// A raw HTTP front that records each request's [`REQUEST_ID_HEADER`] and
/// answers its connections in turn as `plan` says: `Drop` closes the
/// connection once the request is read (a node that redeemed the token and
/// died before answering), `Cut` sends the headers and half the body, then
/// closes, `Answer` answers `{"model": "openai:m"}` in full.
#[derive(Clone, Copy)]
enum Turn {
    Drop,
    Cut,
    Answer,
}

async fn recording_front(plan: Vec<Turn>) -> (String, Arc<Mutex<Vec<Option<String>>>>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let ids: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let seen = Arc::clone(&ids);
    tokio::spawn(async move {
        for turn in plan {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
            let id = head
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{REQUEST_ID_HEADER}: ")))
                .map(|v| v.trim().to_owned());
            seen.lock().unwrap().push(id);
            let body = br#"{"model": "openai:m"}"#;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            match turn {
                Turn::Drop => {}
                Turn::Cut => {
                    let _ = conn.write_all(head.as_bytes()).await;
                    let _ = conn.write_all(&body[..body.len() / 2]).await;
                }
                Turn::Answer => {
                    let _ = conn.write_all(head.as_bytes()).await;
                    let _ = conn.write_all(body).await;
                }
            }
            let _ = conn.shutdown().await;
        }
    });
    (base, ids)
}

#[tokio::test]
async fn a_callbacks_retry_carries_its_request_id_and_no_other_callback_does() {
    // Lost before any answer, then answered: one id, sent twice.
    let (front, ids) = recording_front(vec![Turn::Drop, Turn::Answer, Turn::Answer]).await;
    let app = gateway(&front, &[]);
    let (status, body) = call(&app, "GET", CALLBACK_CONFIG, "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "openai:m");
    // The next callback is another request: another id.
    let (status, body) = call(&app, "GET", CALLBACK_ENV, "").await;
    assert_eq!(status, 200, "{body}");
    let ids = ids.lock().unwrap().clone();
    assert_eq!(ids.len(), 3, "{ids:?}");
    let first = ids[0].clone().expect("the first try carries a request id");
    assert!(
        asbx_protocol::callback::is_valid_request_id(&first),
        "{first}"
    );
    assert_eq!(ids[1].as_deref(), Some(first.as_str()), "the retry's id");
    let other = ids[2].clone().expect("every callback carries one");
    assert_ne!(other, first);

    // An answer broken off after its headers is tried once more, with the
    // same id; the sandbox gets the whole answer.
    let (front, ids) = recording_front(vec![Turn::Cut, Turn::Answer]).await;
    let app = gateway(&front, &[]);
    let (status, body) = call(&app, "GET", CALLBACK_CONFIG, "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "openai:m");
    let ids = ids.lock().unwrap().clone();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids[0].is_some());
    assert_eq!(ids[0], ids[1]);

    // The sandbox can't choose the id: its own header is not passed on.
    let (front, ids) = recording_front(vec![Turn::Answer]).await;
    let app = gateway(&front, &[]);
    let res = app
        .clone()
        .oneshot(
            HttpRequest::builder()
                .method("GET")
                .uri(CALLBACK_CONFIG)
                .header(REQUEST_ID_HEADER, "chosen-by-the-sandbox-0000")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let ids = ids.lock().unwrap().clone();
    assert_eq!(ids.len(), 1);
    assert_ne!(ids[0].as_deref(), Some("chosen-by-the-sandbox-0000"));
    assert!(ids[0].is_some());
}
