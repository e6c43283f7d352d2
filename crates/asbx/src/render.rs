//! `asbx run`: dispatch one turn through a workspace and render it live.
//!
//! The step trace goes to stderr (a spinner per running step when stderr is
//! a terminal), the final result to stdout, so `asbx run ... > answer.txt`
//! keeps just the answer.

#![allow(clippy::print_stdout)]

use std::collections::HashMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use asbx_protocol::{Event, LineDecoder, StepStatus};
use futures::StreamExt;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::RunArgs;

pub(crate) async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let url = args.url.join("api/runs").context("building the runs URL")?;
    let mut body = serde_json::json!({ "prompt": args.prompt });
    if let Some(m) = &args.model {
        body["model"] = m.clone().into();
    }
    let res = reqwest::Client::new()
        .post(url.clone())
        .json(&body)
        .send()
        .await
        .with_context(|| format!("reaching the workspace at {url}; is `asbx up` running?"))?;
    if !res.status().is_success() {
        let status = res.status();
        let text = res.text().await.unwrap_or_default();
        bail!("the workspace answered {status}: {text}");
    }
    let mut ui = Ui::new();
    let mut decoder = LineDecoder::default();
    let mut stream = res.bytes_stream();
    let mut code = ExitCode::from(1);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.context("reading the stream")?;
        if args.json {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            out.write_all(&chunk)?;
            out.flush()?;
        }
        for line in decoder.push(&chunk) {
            match line {
                Ok(line) => {
                    if let Some(c) = ui.show(&line.event, args.json) {
                        code = c;
                    }
                }
                Err(e) => ui.note(&format!("skipped a bad line: {e}")),
            }
        }
    }
    Ok(code)
}

struct Ui {
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
                let args = step.args.as_ref().map(summarize).unwrap_or_default();
                match step.status {
                    StepStatus::Running => {
                        let bar = self.multi.add(ProgressBar::new_spinner());
                        bar.set_style(self.style_running.clone());
                        bar.set_message(format!("{} {args}", step.name));
                        bar.enable_steady_tick(Duration::from_millis(80));
                        if self.multi.is_hidden() && !quiet {
                            eprintln!("… {} {args}", step.name);
                        }
                        self.bars.insert(step.id.clone(), bar);
                    }
                    StepStatus::Succeeded | StepStatus::Failed => {
                        let ms = step.duration_ms.unwrap_or(0);
                        let line = match (&step.status, &step.error) {
                            (StepStatus::Failed, err) => format!(
                                "✗ {} ({ms} ms): {}",
                                step.name,
                                err.as_deref().unwrap_or("failed")
                            ),
                            _ => format!("✓ {} ({ms} ms)", step.name),
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
                None
            }
            Event::Result(r) => {
                if !quiet {
                    println!("{}", r.message);
                }
                Some(ExitCode::SUCCESS)
            }
            Event::Error(e) => {
                if !quiet {
                    eprintln!("error [{}]: {}", e.code, e.message);
                }
                Some(ExitCode::from(1))
            }
            Event::Delta(_) | Event::Log(_) | Event::Heartbeat(_) | Event::SessionInit(_) => None,
            Event::Stdout(_) | Event::ToolCall(_) | Event::ToolResultApplied(_) => None,
            Event::SessionEnded(_) => None,
        }
    }
}

fn summarize(v: &serde_json::Value) -> String {
    let s = match v.get("command").or_else(|| v.get("path")) {
        Some(serde_json::Value::String(s)) => s.clone(),
        _ => v.to_string(),
    };
    let s = s.replace('\n', " ");
    if s.chars().count() > 72 {
        format!("{}…", s.chars().take(72).collect::<String>())
    } else {
        s
    }
}
