//! A chat's working directory kept between turns (CONTRACT §11), on the
//! workspace's side: each turn that ended on its own leaves a snapshot
//! (`store`, a manifest and the blobs it names in `files::blobs`), the
//! runner sends it through `api` behind the dispatch's `workdir` token,
//! and the chat's next dispatch carries the latest one to restore.

pub(crate) mod api;
pub(crate) mod source;
pub(crate) mod store;
pub(crate) mod tar;
