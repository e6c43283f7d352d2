//! A workspace's quotas and usage, as `GET /api/usage` (`crate::usage`)
//! and `asbx quota show` answer them.

use crate::AppState;
use crate::error::WorkspaceError;
use crate::quota::{Quota, store};
use crate::wire::Usage;

/// The quotas and usage of `workspace_id`, its requests counted for
/// `subject`.
pub(crate) async fn of(
    state: &AppState,
    workspace_id: &str,
    subject: &str,
) -> Result<Usage, WorkspaceError> {
    let pool = state.store.pool();
    let now = state.now_ms();
    let limits = store::limits(pool, &state.config.quotas, workspace_id).await?;
    #[expect(clippy::cast_precision_loss, reason = "usage figures, far below 2^53")]
    let used = [
        (
            Quota::ConcurrentSandboxes,
            store::running(pool, workspace_id).await? as f64,
        ),
        (
            Quota::RequestsPerMinute,
            store::hits(pool, subject, now).await? as f64,
        ),
        (
            Quota::SandboxSecondsPerDay,
            (store::sandbox_ms_today(pool, workspace_id, now).await? / 1000) as f64,
        ),
        (
            Quota::TokensPerDay,
            store::tokens_today(pool, workspace_id, now).await? as f64,
        ),
        (
            Quota::StorageMb,
            store::storage_bytes(pool, workspace_id).await? as f64 / (1024.0 * 1024.0),
        ),
    ];
    Ok(Usage {
        quotas: Quota::ALL
            .iter()
            .map(|q| (q.name().to_owned(), limits.get(*q)))
            .collect(),
        used: used
            .into_iter()
            .map(|(q, v)| (q.name().to_owned(), v))
            .collect(),
    })
}
