//! The runner's side of restoring a kept working directory (CONTRACT §11):
//! a blob request answered with a broken connection or a `5xx` (a workspace
//! node dying under a load balancer) is tried again, a bounded number of
//! times, and a restore that still fails refuses the dispatch
//! `502 workdir_unavailable`, never `500 internal`, with nothing left
//! behind.

use serde_json::json;

use crate::harness::*;

/// A dispatch whose sandbox starts with `notes.txt` restored, and the
/// file's bytes.
fn body_with_workdir(ws: &FakeWorkspace, test: &str) -> (serde_json::Value, Vec<u8>) {
    let bytes = format!("kept {}\n", rand::random::<u64>()).into_bytes();
    let sha = ws.put_blob(&bytes);
    let t = ws.mint(&session_id(test));
    let mut body = ws.body(
        &t,
        &script(json!([{"tool": "shell", "args": {"command": "cat notes.txt"}}, {"say": "ok"}])),
    );
    body["workdir"] = json!({
        "token": "tok_workdir",
        "restore": {"entries": [
            {"kind": "file", "path": "notes.txt", "mode": 0o644, "size": bytes.len(), "sha256": sha}
        ]}
    });
    (body, bytes)
}

#[tokio::test]
async fn a_blob_refused_for_a_while_is_fetched_again_and_never_for_ever() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;

    // Two `503`s (a node dying), then the blob: the turn runs with it.
    ws.fail_blobs(2);
    let (body, bytes) = body_with_workdir(&ws, "wd-retry");
    let (status, lines, err) = dispatch(&runner.url, &body).await;
    assert_eq!(status, 200, "{err}");
    assert_well_formed(&lines);
    let out = shell_results(&lines)
        .first()
        .map(|r| r["stdout"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default();
    assert_eq!(out.as_bytes(), bytes.as_slice(), "{lines:?}");
    assert_eq!(ws.blob_requests(), 3, "two refusals, then the blob");

    // Refused every time: a bounded number of tries, then a clear refusal.
    ws.fail_blobs(1_000);
    let before = ws.blob_requests();
    let (body, _) = body_with_workdir(&ws, "wd-gone");
    let (status, _, err) = dispatch(&runner.url, &body).await;
    assert_eq!(status, 502, "{err}");
    let problem: serde_json::Value = serde_json::from_str(&err).unwrap();
    assert_eq!(problem["code"], "workdir_unavailable", "{problem}");
    let tries = ws.blob_requests() - before;
    assert!((2..=10).contains(&tries), "bounded tries: {tries}");

    // A blob the workspace does not have (`404`) is not asked for again.
    ws.fail_blobs(0);
    let (mut body, _) = body_with_workdir(&ws, "wd-missing");
    body["workdir"]["restore"]["entries"][0]["sha256"] = json!("ab".repeat(32));
    let before = ws.blob_requests();
    let (status, _, err) = dispatch(&runner.url, &body).await;
    assert_eq!(status, 502, "{err}");
    assert_eq!(ws.blob_requests() - before, 1);
    runner.assert_clean().await;
}
