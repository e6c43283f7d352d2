//! Where quotas are checked: a dispatch (in the transaction recording it),
//! a request (per API key or browser session), an upload.

use crate::AppState;
use crate::error::WorkspaceError;
use crate::quota::{self, Limits, Quota, store};

/// How long a caller refused `concurrent-sandboxes` is told to wait.
const SANDBOX_RETRY_S: u64 = 5;

const MIB: i64 = 1024 * 1024;

fn limit_i64(limit: u64) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// Admits one more sandbox for `workspace_id` on `conn`, inside the
/// transaction that records its run: the workspace's row is locked first,
/// so every node counts the same running runs and none admits past a
/// limit. `concurrent-sandboxes`, `sandbox-seconds-per-day` and
/// `tokens-per-day` must have room, and `storage-mb` not be used up (a
/// run stores its lines).
///
/// `limits` come from [`limits`], read before the transaction began: on
/// SQLite a transaction that reads before it writes can't wait for the
/// write lock (`SQLITE_BUSY`), and a second connection taken while one is
/// held could wait for the pool.
///
/// With the fleet's `capacity` and no `concurrent-sandboxes` limit, the
/// workspace's fair share ([`quota::fair`]) holds instead; over it, the
/// refusal is one [`is_share_full`] tells apart, which [`ShareWait`]'s
/// callers wait out.
pub(crate) async fn dispatch(
    conn: &mut sqlx::AnyConnection,
    limits: &Limits,
    workspace_id: &str,
    now_ms: i64,
    capacity: Option<u64>,
) -> Result<(), WorkspaceError> {
    let share = fair_capacity(limits, capacity);
    let sandbox_limited = [
        Quota::ConcurrentSandboxes,
        Quota::SandboxSecondsPerDay,
        Quota::TokensPerDay,
        Quota::StorageMb,
    ]
    .into_iter()
    .any(|q| limits.get(q).is_some());
    if !sandbox_limited && share.is_none() {
        return Ok(());
    }
    store::lock_workspace(conn, workspace_id).await?;
    if let Some(capacity) = share {
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let mine = count(store::running(&mut *conn, workspace_id).await?);
        let total = count(store::running_total(&mut *conn).await?);
        if !quota::fair::may_start(mine, total, capacity) {
            return Err(share_full(workspace_id, capacity));
        }
    }
    if let Some(limit) = limits.get(Quota::ConcurrentSandboxes)
        && store::running(&mut *conn, workspace_id).await? >= limit_i64(limit)
    {
        return Err(quota::refused(
            workspace_id,
            Quota::ConcurrentSandboxes,
            limit,
            Some(SANDBOX_RETRY_S),
        ));
    }
    if let Some(limit) = limits.get(Quota::SandboxSecondsPerDay)
        && store::sandbox_ms_today(&mut *conn, workspace_id, now_ms).await?
            >= limit_i64(limit).saturating_mul(1000)
    {
        return Err(tomorrow(
            workspace_id,
            Quota::SandboxSecondsPerDay,
            limit,
            now_ms,
        ));
    }
    if let Some(limit) = limits.get(Quota::TokensPerDay)
        && store::tokens_today(&mut *conn, workspace_id, now_ms).await? >= limit_i64(limit)
    {
        return Err(tomorrow(workspace_id, Quota::TokensPerDay, limit, now_ms));
    }
    storage(&mut *conn, limits, workspace_id, 0).await
}

/// The fleet's capacity when the fair share holds: known, and no
/// `concurrent-sandboxes` limit (which replaces the share).
fn fair_capacity(limits: &Limits, capacity: Option<u64>) -> Option<u64> {
    capacity.filter(|_| limits.get(Quota::ConcurrentSandboxes).is_none())
}

/// Over the fair share of a fleet of `capacity`: a refusal that waiting
/// helps, not counted as one until the wait is over ([`ShareWait`]).
fn share_full(workspace_id: &str, capacity: u64) -> WorkspaceError {
    WorkspaceError::QuotaExceeded {
        workspace: workspace_id.to_owned(),
        quota: Quota::ConcurrentSandboxes.name(),
        limit: quota::fair::share(capacity),
        retry_after_s: Some(SANDBOX_RETRY_S),
    }
}

/// Whether [`dispatch`] refused `e` for the fair share.
pub(crate) fn is_share_full(e: &WorkspaceError) -> bool {
    matches!(e, WorkspaceError::QuotaExceeded { quota, .. } if *quota == Quota::ConcurrentSandboxes.name())
}

/// A dispatch waiting for its fair share of the fleet ([`quota::fair`]):
/// [`ShareWait::turn`] before each try of the transaction that records it,
/// at most the server's queue wait in all.
pub(crate) struct ShareWait<'s> {
    state: &'s AppState,
    workspace_id: &'s str,
    /// `None`: the share does not hold, nothing to wait for.
    capacity: Option<u64>,
    deadline: tokio::time::Instant,
    ticket: Option<quota::fair::Ticket<'s>>,
    /// Told once, when it starts to wait ([`quota::notice`]).
    notify: quota::notice::Notify,
    /// No try of the transaction yet.
    first: bool,
}

impl<'s> ShareWait<'s> {
    pub(crate) fn new(
        state: &'s AppState,
        limits: &Limits,
        workspace_id: &'s str,
        capacity: Option<u64>,
    ) -> Self {
        ShareWait {
            state,
            workspace_id,
            capacity: fair_capacity(limits, capacity),
            deadline: tokio::time::Instant::now() + state.config.queue_wait,
            ticket: None,
            notify: None,
            first: true,
        }
    }

    /// Tells `notify` when the dispatch starts to wait.
    pub(crate) fn notify(mut self, notify: quota::notice::Notify) -> Self {
        self.notify = notify;
        self
    }

    /// Whether `e` (from [`dispatch`]) means: wait and try again.
    pub(crate) fn retry(&self, e: &WorkspaceError) -> bool {
        self.capacity.is_some() && is_share_full(e)
    }

    /// Waits until one more sandbox looks likely to fit the workspace's
    /// share (the transaction checks it for sure), and it is this
    /// workspace's turn: a dispatch that could start still queues behind
    /// waiters of other workspaces, so they are served in turn. Past the
    /// deadline: `429 quota_exceeded` (`concurrent-sandboxes`).
    pub(crate) async fn turn(&mut self) -> Result<(), WorkspaceError> {
        let Some(capacity) = self.capacity else {
            return Ok(());
        };
        let queue = &self.state.dispatcher.fair;
        if std::mem::take(&mut self.first) && !queue.others_waiting(self.workspace_id) {
            // Nobody queued ahead: the transaction's own count decides
            // (two statements fewer on a dispatch that fits); counted
            // here from its first refusal on.
            return Ok(());
        }
        loop {
            let pool = self.state.store.pool();
            let count = |n: i64| u64::try_from(n).unwrap_or(0);
            let mine = count(store::running(pool, self.workspace_id).await?);
            let total = count(store::running_total(pool).await?);
            let my_turn = self.ticket.is_some() || !queue.others_waiting(self.workspace_id);
            if my_turn && quota::fair::may_start(mine, total, capacity) {
                return Ok(());
            }
            let left = self
                .deadline
                .saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(quota::refused(
                    self.workspace_id,
                    Quota::ConcurrentSandboxes,
                    quota::fair::share(capacity),
                    Some(SANDBOX_RETRY_S),
                ));
            }
            if let Some(tell) = self.notify.take() {
                let _ = tell.send(quota::notice::Queued {
                    quota: Quota::ConcurrentSandboxes.name(),
                    wait_s: left.as_secs_f64().ceil() as u64,
                });
            }
            let ticket = self
                .ticket
                .get_or_insert_with(|| queue.join(self.workspace_id));
            if ticket.wait(left.min(quota::fair::RECHECK)).await {
                // Spent: its turn came. Look again, and queue anew if need be.
                self.ticket = None;
            }
        }
    }
}

/// A workspace's limits: the server's defaults with its overrides.
pub(crate) async fn limits(state: &AppState, workspace_id: &str) -> Result<Limits, WorkspaceError> {
    store::limits(state.store.pool(), &state.config.quotas, workspace_id).await
}

fn tomorrow(workspace_id: &str, q: Quota, limit: u64, now_ms: i64) -> WorkspaceError {
    quota::refused(
        workspace_id,
        q,
        limit,
        Some(quota::until_tomorrow_s(now_ms)),
    )
}

/// Refuses when the workspace's stored bytes plus `adding` would pass
/// `storage-mb` (nothing stored is ever refused afterwards: a run keeps
/// its lines). With `adding` 0: refuses when it is already used up.
pub(crate) async fn storage(
    conn: &mut sqlx::AnyConnection,
    limits: &Limits,
    workspace_id: &str,
    adding: u64,
) -> Result<(), WorkspaceError> {
    let Some(limit) = limits.get(Quota::StorageMb) else {
        return Ok(());
    };
    let used = store::storage_bytes(&mut *conn, workspace_id).await?;
    let max = limit_i64(limit).saturating_mul(MIB);
    let full = if adding == 0 {
        used >= max
    } else {
        used.saturating_add(limit_i64(adding)) > max
    };
    if full {
        // Waiting does not help: something must be deleted.
        return Err(quota::refused(workspace_id, Quota::StorageMb, limit, None));
    }
    Ok(())
}

/// Begins the transaction that stores an upload of `size` bytes to the
/// workspace's file bag, refused unless `storage-mb` has room for it: the
/// workspace's row stays locked until the caller's insert commits, so two
/// uploads can't both take the last room.
pub(crate) async fn begin_upload(
    state: &AppState,
    workspace_id: &str,
    size: i64,
) -> Result<crate::store::WriteTx, WorkspaceError> {
    let limits = limits(state, workspace_id).await?;
    let mut tx = crate::store::begin_write(state.store.pool()).await?;
    if limits.get(Quota::StorageMb).is_some() {
        store::lock_workspace(&mut tx, workspace_id).await?;
        let size = u64::try_from(size).unwrap_or(0);
        storage(&mut tx, &limits, workspace_id, size).await?;
    }
    Ok(tx)
}

/// The subject `requests-per-minute` counts for a caller: the hash of its
/// API key or browser session, or its workspace when anonymous.
pub(crate) fn subject(credential_hash: Option<&str>, workspace_id: &str) -> String {
    match credential_hash {
        Some(h) => h.to_owned(),
        None => format!("anon:{workspace_id}"),
    }
}

/// Counts one request of `subject` against its workspace's
/// `requests-per-minute`; refused (with `Retry-After` to the next minute)
/// once the minute's are spent.
pub(crate) async fn request(
    state: &AppState,
    subject: &str,
    workspace_id: &str,
) -> Result<(), WorkspaceError> {
    let pool = state.store.pool();
    let limit = match state.config.quotas.get(Quota::RequestsPerMinute) {
        // No default: a workspace without an override is unlimited, and
        // most are; look the override up only then.
        None => match store::overrides(pool, workspace_id)
            .await?
            .into_iter()
            .find(|(q, _)| *q == Quota::RequestsPerMinute)
        {
            Some((_, v)) => v,
            None => None,
        },
        Some(_) => store::limits(pool, &state.config.quotas, workspace_id)
            .await?
            .get(Quota::RequestsPerMinute),
    };
    let Some(limit) = limit else {
        return Ok(());
    };
    let now = state.now_ms();
    if limit == 0 || !store::hit(pool, subject, now, limit).await? {
        let left = store::MINUTE_MS - now.rem_euclid(store::MINUTE_MS);
        let retry = u64::try_from((left + 999) / 1000).unwrap_or(1).max(1);
        return Err(quota::refused(
            workspace_id,
            Quota::RequestsPerMinute,
            limit,
            Some(retry),
        ));
    }
    Ok(())
}
