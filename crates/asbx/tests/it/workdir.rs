//! A chat's working directory lives on between turns (CONTRACT §11),
//! through the real `asbx up` in the jail the host allows (strict where it
//! can): what turn 1 wrote, turn 2 finds byte for byte, and so does a run
//! of `POST /api/runs` from the chat (which keeps nothing); a symlink to
//! `/etc/shadow` comes back as a link and reads nothing of the host's; a
//! hostile turn's 20,000 files are refused while its answer is kept and
//! the turn before it stays; a fork after turn 1 finds turn 1's files;
//! `workdir.tar` lists them; deleting the chat frees its blobs. On
//! PostgreSQL, a second workspace node restores what the first kept after
//! the first is killed.

use std::time::Duration;

use asbx_protocol::sse::Parser;
use serde_json::{Value, json};

use crate::harness::*;

/// One settled turn: its chat, the output of its shell steps, its answer
/// and how it ended.
struct Settled {
    chat_id: String,
    stdout: String,
    answer: String,
    status: String,
}

async fn turn(url: &str, chat_id: Option<&str>, command: &str, say: &str) -> Settled {
    let mut body = json!({ "message": script(json!([
        {"tool": "shell", "args": {"command": command}},
        {"say": say}
    ])) });
    if let Some(id) = chat_id {
        body["chatId"] = json!(id);
    }
    let res = reqwest::Client::new()
        .post(format!("{url}/api/assistant/chat/stream"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let chat_id = res.headers()["x-asbx-chat-id"].to_str().unwrap().to_owned();
    let text = tokio::time::timeout(Duration::from_secs(240), res.bytes())
        .await
        .expect("the turn went on too long")
        .unwrap();
    let mut out = Settled {
        chat_id,
        stdout: String::new(),
        answer: String::new(),
        status: String::new(),
    };
    for event in Parser::new().push(&text) {
        let data: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
        match event.event.as_str() {
            "stdout" => out.stdout.push_str(data["chunk"].as_str().unwrap_or("")),
            "result" => out.answer = data["message"].as_str().unwrap_or("").to_owned(),
            "done" => out.status = data["status"].as_str().unwrap_or("").to_owned(),
            _ => {}
        }
    }
    out
}

/// A run of `command` (`POST /api/runs`) starting from `chat`'s kept
/// directory: its NDJSON, read to the end.
async fn run_from(url: &str, chat: &str, command: &str) -> String {
    let res = reqwest::Client::new()
        .post(format!("{url}/api/runs"))
        .json(&json!({
            "prompt": script(json!([
                {"tool": "shell", "args": {"command": command}},
                {"say": "ran"}
            ])),
            "workdir": {"from": chat}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    tokio::time::timeout(Duration::from_secs(240), res.text())
        .await
        .expect("the run went on too long")
        .unwrap()
}

/// The `sha256sum` line's hash of `name` in `out`.
fn sum_of<'a>(out: &'a str, name: &str) -> &'a str {
    out.lines()
        .find(|l| l.ends_with(&format!("  {name}")))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no sum of {name} in {out:?}"))
}

async fn chat_detail(url: &str, chat_id: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{url}/api/assistant/chats/{chat_id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn workdir_tar(base: &str, chat_id: &str, after: Option<&str>) -> Vec<u8> {
    let mut url = format!("{base}/api/assistant/chats/{chat_id}/workdir.tar");
    if let Some(m) = after {
        url.push_str(&format!("?afterMessageId={m}"));
    }
    let res = reqwest::get(url).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "application/x-tar");
    res.bytes().await.unwrap().to_vec()
}

/// The names `tar -t` reads in an archive (the host's tar, when there is one).
fn tar_list(archive: &[u8]) -> Vec<String> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("tar")
        .args(["-tf", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("tar");
    child.stdin.take().unwrap().write_all(archive).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "tar -t failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_chats_files_live_on_between_turns_and_hostile_ones_are_bounded() {
    let up = UpProc::start(&[]);
    let folder = up.data.path().join("workspace/blobs");
    let stored = move |sha: &str| folder.join(&sha[..2]).join(&sha[2..]).exists();
    lives_on(&up.url, &up.url, &mut || {}, &stored).await;
}

/// The same on PostgreSQL, the blobs in the database.
#[tokio::test]
async fn a_chats_files_live_on_with_postgresql() {
    let Ok(server) = std::env::var("ASBX_TEST_PG_URL") else {
        asbx_test_support::skip(
            "a_chats_files_live_on_with_postgresql",
            "ASBX_TEST_PG_URL is not set",
        );
        return;
    };
    let db = PgDatabase::create(&server, "workdir");
    let port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let listen = [
        format!("127.0.0.1:{}", port()),
        format!("127.0.0.1:{}", port()),
    ];
    let public = listen.clone().map(|l| format!("http://{l}"));
    let token = hex::encode(rand::random::<[u8; 16]>());
    let origins = public.join(",");
    let runner = RunnerProc::start(&[
        ("ASBX_RUNNER_TOKEN", token.as_str()),
        ("ASBX_WORKSPACE_ORIGINS", origins.as_str()),
    ]);
    let node = |i: usize| {
        WorkspaceProc::start(
            &listen[i],
            &[
                ("DATABASE_URL", db.url.as_str()),
                ("ASBX_SECRET_KEY", crate::harness::TEST_SECRET_KEY),
                ("SANDBOX_URL", runner.url.as_str()),
                ("ASBX_RUNNER_TOKEN", token.as_str()),
                ("ASBX_PUBLIC_URL", public[i].as_str()),
            ],
        )
    };
    let mut a = node(0);
    let b = node(1);
    let stored = |sha: &str| {
        db.query(&format!(
            "SELECT COUNT(*) FROM blobs WHERE sha256 = '{sha}' AND complete = 1"
        ))
        .trim()
            == "1"
    };
    // Turn 1 on node a, which then dies; node b restores what it kept.
    lives_on(&a.url.clone(), &b.url, &mut || a.kill(), &stored).await;
}

/// Turn 1 through `first`, then `between`, the rest through `url`.
async fn lives_on(
    first: &str,
    url: &str,
    between: &mut dyn FnMut(),
    stored: &dyn Fn(&str) -> bool,
) {
    // Turn 1: a repository, a source file, 5 MB of noise, a link out.
    let first_url = first;
    let first = turn(
        first_url,
        None,
        "if command -v git >/dev/null; then git init -q . && echo GIT_INIT; else echo NO_GIT; fi; \
         mkdir -p src && printf 'print(1)\\n' > src/a.py && \
         head -c 5242880 /dev/urandom > big.bin && ln -s /etc/shadow shadow && \
         sha256sum big.bin src/a.py",
        "made",
    )
    .await;
    assert_eq!(first.status, "succeeded", "{}", first.stdout);
    let has_git = first.stdout.contains("GIT_INIT");
    if !has_git {
        asbx_test_support::skip(
            "a_chats_files_live_on_between_turns_and_hostile_ones_are_bounded (git part)",
            "git is not installed in the sandbox",
        );
    }
    let big = sum_of(&first.stdout, "big.bin").to_owned();
    let a1 = sum_of(&first.stdout, "src/a.py").to_owned();
    let chat = first.chat_id.clone();
    // Stored once, in the workspace's blob store.
    assert!(stored(&big), "big.bin's blob is stored");
    between();

    // Turn 2: a fresh sandbox finds them byte for byte, and edits one.
    let second = turn(
        url,
        Some(&chat),
        "sha256sum big.bin src/a.py; echo LINK=$(readlink shadow); \
         cat shadow >/dev/null 2>&1 && echo SHADOW_READ || echo SHADOW_UNREADABLE; \
         test -f .git/HEAD && echo HAS_GIT; printf 'print(2)\\n' > src/a.py; \
         test -s .skills/asbx_files/SKILL.md && echo SKILL_WHOLE",
        "edited",
    )
    .await;
    assert_eq!(second.status, "succeeded", "{}", second.stdout);
    assert_eq!(sum_of(&second.stdout, "big.bin"), big);
    assert_eq!(sum_of(&second.stdout, "src/a.py"), a1);
    assert!(
        second.stdout.contains("LINK=/etc/shadow"),
        "{}",
        second.stdout
    );
    assert!(
        second.stdout.contains("SHADOW_UNREADABLE"),
        "{}",
        second.stdout
    );
    if has_git {
        assert!(second.stdout.contains("HAS_GIT"), "{}", second.stdout);
    }
    // The agent installed its skill afresh: `.skills` is not kept, so
    // turn 1's copy (the tool user's) did not stand in its way.
    assert!(second.stdout.contains("SKILL_WHOLE"), "{}", second.stdout);

    // A run from the chat starts in its latest directory and keeps
    // nothing back (`run.txt` is gone in the turns after it).
    let ran = run_from(
        url,
        &chat,
        "cat src/a.py; sha256sum big.bin; echo RUN_WROTE > run.txt",
    )
    .await;
    assert!(ran.contains("print(2)"), "{ran}");
    assert!(ran.contains(&big), "{ran}");

    // A fork after turn 1 finds turn 1's files, not turn 2's.
    let messages = chat_detail(url, &chat).await["messages"].clone();
    let after_first = messages
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "assistant")
        .expect("turn 1's answer")["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let res = reqwest::Client::new()
        .post(format!("{url}/api/assistant/chats/{chat}/fork"))
        .json(&json!({ "afterMessageId": after_first }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let fork: Value = res.json().await.unwrap();
    let fork_id = fork["id"].as_str().unwrap().to_owned();
    assert_ne!(fork_id, chat);
    let forked = chat_detail(url, &fork_id).await;
    assert_eq!(forked["messages"].as_array().unwrap().len(), 2, "{forked}");
    assert_eq!(forked["forkedFrom"], chat.as_str(), "{forked}");
    let in_fork = turn(
        url,
        Some(&fork_id),
        "cat src/a.py; sha256sum big.bin",
        "forked",
    )
    .await;
    assert!(in_fork.stdout.contains("print(1)"), "{}", in_fork.stdout);
    assert!(!in_fork.stdout.contains("print(2)"), "{}", in_fork.stdout);
    assert_eq!(sum_of(&in_fork.stdout, "big.bin"), big);

    // The latest directory as a tar archive lists the files; turn 1's
    // holds turn 1's bytes.
    let tar = workdir_tar(url, &chat, None).await;
    let listing = tar_list(&tar);
    for name in [".git/", "src/", "src/a.py", "big.bin", "shadow"] {
        assert!(listing.contains(&name.to_owned()), "{name} in {listing:?}");
    }
    assert!(
        !listing.iter().any(|n| n.starts_with(".skills")),
        "{listing:?}"
    );
    let first_tar = tar_list(&workdir_tar(url, &chat, Some(&after_first)).await);
    assert!(first_tar.contains(&"src/a.py".to_owned()), "{first_tar:?}");

    // Turn 3: a hostile turn makes 20,000 files; the answer is kept, the
    // directory is not (the edit of turn 2 stays).
    let hostile = turn(
        url,
        Some(&chat),
        "cat src/a.py; mkdir many && cd many && seq 1 20000 | xargs touch && echo MADE",
        "kept anyway",
    )
    .await;
    assert_eq!(hostile.status, "succeeded", "{}", hostile.stdout);
    assert_eq!(hostile.answer, "kept anyway");
    assert!(hostile.stdout.contains("print(2)"), "{}", hostile.stdout);
    assert!(hostile.stdout.contains("MADE"), "{}", hostile.stdout);

    let after = turn(
        url,
        Some(&chat),
        "cat src/a.py; test -e many && echo MANY_KEPT || echo MANY_GONE; \
         test -e run.txt && echo RUN_KEPT || echo RUN_NOT_KEPT",
        "checked",
    )
    .await;
    assert!(after.stdout.contains("print(2)"), "{}", after.stdout);
    assert!(after.stdout.contains("MANY_GONE"), "{}", after.stdout);
    assert!(after.stdout.contains("RUN_NOT_KEPT"), "{}", after.stdout);
    // The refusal is told, with its reason.
    let kept: Value = reqwest::Client::new()
        .get(format!("{url}/api/assistant/chats/{chat}/workdir"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let refused: Vec<&Value> = kept["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["status"] == "refused")
        .collect();
    assert_eq!(refused.len(), 1, "{kept}");
    assert!(
        refused[0]["error"]
            .as_str()
            .unwrap()
            .contains("more than 10000 entries"),
        "{kept}"
    );

    // Deleting the chat (and its fork, which shares them) frees its blobs.
    let res = reqwest::Client::new()
        .delete(format!("{url}/api/assistant/chats/{fork_id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    assert!(stored(&big), "still named by the chat");
    let res = reqwest::Client::new()
        .delete(format!("{url}/api/assistant/chats/{chat}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    assert!(!stored(&big), "big.bin's blob is freed");
}
