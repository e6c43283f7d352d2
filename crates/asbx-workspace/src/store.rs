//! Storage: one [`Store`] (the pool and the migrations) over SQLite
//! (default) or PostgreSQL. Each feature keeps its own queries in its
//! `store` module.
//!
//! Why `sqlx::Any` and one migration folder: the schema uses only `TEXT` and
//! `BIGINT` columns (times are epoch milliseconds, JSON is text, no booleans,
//! no autoincrement), and `BYTEA` for blob chunks (PostgreSQL's type; SQLite
//! keeps a blob in a column of any type), and every query is a runtime `sqlx::query` with `$N`
//! placeholders, which both SQLite and PostgreSQL accept. So one set of
//! migrations and one set of queries serve both databases, and the tests run
//! the very same code on each. If a dialect ever needs its own DDL, split
//! `migrations/` into `migrations/sqlite` and `migrations/postgres` and pick
//! the migrator by [`Backend`].
//!
//! Atomicity rules: everything that must happen at most once (token
//! redemption, lease acquisition) is a single conditional `UPDATE`/`INSERT`
//! whose `rows_affected` decides, never a read followed by a write.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::migrate::Migrator;
use sqlx::{AnyPool, ConnectOptions as _};

use crate::error::WorkspaceError;

static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// Which database a [`Store`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// The database `conn` (or a transaction on it) talks to.
    pub(crate) fn of(conn: &sqlx::AnyConnection) -> Backend {
        match conn.backend_name() {
            "SQLite" => Backend::Sqlite,
            _ => Backend::Postgres,
        }
    }
}

/// Appends the `VALUES` tuples of a multi-row `INSERT` of `rows` rows of
/// `cols` columns to `sql`. On SQLite the parameters are anonymous (`?`):
/// binding a named one (`$n`) makes sqlx ask SQLite for each parameter's
/// name, a walk of the statement's parameter list, so a 1,500-parameter
/// statement cost about a million string compares (38% of the relay's
/// profile). PostgreSQL takes only `$n`.
pub(crate) fn push_values(sql: &mut String, backend: Backend, rows: usize, cols: usize) {
    use std::fmt::Write as _;
    for r in 0..rows {
        sql.push_str(if r == 0 { "(" } else { ", (" });
        for c in 0..cols {
            if c > 0 {
                sql.push_str(", ");
            }
            if backend == Backend::Sqlite {
                sql.push('?');
            } else {
                let _ = write!(sql, "${}", r * cols + c + 1);
            }
        }
        sql.push(')');
    }
}

/// Whether `url` names a PostgreSQL database.
pub(crate) fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres:") || url.starts_with("postgresql:")
}

/// A transaction that writes ([`begin_write`]): the transaction (it derefs
/// to its connection, as `sqlx::Transaction` does), and on SQLite this
/// process's turn at the database's one write lock.
pub(crate) struct WriteTx {
    tx: sqlx::Transaction<'static, sqlx::Any>,
    _turn: Option<tokio::sync::OwnedMutexGuard<()>>,
    /// Where and when it began: a transaction holding SQLite's one write
    /// lock for long stalls every other writer, so it is named in the log.
    _begun: Begun,
}

/// When and where a [`WriteTx`] began; logged when it was open long.
struct Begun(std::time::Instant, &'static std::panic::Location<'static>);

/// A write transaction open longer than this is logged where it began.
const SLOW_WRITE: std::time::Duration = std::time::Duration::from_secs(1);

impl Drop for Begun {
    fn drop(&mut self) {
        let held = self.0.elapsed();
        if held > SLOW_WRITE {
            tracing::warn!(at = %self.1, ?held, "a write transaction was open long");
        }
    }
}

impl WriteTx {
    pub(crate) async fn commit(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }

    pub(crate) async fn rollback(self) -> Result<(), sqlx::Error> {
        self.tx.rollback().await
    }
}

impl std::ops::Deref for WriteTx {
    type Target = sqlx::AnyConnection;
    fn deref(&self) -> &sqlx::AnyConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut sqlx::AnyConnection {
        &mut self.tx
    }
}

/// How long a writer waits for its turn in this process's queue.
const WRITER_TURN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Each SQLite database's queue of this process's writers, by URL.
static SQLITE_WRITERS: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
> = std::sync::LazyLock::new(Default::default);

/// Begins a transaction that writes. On SQLite:
///
/// - It is `BEGIN IMMEDIATE`: the write lock is taken at the start, because a
///   deferred transaction that has read cannot upgrade its snapshot once
///   another connection committed, and SQLite fails its first write at once
///   with `SQLITE_BUSY` (no busy timeout applies).
/// - This process's writers queue for their turn (a fair async mutex, woken
///   when the last writer is done) *before* they take a pooled connection.
///   Waiting inside `BEGIN IMMEDIATE` instead holds a connection in SQLite's
///   busy handler (which sleeps and polls): a few such waiters took every
///   connection of the pool from the writer holding the lock, which needed
///   one more to finish, until the busy timeout failed them all (`500`
///   after 5 s). Another process on the same file still waits in the busy
///   handler.
///
/// PostgreSQL: `BEGIN`; its row locks order writers.
#[track_caller]
pub(crate) fn begin_write(
    pool: &AnyPool,
) -> impl std::future::Future<Output = Result<WriteTx, sqlx::Error>> + Send + '_ {
    let at = std::panic::Location::caller();
    // In a task of its own, so that it is never given up half-way: a
    // handler's future is dropped when its client goes away, and sqlx's
    // `begin_with` dropped after SQLite's `BEGIN` ran (while it checks the
    // transaction began) leaves the connection in a transaction nobody owns,
    // holding SQLite's write lock for ever. A task runs to its end; a
    // transaction nobody awaits any more is dropped there, rolled back.
    let task = tokio::spawn(begin_write_at(pool.clone(), at));
    async move {
        match task.await {
            Ok(begun) => begun,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(sqlx::Error::PoolClosed),
        }
    }
}

async fn begin_write_at(
    pool: AnyPool,
    at: &'static std::panic::Location<'static>,
) -> Result<WriteTx, sqlx::Error> {
    let url = &pool.connect_options().database_url;
    if url.scheme() != "sqlite" {
        return Ok(WriteTx {
            tx: pool.begin().await?,
            _turn: None,
            _begun: Begun(std::time::Instant::now(), at),
        });
    }
    let queue = {
        let mut writers = SQLITE_WRITERS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(writers.entry(url.as_str().to_owned()).or_default())
    };
    // Bounded: a writer that began another write transaction while it
    // held one would otherwise wait for itself for ever; past the wait it
    // goes on without its turn, to SQLite's busy handler, as before.
    let turn = tokio::time::timeout(WRITER_TURN_WAIT, queue.lock_owned()).await;
    if turn.is_err() {
        tracing::warn!(
            "no turn at the SQLite write lock within {WRITER_TURN_WAIT:?}; waiting in SQLite's busy handler"
        );
    }
    let tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    Ok(WriteTx {
        tx,
        _turn: turn.ok(),
        _begun: Begun(std::time::Instant::now(), at),
    })
}

/// A connection pool with the schema migrated.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    pool: AnyPool,
    /// PostgreSQL's URL, for the node's `LISTEN` connection
    /// ([`crate::notify`]); `None` on SQLite.
    listen_url: Option<String>,
    backend: Backend,
}

impl Store {
    /// Connects to `database_url` (default: `sqlite://{data_dir}/asbx.db`,
    /// created if missing) and runs the migrations.
    pub(crate) async fn open(
        database_url: Option<&str>,
        data_dir: &Path,
    ) -> Result<Store, WorkspaceError> {
        sqlx::any::install_default_drivers();
        let url = match database_url {
            Some(url) => url.to_owned(),
            None => format!("sqlite://{}", data_dir.join("asbx.db").display()),
        };
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if is_postgres_url(&url) {
            Backend::Postgres
        } else {
            return Err(WorkspaceError::Config(
                "database URL must start with sqlite: or postgres:".to_owned(),
            ));
        };
        if backend == Backend::Sqlite {
            private_sqlite_files(&url)?;
        }
        let url = match backend {
            Backend::Sqlite if !url.contains("mode=") => {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}mode=rwc")
            }
            Backend::Sqlite | Backend::Postgres => url,
        };
        let options = AnyConnectOptions::from_str(&url)
            .map_err(|e| WorkspaceError::Config(format!("bad database URL: {e}")))?
            // Each statement with its time and rows at `trace`
            // (`ASBX_LOG=info,sqlx::query=trace`: how docs/performance.md
            // counts a turn's statements); filtered out by the log's level
            // before anything is formatted otherwise.
            .log_statements(tracing::log::LevelFilter::Trace)
            .log_slow_statements(tracing::log::LevelFilter::Off, std::time::Duration::MAX);
        let max = match backend {
            // SQLite has one writer at a time; a few connections are plenty.
            Backend::Sqlite => 4,
            Backend::Postgres => 16,
        };
        let mut pool_options = AnyPoolOptions::new().max_connections(max);
        if backend == Backend::Sqlite {
            // Per connection (SQLite keeps it per connection, sqlx's default
            // is FULL): in WAL mode, NORMAL syncs the WAL only at checkpoints,
            // not at every commit. A commit is in the WAL file (the OS page
            // cache) before the call returns, so it survives the death of any
            // process; only an OS crash or power loss can take back the last
            // commits before a checkpoint. FULL cost one fsync per
            // transaction, about 14 on a chat turn's path (see
            // docs/performance.md).
            //
            // `secure_delete = FAST`: a row's old bytes are zeroed in its
            // page when it is rewritten or deleted (clear-text secrets
            // stored by earlier versions are sealed at start), at no cost
            // in I/O.
            pool_options = pool_options.after_connect(|conn, _meta| {
                Box::pin(async move {
                    sqlx::query("PRAGMA synchronous = NORMAL")
                        .execute(&mut *conn)
                        .await?;
                    sqlx::query("PRAGMA secure_delete = FAST")
                        .execute(&mut *conn)
                        .await?;
                    // A writer waits up to this long for SQLite's one write
                    // lock before `database is locked` (sqlx's default is
                    // 5 s): on a loaded host a statement inside a write
                    // transaction was seen to wait that long in SQLite's
                    // busy handler (the slow-write warning names where),
                    // and every writer behind it was answered `500`.
                    sqlx::query("PRAGMA busy_timeout = 30000")
                        .execute(&mut *conn)
                        .await?;
                    Ok(())
                })
            });
        }
        let pool = pool_options.connect_with(options).await?;
        if backend == Backend::Sqlite {
            // WAL lets readers run beside the writer; it persists in the file.
            sqlx::query("PRAGMA journal_mode = WAL")
                .execute(&pool)
                .await?;
        }
        MIGRATOR.run(&pool).await?;
        let listen_url = (backend == Backend::Postgres).then_some(url);
        Ok(Store {
            pool,
            listen_url,
            backend,
        })
    }

    /// Where a node listens for other nodes' notifications: PostgreSQL's
    /// URL, `None` on SQLite.
    pub(crate) fn listen_url(&self) -> Option<&str> {
        self.listen_url.as_deref()
    }

    /// Which database this is.
    pub(crate) fn backend(&self) -> Backend {
        self.backend
    }

    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// On SQLite, moves the WAL's pages into the database and empties it,
    /// so no older version of a page lingers there (after secrets were
    /// sealed in place); nothing on PostgreSQL.
    pub(crate) async fn checkpoint(&self) -> Result<(), WorkspaceError> {
        if self.backend == Backend::Sqlite {
            sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }
}

/// The SQLite database file of `url` and its `-wal` and `-shm` files, made
/// `0600`: the database is created here, private, before SQLite opens it
/// (SQLite gives a new `-wal` and `-shm` the database's mode), and the
/// files of an earlier version are made private too.
fn private_sqlite_files(url: &str) -> Result<(), WorkspaceError> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let rest = url.trim_start_matches("sqlite:").trim_start_matches("//");
    let path = rest.split('?').next().unwrap_or("");
    if path.is_empty() || path.starts_with(':') || url.contains("mode=memory") {
        return Ok(());
    }
    let db = Path::new(path);
    let io = |p: &Path, e| WorkspaceError::io(p, e);
    if let Err(e) = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(db)
        && e.kind() != std::io::ErrorKind::AlreadyExists
    {
        return Err(io(db, e));
    }
    for suffix in ["", "-wal", "-shm"] {
        let file = PathBuf::from(format!("{path}{suffix}"));
        match std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&file, e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn values_are_anonymous_on_sqlite_and_numbered_on_postgres() {
        let mut sql = String::from("VALUES ");
        push_values(&mut sql, Backend::Sqlite, 2, 3);
        assert_eq!(sql, "VALUES (?, ?, ?), (?, ?, ?)");
        let mut sql = String::new();
        push_values(&mut sql, Backend::Postgres, 2, 2);
        assert_eq!(sql, "($1, $2), ($3, $4)");
        let mut sql = String::new();
        push_values(&mut sql, Backend::Postgres, 0, 2);
        assert_eq!(sql, "");
    }

    /// A `begin_write` given up at any point (a client that went away has
    /// its handler's future dropped) leaves no transaction open: every
    /// writer after it gets the write lock at once. sqlx 0.8.6's
    /// `begin_with` leaves one open on SQLite when dropped while it checks
    /// the transaction began (upstream issue 3932; this test fails at its
    /// first write without the task); PostgreSQL has the like upstream
    /// issue 4385, not hit here, and the same guard.
    async fn a_begin_given_up_at_any_point_leaves_no_transaction_open(store: &Store) {
        sqlx::query("CREATE TABLE t (x BIGINT)")
            .execute(store.pool())
            .await
            .unwrap();
        for i in 0..400u64 {
            let wait = Duration::from_micros(i % 50 * 4);
            let _ = tokio::time::timeout(wait, begin_write(store.pool())).await;
        }
        for n in 0..20 {
            let write = async {
                let mut tx = begin_write(store.pool()).await?;
                sqlx::query("INSERT INTO t VALUES (1)")
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await
            };
            tokio::time::timeout(Duration::from_secs(5), write)
                .await
                .unwrap_or_else(|_| panic!("write {n} waited 5 s for the write lock"))
                .unwrap_or_else(|e| panic!("write {n}: {e}"));
        }
        let (rows,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM t")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(rows, 20, "every committed write is there, and no other");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_begin_given_up_leaves_no_transaction_open_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(None, dir.path()).await.unwrap();
        a_begin_given_up_at_any_point_leaves_no_transaction_open(&store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_begin_given_up_leaves_no_transaction_open_on_postgres() {
        let Some(server) = std::env::var("ASBX_TEST_PG_URL")
            .ok()
            .filter(|u| !u.is_empty())
        else {
            return asbx_test_support::skip(
                "store::tests::..._on_postgres",
                "set ASBX_TEST_PG_URL to run on PostgreSQL",
            );
        };
        sqlx::any::install_default_drivers();
        let name = format!("asbx_store_{}", std::process::id());
        let admin = sqlx::AnyPool::connect(&server).await.unwrap();
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name}"))
            .execute(&admin)
            .await
            .unwrap();
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&admin)
            .await
            .unwrap();
        let mut url = url::Url::parse(&server).unwrap();
        url.set_path(&format!("/{name}"));
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(Some(url.as_str()), dir.path()).await.unwrap();
        a_begin_given_up_at_any_point_leaves_no_transaction_open(&store).await;
        store.pool().close().await;
        sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
            .execute(&admin)
            .await
            .unwrap();
    }
}
