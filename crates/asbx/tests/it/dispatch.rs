//! `POST /stream` end to end (issue 2): a full turn, tokens, bad requests,
//! crashes, disconnects and the runtime cap.

use std::time::{Duration, Instant};

use asbx_protocol::callback::EnvResponse;
use asbx_protocol::{Event, Line, LineDecoder, LogLevel, StepStatus};
use base64::Engine;
use futures::StreamExt;
use serde_json::json;

use crate::harness::*;

#[tokio::test]
async fn full_turn_runs_a_shell_step_and_writes_files_back() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("full"));
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "mkdir -p out/sub && echo report > out/sub/report.txt && echo hello"}},
        {"say": "all done"}
    ]));
    let (status, lines, _) = dispatch(&runner.url, &ws.body(&t, &prompt)).await;
    assert_eq!(status, 200);
    assert_well_formed(&lines);
    assert!(matches!(&lines[0].event, Event::Log(l) if l.level == LogLevel::Info));
    assert_eq!(lines[0].session_id, t.session);
    assert_eq!(
        steps(&lines),
        vec![
            ("shell", StepStatus::Running),
            ("shell", StepStatus::Succeeded)
        ]
    );
    let step_result = lines
        .iter()
        .find_map(|l| match &l.event {
            Event::Step(s) if s.status == StepStatus::Succeeded => s.result.clone(),
            _ => None,
        })
        .expect("step result");
    assert!(step_result.to_string().contains("hello"), "{step_result}");
    assert!(matches!(terminal(&lines), Event::Result(r) if r.message == "all done"));

    let results = ws.seen(|s| s.results.clone());
    assert_eq!(results.len(), 1, "one writeback");
    let f = &results[0].files;
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].path, "sub/report.txt");
    let content = base64::engine::general_purpose::STANDARD
        .decode(&f[0].content_base64)
        .unwrap();
    assert_eq!(content, b"report\n");
    runner.assert_clean().await;
}

#[tokio::test]
async fn environment_variables_and_setup_script_run_before_the_model() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    ws.set_env(EnvResponse {
        variables: [("GREETING".to_owned(), "bonjour".to_owned())].into(),
        setup_script: Some("echo \"$GREETING\" > setup-ran.txt".to_owned()),
        ..Default::default()
    });
    let t = ws.mint(&session_id("setup"));
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": "cat setup-ran.txt; echo \"var=$GREETING\""}},
        {"say": "ok"}
    ]));
    let (_, lines, _) = dispatch(&runner.url, &ws.body(&t, &prompt)).await;
    assert_well_formed(&lines);
    let all = serde_json::to_string(&lines).unwrap();
    assert!(
        all.contains("bonjour") && all.contains("var=bonjour"),
        "{all}"
    );
    runner.assert_clean().await;
}

#[tokio::test]
async fn failing_setup_script_ends_with_setup_failed() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    ws.set_env(EnvResponse {
        setup_script: Some("echo broken >&2; exit 3".into()),
        ..Default::default()
    });
    let t = ws.mint(&session_id("setupfail"));
    let (_, lines, _) = dispatch(&runner.url, &ws.body(&t, &script(json!([{"say": "x"}])))).await;
    assert_well_formed(&lines);
    assert!(
        matches!(terminal(&lines), Event::Error(e) if e.code == "setup_failed"),
        "{lines:?}"
    );
    runner.assert_clean().await;
}

#[tokio::test]
async fn a_replayed_token_gives_otp_rejected() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("replay"));
    let body = ws.body(&t, &script(json!([{"say": "first"}])));
    let (_, first, _) = dispatch(&runner.url, &body).await;
    assert!(matches!(terminal(&first), Event::Result(_)));
    let config_calls = ws.seen(|s| s.config_calls);

    let mut replay = body.clone();
    replay["session_id"] = json!(session_id("replay2"));
    let (_, second, _) = dispatch(&runner.url, &replay).await;
    assert_well_formed(&second);
    assert!(
        matches!(terminal(&second), Event::Error(e) if e.code == "otp_rejected"),
        "{second:?}"
    );
    assert!(steps(&second).is_empty(), "nothing ran");
    assert_eq!(
        ws.seen(|s| s.config_calls),
        config_calls,
        "the run token was never redeemed"
    );
    assert!(ws.seen(|s| s.rejected) >= 1);
    runner.assert_clean().await;
}

#[tokio::test]
async fn invalid_requests_get_problem_json_naming_every_bad_field() {
    let runner = RunnerProc::start(&[]);
    let client = reqwest::Client::new();
    let cases: Vec<(String, Vec<&str>)> = vec![
        (
            json!({"prompt": ""}).to_string(),
            vec!["agent_url", "otp_setup", "otp_run", "prompt"],
        ),
        (
            json!({"agent_url": "file:///etc/passwd", "otp_setup": "a", "otp_run": "b",
                   "prompt": "x", "protocol": 7, "surprise": true})
            .to_string(),
            vec!["agent_url", "protocol", "surprise"],
        ),
        ("{not json".to_owned(), vec![""]),
        ("[1,2,3]".to_owned(), vec![""]),
    ];
    for (body, fields) in cases {
        let res = client
            .post(format!("{}/stream", runner.url))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 400, "{body}");
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        let p: serde_json::Value = res.json().await.unwrap();
        assert_eq!(p["code"], "invalid_request");
        let named: Vec<&str> = p["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["field"].as_str().unwrap())
            .collect();
        for f in fields {
            assert!(named.contains(&f), "{f} not named in {p}");
        }
    }
    let huge = "x".repeat(3 << 20);
    let res = client
        .post(format!("{}/stream", runner.url))
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 413);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    runner.assert_clean().await;
}

#[tokio::test]
async fn a_taken_session_id_gets_409() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("taken"));
    let body = ws.body(&t, &script(json!([{"sleep_ms": 3000}, {"say": "late"}])));
    let first = post_stream(&runner.url, &body).await;
    assert_eq!(first.status(), 200);
    let second = post_stream(&runner.url, &body).await;
    assert_eq!(second.status(), 409);
    let p: serde_json::Value = second.json().await.unwrap();
    assert_eq!(p["code"], "session_exists");
    drop(first);
    runner.assert_clean().await;
}

#[tokio::test]
async fn an_agent_that_crashes_gives_sandbox_crashed_with_its_exit_code() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("crash"));
    let (_, lines, _) = dispatch(&runner.url, &ws.body(&t, &script(json!([{"crash": 7}])))).await;
    assert_well_formed(&lines);
    match terminal(&lines) {
        Event::Error(e) => {
            assert_eq!(e.code, "sandbox_crashed");
            assert!(e.message.contains("code 7"), "{}", e.message);
        }
        other => panic!("expected an error, got {other:?}"),
    }
    // Termination metadata is kept on the session (`session_ended`, docs/protocol.md §4).
    let info: serde_json::Value = reqwest::get(format!("{}/v1/sessions/{}", runner.url, t.session))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let term = &info["termination"];
    assert_eq!(term["reason"], "error");
    assert_eq!(term["terminatedBy"], "agent");
    assert_eq!(term["exitCode"], 7);
    assert!(
        term["stderr"]["head"]
            .as_str()
            .unwrap_or("")
            .contains("scripted crash"),
        "{info}"
    );
    runner.assert_clean().await;
}

/// Reads a stream until `pred` holds for a line, returning the response for more.
pub(crate) async fn read_until(
    res: reqwest::Response,
    mut pred: impl FnMut(&Event) -> bool,
) -> impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> {
    let mut stream = Box::pin(res.bytes_stream());
    let mut d = LineDecoder::default();
    let deadline = Instant::now() + Duration::from_secs(30);
    'outer: loop {
        assert!(Instant::now() < deadline, "line never came");
        let chunk = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("a chunk in time")
            .expect("stream open")
            .expect("chunk");
        for l in d.push(&chunk) {
            if pred(&l.unwrap().event) {
                break 'outer;
            }
        }
    }
    stream
}

/// Polls until at least `min` (or, with `min == 0`, no) processes match.
async fn wait_for_pids(marker: &str, min: usize, within: Duration) -> Vec<i32> {
    let deadline = Instant::now() + within;
    loop {
        let pids = pids_with(marker);
        let done = if min == 0 {
            pids.is_empty()
        } else {
            pids.len() >= min
        };
        if done || Instant::now() > deadline {
            return pids;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// In a jail the agent is the sandbox's init (pid 1 of its pid namespace,
/// the supervisor's only child: two host processes per sandbox), so a
/// tool's orphan becomes the agent's child; once it ends the agent reaps
/// it (no zombie holds a pid of the sandbox's bound) while the turn goes on.
#[tokio::test]
async fn the_agent_is_the_sandbox_init_and_reaps_its_tools_orphans() {
    if profile() == "unconfined" {
        asbx_test_support::skip(
            "the_agent_is_the_sandbox_init_and_reaps_its_tools_orphans",
            "profile unconfined: no pid namespace",
        );
        return;
    }
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("orphan"));
    let n = 100 + rand::random::<u16>() % 800;
    let (orphan, fg) = (format!("2.{n}"), format!("30.{n}"));
    let body = ws.body(
        &t,
        &script(json!([
            // The subshell exits at once: its background sleep is orphaned.
            // (Its command line names the time only once: `sleep 2.N`.)
            {"tool": "shell", "args": {"command": format!("s={orphan}; (sleep $s &); echo ok")}},
            {"tool": "shell", "args": {"command": format!("sleep {fg}")}},
            {"say": "never"}
        ])),
    );
    let res = post_stream(&runner.url, &body).await;
    let stream = read_until(res, |_| true).await;
    let found = wait_for_pids(&format!("sleep {orphan}"), 1, Duration::from_secs(10)).await;
    let &[pid] = found.as_slice() else {
        panic!("the orphan never ran: {found:?}");
    };
    let status = |pid: i32, field: &str| -> Option<String> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(field))
            .map(|v| v.trim().to_owned())
    };
    // Its parent is the agent once its own parent, the subshell, is gone.
    let deadline = Instant::now() + Duration::from_secs(5);
    let agent = loop {
        let parent: i32 = status(pid, "PPid:")
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        let name = std::fs::read(format!("/proc/{parent}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&name).starts_with("asbx-agent") {
            break parent;
        }
        assert!(
            Instant::now() < deadline,
            "the orphan's parent is {parent}, not the agent"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let nspid = status(agent, "NSpid:").unwrap_or_default();
    assert!(
        nspid.ends_with("\t1"),
        "the agent is pid 1 of the sandbox: NSpid {nspid:?}"
    );
    let supervisor: i32 = status(agent, "PPid:").unwrap().parse().unwrap();
    let siblings =
        std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children"))
            .unwrap_or_default();
    assert_eq!(
        siblings.split_whitespace().collect::<Vec<_>>(),
        vec![agent.to_string()],
        "the supervisor's one child is the agent"
    );
    // Ended after about two seconds: reaped, not left a zombie, while the
    // second step still runs.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            Instant::now() < deadline,
            "the orphan was not reaped: state {:?}",
            status(pid, "State:")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !wait_for_pids(&format!("sleep {fg}"), 1, Duration::from_secs(10))
            .await
            .is_empty(),
        "the turn goes on"
    );
    drop(stream);
    runner.assert_clean().await;
}

#[tokio::test]
async fn a_client_disconnect_kills_the_whole_tree_within_a_second() {
    if profile() == "unconfined" {
        asbx_test_support::skip(
            "a_client_disconnect_kills_the_whole_tree_within_a_second",
            "profile unconfined: only a jail's pid namespace guarantees every descendant dies",
        );
        return;
    }
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("disc"));
    let marker = format!("{}", 100 + rand::random::<u16>() % 800);
    let cmd = format!(
        "mkdir -p out; echo x > out/f; (sleep {marker}.25 &) ; sleep {marker}.5 & sleep {marker}.75"
    );
    let body = ws.body(
        &t,
        &script(json!([{"tool": "shell", "args": {"command": cmd}}, {"say": "never"}])),
    );
    let res = post_stream(&runner.url, &body).await;
    let stream = read_until(
        res,
        |e| matches!(e, Event::Step(s) if s.status == StepStatus::Running),
    )
    .await;
    let needle = format!("sleep {marker}.");
    // bash and its three sleeps (one of them orphaned into the background).
    let pids = wait_for_pids(&needle, 4, Duration::from_secs(10)).await;
    assert!(
        pids.len() >= 4,
        "the tool's processes are running: {pids:?}"
    );
    drop(stream);
    let dropped = Instant::now();
    let left = wait_for_pids(&needle, 0, Duration::from_secs(1)).await;
    assert!(
        left.is_empty(),
        "processes survived the disconnect: {left:?}"
    );
    assert!(
        dropped.elapsed() <= Duration::from_secs(1),
        "took {:?}",
        dropped.elapsed()
    );
    assert!(
        ws.seen(|s| s.results.is_empty()),
        "no writeback after cancellation"
    );
    runner.assert_clean().await;
    let info: serde_json::Value = reqwest::get(format!("{}/v1/sessions/{}", runner.url, t.session))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["termination"]["reason"], "terminated");
    assert_eq!(info["termination"]["terminatedBy"], "daemon");
}

#[tokio::test]
async fn the_runtime_cap_kills_the_sandbox() {
    let lines = capped_run("ASBX_MAX_RUNTIME_SEC").await;
    // The step that was running is closed as failed before the error.
    assert_eq!(
        steps(&lines),
        vec![
            ("shell", StepStatus::Running),
            ("shell", StepStatus::Failed)
        ]
    );
}

/// Issue 28, defect 13: the seed's name of the setting is read too.
#[tokio::test]
async fn the_seeds_name_of_the_runtime_cap_is_read() {
    capped_run("ASSISTANT_SANDBOX_MAX_RUNTIME_SEC").await;
}

/// A run on a runner whose runtime cap, 1 s, is set by `setting`: a step
/// that sleeps far longer is killed, the run ends `runtime_cap_exceeded`
/// and nothing is left. Returns its lines.
async fn capped_run(setting: &str) -> Vec<Line> {
    let runner = RunnerProc::start(&[(setting, "1"), ("ASBX_RUNTIME_GRACE_SEC", "0")]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("cap"));
    let marker = format!("{}", 1000 + rand::random::<u16>() % 800);
    let body = ws.body(
        &t,
        &script(json!([{"tool": "shell", "args": {"command": format!("sleep {marker}.5")}}])),
    );
    let started = Instant::now();
    let (_, lines, _) = dispatch(&runner.url, &body).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_well_formed(&lines);
    assert!(
        matches!(terminal(&lines), Event::Error(e) if e.code == "runtime_cap_exceeded"),
        "{lines:?}"
    );
    assert!(
        wait_for_pids(&format!("sleep {marker}.5"), 0, Duration::from_secs(2))
            .await
            .is_empty()
    );
    runner.assert_clean().await;
    lines
}
