//! The egress proxy end to end: a tool in a real jail asks through
//! `HTTP_PROXY`; refusals are 403 problem+json with their codes.

use asbx_protocol::callback::EnvResponse;

use crate::harness::{FakeWorkspace, RunnerProc, scripted};

/// Runs `command` as the sandbox's shell tool and returns its stdout.
async fn shell(runner: &RunnerProc, ws: &FakeWorkspace, command: &str) -> String {
    crate::harness::shell(runner, ws, command).await.0
}

/// Asks the proxy for `url`, with `host` as the `Host` header; prints
/// `<label>=<status> <code or body>`.
const PROBE: &str = r#"python3 - "$@" <<'PY'
import json, os, sys, urllib.request, urllib.error
port = os.environ["UP"]
for label, host in [("same", f"127.0.0.1:{port}"), ("fronted", "evil.test")]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/hello", headers={"Host": host})
    try:
        r = urllib.request.urlopen(req, timeout=10)
        print(f"{label}={r.status} {r.read().decode()}")
    except urllib.error.HTTPError as e:
        body = e.read().decode()
        try:
            print(f"{label}={e.code} {json.loads(body)['code']}")
        except Exception:
            print(f"{label}={e.code} {body[:80]}")
PY
"#;

/// A plain HTTP server on loopback answering `hello-upstream` to anything.
pub(crate) async fn upstream() -> u16 {
    let app = axum::Router::new().fallback(|| async { "hello-upstream" });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    port
}

#[tokio::test]
async fn egress_refusals_carry_codes_and_the_operator_can_allow_a_range() {
    let port = upstream().await;
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    ws.set_env(EnvResponse {
        allowed_hosts: vec![format!("127.0.0.1:{port}")],
        ..Default::default()
    });
    // Loopback is in the sandbox's NO_PROXY; this test wants the proxy.
    let command = format!("unset NO_PROXY no_proxy\nUP={port}\nexport UP\n{PROBE}");

    // Allowed by name and port, but loopback: refused before any connect.
    let runner = RunnerProc::start(&[]);
    let out = shell(&runner, &ws, &command).await;
    assert!(out.contains("same=403 egress_internal_address"), "{out}");
    assert!(out.contains("fronted=403 egress_host_mismatch"), "{out}");
    runner.assert_clean().await;

    // Positive control: the operator allows loopback; the same request is
    // served, while a fronted Host header stays refused.
    let runner = RunnerProc::start(&[("ASBX_ALLOW_INTERNAL", "127.0.0.1/32")]);
    let out = shell(&runner, &ws, &command).await;
    assert!(out.contains("same=200 hello-upstream"), "{out}");
    assert!(out.contains("fronted=403 egress_host_mismatch"), "{out}");
    runner.assert_clean().await;
}
