//! Shared test helpers.
//!
//! - [`mock_provider`]: a mock model provider (axum on 127.0.0.1:0) that
//!   speaks the OpenAI chat-completions and the Anthropic Messages streaming
//!   formats, driven by scripted [`Tape`]s, with fault injection, recording
//!   every request it gets.
//! - [`blips`]: a TCP forwarder that cuts connections at random moments
//!   ([`Blips`]), within a budget of cuts per minute.
//! - [`fake_gateway`]: a stand-in for the runner's per-sandbox gateway on a
//!   Unix socket: the `/callback/*` routes with single-use tokens, and
//!   `/model/{provider}/...` proxied to a provider with a key added, and
//!   `/mcp/{name}` proxied to a streamable-HTTP MCP server, and
//!   `/client-tool/{callId}` answered with what the test pushes.
//! - [`fake_runner`]: a stand-in for the runner's `POST /stream`, for the
//!   workspace's tests.
//! - [`fake_workspace`]: a stand-in for the workspace's callback routes,
//!   with real one-time tokens, for the runner's tests.
//! - [`procs`]: host processes seen from outside a sandbox.
//! - [`skip()`]: skip a check out loud (never silently).
//! - [`snapshot`]: [`asbx_snapshot!`], the one snapshot macro, with
//!   filters that hide ids, times and paths.
//! - [`mcp_server`]: test MCP servers: a stdio one in Python
//!   ([`echo_server_path`]) and a streamable-HTTP one ([`McpHttpServer`]).
//! - [`openapi`]: checks of an OpenAPI document (the problem codes it
//!   names, schemas given a type for parsers that need one).
//! - [`otlp`]: an OTLP/HTTP trace receiver ([`OtlpReceiver`]) that keeps
//!   every span it gets.

pub mod blips;
pub mod fake_gateway;
pub mod fake_runner;
pub mod fake_workspace;
pub mod mcp_server;
pub mod mock_provider;
pub mod openapi;
pub mod otlp;
pub mod procs;
pub mod skip;
pub mod snapshot;
pub mod tls_server;

pub use blips::{Blips, CutPlan};
pub use fake_gateway::{
    ClientToolAnswer, FakeFile, FakeGateway, FakeWorkspaceApi, GatewayConfig, GatewayProvider,
};
pub use mcp_server::{McpHttpServer, McpRequest, echo_server_path, echo_server_source};
pub use mock_provider::{MockProvider, MockToolCall, RecordedRequest, Tape};
pub use otlp::{OtlpReceiver, ReceivedSpan};
pub use procs::descendants_of;
pub use skip::skip;

/// Locks a mutex, ignoring poisoning (a panicking test thread must not hide
/// the recorded data from the others).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
