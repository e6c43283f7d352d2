//! `asbx-bench workdir`: a chat's kept working directory (CONTRACT §11),
//! through the runner's own restore and capture code
//! ([`asbx_runner::Workdir`]) against a stand-in for the workspace's
//! `workdir/...` routes that keeps blobs in a folder on disk, as the
//! workspace's `dir` blob store does.
//!
//! A tree of 1,000 files and 50 MB (20 folders) is written to disk. Then,
//! one run each:
//!
//! - full capture: the tree captured with nothing known (every file read
//!   and hashed, every blob sent);
//! - restore: that snapshot written into a fresh tmpfs, beside `cp -a` of
//!   the same tree from the same disk into another fresh tmpfs (goal:
//!   restore <= 2x `cp -a`);
//! - incremental capture: the restored directory with one file changed
//!   (only it is read again and sent; goal: <= 10 % of the full capture).
//!
//! Both sides read warm page cache (the tree and the blobs were just
//! written). Fresh tmpfs mounts need root; without it, fresh folders under
//! `/dev/shm` (a tmpfs) stand in.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use asbx_protocol::workdir::{
    MissingRequest, MissingResponse, SnapshotReport, WorkdirDispatch, WorkdirManifest,
};
use asbx_runner::Workdir;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::routing::{get, post};

const FILES: usize = 1_000;
const FOLDERS: usize = 20;
const TOTAL_BYTES: usize = 50 * 1024 * 1024;

/// The stand-in workspace: blobs in a folder, the last snapshot, and what
/// was sent.
struct Store {
    blobs: PathBuf,
    snapshot: Mutex<Option<WorkdirManifest>>,
    sent: Mutex<(usize, u64)>,
}

async fn missing(
    State(s): State<Arc<Store>>,
    Json(req): Json<MissingRequest>,
) -> Json<MissingResponse> {
    let missing = req
        .hashes
        .into_iter()
        .filter(|h| !s.blobs.join(h).exists())
        .collect();
    Json(MissingResponse { missing })
}

async fn put_blob(
    State(s): State<Arc<Store>>,
    UrlPath(sha): UrlPath<String>,
    body: Bytes,
) -> StatusCode {
    let tmp = s.blobs.join(format!("{sha}.tmp"));
    if tokio::fs::write(&tmp, &body).await.is_err()
        || tokio::fs::rename(&tmp, s.blobs.join(&sha)).await.is_err()
    {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    if let Ok(mut sent) = s.sent.lock() {
        sent.0 += 1;
        sent.1 += body.len() as u64;
    }
    StatusCode::NO_CONTENT
}

async fn get_blob(
    State(s): State<Arc<Store>>,
    UrlPath(sha): UrlPath<String>,
) -> Result<Vec<u8>, StatusCode> {
    tokio::fs::read(s.blobs.join(sha))
        .await
        .map_err(|_| StatusCode::NOT_FOUND)
}

async fn snapshot(State(s): State<Arc<Store>>, Json(report): Json<SnapshotReport>) -> StatusCode {
    if let Ok(mut kept) = s.snapshot.lock() {
        *kept = report.manifest;
    }
    StatusCode::NO_CONTENT
}

/// Serves the stand-in; its `agent_url`.
async fn serve(store: Arc<Store>) -> anyhow::Result<String> {
    let app = axum::Router::new()
        .route("/s/workdir/missing", post(missing))
        .route("/s/workdir/blobs/{sha}", get(get_blob).put(put_blob))
        .route("/s/workdir/snapshot", post(snapshot))
        .layer(axum::extract::DefaultBodyLimit::max(64 * 1024 * 1024))
        .with_state(store);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/s", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(url)
}

/// Writes the tree: `FILES` files in `FOLDERS` folders, sizes varying
/// around the mean, `TOTAL_BYTES` in all, bytes that do not repeat.
fn make_tree(root: &Path) -> anyhow::Result<()> {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mean = TOTAL_BYTES / FILES;
    let (mut delta, mut written) = (0, 0);
    for i in 0..FILES {
        let dir = root.join(format!("d{:02}", i % FOLDERS));
        std::fs::create_dir_all(&dir)?;
        // Pairs of files `mean ± delta`; the last takes what is left.
        let size = if i + 1 == FILES {
            TOTAL_BYTES - written
        } else if i % 2 == 0 {
            delta = next() as usize % (mean / 2);
            mean + delta
        } else {
            mean - delta
        };
        let mut bytes = Vec::with_capacity(size + 8);
        while bytes.len() < size {
            bytes.extend_from_slice(&next().to_le_bytes());
        }
        bytes.truncate(size);
        written += size;
        std::fs::write(dir.join(format!("f{i:04}.bin")), bytes)?;
    }
    Ok(())
}

/// A fresh tmpfs at `path` (root), or a fresh folder under `/dev/shm`;
/// the folder to use and whether it is a mount.
fn fresh_tmpfs(path: &Path) -> anyhow::Result<(PathBuf, bool)> {
    std::fs::create_dir_all(path)?;
    let mounted = nix::mount::mount(
        Some("tmpfs"),
        path,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=256m,mode=0755"),
    );
    if mounted.is_ok() {
        return Ok((path.to_path_buf(), true));
    }
    let name = path.file_name().context("name")?.to_string_lossy();
    let shm = PathBuf::from("/dev/shm").join(format!("asbx-bench-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&shm)?;
    Ok((shm, false))
}

fn drop_tmpfs((path, mounted): &(PathBuf, bool)) {
    if *mounted {
        let _ = nix::mount::umount2(path.as_path(), nix::mount::MntFlags::MNT_DETACH);
    } else {
        let _ = std::fs::remove_dir_all(path);
    }
}

fn spec(restore: Option<WorkdirManifest>) -> WorkdirDispatch {
    WorkdirDispatch {
        token: "bench".into(),
        restore,
        max_entries: asbx_protocol::workdir::DEFAULT_MAX_ENTRIES,
        max_bytes: asbx_protocol::workdir::DEFAULT_MAX_BYTES,
        capture: true,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn taken(store: &Store) -> (usize, u64) {
    store
        .sent
        .lock()
        .map(|mut s| std::mem::take(&mut *s))
        .unwrap_or_default()
}

pub(crate) async fn workdir() -> anyhow::Result<()> {
    let base = crate::tempdir("workdir")?;
    let tree = base.join("tree");
    make_tree(&tree)?;
    let store = Arc::new(Store {
        blobs: base.join("blobs"),
        snapshot: Mutex::new(None),
        sent: Mutex::default(),
    });
    std::fs::create_dir_all(&store.blobs)?;
    let url = serve(Arc::clone(&store)).await?;
    let client = reqwest::Client::builder().no_proxy().build()?;
    let open = |spec, dir: &Path| {
        let dir = dir.to_string_lossy().into_owned();
        let (url, client) = (url.clone(), client.clone());
        async move { Workdir::open(spec, &url, client, None, &dir).await }
    };
    println!(
        "workdir: {FILES} files, {} MB in {FOLDERS} folders",
        TOTAL_BYTES >> 20
    );

    // Full capture: nothing known, every blob sent.
    let w = open(spec(None), &tree).await.map_err(anyhow::Error::msg)?;
    let t = Instant::now();
    w.capture_and_send().await.map_err(anyhow::Error::msg)?;
    let full = t.elapsed();
    let (n, bytes) = taken(&store);
    let manifest = store.snapshot.lock().ok().and_then(|mut s| s.take());
    let Some(manifest) = manifest else {
        bail!("the full capture kept nothing");
    };
    println!(
        "  full capture          {:>8.1} ms  ({n} blobs, {} MB sent)",
        ms(full),
        bytes >> 20
    );

    // Restore into a fresh tmpfs, beside cp -a of the same tree.
    let into = fresh_tmpfs(&base.join("restored"))?;
    let mut w = open(spec(Some(manifest)), &into.0)
        .await
        .map_err(anyhow::Error::msg)?;
    let t = Instant::now();
    w.restore(None).await.map_err(anyhow::Error::msg)?;
    let restore = t.elapsed();
    let copy_to = fresh_tmpfs(&base.join("copied"))?;
    let t = Instant::now();
    let cp = std::process::Command::new("cp")
        .arg("-a")
        .arg(&tree)
        .arg(copy_to.0.join("tree"))
        .status()?;
    let copy = t.elapsed();
    if !cp.success() {
        bail!("cp -a failed: {cp}");
    }
    let tmpfs = if into.1 { "tmpfs" } else { "/dev/shm" };
    println!("  restore into {tmpfs:<8} {:>8.1} ms", ms(restore));
    println!(
        "  cp -a into {tmpfs:<8}   {:>8.1} ms  (restore / cp -a = {:.2}, goal <= 2)",
        ms(copy),
        restore.as_secs_f64() / copy.as_secs_f64()
    );

    // Incremental: one file changed in the restored directory.
    let changed = into.0.join("d00/f0000.bin");
    std::fs::write(&changed, b"changed by the turn")?;
    let t = Instant::now();
    w.capture_and_send().await.map_err(anyhow::Error::msg)?;
    let incremental = t.elapsed();
    let (n, bytes) = taken(&store);
    println!(
        "  incremental capture   {:>8.1} ms  ({n} blob, {bytes} B sent; / full = {:.1} %, goal <= 10 %)",
        ms(incremental),
        100.0 * incremental.as_secs_f64() / full.as_secs_f64()
    );
    drop_tmpfs(&into);
    drop_tmpfs(&copy_to);
    let _ = std::fs::remove_dir_all(&base);
    Ok(())
}
