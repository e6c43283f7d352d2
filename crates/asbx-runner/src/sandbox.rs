//! Starting one sandbox: the [`Sandbox`] trait and its two implementations.
//!
//! [`Jailed`] runs `asbx jail --policy <json>`, which builds the namespaces,
//! cgroups, seccomp and Landlock layers and execs `asbx agent` inside.
//! [`Unconfined`] runs `asbx agent` as a plain child process: for hosts
//! without namespaces, chosen by name and reported everywhere.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use asbx_protocol::jail::{
    BindMount, IsolationProfile, JailPolicy, JailProfile, RUN_DIR_IN_JAIL, ResourceLimits,
    TOOL_GID, TOOL_UID, WORKDIR_IN_JAIL,
};
use tokio::process::Command;

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
    /// Holds the gateway socket (`/run/asbx` in a jail).
    pub(crate) run: PathBuf,
}

impl SessionDirs {
    /// Creates `parent/name/{work,run}`.
    pub(crate) fn create(parent: &Path, name: &str) -> Result<Self, RunnerError> {
        let root = parent.join(name);
        let dirs = SessionDirs {
            work: root.join("work"),
            run: root.join("run"),
            root,
        };
        for d in [&dirs.work, &dirs.run] {
            std::fs::create_dir_all(d).map_err(|e| RunnerError::io(d.display(), e))?;
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
        if let Err(e) = std::fs::remove_dir_all(&self.root)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.root.display(), error = %e, "could not remove session folder");
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
}

/// A ready-to-spawn command and what the agent must be told about its world.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) command: Command,
    /// The gateway socket path as the agent sees it.
    pub(crate) gateway_socket: String,
    /// The egress proxy socket path as the agent sees it.
    pub(crate) proxy_socket: String,
    /// The working directory as the agent sees it.
    pub(crate) workdir: String,
    /// Uid and gid for tools, when the sandbox provides a separate one.
    pub(crate) tool_user: Option<(u32, u32)>,
}

/// One way of isolating a dispatch.
pub(crate) trait Sandbox: Send + Sync + std::fmt::Debug {
    /// The profile reported on start and in `/healthz`.
    fn profile(&self) -> IsolationProfile;
    fn prepare(&self, spec: &SandboxSpec<'_>) -> Result<Prepared, RunnerError>;
    /// Removes what a sandbox may leave behind if its supervisor was killed hard.
    fn cleanup(&self, spec: &SandboxSpec<'_>);
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
}

impl Sandbox for Jailed {
    fn profile(&self) -> IsolationProfile {
        IsolationProfile::Jail(self.profile)
    }

    fn prepare(&self, spec: &SandboxSpec<'_>) -> Result<Prepared, RunnerError> {
        let policy = JailPolicy {
            workdir: spec.dirs.work.display().to_string(),
            binds: vec![
                BindMount {
                    source: self.exe.display().to_string(),
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
            cgroup: format!("asbx-{}", spec.name),
            profile: self.profile,
        };
        let json = serde_json::to_string(&policy)
            .map_err(|e| RunnerError::Spawn(format!("policy: {e}")))?;
        let mut command = base_command(&self.exe);
        command.arg("jail").arg("--policy").arg(json);
        Ok(Prepared {
            command,
            gateway_socket: format!("{RUN_DIR_IN_JAIL}/{GATEWAY_SOCKET}"),
            proxy_socket: format!("{RUN_DIR_IN_JAIL}/{PROXY_SOCKET}"),
            workdir: WORKDIR_IN_JAIL.to_owned(),
            tool_user: Some((TOOL_UID, TOOL_GID)),
        })
    }

    fn cleanup(&self, spec: &SandboxSpec<'_>) {
        remove_leftover_cgroups(&format!("asbx-{}", spec.name));
    }
}

/// Removes the cgroups of a sandbox whose supervisor died before it could.
/// Normally `asbx jail` removes them itself; this is the fallback.
fn remove_leftover_cgroups(name: &str) {
    let roots = [
        "memory",
        "pids",
        "cpu",
        "cpu,cpuacct",
        "freezer",
        "unified",
        "",
    ];
    for ctrl in roots {
        let dir = Path::new("/sys/fs/cgroup")
            .join(ctrl)
            .join("asbx")
            .join(name);
        if !dir.exists() {
            continue;
        }
        for _ in 0..50 {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            if std::fs::remove_dir(&dir).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
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
            command,
            gateway_socket: spec.dirs.gateway_socket().display().to_string(),
            proxy_socket: spec.dirs.proxy_socket().display().to_string(),
            workdir: spec.dirs.work.display().to_string(),
            tool_user: None,
        })
    }

    fn cleanup(&self, _spec: &SandboxSpec<'_>) {}
}
