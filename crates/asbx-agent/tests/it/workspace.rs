//! The in-sandbox workspace API from the agent's side: attachments fetched
//! and checked before the setup script, the workspace tools and the
//! `asbx_files` skill, and writeback that is never lost silently.

use asbx_protocol::Event;
use asbx_protocol::callback::{AttachmentRef, RunLimits, WorkspaceAccess};
use asbx_test_support::{FakeFile, FakeWorkspaceApi};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::harness::{Harness, script};

const TOKEN: &str = "asbx_ws_test";

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// Deterministic bytes that are not all alike (so a shifted chunk shows).
fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn file(id: &str, path: &str, content: Vec<u8>) -> FakeFile {
    FakeFile {
        id: id.into(),
        path: path.into(),
        mime_type: "application/octet-stream".into(),
        sha256: sha(&content),
        content,
    }
}

fn attachment(f: &FakeFile, path: &str) -> AttachmentRef {
    AttachmentRef {
        id: f.id.clone(),
        path: path.into(),
        size: f.content.len() as u64,
        sha256: f.sha256.clone(),
        mime_type: f.mime_type.clone(),
    }
}

/// A scripted harness with workspace access to `files`, the attachments
/// `attachments` and `setup` as setup script.
fn with_workspace(
    prompt: &str,
    files: Vec<FakeFile>,
    attachments: Vec<AttachmentRef>,
    setup: Option<&str>,
) -> Harness {
    let mut h = Harness::scripted(prompt);
    h.gw.workspace = Some(FakeWorkspaceApi {
        token: TOKEN.into(),
        files,
        history: vec![
            ("user".into(), "first question".into()),
            ("assistant".into(), "first answer".into()),
            ("user".into(), "second question".into()),
        ],
    });
    h.gw.env.workspace = Some(WorkspaceAccess {
        token: TOKEN.into(),
        attachments,
    });
    h.gw.env.setup_script = setup.map(str::to_owned);
    h
}

#[tokio::test]
async fn attachments_of_30_b_5_mb_and_16_mib_arrive_byte_exact_before_the_setup_script() {
    let small = file(
        "f_small",
        "notes.txt",
        b"thirty bytes of attached text!".to_vec(),
    );
    let mid = file("f_mid", "data.bin", bytes(5_000_000, 1));
    let big = file("f_big", "big.bin", bytes(16 << 20, 2));
    let atts = vec![
        attachment(&small, "attachments/notes.txt"),
        attachment(&mid, "attachments/data.bin"),
        attachment(&big, "attachments/deep/big.bin"),
    ];
    let h = with_workspace(
        &script(json!([
            {"tool": "shell", "args": {"command": "cat setup.txt; sha256sum attachments/notes.txt attachments/data.bin attachments/deep/big.bin"}},
            {"say": "checked"}
        ])),
        vec![small.clone(), mid.clone(), big.clone()],
        atts,
        // The setup script sees the files already there.
        Some("sha256sum attachments/notes.txt > setup.txt"),
    );
    let o = h.run().await;
    assert_eq!(o.result(), "checked", "{:#?}", o.events);
    for f in [&small, &mid, &big] {
        let on_disk = std::fs::read(o.workdir.join("attachments").join(match f.id.as_str() {
            "f_small" => "notes.txt",
            "f_mid" => "data.bin",
            _ => "deep/big.bin",
        }))
        .unwrap();
        assert!(on_disk == f.content, "{} differs", f.id);
    }
    let out = o.finished_steps()[0].result.as_ref().unwrap()["stdout"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        out.starts_with(&format!("{}  attachments/notes.txt", small.sha256)),
        "the setup script ran after the fetch: {out}"
    );
    for f in [&small, &mid, &big] {
        assert!(out.contains(&f.sha256), "{out}");
    }
    assert_eq!(
        o.gateway.workspace_requests(),
        vec![
            ("GET".into(), "/workspace/files/f_small".into(), 200),
            ("GET".into(), "/workspace/files/f_mid".into(), 200),
            ("GET".into(), "/workspace/files/f_big".into(), 200),
        ]
    );
    assert!(
        o.events.iter().any(
            |e| matches!(e, Event::Log(l) if l.message.starts_with("fetched 3 attachment(s)"))
        )
    );
}

#[tokio::test]
async fn a_bad_attachment_stops_the_turn_before_the_setup_script() {
    let f = file("f_1", "a.txt", b"the real content".to_vec());
    let cases: Vec<(&str, AttachmentRef, &str)> = vec![
        (
            "wrong hash",
            AttachmentRef {
                sha256: sha(b"something else"),
                ..attachment(&f, "attachments/a.txt")
            },
            "does not match",
        ),
        (
            "declared larger",
            AttachmentRef {
                size: 999,
                ..attachment(&f, "attachments/a.txt")
            },
            "999 declared",
        ),
        (
            "declared smaller",
            AttachmentRef {
                size: 3,
                ..attachment(&f, "attachments/a.txt")
            },
            "more than the 3 bytes",
        ),
        (
            "unknown id",
            AttachmentRef {
                id: "f_other".into(),
                ..attachment(&f, "attachments/a.txt")
            },
            "404",
        ),
        (
            "escaping path",
            attachment(&f, "../escaped.txt"),
            "must not contain ..",
        ),
        ("absolute path", attachment(&f, "/tmp/x.txt"), "relative"),
    ];
    for (what, att, needle) in cases {
        let h = with_workspace(
            &script(json!([{"say": "never"}])),
            vec![f.clone()],
            vec![att],
            Some("touch setup-ran"),
        );
        let o = h.run().await;
        let (code, msg) = o.error();
        assert_eq!(code, "attachment_failed", "{what}: {msg}");
        assert!(msg.contains(needle), "{what}: {msg}");
        assert!(
            !o.workdir.join("setup-ran").exists(),
            "{what}: the setup script ran"
        );
        assert!(
            !o.workdir.join("attachments/a.txt").exists(),
            "{what}: a bad file was left behind"
        );
        assert!(
            !o.workdir.parent().unwrap().join("escaped.txt").exists(),
            "{what}"
        );
    }
    // Positive control: the same file, declared right, passes.
    let h = with_workspace(
        &script(json!([{"say": "fine"}])),
        vec![f.clone()],
        vec![attachment(&f, "attachments/a.txt")],
        Some("touch setup-ran"),
    );
    let o = h.run().await;
    assert_eq!(o.result(), "fine");
    assert!(o.workdir.join("setup-ran").exists());
    assert_eq!(
        std::fs::read(o.workdir.join("attachments/a.txt")).unwrap(),
        f.content
    );
}

#[tokio::test]
async fn the_workspace_tools_list_read_save_create_and_read_history() {
    let text = file("f_text", "report.md", b"# Report\nall good\n".to_vec());
    let bin = file("f_bin", "img.bin", bytes(200_000, 3));
    let h = with_workspace(
        &script(json!([
            {"tool": "workspace_list_files", "args": {}},
            {"tool": "workspace_read_file", "args": {"id": "f_text"}},
            {"tool": "workspace_read_file", "args": {"id": "f_bin", "saveAs": "in/img.bin"}},
            {"tool": "workspace_create_file", "args": {"path": "summary.txt", "content": "short summary"}},
            {"tool": "shell", "args": {"command": "head -c 70000 /dev/zero | tr '\\0' b > big.txt"}},
            {"tool": "workspace_create_file", "args": {"path": "reports/big text.txt", "fromPath": "big.txt", "mimeType": "text/x-big"}},
            {"tool": "chat_history", "args": {"limit": 2}},
            {"tool": "workspace_read_file", "args": {"id": "f_nope"}},
            {"tool": "workspace_create_file", "args": {"path": "x.txt", "content": "a", "fromPath": "big.txt"}},
            {"tool": "workspace_create_file", "args": {"path": "../x.txt", "content": "a"}},
            {"tool": "workspace_read_file", "args": {"id": "../callback/env"}},
            {"tool": "workspace_create_file", "args": {"path": "p.txt", "fromPath": "/etc/passwd"}},
            {"tool": "workspace_read_file", "args": {"id": "f_text", "saveAs": "../../escaped.md"}},
            {"say": "done"}
        ])),
        vec![text.clone(), bin.clone()],
        vec![],
        None,
    );
    let o = h.run().await;
    assert_eq!(o.result(), "done", "{:#?}", o.events);
    let steps = o.finished_steps();
    let names: Vec<_> = steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "workspace_list_files",
            "workspace_read_file",
            "workspace_read_file",
            "workspace_create_file",
            "shell",
            "workspace_create_file",
            "chat_history",
            "workspace_read_file",
            "workspace_create_file",
            "workspace_create_file",
            "workspace_read_file",
            "workspace_create_file",
            "workspace_read_file",
        ]
    );
    let ok = |i: usize| {
        steps[i]
            .result
            .clone()
            .unwrap_or_else(|| panic!("{:?}", steps[i]))
    };
    let listed = ok(0).as_str().unwrap().to_owned();
    assert!(
        listed.contains("\"f_text\"") && listed.contains("\"f_bin\""),
        "{listed}"
    );
    assert_eq!(ok(1), json!("# Report\nall good\n"));
    assert_eq!(ok(2)["bytes"], 200_000);
    assert_eq!(ok(2)["sha256"], bin.sha256.as_str());
    assert!(std::fs::read(o.workdir.join("in/img.bin")).unwrap() == bin.content);
    assert_eq!(ok(3)["path"], "summary.txt");
    assert_eq!(ok(3)["size"], 13);
    assert_eq!(ok(5)["size"], 70_000);
    assert_eq!(
        ok(6),
        json!("assistant: first answer\n\nuser: second question")
    );
    for (i, needle) in [
        (7, "404"),
        (8, "exactly one of"),
        (9, "must not contain .."),
        (10, "not a file id"),
        (11, "must be relative"),
        (12, "must not contain .."),
    ] {
        let err = steps[i]
            .error
            .as_deref()
            .unwrap_or_else(|| panic!("{:?}", steps[i]));
        assert!(err.contains(needle), "step {i}: {err}");
    }
    let created = o.gateway.created_files();
    assert_eq!(created.len(), 2);
    assert_eq!(created[0].path, "summary.txt");
    assert_eq!(created[0].mime_type, "text/plain");
    assert_eq!(created[0].content, b"short summary");
    assert_eq!(created[1].path, "reports/big text.txt");
    assert_eq!(created[1].mime_type, "text/x-big");
    assert!(created[1].content == vec![b'b'; 70_000]);
    // The skill that explains them is installed.
    let skill = std::fs::read_to_string(o.workdir.join(".skills/asbx_files/SKILL.md")).unwrap();
    assert!(skill.contains("workspace_create_file"), "{skill}");
    // Nothing reached the workspace API that the gateway would refuse.
    assert!(
        o.gateway
            .workspace_requests()
            .iter()
            .all(|(_, p, _)| !p.contains("..")),
        "{:?}",
        o.gateway.workspace_requests()
    );
}

#[tokio::test]
async fn reading_a_big_file_as_text_is_cut_at_the_tool_output_limit() {
    let big = file("f_big", "big.txt", vec![b'x'; 3_000_000]);
    let mut h = with_workspace(
        &script(json!([
            {"tool": "workspace_read_file", "args": {"id": "f_big"}},
            {"say": "done"}
        ])),
        vec![big],
        vec![],
        None,
    );
    h.limits(RunLimits {
        tool_output_bytes: Some(1000),
        ..Default::default()
    });
    let o = h.run().await;
    assert_eq!(o.result(), "done");
    let shown = o.finished_steps()[0].result.clone().unwrap();
    let shown = shown.as_str().unwrap();
    assert!(shown.ends_with("…[truncated 2999000 bytes]"), "{shown}");
}

#[tokio::test]
async fn without_workspace_access_there_are_no_workspace_tools_and_no_skill() {
    let o = Harness::scripted(&script(json!([
        {"tool": "workspace_list_files", "args": {}},
        {"say": "done"}
    ])))
    .run()
    .await;
    assert_eq!(o.result(), "done");
    let err = o.finished_steps()[0].error.clone().unwrap();
    assert!(err.contains("unknown tool"), "{err}");
    assert!(!o.workdir.join(".skills/asbx_files").exists());
}

#[tokio::test]
async fn a_token_the_workspace_refuses_is_a_tool_error() {
    let mut h = with_workspace(
        &script(json!([
            {"tool": "workspace_list_files", "args": {}},
            {"say": "done"}
        ])),
        vec![],
        vec![],
        None,
    );
    h.gw.workspace.as_mut().unwrap().token = "asbx_ws_other".into();
    let o = h.run().await;
    assert_eq!(o.result(), "done");
    let err = o.finished_steps()[0].error.clone().unwrap();
    assert!(err.contains("refused this session's token"), "{err}");
}

#[tokio::test]
async fn files_written_before_a_loop_error_are_still_written_back() {
    let write =
        json!({"tool": "write_file", "args": {"path": "out/partial.txt", "content": "kept"}});
    let cases: Vec<(&str, serde_json::Value, Option<RunLimits>)> = vec![
        (
            "model_error",
            json!([write, {"fail": "the model fell over"}]),
            None,
        ),
        (
            "step_limit_exceeded",
            json!([write, {"tool": "list_files", "args": {"path": "."}}, {"say": "never"}]),
            Some(RunLimits {
                max_steps: Some(2),
                ..Default::default()
            }),
        ),
        (
            "tool_limit_exceeded",
            json!([write, {"tool": "list_files", "args": {"path": "."}}, {"say": "never"}]),
            Some(RunLimits {
                max_tool_calls: Some(1),
                ..Default::default()
            }),
        ),
        (
            "duration_limit_exceeded",
            json!([write, {"tool": "shell", "args": {"command": "sleep 30"}}, {"say": "never"}]),
            Some(RunLimits {
                max_duration_ms: Some(1500),
                ..Default::default()
            }),
        ),
    ];
    for (code, steps, limits) in cases {
        let mut h = Harness::scripted(&script(steps));
        if let Some(l) = limits {
            h.limits(l);
        }
        let o = h.run().await;
        assert_eq!(o.error().0, code, "{:#?}", o.events);
        let results = o.gateway.results();
        assert_eq!(results.len(), 1, "{code}: written back");
        assert_eq!(results[0].files[0].path, "partial.txt", "{code}");
    }
}

#[tokio::test]
async fn a_failed_writeback_is_an_error_line() {
    // The upload token is refused: the answer is lost for the user's files,
    // so the turn ends with writeback_failed, not result.
    let mut h = Harness::scripted(&script(json!([
        {"tool": "write_file", "args": {"path": "out/a.txt", "content": "a"}},
        {"say": "all done"}
    ])));
    h.otp_upload = Some("otp-wrong".into());
    let o = h.run().await;
    let (code, msg) = o.error();
    assert_eq!(code, "writeback_failed");
    assert!(msg.contains("1 file(s) of out/ not stored"), "{msg}");
    assert!(msg.contains("401"), "{msg}");

    // A loop error keeps its code; the writeback failure is in its message.
    let mut h = Harness::scripted(&script(json!([
        {"tool": "write_file", "args": {"path": "out/a.txt", "content": "a"}},
        {"fail": "the model fell over"}
    ])));
    h.otp_upload = Some("otp-wrong".into());
    let o = h.run().await;
    let (code, msg) = o.error();
    assert_eq!(code, "model_error");
    assert!(
        msg.contains("the model fell over") && msg.contains("the writeback failed"),
        "{msg}"
    );

    // Positive control: the right token, a result.
    let o = Harness::scripted(&script(json!([
        {"tool": "write_file", "args": {"path": "out/a.txt", "content": "a"}},
        {"say": "all done"}
    ])))
    .run()
    .await;
    assert_eq!(o.result(), "all done");
    assert_eq!(o.gateway.results().len(), 1);
}
