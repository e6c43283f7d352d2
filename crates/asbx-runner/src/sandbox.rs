//! Starting one sandbox: the [`Sandbox`] trait and its two implementations.
//!
//! [`Jailed`] runs `asbx jail` with the policy as JSON, which builds the
//! namespaces, cgroups, seccomp and Landlock layers and runs the agent
//! inside; the runner's zygote forks it ([`ZygoteCell`]), or it is spawned
//! when none runs.
//! [`Unconfined`] runs `asbx agent` as a plain child process: for hosts
//! without namespaces, chosen by name and reported everywhere.
//!
//! **No host path inside a jail.** A bind mount shows its source's path in
//! the sandbox's `/proc/self/mountinfo`, so [`Jailed`] shares nothing from a
//! host folder: each sandbox's run folder (`/run/asbx`, where the gateway
//! and egress sockets appear) is a [`DetachedDir`] of its own, and the
//! `asbx` binary is a copy on one `DetachedDir` per runner process (made at
//! the first boot, shared by every sandbox, read-only inside). Neither is
//! mounted on the host, both vanish with the runner. On a kernel that can't
//! clone a detached mount (before 6.15) the runner falls back to host
//! folders, and says so once in its log.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use asbx_jail::DetachedDir;

use asbx_protocol::jail::{
    BindMount, IsolationProfile, JailEntry, JailPolicy, JailProfile, RUN_DIR_IN_JAIL,
    ResourceLimits, TOOL_GID, TOOL_UID, WORKDIR_IN_JAIL,
};
use tokio::process::Command;

use crate::child::SandboxChild;
use crate::error::RunnerError;

/// Where the `asbx` binary appears inside a jail.
pub(crate) const EXE_IN_JAIL: &str = "/opt/asbx/bin/asbx";
/// The gateway socket's file name, inside the run folder.
pub(crate) const GATEWAY_SOCKET: &str = "gateway.sock";
/// The egress proxy socket's file name, inside the run folder.
pub(crate) const PROXY_SOCKET: &str = "proxy.sock";

/// The host folders of one session.
#[derive(Debug, Clone)]
pub(crate) struct SessionDirs {
    pub(crate) root: PathBuf,
    /// The working directory (`/work` in a jail).
    pub(crate) work: PathBuf,
    /// Holds the gateway socket (`/run/asbx` in a jail): `root/run`, or a
    /// folder of the runner's one [`DetachedDir`] for run folders.
    pub(crate) run: PathBuf,
    /// The run folders' tmpfs, when `run` is on it; it lives as long as the
    /// runner (each sandbox keeps its clone of its own folder until it ends).
    detached_run: Option<Arc<DetachedDir>>,
}

impl SessionDirs {
    /// Creates `parent/name/work` and the run folder: a fresh folder with a
    /// random name on `detached_run` when given (the sandbox sees that name
    /// as its mount's root: nothing of the host, nor the sandbox's own
    /// name, which holds the runner's pid), else `parent/name/run`.
    pub(crate) fn create(
        parent: &Path,
        name: &str,
        detached_run: Option<Arc<DetachedDir>>,
    ) -> Result<Self, RunnerError> {
        let root = parent.join(name);
        let run = match &detached_run {
            Some(d) => d.path().join(hex::encode(rand::random::<[u8; 8]>())),
            None => root.join("run"),
        };
        let dirs = SessionDirs {
            work: root.join("work"),
            run,
            root,
            detached_run,
        };
        std::fs::create_dir_all(&dirs.work).map_err(|e| RunnerError::io(dirs.work.display(), e))?;
        let made = if dirs.detached_run.is_some() {
            use std::os::unix::fs::PermissionsExt;
            // Like the tmpfs root it replaces: whatever the runner's umask.
            std::fs::create_dir(&dirs.run).and_then(|()| {
                std::fs::set_permissions(&dirs.run, std::fs::Permissions::from_mode(0o755))
            })
        } else {
            std::fs::create_dir_all(&dirs.run)
        };
        if let Err(e) = made {
            dirs.remove();
            return Err(RunnerError::io(dirs.run.display(), e));
        }
        Ok(dirs)
    }

    pub(crate) fn gateway_socket(&self) -> PathBuf {
        self.run.join(GATEWAY_SOCKET)
    }

    pub(crate) fn proxy_socket(&self) -> PathBuf {
        self.run.join(PROXY_SOCKET)
    }

    /// Removes everything; errors are logged, not raised (teardown goes on).
    pub(crate) fn remove(&self) {
        let run = self.detached_run.as_ref().map(|_| &self.run);
        for dir in std::iter::once(&self.root).chain(run) {
            if let Err(e) = std::fs::remove_dir_all(dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %dir.display(), error = %e, "could not remove session folder");
            }
        }
    }
}

/// What a sandbox needs to start.
#[derive(Debug)]
pub(crate) struct SandboxSpec<'a> {
    /// Unique among live sandboxes; names the cgroups (`asbx-<name>`).
    pub(crate) name: &'a str,
    pub(crate) dirs: &'a SessionDirs,
    pub(crate) host_uid: u32,
    pub(crate) resources: &'a ResourceLimits,
    pub(crate) env: &'a [(String, String)],
    /// Booted ahead of time for the pool: at the lowest CPU weight until
    /// [`Sandbox::foreground`].
    pub(crate) background: bool,
}

/// A ready-to-start sandbox and what the agent must be told about its world.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) start: Start,
    /// The gateway socket path as the agent sees it.
    pub(crate) gateway_socket: String,
    /// The egress proxy socket path as the agent sees it.
    pub(crate) proxy_socket: String,
    /// The working directory as the agent sees it.
    pub(crate) workdir: String,
    /// Uid and gid for tools, when the sandbox provides a separate one.
    pub(crate) tool_user: Option<(u32, u32)>,
}

/// How a prepared sandbox's supervisor starts.
#[derive(Debug)]
pub(crate) enum Start {
    /// A plain child process.
    Command(Command),
    /// Forked by the runner's zygote, running `policy` (JSON); spawned as
    /// `asbx jail --policy` when the zygote can't.
    Zygote {
        zygote: Arc<ZygoteCell>,
        policy: String,
        /// The policy's cgroup name: a zygote that died mid-fork may have
        /// left it made (its supervisor got that far), and the spawned
        /// supervisor must make it afresh.
        cgroup: String,
    },
}

impl Start {
    /// Starts the supervisor; must run inside the runtime (its pipes and
    /// pidfd join the reactor). Blocks for a `fork` or a `spawn`.
    pub(crate) fn spawn(self) -> std::io::Result<SandboxChild> {
        match self {
            Start::Command(mut c) => SandboxChild::spawned(c.spawn()?),
            Start::Zygote {
                zygote,
                policy,
                cgroup,
            } => match zygote.fork(policy.as_bytes()) {
                Ok(child) => Ok(child),
                Err(_) => {
                    remove_leftover_cgroups(&cgroup);
                    let mut command = base_command(&zygote.exe);
                    command.arg("jail").arg("--policy").arg(&policy);
                    SandboxChild::spawned(command.spawn()?)
                }
            },
        }
    }
}

/// The runner's zygote (`asbx jail --zygote`, see `asbx_jail::Zygote`):
/// started on first use; one request at a time (a fork takes a fraction of
/// a millisecond, and only boots take the lock, never the line path).
#[derive(Debug)]
pub(crate) struct ZygoteCell {
    exe: PathBuf,
    state: Mutex<ZygoteState>,
}

#[derive(Debug)]
enum ZygoteState {
    NotStarted,
    Running(asbx_jail::Zygote),
    /// It could not be started: every sandbox is spawned instead.
    Unavailable,
}

impl ZygoteCell {
    pub(crate) fn new(exe: PathBuf) -> Self {
        ZygoteCell {
            exe,
            state: Mutex::new(ZygoteState::NotStarted),
        }
    }

    /// Forks a supervisor running `policy`; on an error the caller spawns
    /// it instead. A zygote that failed a request is ended and the next
    /// request starts a new one.
    fn fork(&self, policy: &[u8]) -> Result<SandboxChild, asbx_jail::JailError> {
        use nix::fcntl::OFlag;
        let host = |what: &str, e: &dyn std::fmt::Display| {
            asbx_jail::JailError::Host(format!("{what}: {e}"))
        };
        let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| host("pipe", &e));
        let (in_r, in_w) = pipe()?;
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        // Where the supervisor reports the sandbox's end early (`SandboxChild::ended`).
        let (report, report_w) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::Stream,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| host("socketpair", &e))?;
        let forked = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if matches!(*state, ZygoteState::NotStarted) {
                *state = match asbx_jail::Zygote::start(&self.exe) {
                    Ok(z) => ZygoteState::Running(z),
                    Err(e) => {
                        tracing::warn!(error = %e, "no zygote: every sandbox is spawned");
                        ZygoteState::Unavailable
                    }
                };
            }
            let ZygoteState::Running(z) = &*state else {
                return Err(asbx_jail::JailError::Host("no zygote".into()));
            };
            let forked = z.fork(
                policy,
                [in_r.as_fd(), out_w.as_fd(), err_w.as_fd()],
                Some(report_w.as_fd()),
            );
            if let Err(e) = &forked {
                tracing::warn!(error = %e, "the zygote failed; spawning this sandbox and starting a new zygote");
                *state = ZygoteState::NotStarted; // ends this one (see its Drop)
            }
            forked?
        };
        drop((in_r, out_w, err_w, report_w));
        SandboxChild::forked(forked, [in_w, out_r, err_r], report).map_err(|e| host("pipes", &e))
    }
}

/// One way of isolating a dispatch.
pub(crate) trait Sandbox: Send + Sync + std::fmt::Debug {
    /// The profile reported on start and in `/healthz`.
    fn profile(&self) -> IsolationProfile;
    fn prepare(&self, spec: &SandboxSpec<'_>) -> Result<Prepared, RunnerError>;
    /// Removes what a sandbox may leave behind if its supervisor was killed hard.
    fn cleanup(&self, spec: &SandboxSpec<'_>);
    /// Removes what sandboxes left when their runner was killed with them
    /// (no one else will); returns how many. Blocking.
    fn sweep(&self) -> usize {
        0
    }
    /// A sandbox booted in the background now serves a dispatch: give it
    /// the default CPU weight.
    fn foreground(&self, _name: &str) {}
    /// Where run folders that show no host path in the sandbox go, when
    /// this kind of sandbox wants them and the kernel allows it.
    fn detached_run(&self) -> Option<Arc<DetachedDir>> {
        None
    }
}

/// Logs once per runner process that a detached folder could not be made.
fn warn_no_detached(what: &str, e: &asbx_jail::JailError) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            error = %e,
            "{what}: no detached tmpfs on this kernel; sandboxes see host paths in /proc/self/mountinfo"
        );
    }
}

/// The run folders' tmpfs, one per runner process: a folder and two
/// sockets per sandbox, and for a sandbox with secrets bound at the egress
/// its CA bundle (the host's bundle plus its own CA, about 220 KiB), which
/// only the runner writes. One tmpfs for all, not one each: a superblock
/// costs more than its pages (a memcg-aware shrinker, for which every
/// memory cgroup on the host keeps state) and a descriptor. The size is a
/// cap, not a reservation: room for every sandbox's bundle.
const RUN_DIR_BYTES: u64 = 1 << 30;
const RUN_DIR_INODES: u32 = 4 * (u16::MAX as u32) + 64;

/// Where a jail binds the `asbx` binary from: a copy on one [`DetachedDir`]
/// per runner process and binary, made on first use; `exe` itself when that
/// can't be made. One lock per sandbox boot, never on the line path.
fn exe_source(exe: &Path) -> PathBuf {
    static COPIES: Mutex<Vec<(PathBuf, Option<DetachedDir>)>> = Mutex::new(Vec::new());
    let mut copies = COPIES.lock().unwrap_or_else(|p| p.into_inner());
    if !copies.iter().any(|(p, _)| p == exe) {
        let copy = copy_exe(exe)
            .map_err(|e| warn_no_detached("the asbx binary", &e))
            .ok();
        copies.push((exe.to_path_buf(), copy));
    }
    match copies.iter().find(|(p, _)| p == exe) {
        Some((_, Some(dir))) => dir.path().join("asbx"),
        _ => exe.to_path_buf(),
    }
}

fn copy_exe(exe: &Path) -> Result<DetachedDir, asbx_jail::JailError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |e: std::io::Error| asbx_jail::JailError::Host(format!("{}: {e}", exe.display()));
    let len = std::fs::metadata(exe).map_err(io)?.len();
    let dir = DetachedDir::tmpfs(len + (1 << 20), 16, true)?;
    let copy = dir.path().join("asbx");
    std::fs::copy(exe, &copy).map_err(io)?;
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).map_err(io)?;
    Ok(dir)
}

fn base_command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    cmd
}

/// Every layer, through `asbx jail`.
#[derive(Debug)]
pub(crate) struct Jailed {
    pub(crate) exe: PathBuf,
    pub(crate) profile: JailProfile,
    /// The run folders' tmpfs, made on first use ([`Sandbox::detached_run`]).
    pub(crate) run_dirs: std::sync::OnceLock<Option<Arc<DetachedDir>>>,
    /// Forks the supervisors, started on first use from the binary's copy.
    pub(crate) zygote: std::sync::OnceLock<Arc<ZygoteCell>>,
}

impl Sandbox for Jailed {
    fn profile(&self) -> IsolationProfile {
        IsolationProfile::Jail(self.profile)
    }

    fn prepare(&self, spec: &SandboxSpec<'_>) -> Result<Prepared, RunnerError> {
        // The supervisor runs from the detached copy too: the agent is forked
        // from it (`entry: agent`, no `execve`), and its `/proc/self/exe`
        // and memory map must show no host path either.
        let exe = exe_source(&self.exe);
        let cgroup = format!("asbx-{}", spec.name);
        let policy = JailPolicy {
            workdir: spec.dirs.work.display().to_string(),
            binds: vec![
                BindMount {
                    source: exe.display().to_string(),
                    target: EXE_IN_JAIL.to_owned(),
                    writable: false,
                },
                BindMount {
                    source: spec.dirs.run.display().to_string(),
                    target: RUN_DIR_IN_JAIL.to_owned(),
                    writable: false,
                },
            ],
            argv: vec![EXE_IN_JAIL.to_owned(), "agent".to_owned()],
            env: spec.env.to_vec(),
            host_uid: spec.host_uid,
            limits: spec.resources.clone(),
            cgroup: cgroup.clone(),
            profile: self.profile,
            entry: JailEntry::Agent,
            // `Slot::cleanup` removes what a killed supervisor leaves
            // (`remove_leftover_cgroups`): one process less per sandbox.
            guard: false,
            background: spec.background,
        };
        let json = serde_json::to_string(&policy)
            .map_err(|e| RunnerError::Spawn(format!("policy: {e}")))?;
        let zygote = self
            .zygote
            .get_or_init(|| Arc::new(ZygoteCell::new(exe.clone())));
        Ok(Prepared {
            start: Start::Zygote {
                zygote: Arc::clone(zygote),
                policy: json,
                cgroup,
            },
            gateway_socket: format!("{RUN_DIR_IN_JAIL}/{GATEWAY_SOCKET}"),
            proxy_socket: format!("{RUN_DIR_IN_JAIL}/{PROXY_SOCKET}"),
            workdir: WORKDIR_IN_JAIL.to_owned(),
            tool_user: Some((TOOL_UID, TOOL_GID)),
        })
    }

    fn cleanup(&self, spec: &SandboxSpec<'_>) {
        remove_leftover_cgroups(&format!("asbx-{}", spec.name));
    }

    fn sweep(&self) -> usize {
        // Empty and a minute old: no sandbox of a live runner is either for
        // long (its cgroups hold its processes from the first milliseconds).
        asbx_jail::sweep_stale_cgroups(std::time::Duration::from_secs(60))
    }

    fn foreground(&self, name: &str) {
        if let Err(e) = asbx_jail::foreground(&format!("asbx-{name}")) {
            tracing::warn!(sandbox = name, error = %e, "could not restore a sandbox's CPU weight");
        }
    }

    fn detached_run(&self) -> Option<Arc<DetachedDir>> {
        self.run_dirs
            .get_or_init(|| {
                DetachedDir::tmpfs(RUN_DIR_BYTES, RUN_DIR_INODES, false)
                    .map(Arc::new)
                    .map_err(|e| warn_no_detached("the run folder", &e))
                    .ok()
            })
            .clone()
    }
}

/// Removes a sandbox's cgroups once its supervisor is gone, children
/// first: after a clean end the supervisor leaves them (empty) to the
/// runner, to end the stream one teardown sooner; after a SIGKILL (the
/// runner runs its jails without a cleanup guard) nobody else would.
fn remove_leftover_cgroups(name: &str) {
    if let Err(e) = asbx_jail::remove_cgroups(name) {
        tracing::warn!(cgroup = name, error = %e, "could not remove a sandbox's cgroups");
    }
}

/// No isolation: a plain child process in the working directory.
#[derive(Debug)]
pub(crate) struct Unconfined {
    pub(crate) exe: PathBuf,
}

impl Sandbox for Unconfined {
    fn profile(&self) -> IsolationProfile {
        IsolationProfile::Unconfined
    }

    fn prepare(&self, spec: &SandboxSpec<'_>) -> Result<Prepared, RunnerError> {
        let mut command = base_command(&self.exe);
        command
            .arg("agent")
            .current_dir(&spec.dirs.work)
            .envs(spec.env.iter().cloned());
        Ok(Prepared {
            start: Start::Command(command),
            gateway_socket: spec.dirs.gateway_socket().display().to_string(),
            proxy_socket: spec.dirs.proxy_socket().display().to_string(),
            workdir: spec.dirs.work.display().to_string(),
            tool_user: None,
        })
    }

    fn cleanup(&self, _spec: &SandboxSpec<'_>) {}
}
