//! Landlock rules: the whole (read-only) sandbox tree may be read and
//! executed; only `/work`, `/tmp`, `/dev/shm` and writable binds may be
//! written; device nodes under `/dev` and `/proc/self` files may be written
//! (file permissions still apply); the child cgroups' files under
//! `TOOL_CGROUP_IN_JAIL` may be written but nothing created there (file
//! permissions decide which: `cgroup.procs`, the agent's `freezer.state`).
//! Signals and abstract Unix sockets are
//! scoped to the sandbox's own domain (ABI 6+): the agent can still signal
//! its tools (same domain), pathname Unix sockets such as the gateway's are
//! not affected.

use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};

use crate::JailError;

/// The Landlock ABI the rules are written for; older kernels get a best-effort subset.
const TARGET_ABI: ABI = ABI::V7;

fn err(e: impl std::fmt::Display) -> JailError {
    JailError::Landlock(e.to_string())
}

fn rule(path: &Path, access: BitFlags<AccessFs>) -> Result<PathBeneath<PathFd>, JailError> {
    let fd =
        PathFd::new(path).map_err(|e| JailError::Landlock(format!("{}: {e}", path.display())))?;
    let access = if path.is_dir() {
        access
    } else {
        access & AccessFs::from_file(TARGET_ABI)
    };
    Ok(PathBeneath::new(fd, access))
}

/// Restrict the calling process (and everything it starts). With `required`,
/// a kernel without Landlock is an error.
pub(crate) fn restrict(
    writable: &[PathBuf],
    cgroup_dir: Option<&Path>,
    required: bool,
) -> Result<(), JailError> {
    let abi = TARGET_ABI;
    let read = AccessFs::from_read(abi);
    let device = read | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;
    let mut rules = vec![
        rule(Path::new("/"), read)?,
        rule(Path::new("/dev"), device)?,
        rule(
            Path::new("/proc"),
            read | AccessFs::WriteFile | AccessFs::Truncate,
        )?,
    ];
    for w in writable {
        rules.push(rule(w, AccessFs::from_all(abi))?);
    }
    if let Some(dir) = cgroup_dir {
        rules.push(rule(dir, read | AccessFs::WriteFile | AccessFs::Truncate)?);
    }
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?
        .scope(Scope::from_all(abi))
        .map_err(err)?
        .create()
        .map_err(err)?
        .add_rules(rules.into_iter().map(Ok::<_, landlock::RulesetError>))
        .map_err(err)?
        .restrict_self()
        .map_err(err)?;
    if required && status.ruleset == RulesetStatus::NotEnforced {
        return Err(JailError::Landlock("not enforced by this kernel".into()));
    }
    Ok(())
}
