//! Many machines (issue 12, docs/protocol.md §7, ARCHITECTURE.md "Many
//! machines"): one PostgreSQL, two `asbx workspace` nodes and two
//! `asbx runner`s, each in a network namespace of its own that the test
//! makes (`ip netns` and veth pairs on a bridge, names with a random
//! suffix, all removed by a drop guard, and checked gone at the end).
//!
//! The root namespace holds what stands between the machines:
//! - a TCP forwarder per workspace node, bound to the bridge address, to the
//!   test PostgreSQL on 127.0.0.1 (`ASBX_TEST_PG_URL`): a node is cut off
//!   from PostgreSQL by closing its forwarder's connections and refusing new
//!   ones for 10 s;
//! - a TCP load balancer (round robin, a backend that refuses the connection
//!   is skipped) at `ASBX_PUBLIC_URL`, where the sandboxes call back; while a
//!   node is cut off the test marks it down there, as a readiness probe
//!   would.
//!
//! Traffic goes only to the bridge (the test's own namespaces) and, through
//! the forwarders, to 127.0.0.1. The nodes listen on their veth address, so
//! they run with `ASBX_REQUIRE_AUTH` (an API key from `asbx key`) and the
//! runners with `ASBX_RUNNER_TOKEN`; the clients send the public URL's
//! `Host`, as a load balancer would.
//!
//! 200 chat turns (20 chats x 10, one turn per chat at a time, 8 at once)
//! with the scripted model (`echo`, a short sleep, a result) spread over
//! both nodes. Meanwhile node b is cut off from PostgreSQL for 10 s (it
//! refuses turns meanwhile and serves again after), runner b is SIGKILLed
//! while it runs a turn (its turns end `runner_lost`, later ones go to
//! runner a) and node a is SIGKILLed while it drives a turn (node b takes
//! its turns over; their clients resume on node b with `Last-Event-ID`).
//! Then: every accepted turn ended (`done`, or its message in the thread),
//! each chat's thread (read from node b and from a fresh node) holds each
//! turn's user and assistant message exactly once and in order, no run is
//! left `running` and no chat leased, no sandbox, cgroup, process or
//! namespace is left.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

use crate::harness::{
    ASBX, PgDatabase, RunnerProc, WorkspaceProc, cgroups_named, pids_mentioning, script,
};

const CHATS: usize = 20;
const TURNS_PER_CHAT: usize = 10;
const AT_ONCE: usize = 8;
/// How long one turn may take, retries and resumes included, before the
/// test calls it hung.
const TURN_DEADLINE: Duration = Duration::from_secs(100);

// ---------------------------------------------------------------------------
// The network: a bridge in the root namespace, a namespace per machine.

/// The test's namespaces and bridge; removed on drop, whatever happened.
struct Net {
    suffix: String,
    bridge: Option<String>,
    namespaces: Vec<String>,
    /// The root namespace's ends of the veth pairs.
    veths: Vec<String>,
    /// `10.a.b` of the test's /24.
    prefix: String,
}

fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Net {
    /// Whether this host lets the test make namespaces and a bridge.
    fn possible() -> Result<(), String> {
        let probe = format!("asbx-probe-{}", hex::encode(rand::random::<[u8; 3]>()));
        ip(&["netns", "add", &probe])?;
        ip(&["netns", "del", &probe]).map(|_| ())
    }

    /// A bridge with `.1` in the root namespace and one namespace per name,
    /// at `.2`, `.3`, ... in the order given.
    fn create(names: &[&str]) -> Net {
        let suffix = hex::encode(rand::random::<[u8; 3]>());
        let routes = ip(&["-4", "addr"]).unwrap() + &ip(&["-4", "route"]).unwrap();
        let prefix = loop {
            let p = format!(
                "10.{}.{}",
                100 + rand::random::<u8>() % 100,
                rand::random::<u8>()
            );
            if !routes.contains(&format!("{p}.")) {
                break p;
            }
        };
        let mut net = Net {
            suffix,
            bridge: None,
            namespaces: Vec::new(),
            veths: Vec::new(),
            prefix,
        };
        let bridge = format!("asbxbr{}", net.suffix);
        ip(&["link", "add", &bridge, "type", "bridge"]).unwrap();
        net.bridge = Some(bridge.clone());
        ip(&["addr", "add", &format!("{}/24", net.host()), "dev", &bridge]).unwrap();
        ip(&["link", "set", &bridge, "up"]).unwrap();
        for (i, name) in names.iter().enumerate() {
            let ns = format!("asbx-{}-{name}", net.suffix);
            ip(&["netns", "add", &ns]).unwrap();
            net.namespaces.push(ns.clone());
            let (outer, inner) = (
                format!("asbxv{}{i}", net.suffix),
                format!("asbxp{}{i}", net.suffix),
            );
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])
            .unwrap();
            net.veths.push(outer.clone());
            ip(&["link", "set", &inner, "netns", &ns]).unwrap();
            ip(&["link", "set", &outer, "master", &bridge, "up"]).unwrap();
            let addr = format!("{}/24", net.addr(i));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", &inner]).unwrap();
            ip(&["-n", &ns, "link", "set", &inner, "up"]).unwrap();
            ip(&["-n", &ns, "link", "set", "lo", "up"]).unwrap();
        }
        net
    }

    /// The root namespace's address on the bridge.
    fn host(&self) -> String {
        format!("{}.1", self.prefix)
    }

    /// The address of the `i`th namespace.
    fn addr(&self, i: usize) -> String {
        format!("{}.{}", self.prefix, i + 2)
    }

    fn ns(&self, i: usize) -> &str {
        &self.namespaces[i]
    }

    /// What of this net the host still lists.
    fn left(suffix: &str) -> Vec<String> {
        let listed =
            ip(&["netns", "list"]).unwrap_or_default() + &ip(&["link"]).unwrap_or_default();
        listed
            .lines()
            .filter(|l| l.contains(suffix))
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting one end deletes the pair at once (a namespace's own
        // devices go when the kernel gets to freeing it, a moment later).
        for veth in self.veths.drain(..) {
            if let Err(e) = ip(&["link", "del", &veth]) {
                eprintln!("many_machines: {e}");
            }
        }
        for ns in self.namespaces.drain(..) {
            if let Err(e) = ip(&["netns", "del", &ns]) {
                eprintln!("many_machines: {e}");
            }
        }
        if let Some(bridge) = self.bridge.take()
            && let Err(e) = ip(&["link", "del", &bridge])
        {
            eprintln!("many_machines: {e}");
        }
    }
}

// ---------------------------------------------------------------------------
// A TCP forwarder: PostgreSQL's way in, and the load balancer.

struct Proxy {
    addr: SocketAddr,
    shared: Arc<ProxyShared>,
    accept: tokio::task::JoinHandle<()>,
}

struct ProxyShared {
    backends: Vec<SocketAddr>,
    /// Backends marked down: skipped by new connections, and their open
    /// connections closed (as a load balancer whose health check fails
    /// does, so no kept-alive connection goes on to an unhealthy node).
    down: watch::Sender<Vec<bool>>,
    next: AtomicUsize,
    /// While true: new connections are closed at once, open ones dropped.
    cut: watch::Sender<bool>,
}

impl Proxy {
    async fn start(bind: &str, backends: Vec<SocketAddr>) -> Proxy {
        let listener = TcpListener::bind(format!("{bind}:0")).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(ProxyShared {
            down: watch::channel(vec![false; backends.len()]).0,
            backends,
            next: AtomicUsize::new(0),
            cut: watch::channel(false).0,
        });
        let s = Arc::clone(&shared);
        let accept = tokio::spawn(async move {
            // Dropped with the accept loop: aborts every connection.
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                while conns.try_join_next().is_some() {}
                conns.spawn(forward(Arc::clone(&s), inbound));
            }
        });
        Proxy {
            addr,
            shared,
            accept,
        }
    }

    /// Cuts (`true`) or restores (`false`) everything through this proxy.
    fn cut(&self, cut: bool) {
        self.shared.cut.send_replace(cut);
    }

    fn mark_down(&self, backend: usize, down: bool) {
        self.shared.down.send_modify(|d| d[backend] = down);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn forward(shared: Arc<ProxyShared>, mut inbound: TcpStream) {
    let mut cut = shared.cut.subscribe();
    if *cut.borrow() {
        return;
    }
    let n = shared.backends.len();
    let first = shared.next.fetch_add(1, Ordering::Relaxed);
    let mut down = shared.down.subscribe();
    let mut outbound = None;
    for i in 0..n {
        let b = (first + i) % n;
        if down.borrow()[b] {
            continue;
        }
        let connect = TcpStream::connect(shared.backends[b]);
        if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(3), connect).await {
            outbound = Some((b, s));
            break;
        }
    }
    let Some((b, mut outbound)) = outbound else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = cut.wait_for(|c| *c) => {}
        _ = down.wait_for(|d| d[b]) => {}
    }
}

// ---------------------------------------------------------------------------
// Chat turns as a browser makes them.

/// What the turn drivers share.
struct Cluster {
    client: reqwest::Client,
    /// The two nodes' own URLs (a = 0, b = 1).
    nodes: [String; 2],
    /// `Host` of the public URL: what a load balancer passes on.
    host: String,
    key: String,
    at_once: Semaphore,
    /// Logical turns finished (ended, or given up after refusals).
    finished: AtomicUsize,
    /// Per node: turns streaming from it right now, past their first step.
    in_step: [AtomicUsize; 2],
}

/// How one logical turn went.
#[derive(Debug, Default, Clone)]
struct TurnLog {
    chat: usize,
    k: usize,
    /// The accepted turn's id and how it ended.
    turn_id: Option<String>,
    status: Option<String>,
    error_code: Option<String>,
    /// Its client resumed on the other node (its first node went away).
    moved: bool,
    /// Refused attempts before it: `(node, status, code)`.
    refused: Vec<(usize, u16, String)>,
    /// Turn ids the system named that this client never followed (an
    /// attempt cut before its answer, named by a later `409`).
    orphans: Vec<String>,
    /// How many logical turns had finished when this one did.
    at: usize,
    /// The node that accepted it.
    node: Option<usize>,
    /// Refused before its first line (a problem answer naming the turn):
    /// the client was told at once, no line of it was lost.
    refused_at_start: bool,
}

/// SSE frames of one turn as they arrive.
#[derive(Default)]
struct Sse {
    buf: String,
    last_id: Option<u64>,
    ids: Vec<u64>,
    turn_id: Option<String>,
    error_code: Option<String>,
    done: Option<Value>,
    steps: usize,
}

impl Sse {
    fn push(&mut self, chunk: &[u8]) {
        self.buf.push_str(&String::from_utf8_lossy(chunk));
        while let Some(end) = self.buf.find("\n\n") {
            let frame: String = self.buf.drain(..end + 2).collect();
            let (mut id, mut event, mut data) = (None, "", String::new());
            for line in frame.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse::<u64>().ok();
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            let data: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
            if let Some(id) = id {
                self.last_id = Some(id);
                self.ids.push(id);
            }
            match event {
                "turn" => {
                    let t = data["turnId"].as_str().map(str::to_owned);
                    if self.turn_id.is_none() {
                        self.turn_id = t;
                    }
                }
                "step" => self.steps += 1,
                "error" => self.error_code = data["code"].as_str().map(str::to_owned),
                "done" => self.done = Some(data),
                _ => {}
            }
        }
    }
}

enum StreamEnd {
    Done,
    Broke,
}

impl Cluster {
    fn post(&self, node: usize, path: &str) -> reqwest::RequestBuilder {
        self.client
            .post(format!("{}{path}", self.nodes[node]))
            .header(reqwest::header::HOST, &self.host)
            .bearer_auth(&self.key)
    }

    fn get(&self, node: usize, path: &str) -> reqwest::RequestBuilder {
        self.client
            .get(format!("{}{path}", self.nodes[node]))
            .header(reqwest::header::HOST, &self.host)
            .bearer_auth(&self.key)
    }

    /// Reads frames until `done` or the stream breaks; counts the turn as
    /// in a step on `node` while it is.
    async fn follow(&self, node: usize, mut resp: reqwest::Response, sse: &mut Sse) -> StreamEnd {
        let mut counted = false;
        let end = loop {
            // Keep-alive comments come every 15 s: a minute of silence is a
            // hung stream.
            match tokio::time::timeout(Duration::from_secs(60), resp.chunk()).await {
                Ok(Ok(Some(c))) => {
                    sse.push(&c);
                    if sse.done.is_some() {
                        break StreamEnd::Done;
                    }
                    if !counted && sse.steps > 0 {
                        counted = true;
                        self.in_step[node].fetch_add(1, Ordering::SeqCst);
                    }
                }
                Ok(Ok(None) | Err(_)) => break StreamEnd::Broke,
                Err(_) => panic!("no frame for 60 s on node {node}: {:?}", sse.turn_id),
            }
        };
        if counted {
            self.in_step[node].fetch_sub(1, Ordering::SeqCst);
        }
        end
    }

    /// Starts an API run (protocol 2) on `node` whose step prints, sleeps
    /// long enough to outlive the node, and prints again; returns its id and
    /// its lines up to the first output, once it came.
    async fn api_run_started(&self, node: usize) -> (String, Vec<Value>) {
        let prompt = script(json!([
            {"tool": "shell", "args": {"command": "echo api-working; sleep 20; echo api-finished"}},
            {"say": "the api run is done"}
        ]));
        let mut resp = self
            .post(node, "/api/runs")
            .json(&json!({"prompt": prompt, "protocol": 2}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let id = resp.headers()["x-asbx-run-id"].to_str().unwrap().to_owned();
        let mut buf = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !String::from_utf8_lossy(&buf).contains("api-working") {
            assert!(Instant::now() < deadline, "the api run never printed");
            match tokio::time::timeout(Duration::from_secs(60), resp.chunk()).await {
                Ok(Ok(Some(c))) => buf.extend_from_slice(&c),
                other => panic!("the api run's stream ended early: {other:?}"),
            }
        }
        let end = buf.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let lines = buf[..end]
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        (id, lines)
    }

    /// Resumes the API run `id` on `node` after the last of `seen` and reads
    /// it to its end: the output once, in order, and the run succeeded.
    async fn api_run_resumed(&self, node: usize, id: &str, seen: Vec<Value>) {
        let after = seen.last().and_then(|l| l["seq"].as_u64()).unwrap_or(0);
        let resp = self
            .get(node, &format!("/api/runs/{id}/events?after={after}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let rest = tokio::time::timeout(Duration::from_secs(120), resp.bytes())
            .await
            .expect("the taken-over run ended in time")
            .unwrap();
        let mut lines = seen;
        lines.extend(
            rest.split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| serde_json::from_slice::<Value>(l).unwrap()),
        );
        let seqs: Vec<u64> = lines.iter().filter_map(|l| l["seq"].as_u64()).collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "in order, no repeat: {seqs:?}"
        );
        let output: String = lines
            .iter()
            .filter(|l| l["type"] == "stdout")
            .filter_map(|l| l["chunk"].as_str())
            .collect();
        assert_eq!(output, "api-working\napi-finished\n", "{lines:?}");
        let run: Value = self
            .get(node, &format!("/api/runs/{id}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(run["status"], "succeeded", "{run}");
    }

    /// The thread of chat `chat_id` from `node`.
    async fn thread(&self, node: usize, chat_id: &str) -> Result<Value, String> {
        let r = self
            .get(node, &format!("/api/assistant/chats/{chat_id}?limit=500"))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !r.status().is_success() {
            return Err(format!(
                "{}: {}",
                r.status(),
                r.text().await.unwrap_or_default()
            ));
        }
        r.json().await.map_err(|e| e.to_string())
    }

    /// Runs logical turn `k` of chat `chat` (creating the chat on its first
    /// turn), first on `node`, retrying refused attempts on the other node
    /// and resuming a broken stream on either.
    async fn turn(
        &self,
        chat: usize,
        k: usize,
        chat_id: &mut Option<String>,
        node: usize,
    ) -> TurnLog {
        let mut log = TurnLog {
            chat,
            k,
            ..TurnLog::default()
        };
        let deadline = Instant::now() + TURN_DEADLINE;
        let prompt = script(json!([
            {"tool": "shell", "args": {"command": format!("echo turn-{chat}-{k}; sleep 1")}},
            {"say": format!("answer {chat}-{k}")}
        ]));
        let mut node = node;
        loop {
            assert!(
                Instant::now() < deadline,
                "chat {chat} turn {k} never got going: {log:?}"
            );
            let permit = self.at_once.acquire().await.unwrap();
            let mut body = json!({ "message": prompt });
            if let Some(id) = chat_id.as_deref() {
                body["chatId"] = json!(id);
            }
            let sent = self
                .post(node, "/api/assistant/chat/stream")
                .json(&body)
                .send()
                .await;
            let resp = match sent {
                Ok(r) => r,
                Err(_) => {
                    // The node is gone (or went while answering).
                    drop(permit);
                    node = 1 - node;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let header = |name: &str| {
                resp.headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            if chat_id.is_none() {
                *chat_id = header("x-asbx-chat-id");
            }
            let status = resp.status().as_u16();
            if status != 200 {
                let turn_id = header("x-asbx-turn-id");
                let problem: Value = resp.json().await.unwrap_or(Value::Null);
                let code = problem["code"].as_str().unwrap_or("").to_owned();
                assert!(
                    !code.is_empty(),
                    "a refusal without a problem code ({status}): {problem}"
                );
                drop(permit);
                if let Some(turn_id) = turn_id {
                    // Refused by the runner before a line: the failure is
                    // stored as the turn's message.
                    log.turn_id = Some(turn_id);
                    log.status = Some("failed".to_owned());
                    log.error_code = Some(code);
                    log.refused_at_start = true;
                    return log;
                }
                if status == 409
                    && let Some(t) = problem["turnId"].as_str()
                    && !log.orphans.iter().any(|o| o == t)
                {
                    log.orphans.push(t.to_owned());
                }
                log.refused.push((node, status, code));
                if status != 409 {
                    node = 1 - node;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
            log.node = Some(node);
            let mut sse = Sse::default();
            let mut on = node;
            let mut end = self.follow(on, resp, &mut sse).await;
            log.turn_id = sse.turn_id.clone();
            assert!(
                log.turn_id.is_some(),
                "a turn stream without its turn event"
            );
            // The stream broke: resume where it left off, on the other node
            // first (this one may be gone), until the turn ends.
            while let StreamEnd::Broke = end {
                assert!(
                    Instant::now() < deadline,
                    "chat {chat} turn {:?} hung: {log:?}",
                    log.turn_id
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
                let chat_id = chat_id.as_deref().expect("a chat id with the turn");
                for n in [1 - on, on] {
                    let r = self
                        .get(n, &format!("/api/assistant/chats/{chat_id}/stream"))
                        .header("Last-Event-ID", sse.last_id.unwrap_or(0).to_string())
                        .send()
                        .await;
                    let Ok(r) = r else { continue };
                    if r.status() == 200 {
                        let before = sse.turn_id.clone();
                        sse.turn_id = None;
                        let mut replay = Sse {
                            last_id: sse.last_id,
                            ..Sse::default()
                        };
                        end = self.follow(n, r, &mut replay).await;
                        sse.turn_id = before;
                        if replay.turn_id.is_some() && replay.turn_id != sse.turn_id {
                            // Not ours: ours ended a while ago.
                            end = StreamEnd::Broke;
                            if let Some(o) = self.outcome_in_thread(n, chat_id, &log).await {
                                sse.done = Some(json!({"status": o.0}));
                                sse.error_code = o.1.or(sse.error_code.take());
                                end = StreamEnd::Done;
                            }
                            break;
                        }
                        sse.ids.extend(replay.ids);
                        sse.last_id = replay.last_id.or(sse.last_id);
                        sse.error_code = replay.error_code.or(sse.error_code.take());
                        sse.done = replay.done;
                        if n != node {
                            log.moved = true;
                        }
                        on = n;
                        break;
                    }
                    if r.status() == 404 {
                        // Nothing to resume: the turn ended, or its node
                        // died before it stored it; the thread says which.
                        if let Some(outcome) = self.outcome_in_thread(n, chat_id, &log).await {
                            sse.done = Some(json!({"status": outcome.0}));
                            sse.error_code = outcome.1.or(sse.error_code.take());
                            end = StreamEnd::Done;
                            log.moved |= n != node;
                            break;
                        }
                    }
                }
            }
            drop(permit);
            assert!(
                sse.ids.windows(2).all(|w| w[0] < w[1]),
                "frames after Last-Event-ID in order, none twice: {:?}",
                sse.ids
            );
            let done = sse.done.unwrap_or_default();
            log.status = done["status"].as_str().map(str::to_owned);
            log.error_code = sse.error_code;
            if log.status.as_deref() == Some("failed") && log.error_code.is_none() {
                // The stream's last node died after sending a line it never
                // stored, and the replay could not tell that from an
                // `error` this client already had (docs/protocol.md §7):
                // the stored message says why, as a client reads it.
                let chat_id = chat_id.as_deref().expect("a chat id with the turn");
                for n in [on, 1 - on] {
                    if let Some((_, code)) = self.outcome_in_thread(n, chat_id, &log).await {
                        log.error_code = code;
                        break;
                    }
                }
            }
            return log;
        }
    }

    /// The status (and error code) of the turn's assistant message in the
    /// thread, once it is there.
    async fn outcome_in_thread(
        &self,
        node: usize,
        chat_id: &str,
        log: &TurnLog,
    ) -> Option<(String, Option<String>)> {
        let thread = self.thread(node, chat_id).await.ok()?;
        let message = thread["messages"]
            .as_array()?
            .iter()
            .find(|m| m["role"] == "assistant" && m["turnId"].as_str() == log.turn_id.as_deref())?;
        let error = message["content"]
            .as_array()?
            .iter()
            .find(|b| b["type"] == "error");
        Some(match error {
            Some(e) => ("failed".to_owned(), e["code"].as_str().map(str::to_owned)),
            None => ("succeeded".to_owned(), None),
        })
    }
}

/// A workspace API key for the shared database (`asbx key`).
fn api_key(database_url: &str) -> String {
    let data = tempfile::tempdir().unwrap();
    let out = Command::new(ASBX)
        .args(["key", "--name", "many-machines"])
        .env_clear()
        .env("ASBX_DATA", data.path())
        .env("DATABASE_URL", database_url)
        .env("ASBX_SECRET_KEY", crate::harness::TEST_SECRET_KEY)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("key"))
        .map(|k| k.trim().to_owned())
        .expect("a key line")
}

fn pairs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

fn socket(url: &str) -> SocketAddr {
    let u = reqwest::Url::parse(url).unwrap();
    format!("{}:{}", u.host_str().unwrap(), u.port().unwrap())
        .parse()
        .unwrap()
}

/// Removes the cgroup at `path` and its child cgroups (a sandbox's
/// `tools` and `mcp`) if no process is in any of them (`rmdir` fails on one
/// that holds a process); says so.
fn empty_cgroup_removed(path: &str) -> bool {
    fn remove(path: &std::path::Path) -> bool {
        let children_gone = std::fs::read_dir(path)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_dir())
            .all(|e| remove(&e.path()));
        let procs = std::fs::read_to_string(path.join("cgroup.procs")).unwrap_or_default();
        children_gone && procs.trim().is_empty() && std::fs::remove_dir(path).is_ok()
    }
    let removed = remove(std::path::Path::new(path));
    if removed {
        eprintln!("many machines: removed the killed runner's empty cgroup {path}");
    }
    removed
}

/// A cgroup's path with the processes in it (each pid's command line) and
/// its child cgroups: what a leftover holds.
fn cgroup_contents(path: &str) -> String {
    let procs = std::fs::read_to_string(format!("{path}/cgroup.procs")).unwrap_or_default();
    let procs: Vec<String> = procs
        .split_whitespace()
        .map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            format!("{pid} {}", String::from_utf8_lossy(&cmd).replace('\0', " "))
        })
        .collect();
    let children: Vec<String> = std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    format!("{path} procs {procs:?} children {children:?}")
}

/// Waits (bounded) until `ready`, polling.
async fn until(what: &str, within: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ready() {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_two_runners_lose_nothing_when_nodes_and_runners_die() {
    let name = "many_machines::two_nodes_two_runners_lose_nothing_when_nodes_and_runners_die";
    let Ok(server) = std::env::var("ASBX_TEST_PG_URL") else {
        asbx_test_support::skip(name, "set ASBX_TEST_PG_URL to run the many-node tests");
        return;
    };
    if let Err(e) = Net::possible() {
        asbx_test_support::skip(name, &format!("no network namespaces here: {e}"));
        return;
    }
    let started = Instant::now();
    // Declared first: dropped last, after every process in it.
    let net = Net::create(&["wa", "wb", "ra", "rb"]);
    let suffix = net.suffix.clone();
    let db = PgDatabase::create(&server, "asbx_many");
    let key = api_key(&db.url);
    let pg = socket(&server);
    let pg_a = Proxy::start(&net.host(), vec![pg]).await;
    let pg_b = Proxy::start(&net.host(), vec![pg]).await;
    let db_url = |proxy: &Proxy| {
        let mut u = reqwest::Url::parse(&db.url).unwrap();
        u.set_host(Some(&proxy.addr.ip().to_string())).unwrap();
        u.set_port(Some(proxy.addr.port())).unwrap();
        u.to_string()
    };
    let (db_a, db_b) = (db_url(&pg_a), db_url(&pg_b));

    // The nodes' ports are chosen here, so the load balancer knows them.
    let port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let listen = [
        format!("{}:{}", net.addr(0), port()),
        format!("{}:{}", net.addr(1), port()),
    ];
    let lb = Proxy::start(
        &net.host(),
        listen.iter().map(|l| l.parse().unwrap()).collect(),
    )
    .await;
    let public = format!("http://{}", lb.addr);
    let runner_token = hex::encode(rand::random::<[u8; 16]>());
    let runner_env = [
        ("ASBX_RUNNER_TOKEN", runner_token.as_str()),
        ("ASBX_WORKSPACE_ORIGINS", public.as_str()),
        ("ASBX_MAX_SANDBOXES", "8"),
    ];
    let runner_a = RunnerProc::start_in_netns(net.ns(2), &net.addr(2), &runner_env);
    let mut runner_b = RunnerProc::start_in_netns(net.ns(3), &net.addr(3), &runner_env);
    let fleet = format!("{},{}", runner_a.url, runner_b.url);
    let node_env = |db: &str| -> Vec<(String, String)> {
        vec![
            ("DATABASE_URL".into(), db.to_owned()),
            (
                "ASBX_SECRET_KEY".into(),
                crate::harness::TEST_SECRET_KEY.to_owned(),
            ),
            ("SANDBOX_URL".into(), fleet.clone()),
            ("ASBX_RUNNER_TOKEN".into(), runner_token.clone()),
            ("ASBX_PUBLIC_URL".into(), public.clone()),
            ("ASBX_REQUIRE_AUTH".into(), "1".into()),
        ]
    };
    let env_a = node_env(&db_a);
    let env_b = node_env(&db_b);
    let mut node_a = WorkspaceProc::start_in_netns(net.ns(0), &listen[0], &pairs(&env_a));
    let node_b = WorkspaceProc::start_in_netns(net.ns(1), &listen[1], &pairs(&env_b));

    let cluster = Arc::new(Cluster {
        client: reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .build()
            .unwrap(),
        nodes: [node_a.url.clone(), node_b.url.clone()],
        host: lb.addr.to_string(),
        key,
        at_once: Semaphore::new(AT_ONCE),
        finished: AtomicUsize::new(0),
        in_step: Default::default(),
    });

    // 20 chats, each its 10 turns one after another, spread over the nodes.
    let mut drivers = tokio::task::JoinSet::new();
    for chat in 0..CHATS {
        let c = Arc::clone(&cluster);
        drivers.spawn(async move {
            let mut chat_id = None;
            let mut logs = Vec::new();
            for k in 0..TURNS_PER_CHAT {
                let mut log = c.turn(chat, k, &mut chat_id, (chat + k) % 2).await;
                log.at = c.finished.fetch_add(1, Ordering::SeqCst);
                logs.push(log);
            }
            (chat_id, logs)
        });
    }

    // The trouble, while the turns run.
    let finished = |n: usize| {
        let c = Arc::clone(&cluster);
        move || c.finished.load(Ordering::SeqCst) >= n
    };
    let total = CHATS * TURNS_PER_CHAT;
    until("20 turns", Duration::from_secs(120), finished(20)).await;
    // Node b loses PostgreSQL for 10 s; the load balancer's probe sees it.
    lb.mark_down(1, true);
    pg_b.cut(true);
    let cut_at = cluster.finished.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    pg_b.cut(false);
    lb.mark_down(1, false);
    let restored_at = cluster.finished.load(Ordering::SeqCst);

    // The other failures come a while after the cut (or at once if the
    // turns raced past while it lasted), with turns left to go.
    let at = (restored_at + 10).min(total - 60);
    until(
        "the turns after the cut",
        Duration::from_secs(120),
        finished(at),
    )
    .await;
    // Runner b dies while it runs a sandbox.
    let healthz = format!("{}/healthz", runner_b.url);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let h: Value = reqwest::get(&healthz).await.unwrap().json().await.unwrap();
        if h["sessions"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "runner b never got a turn: {h}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    runner_b.sigkill();
    let runner_killed_at = cluster.finished.load(Ordering::SeqCst);

    let at = (runner_killed_at + 15).min(total - 30);
    until(
        "the turns after the runner died",
        Duration::from_secs(120),
        finished(at),
    )
    .await;
    // An API run on node a, mid-step when node a dies: node b takes it over.
    let (api_run, api_seen) = cluster.api_run_started(0).await;
    // Node a dies while it drives the run and, most times, a turn mid-step
    // too: the chats left by now may all be on node b (they move when
    // refused), so the wait for one on node a is bounded and not asserted.
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.in_step[0].load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let turns_in_step_on_a = cluster.in_step[0].load(Ordering::SeqCst);
    node_a.kill();
    let node_killed_at = cluster.finished.load(Ordering::SeqCst);

    // The run's client resumes on node b where it left off: the rest of the
    // output once, in order, and the run succeeded there.
    cluster.api_run_resumed(1, &api_run, api_seen).await;

    let mut chats: BTreeMap<usize, (String, Vec<TurnLog>)> = BTreeMap::new();
    while let Some(r) = drivers.join_next().await {
        let (chat_id, logs) = r.unwrap();
        let chat = logs[0].chat;
        chats.insert(chat, (chat_id.expect("every chat was made"), logs));
    }
    assert_eq!(cluster.finished.load(Ordering::SeqCst), total);
    let ran_for = started.elapsed();

    // Every logical turn was accepted in the end and ended.
    let logs: Vec<&TurnLog> = chats.values().flat_map(|(_, l)| l).collect();
    let mut ok = 0;
    let mut failed: BTreeMap<String, usize> = BTreeMap::new();
    let mut refused: BTreeMap<String, usize> = BTreeMap::new();
    let mut moved = 0;
    for log in &logs {
        let status = log.status.as_deref();
        assert!(
            log.turn_id.is_some() && matches!(status, Some("succeeded" | "failed" | "cancelled")),
            "an accepted turn without an end: {log:?}"
        );
        match status {
            Some("succeeded") => ok += 1,
            _ => {
                println!("failed: {log:?}");
                let code = log.error_code.clone().unwrap_or_default();
                assert!(!code.is_empty(), "a failed turn without a reason: {log:?}");
                *failed.entry(code).or_default() += 1;
            }
        }
        for (_, s, code) in &log.refused {
            *refused.entry(format!("{s} {code}")).or_default() += 1;
        }
        moved += usize::from(log.moved);
    }
    println!(
        "many machines: {} turns in {:.1} s: {ok} ok, failed with reason {failed:?}, \
         {moved} resumed on the other node; refused attempts {refused:?}; \
         cut at {cut_at}..{restored_at}, runner killed at {runner_killed_at}, node killed at \
         {node_killed_at} with {turns_in_step_on_a} turns mid-step on it",
        logs.len(),
        ran_for.as_secs_f64()
    );
    assert!(
        failed.get("runner_lost").copied().unwrap_or(0) >= 1,
        "the turn on the killed runner ended runner_lost: {failed:?}"
    );
    assert!(moved >= 1, "a client of the killed node resumed on node b");
    // A turn fails only for a reason the test gave it: the dead runner's
    // (a turn it ran ends once its node gave up re-attaching, the detach
    // grace after the kill; later turns go to the live runner) or the cut
    // (a turn that was finishing while the cut began). Node a's death fails
    // none: its turns are taken over, and a sandbox callback it was
    // answering is answered again by node b (`callbacks::replay`), so no
    // `bootstrap_failed` nor `otp_rejected`. `at` counts ends, so a window
    // is a few rounds of turns wide.
    let near =
        |at: usize, from: usize, to: usize| at + 2 * AT_ONCE >= from && at <= to + 2 * AT_ONCE;
    for log in logs
        .iter()
        .filter(|l| l.status.as_deref() != Some("succeeded"))
    {
        let lost = log.error_code.as_deref() == Some("runner_lost")
            && log.at + 2 * AT_ONCE >= runner_killed_at;
        // A turn starting as node a dies may be refused at once: its
        // sandbox restores the chat's working directory from the load
        // balancer, which may keep sending the blob requests to the dead
        // node past the runner's few tries. The runner refuses it `502
        // workdir_unavailable` (it was `500 internal`, unexplained, before
        // the tries), the client gets the problem and no line is lost, so
        // it is tolerated there and only there; a turn that started and
        // failed is not.
        let refused_as_a_died = log.refused_at_start
            && log.error_code.as_deref() == Some("workdir_unavailable")
            && near(log.at, node_killed_at, node_killed_at);
        assert!(
            lost || refused_as_a_died || near(log.at, cut_at, restored_at),
            "a failure the test did not cause (node a killed at {node_killed_at}): {log:?}"
        );
    }
    // Node b refused work while cut off, with a problem (checked above).
    let b_refused = logs
        .iter()
        .flat_map(|l| &l.refused)
        .filter(|(node, status, _)| *node == 1 && *status >= 500)
        .count();
    assert!(b_refused > 0, "node b refused nothing while cut off");
    // Node b serves again after its cut, by itself.
    let b_after_cut = logs
        .iter()
        .filter(|l| l.at > restored_at && l.node == Some(1))
        .filter(|l| l.status.as_deref() == Some("succeeded"))
        .count();
    assert!(b_after_cut > 0, "node b served no turn after its cut");

    // Every thread, from node b and from a fresh node: each turn's user
    // message and answer exactly once, in the order the turns ran.
    // Through node a's way to PostgreSQL: 127.0.0.1 in a namespace is its own.
    let fresh_env = node_env(&db_a);
    // Listens where node a did: the load balancer's backends stay right.
    let fresh = WorkspaceProc::start_in_netns(net.ns(0), &listen[0], &pairs(&fresh_env));
    let mut turns_seen = Vec::new();
    for (chat_id, logs) in chats.values() {
        let from_b = cluster.thread(1, chat_id).await.unwrap();
        let from_fresh = cluster.thread(0, chat_id).await.unwrap();
        assert_eq!(
            from_b["messages"], from_fresh["messages"],
            "the same thread from either node"
        );
        assert!(from_b["activeTurnId"].is_null(), "{from_b}");
        assert!(from_b["before"].is_null(), "the whole thread in one page");
        let messages = from_b["messages"].as_array().unwrap();
        // Pairs: the user message, then the turn's one answer.
        assert!(messages.len() % 2 == 0, "{from_b}");
        let mut order = Vec::new();
        for pair in messages.chunks(2) {
            let turn = pair[0]["turnId"].as_str().expect("a turn id").to_owned();
            assert_eq!(pair[0]["role"], "user", "{pair:?}");
            assert_eq!(pair[1]["role"], "assistant", "{pair:?}");
            assert_eq!(pair[1]["turnId"].as_str(), Some(turn.as_str()), "{pair:?}");
            order.push((turn, pair.to_vec()));
        }
        let ids: Vec<&str> = order.iter().map(|(t, _)| t.as_str()).collect();
        let mut unique = ids.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(
            unique.len(),
            ids.len(),
            "a turn twice in {chat_id}: {ids:?}"
        );
        // The accepted turns, in the order they ran; any other turn is an
        // attempt whose answer never reached its client (a node died
        // while answering), ended all the same.
        let accepted: Vec<&str> = logs.iter().filter_map(|l| l.turn_id.as_deref()).collect();
        let in_thread: Vec<&str> = ids
            .iter()
            .copied()
            .filter(|t| accepted.contains(t))
            .collect();
        assert_eq!(in_thread, accepted, "the accepted turns, once, in order");
        for log in logs {
            let (_, pair) = order
                .iter()
                .find(|(t, _)| Some(t.as_str()) == log.turn_id.as_deref())
                .unwrap();
            let text = pair[0]["content"][0]["text"].as_str().unwrap_or_default();
            assert!(
                text.contains(&format!("turn-{}-{}", log.chat, log.k)),
                "the user message of {log:?}: {text}"
            );
            let answer = pair[1]["content"].to_string();
            if log.status.as_deref() == Some("succeeded") {
                assert!(
                    answer.contains(&format!("answer {}-{}", log.chat, log.k))
                        && answer.contains(&format!("turn-{}-{}", log.chat, log.k)),
                    "the answer of {log:?}: {answer}"
                );
            } else {
                assert!(answer.contains("\"error\""), "{log:?}: {answer}");
            }
        }
        turns_seen.extend(ids.iter().map(|s| s.to_string()));
    }

    // Nothing left running or leased.
    let running = db.query("SELECT id FROM runs WHERE status = 'running'");
    assert!(running.trim().is_empty(), "runs left running: {running}");
    let leased = db.query("SELECT id FROM chats WHERE lease_turn_id IS NOT NULL");
    assert!(leased.trim().is_empty(), "chats left leased: {leased}");

    // Nothing left on the host: sandboxes, cgroups, processes.
    let sessions = runner_a.sessions_dir();
    until(
        "runner a's session folders gone",
        Duration::from_secs(30),
        || std::fs::read_dir(&sessions).map_or(true, |d| d.count() == 0),
    )
    .await;
    let listed = runner_a.sessions_listed(&runner_token).await;
    let running: Vec<_> = listed.iter().filter(|(_, s)| s != "ended").collect();
    assert!(running.is_empty(), "runner a still runs {running:?}");
    let mut needles = turns_seen.clone();
    let dead_warm = format!("asbx-warm-{}-", runner_b.pid());
    needles.push(dead_warm.clone());
    let dead_data = runner_b.data.path().display().to_string();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut cgroups = cgroups_named(&needles);
        // Known gap (docs/isolation.md): a warm sandbox whose zygote fork
        // the killed runner's death interrupted may leave its cgroups,
        // empty, to the next runner's sweep of old empty ones. Empty ones
        // of the dead runner's warm pool are removed here and named; one
        // holding a process fails the test.
        cgroups.retain(|path| !(path.contains(&dead_warm) && empty_cgroup_removed(path)));
        let procs = pids_mentioning(&dead_data);
        if cgroups.is_empty() && procs.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: cgroups {:?}, processes of the killed runner {procs:?}",
            cgroups
                .iter()
                .map(|c| cgroup_contents(c))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(fresh);
    drop(node_b);
    drop(node_a);
    drop(runner_a);
    drop(runner_b);
    drop(cluster);
    drop((lb, pg_a, pg_b));
    let left = pids_mentioning(&db.name);
    assert!(left.is_empty(), "workspace processes left: {left:?}");
    drop(db);
    drop(net);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = Net::left(&suffix);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "namespaces or links left: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
