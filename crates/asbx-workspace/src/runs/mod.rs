//! Runs: one dispatch to the runner each. `POST /api/runs`, the dispatch
//! (tokens minted, run recorded, `POST {SANDBOX_URL}/stream`), the NDJSON
//! relay, the outcome tap that reads how a run ended (`tap`), the kept lines
//! (`events`: replay and live tail), and the public view `GET /api/runs/{id}`.
//!
//! Chats and stored agents are runs of another kind: they build a
//! [`dispatch::RunSpec`] and use this feature; it uses only `files`.

pub(crate) mod api;
pub(crate) mod caps;
pub(crate) mod dispatch;
pub(crate) mod events;
pub(crate) mod fleet;
pub(crate) mod lease;
pub(crate) mod lost;
pub(crate) mod reattach;
pub(crate) mod relay;
pub(crate) mod request;
pub(crate) mod runner_http;
pub(crate) mod store;
pub(crate) mod takeover;
pub(crate) mod tap;
pub(crate) mod view;
pub(crate) mod ws;
