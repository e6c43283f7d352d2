//! Integration tests of asbx-workspace over real HTTP on loopback.

// Test helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod access;
mod agents;
mod audit;
mod blobs;
mod callback_replays;
mod callbacks;
mod chat_nodes;
mod chat_pages;
mod chats;
mod environments;
mod fleet;
mod queued;
mod quota;
mod quota_running;
mod readiness;
mod runs;
mod runs_api;
mod sandbox_api;
mod secrets;
mod security;
mod streams;
mod support;
mod tokens;
mod workdir;
