//! The reference-only stand-ins of `asbx-protocol`'s types in the OpenAPI
//! document (`openapi`): each is a `$ref` to the component of the same
//! name, which the document's build fills with the type's schemars schema.
//! Handlers' `#[utoipa::path]` annotations and the wire types' `value_type`s
//! name them (`doc::Line`, ...).

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

by_reference!(
    Line,
    Problem,
    Skill,
    McpServer,
    RunLimits,
    Termination,
    StepStatus,
    Role,
    EnvResponse,
    ConfigResponse,
    ResultsRequest,
    ResultsResponse,
);

/// `"encrypted": {"iv", "ciphertext"}`: base64url (no padding) of a
/// 12-byte nonce and of the AES-256-GCM ciphertext with its tag.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub(crate) struct Sealed {
    iv: String,
    ciphertext: String,
}
