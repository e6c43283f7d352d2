//! Integration tests of asbx-crypto: interoperability with WebCrypto.

// Test helpers outside #[test] fns panic on purpose.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod webcrypto;
