//! Tools reach the runner's egress proxy through the agent's loopback relay.

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{Harness, script};

#[tokio::test]
async fn http_proxy_points_at_a_relay_to_the_proxy_socket() {
    let mut h = Harness::scripted(&script(json!([
        {"tool": "shell", "args": {"command":
            "exec 3<>/dev/tcp/127.0.0.1/${HTTP_PROXY##*:}; printf 'ping' >&3; head -c 4 <&3; echo \" $NO_PROXY\""}},
        {"say": "ok"}
    ])));
    // A stand-in for the runner's proxy: answers "pong" to "ping".
    let sock = h.dir.path().join("proxy.sock");
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        s.write_all(b"pong").await.unwrap();
    });
    h.proxy_socket = Some(sock.display().to_string());
    let o = h.run().await;
    assert_eq!(o.result(), "ok");
    let stdout = o.finished_steps()[0].result.as_ref().unwrap()["stdout"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(stdout.starts_with("pong"), "{stdout}");
    assert!(stdout.contains("127.0.0.1"), "{stdout}");
    server.await.unwrap();
}
