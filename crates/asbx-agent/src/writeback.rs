//! Writeback: the regular files under `<workdir>/out/` go to
//! `/callback/results` in one `POST` with the upload token.
//!
//! The tree is walked by descriptor with `O_NOFOLLOW` (like the file tools),
//! so symlinks and anything that is not a regular file are skipped, never
//! followed. At most [`MAX_FILES`] files and [`MAX_TOTAL_BYTES`] bytes are
//! sent; the rest is skipped. It runs after the loop whatever its outcome
//! (a model error, a limit, the duration cap), so files written before a
//! failure still reach the workspace. A failed writeback (the `POST` failed
//! or timed out, or files were left out over the limits) is a
//! [`WritebackError::Failed`], which the turn ends with as an `error` line
//! `writeback_failed` (docs/protocol.md §2): never only a log line.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use asbx_protocol::LogLevel;
use asbx_protocol::callback::{ResultFile, ResultsRequest, ResultsResponse};
use asbx_protocol::gateway::CALLBACK_RESULTS;
use asbx_protocol::rules::limits;
use base64::Engine;
use nix::dir::{Dir, Type};
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, fstat};

use crate::emit::Emitter;
use crate::gateway_client::GatewayClient;

pub(crate) const MAX_FILES: usize = limits::MAX_WRITEBACK_FILES;
pub(crate) const MAX_TOTAL_BYTES: u64 = limits::MAX_WRITEBACK_BYTES as u64;
pub(crate) const MAX_DEPTH: usize = 32;
pub(crate) const UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// A file found under `out/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutFile {
    /// Relative to `out/`, `/`-separated.
    pub path: String,
    pub content: Vec<u8>,
}

/// What the walk found, and what it left out.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub files: Vec<OutFile>,
    pub skipped: Vec<String>,
}

const DIR_FLAGS: OFlag = OFlag::O_DIRECTORY
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_RDONLY)
    .union(OFlag::O_CLOEXEC);

/// Collects the regular files under `<workdir>/out/`.
pub(crate) fn collect(workdir: &Path) -> Collected {
    let mut c = Collected::default();
    let Ok(root) = nix::fcntl::open(
        workdir,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) else {
        return c;
    };
    let Ok(out) = openat(root.as_fd(), "out", DIR_FLAGS, Mode::empty()) else {
        return c;
    };
    let mut total = 0u64;
    walk(out, "", 0, &mut c, &mut total);
    c.files.sort_by(|a, b| a.path.cmp(&b.path));
    c
}

fn walk(dir: OwnedFd, prefix: &str, depth: usize, c: &mut Collected, total: &mut u64) {
    let Ok(dup) = dir.try_clone() else { return };
    let Ok(mut d) = Dir::from_fd(dup) else { return };
    let mut names: Vec<(String, Option<Type>)> = Vec::new();
    for e in d.iter().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name != "." && name != ".." {
            names.push((name, e.file_type()));
        }
    }
    names.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, ty) in names {
        let rel = format!("{prefix}{name}");
        match ty {
            Some(Type::Directory) => {
                if depth >= MAX_DEPTH {
                    c.skipped.push(format!("{rel}/ (too deep)"));
                    continue;
                }
                if let Ok(sub) = openat(dir.as_fd(), name.as_str(), DIR_FLAGS, Mode::empty()) {
                    walk(sub, &format!("{rel}/"), depth + 1, c, total);
                }
            }
            Some(Type::File) | None => {
                if c.files.len() >= MAX_FILES {
                    c.skipped
                        .push(format!("{rel} (more than {MAX_FILES} files)"));
                    continue;
                }
                match read_regular(&dir, &name, MAX_TOTAL_BYTES - *total) {
                    Ok(Some(content)) => {
                        *total += content.len() as u64;
                        c.files.push(OutFile { path: rel, content });
                    }
                    Ok(None) => c
                        .skipped
                        .push(format!("{rel} (over the {MAX_TOTAL_BYTES} byte total)")),
                    Err(()) => {}
                }
            }
            Some(_) => {}
        }
    }
}

/// Reads a regular file (no symlink) if it fits in `room` bytes.
fn read_regular(dir: &OwnedFd, name: &str, room: u64) -> Result<Option<Vec<u8>>, ()> {
    let fd = openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::empty(),
    )
    .map_err(|_| ())?;
    let st = fstat(fd.as_fd()).map_err(|_| ())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(());
    }
    let size = u64::try_from(st.st_size).unwrap_or(u64::MAX);
    if size > room {
        return Ok(None);
    }
    let mut content = Vec::with_capacity(size as usize);
    // The file may grow while we read; never take more than the room left.
    std::fs::File::from(fd)
        .take(room + 1)
        .read_to_end(&mut content)
        .map_err(|_| ())?;
    if content.len() as u64 > room {
        return Ok(None);
    }
    Ok(Some(content))
}

/// Why files of `out/` did not all reach the workspace.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WritebackError {
    #[error("writeback failed: {0}")]
    Failed(String),
    #[error("could not write to stdout: {0}")]
    Output(#[from] std::io::Error),
}

/// Collects `out/` and posts it once; logs what was stored, fails when
/// anything was not.
pub(crate) async fn writeback(
    gw: &GatewayClient,
    otp_upload: Option<&str>,
    workdir: &Path,
    emitter: &Emitter,
) -> Result<(), WritebackError> {
    let Some(token) = otp_upload else {
        return Ok(());
    };
    let dir = workdir.to_path_buf();
    let collected = tokio::task::spawn_blocking(move || collect(&dir))
        .await
        .map_err(|e| WritebackError::Failed(format!("cannot read out/: {e}")))?;
    let skipped = (!collected.skipped.is_empty()).then(|| {
        let shown: Vec<&str> = collected
            .skipped
            .iter()
            .take(10)
            .map(String::as_str)
            .collect();
        let more = collected.skipped.len() - shown.len();
        format!(
            "{} file(s) of out/ not written back: {}{}",
            collected.skipped.len(),
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        )
    });
    if collected.files.is_empty() {
        return skipped.map_or(Ok(()), |s| Err(WritebackError::Failed(s)));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let body = ResultsRequest {
        files: collected
            .files
            .iter()
            .map(|f| ResultFile {
                path: f.path.clone(),
                content_base64: b64.encode(&f.content),
                mime_type: Some(
                    mime_guess::from_path(&f.path)
                        .first_or_octet_stream()
                        .essence_str()
                        .to_owned(),
                ),
            })
            .collect(),
    };
    let n = body.files.len();
    let post = gw.post_json::<_, ResultsResponse>(CALLBACK_RESULTS, token, &body);
    let resp = match tokio::time::timeout(UPLOAD_TIMEOUT, post).await {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) => {
            return Err(WritebackError::Failed(format!(
                "{n} file(s) of out/ not stored: {e}"
            )));
        }
        Err(_) => {
            return Err(WritebackError::Failed(format!(
                "{n} file(s) of out/ not stored: timed out after {UPLOAD_TIMEOUT:?}"
            )));
        }
    };
    emitter
        .log(
            LogLevel::Info,
            format!(
                "wrote back {n} file(s) from out/ ({} stored)",
                resp.files.len()
            ),
        )
        .await?;
    skipped.map_or(Ok(()), |s| Err(WritebackError::Failed(s)))
}
