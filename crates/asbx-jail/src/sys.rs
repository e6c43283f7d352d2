//! Thin wrappers over the few system calls nix does not cover: `clone` with
//! namespace flags and fork semantics, capability sets, `close_range`,
//! bringing up the loopback interface, `pidfd_open`, `poll`, `_exit`, and
//! the new mount API (`open_tree`, `move_mount`, `fsopen`/`fsmount`).
//!
//! Every `unsafe` block of the crate lives here, each with a SAFETY note.

// The one module allowed `unsafe`: every block below has a SAFETY note.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

/// Capability numbers (linux/capability.h) the jail deals with by name.
pub(crate) const CAP_KILL: u32 = 5;
pub(crate) const CAP_SETGID: u32 = 6;
pub(crate) const CAP_SETUID: u32 = 7;
pub(crate) const CAP_SETPCAP: u32 = 8;

/// What a `clone` returned: which side of it we are on.
pub(crate) enum Forked {
    Parent(libc::pid_t),
    Child,
}

/// `clone(flags | SIGCHLD)` without a new stack: fork semantics plus
/// namespace flags, in one system call.
///
/// The caller must be single-threaded (the child gets a copy of this thread
/// only) and the child must end with [`exit_now`] or `execve`, never by
/// returning into code that assumes it is the original process.
pub(crate) fn clone_fork(ns_flags: libc::c_int) -> io::Result<Forked> {
    let flags = (ns_flags | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: raw clone with a NULL stack behaves like fork(2): the child runs
    // on a copy of the caller's stack. No CLONE_VM/CLONE_SETTLS/CLONE_*TID, so
    // the remaining pointer arguments are unused. The jail calls this from a
    // single-threaded process, so no lock can be held by a vanished thread.
    let ret = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    match ret {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid as libc::pid_t)),
    }
}

/// Takes ownership of a descriptor the kernel handed this process (received
/// with `SCM_RIGHTS`, or a stdio slot nothing else uses).
pub(crate) fn own_received_fd(fd: std::os::fd::RawFd) -> OwnedFd {
    // SAFETY: the caller passes a descriptor that is open and owned by no
    // other Rust value; it is closed exactly once, by the returned value.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Takes descriptor `fd` when it is an open socket, making it
/// close-on-exec; `None` (and `fd` left alone) otherwise.
pub(crate) fn take_socket(fd: std::os::fd::RawFd) -> Option<OwnedFd> {
    // SAFETY: `stat` is plain data, for which all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into the struct we own; an invalid `fd` only
    // makes it fail.
    let ret = unsafe { libc::fstat(fd, &mut st) };
    if ret != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return None;
    }
    // SAFETY: fcntl on an integer; `fd` is open (fstat said so).
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return None;
    }
    Some(own_received_fd(fd))
}

/// `dup2(fd, to)`: makes `to` (a stdio slot) a copy of `fd`, without
/// close-on-exec.
pub(crate) fn dup2_onto(fd: BorrowedFd<'_>, to: std::os::fd::RawFd) -> io::Result<()> {
    // SAFETY: dup2 takes two integers; `fd` is open for the call's duration.
    match unsafe { libc::dup2(fd.as_raw_fd(), to) } {
        -1 => Err(io::Error::last_os_error()),
        _ => Ok(()),
    }
}

/// End the calling process now, without running atexit handlers or
/// destructors (the child of [`clone_fork`] shares them with its parent).
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and touches no Rust state.
    unsafe { libc::_exit(code) }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Set the calling thread's effective, permitted and inheritable sets
/// (bit masks over capability numbers).
pub(crate) fn capset(effective: u64, permitted: u64, inheritable: u64) -> io::Result<()> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: effective as u32,
            permitted: permitted as u32,
            inheritable: inheritable as u32,
        },
        CapData {
            effective: (effective >> 32) as u32,
            permitted: (permitted >> 32) as u32,
            inheritable: (inheritable >> 32) as u32,
        },
    ];
    // SAFETY: header and data are valid, correctly laid out (v3 takes two
    // data elements) and live for the duration of the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Read the calling thread's (effective, permitted, inheritable) sets.
pub(crate) fn capget() -> io::Result<(u64, u64, u64)> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: header and a two-element data array, valid for writes.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut CapHeader,
            data.as_mut_ptr(),
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    let join = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    Ok((
        join(data[0].effective, data[1].effective),
        join(data[0].permitted, data[1].permitted),
        join(data[0].inheritable, data[1].inheritable),
    ))
}

fn prctl5(option: libc::c_int, a: libc::c_ulong, b: libc::c_ulong) -> io::Result<libc::c_int> {
    // SAFETY: the prctl options used here (capability bounding and ambient
    // sets) take integer arguments only; no pointer is passed.
    let ret = unsafe { libc::prctl(option, a, b, 0 as libc::c_ulong, 0 as libc::c_ulong) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Highest capability number this kernel knows.
pub(crate) fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

/// Drop every capability from the bounding set except those in `keep`.
/// Needs `CAP_SETPCAP`, which is dropped last.
pub(crate) fn drop_bounding_except(keep: u64, last: u32) -> io::Result<()> {
    for cap in (0..=last).filter(|c| *c != CAP_SETPCAP) {
        if keep & (1 << cap) == 0 {
            prctl5(libc::PR_CAPBSET_DROP, cap.into(), 0)?;
        }
    }
    if keep & (1 << CAP_SETPCAP) == 0 {
        prctl5(libc::PR_CAPBSET_DROP, CAP_SETPCAP.into(), 0)?;
    }
    Ok(())
}

/// Raise one capability in the ambient set (it must be permitted and inheritable).
pub(crate) fn ambient_raise(cap: u32) -> io::Result<()> {
    prctl5(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
        cap.into(),
    )
    .map(drop)
}

/// Empty the ambient set.
pub(crate) fn ambient_clear() -> io::Result<()> {
    prctl5(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
        0,
    )
    .map(drop)
}

/// Mark every descriptor from `first` up close-on-exec.
pub(crate) fn cloexec_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on
    // descriptors; it takes integers and closes nothing.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Set `IFF_UP` on the loopback interface of the current network namespace.
pub(crate) fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket creation; the descriptor is owned right below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor nobody else owns.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let raw = std::os::fd::AsRawFd::as_raw_fd(&sock);
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the name and writes ifru_flags inside `req`,
    // which is valid for reads and writes.
    if unsafe { libc::ioctl(raw, libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the union member ifru_flags was just written by the kernel.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: as above, `req` is valid and names the interface.
    if unsafe { libc::ioctl(raw, libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reset every catchable signal to its default action (exec keeps
/// "ignored", and Rust ignores `SIGPIPE`, which shells must not inherit).
pub(crate) fn reset_signal_dispositions() {
    for sig in 1..=31 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: installing SIG_DFL installs no Rust code as a handler.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
}

/// The Landlock ABI version of the running kernel, or 0 without Landlock.
pub(crate) fn landlock_abi() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_ulong = 1;
    // SAFETY: with a NULL attr, size 0 and the VERSION flag the call only
    // returns a number.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if ret < 0 { 0 } else { ret }
}

/// Set `SIGCHLD` to its default action.
pub(crate) fn default_sigchld() -> io::Result<()> {
    // SAFETY: SIG_DFL installs no handler code.
    let prev = unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
    if prev == libc::SIG_ERR {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// This process's argument area (`arg_start..arg_end` of
/// `/proc/self/stat`), and its environment area; `None` when the kernel
/// does not say.
fn own_areas() -> io::Result<Option<(CmdlineArea, CmdlineArea)>> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let after_comm = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let fields: Vec<usize> = after_comm
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // Fields 48..=51 of /proc/pid/stat; the slice starts at field 3.
    let (Some(&arg_start), Some(&arg_end), Some(&env_start), Some(&env_end)) = (
        fields.get(45),
        fields.get(46),
        fields.get(47),
        fields.get(48),
    ) else {
        return Err(io::Error::other("short /proc/self/stat"));
    };
    if arg_start == 0 || arg_end <= arg_start || env_end < env_start {
        return Ok(None);
    }
    Ok(Some((
        CmdlineArea {
            start: arg_start,
            end: arg_end,
        },
        CmdlineArea {
            start: env_start,
            end: env_end,
        },
    )))
}

/// This process's argument area, to show a title in ([`CmdlineArea::show`]).
pub(crate) fn cmdline_area() -> io::Result<Option<CmdlineArea>> {
    Ok(own_areas()?.map(|(args, _)| args))
}

/// Hide the supervisor's command line and environment from the sandbox:
/// init is a fork of the supervisor, and `/proc/1/cmdline` is world-readable.
/// Overwrites the argument area with `asbx-init` and zeroes the rest and the
/// environment strings. The last argument byte is made non-zero, which makes
/// the kernel read the area like a `setproctitle` title: up to the first NUL.
pub(crate) fn scrub_cmdline() -> io::Result<Option<CmdlineArea>> {
    const NAME: &[u8] = b"asbx-init";
    let Some((args, env)) = own_areas()? else {
        return Ok(None);
    };
    if args.end <= args.start + NAME.len() + 1 {
        return Ok(None);
    }
    args.show(NAME);
    // SAFETY: [start, end) is this process's own environment strings on its
    // initial stack, mapped and writable. This runs in the sandbox's init,
    // a fork of the supervisor that never reads its environment again.
    unsafe {
        std::ptr::write_bytes(env.start as *mut u8, 0, env.end - env.start);
    }
    Ok(Some(args))
}

/// A process's argument (or environment) area: the same addresses in every
/// fork of the process that found it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CmdlineArea {
    start: usize,
    end: usize,
}

impl CmdlineArea {
    /// Show `name` (NUL-terminated, shorter than the area) as this process's
    /// command line, and its first 15 bytes as its `comm`.
    pub(crate) fn rename(self, name: &std::ffi::CStr) {
        if self.end <= self.start + name.to_bytes_with_nul().len() {
            return;
        }
        self.show(name.to_bytes());
        let _ = nix::sys::prctl::set_name(name);
    }

    /// Show `text` as this process's command line, cut to fit the area: the
    /// area is zeroed, `text` written at its start, and its last byte made
    /// non-zero, which makes the kernel read the area like a `setproctitle`
    /// title, up to the first NUL.
    pub(crate) fn show(self, text: &[u8]) {
        let Some(room) = (self.end - self.start).checked_sub(2) else {
            return;
        };
        let text = &text[..text.len().min(room)];
        // SAFETY: the area is this process's own argument strings on its
        // initial stack (see `own_areas`), mapped and writable, and longer
        // than `text` plus a NUL; nothing reads them as Rust data (the
        // process read its arguments before it got here).
        unsafe {
            std::ptr::write_bytes(self.start as *mut u8, 0, self.end - self.start);
            std::ptr::copy_nonoverlapping(text.as_ptr(), self.start as *mut u8, text.len());
            *((self.end - 1) as *mut u8) = b' ';
        }
    }
}

/// Close every descriptor from `first` up (`close_range`, Linux 5.9).
pub(crate) fn close_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range takes integers; the caller owns every descriptor
    // from `first` up and uses none of them afterwards.
    let ret = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0) };
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// [`close_from`], but the descriptors in `keep` stay open.
pub(crate) fn close_from_except(first: u32, keep: &[RawFd]) -> io::Result<()> {
    let mut keep: Vec<u32> = keep
        .iter()
        .filter_map(|k| u32::try_from(*k).ok())
        .filter(|k| *k >= first)
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let mut from = first;
    for k in keep {
        if k > from {
            // SAFETY: as in `close_from`, for the range below this `keep`.
            let ret = unsafe { libc::syscall(libc::SYS_close_range, from, k - 1, 0) };
            if ret != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        match k.checked_add(1) {
            Some(next) => from = next,
            None => return Ok(()),
        }
    }
    close_from(from)
}

/// Make `env` (`NAME=value` strings) this process's whole environment.
pub(crate) fn replace_environment(env: &[std::ffi::CString]) {
    let old: Vec<std::ffi::OsString> = std::env::vars_os().map(|(k, _)| k).collect();
    for key in old {
        // SAFETY: the process is single-threaded (a fork of the sandbox's
        // init, which never starts a thread), so nothing reads the
        // environment concurrently.
        unsafe { std::env::remove_var(key) };
    }
    for kv in env {
        let bytes = kv.as_bytes();
        if let Some(eq) = bytes.iter().position(|b| *b == b'=') {
            let key = std::ffi::OsStr::from_bytes(&bytes[..eq]);
            let value = std::ffi::OsStr::from_bytes(&bytes[eq + 1..]);
            // SAFETY: as above, single-threaded.
            unsafe { std::env::set_var(key, value) };
        }
    }
}

/// A descriptor of process `pid` that becomes readable when it exits
/// (`pidfd_open`, Linux 5.3). `pid` must be a thread-group leader.
pub(crate) fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new descriptor or -1.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as libc::c_int) })
}

/// Wait until at least one of `fds` is readable (or hung up), or for
/// `timeout_ms` (-1: no limit, 0: just look); which ones are. Restarts on
/// `EINTR`.
pub(crate) fn poll_readable(fds: &[BorrowedFd<'_>], timeout_ms: i32) -> io::Result<Vec<bool>> {
    let mut set: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: `set` is a valid array of `set.len()` pollfd structures that
        // the kernel may write `revents` into; every fd is borrowed, so open.
        let ret = unsafe { libc::poll(set.as_mut_ptr(), set.len() as libc::nfds_t, timeout_ms) };
        if ret >= 0 {
            return Ok(set.iter().map(|p| p.revents != 0).collect());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

// The new mount API (linux/mount.h); libc has the call numbers only.
const OPEN_TREE_CLONE: libc::c_uint = 1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
/// `MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV`.
pub(crate) const MOUNT_ATTR_NOSUID_NODEV: libc::c_uint = 0x2 | 0x4;
/// `MOUNT_ATTR_NOEXEC`.
pub(crate) const MOUNT_ATTR_NOEXEC: libc::c_uint = 0x8;

fn c_path(path: &std::path::Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn fd_result(ret: libc::c_long) -> io::Result<OwnedFd> {
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as libc::c_int) })
}

/// `open_tree(AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)`: a
/// detached, non-recursive copy of the mount that `path` names (symbolic
/// and `/proc/<pid>/fd` links followed), rooted at `path`.
pub(crate) fn open_tree_clone(path: &std::path::Path) -> io::Result<OwnedFd> {
    let p = c_path(path)?;
    // SAFETY: `p` is a valid NUL-terminated string that outlives the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            p.as_ptr(),
            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC,
        )
    };
    fd_result(ret)
}

/// `move_mount(tree, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH)`:
/// attach a detached mount (from [`open_tree_clone`]) on `target`.
pub(crate) fn move_mount_to(tree: BorrowedFd<'_>, target: &std::path::Path) -> io::Result<()> {
    let t = c_path(target)?;
    // SAFETY: both strings are valid and NUL-terminated; `tree` is an open descriptor.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new tmpfs that is mounted nowhere (`fsopen`, `fsconfig`, `fsmount`):
/// reachable only through the returned descriptor, gone with its last one.
pub(crate) fn detached_tmpfs(options: &[(&str, &str)], attrs: libc::c_uint) -> io::Result<OwnedFd> {
    // SAFETY: a static NUL-terminated file-system name.
    let fs =
        fd_result(unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC) })?;
    for (key, value) in options {
        let k = std::ffi::CString::new(*key)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a tmpfs option"))?;
        let v = std::ffi::CString::new(*value)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a tmpfs option"))?;
        // SAFETY: `fs` is open; both strings are valid for the call.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_SET_STRING,
                k.as_ptr(),
                v.as_ptr(),
                0,
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: `fs` is open; no pointer arguments.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fs` is a configured file-system context; no pointer arguments.
    fd_result(unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, attrs) })
}

/// Errors of [`join_before_exec`]'s hook travel to the parent as one `i32`
/// (std sends only an errno from the child): `JOIN_ERROR_BASE + index *
/// JOIN_ERRNO_SPAN + errno`, so the parent learns which file and why.
pub(crate) const JOIN_ERROR_BASE: i32 = 0x4153_0000;
/// See [`JOIN_ERROR_BASE`]; errnos are below it.
pub(crate) const JOIN_ERRNO_SPAN: i32 = 4096;

/// Make `cmd`'s child write `0` to each of `files` (cgroup `cgroup.procs`)
/// after its uid and gid changed and before it `exec`s: it joins those
/// cgroups, and a failed open or write fails the spawn (see
/// [`JOIN_ERROR_BASE`]), so the program never runs outside them.
pub(crate) fn join_before_exec(cmd: &mut std::process::Command, files: Vec<std::ffi::CString>) {
    use std::os::unix::process::CommandExt;
    let hook = move || -> io::Result<()> {
        for (i, file) in files.iter().enumerate() {
            let index = i32::try_from(i).unwrap_or(0);
            let fail = |errno: i32| {
                io::Error::from_raw_os_error(
                    JOIN_ERROR_BASE + index * JOIN_ERRNO_SPAN + errno.clamp(1, JOIN_ERRNO_SPAN - 1),
                )
            };
            // SAFETY: open, write and close are async-signal-safe system
            // calls; `file` is a NUL-terminated string built before the
            // fork and the byte buffer is static. Nothing here allocates or
            // takes a lock (errno is read through a thread-local pointer).
            let fd = unsafe { libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
            if fd < 0 {
                return Err(fail(errno()));
            }
            // SAFETY: as above; `fd` is the descriptor just opened.
            let n = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
            let err = if n == 1 {
                None
            } else if n < 0 {
                Some(errno())
            } else {
                Some(libc::EIO)
            };
            // SAFETY: `fd` is ours and used no more.
            unsafe { libc::close(fd) };
            if let Some(e) = err {
                return Err(fail(e));
            }
        }
        Ok(())
    };
    // SAFETY: the hook runs in the child between fork and exec and only
    // makes async-signal-safe system calls on data prepared before the fork
    // (no allocation, no lock), as `pre_exec` requires.
    unsafe {
        cmd.pre_exec(hook);
    }
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a forked child (closing descriptors in the test process would
    /// close the harness's): the kept descriptors stay open, in any order
    /// and with duplicates and ones below `first`, and every other one from
    /// `first` on is closed. The child's exit code says which check failed.
    #[test]
    fn close_from_except_keeps_exactly_the_kept() {
        let fds: Vec<RawFd> = (0..6)
            .map(|_| {
                std::fs::File::open("/dev/null")
                    .map(std::os::fd::IntoRawFd::into_raw_fd)
                    .unwrap()
            })
            .collect();
        // The lowest of them: other tests' threads open and close files
        // meanwhile, so the six need not come in ascending order.
        let first = u32::try_from(*fds.iter().min().unwrap()).unwrap();
        let keep = [fds[4], fds[1], fds[4], 0];
        // SAFETY: the child only makes system calls, allocates (which
        // glibc's `fork` leaves safe in the child of a threaded process)
        // and `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY: F_GETFD reads a descriptor's flags, open or not.
            let open = |fd: RawFd| unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1;
            let code = match close_from_except(first, &keep) {
                Err(_) => 2,
                Ok(()) if !open(fds[1]) || !open(fds[4]) || !open(0) => 3,
                Ok(()) if [fds[0], fds[2], fds[3], fds[5]].into_iter().any(open) => 4,
                Ok(()) => 0,
            };
            // SAFETY: ends the child at once, running nothing of the parent's.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        for fd in fds {
            // SAFETY: opened above, owned by this test.
            unsafe { libc::close(fd) };
        }
        assert!(libc::WIFEXITED(status), "the child ended by a signal");
        assert_eq!(libc::WEXITSTATUS(status), 0, "check that failed");
    }

    /// `request_memory_cgroup` (`spawn.rs`), in a forked child (the request
    /// socket is taken once per process):
    /// `tools` asked for twice and `mcp` once reach the supervisor's end as
    /// one request each, every answer `+`; the parent plays the supervisor.
    #[test]
    fn a_child_cgroup_is_asked_for_once() {
        let (supervisor, sandbox) = std::os::unix::net::UnixStream::pair().unwrap();
        // SAFETY: the child only sets a variable (it is single-threaded
        // after `fork`), makes system calls, allocates (which glibc's
        // `fork` leaves safe in the child of a threaded process) and
        // `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            drop(supervisor);
            // SAFETY: the child has one thread; nothing reads the
            // environment at the same time.
            unsafe {
                std::env::set_var(
                    asbx_protocol::jail::CGROUP_REQUEST_FD_ENV,
                    sandbox.as_raw_fd().to_string(),
                )
            };
            std::mem::forget(sandbox);
            let code = if !crate::take_cgroup_requests() {
                2
            } else {
                let asked = [
                    crate::request_memory_cgroup("tools"),
                    crate::request_memory_cgroup("tools"),
                    crate::request_memory_cgroup("mcp"),
                ];
                if asked.iter().all(|a| matches!(a, Ok(true))) {
                    0
                } else {
                    3
                }
            };
            // SAFETY: ends the child at once, running nothing of the parent's.
            unsafe { libc::_exit(code) };
        }
        drop(sandbox);
        let mut supervisor = supervisor;
        let mut heard = Vec::new();
        let mut byte = [0u8; 1];
        while let Ok(1) = std::io::Read::read(&mut supervisor, &mut byte) {
            heard.push(byte[0]);
            std::io::Write::write_all(&mut supervisor, b"+").unwrap();
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "the child ended by a signal");
        assert_eq!(libc::WEXITSTATUS(status), 0, "check that failed");
        assert_eq!(heard, b"tm", "{:?}", String::from_utf8_lossy(&heard));
    }
}
