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
