//! A live turn's SSE frames, buffered so that a client reconnecting with
//! `Last-Event-ID` misses nothing: one frame per runner line the live stream
//! sends (`id` = the line's seq), heartbeats as comments, and the `done`
//! payload once the turn has settled. Bounded by [`MAX_BUFFERED_BYTES`]; the
//! oldest frames go first.

use std::collections::VecDeque;
use std::sync::Arc;

use axum::response::sse;

use crate::wire::Done;

/// Most bytes of SSE frames kept per turn for resumption; older frames are
/// dropped first.
const MAX_BUFFERED_BYTES: usize = 32 * 1024 * 1024;

/// One buffered SSE frame: a runner line (`id` = its seq), or a comment
/// (a runner `heartbeat`) when `kind` is empty.
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    pub(crate) seq: u64,
    kind: &'static str,
    data: Arc<str>,
}

impl Frame {
    /// The frame of a runner line of type `kind`.
    pub(crate) fn line(seq: u64, kind: &'static str, data: Arc<str>) -> Frame {
        Frame { seq, kind, data }
    }

    /// A runner `heartbeat`, sent on as an SSE comment.
    pub(crate) fn heartbeat(seq: u64) -> Frame {
        Frame {
            seq,
            kind: "",
            data: Arc::from("heartbeat"),
        }
    }

    pub(crate) fn to_sse(&self) -> sse::Event {
        if self.kind.is_empty() {
            return sse::Event::default().comment(&*self.data);
        }
        sse::Event::default()
            .id(self.seq.to_string())
            .event(self.kind)
            .data(&*self.data)
    }
}

/// A turn's buffered frames, and its `done` once settled.
#[derive(Debug, Default)]
pub(crate) struct Frames {
    events: VecDeque<Frame>,
    bytes: usize,
    done: Option<Done>,
}

impl Frames {
    /// Buffers `frame`, dropping the oldest past [`MAX_BUFFERED_BYTES`].
    pub(crate) fn push(&mut self, frame: Frame) {
        self.bytes += frame.data.len();
        self.events.push_back(frame);
        while self.bytes > MAX_BUFFERED_BYTES {
            match self.events.pop_front() {
                Some(old) => self.bytes -= old.data.len(),
                None => break,
            }
        }
    }

    pub(crate) fn finish(&mut self, done: Done) {
        self.done = Some(done);
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done.is_some()
    }

    /// Frames after `cursor`, and the `done` payload once every frame is out.
    pub(crate) fn after(&self, cursor: u64) -> (Vec<Frame>, Option<Done>) {
        let start = self.events.partition_point(|e| e.seq <= cursor);
        let frames: Vec<Frame> = self.events.iter().skip(start).cloned().collect();
        (frames, self.done.clone())
    }
}
