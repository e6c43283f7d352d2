//! What happens to a workspace's chats, live: `GET /api/assistant/events`
//! (SSE, `event: chat`), so a page in another tab or on another device sees
//! a turn start and end, a chat deleted or its settings changed, without
//! polling. One in-process broadcast per workspace on each node, made when
//! its first subscriber comes and dropped with its last, so one
//! workspace's burst can't push another's events out of a shared buffer
//! (issue 27: a subscriber lags only behind its own workspace).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt as _};
use serde::Serialize;
use tokio::sync::broadcast;

use crate::AppState;
use crate::apidoc as doc;
use crate::auth::Caller;

/// Events buffered per subscriber of one workspace; one that falls further behind misses
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

/// The node's broadcasts of chat events, one per workspace with a
/// subscriber here.
#[derive(Debug, Default)]
pub(crate) struct ChatEvents {
    by_workspace: Mutex<HashMap<String, broadcast::Sender<Arc<ChatEvent>>>>,
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
        let mut map = self
            .by_workspace
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(tx) = map.get(workspace_id) else {
            // No subscriber on this node.
            return;
        };
        let event = Arc::new(ChatEvent {
            workspace_id: workspace_id.to_owned(),
            chat_id: chat_id.to_owned(),
            turn_id: turn_id.map(str::to_owned),
            state,
        });
        if tx.send(event).is_err() {
            // Its last subscriber went away.
            map.remove(workspace_id);
        }
    }

    fn subscribe(&self, workspace_id: String) -> impl Stream<Item = Arc<ChatEvent>> + Send + use<> {
        let rx = {
            let mut map = self
                .by_workspace
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            map.retain(|_, tx| tx.receiver_count() > 0);
            map.entry(workspace_id.clone())
                .or_insert_with(|| broadcast::channel(CAPACITY).0)
                .subscribe()
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst of workspace A's events, far over the buffer, while B's
    /// subscriber is not reading: B still gets each of its own.
    #[tokio::test]
    async fn one_workspaces_burst_does_not_push_out_anothers_events() {
        let events = ChatEvents::default();
        let b = events.subscribe("b".to_owned());
        let a = events.subscribe("a".to_owned());
        events.emit("b", "b-chat", Some("t1"), "started");
        for i in 0..(4 * CAPACITY) {
            events.emit("a", &format!("a-{i}"), None, "updated");
        }
        events.emit("b", "b-chat", Some("t1"), "ended");
        let got: Vec<_> = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            b.take(2).map(|e| e.state).collect(),
        )
        .await
        .expect("B's two events, none pushed out");
        assert_eq!(got, ["started", "ended"]);
        // Positive control: A's own subscriber did fall behind its burst
        // (it missed the oldest), so the buffer was really overrun.
        let first = std::pin::pin!(a).next().await.unwrap();
        assert_ne!(first.chat_id, "a-0", "A's oldest events were dropped");
        // The last subscriber of a workspace gone, its broadcast goes too.
        events.emit("a", "a-last", None, "updated");
        assert!(!events.by_workspace.lock().unwrap().contains_key("a"));
    }
}
