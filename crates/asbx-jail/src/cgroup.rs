//! Per-sandbox cgroups: memory, pids and cpu bounds, and the kill switch
//! used at teardown.
//!
//! - cgroup v1 (one hierarchy per controller): `<root>/{memory,pids,cpu}/asbx/<name>`,
//!   with `memory.limit_in_bytes` (+ `memory.memsw.limit_in_bytes` when swap
//!   accounting exists), `pids.max`, `cpu.cfs_period_us`/`cpu.cfs_quota_us`.
//! - cgroup v2 (when `<root>` is a cgroup2 mount with memory, pids and cpu
//!   available): `<root>/asbx/<name>` with `memory.max`, `memory.swap.max`,
//!   `pids.max`, `cpu.max`; teardown writes `cgroup.kill`.
//!
//! The supervisor plans the paths before `clone`, then creates the
//! directories, writes the limits and moves the sandbox's init into them
//! (its pid into each `cgroup.procs`) while init builds its root; init
//! waits for that before anything it runs could use a resource. A sandbox
//! forked by the zygote gets its directories made ahead (a
//! [`SpareCgroups`] renamed for it): its supervisor only writes the limits
//! and moves init. The shared parent `asbx` directory is left in place;
//! the per-sandbox directory is removed.
//!
//! **Child cgroups** (cgroup v1, when the host has the memory, pids and
//! freezer hierarchies): under each sandbox directory of those three, one
//! child per [`CGROUP_CHILDREN`] (`tools`, `mcp`), with memory (+swap) and
//! pids bounds below the sandbox's ([`child_memory`], [`child_pids`]), so a
//! tool's memory use can't get the agent OOM-killed. Each child's
//! `cgroup.procs` belongs to the one user that joins it ([`joiner_uid`]:
//! `tools` to the tool user, host uid `host_uid + 1`; `mcp` to the MCP
//! user, `host_uid + 2`; mode 0644), since a process joins between `fork`
//! and `exec`, already under its own uid: a tool can't write itself into
//! `mcp` (where the tools' reaper would not look), an MCP server not into
//! `tools`, and the agent into neither. Their `freezer.state` belongs to the
//! agent (host uid `host_uid`, mode 0644); every other file (`tasks`
//! included) stays root's, which the sandbox's user namespace does not map. The sandbox sees them at [`TOOL_CGROUP_IN_JAIL`] (see
//! its doc comment; bound by [`crate::rootfs`]). On cgroup v2 the sandbox's
//! processes live in the sandbox directory itself, which the "no internal
//! processes" rule forbids giving children: no child cgroups there yet, so
//! the folders are absent (the layout's documented "no cgroups" case).
//! The memory children are not made with the sandbox: the supervisor makes
//! one when the sandbox's main process asks for it (before the child's
//! first process starts), and mounts it in the sandbox then
//! ([`Cgroups::make_on_request`]): a memory cgroup costs the host about
//! 0.3 MiB of kernel memory, and an idle sandbox runs no tool.
//! Teardown removes the children before their parent.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use std::os::unix::fs::{PermissionsExt, chown};

#[cfg(doc)]
use asbx_protocol::jail::TOOL_CGROUP_IN_JAIL;
use asbx_protocol::jail::{AGENT_UID, CGROUP_CHILDREN, MCP_UID, ResourceLimits, TOOL_UID};

use crate::JailError;

/// The default mount point of the cgroup file systems.
pub(crate) const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The parent folder of every sandbox cgroup, under each hierarchy.
pub(crate) const PARENT: &str = "asbx";

const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Which cgroup layout this host has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Layout {
    /// One hierarchy per controller: the memory, pids and cpu mount points.
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: PathBuf,
        /// The freezer hierarchy, when mounted: child cgroups need it.
        freezer: Option<PathBuf>,
    },
    /// The unified hierarchy.
    V2 { root: PathBuf },
}

impl Layout {
    /// The hierarchies a sandbox has a cgroup in: memory, pids, cpu and
    /// (when mounted) freezer on v1, in that order; the one on v2.
    pub(crate) fn hierarchies(&self) -> Vec<&PathBuf> {
        match self {
            Layout::V1 {
                memory,
                pids,
                cpu,
                freezer,
            } => [Some(memory), Some(pids), Some(cpu), freezer.as_ref()]
                .into_iter()
                .flatten()
                .collect(),
            Layout::V2 { root } => vec![root],
        }
    }

    /// Find a usable layout under `root`, or say why there is none.
    pub(crate) fn detect(root: &Path) -> Result<Layout, String> {
        if is_cgroup2(root) {
            let controllers = fs::read_to_string(root.join("cgroup.controllers"))
                .map_err(|e| format!("{}: {e}", root.display()))?;
            let have: Vec<&str> = controllers.split_whitespace().collect();
            let missing: Vec<&str> = ["memory", "pids", "cpu"]
                .into_iter()
                .filter(|c| !have.contains(c))
                .collect();
            if missing.is_empty() {
                return Ok(Layout::V2 {
                    root: root.to_path_buf(),
                });
            }
            return Err(format!("cgroup2 lacks controllers: {}", missing.join(", ")));
        }
        let memory = root.join("memory");
        let pids = root.join("pids");
        let cpu = root.join("cpu");
        let needs = [
            memory.join("memory.limit_in_bytes"),
            pids.join("cgroup.procs"),
            cpu.join("cpu.cfs_quota_us"),
        ];
        let missing: Vec<String> = needs
            .iter()
            .filter(|p| !p.exists())
            .map(|p| p.display().to_string())
            .collect();
        if missing.is_empty() {
            let freezer = root.join("freezer");
            let freezer = freezer.join("cgroup.procs").exists().then_some(freezer);
            Ok(Layout::V1 {
                memory,
                pids,
                cpu,
                freezer,
            })
        } else {
            Err(format!(
                "no cgroup v1 controllers: missing {}",
                missing.join(", ")
            ))
        }
    }
}

// The statfs type is a c_long whose width varies by platform.
#[allow(clippy::unnecessary_cast)]
fn is_cgroup2(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .map(|s| s.filesystem_type().0 as i64 == CGROUP2_SUPER_MAGIC)
        .unwrap_or(false)
}

/// Check a cgroup name: a single path component of safe characters.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// The memory bound of a child cgroup: the sandbox's, less a reserve for
/// the agent of max(64 MiB, 1/8), the reserve at most half.
pub(crate) fn child_memory(sandbox: u64) -> u64 {
    sandbox - (64u64 << 20).max(sandbox / 8).min(sandbox / 2)
}

/// The pids bound of a child cgroup: the sandbox's, less max(8, 1/8), at most half.
pub(crate) fn child_pids(sandbox: u64) -> u64 {
    sandbox - 8u64.max(sandbox / 8).min(sandbox / 2)
}

/// One child cgroup directory on the host and where it appears in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChildMount {
    /// One of [`CGROUP_CHILDREN`].
    pub(crate) child: &'static str,
    /// `memory`, `pids` or `freezer`.
    pub(crate) controller: &'static str,
    /// The host directory.
    pub(crate) host: PathBuf,
    /// Made on request, not with the sandbox (the memory children: see
    /// [`Cgroups::make_on_request`]); until then the sandbox's folder for
    /// it is an empty mount point.
    pub(crate) on_request: bool,
}

/// The cgroups of one sandbox. Dropping it kills what is left and removes them.
#[derive(Debug)]
pub(crate) struct Cgroups {
    layout: Layout,
    /// The sandbox directories made so far (what a drop removes).
    dirs: Vec<PathBuf>,
    /// All of them, made or not ([`Cgroups::plan`]).
    planned: Vec<PathBuf>,
    children: Vec<ChildMount>,
    /// The directories (children included) exist already: the zygote made
    /// them ahead of time and renamed them for this sandbox
    /// ([`SpareCgroups::take_as`]); [`Cgroups::make`] and
    /// [`Cgroups::create_children`] only write limits and owners.
    made_ahead: bool,
}

fn set_owner(path: &Path, uid: Option<u32>, gid: Option<u32>, mode: u32) -> Result<(), JailError> {
    let e = |e: io::Error| JailError::Cgroup(format!("{}: {e}", path.display()));
    chown(path, uid, gid).map_err(e)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(e)
}

fn write(path: &Path, value: &str) -> Result<(), JailError> {
    fs::write(path, value).map_err(|e| JailError::Cgroup(format!("{}: {e}", path.display())))
}

fn mkdir(path: &Path) -> Result<bool, JailError> {
    match fs::create_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(JailError::Cgroup(format!("{}: {e}", path.display()))),
    }
}

impl Cgroups {
    /// The sandbox directories [`Cgroups::create`] makes for `name`, in the
    /// order it makes them, one per hierarchy.
    pub(crate) fn dirs_named(layout: &Layout, name: &str) -> Result<Vec<PathBuf>, JailError> {
        if !valid_name(name) {
            return Err(JailError::Policy(format!("invalid cgroup name {name:?}")));
        }
        Ok(layout
            .hierarchies()
            .into_iter()
            .map(|h| h.join(PARENT).join(name))
            .collect())
    }

    /// [`Cgroups::dirs_named`], none of which may exist yet. The supervisor hands
    /// them to its cleanup guard *before* creating any, so that a supervisor
    /// killed half-way through creating them leaves nothing behind.
    pub(crate) fn planned_dirs(layout: &Layout, name: &str) -> Result<Vec<PathBuf>, JailError> {
        let dirs = Cgroups::dirs_named(layout, name)?;
        if let Some(taken) = dirs.iter().find(|d| d.exists()) {
            return Err(JailError::Cgroup(format!(
                "{} already exists (a leftover of a killed supervisor?)",
                taken.display()
            )));
        }
        Ok(dirs)
    }

    /// Give the sandbox named `name` the default CPU weight again (after a
    /// `background` boot).
    pub(crate) fn foreground(layout: &Layout, name: &str) -> Result<(), JailError> {
        if !valid_name(name) {
            return Err(JailError::Policy(format!("invalid cgroup name {name:?}")));
        }
        match layout {
            Layout::V1 { cpu, .. } => write(
                &cpu.join(PARENT).join(name).join("cpu.shares"),
                DEFAULT_SHARES,
            ),
            Layout::V2 { root } => write(
                &root.join(PARENT).join(name).join("cpu.weight"),
                DEFAULT_WEIGHT,
            ),
        }
    }

    /// Create the sandbox's cgroups and write its limits; its child cgroups
    /// are planned ([`Cgroups::child_mounts`]), made by
    /// [`Cgroups::create_children`]. [`Cgroups::plan`] then
    /// [`Cgroups::make`].
    #[cfg(test)]
    pub(crate) fn create(
        layout: Layout,
        name: &str,
        limits: &ResourceLimits,
        background: bool,
    ) -> Result<Cgroups, JailError> {
        let mut me = Cgroups::plan(layout, name)?;
        me.make(limits, background)?;
        Ok(me)
    }

    /// The sandbox's cgroups, planned, none made yet: where they go
    /// ([`Cgroups::procs_files`], [`Cgroups::child_mounts`]), so that the
    /// supervisor can `clone` the sandbox's init first and make them
    /// ([`Cgroups::make`]) while init builds the first half of its root.
    pub(crate) fn plan(layout: Layout, name: &str) -> Result<Cgroups, JailError> {
        let planned = Cgroups::dirs_named(&layout, name)?;
        let mut me = Cgroups {
            layout,
            dirs: Vec::new(),
            planned,
            children: Vec::new(),
            made_ahead: false,
        };
        if let Layout::V1 {
            freezer: Some(_), ..
        } = &me.layout
        {
            let [m, p, _, f] = [0, 1, 2, 3].map(|i| me.planned[i].clone());
            me.plan_children_v1(&m, &p, &f);
        }
        Ok(me)
    }

    /// [`Cgroups::plan`] for cgroups the zygote made ahead and renamed to
    /// `name` ([`SpareCgroups::take_as`]): they exist, children included,
    /// and a drop removes them from now on.
    pub(crate) fn plan_made_ahead(layout: Layout, name: &str) -> Result<Cgroups, JailError> {
        let mut me = Cgroups::plan(layout, name)?;
        me.made_ahead = true;
        me.dirs = me.planned.clone();
        Ok(me)
    }

    /// Makes the planned sandbox cgroups and writes their limits. Refuses a
    /// name whose cgroup exists already (a leftover of a killed supervisor,
    /// or another sandbox's), and removes only what it made itself.
    pub(crate) fn make(
        &mut self,
        limits: &ResourceLimits,
        background: bool,
    ) -> Result<(), JailError> {
        let exists = |dir: &Path| {
            JailError::Cgroup(format!(
                "{} already exists (a leftover of a killed supervisor?)",
                dir.display()
            ))
        };
        match self.layout.clone() {
            // Made ahead: they exist (and are in `dirs`).
            Layout::V1 { .. } if self.made_ahead => self.write_v1_limits(limits, background)?,
            Layout::V1 { .. } => {
                for dir in self.planned.clone() {
                    if let Some(parent) = dir.parent() {
                        mkdir(parent)?;
                    }
                    if !mkdir(&dir)? {
                        return Err(exists(&dir));
                    }
                    self.dirs.push(dir);
                }
                self.write_v1_limits(limits, background)?;
            }
            Layout::V2 { root } => {
                let parent = root.join(PARENT);
                write(&root.join("cgroup.subtree_control"), "+memory +pids +cpu")?;
                mkdir(&parent)?;
                write(&parent.join("cgroup.subtree_control"), "+memory +pids +cpu")?;
                let dir = self.planned[0].clone();
                if !mkdir(&dir)? {
                    return Err(exists(&dir));
                }
                self.dirs.push(dir.clone());
                if let Some(bytes) = limits.memory_bytes {
                    write(&dir.join("memory.max"), &bytes.to_string())?;
                    let swap = dir.join("memory.swap.max");
                    if swap.exists() {
                        write(&swap, "0")?;
                    }
                }
                if let Some(n) = limits.pids {
                    write(&dir.join("pids.max"), &n.to_string())?;
                }
                if background {
                    write(&dir.join("cpu.weight"), BACKGROUND_WEIGHT)?;
                }
                if let Some(pct) = limits.cpu_percent {
                    let quota = u64::from(pct.max(1)) * 1000;
                    write(&dir.join("cpu.max"), &format!("{quota} 100000"))?;
                }
            }
        }
        Ok(())
    }

    /// The sandbox's limits, on cgroup v1 (its directories made).
    fn write_v1_limits(&self, limits: &ResourceLimits, background: bool) -> Result<(), JailError> {
        let [m, p, c] = [&self.dirs[0], &self.dirs[1], &self.dirs[2]];
        if let Some(bytes) = limits.memory_bytes {
            write(&m.join("memory.limit_in_bytes"), &bytes.to_string())?;
            let memsw = m.join("memory.memsw.limit_in_bytes");
            if memsw.exists() {
                write(&memsw, &bytes.to_string())?;
            }
        }
        if let Some(n) = limits.pids {
            write(&p.join("pids.max"), &n.to_string())?;
        }
        if background {
            write(&c.join("cpu.shares"), BACKGROUND_SHARES)?;
        }
        if let Some(pct) = limits.cpu_percent {
            write(&c.join("cpu.cfs_period_us"), "100000")?;
            let quota = u64::from(pct.max(1)) * 1000;
            write(&c.join("cpu.cfs_quota_us"), &quota.to_string())?;
        }
        Ok(())
    }

    /// Where the `tools` and `mcp` children go under the memory, pids and
    /// freezer sandbox directories (see the module docs); made by
    /// [`Cgroups::create_children`].
    fn plan_children_v1(&mut self, memory: &Path, pids: &Path, freezer: &Path) {
        for child in CGROUP_CHILDREN {
            for (controller, parent) in [("memory", memory), ("pids", pids), ("freezer", freezer)] {
                self.children.push(ChildMount {
                    child,
                    controller,
                    host: parent.join(child),
                    on_request: controller == "memory",
                });
            }
        }
    }

    /// Makes the child cgroups [`Cgroups::create`] planned, with their
    /// bounds and owners, but those made on request (the memory children,
    /// [`Cgroups::make_on_request`]). Apart from `create` so that the
    /// supervisor can make them while the sandbox's init builds the first
    /// half of its root. `host_uid` owns their `freezer.state`; their
    /// `cgroup.procs` go to the user each is for ([`joiner_uid`]).
    pub(crate) fn create_children(
        &self,
        limits: &ResourceLimits,
        host_uid: u32,
    ) -> Result<(), JailError> {
        for m in self.children.iter().filter(|m| !m.on_request) {
            if !self.made_ahead {
                mkdir(&m.host)?;
            }
            make_child(m, limits, host_uid)?;
        }
        Ok(())
    }

    /// Whether some child cgroups are made on request
    /// ([`Cgroups::make_on_request`]).
    pub(crate) fn has_on_request(&self) -> bool {
        self.children.iter().any(|m| m.on_request)
    }

    /// Makes the memory cgroup of child `child` (one of [`CGROUP_CHILDREN`])
    /// if it is not there yet, with its bound and owners: on the sandbox's
    /// request, when its first tool (or MCP server) starts, since an idle
    /// sandbox needs none and each costs the host about 0.3 MiB of kernel
    /// memory. Returns it, and whether it was made now.
    pub(crate) fn make_on_request(
        &self,
        child: &str,
        limits: &ResourceLimits,
        host_uid: u32,
    ) -> Result<(&ChildMount, bool), JailError> {
        let m = self
            .children
            .iter()
            .find(|m| m.on_request && m.child == child)
            .ok_or_else(|| JailError::Cgroup(format!("no child cgroup {child:?} to make")))?;
        if !mkdir(&m.host)? {
            return Ok((m, false));
        }
        if let Err(e) = make_child(m, limits, host_uid) {
            let _ = fs::remove_dir(&m.host);
            return Err(e);
        }
        Ok((m, true))
    }

    /// The child cgroup directories the sandbox gets to see.
    pub(crate) fn child_mounts(&self) -> &[ChildMount] {
        &self.children
    }

    /// The `cgroup.procs` files the sandbox's init is moved into.
    pub(crate) fn procs_files(&self) -> Vec<PathBuf> {
        self.planned
            .iter()
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }

    /// The per-sandbox directories.
    #[cfg(test)]
    fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Kill every process left in the cgroups and remove them.
    pub(crate) fn destroy(&mut self) -> Result<(), JailError> {
        self.destroy_within(RMDIR_PATIENCE)
    }

    /// [`Cgroups::destroy`], trying for up to `patience` per cgroup.
    pub(crate) fn destroy_within(
        &mut self,
        patience: std::time::Duration,
    ) -> Result<(), JailError> {
        if self.dirs.is_empty() {
            return Ok(());
        }
        destroy_dirs_within(&self.layout, &self.dirs, patience)?;
        self.dirs.clear();
        self.children.clear();
        Ok(())
    }
}

/// A child cgroup's bounds and owners (see the module docs), its directory made.
fn make_child(m: &ChildMount, limits: &ResourceLimits, host_uid: u32) -> Result<(), JailError> {
    let dir = &m.host;
    match m.controller {
        "memory" => {
            if let Some(bytes) = limits.memory_bytes {
                let v = child_memory(bytes).to_string();
                write(&dir.join("memory.limit_in_bytes"), &v)?;
                let memsw = dir.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    write(&memsw, &v)?;
                }
            }
            // World-writable on some kernels (eventfd registration).
            let events = dir.join("cgroup.event_control");
            if events.exists() {
                set_owner(&events, Some(0), Some(0), 0o200)?;
            }
        }
        "pids" => {
            if let Some(n) = limits.pids {
                write(&dir.join("pids.max"), &child_pids(n).to_string())?;
            }
        }
        _ => {
            set_owner(&dir.join("freezer.state"), Some(host_uid), Some(0), 0o644)?;
        }
    }
    let joiner = joiner_uid(m.child, host_uid);
    set_owner(&dir.join("cgroup.procs"), Some(joiner), Some(0), 0o644)
}

/// The host uid of the only user that may write child `child`'s
/// `cgroup.procs` (see the module docs): the tool user for `tools`, the MCP
/// user for `mcp` (the only other child, [`CGROUP_CHILDREN`]).
pub(crate) fn joiner_uid(child: &str, host_uid: u32) -> u32 {
    let uid = if child == CGROUP_CHILDREN[0] {
        TOOL_UID
    } else {
        MCP_UID
    };
    host_uid + (uid - AGENT_UID)
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        let _ = self.destroy();
    }
}

fn kill_members(dir: &Path) -> bool {
    let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) else {
        return false;
    };
    let mut any = false;
    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        any = true;
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    any
}

/// The child cgroups (subdirectories) of `dir`, deepest first.
fn subcgroups(dir: &Path, depth: u32, out: &mut Vec<PathBuf>) {
    if depth > 4 {
        return;
    }
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            subcgroups(&e.path(), depth + 1, out);
            out.push(e.path());
        }
    }
}

/// Removes the sandbox cgroups (`asbx-*` under each hierarchy's parent)
/// that hold no process anywhere in their subtree and were made at least
/// `min_age` ago: what a runner killed together with its supervisors leaves
/// (no one is left to remove them). Never kills anything: a subtree with a
/// process is skipped, and `rmdir` of a populated cgroup fails anyway. The
/// age keeps it off a neighbour's sandbox being set up (its cgroups are
/// empty for a moment before init joins them); a cgroup whose age can't be
/// read counts as new. Also the spares ([`SpareCgroups`]) of zygotes no
/// longer running. Returns how many sandbox cgroups went.
pub(crate) fn sweep_stale(layout: &Layout, min_age: std::time::Duration) -> usize {
    // By name across the hierarchies: a sandbox's processes are in each,
    // and one with a process in any of them is left whole.
    let old = |name: &str| {
        layout.hierarchies().iter().any(|h| {
            fs::metadata(h.join(PARENT).join(name))
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= min_age)
        })
    };
    remove_empty(layout, |name| {
        (name.starts_with("asbx-") && old(name)) || spare_of_dead_zygote(name)
    })
}

/// Whether `dir`'s `cgroup.procs` lists a process (or can't be read).
fn has_processes(dir: &Path) -> bool {
    fs::read_to_string(dir.join("cgroup.procs")).map_or(true, |s| !s.trim().is_empty())
}

/// How long a teardown keeps trying to remove one cgroup that is still busy.
/// The CPU weight of a sandbox booted in the background, and the default.
const BACKGROUND_SHARES: &str = "2";
const DEFAULT_SHARES: &str = "1024";
const BACKGROUND_WEIGHT: &str = "1";
const DEFAULT_WEIGHT: &str = "100";

pub(crate) const RMDIR_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);
/// The same when no one else will remove them (the supervisor's parent
/// died): a runner SIGKILLed with 2,500 sandboxes left the host's exits
/// queued for longer than [`RMDIR_PATIENCE`], and 1,300 sandboxes' empty
/// cgroups behind.
pub(crate) const ORPHAN_RMDIR_PATIENCE: std::time::Duration = std::time::Duration::from_secs(120);

/// Kill what is left in `dirs` (and their child cgroups) and remove them,
/// children first. Missing directories are fine.
pub(crate) fn destroy_dirs(layout: &Layout, dirs: &[PathBuf]) -> Result<(), JailError> {
    destroy_dirs_within(layout, dirs, RMDIR_PATIENCE)
}

/// [`destroy_dirs`], trying for up to `patience` per cgroup.
fn destroy_dirs_within(
    layout: &Layout,
    dirs: &[PathBuf],
    patience: std::time::Duration,
) -> Result<(), JailError> {
    let mut all = Vec::new();
    for dir in dirs {
        subcgroups(dir, 0, &mut all);
        all.push(dir.clone());
    }
    let dirs = &all[..];
    let mut last_err = None;
    for dir in dirs {
        if !dir.exists() {
            continue;
        }
        if matches!(layout, Layout::V2 { .. }) {
            let _ = fs::write(dir.join("cgroup.kill"), "1");
        }
        // Normally empty: the sandbox's processes died with its pid namespace
        // before the supervisor reaped init. A removal can still race with the
        // kernel releasing the last task (an exiting task keeps its cgroup
        // populated until it is reaped), which on a loaded host takes longer
        // than a moment; so retry with a growing pause, for a bounded time.
        let mut removed = false;
        let deadline = std::time::Instant::now() + patience;
        let mut pause = std::time::Duration::from_millis(1);
        for attempt in 0u32.. {
            kill_members(dir);
            match fs::remove_dir(dir) {
                Ok(()) => {
                    removed = true;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    removed = true;
                    break;
                }
                Err(e) => {
                    last_err = Some(format!("{}: {e}", dir.display()));
                    if std::time::Instant::now() >= deadline {
                        break;
                    }
                    if attempt < 10 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(pause);
                        pause = (pause * 2).min(std::time::Duration::from_millis(50));
                    }
                }
            }
        }
        if removed {
            continue;
        }
    }
    match dirs.iter().any(|d| d.exists()) {
        true => Err(JailError::Cgroup(
            last_err.unwrap_or_else(|| "cgroup not removed".into()),
        )),
        false => Ok(()),
    }
}

/// The start of a spare's name: `zygote-<pid>-<n>`, `pid` the zygote's.
const SPARE_PREFIX: &str = "zygote-";

/// Sandbox cgroups the zygote makes ahead of time, while no request waits,
/// and renames for a sandbox ([`SpareCgroups::take_as`]): making them
/// (`mkdir` of a memory cgroup and its two children alone takes about
/// 0.45 ms on cgroup v1) was the supervisor's largest step after `clone`,
/// and a rename takes a few microseconds. Only on cgroup v1: cgroup v2
/// refuses to rename a cgroup. A spare has no limits until its sandbox's
/// supervisor writes them, and holds no process until its init joins.
/// Dropping this removes the spares left; the spares of a zygote that was
/// killed are removed by its runner ([`remove_spares_of`]) or by the next
/// sweep ([`sweep_stale`]).
#[derive(Debug)]
pub(crate) struct SpareCgroups {
    /// `None`: none are made (not cgroup v1, or making one failed).
    layout: Option<Layout>,
    next: u64,
    ready: Vec<String>,
}

impl SpareCgroups {
    pub(crate) fn new() -> SpareCgroups {
        let layout = Layout::detect(Path::new(CGROUP_ROOT))
            .ok()
            .filter(|l| matches!(l, Layout::V1 { .. }));
        SpareCgroups {
            layout,
            next: 0,
            ready: Vec::new(),
        }
    }

    /// How many are ready.
    pub(crate) fn len(&self) -> usize {
        self.ready.len()
    }

    /// Whether spares can be made here.
    pub(crate) fn enabled(&self) -> bool {
        self.layout.is_some()
    }

    /// Makes one more. If that fails it removes what it made and makes no
    /// more: sandboxes then make their own.
    pub(crate) fn make_one(&mut self) {
        let Some(layout) = self.layout.clone() else {
            return;
        };
        let name = format!("{SPARE_PREFIX}{}-{}", std::process::id(), self.next);
        self.next += 1;
        let made = Cgroups::plan(layout.clone(), &name).and_then(|cg| {
            for dir in &cg.planned {
                if let Some(parent) = dir.parent() {
                    mkdir(parent)?;
                }
                if !mkdir(dir)? {
                    return Err(JailError::Cgroup(format!("{} exists", dir.display())));
                }
            }
            cg.children
                .iter()
                .filter(|c| !c.on_request)
                .try_for_each(|c| mkdir(&c.host).map(drop))
        });
        match made {
            Ok(()) => self.ready.push(name),
            Err(_) => {
                if let Ok(dirs) = Cgroups::dirs_named(&layout, &name) {
                    let _ = destroy_dirs(&layout, &dirs);
                }
                self.layout = None;
            }
        }
    }

    /// Renames a spare to `name`, a sandbox's, in every hierarchy; its
    /// supervisor then only writes limits ([`Cgroups::plan_made_ahead`]).
    /// False when none is ready, when `name` is invalid or taken, or when a
    /// rename failed (what was renamed so far is removed, not left half
    /// renamed): the sandbox makes its own then.
    pub(crate) fn take_as(&mut self, name: &str) -> bool {
        let Some(layout) = &self.layout else {
            return false;
        };
        let Ok(to) = Cgroups::planned_dirs(layout, name) else {
            return false;
        };
        let Some(spare) = self.ready.pop() else {
            return false;
        };
        let Ok(from) = Cgroups::dirs_named(layout, &spare) else {
            return false;
        };
        for (i, (f, t)) in from.iter().zip(&to).enumerate() {
            if fs::rename(f, t).is_err() {
                let _ = destroy_dirs(layout, &to[..i]);
                let _ = destroy_dirs(layout, &from[i..]);
                return false;
            }
            // A rename keeps the time it was made: made new, so that a sweep
            // ([`sweep_stale`]) leaves it alone until init is in it, as it
            // does a sandbox's own cgroups.
            let now = nix::sys::time::TimeSpec::UTIME_NOW;
            let _ = nix::sys::stat::utimensat(
                nix::fcntl::AT_FDCWD,
                t,
                &now,
                &now,
                nix::sys::stat::UtimensatFlags::NoFollowSymlink,
            );
        }
        true
    }

    /// In a child forked from the zygote: the spares are the zygote's.
    pub(crate) fn forget(&mut self) {
        self.ready.clear();
        self.layout = None;
    }
}

impl Drop for SpareCgroups {
    fn drop(&mut self) {
        if let Some(layout) = &self.layout {
            for name in self.ready.drain(..) {
                if let Ok(dirs) = Cgroups::dirs_named(layout, &name) {
                    let _ = destroy_dirs(layout, &dirs);
                }
            }
        }
    }
}

/// The spares a zygote left (`zygote-<pid>-*`) that hold no process: what
/// a zygote that was killed leaves. Returns how many went.
pub(crate) fn remove_spares_of(layout: &Layout, pid: u32) -> usize {
    let prefix = format!("{SPARE_PREFIX}{pid}-");
    remove_empty(layout, |name| name.starts_with(&prefix))
}

/// Removes, by name across the hierarchies, the sandbox cgroups under the
/// parent whose names `pick` chooses and that hold no process anywhere in
/// their subtree. Returns how many names went.
fn remove_empty(layout: &Layout, pick: impl Fn(&str) -> bool) -> usize {
    let hierarchies = layout.hierarchies();
    let mut names = std::collections::BTreeSet::new();
    for h in &hierarchies {
        for e in fs::read_dir(h.join(PARENT)).into_iter().flatten().flatten() {
            if let Some(n) = e.file_name().to_str()
                && valid_name(n)
                && pick(n)
                && e.file_type().is_ok_and(|t| t.is_dir())
            {
                names.insert(n.to_owned());
            }
        }
    }
    let mut removed = 0;
    for name in names {
        let mut all = Vec::new();
        for h in &hierarchies {
            let dir = h.join(PARENT).join(&name);
            if dir.exists() {
                subcgroups(&dir, 0, &mut all);
                all.push(dir);
            }
        }
        if all.iter().any(|d| has_processes(d)) {
            continue;
        }
        if all.iter().all(|d| fs::remove_dir(d).is_ok() || !d.exists()) {
            removed += 1;
        }
    }
    removed
}

/// Whether a spare's name is of a zygote that is no longer running.
fn spare_of_dead_zygote(name: &str) -> bool {
    name.strip_prefix(SPARE_PREFIX)
        .and_then(|rest| rest.split_once('-'))
        .and_then(|(pid, _)| pid.parse::<u32>().ok())
        .is_some_and(|pid| !Path::new("/proc").join(pid.to_string()).exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(valid_name("sbx-1_a.b"));
        assert!(!valid_name(""));
        assert!(!valid_name(".."));
        assert!(!valid_name("a/b"));
        assert!(!valid_name("a b"));
    }

    #[test]
    fn v1_layout_and_limits_on_a_fake_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for (c, f) in [
            ("memory", "memory.limit_in_bytes"),
            ("pids", "cgroup.procs"),
            ("cpu", "cpu.cfs_quota_us"),
        ] {
            fs::create_dir_all(root.join(c)).unwrap();
            fs::write(root.join(c).join(f), "").unwrap();
        }
        let layout = Layout::detect(root).unwrap();
        assert!(matches!(layout, Layout::V1 { .. }));
        let limits = ResourceLimits::default();
        let mut cg = Cgroups::create(layout, "t1", &limits, false).unwrap();
        let mem = root.join("memory/asbx/t1/memory.limit_in_bytes");
        assert_eq!(fs::read_to_string(mem).unwrap(), (512u64 << 20).to_string());
        assert_eq!(
            fs::read_to_string(root.join("cpu/asbx/t1/cpu.cfs_quota_us")).unwrap(),
            "100000"
        );
        assert_eq!(
            fs::read_to_string(root.join("pids/asbx/t1/pids.max")).unwrap(),
            "256"
        );
        // A plain directory with files is not removable like a cgroup; clear it.
        for d in cg.dirs().to_vec() {
            for e in fs::read_dir(&d).unwrap() {
                fs::remove_file(e.unwrap().path()).unwrap();
            }
        }
        cg.destroy().unwrap();
        assert!(!root.join("memory/asbx/t1").exists());
    }

    /// Issue 26, item 4: each child's `cgroup.procs` is writable by the one
    /// user it is for, so a tool can't move itself into `mcp` (out of the
    /// tools' reaper's reach); `freezer.state` stays the agent's.
    #[test]
    fn only_the_user_a_child_is_for_may_join_it() {
        use std::os::unix::fs::MetadataExt;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED the child owners check: chown needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for (c, f) in [
            ("memory", "memory.limit_in_bytes"),
            ("pids", "cgroup.procs"),
            ("cpu", "cpu.cfs_quota_us"),
            ("freezer", "cgroup.procs"),
        ] {
            fs::create_dir_all(root.join(c)).unwrap();
            fs::write(root.join(c).join(f), "").unwrap();
        }
        let layout = Layout::detect(root).unwrap();
        let cg = Cgroups::plan(layout, "t1").unwrap();
        let made: Vec<&ChildMount> = cg.child_mounts().iter().filter(|m| !m.on_request).collect();
        assert_eq!(made.len(), 4, "pids and freezer of tools and mcp");
        for m in &made {
            fs::create_dir_all(&m.host).unwrap();
            for f in ["cgroup.procs", "freezer.state", "tasks"] {
                fs::write(m.host.join(f), "").unwrap();
            }
        }
        let host_uid = 300_000;
        cg.create_children(&ResourceLimits::default(), host_uid)
            .unwrap();
        let owner = |p: PathBuf| {
            let m = fs::metadata(p).unwrap();
            (m.uid(), m.gid(), m.mode() & 0o7777)
        };
        for m in made {
            let joiner = match m.child {
                "tools" => host_uid + 1,
                _ => host_uid + 2,
            };
            assert_eq!(
                owner(m.host.join("cgroup.procs")),
                (joiner, 0, 0o644),
                "{m:?}"
            );
            if m.controller == "freezer" {
                assert_eq!(owner(m.host.join("freezer.state")), (host_uid, 0, 0o644));
            }
        }
    }

    #[test]
    fn child_bounds_leave_the_agent_a_reserve() {
        assert_eq!(child_memory(512 << 20), 448 << 20);
        assert_eq!(child_memory(1 << 30), (1 << 30) - (128 << 20));
        assert_eq!(child_memory(96 << 20), 48 << 20);
        assert_eq!(child_pids(256), 224);
        assert_eq!(child_pids(20), 12);
        assert_eq!(child_pids(4), 2);
    }

    #[test]
    fn missing_controllers_are_reported() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(Layout::detect(tmp.path()).is_err());
    }
}
