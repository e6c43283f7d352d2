//! The runner's OpenAPI 3.1 document, generated from the handlers'
//! `#[utoipa::path]` annotations and served at `GET /openapi.json`.
//!
//! The wire types of `asbx-protocol` are described by their schemars JSON
//! Schemas (`schemas/`), merged into `components.schemas` when the document
//! is built ([`asbx_protocol::schema::components`]), not written twice: the
//! annotations name them through the reference-only types of `apidoc`.
//! The checked-in copy is `openapi/runner.json`; a test fails when it drifts.

use std::sync::OnceLock;

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "asbx runner",
        description = "Runs one AI agent turn per dispatch in a fresh sandbox and streams what it does as NDJSON (docs/protocol.md). Every route but `/healthz`, `/v1/identity` and `/openapi.json` needs `Authorization: Bearer <runner token>` when the runner has a token (it must, unless it listens on loopback). Errors are `application/problem+json` with a stable `code`."
    ),
    modifiers(&Security),
)]
struct RunnerApi;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "runner_token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The runner's token (ASBX_RUNNER_TOKEN); not checked when none is set",
                    ))
                    .build(),
            ),
        );
    }
}

/// The document's frame: its info and security scheme; the operations
/// come with the routes (`crate::api`).
pub(crate) fn base() -> utoipa::openapi::OpenApi {
    RunnerApi::openapi()
}

/// The document, built once.
pub(crate) fn document() -> &'static serde_json::Value {
    static DOC: OnceLock<serde_json::Value> = OnceLock::new();
    DOC.get_or_init(|| build(crate::api().into_openapi()))
}

/// `api` with the protocol's schemas in its components, finished.
fn build(api: utoipa::openapi::OpenApi) -> serde_json::Value {
    let mut doc = asbx_protocol::schema::document_with_components(&api);
    asbx_protocol::schema::sse_envelopes(&mut doc);
    asbx_protocol::schema::name_variants(&mut doc);
    asbx_protocol::schema::prune_components(&mut doc);
    doc
}

/// `GET /openapi.json`: this document (public, no token needed).
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "meta",
    responses((status = 200, description = "The runner's OpenAPI 3.1 document", body = Object)),
)]
pub(crate) async fn openapi_json() -> Json<&'static serde_json::Value> {
    Json(document())
}

#[cfg(test)]
mod tests {

    use asbx_test_support::openapi::{assert_self_contained, documented_codes, operations};

    /// The routes `routes.rs` and `lib.rs` register, as `(method, path)`:
    /// read from the source, so a route added there without an annotation
    /// fails the test.
    #[test]
    fn the_documented_codes_are_the_codes_the_runner_answers() {
        use crate::RunnerError as E;
        let io = || std::io::Error::other("x");
        let errors = [
            E::InvalidRequest(Vec::new()),
            E::Unauthorized,
            E::CrossOrigin("https://page.example".into()),
            E::SessionTaken("s".into()),
            E::SessionNotFound("s".into()),
            E::TooLarge(1),
            E::AtCapacity(1),
            E::NotProtocol2("s".into()),
            E::UnknownCall("c".into()),
            E::AlreadyAnswered("c".into()),
            E::CallClosed("c".into()),
            E::Undecryptable("c".into()),
            E::EventsGone {
                after: 1,
                oldest: 2,
            },
            E::Spawn("x".into()),
            E::io("p", io()),
        ];
        let answered: std::collections::BTreeSet<String> =
            errors.iter().map(|e| e.code()).collect();
        // `404 not_found` of a path no route has is `SessionNotFound`'s
        // code; `405 method_not_allowed` (`E::MethodNotAllowed`) is the
        // router's answer to a method no operation has, so no operation
        // lists it.
        assert_eq!(documented_codes(super::document()), answered);
    }

    #[test]
    fn every_route_is_documented_and_nothing_else() {
        // The runner serves only what `crate::api` registers with
        // `routes!`, which takes each route's path and methods from its
        // documentation: a route added with axum's own `.route(` would be
        // served undocumented.
        for (file, src) in [
            ("routes.rs", include_str!("routes.rs")),
            ("lib.rs", include_str!("lib.rs")),
        ] {
            for call in [".route(", ".route_service(", ".nest(", ".merge("] {
                assert!(
                    !src.contains(call),
                    "{file} adds a route with {call}; register it in crate::api with routes!"
                );
            }
        }
        let documented = operations(super::document());
        assert!(documented.len() >= 9, "too few operations: {documented:?}");
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
        assert!(schemas["DispatchRequest"].get("properties").is_some());
        // Every operation but the public ones names the bearer.
        asbx_test_support::openapi::assert_bearer_documented(doc, |path, _| {
            ["/healthz", "/v1/identity", "/openapi.json"].contains(&path)
        });
    }

    #[test]
    fn checked_in_document_matches_the_code() {
        asbx_test_support::openapi::assert_checked_in(
            env!("CARGO_MANIFEST_DIR"),
            "../../openapi/runner.json",
            super::document(),
        );
    }

    #[tokio::test]
    async fn served_without_the_token_and_healthz_as_documented() {
        use axum::body::Body;
        use axum::http::Request;
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let mut config =
            crate::RunnerConfig::new("/nonexistent/asbx".into(), dir.path().to_owned());
        config.warm_pool = 0;
        config.token = Some("secret".into());
        let router = crate::Runner::new(config).unwrap().router();
        let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
        let res = router.clone().oneshot(get("/openapi.json")).await.unwrap();
        assert_eq!(res.status(), 200);
        let body = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        let got: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(&got, super::document());
        // `/healthz` answers exactly the documented fields.
        let res = router.clone().oneshot(get("/healthz")).await.unwrap();
        let body = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        let health: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let mut have: Vec<&str> = health
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        let schema = &got["components"]["schemas"]["Health"];
        let mut want: Vec<&str> = schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap())
            .collect();
        have.sort();
        want.sort();
        assert_eq!(have, want);
        // A documented 401 is a problem with its code.
        let res = router.oneshot(get("/v1/sessions")).await.unwrap();
        assert_eq!(res.status(), 401);
        assert_eq!(res.headers()["content-type"], "application/problem+json");
    }
}
