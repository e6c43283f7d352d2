//! Validation of untrusted names: file paths a sandbox writes back, MIME
//! types, model names, environment variable names, hosts.
//!
//! Each check returns the reason as text, so a 400 can name the problem.

/// Longest accepted file path, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;
/// Longest accepted path component, in bytes.
pub const MAX_COMPONENT_BYTES: usize = 255;

/// A relative path below the output folder: no absolute paths, no `..`, no
/// empty or `.` components, no backslashes, no control characters.
pub fn check_relative_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(format!("longer than {MAX_PATH_BYTES} bytes"));
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

/// A MIME type `type/subtype` with optional parameters, printable ASCII.
pub fn check_mime_type(mime: &str) -> Result<(), String> {
    let ok = mime.len() <= 255
        && mime.bytes().all(|b| (0x20..0x7f).contains(&b))
        && mime
            .split(';')
            .next()
            .and_then(|essence| essence.trim().split_once('/'))
            .is_some_and(|(t, s)| is_token(t) && is_token(s));
    if ok {
        Ok(())
    } else {
        Err("must be a MIME type like text/plain".to_owned())
    }
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
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

/// An allowed egress host: a hostname, optionally `*.`-prefixed, optional port.
pub fn check_host(host: &str) -> Result<(), String> {
    let name = host.strip_prefix("*.").unwrap_or(host);
    let name = match name.rsplit_once(':') {
        Some((n, port)) if port.parse::<u16>().is_ok() => n,
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
        Err("must be a host name like pypi.org or *.example.com".to_owned())
    }
}

/// The last component of a path, made safe for a `Content-Disposition`
/// `filename` (ASCII letters, digits, `.`, `-`, `_`).
pub fn ascii_file_name(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    let cleaned: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if cleaned.trim_matches(['.', '_']).is_empty() {
        "file".to_owned()
    } else {
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths() {
        for ok in ["a.txt", "dir/b.md", "a/b/c.tar.gz", "..foo", "x..y/z"] {
            assert_eq!(check_relative_path(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a/./b",
            "a//b",
            "a/",
            "C:x",
            "a\\b",
            "a\0b",
            "\n",
        ] {
            assert!(check_relative_path(bad).is_err(), "{bad:?}");
        }
        assert!(check_relative_path(&"a".repeat(MAX_PATH_BYTES + 1)).is_err());
        assert!(check_relative_path(&"a".repeat(MAX_COMPONENT_BYTES + 1)).is_err());
    }

    #[test]
    fn mime_types() {
        for ok in [
            "text/plain",
            "application/vnd.api+json",
            "text/html; charset=utf-8",
        ] {
            assert_eq!(check_mime_type(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "text",
            "/plain",
            "text/",
            "te xt/plain",
            "text/plain\r\nX: y",
        ] {
            assert!(check_mime_type(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn models_names_hosts() {
        assert!(check_model("openai:gpt-4.1-mini").is_ok());
        assert!(check_model("gpt").is_err());
        assert!(check_model(":x").is_err());
        assert!(check_env_name("PATH_2").is_ok());
        assert!(check_env_name("2X").is_err());
        assert!(check_env_name("A-B").is_err());
        assert!(check_host("pypi.org").is_ok());
        assert!(check_host("*.example.com").is_ok());
        assert!(check_host("localhost:8080").is_ok());
        assert!(check_host("a..b").is_err());
        assert!(check_host("http://x").is_err());
    }

    #[test]
    fn file_names_are_sanitized() {
        assert_eq!(ascii_file_name("dir/report.pdf"), "report.pdf");
        assert_eq!(ascii_file_name("a\"b;c.txt"), "a_b_c.txt");
        assert_eq!(ascii_file_name(".."), "file");
    }
}
