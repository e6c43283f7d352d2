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

/// The module path of a source file (`chats::turn` for `src/chats/turn.rs`,
/// `chats` for `src/chats/mod.rs`, `""` for the crate root); `None` for a
/// binary's files.
fn file_module(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?.with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    if parts.last().is_some_and(|p| p == "mod")
        || matches!(parts.as_slice(), [p] if p == "lib" || p == "main")
    {
        parts.pop();
    }
    Some(parts.join("::"))
}

/// The code of a file without comment lines and without its inline unit
/// tests (`#[cfg(test)] mod tests { ... }`, whose `super` is the file).
fn code_of(text: &str) -> String {
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        let t = l.trim_start();
        if t.starts_with("#[cfg(test)]")
            && lines
                .peek()
                .is_some_and(|n| n.trim_start().starts_with("mod tests {"))
        {
            break;
        }
        if !t.starts_with("//") {
            out.push(l);
        }
    }
    out.join("\n")
}

/// Every path a use tree or path expression starting at `rest` names, as
/// segments (`a::{b, c::d}` → `[a, b]`, `[a, c, d]`), and the bytes read.
fn paths_from(rest: &str) -> (Vec<Vec<String>>, usize) {
    fn ident(s: &str) -> (&str, &str) {
        let end = s
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len());
        s.split_at(end)
    }
    fn tree(s: &str, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
        let mut path = prefix.to_vec();
        let mut i = 0;
        loop {
            let rest = &s[i..];
            let trimmed = rest.trim_start();
            i += rest.len() - trimmed.len();
            if let Some(group) = trimmed.strip_prefix('{') {
                i += 1;
                let mut j = 0;
                loop {
                    j += tree(&group[j..], &path, out);
                    let mut after = group[j..].trim_start();
                    j += group[j..].len() - after.len();
                    // `x as y`: the new name is no path.
                    if let Some(renamed) = after.strip_prefix("as ") {
                        let (name, _) = ident(renamed.trim_start());
                        let skipped = after.len() - renamed.trim_start().len() + name.len();
                        j += skipped;
                        after = group[j..].trim_start();
                        j += group[j..].len() - after.len();
                    }
                    if let Some(more) = after.strip_prefix(',') {
                        j += 1;
                        if more.trim_start().starts_with('}') {
                            j += more.len() - more.trim_start().len() + 1;
                            break;
                        }
                    } else {
                        j += usize::from(after.starts_with('}'));
                        break;
                    }
                }
                return i + j;
            }
            let (name, after) = ident(trimmed);
            if name.is_empty() {
                break;
            }
            path.push(name.to_owned());
            i += name.len();
            if after.starts_with("::") {
                i += 2;
            } else {
                break;
            }
        }
        out.push(path);
        i
    }
    let mut out = Vec::new();
    let read = tree(rest, &[], &mut out);
    (out, read)
}

/// The file modules `code` (of module `from`) names: through `crate::`,
/// `super::` and `self::` paths, and a child module's bare name.
fn file_edges(
    from: &str,
    is_mod_rs: bool,
    code: &str,
    modules: &std::collections::BTreeSet<String>,
) -> std::collections::BTreeSet<String> {
    let join = |base: &str, tail: &[String]| -> Vec<String> {
        let mut v: Vec<String> = base
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        v.extend(tail.iter().cloned());
        v
    };
    let parent = |m: &str| {
        m.rsplit_once("::")
            .map_or(String::new(), |(p, _)| p.to_owned())
    };
    // `self` of a file's code is its module; `super` the module above it.
    let this = from.to_owned();
    let mut found = std::collections::BTreeSet::new();
    let mut resolve = |segments: Vec<String>| {
        // The longest prefix that is a file module.
        for n in (1..=segments.len()).rev() {
            let m = segments[..n].join("::");
            if modules.contains(&m) {
                if m != from {
                    found.insert(m);
                }
                return;
            }
        }
    };
    let bytes = code.as_bytes();
    // The end of the last path read: `::`s inside it are not paths' starts.
    let mut read_to = 0;
    for (i, _) in code.match_indices("::") {
        if i < read_to {
            continue;
        }
        // The first segment of a path: the identifier before this `::`,
        // not itself after a `::`.
        let start = code[..i]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |p| p + 1);
        let first = &code[start..i];
        if first.is_empty() || (start >= 2 && &bytes[start - 2..start] == b"::") {
            continue;
        }
        if !(matches!(first, "crate" | "self" | "super") || is_mod_rs || this.is_empty()) {
            continue;
        }
        let (tails, read) = paths_from(&code[i + 2..]);
        read_to = i + 2 + read;
        for tail in tails {
            let full = match first {
                "crate" => join("", &tail),
                "self" => join(&this, &tail),
                "super" => {
                    let mut base = parent(&this);
                    let mut tail = tail.as_slice();
                    while tail.first().is_some_and(|s| s == "super") {
                        base = parent(&base);
                        tail = &tail[1..];
                    }
                    join(&base, tail)
                }
                child if is_mod_rs || this.is_empty() => {
                    let mut segs = vec![child.to_owned()];
                    segs.extend(tail);
                    join(&this, &segs)
                }
                _ => continue,
            };
            resolve(full);
        }
    }
    found
}

/// Strongly connected components of more than one node (Tarjan).
fn cycles_of(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Vec<Vec<String>> {
    struct T<'a> {
        graph: &'a std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        index: std::collections::BTreeMap<&'a str, (usize, usize)>,
        stack: Vec<&'a str>,
        on: std::collections::BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, (t.next, t.next));
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        for w in t.graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let low = t.index[v].1.min(t.index[w].1);
                t.index.get_mut(v).unwrap().1 = low;
            } else if t.on.contains(w) {
                let low = t.index[v].1.min(t.index[w].0);
                t.index.get_mut(v).unwrap().1 = low;
            }
        }
        if t.index[v].0 == t.index[v].1 {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                scc.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        graph,
        index: Default::default(),
        stack: Vec::new(),
        on: Default::default(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out.sort();
    t.out
}

/// The file-level import graph of every crate: `crate::module::file` edges.
fn file_cycles() -> Vec<String> {
    let mut cycles = Vec::new();
    for (krate, src, files) in sources_by_crate() {
        let mods: Vec<(String, &PathBuf)> = files
            .iter()
            .filter_map(|f| Some((file_module(&src, f)?, f)))
            .collect();
        let modules: std::collections::BTreeSet<String> =
            mods.iter().map(|(m, _)| m.clone()).collect();
        let mut graph: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
            Default::default();
        for (m, f) in &mods {
            if m.is_empty() {
                continue; // the crate root declares every module
            }
            let is_mod_rs = f.file_name().is_some_and(|n| n == "mod.rs");
            let code = code_of(&std::fs::read_to_string(f).unwrap_or_default());
            let edges = file_edges(m, is_mod_rs, &code, &modules);
            graph.entry(m.clone()).or_default().extend(edges);
        }
        for scc in cycles_of(&graph) {
            cycles.push(format!("{krate}: {}", scc.join(", ")));
        }
    }
    cycles
}

/// Files that import each other today, in a cycle (each line one strongly
/// connected set of files), to be broken so that this list empties. A new
/// cycle fails the test below, and so does a line here that no longer is
/// one.
const KNOWN_FILE_CYCLES: &[&str] = &[];

#[test]
fn no_import_cycle_between_the_files_of_a_crate() {
    let found = file_cycles();
    let new: Vec<&String> = found
        .iter()
        .filter(|c| !KNOWN_FILE_CYCLES.contains(&c.as_str()))
        .collect();
    let gone: Vec<&&str> = KNOWN_FILE_CYCLES
        .iter()
        .filter(|k| !found.iter().any(|c| c == *k))
        .collect();
    assert!(
        new.is_empty() && gone.is_empty(),
        "import cycles between files: {new:#?}\nno longer cycles (remove them from KNOWN_FILE_CYCLES): {gone:#?}"
    );
}

#[test]
fn the_file_graph_sees_crate_super_and_child_paths() {
    let modules: std::collections::BTreeSet<String> =
        ["a", "a::b", "a::c", "d"].map(str::to_owned).into();
    let code = "use crate::{d, a::c::Thing};\nuse super::Other;\nfn f() { b::g(); }";
    let edges = file_edges("a::x", false, code, &modules);
    assert_eq!(edges, ["a", "a::c", "d"].map(str::to_owned).into());
    let edges = file_edges("a", true, code, &modules);
    assert_eq!(edges, ["a::b", "a::c", "d"].map(str::to_owned).into());
    let graph = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]
        .into_iter()
        .fold(
            std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new(),
            |mut g, (x, y)| {
                g.entry(x.into()).or_default().insert(y.into());
                g
            },
        );
    assert_eq!(cycles_of(&graph), vec![vec!["a", "b", "c"]]);
}
