//! One proxied request as the audit log records it (`crate::audit`):
//! built where the proxy decides, pushed by `Egress::note`.

/// One request through the proxy, as the audit log records it.
pub(crate) struct Note<'a> {
    pub(crate) host: &'a str,
    pub(crate) port: u16,
    pub(crate) method: Option<&'a str>,
    pub(crate) bytes_out: u64,
    pub(crate) bytes_in: u64,
    /// Why it was refused; `None`: allowed.
    pub(crate) refused: Option<&'a str>,
    /// The bound secret set on it (its name).
    pub(crate) secret: Option<&'a str>,
}

/// A tunnel refused for its TLS SNI: the code its audit record carries.
pub(super) const SNI_REFUSED: &str = "egress_host_mismatch";

/// The `Content-Length` of a message, 0 when it has none.
pub(super) fn content_length(headers: &hyper::HeaderMap) -> u64 {
    headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
