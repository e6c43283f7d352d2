//! Repository rules that are cheaper to check than to remember: every
//! module opens with a `//!` doc saying what it is for (STYLE.md §6).

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_module_starts_with_a_doc_comment() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for krate in std::fs::read_dir(&crates).unwrap().flatten() {
        rust_files(&krate.path().join("src"), &mut files);
    }
    assert!(files.len() > 50, "found only {} source files", files.len());
    let undocumented: Vec<String> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            !text
                .lines()
                .find(|l| !l.trim().is_empty())
                .is_some_and(|l| l.starts_with("//!"))
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        undocumented.is_empty(),
        "modules without a //! doc: {undocumented:?}"
    );
}

/// Every `.rs` file of every crate's `src/`, by crate folder.
fn sources_by_crate() -> Vec<(String, PathBuf, Vec<PathBuf>)> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = Vec::new();
    for krate in std::fs::read_dir(&crates).unwrap().flatten() {
        let src = krate.path().join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        files.sort();
        out.push((krate.file_name().to_string_lossy().into_owned(), src, files));
    }
    out
}

/// Where `unsafe` may be: the jail's raw system calls.
const UNSAFE_HOMES: [(&str, &str); 1] = [("asbx-jail", "sys.rs")];

#[test]
fn unsafe_code_is_allowed_only_in_its_home() {
    let mut offenders = Vec::new();
    for (krate, src, files) in sources_by_crate() {
        for f in files {
            let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let home = UNSAFE_HOMES.contains(&(krate.as_str(), rel.as_str()));
            if text.contains("allow(unsafe_code)") && !home {
                offenders.push(format!("{krate}/src/{rel}"));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "unsafe allowed outside {UNSAFE_HOMES:?}: {offenders:?}"
    );
}

/// The top-level module a file belongs to (`chats` for `src/chats/api.rs`).
fn top_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_owned()
}

/// Finds a cycle in `graph` (module → modules it uses), if any.
fn find_cycle(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|n| n == node) {
            let mut cycle = path[i..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = std::collections::BTreeSet::new();
    for node in graph.keys() {
        if let Some(c) = visit(node, graph, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn no_import_cycle_between_the_modules_of_a_crate() {
    let mut cycles = Vec::new();
    for (krate, src, files) in sources_by_crate() {
        let mut graph: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
            Default::default();
        for f in &files {
            let from = top_module(&src, f);
            if matches!(from.as_str(), "lib" | "main" | "bin") {
                continue;
            }
            let text = std::fs::read_to_string(f).unwrap_or_default();
            let code: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            let mut rest = code.as_str();
            while let Some(i) = rest.find("crate::") {
                rest = &rest[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                // `crate::{a, b}` groups: every name in the braces.
                let names: Vec<String> = if name.is_empty() && rest.starts_with('{') {
                    let inner = &rest[1..rest.find('}').unwrap_or(rest.len())];
                    inner
                        .split(',')
                        .map(|s| {
                            s.trim()
                                .chars()
                                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                                .collect()
                        })
                        .collect()
                } else {
                    vec![name]
                };
                for to in names {
                    let is_module = src.join(format!("{to}.rs")).is_file()
                        || src.join(&to).join("mod.rs").is_file();
                    if is_module && to != from {
                        graph.entry(from.clone()).or_default().insert(to);
                    }
                }
            }
        }
        if let Some(cycle) = find_cycle(&graph) {
            cycles.push(format!("{krate}: {}", cycle.join(" -> ")));
        }
    }
    assert!(cycles.is_empty(), "import cycles: {cycles:#?}");
}

#[test]
fn the_readme_configuration_table_matches_the_cli() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let documented: std::collections::BTreeSet<String> = readme
        .lines()
        .filter(|l| l.starts_with("| `"))
        .flat_map(|l| {
            let first = l.split('|').nth(1).unwrap_or("");
            first
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|v| {
            v.chars()
                .all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit())
        })
        .collect();
    let out = std::process::Command::new(crate::harness::ASBX)
        .arg("env-vars")
        .output()
        .unwrap();
    assert!(out.status.success(), "asbx env-vars: {out:?}");
    let cli: std::collections::BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert!(cli.len() > 10, "asbx env-vars listed only {cli:?}");
    let undocumented: Vec<_> = cli.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "settings missing from the README's configuration table: {undocumented:?}"
    );
    // Read outside clap (by tracing, or by a library).
    let elsewhere = ["ASBX_LOG", "OTEL_EXPORTER_OTLP_ENDPOINT"];
    let stale: Vec<_> = documented
        .difference(&cli)
        .filter(|v| !elsewhere.contains(&v.as_str()))
        .collect();
    assert!(
        stale.is_empty(),
        "README documents settings the CLI does not read: {stale:?}"
    );
}

/// Issue 28, defect 14: every Markdown file the README names is in the
/// repository (from its root, or under `docs/`), never outside it (the
/// README once sent readers to `../shared/CONTRACT.md`).
#[test]
fn the_readme_names_only_documents_in_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let named: Vec<&str> = readme
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.ends_with(".md") && !s.contains(char::is_whitespace))
        .collect();
    assert!(named.len() >= 5, "found too few: {named:?}");
    let missing: Vec<_> = named
        .iter()
        .filter(|p| {
            p.split('/').any(|c| c == "..")
                || p.starts_with('/')
                || !(root.join(p).is_file() || root.join("docs").join(p).is_file())
        })
        .collect();
    assert!(
        missing.is_empty(),
        "the README names documents not in the repository: {missing:?}"
    );
    assert!(
        named.contains(&"docs/protocol.md"),
        "the README names the wire contract, docs/protocol.md"
    );
}

/// The crates' own `asbx-*` dependencies, per section of a `Cargo.toml`.
fn internal_deps(manifest: &toml::Table, section: &str) -> std::collections::BTreeSet<String> {
    manifest
        .get(section)
        .and_then(toml::Value::as_table)
        .map(|t| {
            t.keys()
                .filter(|k| k.starts_with("asbx-"))
                .map(|k| k.trim_start_matches("asbx-").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_crate_map_matches_the_manifests() {
    use std::collections::{BTreeMap, BTreeSet};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let arch = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let map = arch
        .split("## Code map")
        .nth(1)
        .and_then(|s| s.split("```").nth(1))
        .expect("a ``` block under ## Code map in ARCHITECTURE.md");
    let mut documented: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in map.lines().filter(|l| l.contains('►')) {
        let (from, to) = line.split_once("──►").expect("`crate ──► deps`");
        let deps = to.split(',').map(|d| d.trim().to_owned()).collect();
        documented.insert(from.trim().to_owned(), deps);
    }
    let mut actual: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    for krate in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        let Ok(text) = std::fs::read_to_string(krate.path().join("Cargo.toml")) else {
            continue;
        };
        let manifest: toml::Table = text.parse().unwrap();
        let name = manifest["package"]["name"].as_str().unwrap().to_owned();
        let short = match name.strip_prefix("asbx-") {
            Some(s) => s.to_owned(),
            None => name.clone(),
        };
        let deps = internal_deps(&manifest, "dependencies");
        // test-support is for tests (and the benchmarks) only.
        if deps.contains("test-support") && short != "bench" {
            problems.push(format!(
                "{name} depends on test-support outside [dev-dependencies]"
            ));
        }
        if !deps.is_empty() {
            actual.insert(short, deps);
        }
    }
    if documented != actual {
        problems.push(format!(
            "ARCHITECTURE.md's code map says {documented:#?}\nbut the manifests say {actual:#?}"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
