//! `asbx jail --check`: probe each layer a profile needs on this host.
//!
//! Namespaces and `pivot_root` are probed for real in short-lived children
//! (a `clone` with the flag, a `pivot_root` in a private mount namespace);
//! seccomp by installing a filter in a child; Landlock by asking its ABI;
//! cgroups by looking for the controllers. Costs a few milliseconds.

use std::path::Path;

use nix::mount::{MsFlags, mount};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;

use asbx_protocol::jail::{JailProfile, Layer, LayerReport};

use crate::cgroup::{CGROUP_ROOT, Layout};
use crate::sys::{self, Forked};

/// Run `f` in a forked child (with namespace `flags`); true if it exits 0.
fn in_child(flags: libc::c_int, f: fn() -> bool) -> Result<bool, String> {
    match sys::clone_fork(flags).map_err(|e| e.to_string())? {
        Forked::Child => {
            let ok = std::panic::catch_unwind(f).unwrap_or(false);
            sys::exit_now(if ok { 0 } else { 1 })
        }
        Forked::Parent(pid) => match waitpid(Pid::from_raw(pid), None) {
            Ok(WaitStatus::Exited(_, 0)) => Ok(true),
            Ok(other) => Err(format!("probe ended with {other:?}")),
            Err(e) => Err(e.to_string()),
        },
    }
}

fn layer(name: &str, required: bool, result: Result<Option<String>, String>) -> Layer {
    match result {
        Ok(detail) => Layer {
            name: name.into(),
            available: true,
            required,
            detail,
        },
        Err(detail) => Layer {
            name: name.into(),
            available: false,
            required,
            detail: Some(detail),
        },
    }
}

fn probe_ns(flag: libc::c_int) -> Result<Option<String>, String> {
    in_child(flag, || true).map(|_| None)
}

fn pivot() -> bool {
    let tmp = Path::new("/tmp");
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .is_ok()
        && mount(
            Some("tmpfs"),
            tmp,
            Some("tmpfs"),
            MsFlags::empty(),
            Some("size=64k"),
        )
        .is_ok()
        && std::fs::create_dir(tmp.join("old")).is_ok()
        && nix::unistd::pivot_root(tmp, &tmp.join("old")).is_ok()
}

fn seccomp_probe() -> bool {
    nix::sys::prctl::set_no_new_privs().is_ok()
        && crate::seccomp::build().is_ok_and(|f| crate::seccomp::install(&f).is_ok())
}

/// Probe every layer `profile` needs (and the others, marked not required).
pub(crate) fn check(profile: JailProfile) -> LayerReport {
    let strict = matches!(profile, JailProfile::Strict);
    let mut layers = vec![layer(
        "root",
        true,
        if nix::unistd::geteuid().is_root() {
            Ok(None)
        } else {
            Err("the jail must run as root".into())
        },
    )];
    for (name, flag) in [
        ("user_namespace", libc::CLONE_NEWUSER),
        ("pid_namespace", libc::CLONE_NEWPID),
        ("mount_namespace", libc::CLONE_NEWNS),
        ("network_namespace", libc::CLONE_NEWNET),
        ("ipc_namespace", libc::CLONE_NEWIPC),
        ("uts_namespace", libc::CLONE_NEWUTS),
        ("cgroup_namespace", libc::CLONE_NEWCGROUP),
    ] {
        layers.push(layer(name, true, probe_ns(flag)));
    }
    layers.push(layer(
        "pivot_root",
        true,
        in_child(libc::CLONE_NEWNS, pivot).map(|_| None),
    ));
    layers.push(layer(
        "cgroups",
        strict,
        Layout::detect(Path::new(CGROUP_ROOT)).map(|l| {
            Some(match l {
                Layout::V1 { .. } => "v1: memory, pids, cpu".to_string(),
                Layout::V2 { .. } => "v2: memory, pids, cpu".to_string(),
            })
        }),
    ));
    layers.push(layer(
        "seccomp",
        true,
        in_child(0, seccomp_probe).map(|_| None),
    ));
    let abi = sys::landlock_abi();
    layers.push(layer(
        "landlock",
        strict,
        if abi >= 1 {
            Ok(Some(format!("abi {abi}")))
        } else {
            Err("Landlock is not enabled in this kernel".into())
        },
    ));
    LayerReport { layers }
}
