//! Re-attaching to a runner's session (docs/protocol.md §9): the one way a
//! node gets back a session's lines after the stream it read broke (a
//! dropped connection, a restarted proxy) or after it took a dead node's
//! run or turn over (`chats::lease::takeover`, `runs::takeover`).
//!
//! Every dispatch has a detach grace (`WorkspaceConfig::runner_detach_grace`):
//! the sandbox goes on without a reader for that long, and its lines wait
//! in the runner's resume log. So a broken stream is not the end: the
//! reader asks `GET /v1/sessions/{id}/events?after=<last seq read>` again,
//! backing off ([`Backoff`]) for as long as its patience lasts, and reads on
//! from there: no gap, no line twice. Only a runner that is gone ends the
//! run `runner_lost` ([`judge`]): it says it does not know the session
//! (`404`) or no longer has the lines after the cursor (`410`), or it can't
//! be reached (refused, timed out, another answer) until the patience is
//! over.

use std::time::Duration;

use crate::AppState;
use crate::runs::runner_http;

/// The first wait between two tries.
const FIRST_WAIT: Duration = Duration::from_millis(100);
/// The longest wait between two tries.
const MAX_WAIT: Duration = Duration::from_secs(2);
/// How long one try waits for the runner's answer (its head, not its body).
const TRY_TIMEOUT: Duration = Duration::from_secs(10);

/// Waits that double from [`FIRST_WAIT`] up to [`MAX_WAIT`].
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(FIRST_WAIT, MAX_WAIT)
    }
}

impl Backoff {
    pub(crate) fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { next: first, max }
    }

    /// The next wait; each is twice the last, up to the maximum.
    pub(crate) fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }
}

/// What one try at re-attaching found.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// `200`: the session's lines after the cursor, then its live tail.
    Attached(reqwest::Response),
    /// `404` or `410`: the runner no longer has the session, or no longer
    /// the lines after the cursor.
    Unknown(String),
    /// Nothing listens where the runner was (connection refused).
    Refused,
    /// Anything else: a timeout, a reset, another status. The runner may be
    /// alive behind a blip.
    Failed(String),
}

impl Attempt {
    /// Why a try did not attach, for the log.
    fn why(&self) -> &str {
        match self {
            Attempt::Attached(_) => "attached",
            Attempt::Unknown(why) | Attempt::Failed(why) => why,
            Attempt::Refused => "connection refused",
        }
    }
}

/// What to do after a try that did not attach.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Try again after this wait.
    Retry(Duration),
    /// The runner is gone, or no longer has the session: the run is lost.
    Gone,
}

/// The runner-gone decision: a runner that says it does not have the
/// session is gone at once; one that can't be reached is given until
/// `patience` is over (`waited` so far), with the backoff's waits between
/// tries (never past the patience).
pub(crate) fn judge(
    attempt: &Attempt,
    waited: Duration,
    patience: Duration,
    backoff: &mut Backoff,
) -> Verdict {
    match attempt {
        Attempt::Unknown(_) => Verdict::Gone,
        Attempt::Attached(_) | Attempt::Refused | Attempt::Failed(_) => {
            let Some(left) = patience.checked_sub(waited).filter(|l| !l.is_zero()) else {
                return Verdict::Gone;
            };
            Verdict::Retry(backoff.next_wait().min(left))
        }
    }
}

/// One try: `GET {sandbox_url}/v1/sessions/{id}/events?after={after}`.
async fn attempt(state: &AppState, sandbox_url: &str, session_id: &str, after: u64) -> Attempt {
    let path = ["v1", "sessions", session_id, "events"];
    let request =
        match runner_http::runner_stream_request(state, reqwest::Method::GET, sandbox_url, &path) {
            Ok(r) => r
                .header(http::header::ACCEPT, "application/x-ndjson")
                .query(&[("after", after)]),
            // A URL no longer allowed gets no request: nobody can re-attach.
            Err(e) => return Attempt::Unknown(e.to_string()),
        };
    match tokio::time::timeout(TRY_TIMEOUT, request.send()).await {
        Ok(Ok(r)) if r.status().is_success() => Attempt::Attached(r),
        Ok(Ok(r)) if refuses_for_good(r.status()) => {
            Attempt::Unknown(format!("the runner answered {}", r.status()))
        }
        Ok(Ok(r)) => Attempt::Failed(format!("the runner answered {}", r.status())),
        Ok(Err(e)) if e.is_connect() => Attempt::Refused,
        Ok(Err(e)) => Attempt::Failed(crate::error::error_chain(&e)),
        Err(_) => Attempt::Failed("no answer in time".to_owned()),
    }
}

/// Whether a runner's answer to a re-attach says no try will do better:
/// `404` and `410` (no such session, or its lines are gone), a redirect
/// (never followed), and any other client error but those a wait may
/// clear (`408`, `409` while the runner still holds the broken reader,
/// `425`, `429`).
fn refuses_for_good(status: reqwest::StatusCode) -> bool {
    use reqwest::StatusCode as S;
    status.is_redirection()
        || (status.is_client_error()
            && ![
                S::REQUEST_TIMEOUT,
                S::CONFLICT,
                S::TOO_EARLY,
                S::TOO_MANY_REQUESTS,
            ]
            .contains(&status))
}

/// Re-attaches to `session_id` on the runner at `sandbox_url` after `after`,
/// trying until the runner answers with the stream, says it is gone, or
/// `patience` is over ([`judge`]). `None`: the session is lost.
pub(crate) async fn reattach(
    state: &AppState,
    sandbox_url: &str,
    session_id: &str,
    after: u64,
    patience: Duration,
) -> Option<reqwest::Response> {
    let start = tokio::time::Instant::now();
    let mut backoff = Backoff::default();
    let mut tries = 0u32;
    loop {
        tries += 1;
        let got = attempt(state, sandbox_url, session_id, after).await;
        let got = match got {
            Attempt::Attached(r) => {
                crate::metrics::METRICS.reattached();
                tracing::info!(
                    session = session_id,
                    after,
                    tries,
                    "re-attached to the runner's session"
                );
                return Some(r);
            }
            other => other,
        };
        match judge(&got, start.elapsed(), patience, &mut backoff) {
            Verdict::Retry(wait) => {
                tracing::debug!(
                    session = session_id,
                    after,
                    why = got.why(),
                    "re-attaching failed; will retry"
                );
                tokio::time::sleep(wait).await;
            }
            Verdict::Gone => {
                tracing::warn!(
                    session = session_id,
                    after,
                    tries,
                    why = got.why(),
                    "the session's runner is gone"
                );
                return None;
            }
        }
    }
}

/// The answer to a dispatch whose connection broke after it was sent: the
/// session's stream from its start when the runner has it, else the
/// dispatch sent again (a runner that does not know the session never
/// started it, so its tokens are unredeemed); a `409 session_exists` to
/// that means an earlier try did start it: re-attached. Bounded by the
/// detach grace. `None`: the runner can't be reached.
pub(crate) async fn resend(
    state: &AppState,
    runner: &url::Url,
    request: &asbx_protocol::DispatchRequest,
    audit_token: &str,
) -> Option<reqwest::Response> {
    let session_id = request.session_id.as_deref()?;
    let patience = state.config.runner_detach_grace;
    let deadline = tokio::time::Instant::now() + patience;
    let mut backoff = Backoff::default();
    while tokio::time::Instant::now() < deadline {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if let Some(r) = reattach(state, runner.as_str(), session_id, 0, left).await {
            return Some(r);
        }
        match runner_http::post_request(state, runner, request, audit_token)
            .ok()?
            .send()
            .await
        {
            Ok(r) if r.status() != reqwest::StatusCode::CONFLICT => return Some(r),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(session = session_id, error = %crate::error::error_chain(&e), "sending the dispatch again failed");
            }
        }
        tokio::time::sleep(backoff.next_wait()).await;
    }
    None
}

/// The runner a run was sent to: its stored URL, else the operator's.
pub(crate) fn runner_of<'a>(state: &'a AppState, stored: Option<&'a str>) -> Option<&'a str> {
    stored.or(state.config.sandbox_url.as_ref().map(url::Url::as_str))
}

/// Re-attaches the stream of a run (or chat turn) this node reads and that
/// broke before the session's end, after the last line read (`after`),
/// within the detach grace: the sandbox waits that long for a reader.
pub(crate) async fn resume(
    state: &AppState,
    run_id: &str,
    after: u64,
) -> Option<reqwest::Response> {
    let stored = match crate::runs::store::get(state.store.pool(), run_id).await {
        Ok(run) => run.and_then(|r| r.sandbox_url),
        Err(e) => {
            tracing::warn!(run = run_id, error = %crate::error::error_chain(&e), "cannot read the run's runner");
            None
        }
    };
    let url = runner_of(state, stored.as_deref())?.to_owned();
    tracing::info!(
        run = run_id,
        after,
        "the runner's stream broke; re-attaching"
    );
    reattach(state, &url, run_id, after, state.config.runner_detach_grace).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_waits_double_up_to_the_maximum() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(700));
        let waits: Vec<u128> = (0..6).map(|_| b.next_wait().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 700, 700, 700]);
    }

    #[test]
    fn only_answers_a_wait_may_change_are_retried() {
        use reqwest::StatusCode as S;
        for gone in [
            S::NOT_FOUND,
            S::GONE,
            S::BAD_REQUEST,
            S::UNAUTHORIZED,
            S::FOUND,
        ] {
            assert!(refuses_for_good(gone), "{gone}");
        }
        for blip in [
            S::CONFLICT,
            S::TOO_MANY_REQUESTS,
            S::REQUEST_TIMEOUT,
            S::BAD_GATEWAY,
            S::SERVICE_UNAVAILABLE,
        ] {
            assert!(!refuses_for_good(blip), "{blip}");
        }
    }

    #[test]
    fn a_runner_that_does_not_know_the_session_is_gone_at_once() {
        let mut b = Backoff::default();
        for why in ["404 Not Found", "410 Gone"] {
            let v = judge(
                &Attempt::Unknown(why.to_owned()),
                Duration::ZERO,
                Duration::from_secs(60),
                &mut b,
            );
            assert_eq!(v, Verdict::Gone);
        }
    }

    #[test]
    fn an_unreachable_runner_is_retried_until_the_patience_is_over() {
        let patience = Duration::from_secs(5);
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(2));
        let mut waited = Duration::ZERO;
        let mut waits = Vec::new();
        let attempts = (0..10).map(|i| match i % 2 {
            0 => Attempt::Refused,
            _ => Attempt::Failed("reset".into()),
        });
        for attempt in attempts {
            match judge(&attempt, waited, patience, &mut b) {
                Verdict::Retry(w) => {
                    waits.push(w.as_secs());
                    waited += w;
                }
                Verdict::Gone => break,
            }
        }
        // 1 + 2 + 2, then the patience is spent: gone, never waiting past it.
        assert_eq!(waits, [1, 2, 2]);
        assert_eq!(waited, patience);
        assert_eq!(
            judge(&Attempt::Refused, waited, patience, &mut b),
            Verdict::Gone
        );
    }

    /// A workspace whose runner is `runner`, and a runner answering each
    /// `GET /v1/sessions/s/events` with the next of `answers` (then `200`).
    async fn against(answers: Vec<u16>) -> (Opened, String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let runner = format!("http://{}/", listener.local_addr().unwrap());
        let tries = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&tries);
        let app = axum::Router::new().route(
            "/v1/sessions/s/events",
            axum::routing::get(move || {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                let status = answers.get(n).copied().unwrap_or(200);
                async move { axum::http::StatusCode::from_u16(status).unwrap() }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        let ws = workspace(&runner).await;
        (ws, runner, tries)
    }

    /// A workspace and its data folder, removed when dropped.
    type Opened = (crate::Workspace, tempfile::TempDir);

    async fn workspace(runner: &str) -> Opened {
        let dir = tempfile::tempdir().unwrap();
        let mut config =
            crate::WorkspaceConfig::new(dir.path(), url::Url::parse("http://127.0.0.1/").unwrap());
        config.sandbox_url = Some(url::Url::parse(runner).unwrap());
        (crate::Workspace::open(config).await.unwrap(), dir)
    }

    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_live_runner_behind_a_blip_is_re_attached_after_backing_off() {
        let (ws, runner, tries) = against(vec![503, 502]).await;
        let got = reattach(&ws.0.state, &runner, "s", 7, Duration::from_secs(30)).await;
        assert!(got.is_some_and(|r| r.status() == 200));
        assert_eq!(tries.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_runner_that_does_not_know_the_session_ends_it_at_once() {
        let (ws, runner, tries) = against(vec![404]).await;
        let started = std::time::Instant::now();
        let got = reattach(&ws.0.state, &runner, "s", 7, Duration::from_secs(30)).await;
        assert!(got.is_none());
        assert_eq!(tries.load(Ordering::SeqCst), 1);
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_runner_that_refuses_connections_is_gone_once_the_patience_is_over() {
        // Bound and let go: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let runner = format!("http://127.0.0.1:{port}/");
        let ws = workspace(&runner).await;
        let started = std::time::Instant::now();
        let got = reattach(&ws.0.state, &runner, "s", 7, Duration::from_millis(700)).await;
        assert!(got.is_none());
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(700), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    #[test]
    fn the_last_wait_stops_at_the_patience() {
        let mut b = Backoff::new(Duration::from_secs(2), Duration::from_secs(2));
        let v = judge(
            &Attempt::Refused,
            Duration::from_millis(4_500),
            Duration::from_secs(5),
            &mut b,
        );
        assert_eq!(v, Verdict::Retry(Duration::from_millis(500)));
    }
}
