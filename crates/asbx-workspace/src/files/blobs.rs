//! The file bag's bytes, stored under their SHA-256, in the place the
//! configuration picks ([`BlobBackend`], `ASBX_BLOB_STORE`):
//!
//! - `dir` ([`dir`]): a folder on this node's disk, `{data_dir}/blobs`. The
//!   default on SQLite (one node).
//! - `db` ([`db`]): the database, in 1 MiB chunks. The default on
//!   PostgreSQL, so every workspace node sharing it serves every file.
//!
//! Content addressing makes writes idempotent and lets two files with the
//! same bytes share one blob. Both backends write as the bytes arrive and
//! publish under the final hash only once all of them are in, so a reader
//! never sees half a blob and a refused upload leaves nothing; both read
//! back as a stream ([`BlobReader`]). Callers see one [`BlobStore`].

mod db;
mod dir;

use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

use crate::config::{BlobBackend, WorkspaceConfig};
use crate::error::WorkspaceError;
use crate::store::{Backend, Store};

#[derive(Debug, Clone)]
pub(crate) struct BlobStore {
    inner: Inner,
}

#[derive(Debug, Clone)]
enum Inner {
    Dir(dir::DirBlobs),
    /// The database, and the folder this node used before, if there is one:
    /// a blob not in the database is read from there.
    Db(db::DbBlobs, Option<dir::DirBlobs>),
}

impl BlobStore {
    /// The backend `config.blob_store` names; unset, `db` when the store is
    /// PostgreSQL and `dir` (`{data_dir}/blobs`) otherwise.
    pub(crate) async fn open(
        config: &WorkspaceConfig,
        store: &Store,
    ) -> Result<BlobStore, WorkspaceError> {
        let backend = config.blob_store.unwrap_or(match store.backend() {
            Backend::Postgres => BlobBackend::Db,
            Backend::Sqlite => BlobBackend::Dir,
        });
        match backend {
            BlobBackend::Dir => BlobStore::open_dir(config.data_dir.join("blobs")).await,
            BlobBackend::Db => {
                // Files this node kept in its folder before: still readable.
                let folder = config.data_dir.join("blobs");
                let earlier = match tokio::fs::try_exists(&folder).await {
                    Ok(true) => Some(dir::DirBlobs::open(folder).await?),
                    Ok(false) | Err(_) => None,
                };
                Ok(BlobStore {
                    inner: Inner::Db(db::DbBlobs::new(store.pool().clone()), earlier),
                })
            }
        }
    }

    /// The blob folder `root` (created if missing).
    pub(crate) async fn open_dir(root: PathBuf) -> Result<BlobStore, WorkspaceError> {
        Ok(BlobStore {
            inner: Inner::Dir(dir::DirBlobs::open(root).await?),
        })
    }

    /// Blobs in `store`'s database alone.
    #[cfg(test)]
    pub(crate) fn open_db(store: &Store) -> BlobStore {
        BlobStore {
            inner: Inner::Db(db::DbBlobs::new(store.pool().clone()), None),
        }
    }

    /// Which backend this is.
    #[cfg(test)]
    pub(crate) fn backend(&self) -> BlobBackend {
        match self.inner {
            Inner::Dir(_) => BlobBackend::Dir,
            Inner::Db(..) => BlobBackend::Db,
        }
    }

    /// Stores `bytes` and returns their SHA-256 (hex).
    pub(crate) async fn put(&self, bytes: &[u8]) -> Result<String, WorkspaceError> {
        match &self.inner {
            Inner::Dir(d) => d.put(bytes).await,
            Inner::Db(d, _) => {
                use sha2::Digest as _;
                let sha = hex::encode(sha2::Sha256::digest(bytes));
                if d.has(&sha).await? {
                    return Ok(sha);
                }
                // One chunk copied at a time.
                let parts =
                    futures::stream::iter(bytes.chunks(db::CHUNK).map(|c| {
                        Ok::<_, std::convert::Infallible>(bytes::Bytes::copy_from_slice(c))
                    }));
                let (stored, _) = d.put_stream(parts, usize::MAX).await?;
                Ok(stored)
            }
        }
    }

    /// Stores a body as it arrives, hashing while it is written, without
    /// holding it in memory: at most `limit` bytes, else
    /// [`WorkspaceError::BodyTooLarge`] and nothing is kept. Returns the
    /// SHA-256 (hex) and the size.
    pub(crate) async fn put_stream<S, E>(
        &self,
        body: S,
        limit: usize,
    ) -> Result<(String, u64), WorkspaceError>
    where
        S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        match &self.inner {
            Inner::Dir(d) => d.put_stream(body, limit).await,
            Inner::Db(d, _) => d.put_stream(body, limit).await,
        }
    }

    /// Opens a blob for reading.
    pub(crate) async fn open_blob(&self, sha: &str) -> Result<BlobReader, WorkspaceError> {
        if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(WorkspaceError::Corrupt(format!("blob name {sha:?}")));
        }
        Ok(BlobReader(match &self.inner {
            Inner::Dir(d) => Reader::File(d.open_blob(sha).await?),
            Inner::Db(d, earlier) => match (d.open_blob(sha).await?, earlier) {
                (Some(r), _) => Reader::Db(Box::new(r)),
                (None, Some(folder)) => Reader::File(folder.open_blob(sha).await?),
                (None, None) => {
                    return Err(WorkspaceError::Corrupt(format!("blob {sha} is not stored")));
                }
            },
        }))
    }

    /// Reads a whole blob.
    #[cfg(test)]
    pub(crate) async fn read(&self, sha: &str) -> Result<Vec<u8>, WorkspaceError> {
        use tokio::io::AsyncReadExt as _;
        let mut blob = self.open_blob(sha).await?;
        let mut out = Vec::new();
        blob.read_to_end(&mut out)
            .await
            .map_err(|e| WorkspaceError::Corrupt(format!("reading blob {sha}: {e}")))?;
        Ok(out)
    }
}

/// One stored blob being read: an [`AsyncRead`], so a handler streams it
/// with `tokio_util::io::ReaderStream`.
#[derive(Debug)]
pub(crate) struct BlobReader(Reader);

#[derive(Debug)]
enum Reader {
    File(tokio::fs::File),
    Db(Box<db::DbReader>),
}

impl AsyncRead for BlobReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().0 {
            Reader::File(f) => Pin::new(f).poll_read(cx, buf),
            Reader::Db(r) => Pin::new(r.as_mut()).poll_read(cx, buf),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use sha2::{Digest as _, Sha256};

    use super::*;

    pub(crate) fn chunks(
        parts: &[&'static [u8]],
    ) -> impl futures::Stream<Item = Result<bytes::Bytes, String>> + Unpin + use<> {
        futures::stream::iter(
            parts
                .iter()
                .map(|p| Ok(bytes::Bytes::from_static(p)))
                .collect::<Vec<_>>(),
        )
    }

    /// `n` bytes that are not a repeating pattern of any chunk length.
    fn varied(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| ((i as u64).wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    }

    /// `bytes` as a body of `part`-byte pieces.
    fn body(
        bytes: &[u8],
        part: usize,
    ) -> impl futures::Stream<Item = Result<bytes::Bytes, String>> + Unpin + use<> {
        futures::stream::iter(
            bytes
                .chunks(part.max(1))
                .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
                .collect::<Vec<_>>(),
        )
    }

    async fn db_store() -> (tempfile::TempDir, Store, BlobStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(None, dir.path()).await.unwrap();
        let blobs = BlobStore::open_db(&store);
        (dir, store, blobs)
    }

    async fn count(store: &Store, sql: &str) -> i64 {
        use sqlx::Row as _;
        sqlx::query(sql)
            .fetch_one(store.pool())
            .await
            .unwrap()
            .try_get(0)
            .unwrap()
    }

    #[tokio::test]
    async fn the_backend_follows_the_setting_then_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(None, dir.path()).await.unwrap();
        let mut config =
            WorkspaceConfig::new(dir.path(), url::Url::parse("http://127.0.0.1/").unwrap());
        let blobs = BlobStore::open(&config, &store).await.unwrap();
        assert_eq!(blobs.backend(), BlobBackend::Dir, "SQLite: the folder");
        let before = blobs.put(b"written to the folder").await.unwrap();
        config.blob_store = Some(BlobBackend::Db);
        let blobs = BlobStore::open(&config, &store).await.unwrap();
        assert_eq!(blobs.backend(), BlobBackend::Db);
        // What the folder holds stays readable; new bytes go to the table.
        assert_eq!(blobs.read(&before).await.unwrap(), b"written to the folder");
        let after = blobs.put(b"written to the table").await.unwrap();
        assert_eq!(count(&store, "SELECT COUNT(*) FROM blobs").await, 1);
        assert!(!dir.path().join("blobs").join(&after[..2]).exists());
        assert_eq!(blobs.read(&after).await.unwrap(), b"written to the table");
        // Without a folder from before, none is made.
        let empty = tempfile::tempdir().unwrap();
        config.data_dir = empty.path().to_path_buf();
        BlobStore::open(&config, &store).await.unwrap();
        assert!(!empty.path().join("blobs").exists());
        assert_eq!("db".parse::<BlobBackend>(), Ok(BlobBackend::Db));
        assert_eq!("dir".parse::<BlobBackend>(), Ok(BlobBackend::Dir));
        assert!("s3".parse::<BlobBackend>().is_err());
    }

    #[tokio::test]
    async fn db_blobs_round_trip_byte_exact_across_chunk_edges() {
        let (_dir, store, blobs) = db_store().await;
        let sizes = [
            0,
            1,
            db::CHUNK - 1,
            db::CHUNK,
            db::CHUNK + 1,
            3 * db::CHUNK + 7,
        ];
        for (i, size) in sizes.into_iter().enumerate() {
            let bytes = varied(size);
            let want = hex::encode(Sha256::digest(&bytes));
            // Pieces that straddle chunk edges, and the whole in one piece.
            let (sha, stored) = blobs
                .put_stream(body(&bytes, 100_003 + i), size)
                .await
                .unwrap();
            assert_eq!((sha.as_str(), stored), (want.as_str(), size as u64));
            assert!(blobs.read(&sha).await.unwrap() == bytes, "size {size}");
            assert_eq!(blobs.put(&bytes).await.unwrap(), want);
            // Read with a small buffer: the same bytes.
            use tokio::io::AsyncReadExt as _;
            let mut r = blobs.open_blob(&sha).await.unwrap();
            let (mut back, mut buf) = (Vec::new(), [0u8; 777]);
            loop {
                let n = r.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                back.extend_from_slice(&buf[..n]);
            }
            assert!(back == bytes, "size {size}, small reads");
        }
        assert_eq!(
            count(&store, "SELECT COUNT(*) FROM blobs").await,
            sizes.len() as i64
        );
        // Chunks: 0 + 1 + 1 + 1 + 2 + 4; no upload left behind.
        assert_eq!(count(&store, "SELECT COUNT(*) FROM blob_chunks").await, 9);
        assert_eq!(
            count(&store, "SELECT COUNT(*) FROM blobs WHERE complete = 0").await,
            0
        );
        // `put` of new bytes.
        let fresh = varied(2 * db::CHUNK + 3);
        let sha = blobs.put(&fresh[..]).await.unwrap();
        assert!(blobs.read(&sha).await.unwrap() == fresh);
    }

    #[tokio::test]
    async fn a_refused_db_upload_leaves_no_row() {
        let (_dir, store, blobs) = db_store().await;
        let bytes = varied(2 * db::CHUNK + 1);
        let err = blobs
            .put_stream(body(&bytes, 65_536), 2 * db::CHUNK)
            .await
            .unwrap_err();
        assert!(
            matches!(err, WorkspaceError::BodyTooLarge { .. }),
            "{err:?}"
        );
        let broken = futures::stream::iter(vec![
            Ok(bytes::Bytes::from(varied(db::CHUNK + 5))),
            Err("connection reset".to_owned()),
        ]);
        assert!(blobs.put_stream(broken, usize::MAX).await.is_err());
        assert_eq!(count(&store, "SELECT COUNT(*) FROM blobs").await, 0);
        assert_eq!(count(&store, "SELECT COUNT(*) FROM blob_chunks").await, 0);
        let missing = hex::encode(Sha256::digest(&bytes));
        assert!(blobs.open_blob(&missing).await.is_err());
    }

    #[tokio::test]
    async fn concurrent_db_puts_of_the_same_bytes_store_one_blob() {
        let (_dir, store, blobs) = db_store().await;
        let bytes = varied(2 * db::CHUNK + 9);
        let (a, b) = tokio::join!(
            blobs.put_stream(body(&bytes, 300_000), usize::MAX),
            blobs.put_stream(body(&bytes, 500_000), usize::MAX),
        );
        assert_eq!(a.unwrap(), b.unwrap());
        assert_eq!(count(&store, "SELECT COUNT(*) FROM blobs").await, 1);
        assert_eq!(count(&store, "SELECT COUNT(*) FROM blob_chunks").await, 3);
        let sha = hex::encode(Sha256::digest(&bytes));
        assert!(blobs.read(&sha).await.unwrap() == bytes);
    }

    #[tokio::test]
    async fn a_db_blob_that_does_not_match_its_hash_fails_to_read() {
        let (_dir, store, blobs) = db_store().await;
        let bytes = varied(db::CHUNK + 10);
        let (sha, _) = blobs
            .put_stream(body(&bytes, db::CHUNK), usize::MAX)
            .await
            .unwrap();
        assert!(blobs.read(&sha).await.unwrap() == bytes, "positive control");
        let mut tampered = varied(10);
        tampered[0] ^= 1;
        sqlx::query("UPDATE blob_chunks SET data = $1 WHERE sha256 = $2 AND idx = 1")
            .bind(tampered)
            .bind(&sha)
            .execute(store.pool())
            .await
            .unwrap();
        let err = blobs.read(&sha).await.unwrap_err();
        assert!(err.to_string().contains("reads back as"), "{err}");
        // A missing chunk.
        sqlx::query("DELETE FROM blob_chunks WHERE sha256 = $1 AND idx = 1")
            .bind(&sha)
            .execute(store.pool())
            .await
            .unwrap();
        assert!(blobs.read(&sha).await.is_err());
    }

    #[tokio::test]
    async fn a_sweep_removes_uploads_a_dead_node_left() {
        let (_dir, store, blobs) = db_store().await;
        // (This put starts the node's own background sweep, of uploads a
        // day old: it must not be what removes the one below.)
        let kept = blobs.put(b"kept").await.unwrap();
        // What a node that died mid-upload leaves: a row and a chunk.
        let began = i64::try_from(asbx_protocol::now_ms()).unwrap() - 1000;
        sqlx::query(
            "INSERT INTO blobs (sha256, size, complete, created_at) VALUES ('upload-x', 0, 0, $1)",
        )
        .bind(began)
        .execute(store.pool())
        .await
        .unwrap();
        sqlx::query("INSERT INTO blob_chunks (sha256, idx, data) VALUES ('upload-x', 0, $1)")
            .bind(b"half".to_vec())
            .execute(store.pool())
            .await
            .unwrap();
        let Inner::Db(d, _) = &blobs.inner else {
            panic!("a db store")
        };
        assert_eq!(d.sweep(began).await.unwrap(), 0, "not older than the cut");
        assert_eq!(d.sweep(began + 1).await.unwrap(), 1);
        assert_eq!(count(&store, "SELECT COUNT(*) FROM blobs").await, 1);
        assert_eq!(count(&store, "SELECT COUNT(*) FROM blob_chunks").await, 1);
        assert_eq!(blobs.read(&kept).await.unwrap(), b"kept");
    }
}
