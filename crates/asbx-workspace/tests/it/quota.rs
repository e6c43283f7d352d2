//! Quotas per workspace (CONTRACT.md §10): each refused at its limit and
//! not before, with `429 quota_exceeded` naming it; `GET /api/usage`.

use std::time::Duration;

use asbx_workspace::Quota;
use serde_json::{Value, json};

use crate::support::{Db, FakeRunner, Mode, TestWorkspace, client, on_both, problem, to_noon};

async fn usage(ws: &TestWorkspace) -> Value {
    let resp = client().get(ws.url("/api/usage")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

async fn post_run(ws: &TestWorkspace) -> reqwest::Response {
    client()
        .post(ws.url("/api/runs"))
        .json(&json!({"prompt": "x", "protocol": 2}))
        .send()
        .await
        .unwrap()
}

/// Asserts a `429 quota_exceeded` naming `quota`; its `Retry-After`.
async fn refused(resp: reqwest::Response, quota: &str) -> Option<u64> {
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
    let p = problem(resp, 429).await;
    assert_eq!(p["code"], "quota_exceeded", "{p}");
    assert_eq!(p["quota"], quota, "{p}");
    retry
}

on_both!(concurrent_sandboxes_are_refused_at_the_limit);
async fn concurrent_sandboxes_are_refused_at_the_limit(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |c| {
        c.quotas.set(Quota::ConcurrentSandboxes, Some(2));
    })
    .await;
    let a = post_run(&ws).await;
    assert_eq!(a.status(), 200);
    let b = post_run(&ws).await;
    assert_eq!(b.status(), 200);
    let u = usage(&ws).await;
    assert_eq!(u["quotas"]["concurrent-sandboxes"], 2, "{u}");
    assert_eq!(u["used"]["concurrent-sandboxes"], 2.0, "{u}");
    let retry = refused(post_run(&ws).await, "concurrent-sandboxes").await;
    assert!(retry.is_some_and(|s| s > 0));
    assert_eq!(
        runner.dispatches().len(),
        2,
        "a refused run reaches no runner"
    );
    // The operator's override wins over the default.
    ws.workspace
        .set_quota("default", Quota::ConcurrentSandboxes, Some(Some(3)))
        .await
        .unwrap();
    let c = post_run(&ws).await;
    assert_eq!(c.status(), 200);
    refused(post_run(&ws).await, "concurrent-sandboxes").await;
    // Unlimited by override.
    ws.workspace
        .set_quota("default", Quota::ConcurrentSandboxes, Some(None))
        .await
        .unwrap();
    let u = usage(&ws).await;
    assert_eq!(u["quotas"]["concurrent-sandboxes"], Value::Null, "{u}");
    let d = post_run(&ws).await;
    assert_eq!(d.status(), 200);
    for _ in 0..4 {
        runner.shared.release.notify_one();
    }
    drop((a, b, c, d));
}

on_both!(requests_per_minute_are_counted_per_key);
async fn requests_per_minute_are_counted_per_key(db: Db) {
    let ws = TestWorkspace::start_on(db, None, |c| {
        c.quotas.set(Quota::RequestsPerMinute, Some(3));
    })
    .await;
    to_noon(&ws);
    let id = ws.workspace.create_workspace("team").await.unwrap();
    let k1 = ws.workspace.create_api_key(&id, "one").await.unwrap();
    let k2 = ws.workspace.create_api_key(&id, "two").await.unwrap();
    let get = |key: &str| client().get(ws.url("/api/usage")).bearer_auth(key).send();
    for i in 1..=3 {
        let resp = get(&k1).await.unwrap();
        assert_eq!(resp.status(), 200, "request {i} of 3");
        let u: Value = resp.json().await.unwrap();
        assert_eq!(u["used"]["requests-per-minute"], f64::from(i), "{u}");
    }
    let retry = refused(get(&k1).await.unwrap(), "requests-per-minute").await;
    assert!(retry.is_some_and(|s| (1..=60).contains(&s)), "{retry:?}");
    // Another key of the same workspace has a minute of its own.
    assert_eq!(get(&k2).await.unwrap().status(), 200);
    // The next minute, the first key may again.
    ws.clock.advance(Duration::from_secs(60));
    assert_eq!(get(&k1).await.unwrap().status(), 200);
}

on_both!(sandbox_seconds_per_day_are_refused_once_used);
async fn sandbox_seconds_per_day_are_refused_once_used(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |c| {
        c.quotas.set(Quota::SandboxSecondsPerDay, Some(10));
    })
    .await;
    to_noon(&ws);
    let mut held = post_run(&ws).await;
    assert_eq!(held.status(), 200);
    held.chunk().await.unwrap();
    ws.clock.advance(Duration::from_secs(9));
    // 9 s of 10 used: one more may start.
    let second = post_run(&ws).await;
    assert_eq!(second.status(), 200);
    let u = usage(&ws).await;
    assert_eq!(u["used"]["sandbox-seconds-per-day"], 9.0, "{u}");
    ws.clock.advance(Duration::from_secs(1));
    let retry = refused(post_run(&ws).await, "sandbox-seconds-per-day").await;
    // Tomorrow (UTC) it is free again: the clock stands at 12:00:10.
    assert_eq!(retry, Some(12 * 3600 - 10));
    runner.shared.release.notify_one();
    runner.shared.release.notify_one();
    while held.chunk().await.unwrap().is_some() {}
    drop(second);
}

on_both!(tokens_per_day_are_refused_once_used);
async fn tokens_per_day_are_refused_once_used(db: Db) {
    use asbx_workspace::Clock as _;
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |c| {
        c.quotas.set(Quota::TokensPerDay, Some(100));
    })
    .await;
    to_noon(&ws);
    let now = ws.clock.now_ms();
    // A turn that ended today having used 99 tokens (its `session_ended`
    // stats; a run of yesterday's counts nothing).
    let pool = ws.db().await;
    for (id, ended, tokens) in [
        ("t-today", now - 1000, 99),
        ("t-yday", now - 86_400_000, 500),
    ] {
        sqlx::query(
            "INSERT INTO runs (id, workspace_id, kind, status, prompt, model, env_json, \
             config_json, created_at, ended_at, tokens) \
             VALUES ($1, 'default', 'run', 'succeeded', 'p', 'm', '{}', '{}', $2, $2, $3)",
        )
        .bind(id)
        .bind(ended)
        .bind(tokens)
        .execute(&pool)
        .await
        .unwrap();
    }
    let u = usage(&ws).await;
    assert_eq!(u["used"]["tokens-per-day"], 99.0, "{u}");
    let ok = post_run(&ws).await;
    assert_eq!(ok.status(), 200);
    ok.bytes().await.unwrap();
    sqlx::query("UPDATE runs SET tokens = 100 WHERE id = 't-today'")
        .execute(&pool)
        .await
        .unwrap();
    let retry = refused(post_run(&ws).await, "tokens-per-day").await;
    assert!(retry.is_some());
}

on_both!(storage_is_refused_past_its_megabytes);
async fn storage_is_refused_past_its_megabytes(db: Db) {
    let ws = TestWorkspace::start_on(db, None, |c| {
        c.quotas.set(Quota::StorageMb, Some(1));
    })
    .await;
    let upload = |name: &str, size: usize| {
        client()
            .post(ws.url(&format!("/api/assistant/files?name={name}")))
            .header("content-type", "application/octet-stream")
            .body(vec![b'x'; size])
            .send()
    };
    let first = upload("a.bin", 600 * 1024).await.unwrap();
    assert_eq!(first.status(), 201);
    let u = usage(&ws).await;
    let used = u["used"]["storage-mb"].as_f64().unwrap();
    assert!((used - 600.0 / 1024.0).abs() < 1e-9, "{u}");
    // 600 KiB + 500 KiB > 1 MiB; 600 KiB + 400 KiB is not.
    let retry = refused(upload("b.bin", 500 * 1024).await.unwrap(), "storage-mb").await;
    assert_eq!(retry, None, "waiting does not free storage");
    assert_eq!(upload("c.bin", 400 * 1024).await.unwrap().status(), 201);
}

#[tokio::test]
async fn usage_names_every_quota_and_unset_is_unlimited() {
    let ws = TestWorkspace::start(None).await;
    let u = usage(&ws).await;
    for name in [
        "concurrent-sandboxes",
        "requests-per-minute",
        "sandbox-seconds-per-day",
        "tokens-per-day",
        "storage-mb",
    ] {
        assert_eq!(u["quotas"][name], Value::Null, "{u}");
        assert!(u["used"][name].is_number(), "{u}");
    }
    let err = ws
        .workspace
        .set_quota("nope", Quota::StorageMb, Some(Some(1)))
        .await;
    assert!(err.is_err(), "an unknown workspace");
}

// Two nodes on one database take dispatches at once: exactly the limit
// start, however they interleave (the workspace's row is locked while a
// dispatch is admitted and recorded).
on_both!(two_nodes_admit_exactly_the_limit);
async fn two_nodes_admit_exactly_the_limit(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    let quotas = |c: &mut asbx_workspace::WorkspaceConfig| {
        c.quotas.set(Quota::ConcurrentSandboxes, Some(3));
    };
    let a = TestWorkspace::start_on(db, Some(runner.url.clone()), quotas).await;
    let shared = a.database_url.clone();
    let b = TestWorkspace::start_on(Db::Sqlite, Some(runner.url.clone()), |c| {
        quotas(c);
        c.database_url = Some(shared);
        c.secret_key = a.workspace.config().secret_key.clone();
    })
    .await;
    let tries = (0..10).map(|i| {
        let node = if i % 2 == 0 { &a } else { &b };
        post_run(node)
    });
    let answers = futures::future::join_all(tries).await;
    let started = answers.iter().filter(|r| r.status() == 200).count();
    let refused = answers.iter().filter(|r| r.status() == 429).count();
    assert_eq!((started, refused), (3, 7));
    assert_eq!(runner.dispatches().len(), 3);
    for _ in 0..3 {
        runner.shared.release.notify_one();
    }
    drop(answers);
}

/// `n` runs posted at once by the holder of `key`, each answered in its
/// own task (a queued one waits for its share).
fn post_runs(ws: &TestWorkspace, key: &str, n: usize) -> Vec<tokio::task::JoinHandle<u16>> {
    (0..n)
        .map(|_| {
            let req = client()
                .post(ws.url("/api/runs"))
                .bearer_auth(key)
                .json(&json!({"prompt": "x", "protocol": 2}));
            tokio::spawn(async move {
                let resp = req.send().await.unwrap();
                let status = resp.status().as_u16();
                // Hold the stream open: the run lives until released.
                tokio::time::sleep(Duration::from_secs(30)).await;
                drop(resp);
                status
            })
        })
        .collect()
}

/// Waits (15 s at most: SQLite on a loaded host can stall a write for
/// seconds) until the runner has seen `n` dispatches.
async fn dispatched(runner: &FakeRunner, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while runner.dispatches().len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} dispatched",
            runner.dispatches().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

on_both!(a_workspace_gets_half_the_fleet_and_waiters_take_turns);
async fn a_workspace_gets_half_the_fleet_and_waiters_take_turns(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    runner.set_health(json!({"status": "ok", "capacity": 4}));
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |c| {
        c.require_auth = true;
        c.queue_wait = Duration::from_secs(20);
    })
    .await;
    let a = ws.workspace.create_workspace("a").await.unwrap();
    let b = ws.workspace.create_workspace("b").await.unwrap();
    let key_a = ws.workspace.create_api_key(&a, "ka").await.unwrap();
    let key_b = ws.workspace.create_api_key(&b, "kb").await.unwrap();

    // A asks for 8 at once: half the fleet (2) starts, 6 wait.
    let runs_a = post_runs(&ws, &key_a, 8);
    dispatched(&runner, 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(runner.dispatches().len(), 2, "A holds at most half");
    // B's two start at once (within a second), A still waiting.
    let started = tokio::time::Instant::now();
    let runs_b = post_runs(&ws, &key_b, 2);
    dispatched(&runner, 4).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let u = client()
        .get(ws.url("/api/usage"))
        .bearer_auth(&key_b)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(u["used"]["concurrent-sandboxes"], 2.0, "{u}");
    // One of A's ends (cancelled: releasing a held session would pick any
    // of the four, B's too): the next of A's waiters starts in its place,
    // and A never holds more than 2.
    let first_of_a = runner.dispatches()[0].session_id.clone().unwrap();
    let cancelled = client()
        .delete(ws.url(&format!("/api/runs/{first_of_a}")))
        .bearer_auth(&key_a)
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), 202);
    dispatched(&runner, 5).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(runner.dispatches().len(), 5);
    for _ in 0..16 {
        runner.shared.release.notify_one();
    }
    for run in runs_a.into_iter().chain(runs_b) {
        run.abort();
    }
}

on_both!(a_dispatch_waits_its_longest_then_429);
async fn a_dispatch_waits_its_longest_then_429(db: Db) {
    let runner = FakeRunner::start(Mode::Hold).await;
    runner.set_health(json!({"status": "ok", "capacity": 2}));
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |c| {
        c.queue_wait = Duration::from_millis(600);
    })
    .await;
    let first = post_run(&ws).await;
    assert_eq!(first.status(), 200);
    let started = tokio::time::Instant::now();
    let retry = refused(post_run(&ws).await, "concurrent-sandboxes").await;
    assert!(started.elapsed() >= Duration::from_millis(500), "it waited");
    assert!(retry.is_some_and(|s| s > 0));
    assert_eq!(
        runner.dispatches().len(),
        1,
        "a refused run reaches no runner"
    );
    runner.shared.release.notify_one();
    drop(first);
}
