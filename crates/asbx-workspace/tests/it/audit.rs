//! The audit log (CONTRACT §10, docs/api-audit.md): one hash chain per
//! workspace, read back as NDJSON pages; an edited record is named by the
//! verification; two nodes appending at once keep one chain; retention
//! prunes behind an anchor and the chain still verifies.

use std::time::Duration;

use asbx_workspace::AuditEvent;
use serde_json::Value;
use sha2::Digest as _;

use crate::support::*;

fn egress(i: u64) -> AuditEvent {
    AuditEvent::Egress {
        host: format!("h{i}.example"),
        port: 443,
        method: Some("CONNECT".to_owned()),
        bytes_out: i,
        bytes_in: 2 * i,
        allowed: i.is_multiple_of(2),
        code: (!i.is_multiple_of(2)).then(|| "egress_host_not_allowed".to_owned()),
        secret: None,
    }
}

/// Every record of the caller's workspace, through the paged API.
async fn read_all(ws: &TestWorkspace, page: usize) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    loop {
        let after = out.last().map_or(0, |r| r["id"].as_i64().unwrap());
        let resp = client()
            .get(ws.url(&format!("/api/audit?after={after}&limit={page}")))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
        let text = resp.text().await.unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(lines.len() <= page);
        if lines.is_empty() {
            return out;
        }
        out.extend(lines);
    }
}

/// Canonical form (keys sorted, no spaces), as CONTRACT §10 defines it,
/// written here independently of the workspace's.
fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<_> = m.keys().collect();
            keys.sort();
            let inner: Vec<String> = keys
                .iter()
                .map(|k| format!("{}:{}", Value::String((*k).clone()), canonical(&m[*k])))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

on_both!(the_chain_verifies_and_an_edited_record_is_named);
async fn the_chain_verifies_and_an_edited_record_is_named(db: Db) {
    let ws = TestWorkspace::start_on(db, None, |_| {}).await;
    for batch in 0..3u64 {
        let events = (0..5).map(|i| egress(batch * 5 + i)).collect();
        ws.workspace
            .append_audit("default", Some("run_a"), events)
            .await
            .unwrap();
    }
    let records = read_all(&ws, 4).await;
    assert_eq!(records.len(), 15);
    // Checked from the outside: ids count from 1, each hash is the SHA-256
    // of the record without it, each prevHash the previous hash.
    let mut prev = String::new();
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r["id"], i as i64 + 1);
        assert_eq!(r["workspace"], "default");
        assert_eq!(r["runId"], "run_a");
        assert_eq!(r["kind"], "egress");
        assert_eq!(r["prevHash"], prev.as_str());
        let mut without = r.clone();
        without.as_object_mut().unwrap().remove("hash");
        let hash = hex::encode(sha2::Sha256::digest(canonical(&without).as_bytes()));
        assert_eq!(r["hash"], hash.as_str());
        prev = hash;
    }
    assert_eq!(records[3]["bytesIn"], 6);
    assert_eq!(records[3]["allowed"], false);
    assert_eq!(records[3]["code"], "egress_host_not_allowed");

    let verdicts = ws.workspace.verify_audit(None).await.unwrap();
    assert_eq!(verdicts.len(), 1);
    assert_eq!(verdicts[0].records, 15);
    assert_eq!(verdicts[0].broken, None);

    // An edit by hand: record 7's byte count.
    let pool = ws.db().await;
    let changed = sqlx::query(
        "UPDATE audit_records SET record = REPLACE(record, '\"bytesOut\":6', '\"bytesOut\":60') \
         WHERE workspace_id = 'default' AND id = 7",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(changed.rows_affected(), 1);
    let verdicts = ws.workspace.verify_audit(Some("default")).await.unwrap();
    let (id, why) = verdicts[0].broken.clone().expect("the edit is found");
    assert_eq!(id, 7, "{why}");
    assert_eq!(verdicts[0].records, 6);

    // Removing the last records (and the edited one put back) is found too.
    sqlx::query(
        "UPDATE audit_records SET record = REPLACE(record, '\"bytesOut\":60', '\"bytesOut\":6') \
         WHERE workspace_id = 'default' AND id = 7",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(
        ws.workspace.verify_audit(None).await.unwrap()[0].broken,
        None
    );
    sqlx::query("DELETE FROM audit_records WHERE workspace_id = 'default' AND id > 13")
        .execute(&pool)
        .await
        .unwrap();
    let verdicts = ws.workspace.verify_audit(None).await.unwrap();
    assert!(verdicts[0].broken.is_some(), "a cut tail is found");
}

on_both!(two_nodes_appending_at_once_keep_one_chain);
async fn two_nodes_appending_at_once_keep_one_chain(db: Db) {
    let a = TestWorkspace::start_on(db, None, |_| {}).await;
    let shared = a.database_url.clone();
    let key = a.workspace.config().secret_key.clone();
    let b = TestWorkspace::start_with(None, |c| {
        c.database_url = Some(shared);
        c.secret_key = key;
    })
    .await;
    let mut tasks = Vec::new();
    for (n, node) in [a.workspace.clone(), b.workspace.clone()]
        .into_iter()
        .cycle()
        .take(8)
        .enumerate()
    {
        tasks.push(tokio::spawn(async move {
            for round in 0..10u64 {
                let events = (0..7)
                    .map(|i| egress(n as u64 * 1000 + round * 10 + i))
                    .collect();
                node.append_audit("default", None, events).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let verdicts = b.workspace.verify_audit(None).await.unwrap();
    assert_eq!(verdicts.len(), 1);
    assert_eq!(verdicts[0].broken, None);
    assert_eq!(verdicts[0].records, 8 * 10 * 7);
    let records = read_all(&a, 10_000).await;
    assert_eq!(records.len(), 560);
    // Each batch stays together: 7 consecutive ids from one writer.
    for batch in records.chunks(7) {
        let writer = batch[0]["bytesOut"].as_u64().unwrap() / 1000;
        assert!(
            batch
                .iter()
                .all(|r| r["bytesOut"].as_u64().unwrap() / 1000 == writer)
        );
    }
}

on_both!(retention_prunes_behind_an_anchor_and_the_chain_still_verifies);
async fn retention_prunes_behind_an_anchor_and_the_chain_still_verifies(db: Db) {
    let ws = TestWorkspace::start_on(db, None, |_| {}).await;
    let old = (0..4).map(egress).collect();
    ws.workspace
        .append_audit("default", None, old)
        .await
        .unwrap();
    ws.clock.advance(Duration::from_secs(3 * 86_400));
    let new = (4..6).map(egress).collect();
    ws.workspace
        .append_audit("default", None, new)
        .await
        .unwrap();
    let gone = ws
        .workspace
        .prune_audit(Duration::from_secs(86_400))
        .await
        .unwrap();
    assert_eq!(gone, 4);
    let records = read_all(&ws, 100).await;
    let ids: Vec<i64> = records.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, [5, 6]);
    let verdicts = ws.workspace.verify_audit(None).await.unwrap();
    assert_eq!(verdicts[0].broken, None);
    assert_eq!(verdicts[0].records, 2);
    // The anchor is what makes it verifiable: without it, record 5's link
    // is broken.
    let pool = ws.db().await;
    sqlx::query("UPDATE audit_heads SET anchor_hash = '' WHERE workspace_id = 'default'")
        .execute(&pool)
        .await
        .unwrap();
    let verdicts = ws.workspace.verify_audit(None).await.unwrap();
    assert_eq!(verdicts[0].broken.as_ref().map(|b| b.0), Some(5));
}

#[tokio::test]
async fn the_api_pages_and_refuses_bad_bounds() {
    let ws = TestWorkspace::start(None).await;
    let resp = client()
        .get(ws.url("/api/audit?limit=0"))
        .send()
        .await
        .unwrap();
    let p = problem(resp, 400).await;
    assert_eq!(p["code"], "invalid_request");
    let resp = client()
        .get(ws.url("/api/runs/nope/audit"))
        .send()
        .await
        .unwrap();
    problem(resp, 404).await;
    // A report without this run's audit token is refused.
    let resp = client()
        .post(ws.url("/api/assistant/sandbox/nope/audit"))
        .bearer_auth("asbx_aud_forged")
        .header("x-asbx-audit-version", "1")
        .json(&serde_json::json!({"events": [{"kind": "dropped", "count": 1}]}))
        .send()
        .await
        .unwrap();
    problem(resp, 401).await;
    assert!(read_all(&ws, 10).await.is_empty());

    // A key made is recorded by name and a short id, never the key.
    let key = ws
        .workspace
        .create_api_key("default", "ci key")
        .await
        .unwrap();
    let records = read_all(&ws, 10).await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["kind"], "api_key_created");
    assert_eq!(records[0]["name"], "ci key");
    assert_eq!(records[0]["keyId"], &sha256_hex(&key)[..12]);
    assert!(!records[0].to_string().contains(&key));
}

on_both!(a_key_revoked_is_recorded_and_opens_nothing);
async fn a_key_revoked_is_recorded_and_opens_nothing(db: Db) {
    let ws = TestWorkspace::start_on(db, None, |_| {}).await;
    let id = ws.workspace.create_workspace("team").await.unwrap();
    let one = ws.workspace.create_api_key(&id, "one").await.unwrap();
    let two = ws.workspace.create_api_key(&id, "two").await.unwrap();
    let usage = |key: &str| {
        client()
            .get(ws.url("/api/usage"))
            .bearer_auth(key.to_owned())
            .send()
    };
    assert_eq!(usage(&one).await.unwrap().status(), 200);
    // By the key itself.
    let w = &ws.workspace;
    assert_eq!(
        w.revoke_api_key(&id, &one).await.unwrap().as_deref(),
        Some("one")
    );
    assert_eq!(usage(&one).await.unwrap().status(), 401);
    assert_eq!(w.revoke_api_key(&id, &one).await.unwrap(), None, "once");
    // By its keyId, as the log names it; not another workspace's.
    let key_id = &sha256_hex(&two)[..12];
    assert_eq!(w.revoke_api_key("default", key_id).await.unwrap(), None);
    assert_eq!(usage(&two).await.unwrap().status(), 200);
    assert!(w.revoke_api_key(&id, "nothex").await.is_err());
    assert_eq!(
        w.revoke_api_key(&id, key_id).await.unwrap().as_deref(),
        Some("two")
    );
    assert_eq!(usage(&two).await.unwrap().status(), 401);
    let reader = w.create_api_key(&id, "reader").await.unwrap();
    let text = client()
        .get(ws.url("/api/audit"))
        .bearer_auth(reader)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let records: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["kind"] == "api_key_revoked")
        .collect();
    assert_eq!(records.len(), 2, "{records:?}");
    assert_eq!(records[0]["name"], "one");
    assert_eq!(records[0]["keyId"], &sha256_hex(&one)[..12]);
    assert_eq!(records[1]["name"], "two");
    assert_eq!(records[1]["keyId"], key_id);
    assert!(!records[0].to_string().contains(&one));
}

on_both!(a_chat_turns_tool_calls_are_recorded);
async fn a_chat_turns_tool_calls_are_recorded(db: Db) {
    // A short turn: its lines are stored with its end, in one transaction.
    let runner = FakeRunner::start(Mode::Full { files: vec![] }).await;
    let ws = TestWorkspace::start_on(db, Some(runner.url.clone()), |_| {}).await;
    let resp = post_turn(&ws, serde_json::json!({"message": "hi"})).await;
    let turn_id = resp.headers()["x-asbx-turn-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let events = SseReader::new(resp).until_done().await;
    assert_eq!(events.last().unwrap().data["status"], "succeeded");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let records = loop {
        let resp = client()
            .get(ws.url(&format!("/api/runs/{turn_id}/audit")))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let text = resp.text().await.unwrap();
        let records: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if records.iter().any(|r| r["kind"] == "tool_call")
            || tokio::time::Instant::now() > deadline
        {
            break records;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let tools: Vec<&Value> = records
        .iter()
        .filter(|r| r["kind"] == "tool_call")
        .collect();
    assert_eq!(tools.len(), 1, "{records:?}");
    assert_eq!(tools[0]["name"], "shell");
    assert_eq!(tools[0]["exitCode"], 0);
    assert_eq!(tools[0]["durationMs"], 5);
}
