//! Users inside the sandbox and the capabilities they keep.
//!
//! The sandbox's user namespace maps [`HOST_IDS_PER_SANDBOX`] ids (uid and
//! gid alike): `1000 → host_uid` (the agent, [`AGENT_UID`]), `1001 →
//! host_uid + 1` (its tools, [`TOOL_UID`]) and `1002 → host_uid + 2` (stdio
//! MCP servers, [`MCP_UID`]); the group 1000 is shared. Every other id,
//! host root included, is unmapped. The supervisor (host root, in the parent
//! namespace) writes the maps; no `newuidmap` is needed.
//!
//! The agent runs as 1000 with exactly `CAP_SETUID`, `CAP_SETGID` and
//! `CAP_KILL` (bounding set reduced to those three, `no_new_privs` set),
//! carried across its `execve` by the ambient set, so that it can start
//! tools as 1001 and MCP servers as 1002 and kill every process of a
//! timed-out tool. `CAP_KILL` counts in the sandbox's user namespace only:
//! it reaches the sandbox's own processes, never a host process. Those
//! capabilities only count inside its user namespace, which owns nothing
//! but itself: the mount, pid, net, ipc, uts and cgroup namespaces belong to
//! the host's user namespace, so not even the agent can mount, configure
//! the network or change the hostname there.
//!
//! **The agent must call [`crate::seal_agent`] first thing** (the `asbx agent`
//! glue does): it empties the ambient and inheritable sets, so the two
//! capabilities stay with the agent process but are lost by anything it
//! `exec`s. A tool started with `Command::uid(1001).gid(1000)` then has no
//! capability at all, cannot signal, trace or read the agent's `/proc`
//! entries, and cannot switch back. (`CAP_KILL` sits in the ambient set only
//! between init and the agent's first instruction, like the other two.)

use std::fs;

use nix::unistd::{Gid, Uid, setgroups, setresgid, setresuid};

use asbx_protocol::jail::{AGENT_GID, AGENT_UID, HOST_IDS_PER_SANDBOX};
#[cfg(doc)]
use asbx_protocol::jail::{MCP_UID, TOOL_UID};

use crate::JailError;
use crate::sys;

/// The capabilities the agent keeps.
pub(crate) const AGENT_CAPS: u64 =
    (1 << sys::CAP_SETUID) | (1 << sys::CAP_SETGID) | (1 << sys::CAP_KILL);

/// Write the uid and gid maps of the user namespace of `pid` (supervisor side).
pub(crate) fn write_maps(pid: libc::pid_t, host_uid: u32) -> Result<(), JailError> {
    let line = format!("{AGENT_UID} {host_uid} {HOST_IDS_PER_SANDBOX}\n");
    for file in ["uid_map", "gid_map"] {
        let path = format!("/proc/{pid}/{file}");
        fs::write(&path, &line).map_err(|e| JailError::Setup(format!("{path}: {e}")))?;
    }
    Ok(())
}

fn setup(what: &str, e: impl std::fmt::Display) -> JailError {
    JailError::Setup(format!("{what}: {e}"))
}

/// Become the agent user with only `AGENT_CAPS` (init side, right after the maps).
pub(crate) fn become_agent() -> Result<(), JailError> {
    setgroups(&[]).map_err(|e| setup("setgroups", e))?;
    let (g, u) = (Gid::from_raw(AGENT_GID), Uid::from_raw(AGENT_UID));
    nix::sys::prctl::set_keepcaps(true).map_err(|e| setup("keepcaps", e))?;
    setresgid(g, g, g).map_err(|e| setup("setresgid", e))?;
    setresuid(u, u, u).map_err(|e| setup("setresuid", e))?;
    nix::sys::prctl::set_keepcaps(false).map_err(|e| setup("keepcaps", e))?;
    sys::drop_bounding_except(AGENT_CAPS, sys::last_cap()).map_err(|e| setup("capbset", e))?;
    sys::capset(AGENT_CAPS, AGENT_CAPS, AGENT_CAPS).map_err(|e| setup("capset", e))?;
    for cap in [sys::CAP_SETUID, sys::CAP_SETGID, sys::CAP_KILL] {
        sys::ambient_raise(cap).map_err(|e| setup("ambient", e))?;
    }
    Ok(())
}
