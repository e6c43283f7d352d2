//! `egress`: the egress proxy's cost for a host a secret is bound to (TLS
//! ended at the proxy, the header set, a TLS connection of its own
//! upstream) beside the end-to-end `CONNECT` tunnel every other host gets,
//! in one run: throughput of one large HTTPS download, and time to the
//! first byte of a small answer on a fresh connection.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use asbx_protocol::callback::InjectedSecret;
use asbx_runner::egress_standalone;
use asbx_test_support::tls_server::{TestCa, https_server};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// A TLS client config trusting `ca_pem` only.
fn client(ca_pem: &str) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c?)?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Opens `CONNECT host` through the proxy at `sock`, then TLS and HTTP/1.1.
async fn open(
    sock: &Path,
    host: &str,
    tls: &Arc<rustls::ClientConfig>,
) -> anyhow::Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
    let mut s = UnixStream::connect(sock).await?;
    s.write_all(format!("CONNECT {host} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).await? == 0 {
            bail!("proxy closed");
        }
        head.push(b[0]);
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        bail!("CONNECT refused: {}", String::from_utf8_lossy(&head));
    }
    let name = ServerName::try_from("127.0.0.1")?.to_owned();
    let stream = tokio_rustls::TlsConnector::from(Arc::clone(tls))
        .connect(name, s)
        .await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// `GET path` on a fresh connection: time to the first body byte, bytes,
/// and total time.
async fn get(
    sock: &Path,
    host: &str,
    tls: &Arc<rustls::ClientConfig>,
    path: &str,
) -> anyhow::Result<(Duration, usize, Duration)> {
    let t = Instant::now();
    let mut sender = open(sock, host, tls).await?;
    let req = hyper::Request::get(path)
        .header("host", host)
        .body(Empty::<Bytes>::new())?;
    let res = sender.send_request(req).await?;
    if !res.status().is_success() {
        bail!("GET {path}: {}", res.status());
    }
    let mut body = res.into_body();
    let mut first = None;
    let mut n = 0;
    while let Some(f) = body.frame().await {
        if let Some(d) = f?.data_ref() {
            first.get_or_insert_with(|| t.elapsed());
            n += d.len();
        }
    }
    Ok((first.unwrap_or_else(|| t.elapsed()), n, t.elapsed()))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

pub(crate) async fn egress(megabytes: usize) -> anyhow::Result<()> {
    let ca = TestCa::new("asbx-bench upstream CA");
    let server = https_server(ca.server_config("127.0.0.1")).await;
    let host = format!("127.0.0.1:{}", server.port());
    let dir = tempfile_dir()?;
    let ca_file = dir.join("upstream-ca.pem");
    std::fs::write(&ca_file, ca.pem())?;
    let internal = vec![asbx_runner::Cidr::parse("127.0.0.1/32").context("cidr")?];

    let tunnel_sock = dir.join("tunnel.sock");
    let _tunnel = egress_standalone::serve(
        tokio::net::UnixListener::bind(&tunnel_sock)?,
        vec![host.clone()],
        &[],
        internal.clone(),
        Some(ca_file.clone()),
    )
    .map_err(anyhow::Error::msg)?;
    let inject_sock = dir.join("inject.sock");
    let inject = egress_standalone::serve(
        tokio::net::UnixListener::bind(&inject_sock)?,
        Vec::new(),
        &[InjectedSecret {
            name: "BENCH_TOKEN".to_owned(),
            value: "bench-secret-value".to_owned(),
            hosts: vec![host.clone()],
            header: "Authorization".to_owned(),
            format: "Bearer {value}".to_owned(),
        }],
        internal,
        Some(ca_file),
    )
    .map_err(anyhow::Error::msg)?;
    let tunnel_tls = client(&ca.pem())?;
    let inject_tls = client(inject.ca_pem.as_deref().context("no sandbox CA")?)?;

    // The header is set (a digest of it comes back), the tunnel sets none.
    let probe = |sock: std::path::PathBuf, tls: Arc<rustls::ClientConfig>| {
        let host = host.clone();
        async move {
            let mut s = open(&sock, &host, &tls).await?;
            let req = hyper::Request::get("/echo")
                .header("host", &host)
                .body(Empty::<Bytes>::new())?;
            let body = s.send_request(req).await?.into_body().collect().await?;
            anyhow::Ok(String::from_utf8_lossy(&body.to_bytes()).into_owned())
        }
    };
    let with = probe(inject_sock.clone(), Arc::clone(&inject_tls)).await?;
    let without = probe(tunnel_sock.clone(), Arc::clone(&tunnel_tls)).await?;
    if with == "authorization=-" || without != "authorization=-" {
        bail!("header injection not as expected: {with} / {without}");
    }

    let bytes = megabytes << 20;
    let path = format!("/bytes/{bytes}");
    let mut rows = Vec::new();
    for (label, sock, tls) in [
        ("CONNECT tunnel", &tunnel_sock, &tunnel_tls),
        ("injecting (TLS ended)", &inject_sock, &inject_tls),
    ] {
        // Warm up, then the best of three downloads.
        get(sock, &host, tls, "/echo").await?;
        let mut best = Duration::MAX;
        for _ in 0..3 {
            let (_, n, total) = get(sock, &host, tls, &path).await?;
            if n != bytes {
                bail!("{label}: {n} bytes, not {bytes}");
            }
            best = best.min(total);
        }
        let mut firsts = Vec::new();
        for _ in 0..50 {
            firsts.push(get(sock, &host, tls, "/echo").await?.0);
        }
        rows.push((
            label,
            bytes as f64 / best.as_secs_f64() / 1e6,
            median(firsts),
        ));
    }
    println!(
        "egress proxy: {megabytes} MB HTTPS download (best of 3), first byte of a fresh connection (median of 50)"
    );
    println!("{:<24} {:>12} {:>16}", "", "MB/s", "first byte (ms)");
    for (label, mbps, first) in &rows {
        println!(
            "{label:<24} {mbps:>12.1} {:>16.3}",
            first.as_secs_f64() * 1e3
        );
    }
    let ratio = rows[1].1 / rows[0].1 * 100.0;
    let added = rows[1].2.as_secs_f64() * 1e3 - rows[0].2.as_secs_f64() * 1e3;
    println!(
        "injecting vs tunnel: {ratio:.0} % of the throughput (goal >= 50 %), first byte {added:+.3} ms (goal < 2 ms)"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("asbx-bench-egress-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
