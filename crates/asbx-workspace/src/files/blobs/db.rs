//! Blobs in the database (`ASBX_BLOB_STORE=db`): every workspace node
//! sharing the database serves every file.
//!
//! Tables (`migrations/0007_blobs.sql`): `blobs(sha256, size, complete,
//! created_at)` and `blob_chunks(sha256, idx, data)`, 1 MiB a chunk.
//!
//! Writing streams: an upload is a row `complete` = 0 under a temporary
//! name; each full chunk is inserted under that name as it arrives, while
//! the bytes are hashed, so at most one chunk is held in memory. Then one
//! transaction publishes it: `INSERT` of the final row (`ON CONFLICT DO
//! NOTHING`), and if that inserted it, the chunks are renamed to the final
//! hash, else (the same bytes are already there, or another node is
//! publishing them right now and PostgreSQL made this one wait for it) they
//! are deleted. Either way the temporary row goes. So a reader sees a blob
//! whole or not at all, two nodes writing the same bytes both succeed with
//! one blob stored, and a refused upload (too large, broken off) leaves
//! nothing: its rows are deleted, or, if the node died first, removed by
//! the next sweep of uploads left incomplete for a day.
//!
//! Reading streams too: [`DbReader`] fetches one chunk at a time.
//!
//! Freeing ([`DbBlobs::free`]) and publishing meet on the blob's row:
//! each begins by updating it (a lock on PostgreSQL; SQLite has one writer
//! at a time). Publishing pins the blob (`super::pins`) in the transaction
//! that finds or inserts it; freeing checks, after it holds the row, in a
//! statement of its own (so it sees what committed before), that no live
//! file and no fresh pin refers to it. So a blob is freed either before an
//! upload finds it (which then stores its own bytes) or not at all.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes, BytesMut};
use futures::future::BoxFuture;
use sha2::{Digest, Sha256};
use sqlx::{AnyPool, Row as _};
use tokio::io::{AsyncRead, ReadBuf};

use crate::error::WorkspaceError;

/// The size of every chunk but a blob's last.
pub(super) const CHUNK: usize = 1024 * 1024;

/// How old an incomplete upload is before a sweep removes it.
const STALE_UPLOAD_MS: i64 = 24 * 60 * 60 * 1000;

/// How often a node sweeps (at most; on the first upload after that).
const SWEEP_EVERY_MS: i64 = 60 * 60 * 1000;

#[derive(Debug, Clone)]
pub(super) struct DbBlobs {
    pool: AnyPool,
    /// When this node last swept stale uploads (epoch ms; 0: never).
    last_sweep: Arc<AtomicI64>,
}

/// The wall clock: stale-upload housekeeping is not a protocol expiry, so
/// it does not follow the workspace's (injectable) clock.
fn now_ms() -> i64 {
    i64::try_from(asbx_protocol::now_ms()).unwrap_or(i64::MAX)
}

impl DbBlobs {
    pub(super) fn new(pool: AnyPool) -> DbBlobs {
        DbBlobs {
            pool,
            last_sweep: Arc::new(AtomicI64::new(0)),
        }
    }

    async fn size_of(&self, sha: &str) -> Result<Option<u64>, WorkspaceError> {
        let row = sqlx::query("SELECT size FROM blobs WHERE sha256 = $1 AND complete = 1")
            .bind(sha)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            None => Ok(None),
            Some(row) => {
                let size: i64 = row.try_get(0)?;
                u64::try_from(size)
                    .map(Some)
                    .map_err(|_| WorkspaceError::Corrupt(format!("blob {sha} has size {size}")))
            }
        }
    }

    /// Stores a body as it arrives (see the module doc): at most `limit`
    /// bytes, else [`WorkspaceError::BodyTooLarge`] and nothing is kept.
    /// Returns the SHA-256 (hex) and the size.
    pub(super) async fn put_stream<S, E>(
        &self,
        body: S,
        limit: usize,
        pin: &str,
    ) -> Result<(String, u64), WorkspaceError>
    where
        S: futures::Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        self.maybe_sweep();
        let upload = format!("upload-{}", crate::tokens::random_id());
        sqlx::query("INSERT INTO blobs (sha256, size, complete, created_at) VALUES ($1, 0, 0, $2)")
            .bind(&upload)
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
        let published = match self.write_chunks(body, &upload, limit).await {
            Ok((sha, size)) => self
                .publish(&upload, &sha, size, pin)
                .await
                .map(|()| (sha, size)),
            Err(e) => Err(e),
        };
        if published.is_err()
            && let Err(e) = self.discard(&upload).await
        {
            // The sweep removes it later.
            tracing::warn!(error = %e, upload, "could not remove a refused upload");
        }
        published
    }

    /// Inserts the body's chunks under `upload`; returns its hash and size.
    async fn write_chunks<S, E>(
        &self,
        mut body: S,
        upload: &str,
        limit: usize,
    ) -> Result<(String, u64), WorkspaceError>
    where
        S: futures::Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        use futures::StreamExt as _;

        let mut hasher = Sha256::new();
        let mut size = 0usize;
        let mut pending = BytesMut::new();
        let mut idx = 0i64;
        while let Some(part) = body.next().await {
            let part =
                part.map_err(|e| WorkspaceError::invalid(format!("could not read the body: {e}")))?;
            size = size.saturating_add(part.len());
            if size > limit {
                return Err(WorkspaceError::BodyTooLarge { limit });
            }
            hasher.update(&part);
            pending.extend_from_slice(&part);
            while pending.len() >= CHUNK {
                let chunk = pending.split_to(CHUNK);
                self.insert_chunk(upload, idx, &chunk).await?;
                idx += 1;
            }
        }
        if !pending.is_empty() {
            self.insert_chunk(upload, idx, &pending).await?;
        }
        Ok((hex::encode(hasher.finalize()), size as u64))
    }

    async fn insert_chunk(
        &self,
        upload: &str,
        idx: i64,
        data: &[u8],
    ) -> Result<(), WorkspaceError> {
        sqlx::query("INSERT INTO blob_chunks (sha256, idx, data) VALUES ($1, $2, $3)")
            .bind(upload)
            .bind(idx)
            .bind(data.to_vec())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Pins the stored blob `sha` as `pin`, in the transaction that finds
    /// it (see the module doc); false when it is not stored.
    pub(super) async fn pin_stored(&self, sha: &str, pin: &str) -> Result<bool, WorkspaceError> {
        let mut tx = crate::store::begin_write(&self.pool).await?;
        if !hold(&mut tx, sha).await? {
            return Ok(false);
        }
        super::pins::insert(&mut *tx, pin, sha).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Makes the chunks of `upload` the blob `sha`, or drops them when it
    /// is already stored, and pins it as `pin`; one transaction.
    async fn publish(
        &self,
        upload: &str,
        sha: &str,
        size: u64,
        pin: &str,
    ) -> Result<(), WorkspaceError> {
        let size = i64::try_from(size)
            .map_err(|_| WorkspaceError::invalid(format!("a body of {size} bytes")))?;
        let mut tx = crate::store::begin_write(&self.pool).await?;
        // The stored row, held (if it is being freed, this waits and finds
        // it gone), else a new one; one another node inserted meanwhile is
        // held next.
        let mut attempts = 0;
        let inserted = loop {
            if hold(&mut tx, sha).await? {
                break false;
            }
            let new = sqlx::query(
                "INSERT INTO blobs (sha256, size, complete, created_at) VALUES ($1, $2, 1, $3) \
                 ON CONFLICT (sha256) DO NOTHING",
            )
            .bind(sha)
            .bind(size)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if new == 1 {
                break true;
            }
            attempts += 1;
            if attempts == 3 {
                return Err(WorkspaceError::Conflict(format!(
                    "blob {sha} is being stored and freed at once: try again"
                )));
            }
        };
        super::pins::insert(&mut *tx, pin, sha).await?;
        if inserted {
            sqlx::query("UPDATE blob_chunks SET sha256 = $1 WHERE sha256 = $2")
                .bind(sha)
                .bind(upload)
                .execute(&mut *tx)
                .await?;
        } else {
            sqlx::query("DELETE FROM blob_chunks WHERE sha256 = $1")
                .bind(upload)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("DELETE FROM blobs WHERE sha256 = $1 AND complete = 0")
            .bind(upload)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Frees the blob `sha` unless a live file or a pin made at or after
    /// `pinned_since` (epoch ms) refers to it; whether it was freed.
    pub(super) async fn free(&self, sha: &str, pinned_since: i64) -> Result<bool, WorkspaceError> {
        let mut tx = crate::store::begin_write(&self.pool).await?;
        if !hold(&mut tx, sha).await?
            || super::pins::referenced(&mut *tx, sha, pinned_since).await?
        {
            return Ok(false);
        }
        sqlx::query("DELETE FROM blob_chunks WHERE sha256 = $1")
            .bind(sha)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM blobs WHERE sha256 = $1")
            .bind(sha)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// The stored blobs no live file refers to (candidates to free).
    pub(super) async fn unreferenced(&self) -> Result<Vec<String>, WorkspaceError> {
        let rows = sqlx::query(
            "SELECT sha256 FROM blobs WHERE complete = 1 AND NOT EXISTS \
             (SELECT 1 FROM files WHERE files.sha256 = blobs.sha256 AND files.deleted_at IS NULL) \
             AND NOT EXISTS (SELECT 1 FROM workdir_blobs w WHERE w.sha256 = blobs.sha256)",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| r.try_get::<String, _>(0).map_err(Into::into))
            .collect()
    }

    /// Removes an upload that will not be published.
    async fn discard(&self, upload: &str) -> Result<(), WorkspaceError> {
        let mut tx = crate::store::begin_write(&self.pool).await?;
        sqlx::query("DELETE FROM blob_chunks WHERE sha256 = $1")
            .bind(upload)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM blobs WHERE sha256 = $1 AND complete = 0")
            .bind(upload)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Removes uploads left incomplete for a day (a node died while
    /// writing); at most once an hour per node, in the background.
    fn maybe_sweep(&self) {
        let now = now_ms();
        let last = self.last_sweep.load(Ordering::Relaxed);
        if now.saturating_sub(last) < SWEEP_EVERY_MS
            || self
                .last_sweep
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = this.sweep(now.saturating_sub(STALE_UPLOAD_MS)).await {
                tracing::warn!(error = %e, "sweeping stale blob uploads failed");
            }
        });
    }

    /// Removes the uploads begun before `before` (epoch ms) and never
    /// published; returns how many.
    pub(super) async fn sweep(&self, before: i64) -> Result<u64, WorkspaceError> {
        let mut tx = crate::store::begin_write(&self.pool).await?;
        sqlx::query(
            "DELETE FROM blob_chunks WHERE sha256 IN \
             (SELECT sha256 FROM blobs WHERE complete = 0 AND created_at < $1)",
        )
        .bind(before)
        .execute(&mut *tx)
        .await?;
        let gone = sqlx::query("DELETE FROM blobs WHERE complete = 0 AND created_at < $1")
            .bind(before)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(gone)
    }

    /// Whether the blob is stored (complete).
    pub(super) async fn has(&self, sha: &str) -> Result<bool, WorkspaceError> {
        Ok(self.size_of(sha).await?.is_some())
    }

    /// Opens a stored blob for reading, chunk by chunk; `None` when it is
    /// not stored.
    pub(super) async fn open_blob(&self, sha: &str) -> Result<Option<DbReader>, WorkspaceError> {
        let Some(size) = self.size_of(sha).await? else {
            return Ok(None);
        };
        Ok(Some(DbReader {
            pool: self.pool.clone(),
            sha: sha.to_owned(),
            chunks: size.div_ceil(CHUNK as u64),
            size,
            next: 0,
            read: 0,
            buf: Bytes::new(),
            fetching: None,
            hasher: Sha256::new(),
        }))
    }
}

/// Holds the stored blob `sha`'s row for the rest of `tx` (a no-op update:
/// a row lock on PostgreSQL, the write lock on SQLite); false when it is
/// not stored.
async fn hold(tx: &mut crate::store::WriteTx, sha: &str) -> Result<bool, WorkspaceError> {
    let held = sqlx::query("UPDATE blobs SET complete = 1 WHERE sha256 = $1 AND complete = 1")
        .bind(sha)
        .execute(&mut **tx)
        .await?;
    Ok(held.rows_affected() == 1)
}

/// A stored blob read one chunk at a time ([`AsyncRead`], so a handler
/// streams it with `ReaderStream`). Every chunk's length is checked, and
/// the SHA-256 at the end: a blob that does not match its name ends the
/// read with an error instead of its last bytes.
pub(super) struct DbReader {
    pool: AnyPool,
    sha: String,
    chunks: u64,
    size: u64,
    /// The next chunk to fetch.
    next: u64,
    /// Bytes fetched so far.
    read: u64,
    /// The rest of the current chunk.
    buf: Bytes,
    fetching: Option<BoxFuture<'static, Result<Vec<u8>, sqlx::Error>>>,
    hasher: Sha256,
}

impl std::fmt::Debug for DbReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbReader")
            .field("sha", &self.sha)
            .field("size", &self.size)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl DbReader {
    fn fetch(&self) -> BoxFuture<'static, Result<Vec<u8>, sqlx::Error>> {
        let (pool, sha, idx) = (self.pool.clone(), self.sha.clone(), self.next);
        Box::pin(async move {
            let idx = i64::try_from(idx).unwrap_or(i64::MAX);
            let row = sqlx::query("SELECT data FROM blob_chunks WHERE sha256 = $1 AND idx = $2")
                .bind(sha)
                .bind(idx)
                .fetch_optional(&pool)
                .await?;
            match row {
                Some(row) => row.try_get::<Vec<u8>, _>(0),
                None => Err(sqlx::Error::RowNotFound),
            }
        })
    }

    /// Takes a fetched chunk in, checking its length (and, after the last,
    /// the hash).
    fn accept(&mut self, data: Vec<u8>) -> std::io::Result<()> {
        let expected = if self.next + 1 == self.chunks {
            self.size - self.read
        } else {
            CHUNK as u64
        };
        if data.len() as u64 != expected {
            return Err(corrupt(format!(
                "blob {} chunk {} has {} bytes, expected {expected}",
                self.sha,
                self.next,
                data.len()
            )));
        }
        self.hasher.update(&data);
        self.read += expected;
        self.next += 1;
        if self.next == self.chunks {
            let got = hex::encode(std::mem::take(&mut self.hasher).finalize());
            if got != self.sha {
                return Err(corrupt(format!("blob {} reads back as {got}", self.sha)));
            }
        }
        self.buf = Bytes::from(data);
        Ok(())
    }
}

fn corrupt(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message)
}

impl AsyncRead for DbReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.buf.is_empty() {
                let n = this.buf.len().min(out.remaining());
                out.put_slice(&this.buf[..n]);
                this.buf.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.next >= this.chunks {
                return Poll::Ready(Ok(())); // the end
            }
            let fetching = match &mut this.fetching {
                Some(f) => f,
                None => this.fetching.insert(this.fetch()),
            };
            let data = match fetching.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(r) => r,
            };
            this.fetching = None;
            let data = data.map_err(|e| {
                std::io::Error::other(format!(
                    "reading blob {} chunk {}: {e}",
                    this.sha, this.next
                ))
            })?;
            this.accept(data)?;
        }
    }
}
