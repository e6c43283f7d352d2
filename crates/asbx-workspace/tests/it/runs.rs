//! `POST /api/runs`: dispatch, NDJSON relay, outcome recording, errors.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Db, FakeRunner, Mode, TestWorkspace, client, on_both, problem, settled_run};

on_both!(lines_are_relayed_intact_and_the_outcome_recorded);
async fn lines_are_relayed_intact_and_the_outcome_recorded(db: Db) {
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let run_id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let body = resp.bytes().await.unwrap();
    assert_eq!(body.as_ref(), runner.sent().as_slice());
    let lines: Vec<Value> = body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["seq"], (i + 1) as u64);
        assert_eq!(l["sessionId"], run_id.as_str());
    }
    assert_eq!(lines[3]["type"], "result");

    // Recorded before the client saw the end of the stream.
    let run: Value = client()
        .get(ws.url(&format!("/api/runs/{run_id}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["result"], "done: hello");
    assert_eq!(run["prompt"], "hello");
    assert_eq!(run["model"], "scripted:demo");
    assert!(run["endedAt"].is_i64());
}

/// Issue 13, item 2: an anonymous request cannot point the workspace (and
/// the tokens it sends) at a runner of its choosing.
#[tokio::test]
async fn a_request_cannot_name_its_runner() {
    let attacker = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x", "sandboxUrl": attacker.url.as_str()}))
        .send()
        .await
        .unwrap();
    let p = problem(resp, 400).await;
    assert!(p["detail"].as_str().unwrap().contains("sandboxUrl"), "{p}");
    assert!(attacker.dispatches().is_empty());
    assert!(runner.dispatches().is_empty());
    // Positive control: without it, the operator's runner gets the run.
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap();
    assert_eq!(runner.dispatches().len(), 1);
    assert!(attacker.dispatches().is_empty());
}

#[tokio::test]
async fn missing_sandbox_url_is_a_clear_error() {
    let ws = TestWorkspace::start(None).await;
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    let p = problem(resp, 503).await;
    assert_eq!(p["code"], "sandbox_url_missing");
    assert!(p["detail"].as_str().unwrap().contains("SANDBOX_URL"), "{p}");
}

#[tokio::test]
async fn bad_run_requests_name_every_bad_field() {
    let ws = TestWorkspace::start(None).await;
    let body = json!({"prompt": " ", "model": "nocolon",
                      "variables": {"1BAD": "x"}, "allowedHosts": ["http://x"]});
    let p = problem(
        client()
            .post(ws.url("/api/runs"))
            .json(&body)
            .send()
            .await
            .unwrap(),
        400,
    )
    .await;
    let fields: Vec<_> = p["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap().to_owned())
        .collect();
    for f in ["prompt", "model", "variables.1BAD", "allowedHosts[0]"] {
        assert!(fields.iter().any(|x| x == f), "{f} missing in {p}");
    }
    let p = problem(
        client()
            .post(ws.url("/api/runs"))
            .json(&json!({"prompt": "x", "bogus": 1}))
            .send()
            .await
            .unwrap(),
        400,
    )
    .await;
    assert!(p["detail"].as_str().unwrap().contains("bogus"), "{p}");
    let p = problem(
        client()
            .post(ws.url("/api/runs"))
            .header("content-type", "application/json")
            .body("{")
            .send()
            .await
            .unwrap(),
        400,
    )
    .await;
    assert_eq!(p["code"], "invalid_request");
}

#[tokio::test]
async fn runner_rejection_passes_through() {
    let rejection = json!({"type": "urn:asbx:problem:at_capacity", "title": "At capacity",
                           "status": 503, "detail": "too many sandboxes", "code": "at_capacity"});
    let runner = FakeRunner::start(Mode::Reject(503, rejection.clone())).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    let run_id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let p = problem(resp, 503).await;
    assert_eq!(p, rejection);
    let run = settled_run(&ws, &run_id).await;
    assert_eq!(run["status"], "failed");
    assert_eq!(run["error"]["code"], "at_capacity");
}

#[tokio::test]
async fn unreachable_runner_is_502() {
    // Bind then drop a listener: nothing listens on that port any more.
    let port = crate::support::bind_loopback()
        .await
        .local_addr()
        .unwrap()
        .port();
    let ws = TestWorkspace::start(Some(format!("http://127.0.0.1:{port}").parse().unwrap())).await;
    let resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    let p = problem(resp, 502).await;
    assert_eq!(p["code"], "upstream_failed");
}

#[tokio::test]
async fn client_disconnect_cancels_the_upstream_and_records_it() {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start(Some(runner.url.clone())).await;
    let dropped = runner.shared.dropped.notified();
    let mut resp = client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x"}))
        .send()
        .await
        .unwrap();
    let run_id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("running"));
    drop(resp);
    tokio::time::timeout(Duration::from_secs(20), dropped)
        .await
        .expect("upstream dropped");
    let run = settled_run(&ws, &run_id).await;
    assert_eq!(run["status"], "failed");
    assert_eq!(run["error"]["code"], "cancelled");
    // Issue 28, defect 5: the run says how its session ended. This runner
    // does not know the session when asked to end it (`404`), so the
    // workspace records what it did: the session was ended for the client.
    assert_eq!(run["termination"]["reason"], "terminated", "{run}");
    assert_eq!(run["termination"]["terminatedBy"], "daemon", "{run}");
    assert_eq!(runner.deletes(), [run_id], "the runner was asked to end it");
}

#[tokio::test]
async fn misc_routes() {
    let ws = TestWorkspace::start(None).await;
    let v: Value = client()
        .get(ws.url("/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v, json!({"status": "ok"}));
    let r = client().get(ws.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("script-src 'self'")
    );
    let page = r.text().await.unwrap();
    assert!(page.contains("/assets/app.js") && page.contains("/assets/app.css"));
    for (path, ty) in [
        ("/assets/app.js", "text/javascript"),
        ("/assets/app.css", "text/css"),
    ] {
        let r = client().get(ws.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(
            r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with(ty)
        );
    }
    let p = problem(client().get(ws.url("/nope")).send().await.unwrap(), 404).await;
    assert_eq!(p["code"], "not_found");
    let p = problem(
        client()
            .get(ws.url("/api/runs/unknown"))
            .send()
            .await
            .unwrap(),
        404,
    )
    .await;
    assert_eq!(p["code"], "not_found");
}
