//! Assistant chats (docs/protocol.md §7): turns with a per-chat
//! lease as the single-flight lock, live SSE with resume, persisted
//! messages, the list and thread views, and the chat's file bag.
//!
//! Rooms: `api` (the handlers), `turn` (a turn's start), `driver` (the task
//! that drives a turn to its end), `live` and `frames` (the turns clients
//! attach to, their buffered SSE frames), `stored` (a turn's lines on their
//! way to the store), `lease` (the lease: its guard, renewal, takeover and
//! SQL), `remote` (another node's turn, replayed), `messages` (the step
//! trace), `store` and `view` (the chats and threads), `fork` (the kept working
//! directories and forks, CONTRACT §11).
//!
//! Uses `runs` (a turn is a run of kind `chat`) and `files` (the bag).

pub(crate) mod api;
pub(crate) mod driver;
pub(crate) mod fork;
pub(crate) mod frames;
pub(crate) mod lease;
pub(crate) mod live;
pub(crate) mod messages;
pub(crate) mod remote;
pub(crate) mod store;
pub(crate) mod stored;
pub(crate) mod turn;
pub(crate) mod view;
