//! Writing a manifest into a fresh sandbox's working directory from the
//! host, before the agent starts: folders and symlinks first, then each
//! file created with `O_CREAT | O_EXCL | O_NOFOLLOW` in its folder, which
//! is opened one component at a time without following a link. Paths are
//! checked ([`WorkdirManifest::check`]), so nothing lands outside.

use std::os::fd::{AsFd, OwnedFd};

use asbx_protocol::workdir::{WorkdirEntry, WorkdirManifest};
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, fchmod, fstat, mkdirat};
use nix::unistd::{Gid, Uid, fchown, fchownat, symlinkat};

use super::walk::{Stamp, open_dir_beneath, split};

/// Who owns what is restored: the sandbox's tool user and shared group
/// (host ids), or `None` to keep the runner's (unconfined).
pub(crate) type Owner = Option<(u32, u32)>;

fn ids(owner: Owner) -> (Option<Uid>, Option<Gid>) {
    match owner {
        Some((u, g)) => (Some(Uid::from_raw(u)), Some(Gid::from_raw(g))),
        None => (None, None),
    }
}

/// Makes the folders and symlinks of `manifest` below `root` (files come
/// next, [`create_file`]). Folders get the sandbox's group bits, as the
/// jail gives `/work`'s copied folders.
pub(crate) fn make_tree(
    root: &OwnedFd,
    manifest: &WorkdirManifest,
    owner: Owner,
) -> std::io::Result<()> {
    let (uid, gid) = ids(owner);
    for e in &manifest.entries {
        match e {
            WorkdirEntry::Dir { path, mode } => {
                let (parent, name) = split(path);
                let dir = open_dir_beneath(root, parent)?;
                let mode = if owner.is_some() {
                    mode | 0o2770
                } else {
                    *mode | 0o700
                };
                mkdirat(dir.as_fd(), name, Mode::from_bits_truncate(mode))?;
                let made = openat(
                    dir.as_fd(),
                    name,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )?;
                // The umask may have cut the bits asked for.
                fchmod(made.as_fd(), Mode::from_bits_truncate(mode))?;
                fchown(made.as_fd(), uid, gid)?;
            }
            WorkdirEntry::Symlink { path, target } => {
                let (parent, name) = split(path);
                let dir = open_dir_beneath(root, parent)?;
                symlinkat(target.as_str(), dir.as_fd(), name)?;
                if owner.is_some() {
                    fchownat(dir.as_fd(), name, uid, gid, AtFlags::AT_SYMLINK_NOFOLLOW)?;
                }
            }
            WorkdirEntry::File { .. } => {}
        }
    }
    Ok(())
}

/// Creates the file at `path` (its folder made by [`make_tree`]), new,
/// never through a link, with `mode` (plus the sandbox's group bits).
pub(crate) fn create_file(
    root: &OwnedFd,
    path: &str,
    mode: u32,
    owner: Owner,
) -> std::io::Result<std::fs::File> {
    let (parent, name) = split(path);
    let dir = open_dir_beneath(root, parent)?;
    let mode = if owner.is_some() {
        mode | 0o660
    } else {
        mode | 0o600
    };
    let fd = openat(
        dir.as_fd(),
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode),
    )?;
    fchmod(fd.as_fd(), Mode::from_bits_truncate(mode))?;
    let (uid, gid) = ids(owner);
    fchown(fd.as_fd(), uid, gid)?;
    Ok(std::fs::File::from(fd))
}

/// A restored file's stamp, taken once its bytes are written.
pub(crate) fn stamp(file: &std::fs::File) -> std::io::Result<Stamp> {
    Ok(Stamp::of(&fstat(file.as_fd())?))
}
