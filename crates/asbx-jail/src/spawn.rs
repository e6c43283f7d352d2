//! Starting a process inside a sandbox's child cgroup with one `exec`.
//!
//! The agent starts every tool and stdio MCP server in the sandbox's child
//! cgroup (`tools` or `mcp`), as the tool's uid. [`join_cgroups_on_spawn`]
//! adds a hook to a [`std::process::Command`] that runs in the child after
//! its uid and gid changed and before it `exec`s the program: it writes `0`
//! to each `cgroup.procs` (the process moves itself), opened only then, so
//! the kernel checks the tool uid's right to move itself (cgroup v1 checks
//! the credentials the file was opened with). A failed open or write fails
//! the spawn ([`join_failure`] says which file and why): the program never
//! runs outside its cgroup. This replaces a `sh -c` wrapper that did the
//! same writes and then `exec`ed the program (two `exec`s per tool start;
//! the agent crate has no `unsafe`, and `pre_exec` needs it).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use asbx_protocol::jail::CGROUP_REQUEST_FD_ENV;

use crate::JailError;
use crate::sys::{self, JOIN_ERRNO_SPAN, JOIN_ERROR_BASE};

/// Make `cmd`'s process join the cgroups whose `cgroup.procs` files are
/// `procs` before it `exec`s; see the module docs.
pub fn join_cgroups_on_spawn(
    cmd: &mut std::process::Command,
    procs: &[PathBuf],
) -> Result<(), JailError> {
    let files = procs
        .iter()
        .map(|p| {
            CString::new(p.as_os_str().as_bytes())
                .map_err(|_| JailError::Policy(format!("{} contains a NUL byte", p.display())))
        })
        .collect::<Result<Vec<_>, _>>()?;
    sys::join_before_exec(cmd, files);
    Ok(())
}

/// When `err` (from spawning a command prepared by
/// [`join_cgroups_on_spawn`] with the same `procs`) says a join failed:
/// which file, and why.
pub fn join_failure(err: &std::io::Error, procs: &[PathBuf]) -> Option<String> {
    let code = err.raw_os_error()?.checked_sub(JOIN_ERROR_BASE)?;
    let index = usize::try_from(code / JOIN_ERRNO_SPAN).ok()?;
    let file = procs.get(index).map(PathBuf::as_path)?;
    let why = std::io::Error::from_raw_os_error(code % JOIN_ERRNO_SPAN);
    Some(format!("{}: {why}", file.display()))
}

/// The request socket, and which child cgroups the supervisor said it made
/// (`tools`, `mcp`): its yes holds for the sandbox's life, so each is asked
/// for once.
struct Asker {
    sock: std::os::unix::net::UnixStream,
    made: [bool; 2],
}

type Requests = std::sync::Mutex<Asker>;

/// The socket on which this process asks its supervisor for its child
/// memory cgroups ([`CGROUP_REQUEST_FD_ENV`]), taken the first time this
/// runs when the environment names a descriptor that is a socket, and made
/// close-on-exec then, so that no tool inherits it.
fn cgroup_requests() -> Option<&'static Requests> {
    static SOCKET: std::sync::OnceLock<Option<Requests>> = std::sync::OnceLock::new();
    SOCKET
        .get_or_init(|| {
            let fd: std::os::fd::RawFd = std::env::var(CGROUP_REQUEST_FD_ENV)
                .ok()?
                .parse()
                .ok()
                .filter(|fd| *fd > 2)?;
            let sock = sys::take_socket(fd)?;
            Some(std::sync::Mutex::new(Asker {
                sock: sock.into(),
                made: [false; 2],
            }))
        })
        .as_ref()
}

/// For the agent, first thing, before it starts any process: takes the
/// socket of [`request_memory_cgroup`] (close-on-exec from now on). Whether
/// there is one.
pub fn take_cgroup_requests() -> bool {
    cgroup_requests().is_some()
}

/// Asks the supervisor to make the memory cgroup of child cgroup `child`
/// (`tools` or `mcp`, see [`CGROUP_REQUEST_FD_ENV`]) and waits for it; once
/// it said yes, returns at once without asking again. Callers on other
/// threads wait while one asks.
/// `Ok(false)`: this process has no such socket (not in a jail, or its
/// child cgroups are made with it); `Ok(true)`: the child's `memory`
/// folder holds its cgroup.
pub fn request_memory_cgroup(child: &str) -> Result<bool, JailError> {
    use std::io::{Read, Write};
    let Some(sock) = cgroup_requests() else {
        return Ok(false);
    };
    let (byte, slot) = match child {
        "tools" => (b't', 0),
        "mcp" => (b'm', 1),
        other => return Err(JailError::Policy(format!("no child cgroup {other:?}"))),
    };
    let io =
        |e: std::io::Error| JailError::Cgroup(format!("asking for the {child} memory cgroup: {e}"));
    let mut asker = sock.lock().unwrap_or_else(|p| p.into_inner());
    if asker.made[slot] {
        return Ok(true);
    }
    asker.sock.write_all(&[byte]).map_err(io)?;
    let mut answer = [0u8; 1];
    asker.sock.read_exact(&mut answer).map_err(io)?;
    match answer[0] {
        b'+' => {
            asker.made[slot] = true;
            Ok(true)
        }
        _ => Err(JailError::Cgroup(format!(
            "the supervisor could not make the {child} memory cgroup"
        ))),
    }
}
