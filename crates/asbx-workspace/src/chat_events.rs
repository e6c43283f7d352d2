//! What happens to a workspace's chats, live: `GET /api/assistant/events`
//! (SSE, `event: chat`), so a page in another tab or on another device sees
//! a turn start and end, a chat deleted or its settings changed, without
//! polling. One in-process broadcast per node; each subscriber keeps its
//! own workspace's events.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt as _};
use serde::Serialize;
use tokio::sync::broadcast;

use crate::AppState;
use crate::apidoc as doc;
use crate::auth::Caller;

/// Events buffered per subscriber; one that falls further behind misses
/// the oldest (it re-reads the chat list on the next one anyway).
const CAPACITY: usize = 256;

/// One chat event.
///
/// - `state`: `started` or `ended` (a turn), `deleted`, `updated` (settings).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ChatEvent {
    #[serde(skip)]
    pub(crate) workspace_id: String,
    pub(crate) chat_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) turn_id: Option<String>,
    #[schema(value_type = String)]
    pub(crate) state: &'static str,
}

/// The node's broadcast of chat events.
#[derive(Debug)]
pub(crate) struct ChatEvents {
    tx: broadcast::Sender<Arc<ChatEvent>>,
}

impl Default for ChatEvents {
    fn default() -> Self {
        ChatEvents {
            tx: broadcast::channel(CAPACITY).0,
        }
    }
}

impl ChatEvents {
    /// Tells every subscriber of the chat's workspace.
    pub(crate) fn emit(
        &self,
        workspace_id: &str,
        chat_id: &str,
        turn_id: Option<&str>,
        state: &'static str,
    ) {
        // No subscriber is fine.
        let _ = self.tx.send(Arc::new(ChatEvent {
            workspace_id: workspace_id.to_owned(),
            chat_id: chat_id.to_owned(),
            turn_id: turn_id.map(str::to_owned),
            state,
        }));
    }

    fn subscribe(&self, workspace_id: String) -> impl Stream<Item = Arc<ChatEvent>> + Send + use<> {
        let rx = self.tx.subscribe();
        futures::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(ev) => return Some((ev, rx)),
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
        .filter(move |ev| std::future::ready(ev.workspace_id == workspace_id))
    }
}

/// `GET /api/assistant/events`.
#[utoipa::path(
    get,
    path = "/api/assistant/events",
    tag = "chats",
    security((), ("api_key" = []), ("session_cookie" = [])),
    responses(
        (status = 200, description = "Chats' turns starting and ending, deletions and settings changes, as SSE (`event: chat`, `data`: a ChatEvent)", body = ChatEvent, content_type = "text/event-stream"),
        (status = 401, response = inline(doc::Unauthorized)),
    ),
)]
pub(crate) async fn serve(State(state): State<Arc<AppState>>, caller: Caller) -> Response {
    let events = state.chat_events.subscribe(caller.workspace_id).map(|ev| {
        Ok::<_, Infallible>(
            Event::default()
                .event("chat")
                .json_data(&*ev)
                .unwrap_or_default(),
        )
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().text("keep-alive"))
        .into_response()
}
