//! The file tools stay inside the working directory.

use asbx_protocol::line::StepStatus;
use serde_json::json;

use crate::harness::{Harness, script};

#[tokio::test]
async fn escapes_and_symlinks_are_refused() {
    let h = Harness::scripted(&script(json!([
        {"tool": "read_file", "args": {"path": "../secret.txt"}},
        {"tool": "read_file", "args": {"path": "a/../../secret.txt"}},
        {"tool": "read_file", "args": {"path": "/etc/hostname"}},
        {"tool": "write_file", "args": {"path": "../escaped.txt", "content": "x"}},
        {"tool": "read_file", "args": {"path": "link-dir/secret.txt"}},
        {"tool": "write_file", "args": {"path": "link-dir/planted.txt", "content": "x"}},
        {"tool": "read_file", "args": {"path": "link-file"}},
        {"tool": "write_file", "args": {"path": "link-file", "content": "x"}},
        {"tool": "list_files", "args": {"path": "link-dir"}},
        {"tool": "list_files", "args": {"path": ".."}},
        {"say": "done"}
    ])));
    let outside = h.dir.path().to_path_buf();
    std::fs::write(outside.join("secret.txt"), "top secret").unwrap();
    std::os::unix::fs::symlink(&outside, h.workdir.join("link-dir")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), h.workdir.join("link-file")).unwrap();
    let o = h.run().await;
    assert_eq!(o.result(), "done");
    let steps = o.finished_steps();
    assert_eq!(steps.len(), 10);
    for s in &steps {
        assert_eq!(s.status, StepStatus::Failed, "{s:?}");
        assert!(!format!("{s:?}").contains("top secret"));
    }
    assert!(steps[0].error.as_ref().unwrap().contains("escapes"));
    assert!(steps[2].error.as_ref().unwrap().contains("outside"));
    assert!(steps[4].error.as_ref().unwrap().contains("symlink"));
    assert!(!outside.join("escaped.txt").exists());
    assert!(!outside.join("planted.txt").exists());
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
        "top secret"
    );
}

#[tokio::test]
async fn inside_paths_work_including_absolute_ones() {
    let h = Harness::scripted("placeholder");
    let abs = h.workdir.join("deep/er/f.txt").display().to_string();
    let mut h = h;
    h.prompt = script(json!([
        {"tool": "write_file", "args": {"path": abs, "content": "one"}},
        {"tool": "read_file", "args": {"path": "deep/./er/../er/f.txt"}},
        {"tool": "list_files", "args": {"path": "deep"}},
        {"tool": "list_files", "args": {}},
        {"say": "done"}
    ]));
    let o = h.run().await;
    let steps = o.finished_steps();
    assert!(
        steps.iter().all(|s| s.status == StepStatus::Succeeded),
        "{steps:?}"
    );
    assert_eq!(steps[1].result.as_ref().unwrap(), &json!("one"));
    assert_eq!(steps[2].result.as_ref().unwrap(), &json!("er/"));
    assert_eq!(steps[3].result.as_ref().unwrap(), &json!("deep/"));
    assert_eq!(
        std::fs::read_to_string(o.workdir.join("deep/er/f.txt")).unwrap(),
        "one"
    );
}

#[tokio::test]
async fn write_to_a_fifo_fails_instead_of_blocking() {
    let h = Harness::scripted(&script(json!([
        {"tool": "shell", "args": {"command": "mkfifo pipe"}},
        {"tool": "write_file", "args": {"path": "pipe", "content": "x"}},
        {"tool": "read_file", "args": {"path": "pipe"}},
        {"say": "done"}
    ])));
    let o = h.run().await;
    assert_eq!(o.result(), "done");
    let steps = o.finished_steps();
    assert_eq!(steps[1].status, StepStatus::Failed, "{:?}", steps[1]);
    assert_eq!(steps[2].status, StepStatus::Failed, "{:?}", steps[2]);
}
