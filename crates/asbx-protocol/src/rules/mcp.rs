//! What an MCP server entry may be. Its name is a path segment of the
//! gateway (`/mcp/{name}`) and a prefix of its tools' names.

use std::collections::BTreeSet;

use crate::callback::McpServer;
use crate::problem::FieldError;

/// Most MCP servers per run.
pub const MAX_SERVERS: usize = 32;
/// Longest server name.
pub const MAX_NAME_BYTES: usize = 64;
/// Longest command, argument or environment value, in bytes.
pub const MAX_ARG_BYTES: usize = 64 * 1024;
/// Most arguments or environment variables of a stdio server.
pub const MAX_ARGS: usize = 256;

/// Whether `name` can be a server name: 1 to 64 of `[A-Za-z0-9_-]`.
pub fn valid_name(name: &str) -> bool {
    super::names::is_name(name, MAX_NAME_BYTES, b"_-")
}

/// Whether `url` is an acceptable streamable-HTTP server URL: `http` or
/// `https`, a host, no credentials. (Where it may point is the egress
/// policy's decision, made when it is used.)
pub fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| "must be an http or https URL".to_owned())?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() {
        return Err("must name a host".to_owned());
    }
    if authority.contains('@') {
        return Err("must not carry credentials".to_owned());
    }
    if url.len() > 2048 || url.chars().any(|c| c.is_control() || c == ' ') {
        return Err("must be at most 2048 printable characters".to_owned());
    }
    Ok(())
}

/// Every problem of one server, as `(field suffix, message)`.
pub fn problems(server: &McpServer) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if !valid_name(server.name()) {
        out.push((
            "name".to_owned(),
            format!("must match ^[A-Za-z0-9_-]{{1,{MAX_NAME_BYTES}}}$"),
        ));
    }
    match server {
        McpServer::Stdio {
            command, args, env, ..
        } => {
            if command.trim().is_empty() {
                out.push(("command".to_owned(), "must not be empty".to_owned()));
            }
            if command.contains('\0') || command.len() > MAX_ARG_BYTES {
                out.push((
                    "command".to_owned(),
                    format!("must not contain NUL or exceed {MAX_ARG_BYTES} bytes"),
                ));
            }
            if args.len() > MAX_ARGS
                || args
                    .iter()
                    .any(|a| a.contains('\0') || a.len() > MAX_ARG_BYTES)
            {
                out.push((
                    "args".to_owned(),
                    format!(
                        "at most {MAX_ARGS} arguments of at most {MAX_ARG_BYTES} bytes, without NUL"
                    ),
                ));
            }
            if env.len() > MAX_ARGS {
                out.push(("env".to_owned(), format!("more than {MAX_ARGS} variables")));
            }
            for (name, value) in env {
                if let Err(msg) = super::names::check_env_name(name) {
                    out.push((format!("env.{name}"), msg));
                }
                if value.contains('\0') || value.len() > MAX_ARG_BYTES {
                    out.push((
                        format!("env.{name}"),
                        format!("value must not contain NUL or exceed {MAX_ARG_BYTES} bytes"),
                    ));
                }
            }
        }
        McpServer::Http { url, .. } => {
            if let Err(msg) = check_url(url) {
                out.push(("url".to_owned(), msg));
            }
        }
    }
    out
}

/// Checks one server; the first problem as text.
pub fn check(server: &McpServer) -> Result<(), String> {
    match problems(server).into_iter().next() {
        None => Ok(()),
        Some((field, msg)) => Err(format!("{field}: {msg}")),
    }
}

/// Every problem of a run's servers, as field errors under `field`.
pub fn check_servers(servers: &[McpServer], field: &str, errors: &mut Vec<FieldError>) {
    if servers.len() > MAX_SERVERS {
        errors.push(FieldError::new(
            field,
            format!(
                "{} MCP servers, at most {MAX_SERVERS} allowed",
                servers.len()
            ),
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, server) in servers.iter().enumerate() {
        let at = format!("{field}[{i}]");
        for (suffix, msg) in problems(server) {
            errors.push(FieldError::new(&format!("{at}.{suffix}"), msg));
        }
        if valid_name(server.name()) && !seen.insert(server.name()) {
            errors.push(FieldError::new(&format!("{at}.name"), "is a duplicate"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(name: &str, url: &str) -> McpServer {
        McpServer::Http {
            name: name.to_owned(),
            url: url.to_owned(),
        }
    }

    #[test]
    fn names_and_urls() {
        assert!(valid_name("docs_1-x"));
        for bad in ["", "a.b", "a/b", &"a".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
        let mut errors = Vec::new();
        check_servers(
            &[
                http("ok", "https://mcp.example.com/mcp"),
                http("ok", "https://mcp.example.com/mcp"),
                http("dot.name", "ftp://x"),
                http("cred", "https://u:p@x/"),
            ],
            "mcpServers",
            &mut errors,
        );
        let fields: Vec<_> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "mcpServers[1].name",
                "mcpServers[2].name",
                "mcpServers[2].url",
                "mcpServers[3].url"
            ]
        );
    }
}
