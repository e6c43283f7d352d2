//! The operator's egress settings, shared by every dispatch: the resolver,
//! the internal ranges allowed anyway, the timeouts, and the TLS the proxy
//! speaks to hosts a secret is bound to. Resolving checks every address.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;

use super::address::{Cidr, is_own_address, is_public};
use super::inject;
use super::refusal::Refusal;

/// Name resolution, pluggable so tests can map names to their own servers.
pub(crate) trait Resolve: Send + Sync + std::fmt::Debug {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>>;
}

/// The system resolver (`getaddrinfo`).
#[derive(Debug)]
pub(crate) struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// The operator's egress settings, shared by every dispatch.
#[derive(Debug, Clone)]
pub(crate) struct EgressSettings {
    pub(crate) resolver: Arc<dyn Resolve>,
    /// Internal ranges the operator lets sandboxes reach anyway.
    pub(crate) allow_internal: Arc<[Cidr]>,
    pub(crate) connect_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    /// The operator's extra CA for upstream TLS (`ASBX_EGRESS_EXTRA_CA`).
    pub(crate) extra_ca: Option<std::path::PathBuf>,
    /// Upstream TLS for bound hosts, loaded on first use.
    tls: Arc<OnceLock<Result<inject::UpstreamTls, String>>>,
}

impl EgressSettings {
    pub(crate) fn new(allow_internal: Vec<Cidr>) -> Self {
        EgressSettings {
            resolver: Arc::new(SystemResolver),
            allow_internal: allow_internal.into(),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            extra_ca: None,
            tls: Arc::default(),
        }
    }

    /// With `ASBX_EGRESS_EXTRA_CA`.
    pub(crate) fn with_extra_ca(mut self, path: Option<std::path::PathBuf>) -> Self {
        self.extra_ca = path;
        self.tls = Arc::default();
        self
    }

    /// The TLS the proxy speaks to bound hosts (the host's trust store plus
    /// the operator's extra CA), read once per runner.
    pub(crate) fn upstream_tls(&self) -> Result<&inject::UpstreamTls, String> {
        self.tls
            .get_or_init(|| inject::UpstreamTls::load(self.extra_ca.as_deref()))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Refuses an address that is not public or is this host's own, unless
    /// the operator allows its range.
    pub(crate) fn check_addr(&self, host: &str, ip: IpAddr) -> Result<(), Refusal> {
        if self.allow_internal.iter().any(|c| c.contains(ip)) {
            return Ok(());
        }
        if !is_public(ip) || is_own_address(ip) {
            return Err(Refusal::Internal(host.to_owned(), ip));
        }
        Ok(())
    }

    /// Resolves `host` once and checks every address: a name with one
    /// internal record is refused whole, so a resolver can't be raced into
    /// handing out the internal one. Callers connect to these addresses
    /// only (pinned), never resolve again.
    pub(crate) async fn resolve_checked(
        &self,
        host: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, Refusal> {
        let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::time::timeout(self.connect_timeout, self.resolver.resolve(host, port))
                .await
                .ok()
                .and_then(Result::ok)
                .ok_or_else(|| Refusal::Resolve(host.to_owned()))?,
        };
        if addrs.is_empty() {
            return Err(Refusal::Resolve(host.to_owned()));
        }
        for a in &addrs {
            self.check_addr(host, a.ip())?;
        }
        Ok(addrs)
    }
}
