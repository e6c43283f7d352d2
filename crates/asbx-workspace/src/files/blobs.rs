//! The blob folder: file bytes stored under their SHA-256.
//!
//! Content addressing makes writes idempotent and lets two files with the
//! same bytes share one blob. A blob is written to a temporary file in the
//! same folder and renamed into place, so a reader never sees half a blob.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::error::WorkspaceError;

#[derive(Debug, Clone)]
pub(crate) struct BlobStore {
    root: PathBuf,
}

impl BlobStore {
    /// Uses (and creates) `root`.
    pub(crate) async fn open(root: PathBuf) -> Result<BlobStore, WorkspaceError> {
        tokio::fs::create_dir_all(root.join("tmp"))
            .await
            .map_err(|e| WorkspaceError::io(&root, e))?;
        Ok(BlobStore { root })
    }

    /// Stores `bytes` and returns their SHA-256 (hex).
    pub(crate) async fn put(&self, bytes: &[u8]) -> Result<String, WorkspaceError> {
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

    /// Opens a blob for reading.
    pub(crate) async fn open_blob(&self, sha: &str) -> Result<tokio::fs::File, WorkspaceError> {
        if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(WorkspaceError::Corrupt(format!("blob name {sha:?}")));
        }
        let path = self.path_of(sha);
        tokio::fs::File::open(&path)
            .await
            .map_err(|e| WorkspaceError::io(&path, e))
    }

    /// Reads a whole blob.
    pub(crate) async fn read(&self, sha: &str) -> Result<Vec<u8>, WorkspaceError> {
        use tokio::io::AsyncReadExt as _;
        let mut file = self.open_blob(sha).await?;
        let mut out = Vec::new();
        file.read_to_end(&mut out)
            .await
            .map_err(|e| WorkspaceError::io(self.path_of(sha), e))?;
        Ok(out)
    }

    fn path_of(&self, sha: &str) -> PathBuf {
        let (a, rest) = sha.split_at(2.min(sha.len()));
        self.root.join(a).join(rest)
    }
}
