//! Runner URLs: what a runner's base URL may look like, how two are
//! compared, how a route of a runner is built from one; and how much of a
//! runner's answer is read ([`MAX_ANSWER_BYTES`]).
//!
//! A runner URL is `http(s)://host[:port][/path]`: no user info, no query,
//! no fragment (a `?` would swallow the path the workspace appends, so the
//! request would go where the URL's author chose). Two URLs name the same
//! runner when scheme, host, port (the scheme's default when absent) and
//! path (without a trailing `/`) agree: [`key`]. A route is joined with
//! [`url::Url`] path segments ([`join`]), never by string concatenation,
//! so a session id can't add a path, a query or a fragment.

use bytes::{Bytes, BytesMut};
use url::Url;

/// Most bytes of any runner answer the workspace reads back (a refusal
/// passed through, a tool result's answer, a session's state, a health
/// probe); the rest is never read.
pub(crate) const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Parses and checks a runner base URL.
pub(crate) fn parse(raw: &str) -> Result<Url, String> {
    let url = Url::parse(raw).map_err(|e| format!("not a URL: {e}"))?;
    check(&url)?;
    Ok(url)
}

/// `url` is `http(s)` with a host and has no user info, query or fragment.
pub(crate) fn check(url: &Url) -> Result<(), String> {
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("must be an http(s) URL".to_owned());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not carry a user name or password".to_owned());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("must not have a query or a fragment".to_owned());
    }
    Ok(())
}

/// What identifies a runner: `scheme://host:port/path`, the port always
/// written, the path without its trailing `/`; `None` for a URL [`check`]
/// refuses.
pub(crate) fn key(url: &Url) -> Option<String> {
    check(url).ok()?;
    let host = url.host_str()?;
    let port = url.port_or_known_default()?;
    let path = url.path().trim_end_matches('/');
    Some(format!("{}://{host}:{port}{path}", url.scheme()))
}

/// Whether `url` names one of `runners` ([`key`]); a URL [`check`] refuses
/// names none.
pub(crate) fn is_one_of<'a>(url: &Url, runners: impl IntoIterator<Item = &'a Url>) -> bool {
    let Some(wanted) = key(url) else {
        return false;
    };
    runners
        .into_iter()
        .any(|r| key(r).is_some_and(|k| k == wanted))
}

/// `base` with `segments` appended to its path, each percent-encoded as one
/// segment (a `/`, `?` or `#` in one stays inside it); no query, no
/// fragment.
pub(crate) fn join(base: &Url, segments: &[&str]) -> Result<Url, String> {
    check(base)?;
    let mut url = base.clone();
    url.path_segments_mut()
        .map_err(|()| "cannot be a base URL".to_owned())?
        .pop_if_empty()
        .extend(segments);
    Ok(url)
}

/// At most `max` bytes of `response`'s body; the rest is never read.
pub(crate) async fn read_bounded(mut response: reqwest::Response, max: usize) -> Bytes {
    let mut out = BytesMut::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        let room = max.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= max {
            break;
        }
    }
    out.freeze()
}

/// A runner's JSON answer, at most [`MAX_ANSWER_BYTES`] of it read; `None`
/// when that is not a `T`.
pub(crate) async fn read_json<T: serde::de::DeserializeOwned>(
    response: reqwest::Response,
) -> Option<T> {
    serde_json::from_slice(&read_bounded(response, MAX_ANSWER_BYTES).await).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn a_runner_url_is_http_with_a_host_and_nothing_that_moves_the_route() {
        for ok in [
            "http://127.0.0.1:1",
            "https://runner.internal/",
            "http://h:7879/prefix/",
        ] {
            assert!(parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "ftp://x",
            "not a url",
            "file:///tmp",
            "http://127.0.0.1:18081/admin/x?q=",
            "http://127.0.0.1:18081/#frag",
            "http://user:pw@127.0.0.1:18081/",
            "http://user@127.0.0.1:18081/",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_same_runner_however_written() {
        let configured = [url("http://Runner.Internal:80/"), url("https://r2/base/")];
        for same in [
            "http://runner.internal",
            "http://runner.internal:80",
            "http://RUNNER.internal/",
            "https://r2:443/base",
            "https://r2/base/",
        ] {
            assert!(is_one_of(&url(same), &configured), "{same}");
        }
        for other in [
            "http://runner.internal:8080/",
            "https://runner.internal/",
            "http://runner.internal/admin",
            "https://r2/base/x",
            "https://r2/",
            "http://r2/base",
            "http://runner.internal/?q=",
            "http://u@runner.internal/",
            "http://runner.internal/#f",
            "http://127.0.0.1:18081/admin/x?q=",
        ] {
            assert!(!is_one_of(&url(other), &configured), "{other}");
        }
        // A configured URL that check refuses matches nothing.
        let odd = [url("http://h/?q=")];
        assert!(!is_one_of(&url("http://h/"), &odd));
        assert!(!is_one_of(&url("http://h/?q="), &odd));
    }

    #[test]
    fn routes_are_joined_by_segment() {
        let base = url("http://h/prefix/");
        assert_eq!(
            join(&base, &["stream"]).unwrap().as_str(),
            "http://h/prefix/stream"
        );
        assert_eq!(
            join(&url("http://127.0.0.1:8080"), &["v1", "sessions", "abc"])
                .unwrap()
                .as_str(),
            "http://127.0.0.1:8080/v1/sessions/abc"
        );
        // A hostile id stays one segment.
        assert_eq!(
            join(&url("http://h"), &["v1", "sessions", "../x?y#z"])
                .unwrap()
                .as_str(),
            "http://h/v1/sessions/..%2Fx%3Fy%23z"
        );
        assert!(join(&url("http://h/x?q="), &["stream"]).is_err());
    }
}
