//! One-time tokens: single use, bound to session and kind, expiry, hashing.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Db, FakeRunner, Mode, TestWorkspace, client, on_both, problem};

/// Starts a held run and returns its dispatch (with the plaintext tokens).
async fn held_run(
    ws: &TestWorkspace,
    runner: &FakeRunner,
    n: usize,
) -> (asbx_protocol::DispatchRequest, reqwest::Response) {
    let resp = client()
        .post(ws.url("/api/runs"))
        // A one-minute cap: every token lives 2 min.
        .json(&json!({"prompt": "hi", "variables": {"A": "1"},
                      "limits": {"max_duration_ms": 60_000}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    (runner.next_dispatch(n).await, resp)
}

async fn get_with(url: &str, token: &str) -> reqwest::Response {
    client().get(url).bearer_auth(token).send().await.unwrap()
}

on_both!(tokens_are_single_use_and_bound_to_session_and_kind);
async fn tokens_are_single_use_and_bound_to_session_and_kind(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let (a, _sa) = held_run(&ws, &runner, 0).await;
    let (b, _sb) = held_run(&ws, &runner, 1).await;

    // Wrong kind: the run token at /env is refused and redeems nothing.
    let p = problem(
        get_with(&format!("{}/env", a.agent_url), &a.otp_run).await,
        401,
    )
    .await;
    assert_eq!(p["code"], "otp_rejected");
    // Another dispatch's token is refused and redeems nothing.
    let p = problem(
        get_with(&format!("{}/env", a.agent_url), &b.otp_setup).await,
        401,
    )
    .await;
    assert_eq!(p["code"], "otp_rejected");

    // First redemption works, with the run's payload.
    let r = get_with(&format!("{}/env", a.agent_url), &a.otp_setup).await;
    assert_eq!(r.status(), 200);
    let env: Value = r.json().await.unwrap();
    assert_eq!(env["variables"], json!({"A": "1"}));
    // Second redemption is refused.
    let p = problem(
        get_with(&format!("{}/env", a.agent_url), &a.otp_setup).await,
        401,
    )
    .await;
    assert_eq!(p["code"], "otp_rejected");

    // The tokens refused above are still good where they belong.
    assert_eq!(
        get_with(&format!("{}/config", a.agent_url), &a.otp_run)
            .await
            .status(),
        200
    );
    assert_eq!(
        get_with(&format!("{}/env", b.agent_url), &b.otp_setup)
            .await
            .status(),
        200
    );

    // No or malformed credentials.
    let p = problem(
        client()
            .get(format!("{}/config", b.agent_url))
            .send()
            .await
            .unwrap(),
        401,
    )
    .await;
    assert_eq!(p["code"], "unauthorized");
    let p = problem(
        get_with(&format!("{}/config", b.agent_url), "nonsense").await,
        401,
    )
    .await;
    assert_eq!(p["code"], "otp_rejected");
}

on_both!(expired_tokens_are_refused);
async fn expired_tokens_are_refused(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let (d, _s) = held_run(&ws, &runner, 0).await;
    // A one-minute cap: every token lives as long as the dispatch may, the
    // cap + 60 s.
    ws.clock.advance(Duration::from_secs(119));
    assert_eq!(
        get_with(&format!("{}/env", d.agent_url), &d.otp_setup)
            .await
            .status(),
        200
    );
    ws.clock.advance(Duration::from_secs(2));
    // 121 s: the run token and the upload token have expired.
    let p = problem(
        get_with(&format!("{}/config", d.agent_url), &d.otp_run).await,
        401,
    )
    .await;
    assert_eq!(p["code"], "otp_rejected");
    let body = json!({"files": [{"path": "a.txt", "content_base64": "aGk="}]});
    let r = client()
        .post(format!("{}/results", d.agent_url))
        .bearer_auth(d.otp_upload.clone().unwrap())
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(problem(r, 401).await["code"], "otp_rejected");
}

/// The lifetime of each token of `session`, in ms, by kind.
async fn lifetimes(ws: &TestWorkspace, session: &str) -> std::collections::BTreeMap<String, i64> {
    let db = ws.db().await;
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT kind, expires_at - created_at FROM tokens WHERE session_id = $1")
            .bind(session)
            .fetch_all(&db)
            .await
            .unwrap();
    db.close().await;
    rows.into_iter().collect()
}

on_both!(token_lifetimes_follow_the_runners_cap);
/// Issue 28, defect 2: a runner whose cap (`/healthz` `max_duration_ms`,
/// from `ASBX_MAX_RUNTIME_SEC`) is 30 min gets tokens that live 31 min, not
/// the default 8 h; a run asking for more is clamped; an unknown cap is the
/// default's.
async fn token_lifetimes_follow_the_runners_cap(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    runner.set_health(json!({"status": "ok", "max_duration_ms": 1_800_000}));
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let run = |body: Value| {
        let url = ws.url("/api/runs");
        async move {
            let resp = client().post(url).json(&body).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            resp
        }
    };
    let _a = run(json!({"prompt": "hi"})).await;
    let a = runner.next_dispatch(0).await;
    let _b = run(json!({"prompt": "hi", "limits": {"max_duration_ms": 36_000_000}})).await;
    let b = runner.next_dispatch(1).await;
    for d in [&a, &b] {
        let session = d.session_id.clone().unwrap();
        let r = get_with(&format!("{}/env", d.agent_url), &d.otp_setup).await;
        assert_eq!(r.status(), 200);
        let ttl = lifetimes(&ws, &session).await;
        assert_eq!(ttl["setup"], 600_000, "{ttl:?}");
        assert_eq!(ttl["run"], 1_860_000, "{ttl:?}");
        assert_eq!(ttl["upload"], 1_860_000, "{ttl:?}");
        assert_eq!(ttl["workspace"], 1_860_000, "{ttl:?}");
    }
    // A runner that says nothing of its cap: the default cap of 8 h.
    let other = FakeRunner::start(Mode::Hold).await;
    let ws2 = TestWorkspace::start(Some(other.url.clone())).await;
    let resp = client()
        .post(ws2.url("/api/runs"))
        .json(&json!({"prompt": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let c = other.next_dispatch(0).await;
    let ttl = lifetimes(&ws2, &c.session_id.clone().unwrap()).await;
    assert_eq!(ttl["run"], 28_860_000, "{ttl:?}");
}

on_both!(concurrent_redemptions_have_exactly_one_winner);
async fn concurrent_redemptions_have_exactly_one_winner(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let (d, _s) = held_run(&ws, &runner, 0).await;
    let url = format!("{}/env", d.agent_url);
    let attempts = (0..16).map(|_| {
        let url = url.clone();
        let token = d.otp_setup.clone();
        tokio::spawn(async move { get_with(&url, &token).await.status().as_u16() })
    });
    let mut statuses = Vec::new();
    for a in attempts {
        statuses.push(a.await.unwrap());
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 401).count(),
        15,
        "{statuses:?}"
    );
}

on_both!(only_token_hashes_are_stored);
async fn only_token_hashes_are_stored(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let (d, _s) = held_run(&ws, &runner, 0).await;
    let plaintexts = [
        d.otp_setup.clone(),
        d.otp_run.clone(),
        d.otp_upload.clone().unwrap(),
    ];
    let session = d.session_id.clone().unwrap();

    let db = ws.db().await;
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT hash, kind FROM tokens WHERE session_id = $1")
            .bind(&session)
            .fetch_all(&db)
            .await
            .unwrap();
    assert_eq!(rows.len(), 3);
    for p in &plaintexts {
        assert!(p.starts_with("asbx_otp_"));
        let h = crate::support::sha256_hex(p);
        assert!(
            rows.iter().any(|(hash, _)| *hash == h),
            "hash of a token is stored"
        );
        assert!(rows.iter().all(|(hash, _)| hash != p));
    }
    db.close().await;
    // No file under the data dir (database, WAL, blobs) holds a plaintext token.
    for entry in walk(ws.data_dir.path()) {
        let bytes = std::fs::read(&entry).unwrap();
        for p in &plaintexts {
            assert!(
                !bytes.windows(p.len()).any(|w| w == p.as_bytes()),
                "plaintext token found in {}",
                entry.display()
            );
        }
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

on_both!(tokens_are_revoked_when_the_stream_ends);
async fn tokens_are_revoked_when_the_stream_ends(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let (d, resp) = held_run(&ws, &runner, 0).await;
    runner.shared.release.notify_one();
    let body = resp.text().await.unwrap();
    assert!(body.contains("released"));
    // Every token of the settled dispatch is refused, although none was
    // spent and none has expired (the run token and the upload token
    // included: a long setup script never outlives its run).
    let p = problem(
        get_with(&format!("{}/env", d.agent_url), &d.otp_setup).await,
        401,
    )
    .await;
    assert_eq!(p["code"], "otp_rejected");
    let p = problem(
        get_with(&format!("{}/config", d.agent_url), &d.otp_run).await,
        401,
    )
    .await;
    assert_eq!(p["code"], "otp_rejected");
    let r = client()
        .post(format!("{}/results", d.agent_url))
        .bearer_auth(d.otp_upload.clone().unwrap())
        .json(&json!({"files": [{"path": "a.txt", "content_base64": "aGk="}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(problem(r, 401).await["code"], "otp_rejected");
}
