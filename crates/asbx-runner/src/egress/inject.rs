//! Secrets set at the egress proxy (docs/api-environments.md, "Secrets set
//! at the egress proxy"): the sandbox holds `asbx-secret:NAME` in the
//! secret's variable, and the proxy sets the secret's header on requests to
//! the hosts it is bound to, plain HTTP and HTTPS alike.
//!
//! - The bindings come from `/env`'s runner-only `injected_secrets`, which
//!   the gateway removes before the agent sees the answer ([`Injections`]).
//! - For HTTPS to a bound host the proxy terminates TLS with a certificate
//!   for that host signed by a CA made for this sandbox alone (its key never
//!   leaves the runner's memory; the sandbox gets the certificate, beside
//!   the system bundle, in `egress-ca.pem` of its run folder) and opens its
//!   own TLS connection upstream, verified against the host's trust store
//!   and `ASBX_EGRESS_EXTRA_CA` ([`UpstreamTls`]). Every other host keeps
//!   the end-to-end tunnel: nothing here is on its path.
//! - A request carrying a placeholder of a secret to a host that secret is
//!   not bound to (in the URL, a header or the first bytes of its body) is
//!   refused `403 secret_placeholder` ([`Injections::stray`]).
//!
//! No value is logged: [`Binding`]'s header value is marked sensitive and
//! its `Debug` names the secret only.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use asbx_protocol::callback::InjectedSecret;
use asbx_protocol::rules::inject::{check_binding, check_value, format_header, placeholder};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::allow::Entry;

/// The CA bundle's file name in the sandbox's run folder.
pub(crate) const CA_FILE: &str = "egress-ca.pem";
/// The variables that name [`CA_FILE`] for the sandbox's tools.
pub(crate) const CA_VARIABLES: [&str; 5] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
];
/// How much of a request body the proxy reads before it forwards it, to
/// look for placeholders (the rest streams unread).
pub(crate) const BODY_SCAN_BYTES: usize = 64 << 10;

/// One bound secret.
pub(crate) struct Binding {
    pub(crate) name: String,
    placeholder: String,
    /// The placeholder as a URL carries it (`:` percent-encoded).
    encoded: String,
    hosts: Vec<Entry>,
    raw_hosts: Vec<String>,
    header: HeaderName,
    value: HeaderValue,
}

impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the value.
        f.debug_struct("Binding")
            .field("name", &self.name)
            .field("hosts", &self.raw_hosts)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl Binding {
    /// The binding of `s`, or why it can't be one (the workspace checks
    /// the same rules, so this is a corrupt or foreign answer).
    pub(crate) fn new(s: &InjectedSecret) -> Result<Binding, String> {
        let spec = asbx_protocol::rules::inject::InjectSpec {
            hosts: s.hosts.clone(),
            header: s.header.clone(),
            format: s.format.clone(),
        };
        if let Some((field, msg)) = check_binding(&spec).into_iter().next() {
            return Err(format!("secret {}: inject.{field} {msg}", s.name));
        }
        check_value(&s.value).map_err(|e| format!("secret {}: {e}", s.name))?;
        let header = HeaderName::from_bytes(s.header.as_bytes())
            .map_err(|_| format!("secret {}: bad header name", s.name))?;
        let mut value = HeaderValue::from_str(&format_header(&s.format, &s.value))
            .map_err(|_| format!("secret {}: bad header value", s.name))?;
        value.set_sensitive(true);
        let hosts = s.hosts.iter().filter_map(|h| Entry::parse(h)).collect();
        let placeholder = placeholder(&s.name);
        Ok(Binding {
            encoded: placeholder.replace(':', "%3A"),
            placeholder,
            name: s.name.clone(),
            hosts,
            raw_hosts: s.hosts.clone(),
            header,
            value,
        })
    }

    /// Whether this secret is set on requests to `host:port`.
    pub(crate) fn binds(&self, host: &str, port: u16) -> bool {
        self.hosts
            .iter()
            .any(|e| e.matches_host(host) && e.allows_port(port))
    }

    /// Whether `hay` holds this secret's placeholder (raw, or with its `:`
    /// percent-encoded in either case).
    fn found_in(&self, hay: &[u8]) -> bool {
        if memchr::memmem::find(hay, self.placeholder.as_bytes()).is_some() {
            return true;
        }
        let lower = self.encoded.replace("%3A", "%3a");
        memchr::memmem::find(hay, self.encoded.as_bytes()).is_some()
            || memchr::memmem::find(hay, lower.as_bytes()).is_some()
    }
}

/// One sandbox's bound secrets and its CA, set once when `/env` passes
/// the gateway.
pub(crate) struct Injections {
    bindings: Vec<Binding>,
    ca: SandboxCa,
    /// A TLS server configuration per bound host name, made on first use.
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

impl std::fmt::Debug for Injections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Injections")
            .field("bindings", &self.bindings)
            .finish_non_exhaustive()
    }
}

impl Injections {
    /// The bindings of `secrets` (a bad one is left out, and said) and a
    /// fresh CA; `None` when none is left.
    pub(crate) fn new(secrets: &[InjectedSecret]) -> Result<Option<Injections>, String> {
        let mut bindings = Vec::new();
        for s in secrets {
            match Binding::new(s) {
                Ok(b) => bindings.push(b),
                Err(e) => tracing::warn!("injected secret left out: {e}"),
            }
        }
        if bindings.is_empty() {
            return Ok(None);
        }
        Ok(Some(Injections {
            bindings,
            ca: SandboxCa::new()?,
            leaves: Mutex::new(HashMap::new()),
        }))
    }

    /// Every host a secret is bound to, as given (each is an allowed host).
    pub(crate) fn hosts(&self) -> impl Iterator<Item = &str> {
        self.bindings
            .iter()
            .flat_map(|b| b.raw_hosts.iter().map(String::as_str))
    }

    /// The sandbox CA's certificate, PEM.
    pub(crate) fn ca_pem(&self) -> &str {
        &self.ca.pem
    }

    /// Whether any secret is bound to `host:port`.
    pub(crate) fn binds(&self, host: &str, port: u16) -> bool {
        self.bindings.iter().any(|b| b.binds(host, port))
    }

    /// Sets the header of every secret bound to `host:port` (replacing the
    /// request's own); returns their names, for the log.
    pub(crate) fn apply(&self, host: &str, port: u16, headers: &mut HeaderMap) -> Vec<&str> {
        let mut names = Vec::new();
        for b in self.bindings.iter().filter(|b| b.binds(host, port)) {
            headers.insert(b.header.clone(), b.value.clone());
            names.push(b.name.as_str());
        }
        names
    }

    /// The first secret whose placeholder `hay` holds while that secret is
    /// not bound to `host:port`.
    pub(crate) fn stray(&self, host: &str, port: u16, hay: &[u8]) -> Option<&str> {
        self.bindings
            .iter()
            .find(|b| !b.binds(host, port) && b.found_in(hay))
            .map(|b| b.name.as_str())
    }

    /// [`Self::stray`] over a request's target and headers.
    pub(crate) fn stray_in_head(
        &self,
        host: &str,
        port: u16,
        uri: &hyper::Uri,
        headers: &HeaderMap,
    ) -> Option<&str> {
        if let Some(name) = self.stray(host, port, uri.to_string().as_bytes()) {
            return Some(name);
        }
        headers.iter().find_map(|(k, v)| {
            self.stray(host, port, k.as_str().as_bytes())
                .or_else(|| self.stray(host, port, v.as_bytes()))
        })
    }

    /// The TLS server configuration presenting a certificate for `host`
    /// signed by this sandbox's CA.
    pub(crate) fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        let mut leaves = self.leaves.lock().map_err(|_| "poisoned".to_owned())?;
        if let Some(c) = leaves.get(host) {
            return Ok(Arc::clone(c));
        }
        let config = Arc::new(self.ca.server_config(host)?);
        leaves.insert(host.to_owned(), Arc::clone(&config));
        Ok(config)
    }
}

/// A certificate authority made for one sandbox; its key stays here.
struct SandboxCa {
    cert: rcgen::Certificate,
    key: KeyPair,
    pem: String,
}

fn tls_err(e: impl std::fmt::Display) -> String {
    format!("egress TLS: {e}")
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl SandboxCa {
    fn new() -> Result<SandboxCa, String> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(tls_err)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params
            .distinguished_name
            .push(DnType::CommonName, "asbx egress CA (this sandbox only)");
        let key = KeyPair::generate().map_err(tls_err)?;
        let cert = params.self_signed(&key).map_err(tls_err)?;
        let pem = cert.pem();
        Ok(SandboxCa { cert, key, pem })
    }

    fn server_config(&self, host: &str) -> Result<rustls::ServerConfig, String> {
        let mut params = CertificateParams::new(vec![host.to_owned()]).map_err(tls_err)?;
        params.distinguished_name.push(DnType::CommonName, host);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().map_err(tls_err)?;
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .map_err(tls_err)?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(tls_err)?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], der)
            .map_err(tls_err)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// Where a host keeps its CA bundle: the runner's `SSL_CERT_FILE`, else
/// the usual places.
const SYSTEM_BUNDLES: [&str; 5] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
];

/// The runner's side of TLS to bound hosts: the host's trust store (plus
/// the operator's extra CA) for upstream connections, and the system
/// bundle the sandbox's CA file starts with.
#[derive(Debug)]
pub(crate) struct UpstreamTls {
    pub(crate) client: Arc<rustls::ClientConfig>,
    /// The host's CA bundle, PEM (empty when none was found).
    pub(crate) system_pem: Vec<u8>,
}

impl UpstreamTls {
    /// Reads the host's bundle and `extra_ca` (a PEM file); with no bundle
    /// on the host, the Mozilla roots `webpki-roots` carries.
    pub(crate) fn load(extra_ca: Option<&Path>) -> Result<UpstreamTls, String> {
        let from_env = std::env::var_os("SSL_CERT_FILE").map(std::path::PathBuf::from);
        let system_pem = from_env
            .into_iter()
            .chain(SYSTEM_BUNDLES.iter().map(std::path::PathBuf::from))
            .find_map(|p| std::fs::read(p).ok())
            .unwrap_or_default();
        let mut roots = rustls::RootCertStore::empty();
        let system: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&system_pem)
            .filter_map(Result::ok)
            .collect();
        if system.is_empty() {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        } else {
            roots.add_parsable_certificates(system);
        }
        if let Some(path) = extra_ca {
            let pem = std::fs::read(path)
                .map_err(|e| format!("ASBX_EGRESS_EXTRA_CA {}: {e}", path.display()))?;
            let mut n = 0;
            for c in CertificateDer::pem_slice_iter(&pem) {
                let c = c.map_err(|e| format!("ASBX_EGRESS_EXTRA_CA {}: {e}", path.display()))?;
                roots
                    .add(c)
                    .map_err(|e| format!("ASBX_EGRESS_EXTRA_CA {}: {e}", path.display()))?;
                n += 1;
            }
            if n == 0 {
                return Err(format!(
                    "ASBX_EGRESS_EXTRA_CA {}: no certificate in it",
                    path.display()
                ));
            }
        }
        let mut client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(tls_err)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(UpstreamTls {
            client: Arc::new(client),
            system_pem,
        })
    }

    /// The sandbox's CA file: the system bundle, then `ca_pem`.
    pub(crate) fn bundle(&self, ca_pem: &str) -> Vec<u8> {
        let mut out = self.system_pem.clone();
        if !out.is_empty() && !out.ends_with(b"\n") {
            out.push(b'\n');
        }
        out.extend_from_slice(ca_pem.as_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str, hosts: &[&str], header: &str, format: &str) -> InjectedSecret {
        InjectedSecret {
            name: name.to_owned(),
            value: format!("value-of-{name}"),
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            header: header.to_owned(),
            format: format.to_owned(),
        }
    }

    fn injections() -> Injections {
        Injections::new(&[
            secret("GH", &["api.github.com"], "Authorization", "Bearer {value}"),
            secret("REG", &["*.registry.test:8443"], "X-Token", "{value}"),
        ])
        .unwrap()
        .unwrap()
    }

    #[test]
    fn headers_are_set_on_bound_hosts_only() {
        let inj = injections();
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            HeaderValue::from_static("Bearer asbx-secret:GH"),
        );
        assert_eq!(inj.apply("api.github.com", 443, &mut h), ["GH"]);
        assert_eq!(h["authorization"], "Bearer value-of-GH");
        assert!(h["authorization"].is_sensitive());
        let mut h = HeaderMap::new();
        assert!(inj.apply("example.com", 443, &mut h).is_empty());
        assert!(
            inj.apply("npm.registry.test", 443, &mut h).is_empty(),
            "port 443 is not bound"
        );
        assert_eq!(inj.apply("npm.registry.test", 8443, &mut h), ["REG"]);
        assert_eq!(h["x-token"], "value-of-REG");
        assert!(inj.binds("api.github.com", 80));
        assert!(!inj.binds("github.com", 443));
        // The value is in no Debug output.
        assert!(!format!("{inj:?}").contains("value-of"));
    }

    #[test]
    fn placeholders_are_found_where_they_are_not_bound() {
        let inj = injections();
        assert_eq!(
            inj.stray("evil.test", 443, b"token=asbx-secret:GH&x"),
            Some("GH")
        );
        assert_eq!(
            inj.stray("evil.test", 443, b"/?t=asbx-secret%3aREG"),
            Some("REG")
        );
        assert_eq!(
            inj.stray("evil.test", 443, b"/?t=asbx-secret%3AGH"),
            Some("GH")
        );
        assert_eq!(inj.stray("evil.test", 443, b"asbx-secret:OTHER"), None);
        assert_eq!(
            inj.stray("api.github.com", 443, b"Bearer asbx-secret:GH"),
            None
        );
        // Another secret's placeholder to a bound host is still refused.
        assert_eq!(
            inj.stray("api.github.com", 443, b"asbx-secret:REG"),
            Some("REG")
        );
        let uri: hyper::Uri = "http://evil.test/x?q=asbx-secret:GH".parse().unwrap();
        assert_eq!(
            inj.stray_in_head("evil.test", 80, &uri, &HeaderMap::new()),
            Some("GH")
        );
        let mut h = HeaderMap::new();
        h.insert("x-a", HeaderValue::from_static("asbx-secret:REG"));
        let uri: hyper::Uri = "/".parse().unwrap();
        assert_eq!(inj.stray_in_head("evil.test", 80, &uri, &h), Some("REG"));
    }

    #[test]
    fn a_bad_binding_is_left_out() {
        let inj = Injections::new(&[
            secret("BAD", &["a.org"], "Host", "{value}"),
            secret("OK", &["a.org"], "X-K", "k={value}"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(inj.hosts().collect::<Vec<_>>(), ["a.org"]);
        let mut h = HeaderMap::new();
        assert_eq!(inj.apply("a.org", 443, &mut h), ["OK"]);
        let mut bad = secret("CRLF", &["a.org"], "X-K", "{value}");
        bad.value = "a\r\nX-Evil: 1".to_owned();
        assert!(Injections::new(&[bad]).unwrap().is_none());
    }

    #[test]
    fn leaf_certificates_chain_to_the_sandbox_ca() {
        let inj = injections();
        let config = inj.server_config("api.github.com").unwrap();
        assert!(Arc::ptr_eq(
            &config,
            &inj.server_config("api.github.com").unwrap()
        ));
        let ca = CertificateDer::from_pem_slice(inj.ca_pem().as_bytes()).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca).unwrap();
        // A client trusting only the sandbox CA completes a handshake.
        let client = Arc::new(
            rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        );
        let name = rustls_pki_types::ServerName::try_from("api.github.com").unwrap();
        let mut c = rustls::ClientConnection::new(client, name).unwrap();
        let mut s = rustls::ServerConnection::new(config).unwrap();
        for _ in 0..10 {
            let mut buf = Vec::new();
            c.write_tls(&mut buf).unwrap();
            s.read_tls(&mut &buf[..]).unwrap();
            s.process_new_packets().unwrap();
            let mut buf = Vec::new();
            s.write_tls(&mut buf).unwrap();
            c.read_tls(&mut &buf[..]).unwrap();
            c.process_new_packets().unwrap();
        }
        assert!(!c.is_handshaking() && !s.is_handshaking());
    }
}
