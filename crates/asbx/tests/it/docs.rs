//! The API pages are tested: every `sh` example of `docs/api-*.md` runs, in
//! page order, in one `bash` per page against a real `asbx up`, with `$ASBX`
//! (the workspace), `$RUNNER` and `$RUNNER_TOKEN` set, `asbx` on the `PATH` and
//! `ASBX_DATA` its data folder. An example fails the
//! test when it exits non-zero, prints nothing, or (through `curl`) gets an
//! HTTP error, unless it says `# answers NNN`, and then it must get NNN.

use std::io::Read as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::UpProc;

/// The runner bearer the test starts `asbx up` with.
const RUNNER_TOKEN: &str = "docs-test-runner-token-0123456789";
/// Longest one page's examples may take.
const PAGE_DEADLINE: Duration = Duration::from_secs(120);

/// The `sh` code blocks of a Markdown page, in order.
fn sh_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match current.as_mut() {
            None if line.trim_end() == "```sh" => current = Some(String::new()),
            None => {}
            Some(_) if line.trim_end() == "```" => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    assert!(current.is_none(), "an unclosed ```sh block");
    blocks
}

/// The status an example says it answers (`# answers 401`), if any.
fn expected_status(block: &str) -> Option<u16> {
    block
        .lines()
        .find_map(|l| l.trim().strip_prefix("# answers "))
        .map(|s| {
            s.trim()
                .parse()
                .expect("`# answers NNN` with a status code")
        })
}

const MARK: &str = "@@asbx-docs-example";

/// One bash script running every block, each after a marker line, with a
/// `curl` that fails on an HTTP error (or prints the status it got).
fn script(blocks: &[String]) -> String {
    let mut s = String::from("set -euo pipefail\n");
    for (i, block) in blocks.iter().enumerate() {
        s.push_str(&format!("echo '{MARK} {i}'\n"));
        if expected_status(block).is_some() {
            s.push_str("curl() { command curl -w '\\n@@status %{http_code}\\n' \"$@\"; }\n");
        } else {
            s.push_str("curl() { command curl --fail-with-body \"$@\"; }\n");
        }
        s.push_str(block);
    }
    s.push_str(&format!("echo '{MARK} end'\n"));
    s
}

/// Runs a page's examples; returns (exit success, stdout, stderr).
fn run_page(script: &str, up: &UpProc, cwd: &Path) -> (bool, String, String) {
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(cwd)
        .env("ASBX", &up.url)
        .env("RUNNER", &up.runner_url)
        .env("RUNNER_TOKEN", RUNNER_TOKEN)
        // `asbx quota set` (docs/api-usage.md) on the workspace's database.
        .env("ASBX_DATA", up.data.path())
        .env("PATH", path_with_asbx())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let (mut o, mut e) = (String::new(), String::new());
        let _ = out.read_to_string(&mut o);
        let _ = err.read_to_string(&mut e);
        (o, e)
    });
    let deadline = Instant::now() + PAGE_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (o, e) = reader.join().unwrap();
    (status.is_some_and(|s| s.success()), o, e)
}

/// `PATH` with the tested `asbx`'s folder first.
fn path_with_asbx() -> std::ffi::OsString {
    let dir = Path::new(crate::harness::ASBX)
        .parent()
        .unwrap()
        .to_path_buf();
    let rest = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(dir).chain(std::env::split_paths(&rest))).unwrap()
}

/// What each example printed, by block index (`end` excluded).
fn outputs(stdout: &str, n: usize) -> Vec<Option<String>> {
    let mut out = vec![None; n];
    let mut current: Option<usize> = None;
    for line in stdout.lines() {
        if let Some(tag) = line.strip_prefix(MARK) {
            current = tag.trim().parse::<usize>().ok();
            if let Some(i) = current {
                out[i] = Some(String::new());
            }
            continue;
        }
        if let Some(text) = current.and_then(|i| out[i].as_mut()) {
            text.push_str(line);
            text.push('\n');
        }
    }
    out
}

#[test]
fn every_example_in_the_api_pages_runs() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    let mut pages: Vec<_> = std::fs::read_dir(&docs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("api-") && name.ends_with(".md")
        })
        .collect();
    pages.sort();
    assert!(pages.len() >= 4, "the API pages: {pages:?}");

    let up = UpProc::start(&[("ASBX_RUNNER_TOKEN", RUNNER_TOKEN)]);
    for page in &pages {
        let name = page.file_name().unwrap().to_string_lossy().into_owned();
        let blocks = sh_blocks(&std::fs::read_to_string(page).unwrap());
        assert!(!blocks.is_empty(), "{name} has no runnable example");
        let cwd = tempfile::tempdir().unwrap();
        let (ok, stdout, stderr) = run_page(&script(&blocks), &up, cwd.path());
        let printed = outputs(&stdout, blocks.len());
        let report = format!("{name}\n--- stdout\n{stdout}\n--- stderr\n{stderr}");
        assert!(
            ok && stdout.contains(&format!("{MARK} end")),
            "an example failed: {report}"
        );
        for (i, block) in blocks.iter().enumerate() {
            let text = printed[i].as_deref().unwrap_or("");
            match expected_status(block) {
                Some(code) => assert!(
                    text.contains(&format!("@@status {code}")),
                    "example {i} should answer {code}:\n{block}\n{report}"
                ),
                None => assert!(
                    !text.trim().is_empty(),
                    "example {i} printed nothing:\n{block}\n{report}"
                ),
            }
        }
    }
}

#[test]
fn the_example_parser_finds_blocks_and_statuses() {
    let page = "x\n```sh\necho a\n```\n```json\n{}\n```\n```sh\n# answers 404\ncurl x\n```\n";
    let blocks = sh_blocks(page);
    assert_eq!(blocks, vec!["echo a\n", "# answers 404\ncurl x\n"]);
    assert_eq!(expected_status(&blocks[0]), None);
    assert_eq!(expected_status(&blocks[1]), Some(404));
    let printed = outputs(&format!("{MARK} 0\na\n{MARK} 1\n\n{MARK} end\n"), 2);
    assert_eq!(printed[0].as_deref(), Some("a\n"));
    assert_eq!(printed[1].as_deref(), Some("\n"));
}
