//! Numeric limits two parts of asbx must agree on, each written once.
//!
//! A limit here is enforced on both sides of a wire: the sender keeps under
//! it and the receiver refuses what is over it (`413 body_too_large`, or a
//! `400` naming the field). Limits only one part cares about stay with that
//! part.

/// Largest file in a chat's bag that crosses the sandbox's boundary: what
/// the in-sandbox workspace API stores from one upload, what the agent's
/// tools fetch or send, and what a chat turn places in a sandbox as
/// attachments in all (docs/protocol.md §3).
pub const MAX_BAG_FILE_BYTES: usize = 16 * 1024 * 1024;

/// Largest request body the runner's gateway passes to the in-sandbox
/// workspace API: one bag file and room for the rest of the request
/// (docs/protocol.md §3).
pub const MAX_WORKSPACE_REQUEST_BYTES: usize = MAX_BAG_FILE_BYTES + 64 * 1024;

/// Most files one writeback (`/results`) carries: the agent sends no more,
/// the workspace refuses a request with more.
pub const MAX_WRITEBACK_FILES: usize = 1_000;

/// Bytes one writeback may carry. The agent counts its files' bytes
/// against it; the workspace bounds the `/results` body (the files in
/// base64, about four thirds of their size, and their JSON) by it.
pub const MAX_WRITEBACK_BYTES: usize = 64 * 1024 * 1024;

/// Most messages one chat-history answer of the in-sandbox workspace API
/// holds: the workspace caps `limit` at it, the agent's `chat_history`
/// tool asks for no more.
pub const MAX_HISTORY_MESSAGES: usize = 100;

/// Messages a chat-history answer holds when the request names no `limit`.
pub const DEFAULT_HISTORY_MESSAGES: usize = 20;

/// Most connections a sandbox holds open at once to one of the runner's
/// sockets (its gateway, its egress proxy): the runner accepts no more, and
/// the agent's egress relay opens no more.
pub const MAX_SANDBOX_CONNECTIONS: usize = 32;
