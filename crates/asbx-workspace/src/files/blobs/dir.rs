//! The blob folder (`ASBX_BLOB_STORE=dir`): file bytes stored under their
//! SHA-256 on this node's disk.
//!
//! A blob is written to a temporary file in the same folder and renamed
//! into place, so a reader never sees half a blob. It is renamed into place
//! even when the same bytes are there already (a fresh copy, the same
//! content), after the caller pinned it, so freeing ([`DirBlobs::take`],
//! then a check, then removal or [`DirBlobs::restore`]) never removes a
//! copy an upload placed after its pin.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::error::WorkspaceError;

#[derive(Debug, Clone)]
pub(super) struct DirBlobs {
    root: PathBuf,
}

impl DirBlobs {
    /// Uses (and creates) `root`.
    pub(super) async fn open(root: PathBuf) -> Result<DirBlobs, WorkspaceError> {
        tokio::fs::create_dir_all(root.join("tmp"))
            .await
            .map_err(|e| WorkspaceError::io(&root, e))?;
        Ok(DirBlobs { root })
    }

    /// Writes `bytes` to a temporary file; its path ([`DirBlobs::place`]
    /// puts it where it belongs).
    pub(super) async fn write_tmp(&self, bytes: &[u8]) -> Result<PathBuf, WorkspaceError> {
        let tmp = self
            .root
            .join("tmp")
            .join(format!("put.{}", crate::tokens::random_id()));
        if let Err(e) = tokio::fs::write(&tmp, bytes).await {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(WorkspaceError::io(&tmp, e));
        }
        Ok(tmp)
    }

    /// Renames the temporary file `tmp` to the blob `sha`, over a copy
    /// already there; `tmp` is gone either way.
    pub(super) async fn place(
        &self,
        tmp: &std::path::Path,
        sha: &str,
    ) -> Result<(), WorkspaceError> {
        let path = self.path_of(sha);
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        let placed = match tokio::fs::create_dir_all(&dir).await {
            Ok(()) => tokio::fs::rename(tmp, &path)
                .await
                .map_err(|e| WorkspaceError::io(&path, e)),
            Err(e) => Err(WorkspaceError::io(&dir, e)),
        };
        if placed.is_err() {
            let _ = tokio::fs::remove_file(tmp).await;
        }
        placed
    }

    /// Moves the blob `sha` aside, to be removed or restored; `None` when
    /// it is not stored.
    pub(super) async fn take(&self, sha: &str) -> Result<Option<PathBuf>, WorkspaceError> {
        let aside = self
            .root
            .join("tmp")
            .join(format!("free.{sha}.{}", crate::tokens::random_id()));
        match tokio::fs::rename(self.path_of(sha), &aside).await {
            Ok(()) => Ok(Some(aside)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(WorkspaceError::io(&aside, e)),
        }
    }

    /// Puts a blob moved aside by [`DirBlobs::take`] back (over a copy an
    /// upload placed meanwhile: the same bytes).
    pub(super) async fn restore(
        &self,
        aside: &std::path::Path,
        sha: &str,
    ) -> Result<(), WorkspaceError> {
        self.place(aside, sha).await
    }

    /// Every blob stored (their SHA-256), and removes the temporary files
    /// older than `stale` (left by a crash).
    pub(super) async fn list(
        &self,
        stale: std::time::Duration,
    ) -> Result<Vec<String>, WorkspaceError> {
        let mut out = Vec::new();
        let io = |p: &std::path::Path, e| WorkspaceError::io(p, e);
        let mut top = tokio::fs::read_dir(&self.root)
            .await
            .map_err(|e| io(&self.root, e))?;
        while let Some(entry) = top.next_entry().await.map_err(|e| io(&self.root, e))? {
            let name = entry.file_name().to_string_lossy().into_owned();
            let dir = entry.path();
            if name == "tmp" {
                remove_stale(&dir, stale).await;
                continue;
            }
            if name.len() != 2 || !entry.file_type().await.is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let mut inner = tokio::fs::read_dir(&dir).await.map_err(|e| io(&dir, e))?;
            while let Some(blob) = inner.next_entry().await.map_err(|e| io(&dir, e))? {
                let sha = format!("{name}{}", blob.file_name().to_string_lossy());
                if sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()) {
                    out.push(sha);
                }
            }
        }
        Ok(out)
    }

    /// Writes a body to a temporary file as it arrives, hashing while it is
    /// written, without holding it in memory: at most `limit` bytes, else
    /// [`WorkspaceError::BodyTooLarge`] and nothing is kept. Returns the
    /// SHA-256 (hex), the size and the file, for [`DirBlobs::place`].
    pub(super) async fn put_stream<S, E>(
        &self,
        mut body: S,
        limit: usize,
    ) -> Result<(String, u64, PathBuf), WorkspaceError>
    where
        S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        use futures::StreamExt as _;
        use tokio::io::AsyncWriteExt as _;

        let tmp = self
            .root
            .join("tmp")
            .join(format!("upload.{}", crate::tokens::random_id()));
        let written = async {
            let mut file = tokio::fs::File::create(&tmp)
                .await
                .map_err(|e| WorkspaceError::io(&tmp, e))?;
            let mut hasher = Sha256::new();
            let mut size = 0usize;
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| {
                    WorkspaceError::invalid(format!("could not read the body: {e}"))
                })?;
                size = size.saturating_add(chunk.len());
                if size > limit {
                    return Err(WorkspaceError::BodyTooLarge { limit });
                }
                hasher.update(&chunk);
                file.write_all(&chunk)
                    .await
                    .map_err(|e| WorkspaceError::io(&tmp, e))?;
            }
            file.flush()
                .await
                .map_err(|e| WorkspaceError::io(&tmp, e))?;
            Ok((hex::encode(hasher.finalize()), size as u64))
        }
        .await;
        match written {
            Ok((sha, size)) => Ok((sha, size, tmp)),
            Err(e) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                Err(e)
            }
        }
    }

    /// Opens a blob for reading (`sha` checked by the caller).
    pub(super) async fn open_blob(&self, sha: &str) -> Result<tokio::fs::File, WorkspaceError> {
        let path = self.path_of(sha);
        tokio::fs::File::open(&path)
            .await
            .map_err(|e| WorkspaceError::io(&path, e))
    }

    /// Whether the blob is stored.
    pub(super) async fn has(&self, sha: &str) -> bool {
        tokio::fs::try_exists(self.path_of(sha))
            .await
            .unwrap_or(false)
    }

    fn path_of(&self, sha: &str) -> PathBuf {
        let (a, rest) = sha.split_at(2.min(sha.len()));
        self.root.join(a).join(rest)
    }
}

/// Removes the files of `dir` not modified for `stale`.
async fn remove_stale(dir: &std::path::Path, stale: std::time::Duration) {
    let Ok(mut entries) = tokio::fs::read_dir(dir).await else {
        return;
    };
    while let Ok(Some(entry)) = entries.next_entry().await {
        let old = entry
            .metadata()
            .await
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > stale);
        if old {
            let _ = tokio::fs::remove_file(entry.path()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::blobs::BlobStore;
    use crate::files::blobs::tests::{chunks, put_stream};
    use crate::store::Store;

    async fn tmp_entries(root: &std::path::Path) -> usize {
        let mut n = 0;
        let mut dir = tokio::fs::read_dir(root.join("tmp")).await.unwrap();
        while dir.next_entry().await.unwrap().is_some() {
            n += 1;
        }
        n
    }

    #[tokio::test]
    async fn a_streamed_body_is_hashed_stored_and_capped() {
        let data = tempfile::tempdir().unwrap();
        let store = Store::open(None, data.path()).await.unwrap();
        let root = data.path().join("blobs");
        let blobs = BlobStore::open_dir(root.clone(), &store).await.unwrap();
        let (sha, size) = put_stream(&blobs, chunks(&[b"hello ", b"world"]), 11)
            .await
            .unwrap();
        assert_eq!(size, 11);
        assert_eq!(sha, hex::encode(Sha256::digest(b"hello world")));
        assert_eq!(blobs.read(&sha).await.unwrap(), b"hello world");
        // The same bytes again: one blob, no temporary file left.
        let again = put_stream(&blobs, chunks(&[b"hello world"]), 11)
            .await
            .unwrap();
        assert_eq!(again.0, sha);
        assert_eq!(tmp_entries(&root).await, 0);
        // One byte over the cap: refused, nothing kept.
        let err = put_stream(&blobs, chunks(&[b"hello ", b"world!"]), 11)
            .await
            .unwrap_err();
        assert!(
            matches!(err, WorkspaceError::BodyTooLarge { limit: 11 }),
            "{err:?}"
        );
        assert_eq!(tmp_entries(&root).await, 0);
        let missing = hex::encode(Sha256::digest(b"hello world!"));
        assert!(blobs.open_blob(&missing).await.is_err());
        // A body that breaks off: refused, nothing kept.
        let broken = futures::stream::iter(vec![
            Ok(bytes::Bytes::from_static(b"part")),
            Err("connection reset".to_owned()),
        ]);
        assert!(put_stream(&blobs, broken, 100).await.is_err());
        assert_eq!(tmp_entries(&root).await, 0);
    }
}
