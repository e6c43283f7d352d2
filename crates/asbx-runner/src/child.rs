//! A sandbox's supervisor process, however it was started: forked by the
//! runner's zygote (`asbx_jail::Zygote`, the jail's usual way) or spawned
//! as a command (the unconfined agent, and the jail when no zygote runs).
//! Either way it is the runner's child, its stdio are pipes, and it is
//! killed if dropped while it runs.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

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

/// A child forked by the zygote: waited for through its pidfd (readable
/// once it exited), then reaped with `waitid(P_PIDFD)`.
#[derive(Debug)]
struct Forked {
    pidfd: AsyncFd<OwnedFd>,
    status: Option<ExitStatus>,
    /// Where its supervisor reports the sandbox's end before it exits
    /// ([`SandboxChild::ended`]).
    report: Option<tokio::net::UnixStream>,
}

impl Forked {
    /// Needs the runtime (the pidfd joins its reactor).
    fn new(pidfd: OwnedFd) -> io::Result<Forked> {
        Ok(Forked {
            pidfd: register(pidfd)?,
            status: None,
            report: None,
        })
    }

    async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(s) = self.status {
                return Ok(s);
            }
            let mut ready = self.pidfd.readable().await?;
            match reap(&self.pidfd, &mut self.status)? {
                Some(s) => return Ok(s),
                None => ready.clear_ready(),
            }
        }
    }

    /// Its status if it exited (reaping it), else `None`.
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        reap(&self.pidfd, &mut self.status)
    }
}

/// `waitid(P_PIDFD, WEXITED | WNOHANG)`, remembering what it found.
fn reap(
    pidfd: &AsyncFd<OwnedFd>,
    status: &mut Option<ExitStatus>,
) -> io::Result<Option<ExitStatus>> {
    if status.is_some() {
        return Ok(*status);
    }
    let found = loop {
        match waitid(
            Id::PIDFd(pidfd.get_ref().as_fd()),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other.map_err(io::Error::from)?,
        }
    };
    *status = match found {
        WaitStatus::Exited(_, code) => Some(ExitStatus::from_raw((code & 0xff) << 8)),
        WaitStatus::Signaled(_, sig, core) => Some(ExitStatus::from_raw(
            sig as i32 | if core { 0x80 } else { 0 },
        )),
        _ => None,
    };
    Ok(*status)
}

impl SandboxChild {
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
    /// pipes, and of the socket its supervisor reports the sandbox's end
    /// on. Needs the runtime (the pidfd joins its reactor).
    pub(crate) fn forked(
        pid: i32,
        pidfd: OwnedFd,
        [stdin, stdout, stderr]: [OwnedFd; 3],
        report: OwnedFd,
    ) -> io::Result<Self> {
        let mut forked = Forked::new(pidfd)?;
        let report = std::os::unix::net::UnixStream::from(report);
        report.set_nonblocking(true)?;
        forked.report = Some(tokio::net::UnixStream::from_std(report)?);
        Ok(SandboxChild {
            pid: u32::try_from(pid).unwrap_or(0),
            how: How::Forked(forked),
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
        use tokio::io::AsyncReadExt;
        if let How::Forked(f) = &mut self.how
            && f.status.is_none()
            && let Some(mut report) = f.report.take()
        {
            let mut code = [0u8; 4];
            tokio::select! {
                read = report.read_exact(&mut code) => {
                    if read.is_ok() {
                        let code = i32::from_le_bytes(code);
                        return Ok(ExitStatus::from_raw((code & 0xff) << 8));
                    }
                }
                status = f.wait() => return status,
            }
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
}

/// A pidfd, registered with the runtime's reactor (readable once the
/// process exited). Needs the runtime.
#[allow(unsafe_code)]
fn register(pidfd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: `register` asks that the descriptor stay open and refer to the
    // same file description for the `AsyncFd`'s whole life: an `OwnedFd`,
    // moved into it and closed only when it drops, does.
    Ok(unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }?)
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
        let _ = kill(Pid::from_raw(self.pid as i32), Signal::SIGKILL);
        if matches!(f.try_wait(), Ok(Some(_))) {
            return;
        }
        let Ok(fd) = f.pidfd.get_ref().try_clone() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if let Ok(mut f) = Forked::new(fd) {
                        let _ = f.wait().await;
                    }
                });
            }
            Err(_) => {
                let _ = waitid(Id::PIDFd(fd.as_fd()), WaitPidFlag::WEXITED);
            }
        }
    }
}
