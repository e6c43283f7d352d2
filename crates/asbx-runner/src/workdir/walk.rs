//! Reading a sandbox's working directory from the host, after its
//! processes are gone: every step is an `openat` of one name relative to
//! an already open folder, with `O_NOFOLLOW`, so nothing the sandbox left
//! (a symlink, a swapped folder) leads the walk outside the directory.
//! Symlinks are kept as links, hard links as plain files; devices, fifos
//! and sockets are skipped. Entries and bytes are bounded.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use asbx_protocol::workdir::{WorkdirEntry, WorkdirManifest, check_path, is_installed};
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat};
use sha2::{Digest, Sha256};

/// Deepest folder nesting walked.
const MAX_DEPTH: usize = 256;

/// Why a capture was refused: a message for the chat's owner.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum CaptureError {
    #[error("the working directory holds more than {0} entries; it was not kept")]
    TooManyEntries(usize),
    #[error("the working directory holds more than {0} bytes; it was not kept")]
    TooManyBytes(u64),
    #[error("the working directory is nested deeper than {MAX_DEPTH} folders; it was not kept")]
    TooDeep,
    #[error("{0}: not kept ({1})")]
    BadName(String, String),
    #[error("reading the working directory: {0}")]
    Io(String),
}

/// A file as the restore left it: unchanged since when its inode, size
/// and change time still match (the sandbox can't set a change time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Stamp {
    ino: u64,
    size: i64,
    ctime: i64,
    ctime_nsec: i64,
}

impl Stamp {
    pub(crate) fn of(st: &FileStat) -> Stamp {
        Stamp {
            ino: st.st_ino,
            size: st.st_size,
            ctime: st.st_ctime,
            ctime_nsec: st.st_ctime_nsec,
        }
    }
}

/// What the restore wrote: each file's path, stamp and hash.
pub(crate) type Known = HashMap<String, (Stamp, String)>;

/// Bounds of a capture.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub(crate) max_entries: usize,
    pub(crate) max_bytes: u64,
}

/// A captured directory: the manifest, and for each hash one path holding
/// those bytes (to upload it from).
#[derive(Debug, Default)]
pub(crate) struct Captured {
    pub(crate) manifest: WorkdirManifest,
    pub(crate) sources: HashMap<String, String>,
    /// Files whose bytes were read and hashed (not known from the restore).
    pub(crate) hashed: usize,
}

fn io(e: impl std::fmt::Display) -> CaptureError {
    CaptureError::Io(e.to_string())
}

/// Walks the folder `root` (an open descriptor of the working directory):
/// each folder's names [`list`]ed, each entry [`Walk::take`]n, folders
/// after the entries of the one holding them.
pub(crate) fn capture(
    root: &OwnedFd,
    bounds: Bounds,
    known: &Known,
) -> Result<Captured, CaptureError> {
    let mut walk = Walk {
        bounds,
        known,
        out: Captured::default(),
        bytes: 0,
    };
    // (folder, its path, its depth)
    let mut stack: Vec<(OwnedFd, String, usize)> =
        vec![(root.try_clone().map_err(io)?, String::new(), 0)];
    while let Some((dir, prefix, depth)) = stack.pop() {
        if depth > MAX_DEPTH {
            return Err(CaptureError::TooDeep);
        }
        let names = list(&dir, walk.out.manifest.entries.len(), bounds.max_entries)?;
        // Folders are walked after this one's entries, last name first off
        // the stack, so parents are always listed before their children.
        let mut subdirs = Vec::new();
        for name in names {
            if let Some((fd, path)) = walk.take(&dir, &prefix, &name)? {
                subdirs.push((fd, format!("{path}/"), depth + 1));
            }
        }
        subdirs.reverse();
        stack.extend(subdirs);
    }
    Ok(walk.out)
}

/// The names in `dir` (without `.` and `..`), sorted; refused when they
/// would make more than `max_entries` with the `taken` entries before them.
fn list(dir: &OwnedFd, taken: usize, max_entries: usize) -> Result<Vec<Vec<u8>>, CaptureError> {
    let mut names: Vec<Vec<u8>> = Vec::new();
    let mut listing = nix::dir::Dir::from_fd(dir.try_clone().map_err(io)?).map_err(io)?;
    for entry in listing.iter() {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        names.push(name.to_vec());
        if taken + names.len() > max_entries {
            return Err(CaptureError::TooManyEntries(max_entries));
        }
    }
    names.sort();
    Ok(names)
}

/// A capture under way: what it has taken, and the bytes counted so far.
struct Walk<'k> {
    bounds: Bounds,
    known: &'k Known,
    out: Captured,
    bytes: u64,
}

impl Walk<'_> {
    /// Takes the entry `name` of `dir` (at `prefix`) into the manifest; a
    /// folder comes back open, with its path, to be walked. Entries gone
    /// meanwhile, devices, fifos and sockets are left out.
    fn take(
        &mut self,
        dir: &OwnedFd,
        prefix: &str,
        name: &[u8],
    ) -> Result<Option<(OwnedFd, String)>, CaptureError> {
        let os = std::ffi::OsStr::from_bytes(name);
        let text = std::str::from_utf8(name).map_err(|_| {
            CaptureError::BadName(
                format!("{prefix}{}", os.to_string_lossy()),
                "not UTF-8".into(),
            )
        })?;
        let path = format!("{prefix}{text}");
        if is_installed(&path) {
            // The agent writes it again from the next run's config.
            return Ok(None);
        }
        check_path(&path).map_err(|m| CaptureError::BadName(path.clone(), m))?;
        let st = match fstatat(dir.as_fd(), os, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(nix::errno::Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(io(e)),
        };
        let mode = st.st_mode & 0o777;
        match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
            SFlag::S_IFDIR => {
                let fd = openat(
                    dir.as_fd(),
                    os,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(io)?;
                self.out.manifest.entries.push(WorkdirEntry::Dir {
                    path: path.clone(),
                    mode,
                });
                return Ok(Some((fd, path)));
            }
            SFlag::S_IFREG => self.take_file(dir, os, path, mode, &st)?,
            SFlag::S_IFLNK => {
                let target = readlinkat(dir.as_fd(), os).map_err(io)?;
                let target = target
                    .to_str()
                    .filter(|t| !t.is_empty() && t.len() <= asbx_protocol::workdir::MAX_LINK_BYTES)
                    .ok_or_else(|| {
                        CaptureError::BadName(path.clone(), "symlink target not kept".into())
                    })?
                    .to_owned();
                self.out
                    .manifest
                    .entries
                    .push(WorkdirEntry::Symlink { path, target });
            }
            // Devices, fifos and sockets are not kept.
            _ => {}
        }
        Ok(None)
    }

    /// A regular file: its hash known from the restore while its stamp
    /// still matches, else read (within the bytes left); counted against
    /// the byte bound.
    fn take_file(
        &mut self,
        dir: &OwnedFd,
        os: &std::ffi::OsStr,
        path: String,
        mode: u32,
        st: &FileStat,
    ) -> Result<(), CaptureError> {
        let (size, sha256) = match self.known.get(&path) {
            Some((stamp, sha)) if *stamp == Stamp::of(st) => (st.st_size as u64, sha.clone()),
            _ => {
                self.out.hashed += 1;
                hash_file(dir, os, self.bounds.max_bytes.saturating_sub(self.bytes))?
            }
        };
        self.bytes += size;
        if self.bytes > self.bounds.max_bytes {
            return Err(CaptureError::TooManyBytes(self.bounds.max_bytes));
        }
        self.out
            .sources
            .entry(sha256.clone())
            .or_insert_with(|| path.clone());
        self.out.manifest.entries.push(WorkdirEntry::File {
            path,
            mode,
            size,
            sha256,
        });
        Ok(())
    }
}

/// Opens a regular file of `dir` without following a link and hashes it:
/// its size and hex SHA-256, reading at most `room` bytes.
fn hash_file(
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    room: u64,
) -> Result<(u64, String), CaptureError> {
    let fd = open_regular(dir, name)?;
    let mut file = std::fs::File::from(fd);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        size += n as u64;
        if size > room {
            return Err(CaptureError::TooManyBytes(room));
        }
        hasher.update(&buf[..n]);
    }
    Ok((size, hex::encode(hasher.finalize())))
}

/// `openat(dir, name, O_NOFOLLOW)`, refused unless a regular file (a fifo
/// opened non-blocking never blocks the walk).
pub(crate) fn open_regular(dir: &OwnedFd, name: &std::ffi::OsStr) -> Result<OwnedFd, CaptureError> {
    let fd = openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_CLOEXEC
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY,
        Mode::empty(),
    )
    .map_err(io)?;
    let st = fstat(fd.as_fd()).map_err(io)?;
    if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFREG {
        return Err(CaptureError::Io(format!(
            "{} is no longer a regular file",
            name.to_string_lossy()
        )));
    }
    Ok(fd)
}

/// Opens the folder at `path` (a checked relative path) below `root`, one
/// component at a time, never through a link.
pub(crate) fn open_dir_beneath(root: &OwnedFd, path: &str) -> std::io::Result<OwnedFd> {
    let mut fd = root.try_clone()?;
    if path.is_empty() {
        return Ok(fd);
    }
    for c in path.split('/') {
        fd = openat(
            fd.as_fd(),
            c,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
    }
    Ok(fd)
}

/// `path` split into its folder and its name.
pub(crate) fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

#[cfg(test)]
#[path = "walk_tests.rs"]
mod tests;
