//! The sandbox's file system: a fresh tmpfs root holding read-only binds of
//! the host's system folders, a curated `/etc`, size-capped `/work` and
//! `/tmp`, a minimal `/dev` and a fresh `/proc` with sensitive entries hidden.
//!
//! Built by the sandbox's init, still host root but already in its own mount
//! namespace (all mounts are private, nothing propagates to the host, and
//! everything vanishes with the namespace):
//!
//! 1. a tmpfs is mounted on the host path `/tmp` (inside the new namespace
//!    only) and `pivot_root`ed into, the host tree moving to `/.oldroot`;
//! 2. the sandbox tree is built in that tmpfs from `/.oldroot/...` sources;
//! 3. `/.oldroot` is detached and the root's mount turns read-only; `/work`,
//!    `/tmp` and `/dev/shm`, folders of the same tmpfs bound onto
//!    themselves, stay writable.
//!
//! **The working directory.** `/work` is a folder of the sandbox's one
//! tmpfs (`disk_bytes` for `/work`, `/tmp` and `/dev/shm` together),
//! owned by the tool uid and the shared group (mode 2775). The host `policy.workdir` is
//! copied into it at start (regular files, folders, symlinks; the runner puts
//! attachments there before starting the jail). Nothing is written back to
//! the host folder: the agent returns files over the gateway and the runner
//! deletes the host folder afterwards. The tmpfs pages are charged to the
//! sandbox's memory cgroup and are freed with its mount namespace.

use std::ffi::OsStr;
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt, lchown, symlink};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::stat::{Mode, SFlag, makedev, mknod};

use asbx_protocol::jail::{
    AGENT_GID, AGENT_UID, JailPolicy, MCP_UID, TOOL_CGROUP_IN_JAIL, TOOL_UID, WORKDIR_IN_JAIL,
};

use crate::JailError;
use crate::cgroup::ChildMount;

/// Where the host tree sits while the sandbox root is being built.
const OLD: &str = "/.oldroot";
/// The host folder the new root tmpfs is mounted on (in the private namespace only).
const BASE: &str = "/tmp";

/// Host system folders made visible read-only (or recreated as symlinks).
const SYSTEM: [&str; 7] = ["usr", "bin", "sbin", "lib", "lib64", "lib32", "libx32"];

/// `/etc` entries taken from the host into the sandboxes' shared `/etc`
/// ([`shared_etc`]): files and folders copied (only what any user of the
/// host may read), symlinks recreated. Nothing else of the host's `/etc` is
/// visible. Deliberately absent: `environment`, `profile.d` and `gitconfig`,
/// where operators put proxies, tokens and credential helpers.
const ETC: [&str; 27] = [
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "bash.bashrc",
    "profile",
    "inputrc",
    "mime.types",
    "protocols",
    "services",
    "networks",
    "rpc",
    "host.conf",
    "gai.conf",
    "os-release",
    "debian_version",
    "shells",
    "magic",
    "magic.mime",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "alternatives",
    "python3",
    "python3.11",
];

/// `/proc` entries remounted read-only.
const PROC_READ_ONLY: [&str; 5] = ["sys", "sysrq-trigger", "irq", "bus", "fs"];
/// `/proc` files hidden behind `/dev/null`.
const PROC_MASKED: [&str; 6] = [
    "kcore",
    "keys",
    "timer_list",
    "sched_debug",
    "latency_stats",
    "kallsyms",
];

/// What to bind: a detached copy of the source's mount (made by the
/// supervisor in the host's mount namespace) and where it appears.
///
/// The copy is taken with `open_tree(OPEN_TREE_CLONE)` rather than bound by
/// path from `/.oldroot`: a source may be a [`crate::DetachedDir`] of the
/// runner (`/proc/<pid>/fd/<n>`), mounted nowhere the sandbox's namespace
/// could bind it from; the sandbox then sees its root as `/`, no host path.
#[derive(Debug, Clone)]
pub(crate) struct Bind {
    tree: Option<Arc<OwnedFd>>,
    pub(crate) target: PathBuf,
    pub(crate) writable: bool,
    pub(crate) is_dir: bool,
}

/// How one host system folder appears in the sandbox.
#[derive(Debug, Clone)]
enum System {
    Symlink(String, PathBuf),
    Dir(String),
}

/// Everything the init needs to build the root, computed by the supervisor.
#[derive(Debug, Clone)]
pub(crate) struct RootPlan {
    system: Vec<System>,
    /// The host folder bound read-only as `/etc` ([`shared_etc`]).
    etc: PathBuf,
    workdir: PathBuf,
    binds: Vec<Bind>,
    disk_bytes: Option<u64>,
    /// Host uid owning `/work` (the tool uid's host id).
    work_uid: u32,
    /// Host gid of the shared group.
    work_gid: u32,
    /// The child cgroups bound under `TOOL_CGROUP_IN_JAIL` (set by the supervisor).
    pub(crate) cgroup_mounts: Vec<ChildMount>,
}

fn policy_err(msg: String) -> JailError {
    JailError::Policy(msg)
}

impl RootPlan {
    /// Check the policy's paths on the host and plan the tree.
    pub(crate) fn new(policy: &JailPolicy) -> Result<RootPlan, JailError> {
        let workdir = fs::canonicalize(&policy.workdir)
            .map_err(|e| policy_err(format!("workdir {}: {e}", policy.workdir)))?;
        if !workdir.is_dir() {
            return Err(policy_err(format!(
                "workdir {} is not a folder",
                policy.workdir
            )));
        }
        let mut system = Vec::new();
        for name in SYSTEM {
            let host = Path::new("/").join(name);
            match fs::symlink_metadata(&host) {
                Ok(m) if m.file_type().is_symlink() => {
                    let to = fs::read_link(&host).map_err(|e| JailError::Host(e.to_string()))?;
                    system.push(System::Symlink(name.to_string(), to));
                }
                Ok(m) if m.is_dir() => system.push(System::Dir(name.to_string())),
                _ => {}
            }
        }
        let mut binds = Vec::new();
        for b in &policy.binds {
            let target = PathBuf::from(&b.target);
            if !target.is_absolute()
                || target.components().any(|c| {
                    !matches!(
                        c,
                        std::path::Component::Normal(_) | std::path::Component::RootDir
                    )
                })
                || target == Path::new("/")
            {
                return Err(policy_err(format!(
                    "bind target {} must be a normalized absolute path",
                    b.target
                )));
            }
            for reserved in ["/proc", "/dev", WORKDIR_IN_JAIL, "/tmp"] {
                if target.starts_with(reserved) {
                    return Err(policy_err(format!(
                        "bind target {} is inside {reserved}",
                        b.target
                    )));
                }
            }
            let source = Path::new(&b.source);
            if !source.is_absolute() {
                return Err(policy_err(format!(
                    "bind source {} must be an absolute path",
                    b.source
                )));
            }
            let is_dir = fs::metadata(source)
                .map_err(|e| policy_err(format!("bind source {}: {e}", b.source)))?
                .is_dir();
            let tree = crate::sys::open_tree_clone(source)
                .map_err(|e| policy_err(format!("bind source {}: {e}", b.source)))?;
            binds.push(Bind {
                tree: Some(Arc::new(tree)),
                target,
                writable: b.writable,
                is_dir,
            });
        }
        // Parents before children.
        binds.sort_by_key(|b| b.target.components().count());
        Ok(RootPlan {
            system,
            etc: shared_etc()?,
            workdir,
            binds,
            disk_bytes: policy.limits.disk_bytes,
            work_uid: policy.host_uid + 1,
            work_gid: policy.host_uid,
            cgroup_mounts: Vec::new(),
        })
    }

    /// The in-sandbox targets of the binds, with whether they are writable.
    pub(crate) fn bind_targets(&self) -> impl Iterator<Item = (&Path, bool)> {
        self.binds.iter().map(|b| (b.target.as_path(), b.writable))
    }

    /// Close the supervisor's copies of the bind trees once the sandbox's
    /// init (which attaches them) has its own.
    pub(crate) fn release_trees(&mut self) {
        for b in &mut self.binds {
            b.tree = None;
        }
    }
}

fn sys(what: &str, path: impl AsRef<Path>, e: impl std::fmt::Display) -> JailError {
    JailError::Setup(format!("{what} {}: {e}", path.as_ref().display()))
}

fn old(host: &Path) -> PathBuf {
    Path::new(OLD).join(host.strip_prefix("/").unwrap_or(host))
}

fn mnt(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), JailError> {
    mount(source, target, fstype, flags, data).map_err(|e| sys("mount", target, e))
}

fn tmpfs(target: &Path, flags: MsFlags, data: &str) -> Result<(), JailError> {
    mnt(
        Some(Path::new("tmpfs")),
        target,
        Some("tmpfs"),
        flags,
        Some(data),
    )
}

/// Bind `source` on `target` (not recursively: host submounts stay hidden)
/// and remount it with `flags` (read-only unless writable).
fn bind(source: &Path, target: &Path, writable: bool) -> Result<(), JailError> {
    mnt(Some(source), target, None, MsFlags::MS_BIND, None)?;
    let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if !writable {
        flags |= MsFlags::MS_RDONLY;
    }
    mnt(None, target, None, flags, None)
}

/// Binds `source` on `target` with exactly `flags` (of `MS_NOSUID`,
/// `MS_NODEV`, `MS_NOEXEC`, `MS_RDONLY`) on the new mount.
fn bind_with(source: &Path, target: &Path, flags: MsFlags) -> Result<(), JailError> {
    mnt(Some(source), target, None, MsFlags::MS_BIND, None)?;
    mnt(
        None,
        target,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | flags,
        None,
    )
}

fn mkdir(path: &Path, mode: u32) -> Result<(), JailError> {
    match fs::create_dir(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(sys("mkdir", path, e)),
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(|e| sys("chmod", path, e))
}

/// Write a root-owned file of the sandbox root, mode 0644 (init runs with
/// umask 0, and the root is remounted read-only only afterwards).
fn write_file(path: &Path, content: &str) -> Result<(), JailError> {
    fs::write(path, content).map_err(|e| sys("write", path, e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644)).map_err(|e| sys("chmod", path, e))
}

/// Build the sandbox root and enter it. Ends with the cwd at `/work`, the
/// host tree detached and `/` read-only.
/// The first half of the root: a fresh tmpfs pivoted to, the read-only
/// system folders and `/etc`. Nothing here depends on the sandbox's
/// cgroups, and it writes only a few small files, so it runs while the
/// supervisor moves init into them (which on cgroup v1 waits for an RCU
/// grace period); [`build_rest`] runs once init is in.
pub(crate) fn build_base(plan: &RootPlan) -> Result<(), JailError> {
    let root = Path::new("/");
    mnt(
        None,
        root,
        None,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None,
    )?;
    // The sandbox's one tmpfs: the root's folders and device nodes, and
    // all it may write (`/work`, `/tmp`, `/dev/shm` are folders of it, each
    // bound onto itself with its own flags once the root's mount turns
    // read-only), so `disk_bytes` bounds the three together. One superblock,
    // not two: each one registers a memcg-aware shrinker, and every memory
    // cgroup on the host then keeps state for every shrinker registered at
    // once (docs/performance.md, "Where the cost is").
    let base = Path::new(BASE);
    let size = match plan.disk_bytes {
        Some(n) => format!("size={n}"),
        None => "size=50%".to_string(),
    };
    tmpfs(
        base,
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        &format!("{size},mode=0755"),
    )?;
    let base_old = base.join(OLD.trim_start_matches('/'));
    mkdir(&base_old, 0o700)?;
    nix::unistd::pivot_root(base, &base_old).map_err(|e| sys("pivot_root", base, e))?;
    nix::unistd::chdir(root).map_err(|e| sys("chdir", root, e))?;

    for s in &plan.system {
        match s {
            System::Symlink(name, to) => {
                symlink(to, root.join(name)).map_err(|e| sys("symlink", name, e))?;
            }
            System::Dir(name) => {
                let target = root.join(name);
                mkdir(&target, 0o755)?;
                bind(&old(&target), &target, false)?;
            }
        }
    }
    let etc = root.join("etc");
    mkdir(&etc, 0o755)?;
    bind_with(
        &old(&plan.etc),
        &etc,
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
    )?;
    Ok(())
}

/// The rest of the root, inside the sandbox's cgroups and cgroup namespace:
/// `/work` (the input files copied in, charged to the sandbox), `/tmp`,
/// `/dev`, `/proc`, the child cgroups, the binds; then the old root goes
/// and the root turns read-only.
///
/// `children_made` is called before the child cgroups are bound: it waits
/// until the supervisor made them (it makes them while this runs).
pub(crate) fn build_rest(
    plan: &RootPlan,
    children_made: impl FnOnce() -> Result<(), JailError>,
) -> Result<(), JailError> {
    let root = Path::new("/");
    let work = Path::new(WORKDIR_IN_JAIL);
    mkdir(work, 0o2775)?;
    // Owner set by chown, not by mount options, which `/proc/self/mountinfo`
    // would show: the sandbox need not learn its host uid range.
    lchown(work, Some(plan.work_uid), Some(plan.work_gid)).map_err(|e| sys("chown", work, e))?;
    fs::set_permissions(work, fs::Permissions::from_mode(0o2775))
        .map_err(|e| sys("chmod", work, e))?;
    copy_tree(&old(&plan.workdir), work, plan.work_uid, plan.work_gid, 0)?;
    bind_with(work, work, MsFlags::MS_NOSUID | MsFlags::MS_NODEV)?;

    let tmp = Path::new("/tmp");
    mkdir(tmp, 0o1777)?;
    bind_with(tmp, tmp, MsFlags::MS_NOSUID | MsFlags::MS_NODEV)?;

    build_dev()?;
    build_proc()?;

    mkdir(Path::new("/run"), 0o755)?;
    mkdir(Path::new("/home"), 0o755)?;
    children_made()?;
    for m in &plan.cgroup_mounts {
        let target = Path::new(TOOL_CGROUP_IN_JAIL)
            .join(m.child)
            .join(m.controller);
        fs::create_dir_all(&target).map_err(|e| sys("mkdir", &target, e))?;
        if m.on_request {
            // Its supervisor mounts it here once made (`supervisor::Requests`).
            continue;
        }
        // Writable (cgroup.procs, freezer.state: file modes decide), nothing executable.
        mnt(Some(&old(&m.host)), &target, None, MsFlags::MS_BIND, None)?;
        mnt(
            None,
            &target,
            None,
            MsFlags::MS_BIND
                | MsFlags::MS_REMOUNT
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC,
            None,
        )?;
    }
    let root_dev = fs::metadata(root).map_err(|e| sys("stat", root, e))?.dev();
    for b in &plan.binds {
        make_mount_point(&b.target, b.is_dir, root_dev)?;
        let Some(tree) = &b.tree else {
            return Err(JailError::Setup(format!(
                "bind {}: no source tree",
                b.target.display()
            )));
        };
        crate::sys::move_mount_to(tree.as_fd(), &b.target)
            .map_err(|e| sys("move_mount", &b.target, e))?;
        let mut flags =
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        if !b.writable {
            flags |= MsFlags::MS_RDONLY;
        }
        mnt(None, &b.target, None, flags, None)?;
    }

    umount2(OLD, MntFlags::MNT_DETACH).map_err(|e| sys("umount", OLD, e))?;
    fs::remove_dir(OLD).map_err(|e| sys("rmdir", OLD, e))?;
    // The root's mount, not its superblock, turns read-only: the binds of
    // `/work`, `/tmp` and `/dev/shm` stay writable.
    mnt(
        None,
        root,
        None,
        MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV,
        None,
    )?;
    nix::unistd::chdir(work).map_err(|e| sys("chdir", work, e))?;
    Ok(())
}

/// Create a mount point for a bind, refusing to create anything outside the
/// sandbox's own root tmpfs (e.g. inside a read-only host bind).
fn make_mount_point(target: &Path, is_dir: bool, root_dev: u64) -> Result<(), JailError> {
    if fs::symlink_metadata(target).is_ok() {
        return Ok(());
    }
    let mut existing = target.parent();
    while let Some(p) = existing {
        if p.exists() {
            break;
        }
        existing = p.parent();
    }
    let anchor = existing.unwrap_or(Path::new("/"));
    let dev = fs::metadata(anchor)
        .map_err(|e| sys("stat", anchor, e))?
        .dev();
    if dev != root_dev {
        return Err(JailError::Setup(format!(
            "bind target {} does not exist and {} is not on the sandbox root; \
             pick a target outside the system folders",
            target.display(),
            anchor.display()
        )));
    }
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent).map_err(|e| sys("mkdir", parent, e))?;
    }
    if is_dir {
        mkdir(target, 0o755)
    } else {
        fs::File::create(target)
            .map(drop)
            .map_err(|e| sys("create", target, e))?;
        fs::set_permissions(target, fs::Permissions::from_mode(0o644))
            .map_err(|e| sys("chmod", target, e))
    }
}

/// Where the sandboxes' shared `/etc` folders are made on the host: in
/// `/run` (a tmpfs), or, where that is read-only (a container's read-only
/// root), in the temporary folder.
const ETC_CACHE: &str = "/run/asbx-jail";
/// Bounds on what is copied from the host's `/etc` entries.
const ETC_MAX_DEPTH: u32 = 6;
const ETC_MAX_ENTRIES: usize = 65_536;
const ETC_MAX_FILE: u64 = 4 << 20;

/// The sandbox's own `/etc` files, the same in every sandbox.
fn generated_etc() -> [(&'static str, String); 4] {
    [
        (
            "passwd",
            format!(
                "root:x:0:0:root:/root:/usr/sbin/nologin\n\
                 agent:x:{AGENT_UID}:{AGENT_GID}:asbx agent:{WORKDIR_IN_JAIL}:/bin/bash\n\
                 tool:x:{TOOL_UID}:{AGENT_GID}:asbx tool:{WORKDIR_IN_JAIL}:/bin/bash\n\
                 mcp:x:{MCP_UID}:{AGENT_GID}:asbx mcp server:{WORKDIR_IN_JAIL}:/bin/bash\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        (
            "group",
            format!("root:x:0:\nagent:x:{AGENT_GID}:tool,mcp\nnogroup:x:65534:\n"),
        ),
        (
            "hosts",
            "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n".into(),
        ),
        ("hostname", "sandbox\n".into()),
    ]
}

/// One entry of the host's `/etc` that the sandboxes see.
#[derive(Debug, Hash)]
enum EtcEntry {
    File {
        rel: PathBuf,
        len: u64,
        mtime: (i64, i64),
        ino: u64,
    },
    Dir {
        rel: PathBuf,
    },
    Symlink {
        rel: PathBuf,
        to: PathBuf,
    },
}

/// What of `host/rel` (an [`ETC`] entry, or inside one) the sandboxes see:
/// regular files and folders any user of the host may read, and symlinks.
/// A private key folder (`/etc/ssl/private`, mode 0700) stays out.
fn etc_entries(
    host: &Path,
    rel: &Path,
    depth: u32,
    out: &mut Vec<EtcEntry>,
) -> Result<(), JailError> {
    if out.len() >= ETC_MAX_ENTRIES {
        return Err(JailError::Host(format!(
            "more than {ETC_MAX_ENTRIES} entries in the host's /etc folders to copy"
        )));
    }
    let path = host.join(rel);
    let Ok(meta) = fs::symlink_metadata(&path) else {
        return Ok(());
    };
    let mode = meta.mode();
    if meta.file_type().is_symlink() {
        let to = fs::read_link(&path).map_err(|e| sys("readlink", &path, e))?;
        out.push(EtcEntry::Symlink {
            rel: rel.to_owned(),
            to,
        });
    } else if meta.is_file() && mode & 0o004 != 0 && meta.len() <= ETC_MAX_FILE {
        out.push(EtcEntry::File {
            rel: rel.to_owned(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ino: meta.ino(),
        });
    } else if meta.is_dir() && mode & 0o005 == 0o005 && depth < ETC_MAX_DEPTH {
        out.push(EtcEntry::Dir {
            rel: rel.to_owned(),
        });
        let mut names: Vec<_> = fs::read_dir(&path)
            .map_err(|e| sys("readdir", &path, e))?
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        names.sort();
        for name in names {
            etc_entries(host, &rel.join(name), depth + 1, out)?;
        }
    }
    Ok(())
}

/// The host folder every sandbox binds read-only as its `/etc`: the
/// generated files ([`generated_etc`]) and copies of the host's [`ETC`]
/// entries, all root's, files 0644 and folders 0755.
///
/// Made once per state of those host entries, in a folder named after it
/// (their names, sizes, inodes and modification times), so every sandbox of
/// every runner on the host shares one copy: in the page cache, not in
/// each sandbox's tmpfs (about 230 KiB of `Shmem` and 80 tmpfs inodes per
/// sandbox before), and a sandbox's start binds one folder instead of
/// writing and copying some 25 files. The process keeps the folder's path
/// (the zygote looks once, at start, and its supervisors inherit it), so a
/// change to the host's `/etc` reaches sandboxes started after the runner
/// restarts; a folder removed meanwhile is made again.
pub(crate) fn shared_etc() -> Result<PathBuf, JailError> {
    let mut known = SHARED_ETC
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(dir) = known.as_ref()
        && dir.is_dir()
    {
        return Ok(dir.clone());
    }
    let caches = [
        PathBuf::from(ETC_CACHE),
        std::env::temp_dir().join("asbx-jail"),
    ];
    let dir = make_shared_etc_in(&caches, Path::new("/etc"))?;
    *known = Some(dir.clone());
    Ok(dir)
}

static SHARED_ETC: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

/// Takes [`shared_etc`]'s folder from the environment variable `var` (the
/// zygote's, set by the runner) when it names one, else finds it now.
pub(crate) fn shared_etc_from_env(var: &str) {
    match std::env::var_os(var).map(PathBuf::from) {
        Some(dir) if dir.is_dir() => {
            *SHARED_ETC
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(dir);
        }
        _ => {
            let _ = shared_etc();
        }
    }
}

/// [`make_shared_etc`] in the first of `caches` where it can be made.
fn make_shared_etc_in(caches: &[PathBuf], host_etc: &Path) -> Result<PathBuf, JailError> {
    let mut failed = Vec::new();
    for cache in caches {
        match make_shared_etc(cache, host_etc) {
            Ok(dir) => return Ok(dir),
            Err(e) => failed.push(e.to_string()),
        }
    }
    Err(JailError::Host(format!(
        "the sandboxes' /etc: {}",
        failed.join("; ")
    )))
}

/// [`shared_etc`]'s folder under `cache` for the host folder `host_etc`.
fn make_shared_etc(cache: &Path, host_etc: &Path) -> Result<PathBuf, JailError> {
    use std::hash::{Hash, Hasher};
    let mut entries = Vec::new();
    for name in ETC {
        etc_entries(host_etc, Path::new(name), 0, &mut entries)?;
    }
    let generated = generated_etc();
    // SipHash with fixed keys: the same name in every process of a build
    // (a cache key: the folder is root's, nothing untrusted chooses it).
    let mut h = std::hash::DefaultHasher::new();
    (host_etc, &generated, &entries).hash(&mut h);
    let dir = cache.join(format!("etc-{:016x}", h.finish()));
    if dir.is_dir() {
        return Ok(dir);
    }
    match fs::create_dir(cache) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(sys("mkdir", cache, e)),
    }
    // Only root may have made or changed what every sandbox will see.
    let meta = fs::symlink_metadata(cache).map_err(|e| sys("stat", cache, e))?;
    if !meta.is_dir() || meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        return Err(JailError::Host(format!(
            "{} must be a folder of root's that no one else may write to",
            cache.display()
        )));
    }
    fs::set_permissions(cache, fs::Permissions::from_mode(0o755))
        .map_err(|e| sys("chmod", cache, e))?;
    let tmp = cache.join(format!(
        ".{}.{}",
        dir.file_name().and_then(OsStr::to_str).unwrap_or("etc"),
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&tmp);
    let filled = fill_etc(&tmp, host_etc, &generated, &entries);
    let placed = filled.and_then(|()| match fs::rename(&tmp, &dir) {
        Ok(()) => Ok(()),
        // Another process made the same folder first: use it.
        Err(_) if dir.is_dir() => Ok(()),
        Err(e) => Err(sys("rename", &tmp, e)),
    });
    let _ = fs::remove_dir_all(&tmp);
    placed.map(|()| dir)
}

fn fill_etc(
    dir: &Path,
    host_etc: &Path,
    generated: &[(&str, String)],
    entries: &[EtcEntry],
) -> Result<(), JailError> {
    mkdir(dir, 0o755)?;
    for (name, content) in generated {
        write_file(&dir.join(name), content)?;
    }
    for e in entries {
        match e {
            EtcEntry::Dir { rel } => mkdir(&dir.join(rel), 0o755)?,
            EtcEntry::Symlink { rel, to } => {
                let dst = dir.join(rel);
                symlink(to, &dst).map_err(|e| sys("symlink", &dst, e))?;
            }
            EtcEntry::File { rel, .. } => {
                let (src, dst) = (host_etc.join(rel), dir.join(rel));
                fs::copy(&src, &dst).map_err(|e| sys("copy", &src, e))?;
                fs::set_permissions(&dst, fs::Permissions::from_mode(0o644))
                    .map_err(|e| sys("chmod", &dst, e))?;
            }
        }
    }
    Ok(())
}

fn build_dev() -> Result<(), JailError> {
    // A folder of the root tmpfs (no superblock of its own), bound onto
    // itself so that this mount, unlike the root's, allows device nodes.
    let dev = Path::new("/dev");
    mkdir(dev, 0o755)?;
    bind_with(dev, dev, MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC)?;
    let rw = Mode::from_bits_truncate(0o666);
    for (name, major, minor) in [
        ("null", 1, 3),
        ("zero", 1, 5),
        ("full", 1, 7),
        ("random", 1, 8),
        ("urandom", 1, 9),
        ("tty", 5, 0),
    ] {
        let p = dev.join(name);
        mknod(&p, SFlag::S_IFCHR, rw, makedev(major, minor)).map_err(|e| sys("mknod", &p, e))?;
    }
    for (name, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
        ("core", "/proc/kcore"),
    ] {
        symlink(to, dev.join(name)).map_err(|e| sys("symlink", name, e))?;
    }
    let pts = dev.join("pts");
    mkdir(&pts, 0o755)?;
    mnt(
        Some(Path::new("devpts")),
        &pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )?;
    let shm = dev.join("shm");
    mkdir(&shm, 0o1777)?;
    bind_with(
        &shm,
        &shm,
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
    )?;
    mnt(
        None,
        dev,
        None,
        MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NOEXEC,
        None,
    )
}

/// A fresh `/proc` with `hidepid=invisible` (2): each uid of the sandbox
/// sees only its own processes (a tool can't read the agent's or an MCP
/// server's command line or environment, nor even see them exist). No `gid=`
/// exemption: the agent and its tools share gid 1000, so it would exempt
/// the tools too. The agent finds its tools' pids in the child cgroups'
/// `cgroup.procs` instead, and signals them with `CAP_KILL`.
fn build_proc() -> Result<(), JailError> {
    let proc_ = Path::new("/proc");
    mkdir(proc_, 0o555)?;
    mnt(
        Some(Path::new("proc")),
        proc_,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("hidepid=invisible"),
    )?;
    for name in PROC_READ_ONLY {
        let p = proc_.join(name);
        if p.exists() {
            bind(&p, &p, false)?;
        }
    }
    let null = Path::new("/dev/null");
    for name in PROC_MASKED {
        let p = proc_.join(name);
        if p.exists() {
            mnt(Some(null), &p, None, MsFlags::MS_BIND, None)?;
        }
    }
    Ok(())
}

/// Copy the host working directory into `/work`: folders, regular files and
/// symlinks (as links, never followed), owned by the sandbox's ids.
fn copy_tree(src: &Path, dst: &Path, uid: u32, gid: u32, depth: u32) -> Result<(), JailError> {
    if depth > 64 {
        return Err(JailError::Setup(format!(
            "{} is nested too deep",
            src.display()
        )));
    }
    let entries = fs::read_dir(src).map_err(|e| sys("read", src, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| sys("read", src, e))?;
        let name: &OsStr = &entry.file_name();
        let from = src.join(name);
        let to = dst.join(name);
        let ft = entry.file_type().map_err(|e| sys("stat", &from, e))?;
        if ft.is_symlink() {
            let link = fs::read_link(&from).map_err(|e| sys("readlink", &from, e))?;
            symlink(link, &to).map_err(|e| sys("symlink", &to, e))?;
        } else if ft.is_dir() {
            mkdir(&to, 0o2775)?;
            copy_tree(&from, &to, uid, gid, depth + 1)?;
        } else if ft.is_file() {
            fs::copy(&from, &to).map_err(|e| sys("copy", &from, e))?;
            let mode = fs::metadata(&to).map_err(|e| sys("stat", &to, e))?.mode();
            fs::set_permissions(&to, fs::Permissions::from_mode((mode & 0o777) | 0o660))
                .map_err(|e| sys("chmod", &to, e))?;
        } else {
            continue;
        }
        lchown(&to, Some(uid), Some(gid)).map_err(|e| sys("chown", &to, e))?;
    }
    Ok(())
}

/// Paths the sandbox may write (for the Landlock rules): `/work`, `/tmp`,
/// `/dev/shm`, and the writable binds. The run folder is listed for reading.
pub(crate) fn writable_roots(plan: &RootPlan) -> Vec<PathBuf> {
    let mut v = vec![
        PathBuf::from(WORKDIR_IN_JAIL),
        PathBuf::from("/tmp"),
        PathBuf::from("/dev/shm"),
    ];
    v.extend(
        plan.bind_targets()
            .filter(|(_, w)| *w)
            .map(|(p, _)| p.to_path_buf()),
    );
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host `/etc` with what the sandboxes may see and what they may not.
    fn host_etc() -> tempfile::TempDir {
        let host = tempfile::tempdir().unwrap();
        let p = host.path();
        fs::write(p.join("services"), "http 80/tcp\n").unwrap();
        fs::write(p.join("shells"), "/bin/sh\n").unwrap();
        fs::set_permissions(p.join("shells"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(p.join("environment"), "TOKEN=secret\n").unwrap();
        fs::create_dir_all(p.join("ssl/certs")).unwrap();
        fs::write(p.join("ssl/certs/a.pem"), "CERT\n").unwrap();
        symlink("a.pem", p.join("ssl/certs/link.pem")).unwrap();
        fs::create_dir(p.join("ssl/private")).unwrap();
        fs::write(p.join("ssl/private/key.pem"), "KEY\n").unwrap();
        fs::set_permissions(p.join("ssl/private"), fs::Permissions::from_mode(0o710)).unwrap();
        host
    }

    #[test]
    fn shared_etc_holds_what_any_host_user_may_read() {
        let (host, cache) = (host_etc(), tempfile::tempdir().unwrap());
        let cache = cache.path().join("c");
        let dir = make_shared_etc(&cache, host.path()).unwrap();
        let read = |rel: &str| fs::read_to_string(dir.join(rel)).ok();
        assert!(
            read("passwd")
                .unwrap()
                .contains(&format!("agent:x:{AGENT_UID}:"))
        );
        assert_eq!(read("services").as_deref(), Some("http 80/tcp\n"));
        assert_eq!(read("ssl/certs/a.pem").as_deref(), Some("CERT\n"));
        assert_eq!(
            fs::read_link(dir.join("ssl/certs/link.pem")).unwrap(),
            Path::new("a.pem")
        );
        for hidden in ["shells", "environment", "ssl/private"] {
            assert!(!dir.join(hidden).exists(), "{hidden} was copied");
        }
        for (rel, mode) in [("", 0o755), ("ssl/certs", 0o755), ("services", 0o644)] {
            let m = fs::metadata(dir.join(rel)).unwrap();
            assert_eq!((m.mode() & 0o7777, m.uid()), (mode, 0), "{rel}");
        }
        let m = fs::metadata(&cache).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o755);
    }

    #[test]
    fn shared_etc_is_made_once_per_state_of_the_host_files() {
        let (host, cache) = (host_etc(), tempfile::tempdir().unwrap());
        let first = make_shared_etc(cache.path(), host.path()).unwrap();
        let ino = fs::metadata(first.join("passwd")).unwrap().ino();
        let again = make_shared_etc(cache.path(), host.path()).unwrap();
        assert_eq!(again, first);
        assert_eq!(fs::metadata(again.join("passwd")).unwrap().ino(), ino);

        fs::write(host.path().join("services"), "http 8080/tcp\n").unwrap();
        let changed = make_shared_etc(cache.path(), host.path()).unwrap();
        assert_ne!(changed, first);
        assert_eq!(
            fs::read_to_string(changed.join("services")).unwrap(),
            "http 8080/tcp\n"
        );
        // The older folder stays for the sandboxes that bound it; no
        // half-made folder is left beside them.
        let mut names: Vec<_> = fs::read_dir(cache.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.iter().all(|n| n.starts_with("etc-")), "{names:?}");
    }

    #[test]
    fn shared_etc_goes_to_the_next_folder_when_one_is_read_only() {
        let (host, tmp) = (host_etc(), tempfile::tempdir().unwrap());
        fs::write(tmp.path().join("file"), "").unwrap();
        let caches = [tmp.path().join("file/c"), tmp.path().join("c")];
        let dir = make_shared_etc_in(&caches, host.path()).unwrap();
        assert!(dir.starts_with(&caches[1]), "{}", dir.display());
        let err = make_shared_etc_in(&caches[..1], host.path()).unwrap_err();
        assert!(err.to_string().contains("file/c"), "{err}");
    }

    #[test]
    fn shared_etc_refuses_a_folder_others_may_write() {
        let (host, cache) = (host_etc(), tempfile::tempdir().unwrap());
        fs::set_permissions(cache.path(), fs::Permissions::from_mode(0o777)).unwrap();
        let err = make_shared_etc(cache.path(), host.path()).unwrap_err();
        assert!(err.to_string().contains("no one else may write"), "{err}");
        assert_eq!(fs::read_dir(cache.path()).unwrap().count(), 0);
    }
}
