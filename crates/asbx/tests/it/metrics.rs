//! Prometheus metrics through the real `asbx up`: `/metrics` of the
//! workspace and of the runner before and after a chat turn that runs a
//! shell tool, each counter that should move moved by what happened, both
//! expositions pass `promtool check metrics`, and who may scrape is what
//! the settings say (ASBX_METRICS_TOKEN, ASBX_RUNNER_TOKEN, ASBX_REQUIRE_AUTH).

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde_json::json;

use asbx_test_support::{MockProvider, Tape};

use crate::harness::*;

const METRICS_TOKEN: &str = "metrics-scrape-secret";

/// Asks the egress proxy (`HTTP_PROXY`) for a host no one allowed; prints
/// `egress=<status>`.
const EGRESS_PROBE: &str = r#"python3 -c '
import urllib.request, urllib.error
try:
    urllib.request.urlopen("http://blocked.example/", timeout=10)
    print("egress=200")
except urllib.error.HTTPError as e:
    print("egress=%d" % e.code)
'"#;

/// `asbx up` with its runner's URL read from the banner; stopped by PID.
struct Up {
    child: Child,
    url: String,
    runner_url: String,
    _data: tempfile::TempDir,
}

impl Up {
    fn start(env: &[(&str, &str)]) -> Up {
        let data = tempfile::tempdir().unwrap();
        let (child, banner) = spawn_up(data.path(), env, Stdio::inherit());
        Up {
            child,
            url: banner.url,
            runner_url: banner.runner_url,
            _data: data,
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One scrape: the text, and each sample (`name{labels}`) with its value.
struct Scrape {
    text: String,
    samples: HashMap<String, f64>,
}

impl Scrape {
    fn get(&self, series: &str) -> f64 {
        self.samples.get(series).copied().unwrap_or(0.0)
    }
}

async fn scrape(url: &str, bearer: Option<&str>) -> Scrape {
    let mut req = reqwest::Client::new().get(format!("{url}/metrics"));
    if let Some(b) = bearer {
        req = req.bearer_auth(b);
    }
    let res = req.send().await.unwrap();
    assert_eq!(res.status(), 200, "{url}/metrics");
    let ct = res.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    let text = res.text().await.unwrap();
    let samples = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_owned(), value.parse::<f64>().unwrap())
        })
        .collect();
    Scrape { text, samples }
}

async fn status_of(url: &str, bearer: Option<&str>) -> (u16, String) {
    let mut req = reqwest::Client::new().get(format!("{url}/metrics"));
    if let Some(b) = bearer {
        req = req.bearer_auth(b);
    }
    let res = req.send().await.unwrap();
    (res.status().as_u16(), res.text().await.unwrap())
}

/// `promtool check metrics` on an exposition, when promtool is installed.
fn promtool_check(test: &str, what: &str, text: &str) {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            asbx_test_support::skip(
                test,
                &format!("promtool not on PATH ({e}); Debian's `prometheus` package has it"),
            );
            return;
        }
    };
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(text.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics ({what}) failed: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until the runner's exposition satisfies `done` (the dispatch is
/// counted when its session is torn down, just after the client's `done`).
async fn scrape_until(url: &str, bearer: &str, done: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = scrape(url, Some(bearer)).await;
        if done(&s) || Instant::now() > deadline {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn counters_move_with_a_chat_turn_and_both_expositions_are_valid() {
    const TEST: &str = "metrics::counters_move_with_a_chat_turn_and_both_expositions_are_valid";
    let runner_token = hex::encode(rand::random::<[u8; 16]>());
    let mock = MockProvider::start().await;
    let up = Up::start(&[
        ("ASBX_RUNNER_TOKEN", &runner_token),
        ("ASBX_METRICS_TOKEN", METRICS_TOKEN),
        ("OPENAI_BASE_URL", mock.base_url.as_str()),
        ("OPENAI_API_KEY", "sk-metrics"),
        ("ASBX_MODEL", "scripted:demo"),
    ]);

    // Who may scrape: the runner takes its bearer, the workspace the metrics token.
    assert_eq!(status_of(&up.runner_url, None).await.0, 401);
    assert_eq!(status_of(&up.runner_url, Some("wrong")).await.0, 401);
    let (code, body) = status_of(&up.url, None).await;
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("\"unauthorized\""), "{body}");
    assert_eq!(
        status_of(&up.url, Some("metrics-scrape-secreT")).await.0,
        401
    );

    // Prometheus scrapes a pod by its IP: with the metrics token set, a
    // foreign `Host` is answered on /metrics (the bearer is no ambient
    // credential), and still refused everywhere else.
    let foreign = |path: &str| {
        reqwest::Client::new()
            .get(format!("{}{path}", up.url))
            .header("host", "10.1.2.3:7878")
            .bearer_auth(METRICS_TOKEN)
            .send()
    };
    assert_eq!(foreign("/metrics").await.unwrap().status(), 200);
    let refused = foreign("/api/assistant/chats").await.unwrap();
    assert_eq!(refused.status(), 403);
    assert!(
        refused.text().await.unwrap().contains("host_not_allowed"),
        "positive control"
    );

    let ws0 = scrape(&up.url, Some(METRICS_TOKEN)).await;
    let rn0 = scrape(&up.runner_url, Some(&runner_token)).await;

    // A refused dispatch is counted with its code.
    let res = reqwest::Client::new()
        .post(format!("{}/stream", up.runner_url))
        .bearer_auth(&runner_token)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);

    // One chat turn that runs a shell tool, which asks the egress proxy
    // for a host the turn does not allow.
    let prompt = script(json!([
        {"tool": "shell", "args": {"command": format!("echo metrics-were-here; {EGRESS_PROBE}")}},
        {"say": "done counting"}
    ]));
    let res = reqwest::Client::new()
        .post(format!("{}/api/assistant/chat/stream", up.url))
        .json(&json!({ "message": prompt }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let mut body = res.bytes_stream();
    let mut seen = Vec::new();
    let read = async {
        while let Some(chunk) = body.next().await {
            seen.extend_from_slice(&chunk.unwrap());
            if memchr_done(&seen) {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(240), read)
        .await
        .expect("the turn went on too long");
    let text = String::from_utf8_lossy(&seen);
    assert!(text.contains("metrics-were-here"), "{text}");
    assert!(text.contains("egress=403"), "{text}");
    assert!(text.contains("\"succeeded\""), "{text}");

    // One run on a real model wire format (the mock provider) through the
    // gateway.
    mock.push(Tape::text("the model answered"));
    let res = reqwest::Client::new()
        .post(format!("{}/api/runs", up.url))
        .json(&json!({ "prompt": "hello", "model": "openai:test-model" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body = res.text().await.unwrap();
    assert!(body.contains("the model answered"), "{body}");

    const COMPLETED: &str = "asbx_runner_dispatches_total{outcome=\"completed\",code=\"none\"}";
    let before = rn0.get(COMPLETED);
    let rn1 = scrape_until(&up.runner_url, &runner_token, |s| {
        s.get(COMPLETED) >= before + 2.0
    })
    .await;
    let ws1 = scrape(&up.url, Some(METRICS_TOKEN)).await;

    let moved = |a: &Scrape, b: &Scrape, series: &str| b.get(series) - a.get(series);
    assert_eq!(moved(&rn0, &rn1, COMPLETED), 2.0, "{}", rn1.text);
    assert_eq!(
        moved(
            &rn0,
            &rn1,
            "asbx_runner_dispatches_total{outcome=\"refused\",code=\"invalid_request\"}"
        ),
        1.0,
        "{}",
        rn1.text
    );
    assert_eq!(
        moved(
            &rn0,
            &rn1,
            "asbx_runner_tool_calls_total{name=\"shell\",status=\"succeeded\"}"
        ),
        1.0,
        "{}",
        rn1.text
    );
    assert_eq!(
        moved(&rn0, &rn1, "asbx_runner_time_to_first_line_seconds_count"),
        2.0
    );
    assert_eq!(
        moved(&rn0, &rn1, "asbx_runner_dispatch_duration_seconds_count"),
        2.0
    );
    assert_eq!(
        moved(
            &rn0,
            &rn1,
            "asbx_runner_egress_requests_total{decision=\"refused\"}"
        ),
        1.0,
        "{}",
        rn1.text
    );
    assert_eq!(
        moved(
            &rn0,
            &rn1,
            "asbx_runner_egress_requests_total{decision=\"allowed\"}"
        ),
        0.0
    );
    assert_eq!(
        moved(
            &rn0,
            &rn1,
            "asbx_runner_model_calls_total{provider=\"openai\"}"
        ),
        1.0,
        "{}",
        rn1.text
    );
    let tokens = moved(
        &rn0,
        &rn1,
        "asbx_runner_model_tokens_total{provider=\"openai\",direction=\"input\"}",
    );
    assert!(tokens >= 1.0, "{tokens} input tokens\n{}", rn1.text);
    assert!(moved(&rn0, &rn1, "asbx_runner_dispatch_duration_seconds_sum") > 0.0);
    // At least session_init, two step lines, the tool's output, the result
    // and session_ended for the turn, and a result for the run.
    let lines = moved(&rn0, &rn1, "asbx_runner_lines_streamed_total");
    assert!(lines >= 6.0, "{lines} lines\n{}", rn1.text);
    let bytes = moved(&rn0, &rn1, "asbx_runner_bytes_streamed_total");
    assert!(bytes >= lines * 40.0, "{bytes} bytes for {lines} lines");
    // Nothing else ended: the counters that should not move did not.
    for other in ["crashed", "cancelled", "runtime_cap", "agent_error"] {
        assert!(
            !rn1.text.contains(&format!("outcome=\"{other}\"")),
            "{other}: {}",
            rn1.text
        );
    }
    assert!(rn1.samples.contains_key("asbx_runner_sandboxes_live"));
    assert!(rn1.samples.contains_key("asbx_runner_sandboxes_warm"));

    assert_eq!(
        moved(
            &ws0,
            &ws1,
            "asbx_workspace_chat_turns_total{status=\"succeeded\"}"
        ),
        1.0,
        "{}",
        ws1.text
    );
    assert_eq!(
        moved(&ws0, &ws1, "asbx_workspace_db_ping_seconds_count"),
        1.0,
        "one round trip per scrape"
    );
    assert!(ws1.get("asbx_workspace_db_connections") >= 1.0);

    promtool_check(TEST, "workspace", &ws1.text);
    promtool_check(TEST, "runner", &rn1.text);
}

/// The SSE stream carried its `done` event.
fn memchr_done(seen: &[u8]) -> bool {
    seen.windows(11).any(|w| w == b"event: done")
}

#[tokio::test]
async fn with_require_auth_and_no_metrics_token_the_workspace_refuses_to_be_scraped() {
    let up = Up::start(&[("ASBX_REQUIRE_AUTH", "true"), ("ASBX_WARM_POOL", "0")]);
    let (code, body) = status_of(&up.url, None).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("ASBX_METRICS_TOKEN"), "{body}");
    // A workspace API key is not a metrics credential either.
    let (code, _) = status_of(&up.url, Some("asbx_some_key")).await;
    assert_eq!(code, 403);
    // Without the token, /metrics is a browser-reachable route like any
    // other: a foreign `Host` (DNS rebinding) is refused first.
    let res = reqwest::Client::new()
        .get(format!("{}/metrics", up.url))
        .header("host", "rebound.example:80")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
    assert!(res.text().await.unwrap().contains("host_not_allowed"));
    // Positive control: the same server answers other routes.
    let health = reqwest::get(format!("{}/healthz", up.url)).await.unwrap();
    assert_eq!(health.status(), 200);
}

/// Issue 28, defect 11: an agent's error is counted under its own code
/// (`model_error` here), not one `agent` for all.
#[tokio::test]
async fn an_agent_error_is_counted_under_its_code() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let t = ws.mint(&session_id("metric-code"));
    let (_, lines, _) = dispatch(
        &runner.url,
        &ws.body(&t, &script(json!([{"fail": "the model fell over"}]))),
    )
    .await;
    assert!(
        matches!(terminal(&lines), asbx_protocol::Event::Error(e) if e.code == "model_error"),
        "{lines:?}"
    );
    const SERIES: &str =
        "asbx_runner_dispatches_total{outcome=\"agent_error\",code=\"model_error\"}";
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut s = scrape(&runner.url, None).await;
    while s.get(SERIES) < 1.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        s = scrape(&runner.url, None).await;
    }
    assert_eq!(s.get(SERIES), 1.0, "{}", s.text);
    assert!(!s.text.contains("code=\"agent\""), "{}", s.text);
    runner.assert_clean().await;
}
