//! End-to-end tests: the real `asbx` binary over real HTTP on loopback.

// Test helpers outside #[test] fns panic on purpose.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

mod harness;

mod agent_features;
mod audit;
mod blips;
mod chat_live;
mod conns;
mod dispatch;
mod docs;
mod doctor;
mod egress;
mod egress_secrets;
mod encryption;
mod fleet;
mod hostile;
mod isolation;
mod many_machines;
mod metrics;
mod models;
mod protocol2;
mod runner_auth;
mod runner_urls;
mod runs_api;
mod sandbox_api;
mod secrets;
mod startup;
mod system;
mod takeover;
mod tidy;
mod tool_kill;
mod traces;
mod web_security;
mod workdir;
mod workdir_restore;
mod ws;
