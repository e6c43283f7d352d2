//! A sandbox's supervisor process, however it was started: forked by the
//! runner's zygote (`asbx_jail::Zygote`, the jail's usual way) or spawned
//! as a command (the unconfined agent, and the jail when no zygote runs).
//! Either way it is the runner's child, its stdio are pipes, and it is
//! killed if dropped while it runs.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;

/// How long a supervisor gets between SIGTERM and SIGKILL.
const KILL_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

#[derive(Debug)]
pub(crate) struct SandboxChild {
    pid: u32,
    how: How,
    pub(crate) stdin: Option<pipe::Sender>,
    pub(crate) stdout: Option<pipe::Receiver>,
    pub(crate) stderr: Option<pipe::Receiver>,
}

#[derive(Debug)]
enum How {
    Spawned(tokio::process::Child),
    Forked(Forked),
}

/// A child forked by the zygote. Its supervisor holds the other end of
/// `report` until it exits: first it writes the sandbox's end there (4
/// bytes, [`SandboxChild::ended`]), then its exit closes it, and it is then
/// reaped with `waitid(P_PID)` (its pid can't be reused before: it is our
/// child, unreaped). One descriptor per sandbox for both, where a pidfd
/// beside the socket took two.
#[derive(Debug)]
struct Forked {
    pid: Pid,
    status: Option<ExitStatus>,
    /// `None` once at its end-of-file (or handed to a reaper on drop).
    report: Option<tokio::net::UnixStream>,
}

impl Forked {
    /// Waits for it to exit and reaps it.
    async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(s) = self.status {
            return Ok(s);
        }
        if let Some(mut report) = self.report.take() {
            // Its end-of-file: the supervisor's descriptors are closed, so
            // it is exiting.
            let mut buf = [0u8; 16];
            while let Ok(n) = report.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        }
        // It closes its descriptors just before it becomes a zombie: this
        // blocks for microseconds, if at all.
        let pid = self.pid;
        let found = tokio::task::spawn_blocking(move || reap(pid, WaitPidFlag::WEXITED))
            .await
            .map_err(io::Error::other)??;
        self.status = found;
        found.ok_or_else(|| io::Error::other("the sandbox's supervisor could not be reaped"))
    }

    /// Its status if it exited (reaping it), else `None`.
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = reap(self.pid, WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG)?;
        }
        Ok(self.status)
    }
}

/// `waitid(P_PID, pid, flags)`: its status if it exited.
fn reap(pid: Pid, flags: WaitPidFlag) -> io::Result<Option<ExitStatus>> {
    let found = loop {
        match waitid(Id::Pid(pid), flags) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other.map_err(io::Error::from)?,
        }
    };
    Ok(match found {
        WaitStatus::Exited(_, code) => Some(ExitStatus::from_raw((code & 0xff) << 8)),
        WaitStatus::Signaled(_, sig, core) => Some(ExitStatus::from_raw(
            sig as i32 | if core { 0x80 } else { 0 },
        )),
        _ => None,
    })
}

impl SandboxChild {
    /// The supervisor's host pid.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// A spawned child, with all three stdio piped.
    pub(crate) fn spawned(mut child: tokio::process::Child) -> io::Result<Self> {
        let pid = child.id().unwrap_or(0);
        let stdin = child.stdin.take().map(|p| p.into_owned_fd()).transpose()?;
        let stdout = child.stdout.take().map(|p| p.into_owned_fd()).transpose()?;
        let stderr = child.stderr.take().map(|p| p.into_owned_fd()).transpose()?;
        Ok(SandboxChild {
            pid,
            how: How::Spawned(child),
            stdin: stdin.map(pipe::Sender::from_owned_fd).transpose()?,
            stdout: stdout.map(pipe::Receiver::from_owned_fd).transpose()?,
            stderr: stderr.map(pipe::Receiver::from_owned_fd).transpose()?,
        })
    }

    /// A child forked for us (see the module docs), our ends of its stdio
    /// pipes, and of the socket its supervisor reports the sandbox's end on
    /// and holds until it exits ([`Forked`]). Needs the runtime (the socket
    /// joins its reactor).
    pub(crate) fn forked(
        pid: i32,
        [stdin, stdout, stderr]: [OwnedFd; 3],
        report: OwnedFd,
    ) -> io::Result<Self> {
        let report = std::os::unix::net::UnixStream::from(report);
        report.set_nonblocking(true)?;
        Ok(SandboxChild {
            pid: u32::try_from(pid).unwrap_or(0),
            how: How::Forked(Forked {
                pid: Pid::from_raw(pid),
                status: None,
                report: Some(tokio::net::UnixStream::from_std(report)?),
            }),
            stdin: Some(pipe::Sender::from_owned_fd(stdin)?),
            stdout: Some(pipe::Receiver::from_owned_fd(stdout)?),
            stderr: Some(pipe::Receiver::from_owned_fd(stderr)?),
        })
    }

    /// Its pid while it has not been reaped.
    pub(crate) fn id(&self) -> Option<u32> {
        match &self.how {
            How::Spawned(c) => c.id(),
            How::Forked(f) => f.status.is_none().then_some(self.pid),
        }
    }

    /// Waits for it to exit and reaps it.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        match &mut self.how {
            How::Spawned(c) => c.wait().await,
            How::Forked(f) => f.wait().await,
        }
    }

    /// How the sandbox ended, as soon as that is known: its supervisor's
    /// report of the main process's end (forked children; before init's
    /// exit takes the sandbox's namespaces down and the supervisor exits),
    /// or else its exit. The supervisor may still run: [`SandboxChild::wait`]
    /// reaps it after.
    pub(crate) async fn ended(&mut self) -> io::Result<ExitStatus> {
        if let How::Forked(f) = &mut self.how
            && f.status.is_none()
            && let Some(report) = f.report.as_mut()
        {
            let mut code = [0u8; 4];
            if report.read_exact(&mut code).await.is_ok() {
                let code = i32::from_le_bytes(code);
                return Ok(ExitStatus::from_raw((code & 0xff) << 8));
            }
            // End-of-file first: it ended without a report (killed, or its
            // set-up failed); its exit says how.
        }
        self.wait().await
    }

    /// Its status if it exited (reaping it), else `None`.
    pub(crate) fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        match &mut self.how {
            How::Spawned(c) => c.try_wait(),
            How::Forked(f) => f.try_wait(),
        }
    }

    /// Kills the sandbox: SIGTERM lets `asbx jail` tear the whole pid
    /// namespace down and remove its cgroups; SIGKILL on the process group
    /// follows if it does not finish in time.
    pub(crate) async fn kill_tree(&mut self) -> Option<ExitStatus> {
        if let Some(pid) = self.id() {
            let pid = Pid::from_raw(pid as i32);
            let _ = kill(pid, Signal::SIGTERM);
            if let Ok(s) = tokio::time::timeout(KILL_GRACE, self.wait()).await {
                return s.ok();
            }
            let _ = killpg(pid, Signal::SIGKILL);
        }
        self.wait().await.ok()
    }
}

impl Drop for SandboxChild {
    fn drop(&mut self) {
        // A spawned child is `kill_on_drop`; do the same for a forked one,
        // and reap it off this thread.
        let How::Forked(f) = &mut self.how else {
            return;
        };
        if f.status.is_some() {
            return;
        }
        // Unreaped, so the pid is still its own.
        let _ = kill(f.pid, Signal::SIGKILL);
        if matches!(f.try_wait(), Ok(Some(_))) {
            return;
        }
        let mut reaper = Forked {
            pid: f.pid,
            status: None,
            report: f.report.take(),
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let _ = reaper.wait().await;
                });
            }
            Err(_) => {
                let _ = reap(reaper.pid, WaitPidFlag::WEXITED);
            }
        }
    }
}
