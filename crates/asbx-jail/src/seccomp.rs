//! The seccomp filters every sandboxed process runs under (tools inherit them).
//!
//! Two programs, built by the supervisor before `clone` and installed by the
//! sandbox's init after set-up:
//!
//! 1. a hand-written prelude: wrong architecture kills the process, x32
//!    system-call numbers fail with `EPERM`, and `clone3` fails with `ENOSYS`
//!    (its flags live in memory a filter cannot read; glibc then falls back
//!    to `clone`, whose flags the second program checks);
//! 2. a deny list compiled with seccompiler: everything listed fails with
//!    `EPERM` (programs get a clear error instead of a kill), everything else
//!    is allowed.
//!
//! **Sockets are an allow-list** (answered `EPERM` by the filter, so no
//! protocol module is even loaded for a denied family):
//! - `AF_UNIX`: stream, datagram and seqpacket;
//! - `AF_INET`, `AF_INET6`: stream and datagram only, protocol 0, TCP or UDP
//!   (no raw, SCTP, DCCP, UDP-Lite, MPTCP, ...);
//! - `AF_NETLINK` with `NETLINK_ROUTE` only: `getifaddrs` (Node's
//!   `os.networkInterfaces`, `ip addr`) and glibc's `getaddrinfo` with
//!   `AI_ADDRCONFIG` read interfaces through it; in a network namespace the
//!   host's user namespace owns, it can read but change nothing.
//!
//! Every other family (`AF_ALG`, `AF_TIPC`, `AF_RDS`, `AF_SMC`, `AF_VSOCK`,
//! `AF_PACKET`, `AF_KEY`, Bluetooth, ...) fails with `EPERM`; `socketpair`
//! only for `AF_UNIX`. Terminal `ioctl`s that inject input or change the
//! line discipline (`TIOCSTI`, `TIOCLINUX`, `TIOCSETD`) fail with `EPERM`.
//!
//! Why a deny list for the other system calls rather than an allow-list:
//! tools are arbitrary programs (interpreters, compilers, package managers,
//! language runtimes that probe new calls), and an allow-list that misses a
//! call breaks them in ways that are hard to diagnose; the calls that reach
//! privileged kernel surface (namespaces, mounts, BPF, io_uring, keyrings,
//! modules, perf, ptrace) are denied by name, and socket families and
//! terminal ioctls, where the argument selects the attack surface, are
//! allow-listed by argument.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch, sock_filter,
};

use crate::JailError;

/// The two compiled programs, in installation order.
#[derive(Clone)]
pub(crate) struct Filters {
    pub(crate) prelude: BpfProgram,
    pub(crate) deny: BpfProgram,
}

fn err(e: impl std::fmt::Display) -> JailError {
    JailError::Seccomp(e.to_string())
}

/// Both programs for the running architecture, built once per process
/// (the same for every sandbox; a zygote builds them before it forks, so
/// its supervisors find them built).
pub(crate) fn build() -> Result<Filters, JailError> {
    static BUILT: std::sync::OnceLock<Result<Filters, String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| build_now().map_err(|e| e.to_string()))
        .clone()
        .map_err(JailError::Seccomp)
}

fn build_now() -> Result<Filters, JailError> {
    let arch: TargetArch = std::env::consts::ARCH.try_into().map_err(err)?;
    let filter = SeccompFilter::new(
        deny_rules()?,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(err)?;
    let deny: BpfProgram = filter.try_into().map_err(err)?;
    Ok(Filters {
        prelude: prelude(arch),
        deny,
    })
}

/// Install both programs on the calling thread. Needs `no_new_privs`.
pub(crate) fn install(filters: &Filters) -> Result<(), JailError> {
    seccompiler::apply_filter(&filters.prelude).map_err(err)?;
    seccompiler::apply_filter(&filters.deny).map_err(err)?;
    Ok(())
}

const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const AUDIT_ARCH_AARCH64: u32 = 0xC000_00B7;
const AUDIT_ARCH_RISCV64: u32 = 0xC000_00F3;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

fn stmt(code: u32, k: u32) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

fn prelude(arch: TargetArch) -> BpfProgram {
    use libc::{BPF_ABS, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W};
    let audit = match arch {
        TargetArch::x86_64 => AUDIT_ARCH_X86_64,
        TargetArch::aarch64 => AUDIT_ARCH_AARCH64,
        TargetArch::riscv64 => AUDIT_ARCH_RISCV64,
    };
    let ld = BPF_LD | BPF_W | BPF_ABS;
    let ret = BPF_RET;
    let errno = |e: i32| libc::SECCOMP_RET_ERRNO | (e as u32 & libc::SECCOMP_RET_DATA);
    // seccomp_data: nr at offset 0, arch at offset 4.
    vec![
        stmt(ld, 4),
        jump(BPF_JMP | BPF_JEQ | BPF_K, audit, 1, 0),
        stmt(ret, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(ld, 0),
        jump(BPF_JMP | BPF_JGE | BPF_K, X32_SYSCALL_BIT, 0, 1),
        stmt(ret, errno(libc::EPERM)),
        jump(BPF_JMP | BPF_JEQ | BPF_K, libc::SYS_clone3 as u32, 0, 1),
        stmt(ret, errno(libc::ENOSYS)),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
    ]
}

/// One rule per alternative: the syscall is denied if any rule matches.
fn when(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, JailError> {
    SeccompRule::new(conditions).map_err(err)
}

fn cond(arg: u8, len: Len, op: Op, value: u64) -> Result<SeccompCondition, JailError> {
    SeccompCondition::new(arg, len, op, value).map_err(err)
}

/// `CLONE_NEW*` flags a `clone` may not carry (`CLONE_NEWTIME` is clone3/unshare only
/// and overlaps the exit-signal byte of `clone`).
const CLONE_NEW_FLAGS: [libc::c_int; 7] = [
    libc::CLONE_NEWNS,
    libc::CLONE_NEWCGROUP,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
];

/// Personality flags that weaken the address space.
const BAD_PERSONALITY: [u64; 4] = [
    0x0040000, // ADDR_NO_RANDOMIZE
    0x0100000, // MMAP_PAGE_ZERO
    0x0200000, // ADDR_COMPAT_LAYOUT
    0x0400000, // READ_IMPLIES_EXEC
];

const AF_UNIX: u64 = libc::AF_UNIX as u64;
const AF_INET: u64 = libc::AF_INET as u64;
const AF_INET6: u64 = libc::AF_INET6 as u64;
const AF_NETLINK: u64 = libc::AF_NETLINK as u64;
const NETLINK_ROUTE: u64 = 0;
/// The socket type without `SOCK_NONBLOCK`/`SOCK_CLOEXEC`.
const SOCK_TYPE_MASK: u64 = 0xf;
const SOCK_STREAM: u64 = libc::SOCK_STREAM as u64;
const SOCK_DGRAM: u64 = libc::SOCK_DGRAM as u64;
const SOCK_SEQPACKET: u64 = libc::SOCK_SEQPACKET as u64;
const IPPROTO_TCP: u64 = libc::IPPROTO_TCP as u64;
const IPPROTO_UDP: u64 = libc::IPPROTO_UDP as u64;
const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541C;
const TIOCSETD: u64 = 0x5423;

/// Syscalls denied outright (no argument check).
fn always_denied() -> Vec<libc::c_long> {
    let mut v = vec![
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_pidfd_getfd,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_fsopen,
        libc::SYS_fsmount,
        libc::SYS_fsconfig,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_keyctl,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_acct,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_reboot,
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
        libc::SYS_clock_adjtime,
        libc::SYS_quotactl,
        libc::SYS_quotactl_fd,
        libc::SYS_vhangup,
        libc::SYS_chroot,
        libc::SYS_syslog,
        libc::SYS_fanotify_init,
        libc::SYS_sethostname,
        libc::SYS_setdomainname,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        libc::SYS_iopl,
        libc::SYS_ioperm,
        libc::SYS_lookup_dcookie,
        libc::SYS_uselib,
        libc::SYS_modify_ldt,
    ]);
    v
}

fn deny_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, JailError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in always_denied() {
        rules.insert(nr, Vec::new());
    }
    let clone_rules = CLONE_NEW_FLAGS
        .iter()
        .map(|f| {
            let f = *f as u64;
            when(vec![cond(0, Len::Qword, Op::MaskedEq(f), f)?])
        })
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_clone, clone_rules);
    rules.insert(libc::SYS_socket, socket_rules()?);
    rules.insert(
        libc::SYS_socketpair,
        vec![when(vec![cond(0, Len::Dword, Op::Ne, AF_UNIX)?])?],
    );
    rules.insert(
        libc::SYS_personality,
        BAD_PERSONALITY
            .iter()
            .map(|f| {
                when(vec![
                    cond(0, Len::Dword, Op::MaskedEq(*f), *f)?,
                    cond(0, Len::Dword, Op::Ne, 0xffff_ffff)?,
                ])
            })
            .collect::<Result<Vec<_>, _>>()?,
    );
    rules.insert(
        libc::SYS_ioctl,
        vec![
            when(vec![cond(1, Len::Dword, Op::Eq, TIOCSTI)?])?,
            when(vec![cond(1, Len::Dword, Op::Eq, TIOCLINUX)?])?,
            when(vec![cond(1, Len::Dword, Op::Eq, TIOCSETD)?])?,
        ],
    );
    Ok(rules)
}

/// Deny rules for `socket(family, type, protocol)`: the complement of the
/// allow-list in the module docs, one rule per denied alternative.
fn socket_rules() -> Result<Vec<SeccompRule>, JailError> {
    let family = |f: u64| cond(0, Len::Dword, Op::Eq, f);
    let not_family = |f: u64| cond(0, Len::Dword, Op::Ne, f);
    let kind = |t: u64| cond(1, Len::Dword, Op::MaskedEq(SOCK_TYPE_MASK), t);
    let not_proto = |p: u64| cond(2, Len::Dword, Op::Ne, p);
    let mut rules = vec![
        // Any family outside the allow-list.
        when(vec![
            not_family(AF_UNIX)?,
            not_family(AF_INET)?,
            not_family(AF_INET6)?,
            not_family(AF_NETLINK)?,
        ])?,
        // Netlink: routing only.
        when(vec![family(AF_NETLINK)?, not_proto(NETLINK_ROUTE)?])?,
    ];
    // No bitwise "not equal" in seccompiler: list the denied type values.
    for t in 0..=SOCK_TYPE_MASK {
        if t != SOCK_STREAM && t != SOCK_DGRAM && t != SOCK_SEQPACKET {
            rules.push(when(vec![family(AF_UNIX)?, kind(t)?])?);
        }
        if t != SOCK_STREAM && t != SOCK_DGRAM {
            for f in [AF_INET, AF_INET6] {
                rules.push(when(vec![family(f)?, kind(t)?])?);
            }
        }
    }
    for f in [AF_INET, AF_INET6] {
        rules.push(when(vec![
            family(f)?,
            not_proto(0)?,
            not_proto(IPPROTO_TCP)?,
            not_proto(IPPROTO_UDP)?,
        ])?);
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile() {
        let f = build().unwrap();
        assert!(f.prelude.len() > 5);
        assert!(f.deny.len() > always_denied().len());
    }
}
