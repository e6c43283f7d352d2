//! Quotas per workspace (CONTRACT.md §10): `concurrent-sandboxes`,
//! `requests-per-minute` (per API key or browser session),
//! `sandbox-seconds-per-day`, `tokens-per-day` (model input + output) and
//! `storage-mb` (the file bag, the stored run lines, and the distinct
//! blobs of the chats' restorable working directories).
//!
//! Each has a server default ([`QuotaDefaults`], `ASBX_QUOTA_*`) and a
//! per-workspace override in `workspace_quotas` (`asbx quota set`). Usage
//! is read from the rows themselves (running runs, today's runs, files,
//! run lines), never from a counter a node keeps, so every node sees the
//! same figure; a dispatch is admitted in the transaction that records it,
//! after locking its workspace's row (`store::lock_workspace`), so two
//! nodes can't both take the last slot. Requests are counted by one
//! conditional upsert per request (`store::hit`).
//!
//! A refusal is `429 quota_exceeded` naming the quota
//! ([`WorkspaceError::QuotaExceeded`]), with `Retry-After` when waiting
//! helps; each goes through [`refused`].

pub(crate) mod admit;
pub(crate) mod enforce;
pub(crate) mod fair;
pub(crate) mod notice;
pub(crate) mod report;
pub(crate) mod store;

pub(crate) use crate::config::{Quota, QuotaDefaults};
use crate::error::WorkspaceError;

/// A workspace's limits: the defaults with its overrides applied.
pub(crate) type Limits = QuotaDefaults;

/// One UTC day in milliseconds: the window of the `-per-day` quotas.
pub(crate) const DAY_MS: i64 = 86_400_000;

/// The start of `now_ms`'s UTC day.
pub(crate) fn day_start(now_ms: i64) -> i64 {
    now_ms - now_ms.rem_euclid(DAY_MS)
}

/// Seconds from `now_ms` to the next UTC midnight (at least 1).
pub(crate) fn until_tomorrow_s(now_ms: i64) -> u64 {
    let left = day_start(now_ms) + DAY_MS - now_ms;
    u64::try_from((left + 999) / 1000).unwrap_or(1).max(1)
}

/// A refusal for `quota` over `limit`, for `workspace_id`: the one place
/// every refusal passes (the answer carries it to the audit log:
/// `audit::record_quota_refusals`).
pub(crate) fn refused(
    workspace_id: &str,
    quota: Quota,
    limit: u64,
    retry_after_s: Option<u64>,
) -> WorkspaceError {
    tracing::info!(
        workspace = workspace_id,
        quota = quota.name(),
        limit,
        "quota refused a request"
    );
    crate::metrics::METRICS.quota_refused(quota.name());
    WorkspaceError::QuotaExceeded {
        workspace: workspace_id.to_owned(),
        quota: quota.name(),
        limit,
        retry_after_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_days_are_utc() {
        for q in Quota::ALL {
            assert_eq!(q.name().parse::<Quota>(), Ok(q));
        }
        assert!("cpu".parse::<Quota>().is_err());
        let noon = 3 * DAY_MS + DAY_MS / 2;
        assert_eq!(day_start(noon), 3 * DAY_MS);
        assert_eq!(until_tomorrow_s(noon), 43_200);
        assert_eq!(until_tomorrow_s(4 * DAY_MS - 1), 1);
    }
}
