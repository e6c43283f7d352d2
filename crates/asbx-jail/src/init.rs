//! The sandbox side: what the child of the supervisor's `clone` does.
//!
//! It starts as host root in fresh mount, pid, net, ipc and uts namespaces
//! (pid 1 of its pid namespace; or joins the fresh network namespace the
//! zygote made ahead, `lo` already up) and, in order: builds the first half
//! of the root file system, sets the hostname and brings up loopback while
//! the supervisor makes the sandbox cgroups and moves it into them (`C` on
//! the set-up channel says it is in), unshares the cgroup namespace, sets
//! rlimits, builds the rest of the root (binding the child cgroups once the
//! supervisor made them: `K`), unshares the user namespace and
//! waits for the supervisor to write its id maps, becomes the agent user,
//! arms `PDEATHSIG`, sets `no_new_privs`, Landlock and seccomp, then forks the
//! main process, which `exec`s `policy.argv`. It stays as the namespace's
//! init: it reaps orphans and, when the main process ends, exits with its
//! status (128 + signal if killed), which makes the kernel kill everything
//! else in the namespace.
//!
//! With `entry: agent` there is no fork: init becomes the agent
//! ([`run_in_process`]), so a sandbox is two host processes, not three
//! (about 0.17 MiB of kernel and private memory and one pid less per
//! sandbox). The agent then reaps the orphans its tools leave (`asbx-agent`'s
//! `orphans` module); its exit is the namespace's end, as the main
//! process's was.
//!
//! Any failure is written to the supervisor as `E<message>` and ends the
//! process before anything is `exec`ed.

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sched::{CloneFlags, unshare};
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::stat::{Mode, umask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};

use crate::sys::{self, Forked};
use crate::{JailError, Plan, fsrules, ids, rootfs, seccomp};

/// The init's exit code when set-up failed (the supervisor reports the message instead).
const SETUP_FAILED: i32 = asbx_protocol::exit::SETUP_FAILED as i32;

/// Resource bounds of the `namespaces` profile, which has no cgroups: rlimits,
/// set by init and inherited by everything in the sandbox.
///
/// - `RLIMIT_NPROC` = `limits.pids`: processes and threads **per uid** of
///   the sandbox (agent 1000, tools 1001, MCP servers 1002 are counted
///   separately, so the sandbox as a whole may reach three times the bound);
/// - `RLIMIT_DATA` = `limits.memory_bytes`: the data segment and private
///   writable mappings (heap, anonymous `mmap`) **of each process**;
/// - `RLIMIT_FSIZE` = `limits.disk_bytes`: the largest file a process may
///   write (beyond it the writer gets `SIGXFSZ`, which kills it, or `EFBIG`
///   if it ignores that signal).
///
/// What this still does **not** bound, unlike the `strict` profile's
/// cgroups: the sum of memory over all processes (N processes may each use
/// `memory_bytes`), shared mappings and files in `/dev/shm` (within the
/// sandbox's one writable tmpfs of `disk_bytes`),
/// page cache and kernel memory, CPU time (no quota: a spin takes a whole
/// core), and no kill switch (teardown relies on the pid namespace alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RlimitBounds {
    nproc: Option<u64>,
    data: Option<u64>,
    fsize: Option<u64>,
}

impl From<&asbx_protocol::jail::ResourceLimits> for RlimitBounds {
    fn from(l: &asbx_protocol::jail::ResourceLimits) -> Self {
        RlimitBounds {
            nproc: l.pids,
            data: l.memory_bytes,
            fsize: l.disk_bytes,
        }
    }
}

impl RlimitBounds {
    fn apply(&self) -> Result<(), JailError> {
        for (res, value, name) in [
            (Resource::RLIMIT_NPROC, self.nproc, "nproc"),
            (Resource::RLIMIT_DATA, self.data, "data"),
            (Resource::RLIMIT_FSIZE, self.fsize, "fsize"),
        ] {
            if let Some(n) = value {
                setrlimit(res, n, n).map_err(|e| setup(&format!("rlimit {name}"), e))?;
            }
        }
        Ok(())
    }
}

/// Run the sandbox side. Never returns.
pub(crate) fn run(plan: &Plan, up: File, down: File) -> ! {
    let mut up = up;
    let area = match catch_unwind(AssertUnwindSafe(|| prepare(plan, &mut up, &down))) {
        Ok(Ok(area)) => area,
        Ok(Err(e)) => fail(&mut up, &e.to_string(), SETUP_FAILED),
        Err(_) => fail(&mut up, "panic during sandbox set-up", SETUP_FAILED),
    };
    if let Some(entry) = plan.entry {
        // The agent is the namespace's init itself: one process fewer per
        // sandbox. It reaps the orphans its tools leave (see the module docs).
        drop(down);
        run_in_process(plan, entry, up, area)
    }
    match sys::clone_fork(0) {
        Err(e) => fail(&mut up, &format!("fork: {e}"), SETUP_FAILED),
        Ok(Forked::Child) => {
            let e = match catch_unwind(AssertUnwindSafe(|| exec_main(plan))) {
                Ok(e) => e.to_string(),
                Err(_) => "panic before exec".to_string(),
            };
            fail(&mut up, &e, 127)
        }
        Ok(Forked::Parent(main)) => {
            drop(up);
            drop(down);
            reap(main, plan.status.as_ref())
        }
    }
}

fn fail(up: &mut File, msg: &str, code: i32) -> ! {
    let _ = up.write_all(format!("E{msg}").as_bytes());
    sys::exit_now(code)
}

fn setup(what: &str, e: impl std::fmt::Display) -> JailError {
    JailError::Setup(format!("{what}: {e}"))
}

fn prepare(plan: &Plan, up: &mut File, down: &File) -> Result<Option<sys::CmdlineArea>, JailError> {
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
        .map_err(|e| setup("sigprocmask", e))?;
    umask(Mode::empty());
    if let Some(netns) = &plan.netns {
        nix::sched::setns(netns, CloneFlags::CLONE_NEWNET).map_err(|e| setup("setns net", e))?;
    }
    let area = sys::scrub_cmdline().map_err(|e| setup("scrub cmdline", e))?;
    // While the supervisor moves this process into the sandbox's cgroups.
    rootfs::build_base(&plan.root)?;
    nix::unistd::sethostname("sandbox").map_err(|e| setup("sethostname", e))?;
    if plan.netns.is_none() {
        sys::loopback_up().map_err(|e| setup("loopback", e))?;
    }
    let mut down_r = down;
    let mut go = [0u8; 1];
    match down_r.read(&mut go) {
        Ok(1) if go[0] == b'C' => {}
        _ => return Err(JailError::Setup("supervisor went away".into())),
    }
    // In the sandbox's cgroups now: they become the cgroup namespace's root.
    unshare(CloneFlags::CLONE_NEWCGROUP).map_err(|e| setup("unshare cgroup", e))?;
    if let Some(n) = plan.nofile {
        // Raising the hard limit needs CAP_SYS_RESOURCE, which hosts may withhold.
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| setup("rlimit", e))?;
        let n = n.min(hard);
        setrlimit(Resource::RLIMIT_NOFILE, n, n).map_err(|e| setup("rlimit nofile", e))?;
    }
    setrlimit(Resource::RLIMIT_CORE, 0, 0).map_err(|e| setup("rlimit core", e))?;

    rootfs::build_rest(&plan.root, || match down_r.read(&mut go) {
        Ok(1) if go[0] == b'K' => Ok(()),
        _ => Err(JailError::Setup("supervisor went away".into())),
    })?;
    // After the copy into /work, which the file-size bound must not cut short.
    if let Some(bounds) = &plan.rlimits {
        bounds.apply()?;
    }

    unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| setup("unshare user", e))?;
    up.write_all(b"M").map_err(|e| setup("sync", e))?;
    match down_r.read(&mut go) {
        Ok(1) if go[0] == b'G' => {}
        _ => return Err(JailError::Setup("supervisor went away".into())),
    }
    ids::become_agent()?;
    // Credential changes clear the parent-death signal, so arm it only now,
    // then make sure the supervisor did not die before it was armed.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(|e| setup("pdeathsig", e))?;
    fcntl(down, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(|e| setup("fcntl", e))?;
    match down_r.read(&mut go) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        _ => return Err(JailError::Setup("supervisor went away".into())),
    }
    nix::sys::prctl::set_dumpable(false).map_err(|e| setup("dumpable", e))?;
    nix::sys::prctl::set_no_new_privs().map_err(|e| setup("no_new_privs", e))?;
    if plan.landlock {
        fsrules::restrict(&plan.writable, plan.cgroup_dir.as_deref(), true)?;
    }
    seccomp::install(&plan.filters)?;
    Ok(area)
}

/// In init, for a policy with `entry: agent`: what `execve` would have
/// done (signal dispositions, umask, exactly the policy's environment, no
/// descriptor but 0, 1 and 2, the socket for its child memory cgroups when
/// it has one, and the close-on-exec pipe for its end), then the agent, in
/// this process, which stays the namespace's init. Every layer is in place
/// already. Closing the set-up channel tells the supervisor the main
/// process started, as the close-on-exec of an `execve` does. Its end goes
/// on `plan.status` before it exits, as [`reap`] tells a main process's.
fn run_in_process(
    plan: &Plan,
    entry: crate::AgentEntry,
    up: File,
    area: Option<sys::CmdlineArea>,
) -> ! {
    sys::reset_signal_dispositions();
    umask(Mode::from_bits_truncate(0o002));
    sys::replace_environment(&plan.env);
    // Sealed before it takes its name: whoever sees `asbx-agent` sees the
    // agent's final capabilities (the entry seals again, as an `exec`ed
    // agent does; dropping what is gone already is a no-op).
    if let Err(e) = crate::seal_agent() {
        let _ = writeln!(std::io::stderr(), "asbx: {e}");
        sys::exit_now(i32::from(asbx_protocol::exit::SETUP_FAILED))
    }
    if let Some(area) = area {
        area.rename(c"asbx-agent");
    }
    drop(up);
    let keep: Vec<_> = [plan.cgroup_request.as_ref(), plan.status.as_ref()]
        .into_iter()
        .flatten()
        .map(|fd| fd.as_raw_fd())
        .collect();
    if let Err(e) = sys::close_from_except(3, &keep) {
        // The channel is closed: nothing to tell the supervisor.
        let _ = writeln!(std::io::stderr(), "asbx: close_range: {e}");
        sys::exit_now(127)
    }
    let code = i32::from(catch_unwind(entry).unwrap_or(101));
    tell_end(plan.status.as_ref(), code);
    std::process::exit(code)
}

/// Tells the supervisor the main process's end on `status`, when there is
/// one: 4 bytes, little-endian (`supervisor`'s `Status::relay` reads them).
fn tell_end(status: Option<&std::os::fd::OwnedFd>, code: i32) {
    if let Some(fd) = status {
        let _ = nix::unistd::write(fd, &code.to_le_bytes());
    }
}

/// In the main process: last per-process settings, then `execve`. Returns only on failure.
fn exec_main(plan: &Plan) -> JailError {
    sys::reset_signal_dispositions();
    umask(Mode::from_bits_truncate(0o002));
    let program = match resolve(plan) {
        Ok(p) => p,
        Err(e) => return e,
    };
    if let Err(e) = sys::cloexec_from(3) {
        return setup("close_range", e);
    }
    if let Some(fd) = &plan.cgroup_request
        && let Err(e) = fcntl(fd, FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()))
    {
        return setup("fcntl", e);
    }
    match nix::unistd::execve(&program, &plan.argv, &plan.env) {
        Err(e) => setup(&format!("exec {}", program.to_string_lossy()), e),
        Ok(never) => match never {},
    }
}

/// Find `argv[0]` like `execvp` does, in the `PATH` of the policy's environment.
fn resolve(plan: &Plan) -> Result<CString, JailError> {
    let Some(first) = plan.argv.first() else {
        return Err(JailError::Policy("empty argv".into()));
    };
    if first.as_bytes().contains(&b'/') {
        return Ok(first.clone());
    }
    let path = plan
        .env
        .iter()
        .find_map(|kv| kv.as_bytes().strip_prefix(b"PATH="))
        .unwrap_or(b"/usr/local/bin:/usr/bin:/bin");
    for dir in path.split(|b| *b == b':').filter(|d| !d.is_empty()) {
        let candidate = Path::new(std::ffi::OsStr::from_bytes(dir))
            .join(std::ffi::OsStr::from_bytes(first.as_bytes()));
        if nix::unistd::access(&candidate, nix::unistd::AccessFlags::X_OK).is_ok()
            && candidate.is_file()
        {
            return path_cstring(candidate);
        }
    }
    Err(JailError::Setup(format!(
        "{} not found in PATH",
        first.to_string_lossy()
    )))
}

fn path_cstring(p: PathBuf) -> Result<CString, JailError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|e| JailError::Policy(e.to_string()))
}

/// Reap every child; when `main` ends, exit with its status, told first on
/// `status` when there is one: the supervisor learns it before this
/// process's exit (which takes the namespaces down) is done.
fn reap(main: libc::pid_t, status: Option<&std::os::fd::OwnedFd>) -> ! {
    let main = nix::unistd::Pid::from_raw(main);
    let end = |code: i32| -> ! {
        tell_end(status, code);
        sys::exit_now(code)
    };
    loop {
        match waitpid(None, Some(WaitPidFlag::__WALL)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == main => end(code),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == main => end(128 + sig as i32),
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => sys::exit_now(SETUP_FAILED),
        }
    }
}
