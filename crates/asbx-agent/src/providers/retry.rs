//! Bounded retries with exponential backoff and jitter for model calls.
//!
//! Retried: 429, 5xx, connection failures and streams cut before the answer
//! was complete. A `Retry-After` (seconds) from the provider replaces the
//! computed delay. Everything is bounded by a number of attempts and a total
//! time budget; when the next wait would overrun the budget the last error is
//! returned instead.

use std::future::Future;
use std::time::{Duration, Instant};

use rand::Rng;

use super::model::ModelError;

/// How model calls are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, including the first.
    pub max_attempts: u32,
    /// Delay before the first retry; doubled each time.
    pub base_delay: Duration,
    /// Largest computed delay.
    pub max_delay: Duration,
    /// Total time a call may spend, retries included.
    pub budget: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(10),
            budget: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1-based), without `Retry-After`.
    pub(crate) fn backoff(&self, retry: u32) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32 << retry.saturating_sub(1).min(16))
            .min(self.max_delay);
        // "Equal jitter": half fixed, half random, so retries never bunch up
        // yet never wait less than half the computed delay.
        let half = exp / 2;
        let jitter_ms = rand::rng().random_range(0..=half.as_millis().max(1) as u64);
        half + Duration::from_millis(jitter_ms)
    }

    /// Runs `attempt` until it succeeds, fails for good, or the bounds are hit.
    pub(crate) async fn run<T, F, Fut>(&self, mut attempt: F) -> Result<T, ModelError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ModelError>>,
    {
        let start = Instant::now();
        let mut tries = 0u32;
        loop {
            tries += 1;
            let err = match attempt().await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if !err.is_retryable() || tries >= self.max_attempts {
                return Err(err);
            }
            let wait = match &err {
                ModelError::Status {
                    retry_after: Some(ra),
                    ..
                } => *ra,
                _ => self.backoff(tries),
            };
            if start.elapsed() + wait > self.budget {
                return Err(err);
            }
            tracing::warn!("model call failed ({err}); retry {tries} in {wait:?}");
            tokio::time::sleep(wait).await;
        }
    }
}

/// Parses a `Retry-After` header given in seconds (HTTP dates are ignored).
pub(crate) fn parse_retry_after(value: Option<&http::HeaderValue>) -> Option<Duration> {
    let s = value?.to_str().ok()?.trim();
    let secs: f64 = s.parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(3600.0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy::default();
        for retry in 1..10 {
            let d = p.backoff(retry);
            assert!(d <= p.max_delay, "{d:?}");
        }
        assert!(p.backoff(1) >= Duration::from_millis(250));
    }

    #[test]
    fn retry_after_seconds() {
        let v = http::HeaderValue::from_static("2");
        assert_eq!(parse_retry_after(Some(&v)), Some(Duration::from_secs(2)));
        let v = http::HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT");
        assert_eq!(parse_retry_after(Some(&v)), None);
    }

    #[tokio::test]
    async fn stops_after_max_attempts_and_not_on_permanent_errors() {
        let p = RetryPolicy {
            base_delay: Duration::from_millis(1),
            ..RetryPolicy::default()
        };
        let n = AtomicU32::new(0);
        let r: Result<(), _> = p
            .run(|| async {
                n.fetch_add(1, Ordering::SeqCst);
                Err(ModelError::Connect("x".into()))
            })
            .await;
        assert!(r.is_err());
        assert_eq!(n.load(Ordering::SeqCst), 4);
        n.store(0, Ordering::SeqCst);
        let r: Result<(), _> = p
            .run(|| async {
                n.fetch_add(1, Ordering::SeqCst);
                Err(ModelError::Provider("bad request".into()))
            })
            .await;
        assert!(r.is_err());
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }
}
