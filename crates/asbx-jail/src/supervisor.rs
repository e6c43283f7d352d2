//! The host side: what `run_jail` does in the `asbx jail` process.
//!
//! 1. plan everything that can be computed up front (paths, seccomp
//!    programs, C strings), so the sandbox side does as little as possible;
//! 2. plan the cgroups (paths only);
//! 3. start a tiny cleanup guard process (see below);
//! 4. block `SIGTERM`/`SIGINT`/`SIGHUP`/`SIGCHLD` and `clone` the sandbox's
//!    init with new mount, pid, net, ipc and uts namespaces (or join it to
//!    a network namespace made ahead of time: the zygote's spares);
//! 5. make the cgroups, write their limits and move init into them while it
//!    builds the first half of its root, and say so (`C`); make the child
//!    cgroups while it builds the second half, and say so (`K`) before it
//!    binds them. When the zygote made them ahead ([`MadeAhead`]), only
//!    write the limits and owners;
//! 6. write the init's uid/gid maps when it asks (one pipe round trip), then
//!    read its set-up channel until end-of-file: silence means the main
//!    process `exec`ed, `E<message>` means set-up failed;
//! 7. wait for init to exit, or for a signal, which kills init (and with it
//!    the whole pid namespace) at once; meanwhile make the child memory
//!    cgroups the main process asks for (`Requests`), and pass init's word
//!    of the main process's end on to the caller when it gave a socket for
//!    it (`MadeAhead::report`), before init's exit is done;
//! 8. remove the cgroups, stop the guard, return the exit code. With
//!    `guard: false` the caller removes the cgroups once the supervisor
//!    exited (the runner does, after the stream's last line), so after a
//!    clean end (the main process exited 0) the supervisor leaves them,
//!    empty, and exits as soon as init is reaped: the caller learns the
//!    exit code one teardown sooner (about 1 ms of `rmdir`s on cgroup v1).
//!    Any other end is cleaned up here as before, so is any end after the
//!    parent died (its pidfd fired, or the supervisor was reparented):
//!    no one else would remove them then. A parent that dies while its
//!    main process exits 0 leaves empty cgroups (the runner sweeps old
//!    empty ones, `sweep_stale_cgroups`); a runner's death normally
//!    breaks its agents' pipes first, which ends them with another code.
//!
//! The cleanup guard is a plain fork of the supervisor, outside every
//! namespace and in its own process group (so a `killpg` of the
//! supervisor's group spares it), holding the read end of a pipe. If the supervisor is
//! SIGKILLed the pipe reaches end-of-file, the sandbox dies of its
//! parent-death signal and the guard removes the cgroups the supervisor
//! could not. In the normal path the supervisor tells it to just exit.
//!
//! **A sandbox never outlives its runner.** First thing, the supervisor
//! opens a pidfd of its parent (the runner, or `asbx up`) and re-checks
//! `getppid` (so a parent that died before the pidfd existed is noticed).
//! While the sandbox runs, the supervisor polls that pidfd beside a
//! signalfd of its termination signals: when the parent process ends,
//! however it ended (SIGKILL included), the pidfd becomes readable and the
//! supervisor kills init, which takes the whole pid namespace with it, then
//! removes the cgroups as on any other exit. A pidfd watches the parent
//! *process*, not the thread that spawned us, unlike `PR_SET_PDEATHSIG`,
//! which fires when that thread exits (tokio's blocking threads come and
//! go). Known gap: if the parent died in the microseconds before the
//! supervisor read `getppid`, it watches the reaper that adopted it.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;

use nix::fcntl::OFlag;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, pipe2};

use asbx_protocol::jail::{CGROUP_REQUEST_FD_ENV, JailPolicy, JailProfile, TOOL_CGROUP_IN_JAIL};

use crate::cgroup::{CGROUP_ROOT, Cgroups, Layout, destroy_dirs};
use crate::sys::{self, Forked};
use crate::{JailError, Plan, ids, init};

const NAMESPACES: libc::c_int = libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;

fn pipe() -> Result<(File, File), JailError> {
    let (r, w): (OwnedFd, OwnedFd) =
        pipe2(OFlag::O_CLOEXEC).map_err(|e| JailError::Host(format!("pipe: {e}")))?;
    Ok((File::from(r), File::from(w)))
}

/// Restores the signal mask when dropped.
struct MaskGuard(SigSet);

impl Drop for MaskGuard {
    fn drop(&mut self) {
        let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&self.0), None);
    }
}

/// The cleanup guard process; see the module docs.
struct Guard {
    pid: libc::pid_t,
    pipe: Option<File>,
}

impl Guard {
    fn start(layout: &Layout, dirs: Vec<PathBuf>) -> Result<Guard, JailError> {
        let (r, w) = pipe()?;
        let layout = layout.clone();
        match sys::clone_fork(0).map_err(|e| JailError::Host(format!("fork: {e}")))? {
            Forked::Child => {
                drop(w);
                // Its own process group: a runner that kills the supervisor's
                // group (killpg) must not take the guard, the only one left
                // to remove the cgroups, children first.
                let _ = nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0));
                // Hold none of the runner's pipes open.
                if let Ok(null) = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/null")
                {
                    let _ = nix::unistd::dup2_stdin(&null);
                    let _ = nix::unistd::dup2_stdout(&null);
                    let _ = nix::unistd::dup2_stderr(&null);
                }
                let mut r = r;
                let mut b = [0u8; 1];
                let clean = matches!(r.read(&mut b), Ok(1) if b[0] == b'D');
                if !clean {
                    let _ = destroy_dirs(&layout, &dirs);
                }
                sys::exit_now(0)
            }
            Forked::Parent(pid) => {
                drop(r);
                // Also here, not only in the child: once `start` returns, a
                // kill of the supervisor's group must miss the guard.
                let _ = nix::unistd::setpgid(Pid::from_raw(pid), Pid::from_raw(pid));
                Ok(Guard { pid, pipe: Some(w) })
            }
        }
    }

    /// Nothing left to clean: tell the guard to exit, and reap it.
    fn dismiss(&mut self) {
        if let Some(mut w) = self.pipe.take() {
            let _ = w.write_all(b"D");
            drop(w);
            let _ = waitpid(Pid::from_raw(self.pid), None);
        }
    }

    /// Cleanup failed here: let the guard retry on its own (it sees end-of-file).
    fn hand_over(&mut self) {
        self.pipe = None;
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.dismiss();
    }
}

/// See [`crate::run_jail`].
pub(crate) fn run(policy: &JailPolicy, agent: Option<crate::AgentEntry>) -> Result<i32, JailError> {
    run_in(policy, agent, MadeAhead::default())
}

/// What the zygote made for a sandbox ahead of time.
#[derive(Debug, Default)]
pub(crate) struct MadeAhead {
    /// A fresh network namespace, `lo` up, for the sandbox instead of a new
    /// one made by `clone`.
    pub(crate) netns: Option<OwnedFd>,
    /// The sandbox's cgroups exist, children included, without limits
    /// (`crate::cgroup::SpareCgroups::take_as`).
    pub(crate) cgroups: bool,
    /// A stream socket on which to report the main process's end as soon as
    /// init tells it (4 bytes, little-endian: the code this process will
    /// exit with), before
    /// init's own exit takes the sandbox's namespaces down: the caller can
    /// end the session then, and reap this process after.
    pub(crate) report: Option<OwnedFd>,
}

/// [`run`], with what the zygote made ahead. The stages of the module
/// docs, in order.
pub(crate) fn run_in(
    policy: &JailPolicy,
    agent: Option<crate::AgentEntry>,
    ahead: MadeAhead,
) -> Result<i32, JailError> {
    let MadeAhead {
        netns,
        cgroups: made_ahead,
        report,
    } = ahead;
    let ppid = nix::unistd::getppid();
    let parent = watch_parent()?;
    let mut plan = Plan::new(policy, agent)?;
    let namespaces = match netns {
        Some(_) => NAMESPACES & !libc::CLONE_NEWNET,
        None => NAMESPACES,
    };
    plan.netns = netns;
    if !nix::unistd::geteuid().is_root() {
        return Err(JailError::NotRoot);
    }
    let (set, _mask) = block_signals()?;
    let (mut cgroups, mut guard) = plan_cgroups(policy, made_ahead)?;
    let (requests, mut status) = open_channels(&mut plan, policy, cgroups.as_ref(), report)?;
    let (init, parent) = clone_init(&mut plan, namespaces, parent)?;
    let Init {
        pid: init,
        up,
        down,
    } = init;
    if let Err(e) = set_up(init, up, &down, policy, &plan, &mut cgroups) {
        let _ = kill(init, Signal::SIGKILL);
        let _ = waitpid(init, None);
        drop(down);
        if let Some(cg) = cgroups.as_mut() {
            let _ = cg.destroy();
        }
        if let Some(g) = guard.as_mut() {
            g.dismiss();
        }
        return Err(e);
    }
    let (code, parent_gone) = wait(init, &set, &parent, requests, cgroups.as_ref(), &mut status);
    drop(down);
    tear_down(policy, code, parent_gone, ppid, status, cgroups, guard);
    Ok(code)
}

/// Blocks the termination signals and `SIGCHLD` until `wait` reads them,
/// also while the cgroups and the guard are made (the guard inherits the
/// mask until it detaches); the guard restores the old mask.
fn block_signals() -> Result<(SigSet, MaskGuard), JailError> {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGCHLD,
    ] {
        set.add(s);
    }
    let mut old = SigSet::empty();
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut old))
        .map_err(|e| JailError::Host(format!("sigprocmask: {e}")))?;
    let mask = MaskGuard(old);
    // A SIGCHLD inherited as "ignore" would make the kernel reap init behind our back.
    sys::default_sigchld().map_err(|e| JailError::Host(format!("signal: {e}")))?;
    Ok((set, mask))
}

/// Plans the sandbox's cgroups (the strict profile's; paths only: they are
/// made, or given limits, after `clone`, beside init's first steps) and
/// starts the cleanup guard. The guard starts before the first cgroup
/// directory exists: a supervisor killed while creating them (a client
/// that hung up at once) must leave none behind.
fn plan_cgroups(
    policy: &JailPolicy,
    made_ahead: bool,
) -> Result<(Option<Cgroups>, Option<Guard>), JailError> {
    match policy.profile {
        JailProfile::Strict => {
            let layout =
                Layout::detect(std::path::Path::new(CGROUP_ROOT)).map_err(JailError::Cgroup)?;
            let mut guard = if policy.guard {
                let planned = match made_ahead {
                    true => Cgroups::dirs_named(&layout, &policy.cgroup)?,
                    false => Cgroups::planned_dirs(&layout, &policy.cgroup)?,
                };
                Some(Guard::start(&layout, planned)?)
            } else {
                None
            };
            let planned = match made_ahead {
                true => Cgroups::plan_made_ahead(layout, &policy.cgroup),
                false => Cgroups::plan(layout, &policy.cgroup),
            };
            match planned {
                Ok(cg) => Ok((Some(cg), guard)),
                Err(e) => {
                    if let Some(g) = guard.as_mut() {
                        g.dismiss();
                    }
                    Err(e)
                }
            }
        }
        JailProfile::Namespaces => Ok((None, None)),
    }
}

/// Puts in `plan` what init needs of the cgroups (their `cgroup.procs`
/// files, the child mounts) and the ends of the channels the sandbox talks
/// on: the main process asks for its child memory cgroups on a socket of
/// its own ([`Requests`]); init tells the main process's end on a pipe of
/// its own when there is someone to report it to ([`Status`]). That pipe
/// (and with it the caller's socket) lives until the supervisor returns:
/// its end-of-file tells the caller this process is exiting.
fn open_channels(
    plan: &mut Plan,
    policy: &JailPolicy,
    cgroups: Option<&Cgroups>,
    report: Option<OwnedFd>,
) -> Result<(Option<Requests>, Option<Status>), JailError> {
    plan.cgroup_procs = cgroups.map(Cgroups::procs_files).unwrap_or_default();
    plan.set_child_cgroups(
        cgroups
            .map(|c| c.child_mounts().to_vec())
            .unwrap_or_default(),
    );
    let requests = match cgroups.filter(|c| c.has_on_request()) {
        Some(_) => Some(Requests::socket(plan, policy)?),
        None => None,
    };
    let status = match report {
        Some(report) => {
            let (r, w) = pipe()?;
            plan.status = Some(OwnedFd::from(w));
            Some(Status {
                from_init: Some(r),
                report,
            })
        }
        None => None,
    };
    Ok((requests, status))
}

/// The sandbox's init as the supervisor holds it: its pid and the two
/// ends of the set-up channel (init's word `up`, the supervisor's `down`).
struct Init {
    pid: Pid,
    up: File,
    down: File,
}

/// `clone`s the sandbox's init into its namespaces (it never returns in
/// the child), then drops every descriptor meant for the sandbox alone.
/// The parent's pidfd goes in and comes back: the child drops it, so the
/// sandbox holds no descriptor of a host process.
fn clone_init(
    plan: &mut Plan,
    namespaces: libc::c_int,
    parent: OwnedFd,
) -> Result<(Init, OwnedFd), JailError> {
    let (up_r, up_w) = pipe()?;
    let (down_r, down_w) = pipe()?;
    let pid =
        match sys::clone_fork(namespaces).map_err(|e| JailError::Host(format!("clone: {e}")))? {
            Forked::Child => {
                drop(up_r);
                drop(down_w);
                drop(parent);
                init::run(plan, up_w, down_r)
            }
            Forked::Parent(pid) => pid,
        };
    drop(up_w);
    drop(down_r);
    drop(plan.netns.take());
    drop(plan.cgroup_request.take());
    drop(plan.status.take());
    plan.root.release_trees();
    let init = Init {
        pid: Pid::from_raw(pid),
        up: up_r,
        down: down_w,
    };
    Ok((init, parent))
}

/// Makes the cgroups and moves init into them while it builds the first
/// half of its root (on cgroup v1 each move may wait for an RCU grace
/// period, and a memory cgroup takes a while to make), lets it go on, and
/// makes the child cgroups while it builds the second half; then the
/// uid/gid maps and the wait for the main process's `exec`.
fn set_up(
    init: Pid,
    up: File,
    down: &File,
    policy: &JailPolicy,
    plan: &Plan,
    cgroups: &mut Option<Cgroups>,
) -> Result<(), JailError> {
    let pid = init.as_raw();
    let made = match cgroups.as_mut() {
        Some(cg) => cg.make(&policy.limits, policy.background),
        None => Ok(()),
    };
    let cgroups = &*cgroups;
    let children = || match cgroups.as_ref() {
        Some(cg) => cg.create_children(&policy.limits, policy.host_uid),
        None => Ok(()),
    };
    match made.and_then(|()| attach(pid, &plan.cgroup_procs, children, down)) {
        Ok(()) => handshake(pid, policy.host_uid, up, down),
        // Init may have failed first (and left for that reason): its
        // message says more than ours.
        Err(e) => {
            let _ = kill(init, Signal::SIGKILL);
            let mut told = Vec::new();
            let mut up = up;
            let _ = up.read_to_end(&mut told);
            Err(if told.is_empty() {
                e
            } else {
                child_error(&told)
            })
        }
    }
}

/// After init's end: removes the cgroups (or leaves them to the caller,
/// see the module docs) and stops the guard; then the report channel
/// closes (its end-of-file tells the caller this process is exiting).
fn tear_down(
    policy: &JailPolicy,
    code: i32,
    parent_gone: bool,
    ppid: Pid,
    status: Option<Status>,
    mut cgroups: Option<Cgroups>,
    mut guard: Option<Guard>,
) {
    if !policy.guard && code == 0 && !parent_gone && nix::unistd::getppid() == ppid {
        // The caller removes the cgroups (now empty: init was reaped, and
        // the pid namespace with it); see the module docs. Forgotten, not
        // dropped: dropping removes them.
        if let Some(cg) = cgroups.take() {
            std::mem::forget(cg);
        }
        drop(status);
        drop(guard);
        return;
    }
    // With the parent gone no one else removes them: wait as long as the
    // host needs to let the sandbox's processes go.
    let patience = match parent_gone || nix::unistd::getppid() != ppid {
        true => crate::cgroup::ORPHAN_RMDIR_PATIENCE,
        false => crate::cgroup::RMDIR_PATIENCE,
    };
    let cleaned = match cgroups.as_mut().map(|c| c.destroy_within(patience)) {
        Some(Err(e)) => {
            // The run itself is over: report (stderr may be a closed pipe
            // if the runner died), and let the guard try again.
            let _ = writeln!(std::io::stderr(), "asbx jail: {e}");
            false
        }
        Some(Ok(())) | None => true,
    };
    if let Some(g) = guard.as_mut() {
        if cleaned { g.dismiss() } else { g.hand_over() }
    }
    drop(status);
}

/// Write init's pid into each `cgroup.procs` and tell init (`C`), then make
/// the child cgroups and tell it (`K`).
fn attach(
    pid: libc::pid_t,
    procs: &[PathBuf],
    children: impl FnOnce() -> Result<(), JailError>,
    down: &File,
) -> Result<(), JailError> {
    let pid = pid.to_string();
    for file in procs {
        std::fs::write(file, &pid)
            .map_err(|e| JailError::Cgroup(format!("{}: {e}", file.display())))?;
    }
    let mut down = down;
    let sync = |e: std::io::Error| JailError::Host(format!("sync: {e}"));
    down.write_all(b"C").map_err(sync)?;
    children()?;
    down.write_all(b"K").map_err(sync)
}

/// Answer the init's map request, then wait until the main process `exec`ed.
fn handshake(pid: libc::pid_t, host_uid: u32, up: File, down: &File) -> Result<(), JailError> {
    let mut up = up;
    let mut first = [0u8; 1];
    let n = up
        .read(&mut first)
        .map_err(|e| JailError::Host(format!("sync: {e}")))?;
    if n == 1 && first[0] == b'M' {
        ids::write_maps(pid, host_uid)?;
        let mut down = down;
        down.write_all(b"G")
            .map_err(|e| JailError::Host(format!("sync: {e}")))?;
        let mut rest = Vec::new();
        let _ = up.read_to_end(&mut rest);
        if rest.is_empty() {
            return Ok(());
        }
        return Err(child_error(&rest));
    }
    let mut rest = first[..n].to_vec();
    let _ = up.read_to_end(&mut rest);
    if rest.is_empty() {
        return Err(JailError::Setup("sandbox init died during set-up".into()));
    }
    Err(child_error(&rest))
}

fn child_error(bytes: &[u8]) -> JailError {
    let text = String::from_utf8_lossy(bytes);
    JailError::Setup(text.strip_prefix('E').unwrap_or(&text).to_string())
}

/// A pidfd of the process that started the supervisor; see the module docs.
fn watch_parent() -> Result<OwnedFd, JailError> {
    let ppid = nix::unistd::getppid();
    let fd = sys::pidfd_open(ppid.as_raw())
        .map_err(|e| JailError::Host(format!("pidfd of the parent {ppid}: {e}")))?;
    if nix::unistd::getppid() != ppid {
        return Err(JailError::Host(
            "the process that started the jail is gone".into(),
        ));
    }
    Ok(fd)
}

/// Wait for init to end; a termination signal, or the end of the parent
/// process, kills it (and the whole pid namespace) first. Returns init's
/// code, or 128 + the signal received (SIGKILL when the parent ended), and
/// whether the parent ended.
fn wait(
    init: Pid,
    set: &SigSet,
    parent: &OwnedFd,
    requests: Option<Requests>,
    cgroups: Option<&Cgroups>,
    status: &mut Option<Status>,
) -> (i32, bool) {
    let mut parent_alive = true;
    let mut requests = requests.zip(cgroups);
    let code = wait_init(init, set, parent, &mut parent_alive, &mut requests, status);
    (code, !parent_alive)
}

fn wait_init(
    init: Pid,
    set: &SigSet,
    parent: &OwnedFd,
    parent_alive: &mut bool,
    requests: &mut Option<(Requests, &Cgroups)>,
    status: &mut Option<Status>,
) -> i32 {
    let mut received: Option<Signal> = None;
    // The signals are blocked since before `clone`: none is lost before this exists.
    let signals = SignalFd::with_flags(set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK).ok();
    if signals.is_none() {
        // Without it nothing is polled: close the request socket, so that
        // a request fails at once instead of waiting forever (and the end
        // is known from the exit alone).
        *requests = None;
        if let Some(s) = status.as_mut() {
            s.from_init = None;
        }
    }
    loop {
        match waitpid(init, Some(WaitPidFlag::WNOHANG)) {
            // Init told its main process's end and exited before the poll
            // below saw the pipe: that word is still in it.
            Ok(WaitStatus::Exited(_, code)) => {
                relay_if_told(status);
                return received.map_or(code, |s| 128 + s as i32);
            }
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                relay_if_told(status);
                return 128 + received.unwrap_or(sig) as i32;
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return 128 + received.map_or(libc::SIGKILL, |s| s as i32),
        }
        let got = match &signals {
            Some(sfd) => {
                // The signals, then each of these that is open.
                let watched = [
                    parent_alive.then(|| parent.as_fd()),
                    requests.as_ref().map(|(r, _)| r.sock.as_fd()),
                    status
                        .as_ref()
                        .and_then(|s| s.from_init.as_ref())
                        .map(|f| f.as_fd()),
                ];
                let mut fds = vec![sfd.as_fd()];
                fds.extend(watched.iter().flatten());
                let ready = sys::poll_readable(&fds, -1).unwrap_or_default();
                let mut next = ready.iter().skip(1);
                let [parent_ready, request_ready, status_ready] =
                    watched.map(|w| w.is_some() && next.next().copied().unwrap_or(false));
                if parent_ready {
                    *parent_alive = false;
                    received.get_or_insert(Signal::SIGKILL);
                    let _ = kill(init, Signal::SIGKILL);
                }
                if request_ready
                    && let Some((r, cg)) = requests.as_mut()
                    && !r.serve(cg, init.as_raw())
                {
                    *requests = None; // end-of-file: the main process is done asking
                }
                if status_ready && let Some(s) = status.as_mut() {
                    s.relay();
                }
                match sfd.read_signal() {
                    Ok(Some(info)) => Signal::try_from(info.ssi_signo as i32).ok(),
                    _ => None,
                }
            }
            // No signalfd (descriptor limit): plain waiting, parent unwatched.
            None => set.wait().ok(),
        };
        match got {
            Some(Signal::SIGCHLD) | None => {}
            Some(sig) => {
                if received.is_none() {
                    received = Some(sig);
                }
                let _ = kill(init, Signal::SIGKILL);
            }
        }
    }
}

/// Passes on init's word of the main process's end if it is in the pipe
/// now (or the pipe is closed); never waits for it.
fn relay_if_told(status: &mut Option<Status>) {
    let Some(s) = status.as_mut() else { return };
    let ready = s
        .from_init
        .as_ref()
        .is_some_and(|f| sys::poll_readable(&[f.as_fd()], 0).is_ok_and(|r| r[0]));
    if ready {
        s.relay();
    }
}

/// The supervisor's end of the socket on which the sandbox's main process
/// asks for its child memory cgroups ([`CGROUP_REQUEST_FD_ENV`]), which are
/// made on request, not with the sandbox: each costs the host about 0.3 MiB
/// of kernel memory, and an idle sandbox runs no tool. A request makes the
/// child's memory cgroup ([`Cgroups::make_on_request`]) and mounts it on
/// its empty folder in the sandbox (`setns` into the sandbox's mount
/// namespace, `move_mount` of a detached bind, `setns` back). The sandbox
/// can ask for these two and nothing else; a request for one made already
/// is answered at once.
struct Requests {
    sock: OwnedFd,
    limits: asbx_protocol::jail::ResourceLimits,
    host_uid: u32,
}

impl Requests {
    /// The socket pair: the sandbox's end goes in `plan` (kept by the main
    /// process alone), with its number in the main process's environment.
    fn socket(plan: &mut Plan, policy: &JailPolicy) -> Result<Requests, JailError> {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        )
        .map_err(|e| JailError::Host(format!("socketpair: {e}")))?;
        // The sandbox's end blocks: its reader waits for the answer.
        nix::fcntl::fcntl(&theirs, nix::fcntl::FcntlArg::F_SETFL(OFlag::empty()))
            .map_err(|e| JailError::Host(format!("fcntl: {e}")))?;
        let var = format!("{CGROUP_REQUEST_FD_ENV}={}", theirs.as_raw_fd());
        let prefix = format!("{CGROUP_REQUEST_FD_ENV}=");
        plan.env
            .retain(|kv| !kv.as_bytes().starts_with(prefix.as_bytes()));
        plan.env
            .push(std::ffi::CString::new(var).map_err(|e| JailError::Host(e.to_string()))?);
        plan.cgroup_request = Some(theirs);
        Ok(Requests {
            sock: ours,
            limits: policy.limits.clone(),
            host_uid: policy.host_uid,
        })
    }

    /// Answers what the socket holds; false at its end-of-file (or error).
    /// Answers never block: an answer the sandbox does not read is dropped.
    fn serve(&mut self, cgroups: &Cgroups, init: libc::pid_t) -> bool {
        let mut asked = [0u8; 64];
        let n = match nix::unistd::read(&self.sock, &mut asked) {
            Ok(0) => return false,
            Ok(n) => n,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => return true,
            Err(_) => return false,
        };
        let mut answers = [b'-'; 64];
        for (b, answer) in asked[..n].iter().zip(&mut answers) {
            let made = match b {
                b't' => self.make(cgroups, "tools", init),
                b'm' => self.make(cgroups, "mcp", init),
                _ => false,
            };
            if made {
                *answer = b'+';
            }
        }
        // Never blocks, never SIGPIPE: answers the sandbox does not read are
        // dropped, and a main process that asked and ended is no reason to die.
        let _ = nix::sys::socket::send(
            self.sock.as_raw_fd(),
            &answers[..n],
            nix::sys::socket::MsgFlags::MSG_NOSIGNAL | nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        );
        true
    }

    /// Makes `child`'s memory cgroup and mounts it in the sandbox, unless
    /// it is there already.
    /// `init`: the sandbox's init, whose mount namespace it goes in.
    fn make(&self, cgroups: &Cgroups, child: &str, init: libc::pid_t) -> bool {
        let (m, made) = match cgroups.make_on_request(child, &self.limits, self.host_uid) {
            Ok(got) => got,
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "asbx jail: {e}");
                return false;
            }
        };
        if !made {
            return true;
        }
        let target = std::path::Path::new(TOOL_CGROUP_IN_JAIL)
            .join(m.child)
            .join(m.controller);
        match mount_in_sandbox(init, &m.host, &target) {
            Ok(()) => true,
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "asbx jail: {}: {e}", target.display());
                let _ = std::fs::remove_dir(&m.host);
                false
            }
        }
    }
}

/// Binds host directory `host` on `target` in the mount namespace of the
/// sandbox whose init is `init`: writable (file modes decide), nothing
/// executable, no set-uid, no devices.
fn mount_in_sandbox(
    init: libc::pid_t,
    host: &std::path::Path,
    target: &std::path::Path,
) -> std::io::Result<()> {
    use nix::mount::{MsFlags, mount};
    use nix::sched::{CloneFlags, setns};
    let tree = sys::open_tree_clone(host)?;
    let home = File::open("/proc/self/ns/mnt")?;
    let sandbox = File::open(format!("/proc/{init}/ns/mnt"))?;
    setns(&sandbox, CloneFlags::CLONE_NEWNS)?;
    let moved = sys::move_mount_to(tree.as_fd(), target).and_then(|()| {
        let flags = MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC;
        mount(None::<&str>, target, None::<&str>, flags, None::<&str>).map_err(Into::into)
    });
    if setns(&home, CloneFlags::CLONE_NEWNS).is_err() {
        // Stranded in the sandbox's mount namespace: end the sandbox and
        // this process rather than go on from there.
        let _ = kill(Pid::from_raw(init), Signal::SIGKILL);
        sys::exit_now(i32::from(asbx_protocol::exit::SETUP_FAILED));
    }
    moved
}

/// Init's report of the main process's end, and where it goes on to
/// ([`MadeAhead::report`]). The caller's socket stays open until this
/// process exits: its end-of-file tells the caller so.
struct Status {
    /// `None` once read.
    from_init: Option<File>,
    report: OwnedFd,
}

impl Status {
    /// Passes init's 4 bytes on (nothing when init ended without them:
    /// then the caller learns the end from this process's exit).
    fn relay(&mut self) {
        let Some(mut from_init) = self.from_init.take() else {
            return;
        };
        let mut code = [0u8; 4];
        if from_init.read_exact(&mut code).is_ok() {
            // A socket: a caller gone is no reason to die of SIGPIPE.
            let _ = nix::sys::socket::send(
                self.report.as_raw_fd(),
                &code,
                nix::sys::socket::MsgFlags::MSG_NOSIGNAL | nix::sys::socket::MsgFlags::MSG_DONTWAIT,
            );
        }
    }
}
