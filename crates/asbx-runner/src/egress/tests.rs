//! The egress proxy's tests: the address ranges, the allow list, and the
//! proxy itself over real sockets with a fake resolver.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use futures::future::BoxFuture;
use tokio::net::{TcpListener, UnixStream};

use super::address::{is_own_address, is_public};
use super::settings::Resolve;
use super::*;

#[test]
fn allow_list_matches_exact_and_subdomains_only() {
    let a = AllowList::default();
    a.set(vec!["PyPI.org.".into(), "*.example.com".into()]);
    assert!(a.check("pypi.org", 443).is_ok());
    assert!(a.check("files.example.com", 443).is_ok());
    assert!(a.check("a.b.example.com", 80).is_ok());
    for bad in ["example.com", "evilexample.com", "pypi.org.evil.net"] {
        assert!(
            matches!(a.check(bad, 443), Err(Refusal::NotAllowed(_))),
            "{bad}"
        );
    }
    assert!(
        AllowList::default().check("pypi.org", 443).is_err(),
        "default: nothing"
    );
}

#[test]
fn ports_are_443_and_80_unless_an_entry_names_one() {
    let a = AllowList::default();
    a.set(vec!["pypi.org".into(), "example.com:8443".into()]);
    assert!(a.check("pypi.org", 443).is_ok());
    assert!(a.check("pypi.org", 80).is_ok());
    assert!(matches!(
        a.check("pypi.org", 22),
        Err(Refusal::PortNotAllowed(..))
    ));
    // A `host:port` entry matches (it never did before) and only on its port.
    assert!(a.check("example.com", 8443).is_ok());
    assert!(matches!(
        a.check("example.com", 443),
        Err(Refusal::PortNotAllowed(..))
    ));
}

#[test]
fn internal_ranges_are_not_public() {
    for ip in [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "255.255.255.255",
        "224.0.0.1",
        "192.0.0.1",
        "192.0.2.1",    // TEST-NET-1
        "198.51.100.7", // TEST-NET-2
        "203.0.113.9",  // TEST-NET-3
        "198.18.0.1",   // benchmarking
        "198.19.255.1", // benchmarking
        "240.0.0.1",    // reserved
        "192.88.99.1",  // 6to4 relay anycast
        "::1",
        "::",
        "::7f00:1",  // IPv4-compatible
        "::8.8.8.8", // IPv4-compatible, even of a public v4
        "fe80::1",
        "fec0::1", // site-local
        "fd00::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "64:ff9b::a00:1",   // NAT64 of 10.0.0.1
        "64:ff9b::808:808", // NAT64 of 8.8.8.8: refused whole
        "64:ff9b:1::1",     // local-use NAT64
        "2002:7f00:1::1",   // 6to4 of 127.0.0.1
        "2002:a00:1::1",    // 6to4 of 10.0.0.1
        "2001::1",          // Teredo
        "2001:0:4136:e378::1",
        "2001:db8::1",
        "2001:10::1",
        "2001:2::1",
        "100::1",
        "ff02::1",
    ] {
        assert!(!is_public(ip.parse().unwrap()), "{ip} counted as public");
    }
    for ip in [
        "1.1.1.1",
        "151.101.0.223",
        "192.0.3.1",
        "198.20.0.1",
        "203.0.114.1",
        "2606:4700::1111",
        "2002:808:808::1", // 6to4 of 8.8.8.8
        "::ffff:8.8.8.8",
    ] {
        assert!(is_public(ip.parse().unwrap()), "{ip} counted as internal");
    }
}

#[test]
fn cidrs() {
    let c = Cidr::parse("10.213.0.0/30").unwrap();
    assert!(c.contains("10.213.0.2".parse().unwrap()));
    assert!(!c.contains("10.213.0.4".parse().unwrap()));
    assert!(!c.contains("::1".parse().unwrap()));
    assert!(Cidr::parse("::1").unwrap().contains("::1".parse().unwrap()));
    assert!(
        Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap())
    );
    for bad in ["", "10.0.0.0/33", "x/8", "::/129"] {
        assert!(Cidr::parse(bad).is_none(), "{bad}");
    }
}

#[test]
fn own_addresses_are_recognized() {
    // Loopback is an interface address of every host; a TEST-NET one is not.
    assert!(is_own_address("127.0.0.1".parse().unwrap()));
    assert!(!is_own_address("192.0.2.77".parse().unwrap()));
}

/// Maps names to fixed addresses.
#[derive(Debug, Default)]
struct FakeDns(HashMap<String, Vec<IpAddr>>);

impl Resolve for FakeDns {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        let found = self
            .0
            .get(host)
            .map(|ips| ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect());
        Box::pin(async move { found.ok_or_else(|| std::io::Error::other("no such name")) })
    }
}

/// An upstream that records what it receives and answers plain HTTP.
struct Upstream {
    addr: SocketAddr,
    conns: Arc<AtomicUsize>,
    received: Arc<std::sync::Mutex<Vec<u8>>>,
}

async fn upstream_on(bind: SocketAddr) -> Upstream {
    let listener = TcpListener::bind(bind).await.unwrap();
    upstream_from(listener)
}

fn upstream_from(listener: TcpListener) -> Upstream {
    let addr = listener.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let received = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (c, r) = (Arc::clone(&conns), Arc::clone(&received));
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            let r = Arc::clone(&r);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                r.lock().unwrap().extend_from_slice(&buf[..n]);
                if buf[..n].starts_with(b"GET ") {
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\nconnection: close\r\n\r\nupstream")
                        .await;
                } else {
                    // A tunnel: echo until closed.
                    if s.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                r.lock().unwrap().extend_from_slice(&buf[..n]);
                                if s.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                }
            });
        }
    });
    Upstream {
        addr,
        conns,
        received,
    }
}

struct Proxy {
    path: std::path::PathBuf,
    stop: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn proxy(allowed: &[&str], dns: &[(&str, IpAddr)], allow_internal: &[&str]) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let mut fake = FakeDns::default();
    for (name, ip) in dns {
        fake.0.entry((*name).to_owned()).or_default().push(*ip);
    }
    let mut settings = EgressSettings::new(
        allow_internal
            .iter()
            .map(|c| Cidr::parse(c).unwrap())
            .collect(),
    );
    settings.resolver = Arc::new(fake);
    settings.connect_timeout = Duration::from_secs(2);
    settings.idle_timeout = Duration::from_millis(400);
    let allow = Arc::new(AllowList::default());
    allow.set(allowed.iter().map(|s| (*s).to_owned()).collect());
    let stop = CancellationToken::new();
    spawn(
        listener,
        Arc::new(Egress {
            allow,
            inject: Arc::default(),
            settings,
            stop: stop.clone(),
            audit: None,
        }),
    );
    Proxy {
        path,
        stop,
        _dir: dir,
    }
}

/// Sends raw bytes to the proxy and reads its whole answer.
async fn ask(p: &Proxy, request: &str) -> (u16, String) {
    let mut s = UnixStream::connect(&p.path).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

fn code_of(answer: &str) -> String {
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("application/problem+json"),
        "not problem+json: {answer}"
    );
    v["code"].as_str().unwrap_or("").to_owned()
}

fn get(target: &str, host: &str) -> String {
    format!("GET http://{target}/x HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n")
}

const LOOP: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

#[tokio::test]
async fn plain_http_host_header_must_name_the_target() {
    let up = upstream_on("127.0.0.1:0".parse().unwrap()).await;
    let port = up.addr.port();
    let entry = format!("allowed.test:{port}");
    let p = proxy(
        &[&entry, "evil.test"],
        &[("allowed.test", LOOP), ("evil.test", LOOP)],
        &["127.0.0.1/32"],
    );
    let target = format!("allowed.test:{port}");
    // Positive control: a matching Host reaches the upstream.
    let (status, body) = ask(&p, &get(&target, &target)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.ends_with("upstream"));
    assert_eq!(up.conns.load(Ordering::SeqCst), 1);
    // The attack: the allowed name in the URL, another in Host.
    let (status, body) = ask(&p, &get(&target, "evil.test")).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(code_of(&body), "egress_host_mismatch");
    assert_eq!(
        up.conns.load(Ordering::SeqCst),
        1,
        "nothing reached upstream"
    );
}

#[tokio::test]
async fn names_pointing_inside_are_refused_unless_the_operator_allows() {
    let up = upstream_on("127.0.0.1:0".parse().unwrap()).await;
    let target = format!("allowed.test:{}", up.addr.port());
    let dns = [("allowed.test", LOOP)];
    let p = proxy(&[&target], &dns, &[]);
    let (status, body) = ask(&p, &get(&target, &target)).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(code_of(&body), "egress_internal_address");
    // An IP literal the list names is checked the same way.
    let lit = format!("127.0.0.1:{}", up.addr.port());
    let p2 = proxy(&[&lit], &[], &[]);
    let (status, body) = ask(&p2, &get(&lit, &lit)).await;
    assert_eq!(
        (status, code_of(&body).as_str()),
        (403, "egress_internal_address")
    );
    assert_eq!(up.conns.load(Ordering::SeqCst), 0);
    // Positive control: the operator allows loopback, the same request passes.
    let p3 = proxy(&[&target], &dns, &["127.0.0.1/32"]);
    let (status, body) = ask(&p3, &get(&target, &target)).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn refusals_have_codes_and_unreachable_is_502() {
    let up = upstream_on("127.0.0.1:0".parse().unwrap()).await;
    let port = up.addr.port();
    let p = proxy(
        &["allowed.test", "dead.test:1"],
        &[("allowed.test", LOOP), ("dead.test", LOOP)],
        &["127.0.0.1/32"],
    );
    let (status, body) = ask(&p, &get("evil.test", "evil.test")).await;
    assert_eq!(
        (status, code_of(&body).as_str()),
        (403, "egress_host_not_allowed")
    );
    let t = format!("allowed.test:{port}");
    let (status, body) = ask(&p, &get(&t, &t)).await;
    assert_eq!(
        (status, code_of(&body).as_str()),
        (403, "egress_port_not_allowed")
    );
    let (status, body) = ask(&p, &format!("CONNECT {t} HTTP/1.1\r\nhost: {t}\r\n\r\n")).await;
    assert_eq!(
        (status, code_of(&body).as_str()),
        (403, "egress_port_not_allowed")
    );
    assert_eq!(up.conns.load(Ordering::SeqCst), 0);
    // Allowed, but nothing listens: 502, not 403.
    let (status, body) = ask(&p, &get("dead.test:1", "dead.test:1")).await;
    assert_eq!(
        (status, code_of(&body).as_str()),
        (502, "upstream_unreachable")
    );
}

/// Opens a tunnel and returns the stream after the proxy's `200`.
async fn open_tunnel(p: &Proxy, target: &str) -> UnixStream {
    let mut s = UnixStream::connect(&p.path).await.unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        assert_eq!(s.read(&mut b).await.unwrap(), 1, "proxy closed: {head:?}");
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

#[tokio::test]
async fn tunnels_need_the_connect_host_as_sni() {
    let up = upstream_on("127.0.0.1:0".parse().unwrap()).await;
    let t = format!("allowed.test:{}", up.addr.port());
    let p = proxy(&[&t], &[("allowed.test", LOOP)], &["127.0.0.1/32"]);
    // Positive control: the right SNI is relayed, and the tunnel carries data.
    let mut s = open_tunnel(&p, &t).await;
    let hello = parse::test_client_hello(Some("allowed.test"));
    s.write_all(&hello).await.unwrap();
    let mut echo = vec![0u8; hello.len()];
    s.read_exact(&mut echo).await.unwrap();
    assert_eq!(echo, hello);
    // The attacks: another SNI (domain fronting), none, or not TLS at all.
    for first in [
        parse::test_client_hello(Some("evil.test")),
        parse::test_client_hello(None),
        b"GET / HTTP/1.1\r\nhost: evil.test\r\n\r\n".to_vec(),
    ] {
        let before = up.received.lock().unwrap().len();
        let mut s = open_tunnel(&p, &t).await;
        s.write_all(&first).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        assert_eq!(
            out, ALERT_ACCESS_DENIED,
            "a TLS access_denied alert, then close"
        );
        assert_eq!(
            up.received.lock().unwrap().len(),
            before,
            "no byte reached upstream"
        );
    }
}

#[tokio::test]
async fn tunnels_die_when_idle_and_with_their_session() {
    let up = upstream_on("127.0.0.1:0".parse().unwrap()).await;
    let t = format!("allowed.test:{}", up.addr.port());
    let p = proxy(&[&t], &[("allowed.test", LOOP)], &["127.0.0.1/32"]);
    let mut s = open_tunnel(&p, &t).await;
    let hello = parse::test_client_hello(Some("allowed.test"));
    s.write_all(&hello).await.unwrap();
    let mut echo = vec![0u8; hello.len()];
    s.read_exact(&mut echo).await.unwrap();
    // Traffic keeps it open past the idle timeout (400 ms)...
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        s.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).await.unwrap();
    }
    // ...silence closes it.
    let started = Instant::now();
    let mut rest = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    assert!(r.is_ok(), "idle tunnel still open after 5 s");
    assert!(started.elapsed() < Duration::from_secs(2));

    // A busy tunnel ends when its session stops.
    let mut s = open_tunnel(&p, &t).await;
    s.write_all(&hello).await.unwrap();
    s.read_exact(&mut echo).await.unwrap();
    p.stop.cancel();
    let r = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut rest)).await;
    assert!(r.is_ok(), "tunnel outlived its session");
}

/// A network namespace joined to this one by a veth pair, `10.213.N.1/30`
/// here and `10.213.N.2/30` inside; removed on drop. Traffic stays on this
/// host.
struct Netns {
    name: String,
    host_if: String,
    inner: Ipv4Addr,
}

impl Netns {
    fn create() -> Result<Netns, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("needs root for `ip netns`".into());
        }
        let pid = std::process::id();
        let n = (pid % 250) as u8;
        let ns = Netns {
            name: format!("asbx-eg-{pid}"),
            host_if: format!("aeh{pid}"),
            inner: Ipv4Addr::new(10, 213, n, 2),
        };
        let peer = format!("aen{pid}");
        let outer = format!("10.213.{n}.1/30");
        let inner = format!("10.213.{n}.2/30");
        let steps: [&[&str]; 7] = [
            &["netns", "add", &ns.name],
            &[
                "link",
                "add",
                &ns.host_if,
                "type",
                "veth",
                "peer",
                "name",
                &peer,
            ],
            &["link", "set", &peer, "netns", &ns.name],
            &["addr", "add", &outer, "dev", &ns.host_if],
            &["link", "set", &ns.host_if, "up"],
            &["-n", &ns.name, "addr", "add", &inner, "dev", &peer],
            &["-n", &ns.name, "link", "set", &peer, "up"],
        ];
        for args in steps {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| format!("`ip` not runnable: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "ip {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        Ok(ns)
    }

    /// A TCP listener bound inside the namespace (a socket keeps the
    /// namespace it was made in, so only this thread has to join it).
    fn listen(&self) -> std::net::TcpListener {
        let path = format!("/run/netns/{}", self.name);
        let inner = self.inner;
        std::thread::spawn(move || {
            let f = std::fs::File::open(path).unwrap();
            nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let l = std::net::TcpListener::bind((inner, 0)).unwrap();
            l.set_nonblocking(true).unwrap();
            l
        })
        .join()
        .unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.host_if])
            .output();
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

#[tokio::test]
async fn an_allowed_upstream_outside_loopback_is_reached() {
    let ns = match Netns::create() {
        Ok(ns) => ns,
        Err(why) => {
            asbx_test_support::skip("an_allowed_upstream_outside_loopback_is_reached", &why);
            return;
        }
    };
    let up = upstream_from(TcpListener::from_std(ns.listen()).unwrap());
    let inner = IpAddr::V4(ns.inner);
    let outer = IpAddr::V4(Ipv4Addr::new(10, 213, ns.inner.octets()[2], 1));
    let t = format!("allowed.test:{}", up.addr.port());
    let o = format!("own.test:{}", up.addr.port());
    let dns = [("allowed.test", inner), ("own.test", outer)];
    // 10.213/16 is private: without the operator's allow it is refused...
    let p = proxy(&[&t, &o], &dns, &[]);
    let (status, body) = ask(&p, &get(&t, &t)).await;
    assert_eq!(
        (status, code_of(&body).as_str()),
        (403, "egress_internal_address")
    );
    assert_eq!(up.conns.load(Ordering::SeqCst), 0);
    // ...with it (for exactly the upstream's address) it is reached, over
    // the veth pair, while this host's own end of it stays refused.
    let allow = format!("{inner}/32");
    let p = proxy(&[&t, &o], &dns, &[&allow]);
    let (status, body) = ask(&p, &get(&t, &t)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.ends_with("upstream"));
    assert_eq!(up.conns.load(Ordering::SeqCst), 1);
    assert!(is_own_address(outer) && !is_own_address(inner));
    let (status, body) = ask(&p, &get(&o, &o)).await;
    assert_eq!(
        (status, code_of(&body).as_str()),
        (403, "egress_internal_address")
    );
}
