//! Model providers the runner's gateway forwards to: `openai` and
//! `anthropic` from the environment, and any number more, named, from a
//! TOML file (`--providers` / `ASBX_PROVIDERS`):
//!
//! ```toml
//! [[provider]]
//! name = "ollama"                       # models are "ollama:<model>"
//! kind = "openai"                       # wire format: "openai" or "anthropic"
//! base_url = "http://127.0.0.1:11434/v1"
//! api_key_env = "OLLAMA_API_KEY"        # optional: read the key from this variable
//! ```
//!
//! Keys stay in the runner; the sandbox only learns names and kinds. A key is
//! named by the variable holding it rather than written in the file, so the
//! file can be committed and shared.

use std::collections::HashSet;
use std::path::Path;

use anyhow::{Context, bail};
use asbx_protocol::gateway::ProviderKind;
use asbx_runner::ProviderConfig;
use serde::Deserialize;

use crate::cli::RunnerOpts;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    provider: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    kind: ProviderKind,
    base_url: String,
    #[serde(default)]
    api_key_env: Option<String>,
}

/// Every configured provider; a name may appear once.
pub(crate) fn load(opts: &RunnerOpts) -> anyhow::Result<Vec<ProviderConfig>> {
    let mut out = Vec::new();
    if opts.openai_api_key.is_some() || opts.openai_base_url.is_some() {
        out.push(ProviderConfig {
            name: "openai".to_owned(),
            kind: ProviderKind::Openai,
            base_url: api_base(
                ProviderKind::Openai,
                opts.openai_base_url
                    .as_deref()
                    .unwrap_or("https://api.openai.com/v1"),
            ),
            api_key: opts.openai_api_key.clone(),
        });
    }
    if opts.anthropic_api_key.is_some() || opts.anthropic_base_url.is_some() {
        out.push(ProviderConfig {
            name: "anthropic".to_owned(),
            kind: ProviderKind::Anthropic,
            base_url: api_base(
                ProviderKind::Anthropic,
                opts.anthropic_base_url
                    .as_deref()
                    .unwrap_or("https://api.anthropic.com"),
            ),
            api_key: opts.anthropic_api_key.clone(),
        });
    }
    if let Some(path) = &opts.providers {
        out.extend(from_file(path, |var| std::env::var(var).ok())?);
    }
    let mut seen = HashSet::new();
    for p in &out {
        if !seen.insert(p.name.as_str()) {
            bail!("provider {:?} is configured twice", p.name);
        }
    }
    Ok(out)
}

/// The base the gateway appends the wire path to, from a base URL written the
/// way each provider's own SDKs take it:
///
/// - Anthropic's SDKs take `ANTHROPIC_BASE_URL` without the version
///   (`https://api.anthropic.com`) and add `/v1/messages`; a base that already
///   ends in `/v1` is taken as it is, so both spellings work.
/// - OpenAI's SDKs take `OPENAI_BASE_URL` with the version
///   (`https://api.openai.com/v1`) and add `/chat/completions`, as the gateway
///   does; only a trailing `/` is dropped.
pub(crate) fn api_base(kind: ProviderKind, base_url: &str) -> String {
    let base = base_url.trim_end_matches('/');
    match kind {
        ProviderKind::Openai => base.to_owned(),
        ProviderKind::Anthropic if base.ends_with("/v1") => base.to_owned(),
        ProviderKind::Anthropic => format!("{base}/v1"),
    }
}

fn from_file(
    path: &Path,
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Vec<ProviderConfig>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the providers file {}", path.display()))?;
    parse(&text, env).with_context(|| format!("in the providers file {}", path.display()))
}

fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<Vec<ProviderConfig>> {
    let file: File = toml::from_str(text)?;
    file.provider
        .into_iter()
        .map(|e| {
            let name_ok = (1..=64).contains(&e.name.len())
                && e.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                && e.name != "scripted";
            if !name_ok {
                bail!(
                    "provider name {:?} must match ^[A-Za-z0-9_-]{{1,64}}$ and not be \"scripted\"",
                    e.name
                );
            }
            let url: url::Url = e
                .base_url
                .parse()
                .with_context(|| format!("provider {}: base_url {:?}", e.name, e.base_url))?;
            if !matches!(url.scheme(), "http" | "https") {
                bail!("provider {}: base_url must be http(s)", e.name);
            }
            let api_key = match &e.api_key_env {
                Some(var) => Some(env(var).with_context(|| {
                    format!(
                        "provider {}: the variable {var} holding its key is not set",
                        e.name
                    )
                })?),
                None => None,
            };
            Ok(ProviderConfig {
                name: e.name,
                kind: e.kind,
                base_url: api_base(e.kind, &e.base_url),
                api_key,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_providers_with_keys_from_variables() {
        let text = r#"
            [[provider]]
            name = "ollama"
            kind = "openai"
            base_url = "http://127.0.0.1:11434/v1"

            [[provider]]
            name = "claude-eu"
            kind = "anthropic"
            base_url = "https://eu.example.com/v1"
            api_key_env = "EU_KEY"
        "#;
        let ps = parse(text, |v| (v == "EU_KEY").then(|| "k-eu".to_owned())).unwrap();
        assert_eq!(ps.len(), 2);
        assert_eq!(ps[0].name, "ollama");
        assert_eq!(ps[0].kind, ProviderKind::Openai);
        assert_eq!(ps[0].api_key, None);
        assert_eq!(ps[1].kind, ProviderKind::Anthropic);
        assert_eq!(ps[1].api_key.as_deref(), Some("k-eu"));
    }

    #[test]
    fn base_urls_follow_each_providers_own_convention() {
        let a = |u| api_base(ProviderKind::Anthropic, u);
        assert_eq!(
            a("https://api.anthropic.com"),
            "https://api.anthropic.com/v1"
        );
        assert_eq!(
            a("https://api.anthropic.com/"),
            "https://api.anthropic.com/v1"
        );
        assert_eq!(
            a("https://api.anthropic.com/v1"),
            "https://api.anthropic.com/v1"
        );
        assert_eq!(
            a("http://proxy:8080/anthropic/v1/"),
            "http://proxy:8080/anthropic/v1"
        );
        let o = |u| api_base(ProviderKind::Openai, u);
        assert_eq!(o("https://api.openai.com/v1/"), "https://api.openai.com/v1");
        assert_eq!(o("http://127.0.0.1:11434/v1"), "http://127.0.0.1:11434/v1");
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let cases = [
            (
                "[[provider]]\nname = \"a b\"\nkind = \"openai\"\nbase_url = \"http://x\"",
                "must match",
            ),
            (
                "[[provider]]\nname = \"x\"\nkind = \"gemini\"\nbase_url = \"http://x\"",
                "unknown variant",
            ),
            (
                "[[provider]]\nname = \"x\"\nkind = \"openai\"\nbase_url = \"ftp://x\"",
                "http(s)",
            ),
            (
                "[[provider]]\nname = \"x\"\nkind = \"openai\"\nbase_url = \"http://x\"\napi_key_env = \"NOPE\"",
                "not set",
            ),
            (
                "[[provider]]\nname = \"x\"\nkind = \"openai\"\nbase_url = \"http://x\"\napi_key = \"inline\"",
                "unknown field",
            ),
        ];
        for (text, want) in cases {
            let err = format!("{:#}", parse(text, |_| None).unwrap_err());
            assert!(err.contains(want), "{text}: {err}");
        }
    }
}
