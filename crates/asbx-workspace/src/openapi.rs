//! The workspace's OpenAPI 3.1 document, generated from the handlers'
//! `#[utoipa::path]` annotations and served at `GET /openapi.json`.
//!
//! The wire types of `asbx-protocol` are described by their schemars JSON
//! Schemas (`schemas/`), merged into `components.schemas` when the document
//! is built ([`asbx_protocol::schema::components`]), not written twice: the
//! annotations name them through the reference-only types of `apidoc`.
//! The checked-in copy is `openapi/workspace.json`; a test fails when it drifts.

use std::sync::OnceLock;

use axum::Json;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "asbx workspace",
        description = "The asbx control plane: runs, stored agents, environments, chats, files, and the callback routes a sandbox reaches through its runner's gateway. Callers authenticate with a workspace API key (`Authorization: Bearer asbx_key_...`) or the browser session cookie made by `POST /api/session`; without either they act in the default workspace unless the workspace requires authentication. The sandbox callback routes take a one-time token as their bearer. Errors are `application/problem+json` with a stable `code`; every route may also answer `403` `host_not_allowed` (a `Host` this server does not answer to) or `cross_origin` (a state-changing request from another origin), and `500` `internal`."
    ),
    modifiers(&Security),
)]
struct WorkspaceApi;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let bearer = |description: &str| {
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(description))
                    .build(),
            )
        };
        components.add_security_scheme(
            "api_key",
            bearer("A workspace API key, `asbx_key_...` (`asbx key`)"),
        );
        components.add_security_scheme(
            "session_cookie",
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                crate::auth::SESSION_COOKIE,
                "The browser session made by `POST /api/session`",
            ))),
        );
        components.add_security_scheme(
            "sandbox_token",
            bearer("A one-time token the workspace minted for the sandbox session"),
        );
        components.add_security_scheme(
            "runner_audit_token",
            bearer("The audit token a dispatch gave the runner (`x-asbx-audit-token`), never the sandbox"),
        );
        components.add_security_scheme(
            "metrics_token",
            bearer("The metrics token (ASBX_METRICS_TOKEN); without one, only loopback callers"),
        );
    }
}

/// Operation ids are `<tag>_<handler>`: handlers of different features
/// share names (`list`, `get`), ids may not.
struct OperationIds;

impl Modify for OperationIds {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            for op in [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
            ]
            .into_iter()
            .flatten()
            {
                let tag = op.tags.as_ref().and_then(|t| t.first()).cloned();
                if let (Some(tag), Some(id)) = (tag, op.operation_id.as_mut()) {
                    *id = format!("{tag}_{id}");
                }
            }
        }
    }
}

/// The document's frame: its info and security schemes; the operations
/// come with the routes (`crate::api`).
pub(crate) fn base() -> utoipa::openapi::OpenApi {
    WorkspaceApi::openapi()
}

/// The document, built once.
pub(crate) fn document() -> &'static serde_json::Value {
    static DOC: OnceLock<serde_json::Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut api = crate::api().into_openapi();
        OperationIds.modify(&mut api);
        build(api)
    })
}

/// `api` with the protocol's schemas in its components, finished.
fn build(api: utoipa::openapi::OpenApi) -> serde_json::Value {
    let mut doc = asbx_protocol::schema::document_with_components(&api);
    open_flattened(&mut doc);
    guard_responses(&mut doc);
    asbx_protocol::schema::sse_envelopes(&mut doc);
    asbx_protocol::schema::name_variants(&mut doc);
    asbx_protocol::schema::prune_components(&mut doc);
    doc
}

/// What every route may answer, whatever its handler does: the Host and
/// Origin guard's `403` and a `500` (`guard::host_and_origin`,
/// `guard::problem_errors`), and, where it uses the database, `503`
/// `database_unavailable`.
fn guard_responses(doc: &mut serde_json::Value) {
    let problem = |description: &str| {
        serde_json::json!({
            "description": description,
            "content": {
                "application/problem+json": {
                    "schema": { "$ref": "#/components/schemas/Problem" }
                }
            }
        })
    };
    let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        // The routes that answer without the database.
        let static_route = matches!(path.as_str(), "/" | "/healthz" | "/openapi.json")
            || path.starts_with("/assets/");
        for op in item.values_mut() {
            let Some(responses) = op.get_mut("responses").and_then(|r| r.as_object_mut()) else {
                continue;
            };
            responses.entry("403").or_insert_with(|| {
                problem(
                    "`host_not_allowed`: a `Host` this server does not answer to; \
                     `cross_origin`: a state-changing request from another origin",
                )
            });
            responses
                .entry("500")
                .or_insert_with(|| problem("`internal`: see the workspace's log"));
            // Every route that reads or writes the database may find it
            // unreachable (a node cut off from PostgreSQL); `Retry-After: 1`.
            const DB: &str = "`database_unavailable`: the database cannot be reached now \
                              (nothing was changed; retry, `Retry-After` says when)";
            if static_route {
                continue;
            }
            match responses.get_mut("503") {
                Some(have) => {
                    if let Some(d) = have.get_mut("description")
                        && let Some(text) =
                            d.as_str().filter(|t| !t.contains("database_unavailable"))
                    {
                        *d = serde_json::Value::String(format!("{text}; {DB}"));
                    }
                }
                None => {
                    responses.insert("503".into(), problem(DB));
                }
            }
        }
    }
}

/// A type that refuses unknown fields (`additionalProperties: false`)
/// flattened into another (`allOf`) would refuse the other's fields too:
/// such a member is inlined without that closing.
fn open_flattened(doc: &mut serde_json::Value) {
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(|s| s.as_object_mut())
    else {
        return;
    };
    let copy = schemas.clone();
    for schema in schemas.values_mut() {
        let Some(members) = schema.get_mut("allOf").and_then(|a| a.as_array_mut()) else {
            continue;
        };
        for member in members {
            let target = member
                .get("$ref")
                .and_then(|r| r.as_str())
                .and_then(|r| r.strip_prefix("#/components/schemas/"))
                .and_then(|name| copy.get(name));
            if let Some(target) = target
                && target.get("additionalProperties") == Some(&serde_json::Value::Bool(false))
            {
                let mut open = target.clone();
                if let Some(obj) = open.as_object_mut() {
                    obj.remove("additionalProperties");
                }
                *member = open;
            }
        }
    }
}

/// `GET /openapi.json`: this document (public, no token needed).
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "meta",
    responses((status = 200, description = "The workspace's OpenAPI 3.1 document", body = Object)),
)]
pub(crate) async fn openapi_json() -> Json<&'static serde_json::Value> {
    Json(document())
}

#[cfg(test)]
mod tests {

    use asbx_test_support::openapi::{assert_self_contained, documented_codes, operations};

    #[test]
    fn the_documented_codes_are_the_codes_the_workspace_answers() {
        use crate::WorkspaceError as E;
        let errors = [
            E::invalid("x"),
            E::Unauthorized,
            E::OtpRejected,
            E::Forbidden("x".into()),
            E::CrossOrigin { origin: "o".into() },
            E::HostNotAllowed { host: "h".into() },
            E::NotFound("x".into()),
            E::BodyTooLarge { limit: 1 },
            E::UnsupportedMediaType { found: "x".into() },
            E::TurnInFlight {
                chat_id: "c".into(),
                turn_id: "t".into(),
            },
            E::Conflict("x".into()),
            E::SandboxUrlMissing,
            E::SandboxUrlNotAllowed { field: "f".into() },
            E::ModelNotAllowed {
                field: "f".into(),
                model: "m".into(),
                allowed: Vec::new(),
            },
            E::Upstream("x".into()),
            E::EventsGone {
                run_id: "r".into(),
                oldest: 1,
            },
            E::Corrupt("x".into()),
            E::Database(sqlx::Error::PoolTimedOut),
            E::QuotaExceeded {
                workspace: "w".into(),
                quota: "storage-mb",
                limit: 1,
                retry_after_s: None,
            },
            E::WorkdirNotKept {
                chat_id: "c".into(),
                at: String::new(),
            },
            E::WorkdirGone {
                chat_id: "c".into(),
                at: String::new(),
            },
        ];
        let mut answered: std::collections::BTreeSet<String> =
            errors.iter().map(|e| e.problem().code).collect();
        // A runner's refusals of a run or a tool result, passed through.
        use asbx_protocol::ProblemCode as C;
        for code in [
            C::AtCapacity,
            C::NotProtocol2,
            C::UnknownCall,
            C::AlreadyAnswered,
            C::SessionEnded,
            C::DecryptionFailed,
        ] {
            answered.insert(code.as_str().to_owned());
        }
        // `405 method_not_allowed` is the router's answer to a method no
        // operation has, so no operation lists it.
        assert_eq!(documented_codes(super::document()), answered);
    }

    #[test]
    fn every_route_is_documented_and_nothing_else() {
        // `lib.rs` serves only what `api()` registers with `routes!`, which
        // takes each route's path and methods from its documentation: a
        // route added with axum's own `.route(` would be served undocumented.
        let src = include_str!("lib.rs");
        for call in [".route(", ".route_service(", ".nest(", ".merge("] {
            assert!(
                !src.contains(call),
                "lib.rs adds a route with {call}; register it in api() with routes!"
            );
        }
        let documented = operations(super::document());
        assert!(documented.len() >= 45, "too few operations: {documented:?}");
    }

    #[tokio::test]
    async fn documented_operations_are_served() {
        use axum::body::Body;
        use axum::http::Request;
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let config = crate::WorkspaceConfig::new(
            dir.path(),
            url::Url::parse("http://127.0.0.1:9/").unwrap(),
        );
        let router = crate::Workspace::open(config).await.unwrap().router();
        for (method, path) in operations(super::document()) {
            let uri = path.replace('{', "x-").replace('}', "");
            let req = Request::builder()
                .method(method.to_uppercase().as_str())
                .uri(&uri)
                .header("host", "127.0.0.1")
                .body(Body::empty())
                .unwrap();
            let res = router.clone().oneshot(req).await.unwrap();
            let status = res.status();
            assert_ne!(status, 405, "{method} {path}: not served with that method");
            if status == 404 {
                let body = axum::body::to_bytes(res.into_body(), usize::MAX)
                    .await
                    .unwrap();
                let text = String::from_utf8_lossy(&body);
                assert!(
                    !text.contains(&format!("route {uri}")),
                    "{method} {path}: the router has no such route: {text}"
                );
            }
        }
    }

    #[test]
    fn the_document_is_openapi_3_1_and_self_contained() {
        let doc = super::document();
        // utoipa reads no schema without a type (any value), not even its
        // own: the checked copy has a type list on those.
        let readable = assert_self_contained(doc);
        let _: utoipa::openapi::OpenApi = serde_json::from_value(readable).unwrap();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        assert!(schemas["Line"].get("oneOf").is_some());
        assert!(schemas["ConfigResponse"].get("properties").is_some());
        // Every operation but the public ones names the bearer.
        asbx_test_support::openapi::assert_bearer_documented(doc, |path: &str, method: &str| {
            path == "/healthz"
                || path == "/readyz"
                || path == "/openapi.json"
                || path == "/"
                || path.starts_with("/assets/")
                || (path == "/api/session" && method != "get")
        });
    }

    #[test]
    fn checked_in_document_matches_the_code() {
        asbx_test_support::openapi::assert_checked_in(
            env!("CARGO_MANIFEST_DIR"),
            "../../openapi/workspace.json",
            super::document(),
        );
    }

    #[tokio::test]
    async fn served_without_credentials_where_the_rest_needs_them() {
        use axum::body::Body;
        use axum::http::Request;
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let mut config =
            crate::WorkspaceConfig::new(dir.path(), url::Url::parse("http://127.0.0.1/").unwrap());
        config.require_auth = true;
        let router = crate::Workspace::open(config).await.unwrap().router();
        let get = |path: &str| {
            Request::get(path)
                .header("host", "127.0.0.1")
                .body(Body::empty())
                .unwrap()
        };
        let res = router.clone().oneshot(get("/openapi.json")).await.unwrap();
        assert_eq!(res.status(), 200);
        let body = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        let got: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(&got, super::document());
        // The documented 401 of a route that needs a key.
        let res = router.oneshot(get("/api/agents")).await.unwrap();
        assert_eq!(res.status(), 401);
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        assert!(
            got["paths"]["/api/agents"]["get"]["responses"]["401"]["content"]
                ["application/problem+json"]
                .is_object()
        );
    }
}
