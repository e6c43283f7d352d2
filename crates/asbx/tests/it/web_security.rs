//! The workspace's web security posture through the real `asbx` binary
//! (docs/protocol.md §8, issue 13 items 3 and 4): a public listen address
//! needs `ASBX_REQUIRE_AUTH`; a foreign `Host`, another origin's state
//! change and a non-JSON body are refused; the legitimate request works.

use std::io::{BufRead as _, BufReader, Read as _};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use crate::harness::ASBX;

/// Starts `asbx workspace --listen {listen}`; the child and the URL it
/// printed, or its exit status and stderr when it refused to start.
fn workspace(
    listen: &str,
    require_auth: Option<&str>,
    data: &std::path::Path,
) -> Result<(Child, String), (std::process::ExitStatus, String)> {
    let mut cmd = Command::new(ASBX);
    cmd.args(["workspace", "--listen", listen])
        .env_clear()
        .env("ASBX_DATA", data)
        .env("ASBX_LOG", "warn")
        .env("SANDBOX_URL", "http://127.0.0.1:9/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(v) = require_auth {
        cmd.env("ASBX_REQUIRE_AUTH", v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    match line.split_whitespace().find(|w| w.starts_with("http://")) {
        Some(url) => Ok((child, url.to_owned())),
        None => {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            Err((child.wait().unwrap(), err))
        }
    }
}

/// Ends a child this test started, by its pid.
fn stop(mut child: Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
}

#[test]
fn a_public_listen_address_needs_require_auth() {
    let data = tempfile::tempdir().unwrap();
    // Binds the wildcard address for a moment; nothing connects to it.
    let (status, err) = workspace("0.0.0.0:0", None, data.path())
        .map(|(c, url)| {
            stop(c);
            url
        })
        .expect_err("a public listen address without auth is refused");
    assert!(!status.success(), "{status}");
    assert!(err.contains("ASBX_REQUIRE_AUTH"), "{err}");
    // Positive controls: with auth it starts; on loopback it needs none.
    let (child, _) = workspace("0.0.0.0:0", Some("1"), data.path())
        .unwrap_or_else(|(s, e)| panic!("with auth it starts: {s}: {e}"));
    stop(child);
    let (child, _) = workspace("127.0.0.1:0", None, data.path())
        .unwrap_or_else(|(s, e)| panic!("loopback starts: {s}: {e}"));
    stop(child);
}

#[tokio::test]
async fn foreign_hosts_other_origins_and_non_json_are_refused() {
    let data = tempfile::tempdir().unwrap();
    let (child, url) = workspace("127.0.0.1:0", None, data.path()).unwrap();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let agent = json!({"name": "csrf"}).to_string();
    let agents = format!("{url}/api/agents");

    // DNS rebinding: the same socket, another name.
    let resp = client
        .get(&agents)
        .header("host", "rebound.example")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let p: Value = resp.json().await.unwrap();
    assert_eq!(p["code"], "host_not_allowed");

    // A browser's cross-site form-style POST.
    let resp = client
        .post(&agents)
        .header("origin", "http://evil.example")
        .header("content-type", "text/plain")
        .body(agent.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let p: Value = resp.json().await.unwrap();
    assert_eq!(p["code"], "cross_origin");

    let resp = client
        .post(&agents)
        .header("content-type", "text/plain")
        .body(agent.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);

    let list: Value = client
        .get(&agents)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["agents"].as_array().unwrap().len(), 0, "{list}");

    // Positive control: same origin, JSON.
    let resp = client
        .post(&agents)
        .header("origin", url.clone())
        .header("content-type", "application/json")
        .body(agent)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let list: Value = client
        .get(&agents)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["agents"].as_array().unwrap().len(), 1, "{list}");
    stop(child);
}
