//! The blob folder (`ASBX_BLOB_STORE=dir`): file bytes stored under their
//! SHA-256 on this node's disk.
//!
//! A blob is written to a temporary file in the same folder and renamed
//! into place, so a reader never sees half a blob.

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

    /// Stores `bytes` and returns their SHA-256 (hex).
    pub(super) async fn put(&self, bytes: &[u8]) -> Result<String, WorkspaceError> {
        let sha = hex::encode(Sha256::digest(bytes));
        let path = self.path_of(&sha);
        if tokio::fs::try_exists(&path).await.unwrap_or(false) {
            return Ok(sha);
        }
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| WorkspaceError::io(&dir, e))?;
        let tmp = self
            .root
            .join("tmp")
            .join(format!("{sha}.{}", crate::tokens::random_id()));
        tokio::fs::write(&tmp, bytes)
            .await
            .map_err(|e| WorkspaceError::io(&tmp, e))?;
        if let Err(e) = tokio::fs::rename(&tmp, &path).await {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(WorkspaceError::io(&path, e));
        }
        Ok(sha)
    }

    /// Stores a body as it arrives, hashing while it is written, without
    /// holding it in memory: at most `limit` bytes, else
    /// [`WorkspaceError::BodyTooLarge`] and nothing is kept. Returns the
    /// SHA-256 (hex) and the size.
    pub(super) async fn put_stream<S, E>(
        &self,
        mut body: S,
        limit: usize,
    ) -> Result<(String, u64), WorkspaceError>
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
        let (sha, size) = match written {
            Ok(v) => v,
            Err(e) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                return Err(e);
            }
        };
        let path = self.path_of(&sha);
        if tokio::fs::try_exists(&path).await.unwrap_or(false) {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Ok((sha, size));
        }
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        let placed = match tokio::fs::create_dir_all(&dir).await {
            Ok(()) => tokio::fs::rename(&tmp, &path)
                .await
                .map_err(|e| WorkspaceError::io(&path, e)),
            Err(e) => Err(WorkspaceError::io(&dir, e)),
        };
        if let Err(e) = placed {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(e);
        }
        Ok((sha, size))
    }

    /// Opens a blob for reading (`sha` checked by the caller).
    pub(super) async fn open_blob(&self, sha: &str) -> Result<tokio::fs::File, WorkspaceError> {
        let path = self.path_of(sha);
        tokio::fs::File::open(&path)
            .await
            .map_err(|e| WorkspaceError::io(&path, e))
    }

    fn path_of(&self, sha: &str) -> PathBuf {
        let (a, rest) = sha.split_at(2.min(sha.len()));
        self.root.join(a).join(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::blobs::BlobStore;
    use crate::files::blobs::tests::chunks;

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
        let root = tempfile::tempdir().unwrap();
        let blobs = BlobStore::open_dir(root.path().to_path_buf())
            .await
            .unwrap();
        let (sha, size) = blobs
            .put_stream(chunks(&[b"hello ", b"world"]), 11)
            .await
            .unwrap();
        assert_eq!(size, 11);
        assert_eq!(sha, hex::encode(Sha256::digest(b"hello world")));
        assert_eq!(blobs.read(&sha).await.unwrap(), b"hello world");
        // The same bytes again: one blob, no temporary file left.
        let again = blobs
            .put_stream(chunks(&[b"hello world"]), 11)
            .await
            .unwrap();
        assert_eq!(again.0, sha);
        assert_eq!(tmp_entries(root.path()).await, 0);
        // One byte over the cap: refused, nothing kept.
        let err = blobs
            .put_stream(chunks(&[b"hello ", b"world!"]), 11)
            .await
            .unwrap_err();
        assert!(
            matches!(err, WorkspaceError::BodyTooLarge { limit: 11 }),
            "{err:?}"
        );
        assert_eq!(tmp_entries(root.path()).await, 0);
        let missing = hex::encode(Sha256::digest(b"hello world!"));
        assert!(blobs.open_blob(&missing).await.is_err());
        // A body that breaks off: refused, nothing kept.
        let broken = futures::stream::iter(vec![
            Ok(bytes::Bytes::from_static(b"part")),
            Err("connection reset".to_owned()),
        ]);
        assert!(blobs.put_stream(broken, 100).await.is_err());
        assert_eq!(tmp_entries(root.path()).await, 0);
    }
}
