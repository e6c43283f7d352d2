//! A test certificate authority and an HTTPS server on loopback for the
//! egress proxy's secret injection tests and benchmark.
//!
//! [`TestCa`] issues certificates for `127.0.0.1`; [`https_server`] serves
//! - `/echo`: the request's `authorization` header as
//!   `authorization=<its digest>` ([`digest`]; `-` when absent), so a test
//!   can check the value without the answer carrying it;
//! - `/bytes/{n}`: `n` bytes of zeros, streamed in 64 KiB chunks;
//! - anything else: `hello-tls`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A certificate authority for tests.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl TestCa {
    /// A fresh CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).must("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().must("key");
        let cert = params.self_signed(&key).must("CA");
        TestCa { cert, key }
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A server configuration with a certificate for `host` from this CA.
    pub fn server_config(&self, host: &str) -> Arc<rustls::ServerConfig> {
        let mut params = CertificateParams::new(vec![host.to_owned()]).must("params");
        params.distinguished_name.push(DnType::CommonName, host);
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().must("key");
        let cert = params.signed_by(&key, &self.cert, &self.key).must("leaf");
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let chain: Vec<CertificateDer<'static>> = vec![cert.der().clone()];
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .must("versions")
        .with_no_client_auth()
        .with_single_cert(chain, der)
        .must("server config");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

/// The first 16 hex digits of the SHA-256 of `value`.
pub fn digest(value: &[u8]) -> String {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(value);
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn full(text: String) -> Body {
    Full::new(Bytes::from(text)).boxed()
}

async fn handle(req: Request<hyper::body::Incoming>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_owned();
    if path == "/echo" {
        let text = match req.headers().get("authorization") {
            Some(v) => format!("authorization={}", digest(v.as_bytes())),
            None => "authorization=-".to_owned(),
        };
        return Ok(Response::new(full(text)));
    }
    if let Some(n) = path
        .strip_prefix("/bytes/")
        .and_then(|n| n.parse::<usize>().ok())
    {
        const CHUNK: usize = 64 << 10;
        let chunk = Bytes::from(vec![0u8; CHUNK]);
        let stream = futures::stream::unfold(n, move |left| {
            let chunk = chunk.clone();
            async move {
                (left > 0).then(|| {
                    let take = left.min(CHUNK);
                    (
                        Ok::<_, Infallible>(Frame::data(chunk.slice(..take))),
                        left - take,
                    )
                })
            }
        });
        let mut res = Response::new(StreamBody::new(stream).boxed());
        res.headers_mut()
            .insert(hyper::header::CONTENT_LENGTH, n.into());
        return Ok(res);
    }
    Ok(Response::new(full("hello-tls".to_owned())))
}

/// Serves HTTPS on `127.0.0.1` (a free port) with `config`; returns the
/// address. The server lives as long as the runtime.
pub async fn https_server(config: Arc<rustls::ServerConfig>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .must("bind");
    let addr = listener.local_addr().must("addr");
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), hyper::service::service_fn(handle))
                    .await;
            });
        }
    });
    addr
}

/// A test helper's `expect`: panics naming what failed.
trait Must<T> {
    fn must(self, what: &str) -> T;
}

impl<T, E: std::fmt::Display> Must<T> for Result<T, E> {
    fn must(self, what: &str) -> T {
        match self {
            Ok(v) => v,
            Err(e) => panic!("{what}: {e}"),
        }
    }
}
