//! The audit log (CONTRACT §10, docs/api-audit.md): one hash chain of
//! records per workspace.
//!
//! - [`chain`]: the canonical form, a record's hash, checking one record.
//! - [`store`]: appending a batch under the chain head's lock, pages,
//!   pruning behind an anchor.
//! - [`api`]: `GET /api/audit`, `GET /api/runs/{id}/audit`, and the
//!   runner's report `POST /api/audit/runner/{sessionId}`.
//!
//! Who writes: the workspace itself (callback redemptions, files through
//! its API, API keys, tool calls from a run's `step` lines, quota
//! refusals), and the runner for what only it sees (egress, model calls),
//! with a token the sandbox never holds.
//!
//! Architecture invariant: no secret value, token or file content is ever
//! in a record ([`AuditEvent`] has no field that could hold one), and a
//! record is only ever appended through [`store::append`] or, inside the
//! transaction of what it records (a callback's redemption, a chat turn's
//! end), [`store::append_in`].

pub(crate) mod api;
pub(crate) mod chain;
pub(crate) mod runner;
pub(crate) mod store;
pub(crate) mod tools;

use std::time::Duration;

pub use asbx_protocol::audit::AuditEvent;
use sqlx::AnyPool;

use crate::AppState;
use crate::error::QuotaRefusal;
use crate::error::WorkspaceError;
pub(crate) use store::Pending;

/// How often a node prunes records past the retention.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Where an event happened besides its workspace.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scope<'a> {
    pub(crate) run_id: Option<&'a str>,
    pub(crate) session_id: Option<&'a str>,
}

impl Scope<'_> {
    /// A run's scope.
    pub(crate) fn run(run_id: &str) -> Scope<'_> {
        Scope {
            run_id: Some(run_id),
            session_id: None,
        }
    }

    /// `events` of `workspace` in this scope, stamped `ts`, to append.
    pub(crate) fn pending(
        &self,
        workspace: &str,
        ts: i64,
        events: Vec<AuditEvent>,
    ) -> Vec<Pending> {
        events
            .into_iter()
            .map(|event| Pending {
                workspace: workspace.to_owned(),
                run_id: self.run_id.map(str::to_owned),
                session_id: self.session_id.map(str::to_owned),
                ts,
                event,
            })
            .collect()
    }
}

/// Appends events the workspace itself saw, now. A failure is logged, not
/// returned: the request it describes already happened.
pub(crate) async fn record(
    state: &AppState,
    workspace: &str,
    scope: Scope<'_>,
    events: Vec<AuditEvent>,
) {
    let pending = scope.pending(workspace, state.now_ms(), events);
    if let Err(e) = store::append(state.store.pool(), workspace, &pending).await {
        tracing::warn!(error = %e, workspace, "appending to the audit log failed");
    }
}

/// Appends events of the run `run_id` (its workspace looked up), now.
pub(crate) async fn record_for_run(state: &AppState, run_id: &str, events: Vec<AuditEvent>) {
    match store::run_workspace(state.store.pool(), run_id).await {
        Ok(Some(workspace)) => record(state, &workspace, Scope::run(run_id), events).await,
        Ok(None) => tracing::warn!(run_id, "audit: no such run"),
        Err(e) => tracing::warn!(error = %e, run_id, "audit: reading the run failed"),
    }
}

/// A callback redeemed for `run_id` at `route`, appended in the
/// redemption's own write transaction `tx` (the run's `workspace` read
/// there): a redemption commits with its record or not at all.
pub(crate) async fn callback(
    tx: &mut sqlx::AnyConnection,
    now_ms: i64,
    workspace: &str,
    run_id: &str,
    route: &str,
) -> Result<(), WorkspaceError> {
    let event = AuditEvent::Callback {
        route: route.to_owned(),
    };
    let pending = Scope::run(run_id).pending(workspace, now_ms, vec![event]);
    store::append_in(tx, workspace, &pending).await
}

/// A file of the bag: its workspace, run, path and size (never its bytes).
pub(crate) struct FileSeen<'a> {
    pub(crate) workspace: &'a str,
    pub(crate) run_id: Option<&'a str>,
    pub(crate) path: &'a str,
    pub(crate) size: i64,
}

/// A file of the bag written or read (`via`: `sandbox`, `upload`,
/// `download`), its path and size only.
pub(crate) async fn file(state: &AppState, file: FileSeen<'_>, write: bool, via: &str) {
    let (path, size, via) = (
        file.path.to_owned(),
        u64::try_from(file.size).unwrap_or(0),
        via.to_owned(),
    );
    let event = if write {
        AuditEvent::FileWrite { path, size, via }
    } else {
        AuditEvent::FileRead { path, size, via }
    };
    let scope = Scope {
        run_id: file.run_id,
        session_id: None,
    };
    record(state, file.workspace, scope, vec![event]).await;
}

/// A quota refusal: the workspace answered `429` for `quota`.
pub(crate) async fn quota_refused(state: &AppState, workspace: &str, quota: &str) {
    let event = AuditEvent::QuotaRefused {
        quota: quota.to_owned(),
    };
    record(state, workspace, Scope::default(), vec![event]).await;
}

/// Records each quota refusal an answer carries ([`QuotaRefusal`], put
/// there by the error's answer), after the answer: the refused caller
/// never waits on the log.
pub(crate) async fn record_quota_refusals(
    axum::extract::State(state): axum::extract::State<std::sync::Arc<AppState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let response = next.run(request).await;
    if let Some(r) = response.extensions().get::<QuotaRefusal>().cloned() {
        tokio::spawn(async move { quota_refused(&state, &r.workspace, r.quota).await });
    }
    response
}

/// The outcome of checking one workspace's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditVerdict {
    pub workspace: String,
    /// Records checked (up to the first broken one).
    pub records: u64,
    /// The first broken record's id and why, if any.
    pub broken: Option<(i64, String)>,
}

/// Checks `workspace`'s chain from its anchor to its head.
pub(crate) async fn verify(
    pool: &AnyPool,
    workspace: &str,
) -> Result<AuditVerdict, WorkspaceError> {
    let head = store::head(pool, workspace).await?;
    let (last_id, last_hash, anchor_id, anchor_hash) =
        head.clone().unwrap_or((0, String::new(), 0, String::new()));
    let mut verdict = AuditVerdict {
        workspace: workspace.to_owned(),
        records: 0,
        broken: None,
    };
    let mut prev = anchor_hash;
    let mut after = anchor_id;
    // Page by page, the next one read while this one is hashed.
    let mut next = Some(read_page(pool, workspace, anchor_id));
    while let Some(reading) = next.take() {
        let page = reading
            .await
            .map_err(|e| WorkspaceError::Corrupt(format!("reading the audit records: {e}")))??;
        let Some(&(last, _)) = page.last() else {
            break;
        };
        if page.len() == VERIFY_PAGE {
            next = Some(read_page(pool, workspace, last));
        }
        for (id, text) in &page {
            match chain::check(text, *id, workspace, &prev) {
                Ok(hash) => prev = hash,
                Err(why) => {
                    verdict.broken = Some((*id, why.to_string()));
                    return Ok(verdict);
                }
            }
            verdict.records += 1;
        }
        after = last;
    }
    if head.is_none() && verdict.records > 0 || after != last_id.max(anchor_id) || prev != last_hash
    {
        verdict.broken = Some((after, chain::Broken::Head.to_string()));
    }
    Ok(verdict)
}

/// Records read per query while verifying.
const VERIFY_PAGE: usize = 10_000;

/// Reads `workspace`'s page of records after `after` on a task of its own.
fn read_page(
    pool: &AnyPool,
    workspace: &str,
    after: i64,
) -> tokio::task::JoinHandle<Result<Vec<(i64, String)>, WorkspaceError>> {
    let (pool, workspace) = (pool.clone(), workspace.to_owned());
    tokio::spawn(async move {
        let limit = i64::try_from(VERIFY_PAGE).unwrap_or(i64::MAX);
        store::page(&pool, &workspace, None, after, limit).await
    })
}

/// Checks every chain (or `only`'s).
pub(crate) async fn verify_all(
    pool: &AnyPool,
    only: Option<&str>,
) -> Result<Vec<AuditVerdict>, WorkspaceError> {
    let workspaces = match only {
        Some(w) => vec![w.to_owned()],
        None => store::workspaces(pool).await?,
    };
    let mut out = Vec::with_capacity(workspaces.len());
    for w in workspaces {
        out.push(verify(pool, &w).await?);
    }
    Ok(out)
}

/// Drops every workspace's records older than `retention`, keeping each
/// chain verifiable from its anchor; how many went.
pub(crate) async fn prune(state: &AppState, retention: Duration) -> Result<u64, WorkspaceError> {
    let before = state
        .now_ms()
        .saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
    let mut gone = 0;
    for w in store::workspaces(state.store.pool()).await? {
        gone += store::prune(state.store.pool(), &w, before).await?;
    }
    Ok(gone)
}

/// With a retention set, prunes at start and hourly.
pub(crate) fn start_pruner(state: &std::sync::Arc<AppState>) {
    let Some(retention) = state.config.audit_retention else {
        return;
    };
    let weak = std::sync::Arc::downgrade(state);
    tokio::spawn(async move {
        loop {
            let Some(state) = weak.upgrade() else {
                return;
            };
            match prune(&state, retention).await {
                Ok(0) => {}
                Ok(gone) => tracing::info!(gone, "pruned audit records past the retention"),
                Err(e) => tracing::warn!(error = %e, "pruning the audit log failed"),
            }
            drop(state);
            tokio::time::sleep(PRUNE_EVERY).await;
        }
    });
}
