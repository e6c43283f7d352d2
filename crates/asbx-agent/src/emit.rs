//! The NDJSON writer for the agent's stdout.
//!
//! Every [`Event`] is serialized by serde from the typed enum, written as one
//! line and flushed at once, so the runner sees each line as it is produced.
//! The writer sits behind an async mutex: tools streaming `stdout` events and
//! the loop share one [`Emitter`], and lines never interleave.

use std::sync::Arc;

use asbx_protocol::line::{Delta, OutputStream, Stdout, Step, StepStatus};
use asbx_protocol::{Event, LogLevel, Protocol};
use serde_json::Value;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex;

type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// A cloneable handle on the agent's NDJSON output.
#[derive(Clone)]
pub(crate) struct Emitter {
    out: Arc<Mutex<Writer>>,
    protocol: Protocol,
}

impl std::fmt::Debug for Emitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emitter")
            .field("protocol", &self.protocol)
            .finish_non_exhaustive()
    }
}

impl Emitter {
    pub(crate) fn new(out: impl AsyncWrite + Send + Unpin + 'static, protocol: Protocol) -> Self {
        Emitter {
            out: Arc::new(Mutex::new(Box::new(out))),
            protocol,
        }
    }

    /// Whether protocol 2 lines (`delta`, `stdout`) may be written.
    pub(crate) fn is_v2(&self) -> bool {
        self.protocol == Protocol::V2
    }

    /// Writes one line and flushes it.
    pub(crate) async fn emit(&self, event: &Event) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(event).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut out = self.out.lock().await;
        out.write_all(&line).await?;
        out.flush().await
    }

    pub(crate) async fn log(
        &self,
        level: LogLevel,
        message: impl Into<String>,
    ) -> std::io::Result<()> {
        self.emit(&Event::log(level, message)).await
    }

    pub(crate) async fn step_running(
        &self,
        id: &str,
        name: &str,
        args: Value,
    ) -> std::io::Result<()> {
        self.emit(&Event::Step(Step {
            id: id.to_owned(),
            name: name.to_owned(),
            status: StepStatus::Running,
            args: Some(args),
            result: None,
            error: None,
            duration_ms: None,
        }))
        .await
    }

    /// A step's end: `failed` with `error` when there is one (with the
    /// `result` too when the tool has one to show), else `succeeded`.
    pub(crate) async fn step_finished(
        &self,
        id: &str,
        name: &str,
        result: Option<Value>,
        error: Option<String>,
        duration_ms: u64,
    ) -> std::io::Result<()> {
        let status = match error {
            None => StepStatus::Succeeded,
            Some(_) => StepStatus::Failed,
        };
        self.emit(&Event::Step(Step {
            id: id.to_owned(),
            name: name.to_owned(),
            status,
            args: None,
            result,
            error,
            duration_ms: Some(duration_ms),
        }))
        .await
    }

    /// A `delta` line; dropped in protocol 1.
    pub(crate) async fn delta(&self, text: &str) -> std::io::Result<()> {
        if !self.is_v2() || text.is_empty() {
            return Ok(());
        }
        self.emit(&Event::Delta(Delta {
            text: text.to_owned(),
        }))
        .await
    }

    /// A `stdout` line for a running tool; dropped in protocol 1.
    pub(crate) async fn tool_output(
        &self,
        step_id: &str,
        stream: OutputStream,
        chunk: &str,
    ) -> std::io::Result<()> {
        if !self.is_v2() || chunk.is_empty() {
            return Ok(());
        }
        self.emit(&Event::Stdout(Stdout {
            step_id: step_id.to_owned(),
            stream,
            chunk: chunk.to_owned(),
        }))
        .await
    }
}
