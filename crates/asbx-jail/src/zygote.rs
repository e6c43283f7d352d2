//! The zygote: one long-lived, single-threaded `asbx jail --zygote` process
//! per runner that forks supervisors on request, so a sandbox's supervisor
//! is a `fork`, not an `execve` of the runner's binary.
//!
//! Why: an `execve` of a large position-independent binary maps it, loads
//! its libraries and applies its relocations (about 14,000 for
//! `asbx-sandbox`), each time. That is part of a millisecond of a cold
//! dispatch's critical path and of every pool boot's CPU, and the relocated
//! pages (`.data.rel.ro` and the GOT, about 0.24 MiB) are private to each
//! supervisor, and so to each sandbox, whose init and agent are forked from
//! it. Forked from the zygote, every supervisor shares those pages with it.
//!
//! The wire, over a `SOCK_SEQPACKET` socket pair (the zygote's end is its
//! stdin):
//! - request: one message, the policy as JSON, with three or four
//!   descriptors (`SCM_RIGHTS`): the supervisor's stdin, stdout and stderr,
//!   and where it reports the main process's end ([`Zygote::fork`]);
//! - reply: `P` and the child's pid (4 bytes, little-endian), or `E` and a
//!   message (the policy was refused, or `clone` failed).
//!
//! The child is cloned with `CLONE_PARENT`: it is the runner's child, as an
//! `execve`d supervisor would be (the runner reaps it, its pidfd of its
//! parent watches the runner), and the zygote never waits for anything but
//! its socket. It then makes the three descriptors its stdio, its own
//! process group, and runs [`crate::supervisor::run`] as `asbx jail
//! --policy` would.
//!
//! While no request waits it makes what a sandbox would otherwise make on
//! its critical path, each for one sandbox and never reused: network
//! namespaces ([`SPARE_NETNS`]) and, on cgroup v1, sandbox cgroups
//! ([`SPARE_CGROUPS`], renamed for the sandbox before its fork).
//!
//! The zygote holds no secret: it is started with an empty environment, and
//! what it knows is the policies it was sent. It ends when its socket reads
//! end-of-file: when the runner closed its end or died, and removes its
//! spare cgroups first; [`Zygote`]'s drop removes those of a zygote that was
//! killed.
//!
//! What it costs: every supervisor (and so every sandbox's init and agent)
//! shares the zygote's address-space layout instead of getting a fresh one
//! from `execve`. None of them parses input from another sandbox, and the
//! sandbox side reaches its supervisor only through its set-up pipe.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg,
    sendmsg, socketpair,
};

use asbx_protocol::exit;
use asbx_protocol::jail::{JailPolicy, JailProfile};

use crate::cgroup::{CGROUP_ROOT, Layout, SpareCgroups, remove_spares_of};
use crate::sys::{self, Forked};
use crate::{AgentEntry, JailError};

/// Room for the forked supervisors' titles: the zygote's command line is
/// `exe jail --zygote <TITLE_ROOM spaces>`, and each child writes over it
/// `asbx jail <cgroup> <workdir>`, so an operator's `ps` (and a test) can
/// tell which sandbox a supervisor runs, as the `--policy` argument of an
/// `execve`d one showed.
const TITLE_ROOM: usize = 480;

/// Network namespaces the zygote keeps made ahead of time, `lo` up: making
/// one (and bringing `lo` up, which starts IPv6 address configuration) is
/// the largest single step of a sandbox's start, about 0.8 ms on this
/// kernel. Each is fresh: handed to exactly one sandbox and never reused. It
/// makes them while no request waits, so they cost a request nothing.
const SPARE_NETNS: usize = 4;

/// Sandbox cgroups the zygote keeps made ahead of time, renamed for a
/// sandbox on request (see [`SpareCgroups`]); like the network namespaces,
/// each serves one sandbox.
const SPARE_CGROUPS: usize = 4;

/// The largest policy the zygote reads (a policy carries the agent's
/// environment; a few KiB in practice).
const MAX_POLICY: usize = 1 << 20;

/// The zygote's one environment variable: the sandboxes' shared `/etc`
/// (`rootfs::shared_etc`), found by the runner. Walking the host's `/etc`
/// in the zygote itself would leave its heap fragmented, and every
/// supervisor, init and agent forked from it pays for that in pages copied
/// on write: about 30 KiB each, 100 KiB per sandbox, measured.
const ETC_ENV: &str = "ASBX_JAIL_ETC";

/// The runner's handle on its zygote. Not `Sync`-safe to share without a
/// lock: requests and replies must not interleave.
#[derive(Debug)]
pub struct Zygote {
    /// `None` only while dropping.
    sock: Option<OwnedFd>,
    child: Child,
}

impl Zygote {
    /// The zygote's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts `exe jail --zygote` with an environment of only `ETC_ENV`,
    /// its stdout on `/dev/null` and its stderr inherited.
    pub fn start(exe: &Path) -> Result<Zygote, JailError> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| JailError::Host(format!("zygote socket: {e}")))?;
        let etc = crate::rootfs::shared_etc()?;
        let child = Command::new(exe)
            .args(["jail", "--zygote", &" ".repeat(TITLE_ROOM)])
            .env_clear()
            .env(ETC_ENV, etc)
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| JailError::Host(format!("{}: {e}", exe.display())))?;
        Ok(Zygote {
            sock: Some(ours),
            child,
        })
    }

    /// Forks a supervisor running `policy` (JSON) with `stdio` as its stdin,
    /// stdout and stderr; returns its pid. The child is the caller's (see
    /// the module docs): the caller reaps it. With `report` (a stream
    /// socket), the supervisor reports the main process's end there as soon
    /// as the sandbox's init tells it: 4 bytes, the code (little-endian) the
    /// supervisor will exit with, before init's exit takes the sandbox's
    /// namespaces down. Nothing comes if the sandbox ends another way (its
    /// supervisor killed, set-up failed): then its exit says it. The
    /// supervisor holds `report` until it exits, so its end-of-file says the
    /// supervisor is exiting.
    pub fn fork(
        &self,
        policy: &[u8],
        stdio: [BorrowedFd<'_>; 3],
        report: Option<BorrowedFd<'_>>,
    ) -> Result<libc::pid_t, JailError> {
        let io = |e: nix::Error| JailError::Host(format!("zygote: {e}"));
        let sock = self
            .sock
            .as_ref()
            .ok_or_else(|| JailError::Host("zygote: closed".into()))?;
        let mut fds: Vec<RawFd> = stdio.iter().map(|f| f.as_raw_fd()).collect();
        fds.extend(report.map(|r| r.as_raw_fd()));
        let cmsg = [ControlMessage::ScmRights(&fds)];
        sendmsg::<()>(
            sock.as_raw_fd(),
            &[IoSlice::new(policy)],
            &cmsg,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(io)?;
        let mut buf = [0u8; 1024];
        let (n, []) = recv_with_fds::<0>(sock.as_fd(), &mut buf)
            .map_err(|e| JailError::Host(format!("zygote: {e}")))?;
        match &buf[..n] {
            [b'P', a, b, c, d] => Ok(i32::from_le_bytes([*a, *b, *c, *d])),
            [b'E', msg @ ..] => Err(JailError::Host(format!(
                "zygote: {}",
                String::from_utf8_lossy(msg)
            ))),
            [] => Err(JailError::Host("zygote: it ended".into())),
            _ => Err(JailError::Host("zygote: an unreadable reply".into())),
        }
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        // End-of-file on its socket ends it at once, and it removes its
        // spare cgroups; one that was killed could not.
        drop(self.sock.take());
        let _ = self.child.wait();
        if let Ok(layout) = Layout::detect(Path::new(CGROUP_ROOT)) {
            remove_spares_of(&layout, self.child.id());
        }
    }
}

/// Receives one message into `buf` and up to `N` descriptors (close-on-exec).
/// A message longer than `buf` is an error.
fn recv_with_fds<const N: usize>(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
) -> io::Result<(usize, [Option<OwnedFd>; N])> {
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = loop {
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => break r.map_err(io::Error::from)?,
        }
    };
    let mut got: [Option<OwnedFd>; N] = std::array::from_fn(|_| None);
    let mut i = 0;
    let mut extra = false;
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for fd in fds {
                let owned = sys::own_received_fd(fd);
                if i < N {
                    got[i] = Some(owned);
                    i += 1;
                } else {
                    extra = true; // dropped: closed
                }
            }
        }
    }
    let n = msg.bytes;
    if msg
        .flags
        .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC)
        || extra
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message or descriptors truncated",
        ));
    }
    Ok((n, got))
}

/// `asbx jail --zygote`: serve fork requests on stdin until end-of-file.
/// Returns the process's exit code. Must run in a fresh single-threaded
/// process.
pub fn serve(agent: Option<AgentEntry>) -> i32 {
    // Fd 0 is the socket, and nothing else in this process uses it.
    let sock = sys::own_received_fd(0);
    let title = sys::cmdline_area().ok().flatten();
    if let Some(area) = title {
        area.show(b"asbx jail --zygote");
    }
    let mut buf = vec![0u8; MAX_POLICY];
    // What every supervisor would otherwise compute the same, once.
    let _ = crate::seccomp::build();
    crate::rootfs::shared_etc_from_env(ETC_ENV);
    let mut spares = Spares::new();
    loop {
        spares.fill_while_idle(sock.as_fd());
        let (n, fds) = match recv_with_fds::<4>(sock.as_fd(), &mut buf) {
            Ok((0, _)) => return 0, // the runner closed its end, or died
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                if reply(&sock, b"E", e.to_string().as_bytes()).is_err() {
                    return 1;
                }
                continue;
            }
            Err(_) => return 1,
        };
        let answer = fork_one(&buf[..n], fds, agent, title, &mut spares);
        let sent = match answer {
            Ok(pid) => reply(&sock, b"P", &pid.to_le_bytes()),
            Err(e) => reply(&sock, b"E", e.to_string().as_bytes()),
        };
        if sent.is_err() {
            return 1;
        }
    }
}

fn reply(sock: &OwnedFd, tag: &[u8], body: &[u8]) -> nix::Result<()> {
    sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(tag), IoSlice::new(body)],
        &[],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map(|_| ())
}

/// Parses the policy and forks its supervisor; the child never returns.
fn fork_one(
    policy: &[u8],
    fds: [Option<OwnedFd>; 4],
    agent: Option<AgentEntry>,
    title: Option<sys::CmdlineArea>,
    spares: &mut Spares,
) -> Result<libc::pid_t, JailError> {
    let policy: JailPolicy = serde_json::from_slice(policy)
        .map_err(|e| JailError::Policy(format!("invalid policy: {e}")))?;
    let [Some(stdin), Some(stdout), Some(stderr), report] = fds else {
        return Err(JailError::Host(
            "a request without its three descriptors".into(),
        ));
    };
    // Ours or the child's; closed here either way once the child has it.
    let netns = spares.take();
    // Renamed for this sandbox: the child's from here on, or removed here.
    let cgroups_made =
        policy.profile == JailProfile::Strict && spares.cgroups.take_as(&policy.cgroup);
    // `CLONE_PARENT`: the child is the runner's (see the module docs).
    let cloned =
        sys::clone_fork(libc::CLONE_PARENT).map_err(|e| JailError::Host(format!("clone: {e}")));
    if cgroups_made && cloned.is_err() {
        let _ = crate::remove_cgroups(&policy.cgroup);
    }
    match cloned? {
        Forked::Parent(pid) => Ok(pid),
        Forked::Child => {
            if let Some(area) = title {
                area.show(format!("asbx jail {} {}", policy.cgroup, policy.workdir).as_bytes());
            }
            let code = match become_supervisor(&stdin, &stdout, &stderr) {
                Ok(()) => {
                    drop((stdin, stdout, stderr));
                    // The other spares are the zygote's, not this sandbox's.
                    drop(std::mem::take(&mut spares.ready));
                    spares.cgroups.forget();
                    let ahead = crate::supervisor::MadeAhead {
                        netns,
                        cgroups: cgroups_made,
                        report,
                    };
                    match crate::supervisor::run_in(&policy, agent, ahead) {
                        Ok(code) => code,
                        Err(e) => {
                            use std::io::Write;
                            if cgroups_made {
                                // Failed before they were in its hands.
                                let _ = crate::remove_cgroups(&policy.cgroup);
                            }
                            let _ = writeln!(std::io::stderr(), "asbx jail: {e}");
                            i32::from(exit::SETUP_FAILED)
                        }
                    }
                }
                Err(_) => i32::from(exit::SETUP_FAILED),
            };
            sys::exit_now(code)
        }
    }
}

/// In the forked child: the three descriptors become stdio (which closes
/// the zygote's socket, fd 0), and the child leads its own process group,
/// as the runner's `process_group(0)` made an `execve`d supervisor do.
fn become_supervisor(stdin: &OwnedFd, stdout: &OwnedFd, stderr: &OwnedFd) -> io::Result<()> {
    for (fd, to) in [(stdin, 0), (stdout, 1), (stderr, 2)] {
        sys::dup2_onto(fd.as_fd(), to)?;
    }
    let me = nix::unistd::Pid::from_raw(0);
    nix::unistd::setpgid(me, me).map_err(io::Error::from)
}

/// What the zygote makes ahead of time: network namespaces
/// ([`SPARE_NETNS`]) and sandbox cgroups ([`SPARE_CGROUPS`]).
struct Spares {
    /// The zygote's own network namespace, to return to after making one.
    home: Option<OwnedFd>,
    ready: Vec<OwnedFd>,
    cgroups: SpareCgroups,
}

impl Spares {
    fn new() -> Spares {
        // Without its own namespace's descriptor the zygote could not come
        // back from a new one: then it makes none, and `clone` makes each.
        let home = std::fs::File::open("/proc/self/ns/net")
            .ok()
            .map(OwnedFd::from);
        Spares {
            home,
            ready: Vec::new(),
            cgroups: SpareCgroups::new(),
        }
    }

    /// A fresh namespace for one sandbox, if one is ready.
    fn take(&mut self) -> Option<OwnedFd> {
        self.ready.pop()
    }

    /// Makes spares, one at a time, until there are enough of each kind,
    /// or a request waits on `sock`. A kind whose making failed is made no
    /// more (then each sandbox makes its own).
    fn fill_while_idle(&mut self, sock: BorrowedFd<'_>) {
        loop {
            let netns = self.home.is_some() && self.ready.len() < SPARE_NETNS;
            let cgroups = self.cgroups.enabled() && self.cgroups.len() < SPARE_CGROUPS;
            if !(netns || cgroups) || sys::poll_readable(&[sock], 0).map_or(true, |r| r[0]) {
                return;
            }
            // The kind with fewer ready first.
            if netns && (!cgroups || self.ready.len() <= self.cgroups.len()) {
                match self.make() {
                    Some(ns) => self.ready.push(ns),
                    None => self.home = None,
                }
            } else {
                self.cgroups.make_one();
            }
        }
    }

    /// A new network namespace with `lo` up; the zygote is back in its own
    /// when this returns, or `None` and stays home if it could not be made.
    fn make(&self) -> Option<OwnedFd> {
        use nix::sched::{CloneFlags, setns, unshare};
        let home = self.home.as_ref()?;
        unshare(CloneFlags::CLONE_NEWNET).ok()?;
        let made = std::fs::File::open("/proc/self/ns/net")
            .ok()
            .map(OwnedFd::from)
            .filter(|_| sys::loopback_up().is_ok());
        if setns(home, CloneFlags::CLONE_NEWNET).is_err() {
            // Stranded in a namespace of its own: forking from here would
            // put sandboxes in it. Nothing sane is left to do.
            sys::exit_now(1);
        }
        made
    }
}
