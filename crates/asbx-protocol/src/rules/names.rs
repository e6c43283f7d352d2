//! Names and paths that cross a boundary: environment variable names, egress
//! hosts, model names and relative file paths.
//!
//! Each check returns the reason as text, so an HTTP `400` can name it.

/// Longest accepted relative file path, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;
/// Longest accepted path component, in bytes.
pub const MAX_COMPONENT_BYTES: usize = 255;

/// A relative path: no absolute paths, no `..`, no empty or `.` components,
/// no backslashes, no control characters, at most `max_bytes`.
pub fn check_relative_path_within(path: &str, max_bytes: usize) -> Result<(), String> {
    if path.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if path.len() > max_bytes {
        return Err(format!("longer than {max_bytes} bytes"));
    }
    if path.starts_with('/') {
        return Err("must be relative, not absolute".to_owned());
    }
    if path.contains('\\') {
        return Err("must use / as separator, not \\".to_owned());
    }
    if path.chars().any(char::is_control) {
        return Err("must not contain control characters".to_owned());
    }
    if path.len() >= 2 && path.as_bytes()[1] == b':' && path.as_bytes()[0].is_ascii_alphabetic() {
        return Err("must be relative, not a drive path".to_owned());
    }
    for component in path.split('/') {
        match component {
            "" => return Err("must not contain empty components (//) or end in /".to_owned()),
            "." => return Err("must not contain . components".to_owned()),
            ".." => return Err("must not contain .. components".to_owned()),
            c if c.len() > MAX_COMPONENT_BYTES => {
                return Err(format!(
                    "has a component longer than {MAX_COMPONENT_BYTES} bytes"
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// [`check_relative_path_within`] with [`MAX_PATH_BYTES`].
pub fn check_relative_path(path: &str) -> Result<(), String> {
    check_relative_path_within(path, MAX_PATH_BYTES)
}

/// A model name `provider:model`.
pub fn check_model(model: &str) -> Result<(), String> {
    let ok = model.len() <= 256
        && model
            .split_once(':')
            .is_some_and(|(p, m)| !p.is_empty() && !m.is_empty())
        && model.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        Err("must be provider:model, for example openai:gpt-4.1-mini".to_owned())
    }
}

/// An environment variable name `^[A-Za-z_][A-Za-z0-9_]{0,127}$`.
pub fn check_env_name(name: &str) -> Result<(), String> {
    let mut bytes = name.bytes();
    let ok = name.len() <= 128
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err("must match ^[A-Za-z_][A-Za-z0-9_]{0,127}$".to_owned())
    }
}

/// An allowed egress host: a hostname, optionally `*.`-prefixed, optionally
/// with `:port`.
pub fn check_host(host: &str) -> Result<(), String> {
    let name = host.strip_prefix("*.").unwrap_or(host);
    let name = match name.rsplit_once(':') {
        Some((n, port)) if port.parse::<u16>().is_ok_and(|p| p != 0) => n,
        _ => name,
    };
    let ok = !name.is_empty()
        && host.len() <= 260
        && name
            .split('.')
            .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    if ok {
        Ok(())
    } else {
        Err("must be a host name like pypi.org, *.example.com or example.com:8443".to_owned())
    }
}

/// Whether `name` is a tool name every provider accepts (client tools, and
/// the wire names of MCP tools): `^[A-Za-z0-9_-]{1,64}$`. Session ids and
/// call ids follow the same pattern.
pub fn valid_tool_name(name: &str) -> bool {
    is_name(name, 64, b"_-")
}

/// `1..=max` ASCII letters, digits, or one of `extra`.
pub(crate) fn is_name(name: &str, max: usize, extra: &[u8]) -> bool {
    (1..=max).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths() {
        assert!(check_relative_path("a/b.txt").is_ok());
        for bad in ["", "/etc", "a/../b", "a//b", "./a", "a\\b", "C:x", "a\u{7}"] {
            assert!(check_relative_path(bad).is_err(), "{bad:?}");
        }
        assert!(check_relative_path_within("abcd", 3).is_err());
    }

    #[test]
    fn hosts_and_names() {
        for good in ["pypi.org", "*.example.com", "example.com:8443"] {
            assert!(check_host(good).is_ok(), "{good}");
        }
        for bad in ["", "a..b", "exa mple.com", "*.", "x.com:0"] {
            assert!(check_host(bad).is_err(), "{bad}");
        }
        assert!(check_env_name("_A1").is_ok());
        assert!(check_env_name("1A").is_err());
        assert!(check_model("openai:gpt").is_ok());
        assert!(check_model("gpt").is_err());
    }
}
