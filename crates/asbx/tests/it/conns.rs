//! Connection limits of the real servers: idle, slow-header and flooding
//! clients are closed or refused, other clients stay served, streams last.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::harness::{RunnerProc, WorkspaceProc};

/// `asbx workspace` refuses to start without a runner; these tests make no
/// dispatch, so a runner that is not there does.
const NO_RUNNER: (&str, &str) = ("SANDBOX_URL", "http://127.0.0.1:9");

/// The other tenant's address: the flood comes from 127.0.0.1.
const OTHER: &str = "127.0.0.2";

fn socket_addr(url: &str) -> SocketAddr {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

/// A TCP connection to `addr` from the loopback address `from`.
async fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(from.parse().unwrap(), 0))
        .unwrap();
    socket.connect(addr).await.unwrap()
}

/// A client whose connections leave from the loopback address `from`, a
/// new one for each request.
fn client_from(from: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(from.parse::<IpAddr>().unwrap())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// `GET url` from `from`: its status and how long it took.
async fn timed_get(from: &str, url: &str) -> (Option<u16>, Duration) {
    let client = client_from(from);
    let start = Instant::now();
    let status = client
        .get(url)
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16());
    (status, start.elapsed())
}

/// Writes `GET path` (keep-alive) and reads the whole answer: its head.
async fn request(conn: &mut TcpStream, host: SocketAddr, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nhost: {host}\r\n\r\n");
    conn.write_all(req.as_bytes()).await.unwrap();
    read_answer(conn).await
}

/// Reads an answer with a `content-length` body; returns head and body.
async fn read_answer(conn: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + len {
                return String::from_utf8_lossy(&buf[..end + 4 + len]).into_owned();
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut chunk))
            .await
            .expect("an answer within 5 s")
            .unwrap();
        assert!(n > 0, "closed before a whole answer: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Waits up to `within` for the server to close `conn` (end of file or a
/// reset); returns how long that took, or `None` if it stayed open.
async fn closed_within(conn: &mut TcpStream, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut chunk = [0u8; 4096];
    loop {
        let left = within.checked_sub(start.elapsed())?;
        match tokio::time::timeout(left, conn.read(&mut chunk)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// The descriptors a process holds open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[tokio::test]
async fn a_half_sent_request_is_closed_after_the_header_timeout() {
    let ws = WorkspaceProc::start(
        "127.0.0.1:0",
        &[
            NO_RUNNER,
            ("ASBX_HEADER_TIMEOUT_SEC", "1"),
            ("ASBX_IDLE_TIMEOUT_SEC", "30"),
        ],
    );
    let addr = socket_addr(&ws.url);
    let opened = Instant::now();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(format!("GET /api/session HTTP/1.1\r\nhost: {addr}\r\nx-slow: ").as_bytes())
        .await
        .unwrap();
    for conn in [&mut half, &mut silent] {
        closed_within(conn, Duration::from_secs(5))
            .await
            .expect("a half-sent request or a silent connection still open after 5 s");
        let took = opened.elapsed();
        assert!(
            took >= Duration::from_millis(900),
            "closed too soon: {took:?}"
        );
    }
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let ws = WorkspaceProc::start(
        "127.0.0.1:0",
        &[
            NO_RUNNER,
            ("ASBX_HEADER_TIMEOUT_SEC", "1"),
            ("ASBX_IDLE_TIMEOUT_SEC", "3"),
        ],
    );
    let addr = socket_addr(&ws.url);
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let first = request(&mut conn, addr, "/healthz").await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    // Idle past the header timeout, within the idle one: still served.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let second = request(&mut conn, addr, "/healthz").await;
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
    let took = closed_within(&mut conn, Duration::from_secs(8))
        .await
        .expect("an idle keep-alive connection still open 8 s later (idle timeout 3 s)");
    assert!(
        took >= Duration::from_millis(2500),
        "closed too soon: {took:?}"
    );
}

#[tokio::test]
async fn a_stream_outlives_the_idle_timeout() {
    let ws = WorkspaceProc::start(
        "127.0.0.1:0",
        &[
            NO_RUNNER,
            ("ASBX_HEADER_TIMEOUT_SEC", "1"),
            ("ASBX_IDLE_TIMEOUT_SEC", "1"),
        ],
    );
    let addr = socket_addr(&ws.url);
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET /api/assistant/events HTTP/1.1\r\nhost: {addr}\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let mut idle = TcpStream::connect(addr).await.unwrap();
    let answer = request(&mut idle, addr, "/healthz").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The stream sends nothing for 15 s (its keep-alive comment): well past
    // the idle timeout, it stays open; the idle connection beside it closes.
    assert!(
        closed_within(&mut idle, Duration::from_secs(4))
            .await
            .is_some(),
        "an idle connection outlived the idle timeout"
    );
    assert_eq!(
        closed_within(&mut stream, Duration::from_millis(500)).await,
        None,
        "a stream was cut by the idle timeout"
    );
}

#[tokio::test]
async fn past_the_connection_cap_a_connection_is_refused_with_503() {
    let ws = WorkspaceProc::start(
        "127.0.0.1:0",
        &[
            NO_RUNNER,
            ("ASBX_MAX_CONNECTIONS", "8"),
            ("ASBX_MAX_CONNECTIONS_PER_PEER", "0"),
            ("ASBX_HEADER_TIMEOUT_SEC", "60"),
        ],
    );
    let addr = socket_addr(&ws.url);
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut refused = connect_from(OTHER, addr).await;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(2), refused.read_to_string(&mut answer))
        .await
        .expect("a refused connection closed at once")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 1"), "{answer}");
    assert!(
        answer.contains("\"code\":\"too_many_connections\""),
        "{answer}"
    );
    drop(held);
    let url = format!("{}/api/session", ws.url);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if timed_get(OTHER, &url).await.0 == Some(200) {
            break;
        }
        assert!(Instant::now() < deadline, "no recovery after the cap");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_runner_closes_slow_heads_and_caps_each_address() {
    let runner = RunnerProc::start_with(
        "unconfined",
        &[
            ("ASBX_WARM_POOL", "0"),
            ("ASBX_HEADER_TIMEOUT_SEC", "1"),
            ("ASBX_MAX_CONNECTIONS_PER_PEER", "4"),
        ],
    );
    let addr = socket_addr(&runner.url);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    let mut half = TcpStream::connect(addr).await.unwrap();
    let half_opened = Instant::now();
    half.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut fifth = TcpStream::connect(addr).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(
        Duration::from_millis(900),
        fifth.read_to_string(&mut answer),
    )
    .await
    .expect("a fifth connection from one address refused at once")
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    let healthz = format!("{}/healthz", runner.url);
    let (status, took) = timed_get(OTHER, &healthz).await;
    assert_eq!(status, Some(200));
    assert!(took < Duration::from_secs(1), "{took:?}");
    closed_within(&mut half, Duration::from_secs(5))
        .await
        .expect("a half-sent request to the runner still open after 5 s");
    let took = half_opened.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "closed too soon: {took:?}"
    );
    for conn in &mut held {
        assert!(closed_within(conn, Duration::from_secs(3)).await.is_some());
    }
    let (status, _) = timed_get("127.0.0.1", &healthz).await;
    assert_eq!(status, Some(200), "the address's slots did not come back");
}

/// Connections the flood opens, idle and slow-header, from each of two
/// child processes (the test process's open-file limit may be 20,000).
const FLOOD_IDLE: usize = 10_000;
const FLOOD_SLOW: usize = 100;

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_idle_and_slow_clients_leaves_other_addresses_served() {
    let ws = WorkspaceProc::start(
        "127.0.0.1:0",
        &[NO_RUNNER, ("ASBX_HEADER_TIMEOUT_SEC", "2")],
    );
    let addr = socket_addr(&ws.url);
    let session = format!("{}/api/session", ws.url);
    assert_eq!(timed_get(OTHER, &session).await.0, Some(200));
    let baseline = open_fds(ws.pid());
    // Another tenant asks every 200 ms while the flood lasts.
    let flooding = Arc::new(AtomicBool::new(true));
    let probe = tokio::spawn(probe_until(Arc::clone(&flooding), session.clone()));
    let started = Instant::now();
    let mut floods: Vec<Flood> = (0..2).map(|nth| Flood::start(addr, nth)).collect();
    let mut opened = Vec::new();
    for flood in &mut floods {
        opened.push(flood.opened().await);
    }
    let held = open_fds(ws.pid());
    // One more probe, once the whole flood is open, then the probing stops.
    tokio::time::sleep(Duration::from_millis(200)).await;
    flooding.store(false, Ordering::Relaxed);
    let mut answers = probe.await.unwrap();
    eprintln!(
        "flood: {opened:?} in {:?}; other address answered in {answers:?}; \
         {held} descriptors held (from {baseline})",
        started.elapsed()
    );
    assert_eq!(
        opened,
        [(FLOOD_IDLE, FLOOD_SLOW); 2],
        "the flood fell short"
    );
    assert!(
        started.elapsed() < Duration::from_secs(45),
        "{:?}",
        started.elapsed()
    );
    // Every probe answered 200 within the client's 5 s (a refusal or a
    // timeout is `MAX`), and the typical one in under a second: on a
    // machine this test shares with others' sandboxes one answer may wait
    // for a core, which is the scheduler's doing, not the flood's.
    answers.sort();
    assert!(!answers.is_empty(), "no probe ran during the flood");
    let worst = answers[answers.len() - 1];
    assert!(
        worst < Duration::MAX,
        "a probe was refused or timed out: {answers:?}"
    );
    let median = answers[answers.len() / 2];
    assert!(
        median < Duration::from_secs(1),
        "{median:?} during the flood"
    );
    // One address holds at most 256 (the default per-peer cap).
    assert!(held <= baseline + 256 + 16, "{held} descriptors held");
    drop(floods);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _) = timed_get("127.0.0.1", &session).await;
        if status == Some(200) && open_fds(ws.pid()) <= baseline + 16 {
            break;
        }
        assert!(Instant::now() < deadline, "no recovery after the flood");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Asks `url` from the other address every 200 ms while `flooding`;
/// returns how long each answer took (a failure counts as forever).
async fn probe_until(flooding: Arc<AtomicBool>, url: String) -> Vec<Duration> {
    let mut answers = Vec::new();
    while flooding.load(Ordering::Relaxed) {
        let (status, took) = timed_get(OTHER, &url).await;
        answers.push(match status {
            Some(200) => took,
            _ => Duration::MAX,
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    answers
}

/// A child process (this test binary, [`flood_helper`]) holding a flood of
/// connections open until dropped.
struct Flood {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Flood {
    /// The `nth` helper (its own block of source ports).
    fn start(addr: SocketAddr, nth: u16) -> Flood {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "conns::flood_helper",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                "ASBX_TEST_FLOOD",
                format!(
                    "{addr} {FLOOD_IDLE} {FLOOD_SLOW} {}",
                    10_000 + nth * FLOOD_PORTS
                ),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        Flood { child, stdin }
    }

    /// How many idle and slow connections it opened.
    async fn opened(&mut self) -> (usize, usize) {
        let stdout = self.child.stdout.take().unwrap();
        let read = tokio::task::spawn_blocking(move || {
            let mut lines = BufReader::new(stdout).lines();
            while let Some(line) = lines.next() {
                let line = line.unwrap();
                // After the harness's `test conns::flood_helper ... `.
                if let Some((_, counts)) = line.split_once("flood-opened ") {
                    let (idle, slow) = counts.split_once(' ').unwrap();
                    let counts = (idle.parse().unwrap(), slow.parse().unwrap());
                    // The rest (the harness's summary) to the end.
                    std::thread::spawn(move || lines.for_each(drop));
                    return counts;
                }
            }
            (0, 0)
        });
        // Bounded: a helper that never reports counts as opening nothing.
        match tokio::time::timeout(Duration::from_secs(50), read).await {
            Ok(counts) => counts.unwrap(),
            Err(_) => (0, 0),
        }
    }
}

impl Drop for Flood {
    /// Closing its stdin ends it; SIGKILL by PID if it lingers.
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run by [`Flood`] in a child process: opens `ASBX_TEST_FLOOD`'s idle
/// and slow-header connections, prints how many, trickles header lines on
/// the slow ones until its stdin closes, then closes them all.
#[test]
#[ignore = "a child process of a_flood_of_idle_and_slow_clients_leaves_other_addresses_served"]
fn flood_helper() {
    let Ok(spec) = std::env::var("ASBX_TEST_FLOOD") else {
        return;
    };
    let words: Vec<&str> = spec.split(' ').collect();
    let addr: SocketAddr = words[0].parse().unwrap();
    let (idle, slow): (usize, usize) = (words[1].parse().unwrap(), words[2].parse().unwrap());
    let first_port: u16 = words[3].parse().unwrap();
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(flood(addr, idle, slow, first_port));
}

/// [`flood_helper`]'s work, its source ports from `first_port` on.
async fn flood(addr: SocketAddr, idle: usize, slow: usize, first_port: u16) {
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut ports = first_port..first_port.saturating_add(FLOOD_PORTS);
    let idle_conns = open_many(addr, idle, &mut ports, deadline).await;
    let mut slow_conns = open_many(addr, slow, &mut ports, deadline).await;
    let head = format!("GET /api/session HTTP/1.1\r\nhost: {addr}\r\n");
    for c in &mut slow_conns {
        let _ = c.write_all(head.as_bytes()).await;
    }
    // Straight to the descriptor: the test harness may capture `println!`.
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "flood-opened {} {}",
        idle_conns.len(),
        slow_conns.len()
    )
    .unwrap();
    out.flush().unwrap();
    drop(out);
    let done = Arc::new(AtomicBool::new(false));
    let d = Arc::clone(&done);
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        d.store(true, Ordering::Relaxed);
    });
    while !done.load(Ordering::Relaxed) {
        for c in &mut slow_conns {
            let _ = c.write_all(b"x-slow: 1\r\n").await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    drop(idle_conns);
}

/// Source ports each flood helper may use: below the ephemeral range (whose
/// scan for a free port slows to a crawl once half of it is taken, and
/// which other processes need), one block per helper.
const FLOOD_PORTS: u16 = 11_000;

/// `n` connections to `addr`, 256 connecting at once, each from the next
/// of `ports` that is free, until `deadline`.
async fn open_many(
    addr: SocketAddr,
    n: usize,
    ports: &mut std::ops::Range<u16>,
    deadline: Instant,
) -> Vec<TcpStream> {
    let mut out = Vec::with_capacity(n);
    let mut pending = tokio::task::JoinSet::new();
    while out.len() < n && Instant::now() < deadline {
        while pending.len() < 256 && out.len() + pending.len() < n {
            let Some(port) = ports.next() else { break };
            pending.spawn(connect_from_port(addr, port));
        }
        match pending.join_next().await {
            Some(Ok(Some(conn))) => out.push(conn),
            Some(_) => {}
            None => break,
        }
    }
    out
}

/// A connection to `addr` from 127.0.0.1:`port`, if that port is free.
async fn connect_from_port(addr: SocketAddr, port: u16) -> Option<TcpStream> {
    let socket = TcpSocket::new_v4().ok()?;
    // A port a former run left in TIME_WAIT is free for this.
    socket.set_reuseaddr(true).ok()?;
    socket.bind(SocketAddr::from(([127, 0, 0, 1], port))).ok()?;
    tokio::time::timeout(Duration::from_secs(3), socket.connect(addr))
        .await
        .ok()?
        .ok()
}
