//! The reference-only stand-ins of `asbx-protocol`'s types in the OpenAPI
//! document (`openapi`): each is a `$ref` to the component of the same
//! name, which the document's build fills with the type's schemars schema.
//! Handlers' `#[utoipa::path]` annotations name them as `doc::Line`, ...

use utoipa::openapi::{Ref, RefOr, schema::Schema};

macro_rules! by_reference {
    ($($name:ident),* $(,)?) => {$(
        pub(crate) struct $name;
        impl utoipa::PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                RefOr::Ref(Ref::from_schema_name(stringify!($name)))
            }
        }
        impl utoipa::ToSchema for $name {}
    )*};
}

by_reference!(Line, DispatchRequest, Problem, SessionInfo);

/// The `401` every route but the public ones lists: a `Problem` in
/// `application/problem+json`.
pub(crate) struct Unauthorized;

impl<'r> utoipa::ToResponse<'r> for Unauthorized {
    fn response() -> (&'r str, RefOr<utoipa::openapi::Response>) {
        use utoipa::openapi::{ContentBuilder, ResponseBuilder};
        let content = ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("Problem")))
            .build();
        let response = ResponseBuilder::new()
            .description("`unauthorized`: the runner token is missing or wrong")
            .content(asbx_protocol::Problem::CONTENT_TYPE, content)
            .build();
        ("Unauthorized", response.into())
    }
}
