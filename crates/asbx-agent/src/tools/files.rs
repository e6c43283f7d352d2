//! `read_file`, `write_file`, `list_files`, confined to the working directory.
//!
//! Path rules: a path is taken relative to the working directory; an
//! absolute path is accepted only if it lies lexically inside it. `.` is
//! dropped and `..` pops a component; popping past the root is refused.
//!
//! Symlinks: the tools never follow one. The path is walked one component at
//! a time from a descriptor of the working directory with `openat(...,
//! O_NOFOLLOW)` (directories with `O_DIRECTORY|O_NOFOLLOW`), so a symlink at
//! any position, even one pointing inside the working directory, is refused.
//! Walking by descriptor (rather than canonicalize-then-check) leaves no
//! window for a tool process to swap a directory for a symlink between the
//! check and the use, and needs no `openat2` support from the kernel. Use
//! `shell` to work with symlinks.
//!
//! Modes: `write_file` leaves what it creates editable by the tools (another
//! uid, the same gid): files `0664`, folders `0775`, whatever the umask.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, fchmod, fstat, mkdirat};
use serde_json::json;

use super::context::{DISPLAY_BYTES, ToolContext, ToolOutput, cut};

/// Most entries `list_files` returns.
const MAX_LIST_ENTRIES: usize = 1000;

/// Turns a tool path into components below the working directory.
pub(crate) fn components(workdir: &Path, input: &str) -> Result<Vec<OsString>, String> {
    if input.contains('\0') {
        return Err("path contains a NUL byte".into());
    }
    let p = Path::new(input);
    let rel: PathBuf = if p.is_absolute() {
        let normal = normalize(p)?;
        let root = normalize(workdir)?;
        let mut abs = PathBuf::from("/");
        abs.extend(&normal);
        let mut root_abs = PathBuf::from("/");
        root_abs.extend(&root);
        match abs.strip_prefix(&root_abs) {
            Ok(r) => r.to_path_buf(),
            Err(_) => return Err(format!("{input}: path is outside the working directory")),
        }
    } else {
        p.to_path_buf()
    };
    normalize(&rel).map_err(|_| format!("{input}: path escapes the working directory"))
}

fn normalize(p: &Path) -> Result<Vec<OsString>, String> {
    let mut out = Vec::new();
    for c in p.components() {
        match c {
            Component::Prefix(_) | Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                if out.pop().is_none() {
                    return Err("path escapes the working directory".into());
                }
            }
            Component::Normal(s) => out.push(s.to_os_string()),
        }
    }
    Ok(out)
}

pub(crate) fn errno_msg(path: &str, e: Errno) -> String {
    match e {
        Errno::ELOOP => format!("{path}: refusing to follow a symlink"),
        Errno::ENOTDIR => format!("{path}: a path component is not a directory (or is a symlink)"),
        Errno::ENOENT => format!("{path}: no such file or directory"),
        Errno::EISDIR => format!("{path}: is a directory"),
        Errno::EACCES | Errno::EPERM => format!("{path}: permission denied"),
        other => format!("{path}: {}", other.desc()),
    }
}

pub(crate) fn open_root(workdir: &Path) -> Result<OwnedFd, String> {
    nix::fcntl::open(
        workdir,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open the working directory: {}", e.desc()))
}

/// Mode of the files `write_file` creates: the tools share the agent's gid.
pub(crate) const FILE_MODE: u32 = 0o664;
/// Mode of the folders `write_file` creates.
pub(crate) const DIR_MODE: u32 = 0o775;

/// Opens the directory at `comps` without following symlinks, creating
/// missing directories with mode `create` (exactly, whatever the umask)
/// when it is set.
pub(crate) fn open_dir(
    root: OwnedFd,
    comps: &[OsString],
    create: Option<u32>,
    path: &str,
) -> Result<OwnedFd, String> {
    let mut cur = root;
    for c in comps {
        let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC;
        let next = match (
            openat(cur.as_fd(), c.as_os_str(), flags, Mode::empty()),
            create,
        ) {
            (Err(Errno::ENOENT), Some(mode)) => {
                let made = match mkdirat(cur.as_fd(), c.as_os_str(), Mode::from_bits_truncate(mode))
                {
                    Ok(()) => true,
                    Err(Errno::EEXIST) => false,
                    Err(e) => return Err(errno_msg(path, e)),
                };
                let fd = openat(cur.as_fd(), c.as_os_str(), flags, Mode::empty())
                    .map_err(|e| errno_msg(path, e))?;
                if made {
                    // The umask took bits away.
                    fchmod(fd.as_fd(), Mode::from_bits_truncate(mode))
                        .map_err(|e| errno_msg(path, e))?;
                }
                Ok(fd)
            }
            (other, _) => other,
        };
        cur = next.map_err(|e| errno_msg(path, e))?;
    }
    Ok(cur)
}

fn read_blocking(workdir: PathBuf, path: String, cap: usize) -> Result<(Vec<u8>, usize), String> {
    let comps = components(&workdir, &path)?;
    let Some((name, dirs)) = comps.split_last() else {
        return Err(format!("{path}: is a directory"));
    };
    let dir = open_dir(open_root(&workdir)?, dirs, None, &path)?;
    let fd = openat(
        dir.as_fd(),
        name.as_os_str(),
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| errno_msg(&path, e))?;
    let st = fstat(fd.as_fd()).map_err(|e| errno_msg(&path, e))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(format!("{path}: not a regular file"));
    }
    let size = usize::try_from(st.st_size).unwrap_or(usize::MAX);
    let mut data = Vec::with_capacity(cap.min(size));
    std::fs::File::from(fd)
        .take(cap as u64)
        .read_to_end(&mut data)
        .map_err(|e| format!("{path}: {e}"))?;
    Ok((data, size))
}

/// `read_file {path}`.
pub(crate) async fn read_file(ctx: &ToolContext, path: &str) -> ToolOutput {
    let (workdir, p, cap) = (ctx.workdir.clone(), path.to_owned(), ctx.output_bytes);
    match tokio::task::spawn_blocking(move || read_blocking(workdir, p, cap)).await {
        Ok(Ok((data, size))) => ToolOutput {
            model_text: cut(&data, size, cap),
            display: Ok(json!(cut(&data, size, DISPLAY_BYTES))),
        },
        Ok(Err(e)) => ToolOutput::failed(e),
        Err(e) => ToolOutput::failed(format!("read_file crashed: {e}")),
    }
}

/// Opens `name` in `dir` for writing, created with `mode` or truncated,
/// never through a symlink and never blocking on a FIFO; refuses anything
/// but a regular file. `shown` names the path in errors.
pub(crate) fn create_regular(
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    mode: u32,
    shown: &str,
) -> Result<(OwnedFd, nix::sys::stat::FileStat), String> {
    let fd = openat(
        dir.as_fd(),
        name,
        OFlag::O_WRONLY
            | OFlag::O_CREAT
            | OFlag::O_TRUNC
            | OFlag::O_NOFOLLOW
            | OFlag::O_CLOEXEC
            // A FIFO without a reader fails with ENXIO instead of blocking.
            | OFlag::O_NONBLOCK,
        Mode::from_bits_truncate(mode),
    )
    .map_err(|e| errno_msg(shown, e))?;
    let st = fstat(fd.as_fd()).map_err(|e| errno_msg(shown, e))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(format!("{shown}: not a regular file"));
    }
    Ok((fd, st))
}

fn write_blocking(
    workdir: PathBuf,
    path: String,
    content: String,
    owner: Option<(u32, u32)>,
) -> Result<usize, String> {
    let comps = components(&workdir, &path)?;
    let Some((name, dirs)) = comps.split_last() else {
        return Err(format!("{path}: is a directory"));
    };
    let dir = open_dir(open_root(&workdir)?, dirs, Some(DIR_MODE), &path)?;
    let (fd, st) = create_regular(&dir, name, FILE_MODE, &path)?;
    if st.st_uid == nix::unistd::geteuid().as_raw() {
        // Group-writable whatever the umask, so the tools (same gid) can edit it.
        fchmod(fd.as_fd(), Mode::from_bits_truncate(FILE_MODE)).map_err(|e| errno_msg(&path, e))?;
    }
    if let Some((uid, gid)) = owner {
        // Let the tool user own the file when the agent may hand it over
        // (it has no CAP_CHOWN in a jail, where the shared gid does the job).
        let _ = nix::unistd::fchown(
            fd.as_fd(),
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        );
    }
    let mut f = std::fs::File::from(fd);
    f.write_all(content.as_bytes())
        .map_err(|e| format!("{path}: {e}"))?;
    Ok(content.len())
}

/// `write_file {path, content}`.
pub(crate) async fn write_file(ctx: &ToolContext, path: &str, content: &str) -> ToolOutput {
    let (workdir, p, c, owner) = (
        ctx.workdir.clone(),
        path.to_owned(),
        content.to_owned(),
        ctx.tool_user,
    );
    match tokio::task::spawn_blocking(move || write_blocking(workdir, p, c, owner)).await {
        Ok(Ok(n)) => ToolOutput {
            model_text: format!("wrote {n} bytes to {path}"),
            display: Ok(json!({"path": path, "bytes": n})),
        },
        Ok(Err(e)) => ToolOutput::failed(e),
        Err(e) => ToolOutput::failed(format!("write_file crashed: {e}")),
    }
}

fn list_blocking(workdir: PathBuf, path: String) -> Result<(Vec<String>, usize), String> {
    let comps = components(&workdir, &path)?;
    let dir = open_dir(open_root(&workdir)?, &comps, None, &path)?;
    let mut d = Dir::from_fd(dir).map_err(|e| errno_msg(&path, e))?;
    let mut entries = Vec::new();
    let mut total = 0;
    for e in d.iter() {
        let e = e.map_err(|e| errno_msg(&path, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "." || name == ".." {
            continue;
        }
        total += 1;
        if entries.len() >= MAX_LIST_ENTRIES {
            continue;
        }
        let suffix = match e.file_type() {
            Some(Type::Directory) => "/",
            Some(Type::Symlink) => "@",
            Some(_) | None => "",
        };
        entries.push(format!("{name}{suffix}"));
    }
    entries.sort();
    Ok((entries, total))
}

/// `list_files {path}`: names, `/` after directories, `@` after symlinks.
pub(crate) async fn list_files(ctx: &ToolContext, path: &str) -> ToolOutput {
    let (workdir, p) = (ctx.workdir.clone(), path.to_owned());
    match tokio::task::spawn_blocking(move || list_blocking(workdir, p)).await {
        Ok(Ok((entries, total))) => {
            let mut text = entries.join("\n");
            if total > entries.len() {
                text.push_str(&format!("\n…[{} more entries]", total - entries.len()));
            }
            ToolOutput {
                model_text: cut(text.as_bytes(), text.len(), ctx.output_bytes),
                display: Ok(json!(cut(text.as_bytes(), text.len(), DISPLAY_BYTES))),
            }
        }
        Ok(Err(e)) => ToolOutput::failed(e),
        Err(e) => ToolOutput::failed(format!("list_files crashed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_rules() {
        let w = Path::new("/work/dir");
        let ok = |p: &str| components(w, p).unwrap();
        assert_eq!(ok("a/b"), vec![OsString::from("a"), OsString::from("b")]);
        assert_eq!(ok("./a/../b"), vec![OsString::from("b")]);
        assert_eq!(ok("/work/dir/x"), vec![OsString::from("x")]);
        assert!(ok(".").is_empty());
        assert!(components(w, "../x").is_err());
        assert!(components(w, "a/../../x").is_err());
        assert!(components(w, "/etc/passwd").is_err());
        assert!(components(w, "/work/dirx/y").is_err());
        assert!(components(w, "/work/dir/../x").is_err());
    }

    #[tokio::test]
    async fn write_file_leaves_files_and_folders_the_tools_can_edit() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // What a jail's agent typically has; the modes must not depend on it.
        let old = nix::sys::stat::umask(Mode::from_bits_truncate(0o022));
        let ctx = ToolContext {
            workdir: dir.path().to_path_buf(),
            variables: Default::default(),
            tool_user: None,
            timeout: std::time::Duration::from_secs(5),
            output_bytes: 1024,
            emitter: crate::emit::Emitter::new(tokio::io::sink(), asbx_protocol::Protocol::V1),
            cgroup_root: super::super::process::CgroupRoot(dir.path().join("none")),
        };
        let out = write_file(&ctx, "out/deep/a.txt", "hi").await;
        nix::sys::stat::umask(old);
        assert!(!out.is_error(), "{out:?}");
        let mode = |p: &str| {
            std::fs::metadata(dir.path().join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode("out/deep/a.txt"), 0o664);
        assert_eq!(mode("out"), 0o775);
        assert_eq!(mode("out/deep"), 0o775);
        // An existing file of the agent's, made private, is opened up again.
        std::fs::set_permissions(
            dir.path().join("out/deep/a.txt"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        assert!(!write_file(&ctx, "out/deep/a.txt", "again").await.is_error());
        assert_eq!(mode("out/deep/a.txt"), 0o664);
    }
}
