//! `asbx run`: dispatch one turn through a workspace and render it live.
//!
//! The step trace goes to stderr (a spinner per running step when stderr is
//! a terminal, each tool's output live under its step), the answer to stdout
//! as the model streams it, so `asbx run ... > answer.txt` keeps just the
//! answer.
//!
//! Every byte that came from a sandbox (step names, arguments, tool output,
//! model text, error messages) is printed through [`escape_controls`]: no
//! terminal escape sequence from a model or a tool reaches the operator's
//! terminal.

#![allow(clippy::print_stdout)]

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use asbx_protocol::{Event, LineDecoder, StepStatus};
use futures::StreamExt;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::RunArgs;

pub(super) async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let url = args.url.join("api/runs").context("building the runs URL")?;
    // Protocol 2: the answer as it streams (`delta`) and each tool's output
    // while it runs (`stdout`), docs/protocol.md §4.
    let mut body = serde_json::json!({ "prompt": args.prompt, "protocol": 2 });
    if let Some(m) = &args.model {
        body["model"] = m.clone().into();
    }
    // Told at once when the run waits for a sandbox (docs/api-usage.md).
    let mut req = reqwest::Client::new()
        .post(url.clone())
        .header("prefer", "queued-notice")
        .json(&body);
    if let Some(key) = &args.api_key {
        req = req.bearer_auth(key);
    }
    let res = req
        .send()
        .await
        .with_context(|| format!("reaching the workspace at {url}; is `asbx up` running?"))?;
    if !res.status().is_success() {
        let status = res.status();
        let text = res.text().await.unwrap_or_default();
        bail!("the workspace answered {status}: {text}");
    }
    let mut ui = Ui::new();
    let mut lines = Lines {
        json: args.json,
        decoder: LineDecoder::default(),
        raw: Vec::new(),
        code: ExitCode::from(1),
    };
    let mut preamble = Some(Vec::new());
    let mut stream = res.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.context("reading the stream")?;
        match preamble.as_mut() {
            Some(head) => {
                head.extend_from_slice(&chunk);
                if notices(head, &ui)? {
                    let rest = preamble.take().unwrap_or_default();
                    lines.feed(&rest, &mut ui)?;
                }
            }
            None => lines.feed(&chunk, &mut ui)?,
        }
    }
    if let Some(rest) = preamble.filter(|r| !r.is_empty()) {
        lines.feed(&rest, &mut ui)?;
    }
    lines.finish()
}

/// The workspace's notices before the session's first line, asked for
/// with `Prefer: queued-notice` (docs/api-usage.md, "Queued").
#[derive(Debug, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Notice {
    /// The run waits for a sandbox, at most `waitS` seconds.
    Queued {
        #[serde(rename = "waitS")]
        wait_s: u64,
    },
    /// The wait ended in a refusal: what the status answer would have said.
    Refused {
        status: u16,
        problem: serde_json::Value,
    },
}

/// Takes the notices at the start of `head` off it, each shown; `true`
/// once a line that is not a notice starts it (the session's lines
/// follow), `false` while more may come.
fn notices(head: &mut Vec<u8>, ui: &Ui) -> anyhow::Result<bool> {
    while let Some(end) = memchr::memchr(b'\n', head) {
        let Ok(notice) = serde_json::from_slice::<Notice>(&head[..end]) else {
            return Ok(true);
        };
        match notice {
            Notice::Queued { wait_s } => {
                ui.note(&format!(
                    "queued: waiting for a sandbox (at most {wait_s} s)"
                ));
            }
            Notice::Refused { status, problem } => {
                let detail = escape_controls(&problem.to_string(), false).into_owned();
                bail!("the workspace answered {status} after the queue: {detail}");
            }
        }
        head.drain(..=end);
    }
    Ok(false)
}

/// The session's lines: printed raw (`--json`) and shown.
struct Lines {
    json: bool,
    decoder: LineDecoder,
    /// `--json`: the bytes after the last whole line printed.
    raw: Vec<u8>,
    code: ExitCode,
}

impl Lines {
    fn feed(&mut self, chunk: &[u8], ui: &mut Ui) -> anyhow::Result<()> {
        if self.json {
            // Whole lines only, so no character is split between two writes.
            use std::io::Write;
            self.raw.extend_from_slice(chunk);
            if let Some(end) = memchr::memrchr(b'\n', &self.raw) {
                let mut out = std::io::stdout().lock();
                out.write_all(&escape_json_controls(&self.raw[..=end]))?;
                out.flush()?;
                self.raw.drain(..=end);
            }
        }
        for line in self.decoder.push(chunk) {
            match line {
                Ok(line) => {
                    if let Some(c) = ui.show(&line.event, self.json) {
                        self.code = c;
                    }
                }
                Err(e) => ui.note(&format!("skipped a bad line: {e}")),
            }
        }
        Ok(())
    }

    fn finish(self) -> anyhow::Result<ExitCode> {
        if self.json && !self.raw.is_empty() {
            use std::io::Write;
            std::io::stdout()
                .lock()
                .write_all(&escape_json_controls(&self.raw))?;
        }
        Ok(self.code)
    }
}

struct Ui {
    /// The answer text printed so far from `delta` lines.
    streamed: String,
    multi: MultiProgress,
    bars: HashMap<String, ProgressBar>,
    style_running: ProgressStyle,
    style_done: ProgressStyle,
}

impl Ui {
    fn new() -> Self {
        let target = if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        Ui {
            streamed: String::new(),
            multi: MultiProgress::with_draw_target(target),
            bars: HashMap::new(),
            style_running: ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            style_done: ProgressStyle::with_template("{msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        }
    }

    fn note(&self, msg: &str) {
        if self.multi.is_hidden() {
            eprintln!("{msg}");
        } else {
            let _ = self.multi.println(msg);
        }
    }

    /// Shows one event; returns the exit code when the turn ended.
    fn show(&mut self, event: &Event, quiet: bool) -> Option<ExitCode> {
        match event {
            Event::Step(step) => {
                self.step(step, quiet);
                None
            }
            Event::Result(r) => self.result(r, quiet),
            Event::Error(e) => self.error(e, quiet),
            Event::Delta(d) => {
                if !quiet {
                    use std::io::Write;
                    let mut out = std::io::stdout().lock();
                    let _ = write!(out, "{}", escape_controls(&d.text, true));
                    let _ = out.flush();
                    self.streamed.push_str(&d.text);
                }
                None
            }
            Event::Stdout(o) => {
                if !quiet {
                    for line in o.chunk.lines().filter(|l| !l.is_empty()) {
                        let text = format!("    │ {}", escape_controls(line, false));
                        match self.bars.get(&o.step_id) {
                            Some(bar) if !self.multi.is_hidden() => bar.println(text),
                            _ => self.note(&text),
                        }
                    }
                }
                None
            }
            Event::SessionEnded(end) => {
                if !quiet
                    && let Some(msg) = &end.message
                    && end.reason != asbx_protocol::session::EndReason::Completed
                {
                    self.note(&format!("session ended: {}", escape_controls(msg, false)));
                }
                None
            }
            Event::Log(_) | Event::Heartbeat(_) | Event::SessionInit(_) => None,
            Event::ToolCall(_) | Event::ToolResultApplied(_) => None,
        }
    }

    /// A step: a spinner while it runs, a line once it ended.
    fn step(&mut self, step: &asbx_protocol::line::Step, quiet: bool) {
        let args = step.args.as_ref().map(summarize).unwrap_or_default();
        let name = escape_controls(&step.name, false);
        match step.status {
            StepStatus::Running => {
                let bar = self.multi.add(ProgressBar::new_spinner());
                bar.set_style(self.style_running.clone());
                bar.set_message(format!("{name} {args}"));
                bar.enable_steady_tick(Duration::from_millis(80));
                if self.multi.is_hidden() && !quiet {
                    eprintln!("… {name} {args}");
                }
                self.bars.insert(step.id.clone(), bar);
            }
            StepStatus::Succeeded | StepStatus::Failed => {
                let ms = step.duration_ms.unwrap_or(0);
                let line = match (&step.status, &step.error) {
                    (StepStatus::Failed, err) => format!(
                        "✗ {name} ({ms} ms): {}",
                        escape_controls(err.as_deref().unwrap_or("failed"), false)
                    ),
                    _ => format!("✓ {name} ({ms} ms)"),
                };
                match self.bars.remove(&step.id) {
                    Some(bar) => {
                        bar.set_style(self.style_done.clone());
                        bar.finish_with_message(line.clone());
                    }
                    None => self.note(&line),
                }
                if self.multi.is_hidden() && !quiet {
                    eprintln!("{line}");
                }
            }
        }
    }

    /// The answer, without what the deltas already showed.
    fn result(&self, r: &asbx_protocol::line::ResultLine, quiet: bool) -> Option<ExitCode> {
        if !quiet {
            let rest = r.message.strip_prefix(self.streamed.as_str());
            let text = match rest {
                // What the deltas already showed is not printed twice.
                Some(rest) => rest,
                None if self.streamed.is_empty() => r.message.as_str(),
                None => {
                    println!();
                    r.message.as_str()
                }
            };
            println!("{}", escape_controls(text, true));
        }
        Some(ExitCode::SUCCESS)
    }

    /// The turn's error, on stderr.
    fn error(&self, e: &asbx_protocol::line::ErrorLine, quiet: bool) -> Option<ExitCode> {
        if !quiet {
            if !self.streamed.is_empty() {
                println!();
            }
            eprintln!(
                "error [{}]: {}",
                escape_controls(&e.code, false),
                escape_controls(&e.message, false)
            );
        }
        Some(ExitCode::from(1))
    }
}

fn summarize(v: &serde_json::Value) -> String {
    let s = match v.get("command").or_else(|| v.get("path")) {
        Some(serde_json::Value::String(s)) => s.clone(),
        _ => v.to_string(),
    };
    let s = escape_controls(&s, false);
    if s.chars().count() > 72 {
        format!("{}…", s.chars().take(72).collect::<String>())
    } else {
        s.into_owned()
    }
}

/// `s` with every control character (and every Unicode bidirectional
/// override, which can make a line read differently than it is) written as a
/// visible escape: `\x1b`, `\u{202e}`. `keep_newlines` leaves `\n` and `\t`
/// as they are (for answer text and tool output).
pub(crate) fn escape_controls(s: &str, keep_newlines: bool) -> Cow<'_, str> {
    let bad = |c: char| {
        (c.is_control() && !(keep_newlines && (c == '\n' || c == '\t')))
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !s.chars().any(bad) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !bad(c) {
            out.push(c);
        } else if (c as u32) < 0x100 {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        }
    }
    Cow::Owned(out)
}

/// NDJSON bytes with the C1 control characters (U+0080 to U+009F) and the
/// bidirectional overrides written as JSON `\uXXXX` escapes. Valid JSON can
/// carry these raw inside strings (and nowhere else), where some terminals
/// act on them; escaped, the line is the same JSON and harmless to print.
/// (C0 controls can't appear raw in valid JSON.)
fn escape_json_controls(bytes: &[u8]) -> Cow<'_, [u8]> {
    let risky = |w: &[u8]| match w {
        [0xc2, b, ..] => (0x80..=0x9f).contains(b),
        [0xe2, 0x80, b] => (0xaa..=0xae).contains(b),
        [0xe2, 0x81, b] => (0xa6..=0xa9).contains(b),
        _ => false,
    };
    if !bytes.iter().any(|&b| b == 0xc2 || b == 0xe2) {
        return Cow::Borrowed(bytes);
    }
    let mut out = Vec::with_capacity(bytes.len() + 16);
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        if rest.len() >= 2 && rest[0] == 0xc2 && (0x80..=0x9f).contains(&rest[1]) {
            out.extend_from_slice(format!("\\u{:04x}", rest[1]).as_bytes());
            i += 2;
        } else if rest.len() >= 3 && risky(&rest[..3]) {
            let cp = ((u32::from(rest[0]) & 0x0f) << 12)
                | ((u32::from(rest[1]) & 0x3f) << 6)
                | (u32::from(rest[2]) & 0x3f);
            out.extend_from_slice(format!("\\u{cp:04x}").as_bytes());
            i += 3;
        } else {
            out.push(rest[0]);
            i += 1;
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_notices_are_taken_off_before_the_session_lines() {
        let ui = Ui::new();
        let mut head = br#"{"type":"queued","quota":"concurrent-sandboxes","waitS":30}"#.to_vec();
        assert!(!notices(&mut head, &ui).unwrap(), "no whole line yet");
        head.extend_from_slice(b"\n{\"type\":\"queued\",\"waitS\":15}\n{\"seq\":1,");
        assert!(
            !notices(&mut head, &ui).unwrap(),
            "the session line is not whole yet"
        );
        assert_eq!(head, b"{\"seq\":1,", "both notices taken off");
        head.extend_from_slice(b"\"type\":\"log\"}\n");
        assert!(
            notices(&mut head, &ui).unwrap(),
            "a session line ends the notices"
        );
        assert!(
            head.starts_with(b"{\"seq\":1,"),
            "and is left for the decoder"
        );
    }

    #[test]
    fn a_refusal_after_the_queue_is_an_error_naming_its_code() {
        let ui = Ui::new();
        let mut head = br#"{"type":"queued","waitS":1}
{"type":"refused","status":429,"retryAfter":5,"problem":{"code":"quota_exceeded","quota":"concurrent-sandboxes"}}
"#
        .to_vec();
        let e = notices(&mut head, &ui).unwrap_err().to_string();
        assert!(e.contains("429") && e.contains("quota_exceeded"), "{e}");
    }

    #[test]
    fn control_characters_are_shown_escaped() {
        assert_eq!(escape_controls("plain text", false), "plain text");
        assert_eq!(
            escape_controls("\u{1b}[31mred\u{1b}[0m", false),
            "\\x1b[31mred\\x1b[0m"
        );
        assert_eq!(escape_controls("a\nb\tc\r", true), "a\nb\tc\\x0d");
        assert_eq!(escape_controls("a\nb", false), "a\\x0ab");
        assert_eq!(escape_controls("\u{9b}2J", true), "\\x9b2J");
        assert_eq!(escape_controls("abc\u{202e}fed", true), "abc\\u{202e}fed");
    }

    #[test]
    fn raw_json_lines_keep_their_meaning_with_c1_controls_escaped() {
        let line = "{\"type\":\"result\",\"message\":\"a\u{9b}2Jb\u{202e}c\u{e9}\"}\n";
        let out = escape_json_controls(line.as_bytes());
        let text = std::str::from_utf8(&out).unwrap();
        assert!(
            !text.contains('\u{9b}') && !text.contains('\u{202e}'),
            "{text}"
        );
        let a: serde_json::Value = serde_json::from_str(line).unwrap();
        let b: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(a, b);
        assert!(matches!(
            escape_json_controls(b"{\"a\":\"\xc3\xa9\"}"),
            Cow::Borrowed(_)
        ));
    }
}
