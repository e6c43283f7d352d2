//! The web chat page (`/` and its assets), `GET /healthz`, and the 404
//! fallback. The page is plain HTML, CSS and JS compiled into the binary, with
//! two vendored libraries (`assets/vendor/README.md`): `marked` renders the
//! answers' Markdown and `DOMPurify` sanitises what it makes.

use axum::Json;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::error::WorkspaceError;
use crate::wire::Health;

const INDEX_HTML: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const APP_CSS: &str = include_str!("../assets/app.css");
const MARKED_JS: &str = include_str!("../assets/vendor/marked.umd.js");
const PURIFY_JS: &str = include_str!("../assets/vendor/purify.min.js");

/// Only this origin's scripts, styles and requests; never framed.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'";

/// A page asset's route: a handler serving `$body` as `$type`, documented
/// at `$path`.
macro_rules! asset_route {
    ($name:ident, $path:literal, $what:literal, $body:expr, $type:literal) => {
        #[utoipa::path(
            get,
            path = $path,
            tag = "pages",
            responses((status = 200, description = $what, body = String, content_type = $type)),
        )]
        pub(crate) async fn $name() -> Response {
            asset($body, $type)
        }
    };
}

asset_route!(
    index,
    "/",
    "The chat page",
    INDEX_HTML,
    "text/html; charset=utf-8"
);
asset_route!(
    app_js,
    "/assets/app.js",
    "The page's script",
    APP_JS,
    "text/javascript; charset=utf-8"
);
asset_route!(
    app_css,
    "/assets/app.css",
    "The page's styles",
    APP_CSS,
    "text/css; charset=utf-8"
);
asset_route!(
    marked_js,
    "/assets/vendor/marked.js",
    "Vendored marked",
    MARKED_JS,
    "text/javascript; charset=utf-8"
);
asset_route!(
    purify_js,
    "/assets/vendor/purify.js",
    "Vendored DOMPurify",
    PURIFY_JS,
    "text/javascript; charset=utf-8"
);

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

#[utoipa::path(
    get,
    path = "/healthz",
    tag = "meta",
    responses(
        (status = 200, description = "The workspace is up", body = Health),
    ),
)]
pub(crate) async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// How long `/readyz` waits for the database.
const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

#[utoipa::path(
    get,
    path = "/readyz",
    tag = "meta",
    responses(
        (status = 200, description = "The workspace can reach its database and take work", body = Health),
        (status = 503, description = "`database_unavailable`: the database does not answer (within 2 s); a load balancer should send work to another node", body = crate::apidoc::Problem, content_type = "application/problem+json"),
    ),
)]
/// Readiness: `/healthz` says the process is up, this one that it can do
/// work, a `SELECT 1` answered within [`READY_TIMEOUT`]. A node cut off
/// from PostgreSQL answers `503` until it is back, by itself.
pub(crate) async fn readyz(
    axum::extract::State(state): axum::extract::State<std::sync::Arc<crate::AppState>>,
) -> Result<Json<Health>, WorkspaceError> {
    let ping = sqlx::query("SELECT 1").execute(state.store.pool());
    let failure = match tokio::time::timeout(READY_TIMEOUT, ping).await {
        Ok(Ok(_)) => return Ok(Json(Health { status: "ready" })),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {READY_TIMEOUT:?}"),
    };
    tracing::warn!(%failure, "not ready: the database does not answer");
    // Whatever the failure, the answer is the one a probe acts on.
    Err(WorkspaceError::Database(sqlx::Error::PoolTimedOut))
}

pub(crate) async fn not_found(uri: axum::http::Uri) -> WorkspaceError {
    WorkspaceError::NotFound(format!("route {}", uri.path()))
}
