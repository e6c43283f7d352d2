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
//!
//! Freeing: a blob is freed when no live file row refers to it
//! ([`BlobStore::free`], right after a file or a chat is deleted, and
//! [`BlobStore::sweep`], at start, hourly and by `asbx gc`, for what a crash
//! between the row's deletion and the freeing left). Rows are counted when
//! freeing, not kept as a count: nothing can drift. Between a blob's storing
//! and its file row's insert, the upload *pins* it (a `blob_pins` row,
//! written before the bytes are placed, removed by [`BlobStore::release`]
//! once the row is stored): freeing skips a pinned blob, so an upload that
//! reuses the bytes of a blob being freed either finds it gone and stores
//! its own copy, or keeps it. A pin a crashed upload left counts for
//! [`PIN_TTL_MS`], then the sweep frees its blob. Each backend's module says
//! how its freeing and storing meet.

mod db;
mod dir;
mod pins;

use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};

use sqlx::AnyPool;
use tokio::io::{AsyncRead, ReadBuf};

use crate::config::{BlobBackend, WorkspaceConfig};
use crate::error::WorkspaceError;
use crate::store::{Backend, Store};

/// How long a pin keeps its blob (an upload stores its row long before).
pub(crate) const PIN_TTL_MS: i64 = 60 * 60 * 1000;

/// How often a node sweeps unreferenced blobs.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(60 * 60);

/// How old a temporary file of the blob folder is before a sweep removes it.
const STALE_TMP: std::time::Duration = std::time::Duration::from_secs(24 * 60 * 60);

#[derive(Debug, Clone)]
pub(crate) struct BlobStore {
    inner: Inner,
    /// The database: file rows and pins.
    pool: AnyPool,
}

/// Bytes stored and pinned: [`BlobStore::release`] it once the row that
/// refers to it is stored.
#[derive(Debug)]
#[must_use = "release it once the row that refers to the blob is stored"]
pub(crate) struct Stored {
    pub(crate) sha256: String,
    pub(crate) size: u64,
    pin: String,
}

/// The wall clock (pins are housekeeping, not protocol expiries).
fn now_ms() -> i64 {
    i64::try_from(asbx_protocol::now_ms()).unwrap_or(i64::MAX)
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
            BlobBackend::Dir => BlobStore::open_dir(config.data_dir.join("blobs"), store).await,
            BlobBackend::Db => {
                // Files this node kept in its folder before: still readable.
                let folder = config.data_dir.join("blobs");
                let earlier = match tokio::fs::try_exists(&folder).await {
                    Ok(true) => Some(dir::DirBlobs::open(folder).await?),
                    Ok(false) | Err(_) => None,
                };
                Ok(BlobStore {
                    inner: Inner::Db(db::DbBlobs::new(store.pool().clone()), earlier),
                    pool: store.pool().clone(),
                })
            }
        }
    }

    /// The blob folder `root` (created if missing), its file rows and pins
    /// in `store`.
    pub(crate) async fn open_dir(
        root: PathBuf,
        store: &Store,
    ) -> Result<BlobStore, WorkspaceError> {
        Ok(BlobStore {
            inner: Inner::Dir(dir::DirBlobs::open(root).await?),
            pool: store.pool().clone(),
        })
    }

    /// Blobs in `store`'s database alone.
    #[cfg(test)]
    pub(crate) fn open_db(store: &Store) -> BlobStore {
        BlobStore {
            inner: Inner::Db(db::DbBlobs::new(store.pool().clone()), None),
            pool: store.pool().clone(),
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

    /// Stores `bytes`, pinned.
    pub(crate) async fn put(&self, bytes: &[u8]) -> Result<Stored, WorkspaceError> {
        use sha2::Digest as _;
        let sha = hex::encode(sha2::Sha256::digest(bytes));
        let pin = crate::tokens::random_id();
        match &self.inner {
            Inner::Dir(d) => {
                let tmp = d.write_tmp(bytes).await?;
                self.pin_and_place(d, &tmp, &sha, &pin).await?;
            }
            Inner::Db(d, _) => {
                if !d.pin_stored(&sha, &pin).await? {
                    // One chunk copied at a time.
                    let parts = futures::stream::iter(bytes.chunks(db::CHUNK).map(|c| {
                        Ok::<_, std::convert::Infallible>(bytes::Bytes::copy_from_slice(c))
                    }));
                    d.put_stream(parts, usize::MAX, &pin).await?;
                }
            }
        }
        Ok(Stored {
            sha256: sha,
            size: bytes.len() as u64,
            pin,
        })
    }

    /// Pins the blob `sha`, then renames `tmp` to it.
    async fn pin_and_place(
        &self,
        d: &dir::DirBlobs,
        tmp: &std::path::Path,
        sha: &str,
        pin: &str,
    ) -> Result<(), WorkspaceError> {
        if let Err(e) = pins::insert(&self.pool, pin, sha).await {
            let _ = tokio::fs::remove_file(tmp).await;
            return Err(e);
        }
        d.place(tmp, sha).await
    }

    /// Unpins what an upload stored, its row now stored (or not to be):
    /// the blob is freed with the last row that refers to it. A failure is
    /// logged: the pin expires.
    pub(crate) async fn release(&self, stored: Stored) {
        if let Err(e) = pins::release(&self.pool, &stored.pin).await {
            tracing::warn!(error = %e, sha256 = %stored.sha256, "could not unpin a blob; its pin expires");
        }
    }

    /// The pin of a blob a turn's working directory sent (`session_id`).
    pub(crate) fn workdir_pin(session_id: &str) -> String {
        format!("wd:{session_id}:{}", crate::tokens::random_id())
    }

    /// Unpins every blob a turn's working directory sent, its snapshot row
    /// now stored (or refused). A failure is logged: the pins expire.
    pub(crate) async fn release_workdir(&self, session_id: &str) {
        if let Err(e) = pins::release_workdir(&self.pool, session_id).await {
            tracing::warn!(error = %e, session = %session_id, "could not unpin a working directory's blobs; their pins expire");
        }
    }

    /// Frees the blob `sha` unless a live file row or a pin refers to it;
    /// whether it was freed.
    pub(crate) async fn free(&self, sha: &str) -> Result<bool, WorkspaceError> {
        let since = now_ms().saturating_sub(PIN_TTL_MS);
        match &self.inner {
            Inner::Dir(d) => self.free_in_dir(d, sha, since).await,
            Inner::Db(d, earlier) => {
                let in_db = d.free(sha, since).await?;
                let in_dir = match earlier {
                    Some(folder) => self.free_in_dir(folder, sha, since).await?,
                    None => false,
                };
                Ok(in_db || in_dir)
            }
        }
    }

    /// Frees each of `shas` nothing refers to; how many were freed. A
    /// failure is logged (the sweep frees it later).
    pub(crate) async fn free_all(&self, shas: impl IntoIterator<Item = String>) -> u64 {
        let mut freed = 0;
        for sha in shas {
            match self.free(&sha).await {
                Ok(true) => freed += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, sha256 = %sha, "could not free a blob; a sweep will")
                }
            }
        }
        freed
    }

    /// Moves the blob aside, checks that nothing refers to it (a pin an
    /// upload wrote before placing a fresh copy included), then removes
    /// it, or puts it back.
    async fn free_in_dir(
        &self,
        d: &dir::DirBlobs,
        sha: &str,
        since: i64,
    ) -> Result<bool, WorkspaceError> {
        if pins::referenced(&self.pool, sha, since).await? {
            return Ok(false);
        }
        let Some(aside) = d.take(sha).await? else {
            return Ok(false);
        };
        match pins::referenced(&self.pool, sha, since).await {
            Ok(false) => {
                tokio::fs::remove_file(&aside)
                    .await
                    .map_err(|e| WorkspaceError::io(&aside, e))?;
                Ok(true)
            }
            Ok(true) => d.restore(&aside, sha).await.map(|()| false),
            Err(e) => {
                d.restore(&aside, sha).await?;
                Err(e)
            }
        }
    }

    /// Frees every blob nothing refers to, removes expired pins and what
    /// crashed uploads left; how many blobs were freed.
    pub(crate) async fn sweep(&self) -> Result<u64, WorkspaceError> {
        let since = now_ms().saturating_sub(PIN_TTL_MS);
        pins::prune(&self.pool, since).await?;
        let candidates = match &self.inner {
            Inner::Dir(d) => d.list(STALE_TMP).await?,
            Inner::Db(d, earlier) => {
                d.sweep(now_ms().saturating_sub(STALE_TMP.as_millis() as i64))
                    .await?;
                let mut all = d.unreferenced().await?;
                if let Some(folder) = earlier {
                    all.extend(folder.list(STALE_TMP).await?);
                }
                all
            }
        };
        let referenced = pins::live_files(&self.pool).await?;
        Ok(self
            .free_all(candidates.into_iter().filter(|s| !referenced.contains(s)))
            .await)
    }

    /// Sweeps now and then every hour, in the background, for as long as
    /// the runtime runs.
    pub(crate) fn start_sweeper(&self) {
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                match this.sweep().await {
                    Ok(0) => {}
                    Ok(freed) => tracing::info!(freed, "freed blobs no file refers to"),
                    Err(e) => tracing::warn!(error = %e, "sweeping blobs failed"),
                }
                tokio::time::sleep(SWEEP_EVERY).await;
            }
        });
    }

    /// Stores a body as it arrives, hashing while it is written, without
    /// holding it in memory: at most `limit` bytes, else
    /// [`WorkspaceError::BodyTooLarge`] and nothing is kept. Pinned.
    pub(crate) async fn put_stream<S, E>(
        &self,
        body: S,
        limit: usize,
    ) -> Result<Stored, WorkspaceError>
    where
        S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        self.put_stream_as(body, limit, crate::tokens::random_id())
            .await
    }

    /// [`BlobStore::put_stream`], pinned as `pin` (a working directory's
    /// blobs are unpinned together, [`BlobStore::release_workdir`]).
    pub(crate) async fn put_stream_as<S, E>(
        &self,
        body: S,
        limit: usize,
        pin: String,
    ) -> Result<Stored, WorkspaceError>
    where
        S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let (sha256, size) = match &self.inner {
            Inner::Dir(d) => {
                let (sha, size, tmp) = d.put_stream(body, limit).await?;
                self.pin_and_place(d, &tmp, &sha, &pin).await?;
                (sha, size)
            }
            Inner::Db(d, _) => d.put_stream(body, limit, &pin).await?,
        };
        Ok(Stored { sha256, size, pin })
    }

    /// Whether the blob `sha` (checked by the caller) is stored.
    pub(crate) async fn has(&self, sha: &str) -> Result<bool, WorkspaceError> {
        Ok(match &self.inner {
            Inner::Dir(d) => d.has(sha).await,
            Inner::Db(d, earlier) => {
                d.has(sha).await? || matches!(earlier, Some(f) if f.has(sha).await)
            }
        })
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

    /// Stores and releases `bytes` (as an upload whose row is stored).
    pub(crate) async fn put(blobs: &BlobStore, bytes: &[u8]) -> Result<String, WorkspaceError> {
        let stored = blobs.put(bytes).await?;
        let sha = stored.sha256.clone();
        blobs.release(stored).await;
        Ok(sha)
    }

    /// Stores and releases a body: its SHA-256 and size.
    pub(crate) async fn put_stream<S, E>(
        blobs: &BlobStore,
        body: S,
        limit: usize,
    ) -> Result<(String, u64), WorkspaceError>
    where
        S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let stored = blobs.put_stream(body, limit).await?;
        let out = (stored.sha256.clone(), stored.size);
        blobs.release(stored).await;
        Ok(out)
    }

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
        let before = put(&blobs, b"written to the folder").await.unwrap();
        config.blob_store = Some(BlobBackend::Db);
        let blobs = BlobStore::open(&config, &store).await.unwrap();
        assert_eq!(blobs.backend(), BlobBackend::Db);
        // What the folder holds stays readable; new bytes go to the table.
        assert_eq!(blobs.read(&before).await.unwrap(), b"written to the folder");
        let after = put(&blobs, b"written to the table").await.unwrap();
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
            let (sha, stored) = put_stream(&blobs, body(&bytes, 100_003 + i), size)
                .await
                .unwrap();
            assert_eq!((sha.as_str(), stored), (want.as_str(), size as u64));
            assert!(blobs.read(&sha).await.unwrap() == bytes, "size {size}");
            assert_eq!(put(&blobs, &bytes).await.unwrap(), want);
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
        let sha = put(&blobs, &fresh[..]).await.unwrap();
        assert!(blobs.read(&sha).await.unwrap() == fresh);
    }

    #[tokio::test]
    async fn a_refused_db_upload_leaves_no_row() {
        let (_dir, store, blobs) = db_store().await;
        let bytes = varied(2 * db::CHUNK + 1);
        let err = put_stream(&blobs, body(&bytes, 65_536), 2 * db::CHUNK)
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
        assert!(put_stream(&blobs, broken, usize::MAX).await.is_err());
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
            put_stream(&blobs, body(&bytes, 300_000), usize::MAX),
            put_stream(&blobs, body(&bytes, 500_000), usize::MAX),
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
        let (sha, _) = put_stream(&blobs, body(&bytes, db::CHUNK), usize::MAX)
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
        let kept = put(&blobs, b"kept").await.unwrap();
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

    async fn exec(store: &Store, sql: &str) {
        sqlx::query(sql).execute(store.pool()).await.unwrap();
    }

    /// A blob is freed only when no live file row and no fresh pin refers
    /// to it; freed, the same bytes can be stored again.
    #[tokio::test]
    async fn a_pinned_or_referenced_blob_is_not_freed() {
        for backend in [BlobBackend::Dir, BlobBackend::Db] {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(None, dir.path()).await.unwrap();
            let blobs = match backend {
                BlobBackend::Dir => BlobStore::open_dir(dir.path().join("blobs"), &store)
                    .await
                    .unwrap(),
                BlobBackend::Db => BlobStore::open_db(&store),
            };
            let stored = blobs.put(b"bytes").await.unwrap();
            let sha = stored.sha256.clone();
            assert!(
                !blobs.free(&sha).await.unwrap(),
                "{backend:?}: pinned by its upload"
            );
            exec(
                &store,
                &format!(
                    "INSERT INTO files (id, workspace_id, origin, path, mime_type, size, sha256, \
                     created_at) VALUES ('f', 'default', 'upload', 'p', 't', 5, '{sha}', 1)"
                ),
            )
            .await;
            blobs.release(stored).await;
            assert!(
                !blobs.free(&sha).await.unwrap(),
                "{backend:?}: a file refers to it"
            );
            assert_eq!(blobs.read(&sha).await.unwrap(), b"bytes");
            exec(&store, "UPDATE files SET deleted_at = 1").await;
            assert!(
                blobs.free(&sha).await.unwrap(),
                "{backend:?}: nothing refers to it"
            );
            assert!(blobs.open_blob(&sha).await.is_err());
            assert!(
                !blobs.free(&sha).await.unwrap(),
                "{backend:?}: already freed"
            );
            // Stored again after.
            assert_eq!(put(&blobs, b"bytes").await.unwrap(), sha);
            assert_eq!(blobs.read(&sha).await.unwrap(), b"bytes");
            // A pin a crashed upload left expires; the sweep frees its blob.
            let crashed = blobs.put(b"left behind").await.unwrap();
            exec(&store, "UPDATE blob_pins SET created_at = 0").await;
            assert_eq!(blobs.sweep().await.unwrap(), 2, "{backend:?}");
            assert!(blobs.open_blob(&crashed.sha256).await.is_err());
            blobs.release(crashed).await;
            assert_eq!(count(&store, "SELECT COUNT(*) FROM blob_pins").await, 0);
        }
    }
}
