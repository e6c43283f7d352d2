//! Secrets bound to hosts (docs/api-environments.md, "Secrets set at the
//! egress proxy"): what a binding may be, the placeholder the sandbox sees
//! in its variable, and the header the runner's egress proxy sets. The
//! workspace checks bindings with [`check_binding`] when it stores them; the
//! runner formats with [`format_header`] and scans for [`placeholder`]s.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::names;

/// What a bound secret's variable holds in the sandbox: `asbx-secret:NAME`.
pub const PLACEHOLDER_PREFIX: &str = "asbx-secret:";
/// The slot of the value in [`InjectSpec::format`].
pub const VALUE_SLOT: &str = "{value}";
/// Most hosts one secret may be bound to.
pub const MAX_HOSTS: usize = 32;
/// Longest `format`.
pub const MAX_FORMAT_BYTES: usize = 1024;

/// `"inject"` of a named environment's secret: set `header` to `format`
/// (with `{value}` replaced by the secret) on requests to `hosts` only.
///
/// - `hosts`: names as in `allowedHosts` (`api.github.com`,
///   `*.example.com`, `host:port`); each is also an allowed host.
/// - `header`: an HTTP header name (`Authorization`); not a hop-by-hop or
///   framing header (`Host`, `Content-Length`, `Transfer-Encoding`, ...).
/// - `format`: the header's value, holding `{value}` exactly once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InjectSpec {
    pub hosts: Vec<String>,
    pub header: String,
    pub format: String,
}

/// The sandbox's stand-in for secret `name`.
pub fn placeholder(name: &str) -> String {
    format!("{PLACEHOLDER_PREFIX}{name}")
}

/// `format` with its `{value}` replaced by `value`.
pub fn format_header(format: &str, value: &str) -> String {
    format.replacen(VALUE_SLOT, value, 1)
}

/// Headers the proxy owns or that frame the message: never injected.
const RESERVED_HEADERS: [&str; 11] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
    "expect",
];

/// Whether `name` is an HTTP token (RFC 9110 `tchar`s).
fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Checks a binding; each fault as `(field under inject, message)`.
pub fn check_binding(spec: &InjectSpec) -> Vec<(String, String)> {
    let mut errors = Vec::new();
    if spec.hosts.is_empty() {
        errors.push(("hosts".to_owned(), "must name at least one host".to_owned()));
    }
    if spec.hosts.len() > MAX_HOSTS {
        errors.push(("hosts".to_owned(), format!("at most {MAX_HOSTS} hosts")));
    }
    for (i, h) in spec.hosts.iter().enumerate() {
        if let Err(msg) = names::check_host(h) {
            errors.push((format!("hosts[{i}]"), msg));
        }
    }
    if !is_token(&spec.header) {
        errors.push((
            "header".to_owned(),
            "must be an HTTP header name".to_owned(),
        ));
    } else if RESERVED_HEADERS.contains(&spec.header.to_ascii_lowercase().as_str()) {
        errors.push((
            "header".to_owned(),
            "is a header the proxy owns or that frames the message".to_owned(),
        ));
    }
    if spec.format.matches(VALUE_SLOT).count() != 1 {
        errors.push((
            "format".to_owned(),
            "must hold {value} exactly once".to_owned(),
        ));
    }
    if spec.format.len() > MAX_FORMAT_BYTES {
        errors.push((
            "format".to_owned(),
            format!("at most {MAX_FORMAT_BYTES} bytes"),
        ));
    }
    if spec.format.bytes().any(|b| b.is_ascii_control()) {
        errors.push((
            "format".to_owned(),
            "must not hold control characters".to_owned(),
        ));
    }
    errors
}

/// Whether `value` may stand in a header: no control character, so the
/// formatted header can't split or end the request.
pub fn check_value(value: &str) -> Result<(), String> {
    if value.bytes().any(|b| b.is_ascii_control()) {
        return Err("a secret bound to hosts must not hold control characters".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(hosts: &[&str], header: &str, format: &str) -> InjectSpec {
        InjectSpec {
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            header: header.to_owned(),
            format: format.to_owned(),
        }
    }

    #[test]
    fn the_value_fills_its_slot_once() {
        assert_eq!(format_header("Bearer {value}", "t0k"), "Bearer t0k");
        assert_eq!(format_header("{value}", "a{value}b"), "a{value}b");
        assert_eq!(placeholder("GITHUB_TOKEN"), "asbx-secret:GITHUB_TOKEN");
    }

    #[test]
    fn bindings_are_checked_field_by_field() {
        assert!(
            check_binding(&spec(
                &["api.github.com", "*.x.org:8443"],
                "Authorization",
                "Bearer {value}"
            ))
            .is_empty()
        );
        let fields = |s: InjectSpec| -> Vec<String> {
            check_binding(&s).into_iter().map(|(f, _)| f).collect()
        };
        assert_eq!(fields(spec(&[], "A", "{value}")), ["hosts"]);
        assert_eq!(fields(spec(&["bad host"], "A", "{value}")), ["hosts[0]"]);
        assert_eq!(
            fields(spec(&["a.org"], "Bad Header", "{value}")),
            ["header"]
        );
        assert_eq!(fields(spec(&["a.org"], "Host", "{value}")), ["header"]);
        assert_eq!(fields(spec(&["a.org"], "A", "Bearer")), ["format"]);
        assert_eq!(fields(spec(&["a.org"], "A", "{value}{value}")), ["format"]);
        assert_eq!(fields(spec(&["a.org"], "A", "x\r\n{value}")), ["format"]);
        assert!(check_value("ghp_123").is_ok());
        assert!(check_value("a\r\nX-Evil: 1").is_err());
    }
}
