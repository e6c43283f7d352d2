//! The sandbox runner: `POST /stream` boots a fresh sandbox per dispatch and
//! streams what the agent in it does as NDJSON.
//!
//! - [`Runner::new`] takes a [`RunnerConfig`]; [`Runner::router`] serves it.
//! - `routes` holds the thin HTTP handlers (auth is the `auth` extractor);
//!   `dispatch` owns a dispatch's start, socket binding and teardown;
//!   `drive` is the per-dispatch task; `session` the registry and the
//!   response-body guards; `gateway` is the sandbox's only way out; `egress`
//!   its proxy; `sandbox` starts the jail; `metrics` is `GET /metrics`;
//!   `otel` the OpenTelemetry spans of a dispatch (off unless enabled);
//!   `identity` the long-term key that signs encrypted sessions' handshakes.

mod apidoc;
mod audit;
mod auth;
mod child;
mod config;
mod dispatch;
mod drive;
mod egress;
/// The egress proxy's pure parsing, for the fuzz targets.
#[doc(hidden)]
pub use egress::parse as egress_parse;
/// One egress proxy on its own, for `asbx-bench`.
#[doc(hidden)]
pub use egress::standalone as egress_standalone;
mod error;
mod gateway;
mod identity;
mod limit;
mod metrics;
mod openapi;
mod otel;
mod pool;
mod resume;
mod routes;
mod sandbox;
mod session;
mod stamp;
mod stderr;
mod uids;
mod workdir;
mod ws;

use std::sync::Arc;

use asbx_protocol::jail::IsolationProfile;
use axum::Router;
use tokio::sync::Semaphore;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use config::{ProviderConfig, RunnerConfig};
pub use egress::Cidr;
pub use error::RunnerError;
pub use otel::enable as enable_traces;
/// A sandbox's kept working directory (CONTRACT §11): public for
/// `asbx-bench workdir`, which restores and captures one outside a sandbox.
pub use workdir::{RestoreError, Workdir};

use crate::sandbox::{Jailed, Sandbox, Unconfined};
use crate::session::Sessions;
use crate::uids::{UidClaim, UidPool};

/// A running runner's shared state.
#[derive(Debug, Clone)]
pub struct Runner {
    inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) config: RunnerConfig,
    pub(crate) sandbox: Box<dyn Sandbox>,
    pub(crate) sessions: Sessions,
    pub(crate) capacity: Arc<Semaphore>,
    pub(crate) uids: Arc<UidPool>,
    /// The host uid blocks `uids` hands out, held until the runner ends.
    _uid_claim: Option<UidClaim>,
    pub(crate) providers: Arc<Vec<ProviderConfig>>,
    pub(crate) client: reqwest::Client,
    pub(crate) pool: pool::Pool,
    pub(crate) egress: egress::EgressSettings,
    /// Signs each encrypted session's handshake (`docs/protocol.md` §4).
    pub(crate) identity: asbx_crypto::IdentityKey,
}

/// How often a runner looks for what killed runners' sandboxes left.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(600);

impl Runner {
    pub fn new(mut config: RunnerConfig) -> Result<Self, RunnerError> {
        config.bound_duration_by_runtime();
        // The state folder is this runner's own: what a previous run left is stale.
        for sub in ["sessions", "pool"] {
            let dir = config.state_dir.join(sub);
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).map_err(|e| RunnerError::io(dir.display(), e))?;
        }
        let identity = identity::load_or_create(&config.state_dir)?;
        let sandbox: Box<dyn Sandbox> = match config.isolation {
            IsolationProfile::Jail(profile) => Box::new(Jailed {
                exe: config.asbx_exe.clone(),
                profile,
                run_dirs: std::sync::OnceLock::new(),
                zygote: std::sync::OnceLock::new(),
            }),
            IsolationProfile::Unconfined => Box::new(Unconfined {
                exe: config.asbx_exe.clone(),
            }),
        };
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            // A redirect would lead the gateway somewhere it never checked.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| RunnerError::Spawn(format!("http client: {e}")))?;
        let slots = config.max_sandboxes + config.warm_pool.max(config.warm_pool_max);
        // Jailed sandboxes run as host uids of their own: claimed on the
        // host, so another runner there never hands out the same ones.
        let uid_claim = match (&config.isolation, &config.uid_locks) {
            (IsolationProfile::Jail(_), Some(dir)) => Some(UidClaim::take(
                dir,
                config.uid_base,
                slots as u64 * u64::from(asbx_protocol::jail::HOST_IDS_PER_SANDBOX),
            )?),
            _ => None,
        };
        let uid_base = uid_claim.as_ref().map_or(config.uid_base, UidClaim::base);
        Ok(Runner {
            inner: Arc::new(Inner {
                capacity: Arc::new(Semaphore::new(config.max_sandboxes)),
                uids: Arc::new(UidPool::new(uid_base, slots)),
                _uid_claim: uid_claim,
                pool: pool::Pool::new(config.warm_pool, config.warm_pool_max),
                providers: Arc::new(config.providers.clone()),
                sessions: Sessions::default(),
                egress: egress::EgressSettings::new(config.allow_internal.clone())
                    .with_extra_ca(config.egress_extra_ca.clone()),
                identity,
                sandbox,
                client,
                config,
            }),
        })
    }

    /// Refuses a non-loopback listen address without a runner token.
    pub fn check_listen(&self, addr: std::net::SocketAddr) -> Result<(), RunnerError> {
        self.inner.config.check_listen(addr)
    }

    /// The public key of the runner's identity (`GET /v1/identity`).
    pub fn identity_key(&self) -> String {
        self.inner.identity.public_key()
    }

    /// The isolation profile in force.
    pub fn profile(&self) -> &'static str {
        self.inner.sandbox.profile().as_str()
    }

    pub fn router(&self) -> Router {
        let router = served_routes(Arc::clone(&self.inner))
            .method_not_allowed_fallback(routes::method_not_allowed)
            .fallback(routes::no_route);
        // Traces on: each handler runs in its caller's `traceparent` context.
        if otel::enabled() {
            return router.layer(axum::middleware::from_fn(otel::incoming));
        }
        router
    }

    /// Boots the warm pool in the background, and from now on and every
    /// `SWEEP_EVERY` removes what sandboxes of killed runners left
    /// (`Sandbox::sweep`). Call once the runner serves.
    pub fn warm_up(&self) {
        pool::Pool::refill(&self.inner);
        let inner = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                let Some(strong) = inner.upgrade() else {
                    return;
                };
                let swept = tokio::task::spawn_blocking(move || strong.sandbox.sweep()).await;
                if let Ok(n @ 1..) = swept {
                    tracing::info!(sandboxes = n, "removed the cgroups killed runners left");
                }
                tokio::time::sleep(SWEEP_EVERY).await;
            }
        });
    }

    /// Ends the warm sandboxes and removes their traces (on shutdown).
    pub async fn shutdown(&self) {
        pool::Pool::drain(&self.inner).await;
    }
}

/// The routes, served as `api` declares them.
fn served_routes(inner: Arc<Inner>) -> Router {
    let (routes, _) = api().split_for_parts();
    routes.with_state(inner)
}

/// Every route with its OpenAPI operation: `routes!` registers a handler
/// at the path and methods of its `#[utoipa::path]`, so no route is served
/// undocumented and none documented unserved. One `routes!` per path.
/// The document (`openapi::document`) is built from this list too. It
/// lives at the crate's root so that the handlers' modules and `openapi`
/// import no cycle.
pub(crate) fn api() -> OpenApiRouter<Arc<Inner>> {
    OpenApiRouter::with_openapi(openapi::base())
        .routes(routes!(routes::stream))
        .routes(routes!(ws::upgrade))
        .routes(routes!(routes::healthz))
        .routes(routes!(routes::metrics))
        .routes(routes!(routes::identity))
        .routes(routes!(routes::list_sessions))
        .routes(routes!(routes::get_session, routes::delete_session))
        .routes(routes!(resume::events))
        .routes(routes!(resume::tool_result))
        .routes(routes!(openapi::openapi_json))
}
