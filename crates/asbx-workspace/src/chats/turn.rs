//! Starting a chat turn (docs/protocol.md §7): take the chat's
//! lease (creating the chat on the first turn), persist the user message,
//! replay the last 20 messages, put attachments in the sandbox, dispatch.

use std::sync::Arc;

use asbx_protocol::FieldError;
use asbx_protocol::callback::{
    AttachmentRef, ConfigResponse, EnvResponse, REPLAY_TURN_LIMIT, Role, WorkspaceAccess,
};
use axum::http::{HeaderValue, StatusCode};
use bytes::Bytes;

use crate::AppState;
use crate::chats::driver::{self, TurnContext};
use crate::chats::lease::takeover::recover_lost_turn;
use crate::chats::lease::{self, LeaseGuard, sql as lease_sql};
use crate::chats::live::LiveTurn;
use crate::chats::store as chats;
use crate::environments;
use crate::error::WorkspaceError;
use crate::files::ascii_file_name;
use crate::files::store::{self as files, FileRow};
use crate::quota::admit;
use crate::runs::dispatch::{self, RunOptions, RunSpec, Started};
use crate::tokens;
use crate::validate;
use crate::wire::{
    ChatSettings, ContentBlock, FileAttachment, PersistedMessage, RunKind, TurnRequest,
};

/// Most attachments on one message.
pub(crate) const MAX_ATTACHMENTS: usize = 20;
/// Most attachment bytes placed in one sandbox: what the agent fetches
/// there is bounded by the bag's file limit.
pub(crate) const MAX_ATTACHMENT_BYTES: i64 =
    asbx_protocol::rules::limits::MAX_BAG_FILE_BYTES as i64;
/// Folder (in the sandbox's working directory) attachments are written to.
pub(crate) const ATTACHMENT_DIR: &str = "attachments";

/// A started turn.
#[derive(Debug)]
pub(crate) enum TurnStart {
    /// The runner streams; subscribe to the live turn.
    Live(Arc<LiveTurn>),
    /// The runner refused before streaming; pass its answer through. The
    /// failure is already persisted and the lease released.
    Rejected {
        chat_id: String,
        turn_id: String,
        status: StatusCode,
        content_type: Option<HeaderValue>,
        body: Bytes,
    },
}

/// Starts a turn: [`check`] the request, [`prepare`] what it needs (its
/// attachments, its chat and settings), [`record`] it (the lease, the user
/// message and the run, in one transaction) once [`admit_and_record`] finds
/// room for it, then [`dispatch_turn`]: a live turn ([`driver::spawn`]), or
/// the runner's refusal persisted and passed through ([`reject`]).
/// `notify` is told if it waits for its fair share
/// ([`crate::quota::notice`]).
pub(crate) async fn start_turn(
    state: &Arc<AppState>,
    workspace_id: &str,
    mut request: TurnRequest,
    notify: crate::quota::notice::Notify,
) -> Result<TurnStart, WorkspaceError> {
    let sandbox_url = check(state, &request)?;
    let prepared = prepare(state, workspace_id, &mut request, sandbox_url).await?;
    let turn_id = tokens::random_id();
    let now = state.now_ms();
    let lease = lease_sql::Lease {
        turn_id: &turn_id,
        until: lease::expiry(state, now),
        now_ms: now,
        first_message_id: &tokens::random_id(),
    };
    if let Some((chat, _)) = &prepared.existing {
        // A lost turn's lease is taken over below; mark that turn
        // interrupted first, so the thread says what became of it.
        recover_lost_turn(state, chat).await?;
    }
    let route = dispatch::route(state, &prepared.sandbox_url).await;
    let (recorded, limits) = admit_and_record(
        state,
        workspace_id,
        &request,
        &prepared,
        &lease,
        &route,
        notify,
    )
    .await?;
    dispatch_turn(state, workspace_id, recorded, &limits, turn_id, now, route).await
}

/// Waits for room under the workspace's quotas and the fleet's fair share,
/// then [`record`]s the turn; a dispatch that took the room first sends it
/// back to wait.
async fn admit_and_record(
    state: &Arc<AppState>,
    workspace_id: &str,
    request: &TurnRequest,
    prepared: &Prepared,
    lease: &lease_sql::Lease<'_>,
    route: &dispatch::Route,
    notify: crate::quota::notice::Notify,
) -> Result<(Recorded, crate::quota::Limits), WorkspaceError> {
    let limits = admit::limits(state, workspace_id).await?;
    let capacity = dispatch::fleet_capacity(state, &prepared.sandbox_url).await;
    let mut share = admit::ShareWait::new(state, &limits, workspace_id, capacity).notify(notify);
    let quota = Admission {
        limits: &limits,
        capacity,
    };
    loop {
        share.turn().await?;
        match record(
            state,
            workspace_id,
            request,
            prepared.clone(),
            lease,
            route,
            &quota,
        )
        .await
        {
            // Another dispatch took the room first: wait again.
            Err(e) if share.retry(&e) => continue,
            recorded => return recorded.map(|r| (r, limits)),
        }
    }
}

/// Dispatches a recorded turn under its lease: a live turn the driver
/// follows, or the runner's refusal (or its silence) persisted as the
/// turn's failure, the lease released.
async fn dispatch_turn(
    state: &Arc<AppState>,
    workspace_id: &str,
    recorded: Recorded,
    limits: &crate::quota::Limits,
    turn_id: String,
    now: i64,
    route: dispatch::Route,
) -> Result<TurnStart, WorkspaceError> {
    let Recorded {
        chat_id,
        spec,
        run,
        user_message_id,
    } = recorded;
    let lease = LeaseGuard::new(Arc::clone(state), chat_id.clone(), turn_id.clone());

    let live = LiveTurn::new(
        turn_id.clone(),
        chat_id.clone(),
        workspace_id.to_owned(),
        user_message_id,
        now,
        state.config.detach_grace,
    );
    match dispatch::post(state, &spec, &RunOptions::default(), route, run).await {
        Ok(Started::Streaming { response }) => {
            crate::quota::enforce::watch_seconds(state, limits, workspace_id, &turn_id);
            driver::spawn(
                TurnContext {
                    state: Arc::clone(state),
                    turn: Arc::clone(&live),
                    lease,
                },
                response,
            );
            Ok(TurnStart::Live(live))
        }
        Ok(Started::Rejected {
            status,
            content_type,
            body,
        }) => {
            let (code, message) = refusal(status, &body);
            reject(state, lease, &chat_id, &turn_id, &code, &message).await?;
            Ok(TurnStart::Rejected {
                chat_id,
                turn_id,
                status,
                content_type,
                body,
            })
        }
        Err(e) => {
            reject(
                state,
                lease,
                &chat_id,
                &turn_id,
                crate::error::ProblemCode::UpstreamFailed.as_str(),
                "the sandbox runner could not be reached",
            )
            .await?;
            Err(e)
        }
    }
}

/// The code and message a runner's refusal is persisted with: its
/// problem's, or `upstream_failed` when its body is none.
fn refusal(status: StatusCode, body: &[u8]) -> (String, String) {
    match serde_json::from_slice::<asbx_protocol::Problem>(body) {
        Ok(p) => (p.code, p.detail),
        Err(_) => (
            crate::error::ProblemCode::UpstreamFailed
                .as_str()
                .to_owned(),
            format!("the sandbox runner answered {status}"),
        ),
    }
}

/// The request's own faults, every one named (`400`); then the runner's
/// URL, without which no turn starts (`503`).
fn check(state: &AppState, request: &TurnRequest) -> Result<url::Url, WorkspaceError> {
    let mut errors = Vec::new();
    validate::prompt(&request.message, "message", &mut errors);
    if request.chat_id.is_some() && request.settings.is_some() {
        errors.push(FieldError::new(
            "settings",
            "only on a new chat's first turn: change an existing chat's with \
             PUT /api/assistant/chats/{id}/settings",
        ));
    }
    if request.attachment_ids.len() > MAX_ATTACHMENTS {
        errors.push(FieldError::new(
            "attachmentIds",
            format!("more than {MAX_ATTACHMENTS} attachments"),
        ));
    }
    if !errors.is_empty() {
        return Err(WorkspaceError::invalid_fields(errors));
    }
    state
        .config
        .sandbox_url
        .clone()
        .ok_or(WorkspaceError::SandboxUrlMissing)
}

/// What a turn needs before it is recorded, read outside its transaction.
#[derive(Clone)]
struct Prepared {
    attachments: Vec<FileRow>,
    /// An existing chat's row and stored settings.
    existing: Option<(chats::ChatRow, Option<String>)>,
    /// A new chat's settings, stored with it.
    new_settings: Option<ChatSettings>,
    settings_run: environments::ChatRun,
    sandbox_url: url::Url,
}

/// Resolves the attachments, reads an existing chat (its row and settings
/// in one read, `404` when there is none) and makes the run's settings.
async fn prepare(
    state: &AppState,
    workspace_id: &str,
    request: &mut TurnRequest,
    sandbox_url: url::Url,
) -> Result<Prepared, WorkspaceError> {
    let attachments = resolve_attachments(
        state,
        workspace_id,
        request.chat_id.as_deref(),
        &request.attachment_ids,
    )
    .await?;
    let existing = match &request.chat_id {
        Some(chat_id) => Some(
            chats::get_with_settings(state.store.pool(), chat_id, workspace_id)
                .await?
                .ok_or_else(|| WorkspaceError::NotFound(format!("chat {chat_id}")))?,
        ),
        None => None,
    };
    let stored_settings = existing.as_ref().and_then(|(_, text)| text.as_deref());
    let (new_settings, settings_run) =
        chat_settings(state, workspace_id, request, stored_settings).await?;
    Ok(Prepared {
        attachments,
        existing,
        new_settings,
        settings_run,
        sandbox_url,
    })
}

/// A recorded turn, ready to dispatch.
struct Recorded {
    chat_id: String,
    spec: RunSpec,
    run: dispatch::Recorded,
    user_message_id: String,
}

/// The quotas a turn is admitted under: its workspace's limits and the
/// fleet's capacity (the fair share).
struct Admission<'l> {
    limits: &'l crate::quota::Limits,
    capacity: Option<u64>,
}

/// Records the turn: the lease (a new chat made with it), the attachments
/// claimed for the chat's bag, the user message and the run with its
/// tokens. One transaction, one commit (one fsync on PostgreSQL), before
/// the dispatch. An error on the way rolls all of it back: no lease is taken
/// and nothing is left to release. A chat whose lease another turn holds is
/// `409 turn_in_flight`, unless that turn has finished (its message stored)
/// and only its release is still on its way
/// ([`lease_sql::clear_finished_lease`]).
async fn record(
    state: &AppState,
    workspace_id: &str,
    request: &TurnRequest,
    prepared: Prepared,
    lease: &lease_sql::Lease<'_>,
    route: &dispatch::Route,
    quota: &Admission<'_>,
) -> Result<Recorded, WorkspaceError> {
    let now = lease.now_ms;
    let mut tx = crate::store::begin_write(state.store.pool()).await?;
    let chat_id = match &request.chat_id {
        Some(chat_id) => {
            let mut taken = lease_sql::try_lease(&mut *tx, chat_id, workspace_id, lease).await?;
            if !taken
                && lease_sql::clear_finished_lease(&mut *tx, chat_id, workspace_id, now).await?
            {
                // The lease was a finished turn's, not yet released.
                taken = lease_sql::try_lease(&mut *tx, chat_id, workspace_id, lease).await?;
            }
            if !taken {
                tx.rollback().await?;
                let chat = chats::get(state.store.pool(), chat_id, workspace_id)
                    .await?
                    .ok_or_else(|| WorkspaceError::NotFound(format!("chat {chat_id}")))?;
                return Err(WorkspaceError::TurnInFlight {
                    chat_id: chat_id.clone(),
                    turn_id: chat.lease_turn_id.unwrap_or_default(),
                });
            }
            chat_id.clone()
        }
        None => {
            let chat_id = tokens::random_id();
            lease_sql::create_leased(
                &mut *tx,
                &chat_id,
                workspace_id,
                &title_of(&request.message),
                lease,
            )
            .await?;
            if let Some(settings) = &prepared.new_settings {
                environments::store_chat_settings_on(
                    &mut tx,
                    workspace_id,
                    &chat_id,
                    settings,
                    now,
                )
                .await?;
            }
            chat_id
        }
    };
    for file in &prepared.attachments {
        files::claim_for_chat(&mut *tx, &file.id, workspace_id, &chat_id).await?;
    }
    let history = chats::recent_messages(&mut *tx, &chat_id, REPLAY_TURN_LIMIT as i64).await?;
    let user_message = user_message(&request.message, &prepared.attachments, lease);
    chats::append_message(&mut *tx, &chat_id, &user_message).await?;

    let spec = run_spec(
        workspace_id,
        &chat_id,
        &request.message,
        lease.turn_id,
        &history,
        prepared,
    );
    admit::dispatch(&mut tx, quota.limits, workspace_id, now, quota.capacity).await?;
    let run = dispatch::record(&mut tx, &spec, route, now).await?;
    tx.commit().await?;
    Ok(Recorded {
        chat_id,
        spec,
        run,
        user_message_id: user_message.id,
    })
}

/// The turn's user message: its text and the files attached to it.
fn user_message(
    text: &str,
    attachments: &[FileRow],
    lease: &lease_sql::Lease<'_>,
) -> PersistedMessage {
    PersistedMessage {
        id: lease.first_message_id.to_owned(),
        role: Role::User,
        content: vec![ContentBlock::Text {
            text: text.to_owned(),
        }],
        file_attachments: attachments
            .iter()
            .map(|f| FileAttachment {
                id: f.id.clone(),
                name: f.path.clone(),
                mime_type: f.mime_type.clone(),
                size: f.size,
            })
            .collect(),
        created_at: lease.now_ms,
        turn_id: Some(lease.turn_id.to_owned()),
    }
}

/// The turn's run: the message (with the attached files' paths), the
/// chat's settings, the attachments placed in the sandbox, the replayed
/// `history`.
fn run_spec(
    workspace_id: &str,
    chat_id: &str,
    message: &str,
    turn_id: &str,
    history: &[PersistedMessage],
    prepared: Prepared,
) -> RunSpec {
    let Prepared {
        attachments,
        settings_run,
        sandbox_url,
        ..
    } = prepared;
    let placed = attachment_refs(&attachments);
    RunSpec {
        id: turn_id.to_owned(),
        workspace_id: workspace_id.to_owned(),
        kind: RunKind::Chat,
        chat_id: Some(chat_id.to_owned()),
        agent_id: None,
        prompt: prompt_with_attachments(message, &placed),
        env: EnvResponse {
            // The bearer is minted when `/env` is redeemed (`callbacks`).
            workspace: Some(WorkspaceAccess {
                token: String::new(),
                attachments: placed,
            }),
            ..settings_run.env
        },
        secrets: settings_run.secrets,
        config: ConfigResponse {
            conversation: history.iter().map(PersistedMessage::to_chat_turn).collect(),
            ..settings_run.config
        },
        sandbox_url,
        workdir_from: None,
    }
}

/// The rejection path: a turn the runner refused (or that could not reach
/// it) gets an `error` block in its thread, and its lease is released.
async fn reject(
    state: &AppState,
    lease: LeaseGuard,
    chat_id: &str,
    turn_id: &str,
    code: &str,
    message: &str,
) -> Result<(), WorkspaceError> {
    persist_failure(state, chat_id, turn_id, code, message).await?;
    lease.release().await;
    Ok(())
}

/// The turn's settings: a new chat's checked `settings` (returned to be
/// stored with the chat), or an existing chat's `stored` ones (their JSON
/// text, read with the chat); and the `/env` and `/config` they make (a
/// deleted environment is `409 conflict`).
async fn chat_settings(
    state: &AppState,
    workspace_id: &str,
    request: &mut TurnRequest,
    stored: Option<&str>,
) -> Result<(Option<ChatSettings>, environments::ChatRun), WorkspaceError> {
    let (new, settings) = match (&request.chat_id, request.settings.take()) {
        (None, Some(s)) => {
            environments::check_chat_settings(state, workspace_id, &s).await?;
            let s = environments::seal_chat_settings(state, s, &ChatSettings::default())?;
            (Some(s.clone()), s)
        }
        (None, None) => (None, ChatSettings::default()),
        (Some(chat_id), _) => (None, environments::parse_chat_settings(chat_id, stored)?),
    };
    let run = environments::chat_run(state, workspace_id, &settings).await?;
    Ok((new, run))
}

async fn persist_failure(
    state: &AppState,
    chat_id: &str,
    turn_id: &str,
    code: &str,
    message: &str,
) -> Result<(), WorkspaceError> {
    let failed = PersistedMessage {
        id: tokens::random_id(),
        role: Role::Assistant,
        content: vec![ContentBlock::Error {
            code: code.to_owned(),
            message: message.to_owned(),
            termination: None,
            interrupted: false,
        }],
        file_attachments: Vec::new(),
        created_at: state.now_ms(),
        turn_id: Some(turn_id.to_owned()),
    };
    chats::append_message(state.store.pool(), chat_id, &failed).await
}

/// Checks every attachment id: a live file of this workspace, not in another
/// chat's bag.
async fn resolve_attachments(
    state: &AppState,
    workspace_id: &str,
    chat_id: Option<&str>,
    ids: &[String],
) -> Result<Vec<FileRow>, WorkspaceError> {
    let mut out: Vec<FileRow> = Vec::with_capacity(ids.len());
    let mut errors = Vec::new();
    let mut total = 0i64;
    for (i, id) in ids.iter().enumerate() {
        let file = files::get_in(state.store.pool(), id, workspace_id)
            .await?
            .filter(|f| f.chat_id.is_none() || f.chat_id.as_deref() == chat_id);
        match file {
            Some(f) if out.iter().any(|o| o.id == f.id) => {}
            Some(f) => {
                total = total.saturating_add(f.size);
                out.push(f);
            }
            None => errors.push(FieldError::new(
                &format!("attachmentIds[{i}]"),
                "no such file in this chat's bag",
            )),
        }
    }
    if total > MAX_ATTACHMENT_BYTES {
        errors.push(FieldError::new(
            "attachmentIds",
            format!("attachments total more than {MAX_ATTACHMENT_BYTES} bytes"),
        ));
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(WorkspaceError::invalid_fields(errors))
    }
}

/// Where each attachment goes in the sandbox's working directory: under
/// `attachments/`, by its sanitized name (`2-name`, `3-name`... on a clash).
/// The agent fetches each through the workspace API and checks its size and
/// SHA-256 before the setup script runs (docs/protocol.md §3); the bytes
/// never travel in `/env`.
fn attachment_refs(attachments: &[FileRow]) -> Vec<AttachmentRef> {
    let mut placed: Vec<AttachmentRef> = Vec::with_capacity(attachments.len());
    for file in attachments {
        let base = ascii_file_name(&file.path);
        let mut path = format!("{ATTACHMENT_DIR}/{base}");
        let mut n = 1;
        while placed.iter().any(|p| p.path == path) {
            n += 1;
            path = format!("{ATTACHMENT_DIR}/{n}-{base}");
        }
        placed.push(AttachmentRef {
            id: file.id.clone(),
            path,
            size: u64::try_from(file.size).unwrap_or(0),
            sha256: file.sha256.clone(),
            mime_type: file.mime_type.clone(),
        });
    }
    placed
}

/// The message, and the list of attached files' paths for the model.
fn prompt_with_attachments(message: &str, placed: &[AttachmentRef]) -> String {
    if placed.is_empty() {
        return message.to_owned();
    }
    let list: Vec<String> = placed
        .iter()
        .map(|a| format!("- {} ({}, {} bytes)", a.path, a.mime_type, a.size))
        .collect();
    format!(
        "{message}\n\nAttached files, in the working directory:\n{}",
        list.join("\n")
    )
}

/// A chat title: the first line of the first message, at most 80 characters.
fn title_of(message: &str) -> String {
    let first = message.trim().lines().next().unwrap_or("").trim();
    let mut title: String = first.chars().take(80).collect();
    if first.chars().count() > 80 {
        title.push('…');
    }
    if title.is_empty() {
        "New chat".to_owned()
    } else {
        title
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attachments_become_refs_with_distinct_paths() {
        let row = |id: &str, path: &str| FileRow {
            id: id.to_owned(),
            workspace_id: "w".to_owned(),
            run_id: None,
            chat_id: None,
            origin: files::FileOrigin::Upload,
            path: path.to_owned(),
            mime_type: "text/plain".to_owned(),
            size: 3,
            sha256: "ab".repeat(32),
            created_at: 0,
        };
        let refs = attachment_refs(&[
            row("a", "dir/notes.txt"),
            row("b", "notes.txt"),
            row("c", "../we ird;.txt"),
        ]);
        let paths: Vec<_> = refs.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "attachments/notes.txt",
                "attachments/2-notes.txt",
                "attachments/we_ird_.txt"
            ]
        );
        assert_eq!(refs[1].id, "b");
        assert_eq!(
            (refs[1].size, refs[1].sha256.as_str()),
            (3, "ab".repeat(32).as_str())
        );
        let prompt = prompt_with_attachments("read them", &refs);
        assert!(prompt.starts_with("read them\n\nAttached files"));
        assert!(prompt.contains("- attachments/2-notes.txt (text/plain, 3 bytes)"));
        assert_eq!(prompt_with_attachments("x", &[]), "x");
    }

    /// A workspace on SQLite in a temporary folder whose runner nothing
    /// listens for: no test reaches the dispatch.
    async fn unreachable_runner_workspace() -> (tempfile::TempDir, crate::Workspace) {
        let dir = tempfile::tempdir().unwrap();
        let mut config =
            crate::WorkspaceConfig::new(dir.path(), url::Url::parse("http://127.0.0.1/").unwrap());
        config.sandbox_url = Some(url::Url::parse("http://127.0.0.1:9/").unwrap());
        let ws = crate::Workspace::open(config).await.unwrap();
        (dir, ws)
    }

    /// Issue 32, item 4: a turn whose message is stored has finished, even
    /// while its lease waits for its node's release: the next turn takes
    /// the lease instead of a `409 turn_in_flight`. A turn in flight (no
    /// message yet) still holds it.
    #[tokio::test]
    async fn a_finished_turns_lease_does_not_refuse_the_next_turn() {
        let (_dir, ws) = unreachable_runner_workspace().await;
        let state = Arc::clone(&ws.state);
        let pool = state.store.pool();
        let workspace = crate::DEFAULT_WORKSPACE;
        let lease = lease_sql::Lease {
            turn_id: "turn-0",
            until: i64::MAX / 2,
            now_ms: 0,
            first_message_id: "message-0",
        };
        lease_sql::create_leased(pool, "chat-1", workspace, "t", &lease)
            .await
            .unwrap();
        let request = || TurnRequest {
            chat_id: Some("chat-1".to_owned()),
            message: "next".into(),
            ..Default::default()
        };
        let in_flight = start_turn(&state, workspace, request(), None).await;
        assert!(
            matches!(in_flight, Err(WorkspaceError::TurnInFlight { .. })),
            "a turn without its message is in flight"
        );
        let answer = PersistedMessage {
            id: "message-1".to_owned(),
            role: Role::Assistant,
            content: vec![ContentBlock::Text {
                text: "done".to_owned(),
            }],
            file_attachments: Vec::new(),
            created_at: 1,
            turn_id: Some("turn-0".to_owned()),
        };
        chats::append_message(pool, "chat-1", &answer)
            .await
            .unwrap();
        let next = start_turn(&state, workspace, request(), None).await;
        assert!(
            !matches!(next, Err(WorkspaceError::TurnInFlight { .. })),
            "the finished turn's lease was taken over"
        );
        let chat = chats::get(pool, "chat-1", workspace)
            .await
            .unwrap()
            .unwrap();
        assert_ne!(chat.lease_turn_id.as_deref(), Some("turn-0"));
    }

    /// A turn start is one transaction: when any of it fails (here the
    /// run's row, refused by a trigger), the chat keeps no lease, no user
    /// message and no token, and the next turn may start at once.
    #[tokio::test]
    async fn a_turn_that_cannot_be_recorded_leaves_nothing() {
        let (_dir, ws) = unreachable_runner_workspace().await;
        let state = Arc::clone(&ws.state);
        let pool = state.store.pool();
        let workspace = crate::DEFAULT_WORKSPACE;
        let lease = lease_sql::Lease {
            turn_id: "turn-0",
            until: 1,
            now_ms: 0,
            first_message_id: "message-0",
        };
        lease_sql::create_leased(pool, "chat-1", workspace, "t", &lease)
            .await
            .unwrap();
        lease_sql::release_lease(pool, "chat-1", "turn-0", 0)
            .await
            .unwrap();
        sqlx::query(
            "CREATE TRIGGER no_runs BEFORE INSERT ON runs \
             BEGIN SELECT RAISE(ABORT, 'no runs here'); END",
        )
        .execute(pool)
        .await
        .unwrap();
        let request = |chat_id: Option<&str>| TurnRequest {
            chat_id: chat_id.map(str::to_owned),
            message: "hello".into(),
            ..Default::default()
        };
        let failed = start_turn(&state, workspace, request(Some("chat-1")), None).await;
        assert!(failed.is_err(), "the run's row was refused");
        let chat = chats::get(pool, "chat-1", workspace)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(chat.lease_turn_id, None, "no lease left taken");
        assert!(
            chats::recent_messages(pool, "chat-1", 20)
                .await
                .unwrap()
                .is_empty(),
            "no user message kept"
        );
        let count = |table: &'static str| async move {
            let row = sqlx::query(&format!("SELECT COUNT(*) AS n FROM {table}"))
                .fetch_one(pool)
                .await
                .unwrap();
            sqlx::Row::get::<i64, _>(&row, "n")
        };
        assert_eq!(count("tokens").await, 0, "no token minted");
        // A first turn (its chat made in the same transaction) leaves no
        // chat either.
        assert!(
            start_turn(&state, workspace, request(None), None)
                .await
                .is_err()
        );
        assert_eq!(count("chats").await, 1, "no chat left behind");
        // With the trigger gone, the chat takes a turn: its lease is free.
        sqlx::query("DROP TRIGGER no_runs")
            .execute(pool)
            .await
            .unwrap();
        let next = start_turn(&state, workspace, request(Some("chat-1")), None).await;
        assert!(
            !matches!(next, Err(WorkspaceError::TurnInFlight { .. })),
            "the lease was free"
        );
    }

    #[test]
    fn titles() {
        assert_eq!(title_of("  hello\nworld"), "hello");
        assert_eq!(title_of(&"x".repeat(100)).chars().count(), 81);
    }
}
