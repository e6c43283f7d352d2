//! The egress proxy's pure parsing: request-target authorities, the `Host`
//! header check, and the SNI of a TLS ClientHello.
//!
//! No I/O here: every function takes bytes or strings, so a fuzz target can
//! call them directly (re-exported as `asbx_runner::egress_parse`).

/// Why a target, a `Host` header or a ClientHello was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("empty host")]
    EmptyHost,
    #[error("user info is not allowed in an authority")]
    UserInfo,
    #[error("bad port {0:?}")]
    BadPort(String),
    #[error("bad IPv6 literal")]
    BadIpv6,
    #[error("bad character in host")]
    BadHost,
    #[error("not a TLS handshake record")]
    NotHandshake,
    #[error("not a ClientHello")]
    NotClientHello,
    #[error("the ClientHello does not fit in its first record")]
    Fragmented,
    #[error("malformed ClientHello: {0}")]
    Malformed(&'static str),
}

/// An authority's host (lower case, no trailing dot, IPv6 without brackets)
/// and its port, if one was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority {
    pub host: String,
    pub port: Option<u16>,
}

/// Parses `host`, `host:port`, `[v6]` or `[v6]:port`. User info (`a@b`),
/// empty hosts, bad ports and control or space characters are refused.
pub fn parse_authority(s: &str) -> Result<Authority, ParseError> {
    if s.contains('@') {
        return Err(ParseError::UserInfo);
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (v6, after) = rest.split_once(']').ok_or(ParseError::BadIpv6)?;
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(ParseError::BadIpv6);
        }
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or(ParseError::BadIpv6)?),
        };
        (v6, port)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n != 0 && p.bytes().all(|b| b.is_ascii_digit()) => Some(n),
            _ => return Err(ParseError::BadPort(p.chars().take(16).collect())),
        },
    };
    let host = normalize_host(host);
    if host.is_empty() {
        return Err(ParseError::EmptyHost);
    }
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b))
    {
        return Err(ParseError::BadHost);
    }
    Ok(Authority { host, port })
}

/// Lower case, no surrounding space, no trailing dot.
pub fn normalize_host(h: &str) -> String {
    h.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// Whether a plain-HTTP request's `Host` header names the same host and port
/// as its absolute-form target (`default_port` when either omits it).
pub fn host_header_matches(
    target: &str,
    host_header: &str,
    default_port: u16,
) -> Result<bool, ParseError> {
    let t = parse_authority(target)?;
    let h = parse_authority(host_header)?;
    Ok(t.host == h.host && t.port.unwrap_or(default_port) == h.port.unwrap_or(default_port))
}

/// What the first bytes of a tunnel say about its TLS server name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientHello {
    /// The first record is not complete yet: at least this many bytes in all
    /// are needed.
    Incomplete { needed: usize },
    /// A ClientHello without a `server_name` extension.
    NoSni,
    /// The `host_name` of the `server_name` extension (lower case, no
    /// trailing dot).
    Sni(String),
}

/// Length of a TLS record header.
pub const RECORD_HEADER: usize = 5;
/// Largest TLS plaintext record body.
pub const MAX_RECORD: usize = 1 << 14;

/// Reads the SNI from the first TLS record of a tunnel. The whole
/// ClientHello must sit in that first record (clients send it so; a
/// fragmented one is refused rather than reassembled).
pub fn client_hello_sni(buf: &[u8]) -> Result<ClientHello, ParseError> {
    if buf.is_empty() {
        return Ok(ClientHello::Incomplete {
            needed: RECORD_HEADER,
        });
    }
    if buf[0] != 0x16 {
        return Err(ParseError::NotHandshake);
    }
    if buf.len() < RECORD_HEADER {
        return Ok(ClientHello::Incomplete {
            needed: RECORD_HEADER,
        });
    }
    if buf[1] != 0x03 {
        return Err(ParseError::NotHandshake);
    }
    let len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    if len == 0 || len > MAX_RECORD {
        return Err(ParseError::Malformed("record length"));
    }
    let needed = RECORD_HEADER + len;
    if buf.len() < needed {
        return Ok(ClientHello::Incomplete { needed });
    }
    let mut r = Reader(&buf[RECORD_HEADER..needed]);
    if r.u8()? != 0x01 {
        return Err(ParseError::NotClientHello);
    }
    let hs_len = r.u24()?;
    if hs_len > r.0.len() {
        return Err(ParseError::Fragmented);
    }
    let mut hello = Reader(r.take(hs_len)?);
    hello.take(2 + 32)?; // legacy_version, random
    let n = usize::from(hello.u8()?);
    hello.take(n)?; // legacy_session_id
    let n = hello.u16()?;
    hello.take(n)?; // cipher_suites
    let n = usize::from(hello.u8()?);
    hello.take(n)?; // legacy_compression_methods
    if hello.0.is_empty() {
        return Ok(ClientHello::NoSni);
    }
    let n = hello.u16()?;
    let mut exts = Reader(hello.take(n)?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let n = exts.u16()?;
        let mut body = Reader(exts.take(n)?);
        if kind != 0 {
            continue;
        }
        let n = body.u16()?;
        let mut list = Reader(body.take(n)?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let n = list.u16()?;
            let name = list.take(n)?;
            if name_type == 0 {
                if name.is_empty()
                    || !name
                        .iter()
                        .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(b))
                {
                    return Err(ParseError::Malformed("server name"));
                }
                let name =
                    std::str::from_utf8(name).map_err(|_| ParseError::Malformed("server name"))?;
                return Ok(ClientHello::Sni(normalize_host(name)));
            }
        }
        return Err(ParseError::Malformed("server_name without a host_name"));
    }
    Ok(ClientHello::NoSni)
}

/// A bounds-checked cursor.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ParseError> {
        if n > self.0.len() {
            return Err(ParseError::Malformed("length past the end"));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, ParseError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<usize, ParseError> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn u24(&mut self) -> Result<usize, ParseError> {
        let b = self.take(3)?;
        Ok((usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }
}

/// Builds a minimal ClientHello record, for tests (here, in the proxy's
/// tests and in fuzz seeds): `sni` as its `server_name`, or none.
#[doc(hidden)]
pub fn test_client_hello(sni: Option<&str>) -> Vec<u8> {
    let mut exts = Vec::new();
    if let Some(name) = sni {
        let name = name.as_bytes();
        let entry_len = 3 + name.len();
        exts.extend_from_slice(&0u16.to_be_bytes());
        exts.extend_from_slice(&((entry_len + 2) as u16).to_be_bytes());
        exts.extend_from_slice(&(entry_len as u16).to_be_bytes());
        exts.push(0);
        exts.extend_from_slice(&(name.len() as u16).to_be_bytes());
        exts.extend_from_slice(name);
    }
    // supported_versions: TLS 1.3, so the record looks like a real client's.
    exts.extend_from_slice(&[0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]);
    let mut hello = vec![0x03, 0x03];
    hello.extend_from_slice(&[7u8; 32]);
    hello.push(0);
    hello.extend_from_slice(&[0x00, 0x02, 0x13, 0x01]);
    hello.extend_from_slice(&[0x01, 0x00]);
    hello.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    hello.extend_from_slice(&exts);
    let mut hs = vec![0x01];
    hs.extend_from_slice(&(hello.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&hello);
    let mut rec = vec![0x16, 0x03, 0x01];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities() {
        let a = parse_authority("Example.COM.:8443").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("example.com", Some(8443)));
        let a = parse_authority("[::1]:80").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("::1", Some(80)));
        assert_eq!(parse_authority("pypi.org").unwrap().port, None);
        for bad in [
            "",
            ":80",
            "a@b.com",
            "x.com:0",
            "x.com:+80",
            "x.com:99999",
            "[::1",
            "a b",
            "a\r\nb",
        ] {
            assert!(parse_authority(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn host_header_must_name_the_target() {
        assert!(host_header_matches("pypi.org", "PyPI.org", 80).unwrap());
        assert!(host_header_matches("pypi.org:80", "pypi.org", 80).unwrap());
        assert!(!host_header_matches("pypi.org", "evil.test", 80).unwrap());
        assert!(!host_header_matches("pypi.org", "pypi.org:8080", 80).unwrap());
        assert!(host_header_matches("pypi.org", "evil@x", 80).is_err());
    }

    #[test]
    fn sni_is_read_from_a_client_hello() {
        let rec = test_client_hello(Some("Files.Example.com"));
        assert_eq!(
            client_hello_sni(&rec).unwrap(),
            ClientHello::Sni("files.example.com".into())
        );
        assert_eq!(
            client_hello_sni(&test_client_hello(None)).unwrap(),
            ClientHello::NoSni
        );
        // Every strict prefix is incomplete, never an error or a wrong name.
        for cut in 0..rec.len() {
            assert!(
                matches!(
                    client_hello_sni(&rec[..cut]),
                    Ok(ClientHello::Incomplete { .. })
                ),
                "cut at {cut}"
            );
        }
        assert_eq!(
            client_hello_sni(b"GET / HTTP/1.1\r\n"),
            Err(ParseError::NotHandshake)
        );
        // A handshake length past the record is refused, not read beyond.
        let mut bad = rec.clone();
        bad[6] = 0x7f;
        assert_eq!(client_hello_sni(&bad), Err(ParseError::Fragmented));
        // A name with a control byte is malformed.
        let evil = test_client_hello(Some("a\u{1}b"));
        assert!(client_hello_sni(&evil).is_err());
    }
}
