//! Assistant chats (docs/protocol.md §7): turns with a per-chat
//! lease as the single-flight lock, live SSE with resume, persisted
//! messages, the list and thread views, and the chat's file bag.
//!
//! Uses `runs` (a turn is a run of kind `chat`) and `files` (the bag).

pub(crate) mod api;
pub(crate) mod live;
pub(crate) mod messages;
pub(crate) mod remote;
pub(crate) mod store;
pub(crate) mod takeover;
pub(crate) mod turn;
pub(crate) mod view;
