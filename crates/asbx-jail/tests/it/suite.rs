//! The test cases: each one a real program or attack run inside a sandbox.

use std::io::{BufRead, BufReader, Read, Write};
use std::time::{Duration, Instant};

use asbx_protocol::jail::{BindMount, JailProfile};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::harness::{Case, Out, Outcome, Sbx, ensure, eventually, finish, marked_pids};

pub fn cases() -> Vec<Case> {
    vec![
        ("check_reports_every_layer", check_reports_every_layer),
        ("exit_codes_and_signals", exit_codes_and_signals),
        (
            "stdin_and_stdout_are_inherited",
            stdin_and_stdout_are_inherited,
        ),
        ("exact_environment", exact_environment),
        ("identity_and_hardening", identity_and_hardening),
        ("host_files_are_invisible", host_files_are_invisible),
        ("other_sandbox_is_invisible", other_sandbox_is_invisible),
        (
            "writes_outside_work_and_tmp_fail",
            writes_outside_work_and_tmp_fail,
        ),
        ("workdir_inputs_are_copied_in", workdir_inputs_are_copied_in),
        ("proc_shows_only_the_sandbox", proc_shows_only_the_sandbox),
        ("dangerous_syscalls_fail", dangerous_syscalls_fail),
        ("setuid_programs_gain_nothing", setuid_programs_gain_nothing),
        (
            "vsock_packet_and_raw_sockets_fail",
            vsock_packet_and_raw_sockets_fail,
        ),
        (
            "socket_families_are_an_allow_list",
            socket_families_are_an_allow_list,
        ),
        (
            "tty_line_discipline_and_injection_fail",
            tty_line_discipline_and_injection_fail,
        ),
        ("host_loopback_is_unreachable", host_loopback_is_unreachable),
        ("fork_bomb_is_contained", fork_bomb_is_contained),
        (
            "memory_bomb_is_oom_killed_inside",
            memory_bomb_is_oom_killed_inside,
        ),
        ("disk_fill_stops_at_the_cap", disk_fill_stops_at_the_cap),
        (
            "writable_folders_share_one_tmpfs_and_one_cap",
            writable_folders_share_one_tmpfs_and_one_cap,
        ),
        ("cpu_spin_is_throttled", cpu_spin_is_throttled),
        ("tool_cannot_attack_the_agent", tool_cannot_attack_the_agent),
        (
            "run_dir_bind_and_gateway_socket",
            run_dir_bind_and_gateway_socket,
        ),
        ("setup_failures_exec_nothing", setup_failures_exec_nothing),
        (
            "sigterm_to_supervisor_kills_everything",
            sigterm_to_supervisor_kills_everything,
        ),
        (
            "sigkill_to_supervisor_kills_everything",
            sigkill_to_supervisor_kills_everything,
        ),
        (
            "init_exits_with_main_and_kills_the_rest",
            init_exits_with_main_and_kills_the_rest,
        ),
        (
            "sigkill_of_the_parent_kills_the_sandbox",
            sigkill_of_the_parent_kills_the_sandbox,
        ),
        (
            "without_a_guard_the_caller_removes_the_cgroups",
            without_a_guard_the_caller_removes_the_cgroups,
        ),
        (
            "namespaces_profile_gets_rlimits",
            namespaces_profile_gets_rlimits,
        ),
        (
            "child_cgroups_join_but_nothing_else",
            child_cgroups_join_but_nothing_else,
        ),
        (
            "tool_memory_hog_dies_agent_survives",
            tool_memory_hog_dies_agent_survives,
        ),
        ("no_secrets_from_etc_or_proc", no_secrets_from_etc_or_proc),
        (
            "etc_is_one_read_only_folder_for_every_sandbox",
            etc_is_one_read_only_folder_for_every_sandbox,
        ),
        (
            "killpg_of_the_supervisor_removes_child_cgroups",
            killpg_of_the_supervisor_removes_child_cgroups,
        ),
        (
            "a_supervisor_killed_while_starting_leaves_no_cgroup",
            a_supervisor_killed_while_starting_leaves_no_cgroup,
        ),
        (
            "mountinfo_and_cgroup_show_no_host_path",
            mountinfo_and_cgroup_show_no_host_path,
        ),
        (
            "stale_cgroups_are_swept_and_live_ones_kept",
            stale_cgroups_are_swept_and_live_ones_kept,
        ),
        (
            "the_zygote_forks_supervisors_as_the_callers_children",
            the_zygote_forks_supervisors_as_the_callers_children,
        ),
        (
            "zygote_sandboxes_get_fresh_network_namespaces",
            zygote_sandboxes_get_fresh_network_namespaces,
        ),
        (
            "zygote_supervisors_report_the_end_on_their_socket",
            zygote_supervisors_report_the_end_on_their_socket,
        ),
        (
            "hostile_cgroup_requests_leave_the_supervisor_whole",
            hostile_cgroup_requests_leave_the_supervisor_whole,
        ),
        (
            "zygote_sandboxes_get_spare_cgroups_with_their_own_limits",
            zygote_sandboxes_get_spare_cgroups_with_their_own_limits,
        ),
    ]
}

type R = Result<Outcome, String>;

fn pass() -> R {
    Ok(Outcome::Pass)
}

/// What `asbx_jail::seal_agent` does, then start argv as the tool user:
/// the way the agent starts tools.
const AS_TOOL: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
pid = os.fork()
if pid == 0:
    os.setgid(1000)
    os.setuid(int(os.environ.get("AS_UID", "1001")))
    os.execv(sys.argv[1], sys.argv[1:])
_, st = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(st))
"#;

fn with_tool_helper(sbx: &Sbx) {
    std::fs::write(sbx.dir.path().join("as_tool.py"), AS_TOOL).unwrap();
}

fn check_reports_every_layer() -> R {
    let report = asbx_jail::check(JailProfile::Strict);
    let missing = report.missing();
    ensure(missing.is_empty(), format!("missing layers: {missing:?}"))?;
    ensure(report.layers.len() >= 11, format!("{report:?}"))?;
    pass()
}

fn exit_codes_and_signals() -> R {
    let out = Sbx::new("echo hi; echo err >&2; exit 7").run();
    ensure(
        out.code == 7 && out.stdout == "hi\n" && out.stderr == "err\n",
        format!("{out:?}"),
    )?;
    let out = Sbx::new("kill -KILL $$").run();
    ensure(out.code == 137, format!("SIGKILL: {out:?}"))?;
    let out = Sbx::new("kill -TERM $$").run();
    ensure(out.code == 143, format!("SIGTERM: {out:?}"))?;
    Sbx::new("true").run().ok()?;
    pass()
}

fn stdin_and_stdout_are_inherited() -> R {
    let out = Sbx::new("read -r l; echo \"got:$l\"")
        .run_with(Some(b"{\"bootstrap\":1}\n"), Duration::from_secs(30))
        .ok()?;
    ensure(out.stdout == "got:{\"bootstrap\":1}\n", format!("{out:?}"))?;
    pass()
}

fn exact_environment() -> R {
    let sbx = Sbx::argv(&["/usr/bin/env"]);
    let out = sbx.run().ok()?;
    // The one variable the jail adds, where the memory cgroups of the child
    // cgroups are made on request (cgroup v1): the request socket's number.
    let request = format!("{}=", asbx_protocol::jail::CGROUP_REQUEST_FD_ENV);
    let on_request = std::path::Path::new("/sys/fs/cgroup/freezer/cgroup.procs").exists();
    let mut got: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| {
            !(on_request
                && l.strip_prefix(&request)
                    .is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n > 2)))
        })
        .collect();
    ensure(
        !on_request || out.stdout.lines().any(|l| l.starts_with(&request)),
        format!("no {request}: {:?}", out.stdout),
    )?;
    got.sort();
    let mut want: Vec<String> = sbx
        .policy
        .env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    want.sort();
    ensure(got == want, format!("env {got:?} != {want:?}"))?;
    // A bare program name is looked up in the policy's PATH.
    Sbx::argv(&["true"]).run().ok()?;
    pass()
}

fn identity_and_hardening() -> R {
    let out = Sbx::new(
        "id -u; id -g; id -G; hostname; pwd; umask; \
         grep -E '^(NoNewPrivs|Seccomp|CapEff|CapBnd|CapAmb):' /proc/self/status",
    )
    .run()
    .ok()?;
    // CAP_SETUID, CAP_SETGID, CAP_KILL (the agent seals the ambient set itself).
    let want = "1000\n1000\n1000\nsandbox\n/work\n0002\nCapEff:\t00000000000000e0\n\
                CapBnd:\t00000000000000e0\nCapAmb:\t00000000000000e0\nNoNewPrivs:\t1\nSeccomp:\t2\n";
    ensure(out.stdout == want, format!("got {:?}", out.stdout))?;
    pass()
}

fn host_files_are_invisible() -> R {
    let secret = tempfile::Builder::new()
        .prefix(".tmp-asbx-secret")
        .tempdir()
        .unwrap();
    let file = secret.path().join("secret.txt");
    std::fs::write(&file, "ASBXHOSTSECRET42").unwrap();
    let script = format!(
        "cat {f} 2>/dev/null && echo LEAK; ls /.oldroot 2>/dev/null && echo LEAK; \
         cat /etc/shadow 2>/dev/null && echo LEAK; grep -rs --exclude-dir=proc --exclude-dir=dev --exclude-dir=usr ASBXHOSTSECRET42 / 2>/dev/null | head -1; \
         ls / | tr '\\n' ' '",
        f = file.display()
    );
    let out = Sbx::new(&script).run();
    ensure(
        !out.stdout.contains("LEAK") && !out.stdout.contains("ASBXHOSTSECRET42"),
        format!("{out:?}"),
    )?;
    let listed: Vec<&str> = out.stdout.split_whitespace().collect();
    for l in &listed {
        ensure(
            [
                "bin", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "proc", "run",
                "sbin", "tmp", "usr", "work",
            ]
            .contains(l),
            format!("unexpected /{l} in the sandbox root: {listed:?}"),
        )?;
    }
    pass()
}

fn other_sandbox_is_invisible() -> R {
    let b = Sbx::new("echo ready; exec sleep 60");
    std::fs::write(b.dir.path().join("b-secret"), "BSECRET").unwrap();
    let mut child = b.spawn(None);
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let script = format!(
        "ls {d} 2>/dev/null && echo LEAK; grep -rs --exclude-dir=proc --exclude-dir=dev --exclude-dir=usr BSECRET / 2>/dev/null | head -1; \
         ps -e 2>/dev/null | grep -c sleep; true",
        d = b.dir.path().display()
    );
    let out = Sbx::new(&script).run();
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    let b_out = finish(child, Duration::from_secs(30));
    ensure(line == "ready\n", format!("b: {line:?}"))?;
    ensure(b_out.code == 143, format!("b: {b_out:?}"))?;
    ensure(
        !out.stdout.contains("LEAK") && !out.stdout.contains("BSECRET"),
        format!("{out:?}"),
    )?;
    ensure(
        out.stdout.trim_end().ends_with('0'),
        format!("saw b's sleep: {out:?}"),
    )?;
    pass()
}

fn writes_outside_work_and_tmp_fail() -> R {
    let out = Sbx::new(
        "for p in /x /usr/x /usr/bin/x /etc/x /etc/passwd /bin/x /run/x /home/x /dev/x /proc/x \
                  /proc/sys/kernel/hostname /proc/sysrq-trigger; do \
           (echo x > $p) 2>/dev/null && echo \"WROTE $p\"; done; \
         echo a > /work/a && echo b > /tmp/b && echo c > /dev/shm/c && echo d > /dev/null && \
         mkdir -p /work/sub/dir && echo writable-ok",
    )
    .run()
    .ok()?;
    ensure(!out.stdout.contains("WROTE"), format!("{out:?}"))?;
    ensure(out.stdout.contains("writable-ok"), format!("{out:?}"))?;
    pass()
}

fn workdir_inputs_are_copied_in() -> R {
    let sbx = Sbx::new(
        "cat /work/input.txt; cat /work/sub/nested.txt; echo more >> /work/input.txt; \
         stat -c '%u:%g:%a' /work /work/input.txt; readlink /work/link; ls /work/fifo 2>&1 | grep -c 'No such'",
    );
    let d = sbx.dir.path();
    std::fs::write(d.join("input.txt"), "attachment\n").unwrap();
    std::fs::create_dir(d.join("sub")).unwrap();
    std::fs::write(d.join("sub/nested.txt"), "nested\n").unwrap();
    std::os::unix::fs::symlink("/etc/shadow", d.join("link")).unwrap();
    nix::unistd::mkfifo(
        &d.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let out = sbx.run().ok()?;
    ensure(
        out.stdout == "attachment\nnested\n1001:1000:2775\n1001:1000:664\n/etc/shadow\n1\n",
        format!("{out:?}"),
    )?;
    let host = std::fs::read_to_string(d.join("input.txt")).unwrap();
    ensure(host == "attachment\n", "the host workdir was modified")?;
    pass()
}

fn proc_shows_only_the_sandbox() -> R {
    let out = Sbx::new(
        "ls /proc | grep -cE '^[0-9]+$'; echo $$; tr -cd '{/' < /proc/1/cmdline | wc -c; \
         cat /proc/1/environ 2>/dev/null | wc -c; ls /proc/1/fd 2>/dev/null | wc -l; \
         (cat /proc/kcore | head -c1) 2>/dev/null | wc -c",
    )
    .run()
    .ok()?;
    let lines: Vec<i64> = out
        .stdout
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    // init, bash, ls, grep at most; bash is pid 2; init's cmdline is scrubbed,
    // its environment and descriptors are unreadable; kcore reads nothing.
    ensure(lines.len() == 6, format!("{out:?}"))?;
    ensure(lines[0] <= 5 && lines[1] == 2, format!("{out:?}"))?;
    ensure(
        lines[2] == 0 && lines[3] == 0 && lines[4] == 0 && lines[5] == 0,
        format!("{out:?}"),
    )?;
    let me = std::process::id();
    let out = Sbx::new(&format!("ls /proc/{me} 2>/dev/null && echo LEAK; true"))
        .run()
        .ok()?;
    ensure(!out.stdout.contains("LEAK"), format!("{out:?}"))?;
    pass()
}

const SYSCALLS: &str = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def t(name, r):
    if r == 0 and name.startswith("clone"):
        os._exit(0)
    print(name, r, ctypes.get_errno())
    ctypes.set_errno(0)
t("ptrace_attach", libc.ptrace(16, 1, 0, 0))
t("ptrace_traceme", libc.ptrace(0, 0, 0, 0))
t("mount", libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None))
t("umount", libc.umount2(b"/proc", 2))
t("unshare_user", libc.unshare(0x10000000))
t("unshare_mount", libc.unshare(0x00020000))
t("unshare_net", libc.unshare(0x40000000))
t("setns", libc.setns(0, 0))
t("clone_newuser", libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0))
t("clone_newpid", libc.syscall(56, 0x20000000 | 17, 0, 0, 0, 0))
t("bpf", libc.syscall(321, 0, 0, 0))
t("perf_event_open", libc.syscall(298, 0, 0, -1, -1, 0))
t("io_uring_setup", libc.syscall(425, 1, 0))
t("userfaultfd", libc.syscall(323, 0))
t("keyctl", libc.syscall(250, 0, 0, 0, 0))
t("add_key", libc.syscall(248, b"user", b"x", b"y", 1, -3))
t("process_vm_readv", libc.syscall(310, 1, 0, 0, 0, 0, 0))
t("open_by_handle_at", libc.syscall(304, 0, 0, 0))
t("personality", libc.personality(0x0040000))
t("chroot", libc.chroot(b"/tmp"))
t("init_module", libc.syscall(175, 0, 0, 0))
t("kexec_load", libc.syscall(246, 0, 0, 0, 0))
t("reboot", libc.syscall(169, 0, 0, 0, 0))
t("settimeofday", libc.syscall(164, 0, 0))
t("iopl", libc.syscall(172, 3))
t("acct", libc.syscall(163, 0))
t("swapoff", libc.syscall(168, b"/x"))
t("fsopen", libc.syscall(430, b"tmpfs", 0))
t("open_tree", libc.syscall(428, -100, b"/", 0))
t("x32_getpid", libc.syscall(0x40000000 + 39))
"#;

fn dangerous_syscalls_fail() -> R {
    let sbx = Sbx::argv(&["/usr/bin/python3", "/work/t.py"]);
    std::fs::write(sbx.dir.path().join("t.py"), SYSCALLS).unwrap();
    let out = sbx.run().ok()?;
    let mut n = 0;
    for line in out.stdout.lines() {
        n += 1;
        ensure(line.ends_with(" -1 1"), format!("not EPERM: {line}"))?;
    }
    ensure(n == 30, format!("{out:?}"))?;
    // clone3 must say ENOSYS so glibc falls back to clone; personality queries still work.
    let out = Sbx::argv(&[
        "/usr/bin/python3",
        "-c",
        "import ctypes; l = ctypes.CDLL(None, use_errno=True); \
         print(l.syscall(435, 0, 0), ctypes.get_errno(), l.personality(0xffffffff))",
    ])
    .run()
    .ok()?;
    ensure(out.stdout == "-1 38 0\n", format!("clone3: {out:?}"))?;
    // Threads and subprocesses still work through the glibc fallback.
    let out = Sbx::argv(&[
        "/usr/bin/python3",
        "-c",
        "import threading, subprocess; t = threading.Thread(target=print, args=('thread',)); \
         t.start(); t.join(); print(subprocess.run(['/bin/echo', 'child'], capture_output=True).stdout.decode().strip())",
    ])
    .run()
    .ok()?;
    ensure(out.stdout == "thread\nchild\n", format!("{out:?}"))?;
    pass()
}

fn setuid_programs_gain_nothing() -> R {
    let sbx = Sbx::new(
        "for p in /usr/bin/su /usr/bin/passwd /usr/bin/mount /usr/bin/newgrp /usr/bin/chsh /usr/bin/sudo; do \
           [ -x $p ] || continue; \
           out=$($p </dev/null 2>&1; id -u); echo \"$p -> $(echo \"$out\" | tail -1)\"; done; \
         mount -t tmpfs x /tmp 2>/dev/null && echo MOUNTED; \
         python3 /work/as_tool.py /bin/grep -E '^(Uid|Gid|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status",
    );
    with_tool_helper(&sbx);
    let out = sbx.run().ok()?;
    ensure(!out.stdout.contains("MOUNTED"), format!("{out:?}"))?;
    for l in out.stdout.lines().filter(|l| l.contains("->")) {
        ensure(
            l.ends_with("-> 1000"),
            format!("setuid program changed ids: {l}"),
        )?;
    }
    let want = "Uid:\t1001\t1001\t1001\t1001\nGid:\t1000\t1000\t1000\t1000\n\
                CapInh:\t00000000000000e0\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n\
                CapBnd:\t00000000000000e0\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n";
    ensure(
        out.stdout.ends_with(want),
        format!("tool status: {:?}", out.stdout),
    )?;
    pass()
}

fn vsock_packet_and_raw_sockets_fail() -> R {
    let out = Sbx::argv(&[
        "/usr/bin/python3",
        "-c",
        "import socket\n\
         for name, fam, typ, proto in [('vsock', 40, 1, 0), ('vsock_dgram', 40, 2, 0), ('packet', 17, 3, 0), \
           ('packet_dgram', 17, 2, 0), ('raw4', 2, 3, 1), ('raw6', 10, 3, 58), ('raw_unix', 1, 3, 0)]:\n\
         \ttry:\n\t\tsocket.socket(fam, typ, proto); print(name, 'OPEN')\n\
         \texcept OSError as e:\n\t\tprint(name, e.errno)\n\
         print(open('/proc/net/dev').read().count(':'))",
    ])
    .run()
    .ok()?;
    let want = "vsock 1\nvsock_dgram 1\npacket 1\npacket_dgram 1\nraw4 1\nraw6 1\nraw_unix 1\n1\n";
    ensure(out.stdout == want, format!("{out:?}"))?;
    pass()
}

/// Every socket family, type and protocol outside the allow-list fails
/// with `EPERM` from the filter (not `EAFNOSUPPORT` from a kernel that
/// happens to lack the module); the allowed ones (positive control) open.
fn socket_families_are_an_allow_list() -> R {
    const PROBE: &str = r#"
import socket
F = 0x80000 | 0x800  # SOCK_CLOEXEC | SOCK_NONBLOCK
cases = [
    ("alg", 38, 5, 0), ("tipc", 30, 4, 0), ("tipc_stream", 30, 1, 0), ("rds", 21, 5, 0),
    ("smc", 43, 1, 0), ("key", 15, 3, 2), ("bluetooth", 31, 3, 1), ("can", 29, 3, 1),
    ("vsock", 40, 1, 0), ("packet", 17, 3, 0), ("appletalk", 5, 2, 0), ("x25", 9, 5, 0),
    ("dccp", 2, 6, 33), ("dccp6", 10, 6, 33), ("sctp", 2, 1, 132), ("sctp_seq", 2, 5, 132),
    ("sctp6", 10, 1, 132), ("udplite", 2, 2, 136), ("mptcp", 2, 1, 262), ("raw4", 2, 3, 1),
    ("raw4_flags", 2, 3 | F, 255), ("inet_rdm", 2, 4, 0), ("inet_seqpacket", 2, 5, 0),
    ("unix_raw", 1, 3, 0), ("unix_rdm", 1, 4, 0), ("netlink_audit", 16, 3, 9),
    ("netlink_uevent", 16, 2, 15), ("netlink_netfilter", 16, 3, 12), ("netlink_generic", 16, 3, 16),
    ("netlink_xfrm", 16, 3, 6),
    # allowed
    ("ok_unix_stream", 1, 1, 0), ("ok_unix_dgram", 1, 2, 0), ("ok_unix_seqpacket", 1, 5, 0),
    ("ok_tcp", 2, 1, 0), ("ok_tcp_explicit", 2, 1, 6), ("ok_tcp_flags", 2, 1 | F, 0),
    ("ok_udp", 2, 2, 0), ("ok_udp_explicit", 2, 2, 17), ("ok_tcp6", 10, 1, 0),
    ("ok_udp6", 10, 2 | F, 17), ("ok_netlink_route", 16, 3, 0), ("ok_netlink_route_dgram", 16, 2, 0),
]
for name, fam, typ, proto in cases:
    try:
        socket.socket(fam, typ, proto).close(); print(name, "OPEN")
    except OSError as e:
        print(name, e.errno)
for name, fam in [("pair_inet", 2), ("pair_tipc", 30)]:
    try:
        socket.socketpair(fam, 1, 0); print(name, "OPEN")
    except OSError as e:
        print(name, e.errno)
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
a.sendall(b"pair-ok"); print(b.recv(7).decode())
"#;
    let out = Sbx::argv(&["/usr/bin/python3", "-c", PROBE]).run().ok()?;
    let mut seen = 0;
    for line in out.stdout.lines() {
        let Some((name, result)) = line.split_once(' ') else {
            continue;
        };
        seen += 1;
        let want = if name.starts_with("ok_") { "OPEN" } else { "1" };
        ensure(
            result == want,
            format!("{name}: {result}, want {want}\n{}", out.stdout),
        )?;
    }
    ensure(seen == 44, format!("{seen} results: {out:?}"))?;
    ensure(out.stdout.ends_with("pair-ok\n"), format!("{out:?}"))?;
    pass()
}

/// A tool with a terminal can't change its line discipline (`TIOCSETD`,
/// the way into old line-discipline bugs) or inject input (`TIOCSTI`);
/// reading the discipline and the window size (positive control) works.
fn tty_line_discipline_and_injection_fail() -> R {
    const PROBE: &str = r#"
import fcntl, os, struct
m, s = os.openpty()
def t(name, fd, req, arg):
    try:
        fcntl.ioctl(fd, req, arg); print(name, "OK")
    except OSError as e:
        print(name, e.errno)
t("getd", s, 0x5424, struct.pack("i", 0))      # TIOCGETD
t("winsz", s, 0x5413, b"\0" * 8)              # TIOCGWINSZ
t("setd_n_tty", s, 0x5423, struct.pack("i", 0)) # TIOCSETD N_TTY
t("setd_slip", s, 0x5423, struct.pack("i", 1))  # TIOCSETD N_SLIP
t("setd_master", m, 0x5423, struct.pack("i", 0))
t("sti", s, 0x5412, b"x")                       # TIOCSTI
t("linux", s, 0x541C, b"\x0b")                 # TIOCLINUX
"#;
    let out = Sbx::argv(&["/usr/bin/python3", "-c", PROBE]).run().ok()?;
    let want = "getd OK\nwinsz OK\nsetd_n_tty 1\nsetd_slip 1\nsetd_master 1\nsti 1\nlinux 1\n";
    ensure(out.stdout == want, format!("{out:?}"))?;
    pass()
}

fn host_loopback_is_unreachable() -> R {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let sbx = Sbx::new(&format!(
        "(echo x > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo CONNECTED; \
         python3 -c \"\nimport socket, threading\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n\
c = socket.create_connection(s.getsockname()); a, _ = s.accept(); c.sendall(b'lo-ok'); print(a.recv(5).decode())\""
    ));
    let out = sbx.run().ok()?;
    ensure(!out.stdout.contains("CONNECTED"), format!("{out:?}"))?;
    ensure(
        out.stdout.contains("lo-ok"),
        format!("loopback inside: {out:?}"),
    )?;
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => pass(),
        other => Err(format!("host listener got a connection: {other:?}")),
    }
}

fn fork_bomb_is_contained() -> R {
    let mut sbx = Sbx::argv(&[
        "/usr/bin/python3",
        "-c",
        "import os, time\nn = 0\ntry:\n\twhile True:\n\t\tif os.fork() == 0:\n\t\t\ttime.sleep(60); os._exit(0)\n\t\tn += 1\n\
         except OSError as e:\n\tprint(n, e.errno)",
    ]);
    sbx.policy.limits.pids = Some(32);
    let out = sbx.run_with(None, Duration::from_secs(60)).ok()?;
    let parts: Vec<i64> = out
        .stdout
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect();
    ensure(
        parts.len() == 2 && parts[0] < 32 && parts[1] == 11,
        format!("{out:?}"),
    )?;
    ensure(
        eventually(Duration::from_secs(10), || {
            marked_pids(&sbx.marker).is_empty()
        }),
        "sleepers survived",
    )?;
    // A classic shell bomb, while the host keeps working.
    let mut bomb = Sbx::new("b() { b | b & }; b 2>/dev/null; sleep 2; echo survived");
    bomb.policy.limits.pids = Some(64);
    let t = Instant::now();
    let out = bomb.run_with(None, Duration::from_secs(60));
    ensure(out.stdout.contains("survived"), format!("{out:?}"))?;
    ensure(t.elapsed() < Duration::from_secs(50), "bomb took too long")?;
    ensure(
        std::process::Command::new("/bin/true").status().is_ok(),
        "host cannot fork",
    )?;
    ensure(
        eventually(Duration::from_secs(10), || {
            marked_pids(&bomb.marker).is_empty()
        }),
        "bomb survived",
    )?;
    pass()
}

fn memory_bomb_is_oom_killed_inside() -> R {
    let mut sbx =
        Sbx::new("python3 -c 'b = bytearray(512 << 20); print(\"ALLOCATED\")'; echo rc=$?");
    sbx.policy.limits.memory_bytes = Some(64 << 20);
    let out = sbx.run().ok()?;
    ensure(out.stdout == "rc=137\n", format!("{out:?}"))?;
    pass()
}

fn disk_fill_stops_at_the_cap() -> R {
    let mut sbx = Sbx::new(
        "for d in /work /tmp; do dd if=/dev/zero of=$d/fill bs=1M count=64 2>/dev/null && echo \"$d UNCAPPED\"; \
           echo \"$d $(du -k $d/fill | cut -f1)\"; done",
    );
    sbx.policy.limits.disk_bytes = Some(8 << 20);
    let out = sbx.run().ok()?;
    ensure(!out.stdout.contains("UNCAPPED"), format!("{out:?}"))?;
    for l in out.stdout.lines() {
        let kb: u64 = l
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(u64::MAX);
        ensure(kb <= 8192, format!("over the cap: {l}"))?;
    }
    pass()
}

/// `/work`, `/tmp`, `/dev/shm` and `/dev` are folders of the root's tmpfs:
/// three file systems in all (the root, `/proc`, `/dev/pts`), each a
/// superblock the kernel keeps per-cgroup state for. The cap bounds the
/// three writable folders together, `/dev` still opens its device nodes but
/// takes no new file, and the root's mount is read-only: nothing written
/// to `/tmp` can be linked, moved or remounted into it.
fn writable_folders_share_one_tmpfs_and_one_cap() -> R {
    let mut sbx = Sbx::new(
        "stat -c '%n %d' / /dev /work /tmp /dev/shm /proc /dev/pts; \
         awk '$5 == \"/\" { split($6, o, \",\"); print \"root mount \" o[1] }' /proc/self/mountinfo; \
         dd if=/dev/zero of=/work/a bs=1M count=6 2>/dev/null && echo work-ok; \
         dd if=/dev/zero of=/tmp/b bs=1M count=6 2>/dev/null || echo tmp-full; \
         echo x 2>/dev/null > /dev/shm/c || echo shm-full; \
         head -c 4 /dev/zero | od -An -tx1 | tr -d ' \n'; echo; \
         touch /dev/x 2>/dev/null || echo dev-ro; \
         rm -f /tmp/b; mkdir /tmp/d; \
         ln /work/a /home/a 2>/dev/null && echo LINKED; \
         mv /tmp/d /run/d 2>/dev/null && echo MOVED; \
         mount -o remount,rw / 2>/dev/null && echo REMOUNTED; \
         touch /x /run/x /home/x 2>/dev/null && echo WROTE; \
         test -e /home/a || test -e /run/d || echo root-untouched",
    );
    sbx.policy.limits.disk_bytes = Some(8 << 20);
    let out = sbx.run().ok()?;
    let dev: std::collections::BTreeMap<&str, &str> = out
        .stdout
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(n, _)| n.starts_with('/'))
        .collect();
    let get = |n: &str| dev.get(n).copied().unwrap_or("?");
    ensure(dev.len() == 7, format!("{out:?}"))?;
    ensure(
        ["/dev", "/work", "/tmp", "/dev/shm"]
            .iter()
            .all(|n| get(n) == get("/")),
        format!("one tmpfs: {dev:?}"),
    )?;
    let distinct: std::collections::BTreeSet<&str> = dev.values().copied().collect();
    ensure(distinct.len() == 3, format!("three file systems: {dev:?}"))?;
    for want in [
        "root mount ro",
        "work-ok",
        "tmp-full",
        "shm-full",
        "00000000",
        "dev-ro",
        "root-untouched",
    ] {
        ensure(
            out.stdout.lines().any(|l| l == want),
            format!("{want}: {out:?}"),
        )?;
    }
    for bad in ["LINKED", "MOVED", "REMOUNTED", "WROTE"] {
        ensure(!out.stdout.contains(bad), format!("{bad}: {out:?}"))?;
    }
    pass()
}

fn cpu_spin_is_throttled() -> R {
    let mut spin = Sbx::new("echo spinning; timeout 4 bash -c 'while :; do :; done'; echo done");
    spin.policy.limits.cpu_percent = Some(20);
    let mut child = spin.spawn(None);
    let mut line = String::new();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    reader.read_line(&mut line).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let stat = std::fs::read_to_string(spin.cgroup_dirs()[2].join("cpu.stat")).unwrap_or_default();
    // Another sandbox still gets its work done meanwhile.
    let other = Sbx::new("echo other-ok").run_with(None, Duration::from_secs(30));
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    let _ = child.wait();
    let throttled: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("nr_throttled "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    ensure(throttled > 0, format!("cpu.stat: {stat}"))?;
    ensure(other.stdout == "other-ok\n", format!("{other:?}"))?;
    ensure(rest == "done\n", format!("{rest:?}"))?;
    pass()
}

fn tool_cannot_attack_the_agent() -> R {
    let sbx =
        Sbx::new("python3 /work/as_tool.py /usr/bin/python3 /work/attack.py $$; echo agent-alive");
    with_tool_helper(&sbx);
    std::fs::write(
        sbx.dir.path().join("attack.py"),
        r#"
import os, signal, sys
pid = int(sys.argv[1])
def attempt(name, f):
    try:
        f(); print(name, "ALLOWED")
    except OSError as e:
        print(name, "denied")
attempt("fd1", lambda: open(f"/proc/{pid}/fd/1", "w").write("INJECTED\n"))
attempt("fd_list", lambda: os.listdir(f"/proc/{pid}/fd"))
attempt("environ", lambda: open(f"/proc/{pid}/environ").read())
attempt("mem", lambda: open(f"/proc/{pid}/mem", "rb").read(1))
attempt("kill", lambda: os.kill(pid, signal.SIGTERM))
attempt("kill_init", lambda: os.kill(1, signal.SIGKILL))
attempt("setuid", lambda: os.setuid(1000))
attempt("setgroups", lambda: os.setgroups([0]))
"#,
    )
    .unwrap();
    let out = sbx.run().ok()?;
    ensure(
        !out.stdout.contains("ALLOWED") && !out.stdout.contains("INJECTED"),
        format!("{out:?}"),
    )?;
    ensure(
        out.stdout.matches("denied").count() == 8,
        format!("{out:?}"),
    )?;
    ensure(out.stdout.ends_with("agent-alive\n"), format!("{out:?}"))?;
    pass()
}

fn run_dir_bind_and_gateway_socket() -> R {
    use std::os::unix::fs::PermissionsExt;
    let run = tempfile::Builder::new()
        .prefix(".tmp-asbx-run")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(run.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = run.path().join("gateway.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::fs::create_dir(run.path().join("bin")).unwrap();
    std::fs::write(
        run.path().join("bin/hello"),
        "#!/bin/sh\necho hello-from-bind\n",
    )
    .unwrap();
    std::fs::set_permissions(
        run.path().join("bin/hello"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).unwrap();
        s.write_all(b"pong").unwrap();
    });
    let mut sbx = Sbx::new(
        "/run/asbx/bin/hello; touch /run/asbx/x 2>/dev/null && echo WROTE; \
         python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('/run/asbx/gateway.sock'); \
s.sendall(b'ping'); print(s.recv(4).decode())\"",
    );
    sbx.policy.binds.push(BindMount {
        source: run.path().to_string_lossy().into_owned(),
        target: "/run/asbx".into(),
        writable: false,
    });
    let out = sbx.run().ok()?;
    server.join().map_err(|_| "socket server failed")?;
    ensure(out.stdout == "hello-from-bind\npong\n", format!("{out:?}"))?;
    pass()
}

fn setup_failures_exec_nothing() -> R {
    let out = Sbx::argv(&["/nonexistent/prog"]).run();
    ensure(
        out.code == 125 && out.stderr.contains("exec /nonexistent/prog"),
        format!("{out:?}"),
    )?;
    let mut sbx = Sbx::new("echo EXECUTED");
    sbx.policy.binds.push(BindMount {
        source: "/etc/hostname".into(),
        target: "/usr/asbx-does-not-exist".into(),
        writable: false,
    });
    let out = sbx.run();
    ensure(
        out.code == 125 && !out.stdout.contains("EXECUTED"),
        format!("{out:?}"),
    )?;
    ensure(
        sbx.cgroup_dirs().iter().all(|d| !d.exists()),
        "cgroup left after failure",
    )?;
    let mut sbx = Sbx::new("echo EXECUTED");
    sbx.policy.cgroup = "../escape".into();
    let out = sbx.run();
    ensure(
        out.code == 125 && !out.stdout.contains("EXECUTED"),
        format!("{out:?}"),
    )?;
    let mut sbx = Sbx::new("echo EXECUTED");
    sbx.policy.host_uid = 0;
    let out = sbx.run();
    ensure(
        out.code == 125 && !out.stdout.contains("EXECUTED"),
        format!("{out:?}"),
    )?;
    pass()
}

fn kill_supervisor(sig: Signal, want: i32) -> R {
    let sbx = Sbx::new("sleep 300 & sleep 301 & echo ready; wait");
    let mut child = sbx.spawn(None);
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    // A process in the middle of execve can be missing from one look at
    // /proc/*/environ: look until all three are seen.
    let seen = if eventually(Duration::from_secs(10), || {
        marked_pids(&sbx.marker).len() >= 3
    }) {
        3
    } else {
        marked_pids(&sbx.marker).len()
    };
    let created = sbx.cgroup_dirs().iter().all(|d| d.exists());
    kill(Pid::from_raw(child.id() as i32), sig).unwrap();
    let out = finish(child, Duration::from_secs(30));
    ensure(line == "ready\n", format!("{line:?}"))?;
    ensure(seen >= 3, "sandbox processes not found on the host")?;
    ensure(created, "cgroups not created")?;
    ensure(out.code == want, format!("{out:?}"))?;
    ensure(
        eventually(Duration::from_secs(10), || {
            marked_pids(&sbx.marker).is_empty()
        }),
        format!("processes left: {:?}", marked_pids(&sbx.marker)),
    )?;
    ensure(
        eventually(Duration::from_secs(10), || {
            sbx.cgroup_dirs().iter().all(|d| !d.exists())
        }),
        "cgroups left",
    )?;
    pass()
}

fn sigterm_to_supervisor_kills_everything() -> R {
    kill_supervisor(Signal::SIGTERM, 143)?;
    kill_supervisor(Signal::SIGINT, 130)
}

fn sigkill_to_supervisor_kills_everything() -> R {
    kill_supervisor(Signal::SIGKILL, 137)
}

fn init_exits_with_main_and_kills_the_rest() -> R {
    let sbx = Sbx::new("(trap '' TERM HUP; exec sleep 300) & setsid sleep 301 & exit 3");
    let t = Instant::now();
    let out = sbx.run();
    ensure(out.code == 3, format!("{out:?}"))?;
    ensure(
        t.elapsed() < Duration::from_secs(30),
        "waited for background processes",
    )?;
    ensure(
        eventually(Duration::from_secs(5), || {
            marked_pids(&sbx.marker).is_empty()
        }),
        "background processes survived",
    )?;
    pass()
}

/// `guard: false` (the runner's jails): after a clean end (exit 0) the
/// supervisor exits once init is reaped and leaves the cgroups, empty, to
/// its caller, which removes them (`asbx_jail::remove_cgroups`); after any
/// other end, or when the parent died (no one else would), the supervisor
/// still removes them.
fn without_a_guard_the_caller_removes_the_cgroups() -> R {
    let mut sbx = Sbx::new("sleep 300 & exit 0");
    sbx.policy.guard = false;
    if sbx.cgroup_dirs().is_empty() {
        return Ok(Outcome::Skip("no cgroup v1 hierarchies".into()));
    }
    let out = sbx.run();
    ensure(out.code == 0, format!("{out:?}"))?;
    let dirs = sbx.cgroup_dirs();
    ensure(
        dirs.iter().all(|d| d.exists()),
        format!("the supervisor removed the cgroups itself: {dirs:?}"),
    )?;
    let members: String = dirs
        .iter()
        .map(|d| std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default())
        .collect();
    ensure(
        members.trim().is_empty(),
        format!("processes left in the cgroups: {members}"),
    )?;
    asbx_jail::remove_cgroups(&sbx.policy.cgroup).map_err(|e| e.to_string())?;
    ensure(
        sbx.cgroup_dirs().iter().all(|d| !d.exists()),
        "remove_cgroups left a cgroup",
    )?;

    let mut sbx = Sbx::new("sleep 300 & exit 3");
    sbx.policy.guard = false;
    let out = sbx.run();
    ensure(out.code == 3, format!("{out:?}"))?;
    ensure(
        sbx.cgroup_dirs().iter().all(|d| !d.exists()),
        "after exit 3 the supervisor left the cgroups",
    )?;

    let mut sbx = Sbx::new("sleep 300 & sleep 301 & echo ready; wait");
    sbx.policy.guard = false;
    let mut parent = sbx.spawn_via_parent();
    let mut line = String::new();
    BufReader::new(parent.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let created = sbx.cgroup_dirs().iter().all(|d| d.exists());
    kill(Pid::from_raw(parent.id() as i32), Signal::SIGKILL).unwrap();
    let _ = parent.wait();
    ensure(line == "ready\n" && created, format!("{line:?} {created}"))?;
    ensure(
        eventually(Duration::from_secs(5), || {
            marked_pids(&sbx.marker).is_empty() && sbx.cgroup_dirs().iter().all(|d| !d.exists())
        }),
        format!(
            "after the parent's SIGKILL: {:?} {:?}",
            marked_pids(&sbx.marker),
            sbx.cgroup_dirs()
        ),
    )?;
    pass()
}

/// The runner (here a stand-in parent) is SIGKILLed while its sandbox runs:
/// within 5 s the supervisor, its guard, init, the main process and its
/// background processes are gone and the cgroups removed (docs/protocol.md §8).
fn sigkill_of_the_parent_kills_the_sandbox() -> R {
    let sbx = Sbx::new("sleep 300 & sleep 301 & echo ready; wait");
    let mut parent = sbx.spawn_via_parent();
    let mut line = String::new();
    BufReader::new(parent.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    // Positive control: everything is there before the kill.
    let seen = eventually(Duration::from_secs(10), || {
        marked_pids(&sbx.marker).len() >= 3
    });
    let supervisors = sbx.supervisor_pids();
    let created = sbx.cgroup_dirs().iter().all(|d| d.exists());
    kill(Pid::from_raw(parent.id() as i32), Signal::SIGKILL).unwrap();
    let _ = parent.wait();
    ensure(line == "ready\n", format!("{line:?}"))?;
    ensure(seen, "sandbox processes not found on the host")?;
    ensure(
        supervisors.len() >= 3,
        format!("parent, supervisor, guard: {supervisors:?}"),
    )?;
    ensure(created, "cgroups not created")?;
    let t = Instant::now();
    let gone = eventually(Duration::from_secs(5), || {
        marked_pids(&sbx.marker).is_empty()
            && sbx.supervisor_pids().is_empty()
            && sbx.cgroup_dirs().iter().all(|d| !d.exists())
    });
    ensure(
        gone,
        format!(
            "5 s after the parent died: sandbox {:?}, supervisor {:?}, cgroups {:?}",
            marked_pids(&sbx.marker),
            sbx.supervisor_pids(),
            sbx.cgroup_dirs()
                .iter()
                .filter(|d| d.exists())
                .collect::<Vec<_>>()
        ),
    )?;
    println!(
        "    sandbox gone {} ms after its parent",
        t.elapsed().as_millis()
    );
    pass()
}

/// The `namespaces` profile has no cgroups: its sandbox limits become
/// rlimits. A memory hog and a process flood hit them; a modest allocation
/// and a few processes (positive controls) still work; `strict` sets none.
fn namespaces_profile_gets_rlimits() -> R {
    const PROBE: &str = r#"
import os, resource, subprocess
print("nproc", resource.getrlimit(resource.RLIMIT_NPROC)[0])
print("data", resource.getrlimit(resource.RLIMIT_DATA)[0])
print("fsize", resource.getrlimit(resource.RLIMIT_FSIZE)[0])
small = bytearray(8 << 20)
print("small_alloc ok")
try:
    big = bytearray(200 << 20)
    print("big_alloc ALLOWED")
except MemoryError:
    print("big_alloc denied")
procs, failed = [], 0
for _ in range(60):
    try:
        procs.append(subprocess.Popen(["sleep", "5"]))
    except OSError:
        failed += 1
print("spawned", len(procs), "failed", failed)
for p in procs:
    p.kill(); p.wait()
import signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
try:
    with open("/tmp/big", "wb") as f:
        f.write(b"x" * (2 << 20))
    print("big_file ALLOWED")
except OSError as e:
    print("big_file denied", e.errno)
"#;
    let mut sbx = Sbx::argv(&["/usr/bin/python3", "-c", PROBE]);
    sbx.policy.profile = JailProfile::Namespaces;
    sbx.policy.limits.memory_bytes = Some(96 << 20);
    sbx.policy.limits.pids = Some(24);
    sbx.policy.limits.disk_bytes = Some(1 << 20);
    let out = sbx.run().ok()?;
    let o = &out.stdout;
    ensure(o.contains("nproc 24\n"), o.clone())?;
    ensure(o.contains(&format!("data {}\n", 96u64 << 20)), o.clone())?;
    ensure(o.contains(&format!("fsize {}\n", 1u64 << 20)), o.clone())?;
    ensure(o.contains("small_alloc ok"), o.clone())?;
    ensure(o.contains("big_alloc denied"), o.clone())?;
    ensure(o.contains("big_file denied 27"), o.clone())?; // EFBIG
    let spawned: u32 = o
        .lines()
        .find_map(|l| l.strip_prefix("spawned "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    ensure(
        (5..24).contains(&spawned),
        format!("processes spawned under nproc 24: {spawned}: {o}"),
    )?;
    // The strict profile bounds with cgroups, not with these rlimits.
    let strict = Sbx::argv(&[
        "/usr/bin/python3",
        "-c",
        "import resource; print(resource.getrlimit(resource.RLIMIT_DATA)[0])",
    ]);
    let out = strict.run().ok()?;
    ensure(
        out.stdout.trim() == "-1",
        format!("strict data rlimit {out:?}"),
    )?;
    pass()
}

/// The `tools` and `mcp` child cgroups (v1 with a freezer hierarchy): their
/// memory cgroups are absent until the main process asks for them (twice
/// for `tools`: answered at once; an unknown child is refused); a tool
/// (uid 1001) joins `tools` by writing `0`, and an MCP server (uid 1002)
/// joins `mcp`; neither can join the other's child (issue 26, item 4: a
/// tool in `mcp` would be out of its reaper's reach), change a limit,
/// create a cgroup, reach the sandbox's own cgroup or freeze; the agent
/// joins neither, and (positive control) can freeze.
fn child_cgroups_join_but_nothing_else() -> R {
    if !std::path::Path::new("/sys/fs/cgroup/freezer/cgroup.procs").exists() {
        return Ok(Outcome::Skip(
            "no cgroup v1 freezer hierarchy: the jail makes no child cgroups".into(),
        ));
    }
    const SCRIPT: &str = r#"
C=/run/asbx-cgroup
try() { if ( eval "$2" ) 2>/dev/null; then echo "$1=ALLOWED"; else echo "$1=denied"; fi; }
echo children=$(ls $C | tr '\n' ' ') controllers=$(ls $C/tools | tr '\n' ' ')
echo memory_before=$(ls $C/tools/memory $C/mcp/memory | grep -c cgroup.procs)
ask() { printf %s "$1" >&$ASBX_CGROUP_REQUEST_FD && IFS= read -r -n1 -u $ASBX_CGROUP_REQUEST_FD a && echo "ask_$1=$a"; }
ask t; ask t; ask m; ask x
cat $C/tools/memory/memory.limit_in_bytes $C/tools/memory/memory.memsw.limit_in_bytes $C/mcp/pids/pids.max
python3 /work/as_tool.py /bin/bash -c '
try() { if ( eval "$2" ) 2>/dev/null; then echo "$1=ALLOWED"; else echo "$1=denied"; fi; }
C=/run/asbx-cgroup
for c in memory pids freezer; do echo 0 > $C/tools/$c/cgroup.procs && echo join_$c=ok; done
echo cgroups=$(grep -E ":(memory|pids|freezer):" /proc/self/cgroup | cut -d: -f3 | sort -u | tr "\n" " ")
echo capeff=$(awk "/^CapEff/ {print \$2}" /proc/self/status)
try limit "echo 1048576 > $C/tools/memory/memory.limit_in_bytes"
try pidsmax "echo 100000 > $C/tools/pids/pids.max"
try mkdir "mkdir $C/tools/memory/sub"
try tool_freeze "echo FROZEN > $C/tools/freezer/freezer.state"
try events "echo 1 > $C/tools/memory/cgroup.event_control"
try parent "echo 0 > $C/tools/memory/../cgroup.procs"
try sysfs "echo 0 > /sys/fs/cgroup/memory/cgroup.procs"
try mount_cgroup "mount -t cgroup -o memory none /tmp"
for c in memory pids freezer; do try tool_joins_mcp_$c "echo 0 > $C/mcp/$c/cgroup.procs"; done
try tool_tasks "echo 0 > $C/mcp/pids/tasks"
'
AS_UID=1002 python3 /work/as_tool.py /bin/bash -c '
echo mcp_uid=$(id -u) mcp_name=$(id -un)
(echo 0 > /run/asbx-cgroup/tools/pids/cgroup.procs) 2>/dev/null && echo mcp_joins_tools=ALLOWED || echo mcp_joins_tools=denied
echo 0 > /run/asbx-cgroup/mcp/memory/cgroup.procs && echo mcp_join=ok
touch /tmp/mcp-file; echo mcp_owner=$(stat -c %u /tmp/mcp-file)
'
try agent_joins_tools "echo 0 > $C/tools/pids/cgroup.procs"
try agent_freeze "echo FROZEN > $C/tools/freezer/freezer.state && echo THAWED > $C/tools/freezer/freezer.state"
"#;
    let mut sbx = Sbx::new(SCRIPT);
    sbx.policy.limits.memory_bytes = Some(512 << 20);
    sbx.policy.limits.pids = Some(256);
    with_tool_helper(&sbx);
    let out = sbx.run().ok()?;
    let o = &out.stdout;
    for want in [
        "children=mcp tools controllers=freezer memory pids\nmemory_before=0\n",
        "ask_t=+\nask_t=+\nask_m=+\nask_x=-\n",
        &format!("{}\n{}\n224\n", 448u64 << 20, 448u64 << 20),
        "join_memory=ok\njoin_pids=ok\njoin_freezer=ok\n",
        "cgroups=/tools\n",
        "capeff=0000000000000000\n",
        "limit=denied\npidsmax=denied\nmkdir=denied\ntool_freeze=denied\nevents=denied\n\
         parent=denied\nsysfs=denied\nmount_cgroup=denied\n",
        "tool_joins_mcp_memory=denied\ntool_joins_mcp_pids=denied\n\
         tool_joins_mcp_freezer=denied\ntool_tasks=denied\n",
        "mcp_uid=1002 mcp_name=mcp\nmcp_joins_tools=denied\nmcp_join=ok\nmcp_owner=1002\n",
        "agent_joins_tools=denied\nagent_freeze=ALLOWED\n",
    ] {
        ensure(
            o.contains(want),
            format!("want {want:?} in\n{o}\n{}", out.stderr),
        )?;
    }
    pass()
}

/// The child memory cgroup requests of a hostile main process: 4 MB of
/// junk (each byte refused) whose answers it never reads (more than a
/// socket buffer holds), then requests, then its end: the supervisor
/// neither blocks nor dies, reports the main process's exit code, and
/// removes every cgroup, the memory children it made included.
fn hostile_cgroup_requests_leave_the_supervisor_whole() -> R {
    if !std::path::Path::new("/sys/fs/cgroup/freezer/cgroup.procs").exists() {
        return Ok(Outcome::Skip(
            "no cgroup v1 freezer hierarchy: the jail makes no child cgroups".into(),
        ));
    }
    let sbx = Sbx::new(
        "head -c 4000000 /dev/zero | tr '\\0' x >&$ASBX_CGROUP_REQUEST_FD; \
         printf tmtmtm >&$ASBX_CGROUP_REQUEST_FD; sleep 0.2; exit 5",
    );
    let out = sbx.run();
    ensure(out.code == 5, format!("{out:?}"))?;
    ensure(
        eventually(Duration::from_secs(5), || {
            sbx.cgroup_dirs().iter().all(|d| !d.exists())
        }),
        format!("cgroups left: {:?}", sbx.cgroup_dirs()),
    )?;
    pass()
}

/// A tool in `tools` that allocates more than the child's bound (but less
/// than the sandbox's) is OOM-killed, and the agent-like parent outside it
/// lives on; the same allocation outside `tools` (positive control) fits.
fn tool_memory_hog_dies_agent_survives() -> R {
    if !std::path::Path::new("/sys/fs/cgroup/freezer/cgroup.procs").exists() {
        return Ok(Outcome::Skip(
            "no cgroup v1 freezer hierarchy: the jail makes no child cgroups".into(),
        ));
    }
    // 1 GiB sandbox: `tools` gets 896 MiB; the hog wants 940 MiB.
    const SCRIPT: &str = r#"
printf t >&$ASBX_CGROUP_REQUEST_FD && read -r -n1 -u $ASBX_CGROUP_REQUEST_FD made
HOG='b = b"x" * (940 << 20); print("hog lived")'
python3 /work/as_tool.py /bin/bash -c "echo 0 > /run/asbx-cgroup/tools/memory/cgroup.procs; exec python3 -c '$HOG'"
echo tool_exit=$?
python3 /work/as_tool.py /usr/bin/python3 -c "$HOG"
echo control_exit=$?
echo agent alive
"#;
    let mut sbx = Sbx::new(SCRIPT);
    sbx.policy.limits.memory_bytes = Some(1 << 30);
    with_tool_helper(&sbx);
    let out = sbx.run_with(None, Duration::from_secs(120)).ok()?;
    ensure(
        // 247: the helper's exit code for a child killed by SIGKILL (-9).
        out.stdout == "tool_exit=247\nhog lived\ncontrol_exit=0\nagent alive\n",
        format!("{out:?}"),
    )?;
    pass()
}

/// Item 8 of issue 13: root files are 0644 (not writable by anyone before
/// the read-only remount made it moot), the host's `/etc/environment`,
/// `/etc/gitconfig` and `/etc/profile.d` stay outside, mount options don't
/// show the host uid range, and `/proc` hides
/// other uids' processes: a tool can't see init or the agent, let alone read
/// the agent's environment, while the agent (positive control) sees and
/// reads itself.
fn no_secrets_from_etc_or_proc() -> R {
    const SCRIPT: &str = r#"
stat -L -c '%a %n' /etc/passwd /etc/group /etc/hosts /etc/hostname /etc/nsswitch.conf
for f in /etc/environment /etc/gitconfig /etc/profile.d; do test -e $f && echo "leak $f"; done
grep -E '[ ,](uid|gid)=[0-9]{5}' /proc/self/mountinfo | sed 's/^/leak /'
echo agent_sees_self=$(test -e /proc/$$ && echo yes)
echo agent_reads_self=$(grep -c ASBX_IT_MARKER /proc/$$/environ)
python3 /work/as_tool.py /bin/bash -c "
echo tool_sees_init=\$(test -e /proc/1 && echo yes || echo no)
echo tool_sees_agent=\$(test -e /proc/$$ && echo yes || echo no)
echo tool_reads_agent=\$(cat /proc/$$/environ 2>/dev/null | grep -c ASBX_IT_MARKER)
echo tool_pids=\$(ls /proc | grep -c '^[0-9]')
"
"#;
    let sbx = Sbx::new(SCRIPT);
    with_tool_helper(&sbx);
    let out = sbx.run().ok()?;
    let want = "644 /etc/passwd\n644 /etc/group\n644 /etc/hosts\n644 /etc/hostname\n\
                644 /etc/nsswitch.conf\nagent_sees_self=yes\nagent_reads_self=1\n\
                tool_sees_init=no\ntool_sees_agent=no\ntool_reads_agent=0\n";
    ensure(out.stdout.starts_with(want), format!("{out:?}"))?;
    // The tool sees its own (bash, the substitution's subshell, ls, grep), never
    // init, the agent or the helper that started it.
    let tool_pids: u32 = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("tool_pids="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    ensure(
        (1..=4).contains(&tool_pids),
        format!("tool sees {tool_pids} pids: {out:?}"),
    )?;
    let host_has = ["/etc/environment", "/etc/gitconfig", "/etc/profile.d"]
        .iter()
        .filter(|f| std::path::Path::new(f).exists())
        .count();
    if host_has == 0 {
        println!("    (host has none of /etc/environment, gitconfig, profile.d: absence only)");
    }
    pass()
}

/// Every sandbox binds the same host folder, read-only, as its `/etc`
/// (`rootfs::shared_etc`): the same inodes in two sandboxes, a read-only
/// mount that root in the sandbox can neither write to nor remount, the
/// host's `/etc/alternatives` links working (`awk` is one), and a host
/// folder only root may read (`/etc/ssl/private`) absent.
fn etc_is_one_read_only_folder_for_every_sandbox() -> R {
    const SCRIPT: &str = r#"
stat -c 'inodes %d:%i' /etc/passwd /etc/nsswitch.conf
awk '$5 == "/etc" { split($6, o, ","); print "etc mount " o[1] }' /proc/self/mountinfo
(echo x > /etc/passwd) 2>/dev/null && echo WROTE passwd
(echo x > /etc/new) 2>/dev/null && echo WROTE new
mount -o remount,rw /etc 2>/dev/null && echo REMOUNTED
test -e /etc/ssl/private && echo private visible
test -s /etc/ssl/certs/ca-certificates.crt && echo certs
true
"#;
    let a = Sbx::new(SCRIPT).run().ok()?;
    let b = Sbx::new(SCRIPT).run().ok()?;
    let inodes = |o: &Out| -> Vec<String> {
        o.stdout
            .lines()
            .filter(|l| l.starts_with("inodes "))
            .map(str::to_owned)
            .collect()
    };
    ensure(
        inodes(&a).len() == 2 && inodes(&a) == inodes(&b),
        format!("two sandboxes, two /etc: {a:?} {b:?}"),
    )?;
    ensure(
        a.stdout.contains("etc mount ro\n"),
        format!("/etc not a read-only mount: {a:?}"),
    )?;
    for bad in ["WROTE", "REMOUNTED", "private visible"] {
        ensure(!a.stdout.contains(bad), format!("{bad}: {a:?}"))?;
    }
    let host_certs = std::path::Path::new("/etc/ssl/certs/ca-certificates.crt").exists();
    ensure(
        a.stdout.contains("certs\n") == host_certs,
        format!("host has certs: {host_certs}; {a:?}"),
    )?;
    pass()
}

/// The runner ends a sandbox with `killpg(SIGKILL)` of the supervisor's
/// process group: the cleanup guard (its own group) survives it and removes
/// every cgroup, the `tools` and `mcp` children first, within 5 s.
fn killpg_of_the_supervisor_removes_child_cgroups() -> R {
    // The tool user joins (only it may write the child's `cgroup.procs`).
    let sbx = Sbx::new(
        "printf t >&$ASBX_CGROUP_REQUEST_FD && read -r -n1 -u $ASBX_CGROUP_REQUEST_FD made; \
         python3 /work/as_tool.py /bin/bash -c \
         'echo 0 > /run/asbx-cgroup/tools/memory/cgroup.procs && exec sleep 300' & \
         echo ready; wait",
    );
    with_tool_helper(&sbx);
    let mut child = sbx.spawn_in_group();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let children = sbx.cgroup_dirs()[0].join("tools").exists();
    let seen = eventually(Duration::from_secs(10), || {
        marked_pids(&sbx.marker).len() >= 2
    });
    nix::sys::signal::killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    let _ = child.wait();
    ensure(line == "ready\n", format!("{line:?}"))?;
    ensure(seen, "sandbox processes not found")?;
    ensure(children, "no tools child cgroup before the kill")?;
    ensure(
        eventually(Duration::from_secs(5), || {
            marked_pids(&sbx.marker).is_empty() && sbx.cgroup_dirs().iter().all(|d| !d.exists())
        }),
        format!(
            "after killpg: processes {:?}, cgroups {:?}",
            marked_pids(&sbx.marker),
            sbx.cgroup_dirs()
                .iter()
                .filter(|d| d.exists())
                .collect::<Vec<_>>()
        ),
    )?;
    pass()
}

/// A client that hangs up at once gets its sandbox's group SIGKILLed while the
/// supervisor may still be creating the cgroups; whatever moment the kill
/// lands, no cgroup directory outlives it (the guard starts first).
fn a_supervisor_killed_while_starting_leaves_no_cgroup() -> R {
    let mut left = Vec::new();
    for delay_us in (0..=20_000).step_by(200) {
        let sbx = Sbx::new("echo ready; sleep 300");
        let mut child = sbx.spawn_in_group();
        std::thread::sleep(Duration::from_micros(delay_us));
        nix::sys::signal::killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
        let _ = child.wait();
        let gone = eventually(Duration::from_secs(10), || {
            sbx.cgroup_dirs().iter().all(|d| !d.exists()) && sbx.supervisor_pids().is_empty()
        });
        if !gone {
            left.extend(sbx.cgroup_dirs().into_iter().filter(|d| d.exists()));
        }
    }
    ensure(left.is_empty(), format!("cgroups left behind: {left:?}"))?;
    pass()
}

/// `/proc/self/mountinfo` and `/proc/self/cgroup` inside a sandbox name no
/// host path and no pid of the host (issue 13, item 8): the run folder and
/// the binary come from the runner's `DetachedDir`s (root `/`), `/work` is
/// a copy, cgroups read from the sandbox's cgroup namespace. Positive
/// controls: the table lists the sandbox's own mounts, a socket made by the
/// "runner" through the detached folder's path is reachable inside, and a
/// plain host-folder bind beside them does show its host path (what the
/// runner used to do), so the reader would see a leak.
fn mountinfo_and_cgroup_show_no_host_path() -> R {
    use std::os::unix::fs::PermissionsExt;
    let (run, bin) = match (
        asbx_jail::DetachedDir::tmpfs(64 << 10, 64, false),
        asbx_jail::DetachedDir::tmpfs(1 << 20, 16, true),
    ) {
        (Ok(r), Ok(b)) => (r, b),
        (Err(e), _) | (_, Err(e)) => {
            return Ok(Outcome::Skip(format!("no detached tmpfs here: {e}")));
        }
    };
    let sock = run.path().join("gateway.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let hello = bin.path().join("hello");
    std::fs::write(&hello, "#!/bin/sh\necho hello-from-detached\n").unwrap();
    std::fs::set_permissions(&hello, std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(b"pong").unwrap();
    });
    let host = tempfile::Builder::new()
        .prefix(".tmp-asbx-hostbind")
        .tempdir()
        .unwrap();
    let mut sbx = Sbx::new(
        "/opt/asbx/bin/asbx; \
         python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); \
s.connect('/run/asbx/gateway.sock'); print(s.recv(4).decode())\"; \
         echo ---; cat /proc/self/mountinfo; echo ---; cat /proc/self/cgroup",
    );
    for (source, target) in [
        (run.path().to_path_buf(), "/run/asbx"),
        (hello.clone(), "/opt/asbx/bin/asbx"),
        (host.path().to_path_buf(), "/run/hostbind"),
    ] {
        sbx.policy.binds.push(BindMount {
            source: source.to_string_lossy().into_owned(),
            target: target.into(),
            writable: false,
        });
    }
    let out = sbx.run().ok()?;
    server.join().map_err(|_| "socket server failed")?;
    let mut parts = out.stdout.split("---\n");
    let (head, mountinfo, cgroup) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    ensure(
        head == "hello-from-detached\npong\n",
        format!("the detached folders work: {out:?}"),
    )?;
    // Field 4 is the mount's root, field 5 its mount point; the source
    // follows the " - fstype" separator.
    let mut roots = std::collections::BTreeMap::new();
    for line in mountinfo.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let source = line.split(" - ").nth(1).and_then(|r| r.split(' ').nth(1));
        if let (Some(root), Some(point), Some(source)) = (f.get(3), f.get(4), source) {
            roots.insert(point.to_string(), (root.to_string(), source.to_string()));
        }
    }
    for point in [
        "/",
        "/work",
        "/tmp",
        "/proc",
        "/run/asbx",
        "/opt/asbx/bin/asbx",
    ] {
        ensure(
            roots.contains_key(point),
            format!("{point} is not in the mount table: {mountinfo}"),
        )?;
    }
    let host_path = host.path().to_string_lossy().into_owned();
    ensure(
        roots.get("/run/hostbind").map(|(r, _)| r.as_str()) == Some(host_path.as_str()),
        format!("control: a host bind shows its host path {host_path}: {mountinfo}"),
    )?;
    let pid = std::process::id().to_string();
    let workdir = sbx.dir.path().to_string_lossy().into_owned();
    // `/work`, `/tmp` and `/dev/shm` are folders of the sandbox's own tmpfs
    // bound onto themselves: their root is their own path in it.
    for point in ["/work", "/tmp", "/dev/shm"] {
        let got = roots.get(point).map(|(r, s)| (r.as_str(), s.as_str()));
        ensure(
            got == Some((point, "tmpfs")),
            format!("{point}: {got:?}: {mountinfo}"),
        )?;
    }
    for (point, (root, source)) in &roots {
        if matches!(
            point.as_str(),
            "/run/hostbind" | "/work" | "/tmp" | "/dev/shm"
        ) {
            continue;
        }
        for field in [root, source] {
            let leaks = field.contains(&workdir)
                || field.contains("/proc/")
                || field.contains("/fd/")
                || field.contains(".tmp")
                || field.contains("/work")
                || field.split(|c: char| !c.is_ascii_digit()).any(|n| n == pid);
            ensure(
                !leaks,
                format!("{point} shows a host path or pid ({field}): {mountinfo}"),
            )?;
        }
    }
    for point in ["/run/asbx", "/opt/asbx/bin/asbx"] {
        let root = roots.get(point).map(|(r, _)| r.as_str()).unwrap_or("");
        ensure(
            root == "/" || root == "/hello",
            format!("{point} has root {root}: {mountinfo}"),
        )?;
    }
    ensure(
        !cgroup.is_empty() && cgroup.lines().all(|l| l.ends_with(":/")),
        format!("the cgroup file shows only the namespace's root: {cgroup}"),
    )?;
    ensure(
        !out.stdout.contains(&sbx.policy.cgroup),
        format!("the cgroup name shows: {out:?}"),
    )?;
    pass()
}

/// `sweep_stale_cgroups` removes an old sandbox cgroup no process is in
/// (children first), and keeps one as old with a process in it and an
/// empty one just made (a neighbour's sandbox being set up). It removes a
/// dead zygote's spares however new, and keeps a live one's.
fn stale_cgroups_are_swept_and_live_ones_kept() -> R {
    use nix::sys::stat::{UtimensatFlags, utimensat};
    use nix::sys::time::TimeSpec;
    use std::path::{Path, PathBuf};
    use std::process::Command;
    let hierarchies: Vec<PathBuf> = ["memory", "pids"]
        .iter()
        .map(|c| Path::new("/sys/fs/cgroup").join(c).join("asbx"))
        .collect();
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let name = |kind: &str| match kind {
        "dead-zygote" => format!("zygote-{dead}-0"),
        "live-zygote" => format!("zygote-{}-0", std::process::id()),
        _ => format!("asbx-sweep-{}-{kind}", std::process::id()),
    };
    let dirs =
        |kind: &str| -> Vec<PathBuf> { hierarchies.iter().map(|h| h.join(name(kind))).collect() };
    let two_minutes_ago = TimeSpec::new(
        (std::time::SystemTime::now() - Duration::from_secs(120))
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64,
        0,
    );
    for kind in ["stale", "busy", "fresh", "dead-zygote", "live-zygote"] {
        for d in dirs(kind) {
            std::fs::create_dir_all(d.join("tools")).unwrap();
        }
    }
    for kind in ["stale", "busy"] {
        for d in dirs(kind) {
            for p in [d.join("tools"), d.clone()] {
                utimensat(
                    nix::fcntl::AT_FDCWD,
                    &p,
                    &two_minutes_ago,
                    &two_minutes_ago,
                    UtimensatFlags::NoFollowSymlink,
                )
                .unwrap();
            }
        }
    }
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    std::fs::write(
        dirs("busy")[1].join("tools").join("cgroup.procs"),
        sleeper.id().to_string(),
    )
    .unwrap();
    let swept = asbx_jail::sweep_stale_cgroups(Duration::from_secs(60));
    let state = |kind: &str| dirs(kind).iter().map(|d| d.exists()).collect::<Vec<_>>();
    let (stale, busy, fresh) = (state("stale"), state("busy"), state("fresh"));
    let (dead_zygote, live_zygote) = (state("dead-zygote"), state("live-zygote"));
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    for kind in ["busy", "fresh", "dead-zygote", "live-zygote"] {
        for d in dirs(kind) {
            let _ = std::fs::remove_dir(d.join("tools"));
            let _ = std::fs::remove_dir(&d);
        }
    }
    ensure(stale == [false, false], format!("stale left: {stale:?}"))?;
    ensure(busy == [true, true], format!("busy removed: {busy:?}"))?;
    ensure(fresh == [true, true], format!("fresh removed: {fresh:?}"))?;
    ensure(
        dead_zygote == [false, false],
        format!("a dead zygote's spare left: {dead_zygote:?}"),
    )?;
    ensure(
        live_zygote == [true, true],
        format!("a live zygote's spare removed: {live_zygote:?}"),
    )?;
    ensure(swept >= 2, format!("swept {swept}"))?;
    pass()
}

/// `asbx_jail::Zygote` (this binary as `jail --zygote`): a refused policy
/// leaves it serving; a forked supervisor is the caller's child, shows its
/// sandbox in its command line, runs the policy with the caller's pipes as
/// its stdio and reports the exit code; the zygote ends with its socket.
fn the_zygote_forks_supervisors_as_the_callers_children() -> R {
    use std::os::fd::AsFd;
    let exe = std::env::current_exe().unwrap();
    let zygote = asbx_jail::Zygote::start(&exe).map_err(|e| e.to_string())?;
    let zygote_pid = zygote.pid();
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();

    let (in_r, _in_w) = pipe();
    let (_out_r, out_w) = pipe();
    match zygote.fork(
        b"{not a policy",
        [in_r.as_fd(), out_w.as_fd(), out_w.as_fd()],
        None,
    ) {
        Err(e) if e.to_string().contains("invalid policy") => {}
        other => return Err(format!("a bad policy: {other:?}")),
    }

    let sbx = Sbx::new("read -r l; echo \"hi $l\"; echo err >&2; exit 7");
    let (pid, in_w, out_r, err_r) = zygote_fork(&zygote, &sbx)?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let ppid: u32 = stat
        .rsplit_once(") ")
        .and_then(|(_, r)| r.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // The child writes its title over the zygote's just after the fork.
    let title = || {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmdline).into_owned()
    };
    let named = |t: &str| t.contains(&sbx.policy.cgroup) && t.contains(&sbx.policy.workdir);
    eventually(Duration::from_secs(5), || named(&title()));
    let title = title();
    let mut in_w = in_w;
    in_w.write_all(b"there\n").unwrap();
    drop(in_w);
    let (out, err, status) = zygote_collect(pid, out_r, err_r)?;
    ensure(
        ppid == std::process::id(),
        format!("its parent is {ppid}, not the caller"),
    )?;
    ensure(
        named(&title),
        format!("its command line names its sandbox: {title:?}"),
    )?;
    ensure(
        out == "hi there\n" && err == "err\n",
        format!("stdout {out:?}, stderr {err:?}"),
    )?;
    ensure(
        status == nix::sys::wait::WaitStatus::Exited(Pid::from_raw(pid), 7),
        format!("{status:?}"),
    )?;
    drop(zygote);
    ensure(
        !std::path::Path::new(&format!("/proc/{zygote_pid}")).exists(),
        "the zygote outlived its socket",
    )?;
    pass()
}

/// Through the zygote, whose spare network namespaces are ready (it makes
/// them while idle): two sandboxes in a row each get a network namespace
/// of their own, neither the host's nor the other's, with `lo` up and no
/// other interface.
fn zygote_sandboxes_get_fresh_network_namespaces() -> R {
    let exe = std::env::current_exe().unwrap();
    let zygote = asbx_jail::Zygote::start(&exe).map_err(|e| e.to_string())?;
    // Let it make its spares.
    std::thread::sleep(Duration::from_millis(300));
    let script = "readlink /proc/self/ns/net; \
        python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(1); \
        socket.create_connection(s.getsockname(), timeout=2); print('lo up')\"; \
        tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '";
    let mut seen = Vec::new();
    for _ in 0..2 {
        let sbx = Sbx::new(script);
        let (pid, in_w, out_r, err_r) = zygote_fork(&zygote, &sbx)?;
        drop(in_w);
        let (out, err, status) = zygote_collect(pid, out_r, err_r)?;
        ensure(
            status == nix::sys::wait::WaitStatus::Exited(Pid::from_raw(pid), 0),
            format!("{status:?}: {out} {err}"),
        )?;
        let lines: Vec<&str> = out.lines().collect();
        ensure(
            lines.len() == 3 && lines[1] == "lo up" && lines[2] == "lo",
            format!("lo up and alone: {out:?} {err:?}"),
        )?;
        seen.push(lines[0].to_owned());
    }
    let host = std::fs::read_link("/proc/self/ns/net").unwrap();
    let host = host.to_string_lossy();
    ensure(
        seen[0].starts_with("net:[") && seen[0] != seen[1] && !seen.iter().any(|s| *s == host),
        format!("fresh namespaces: {seen:?}, the host's {host}"),
    )?;
    pass()
}

/// Through the zygote, whose spare cgroups are ready (it makes them while
/// idle, `zygote-<pid>-<n>`, children included but the memory ones, made
/// when a sandbox asks): a sandbox's cgroups are
/// one of them, renamed (the same kernfs inode) and made new (for a
/// sweep), with the sandbox's own limits and its children's written, init
/// in it; they go with the
/// sandbox; and the spares of a zygote that was SIGKILLed go when its
/// handle is dropped.
fn zygote_sandboxes_get_spare_cgroups_with_their_own_limits() -> R {
    use std::os::unix::fs::MetadataExt;
    use std::path::{Path, PathBuf};
    let memory = Path::new("/sys/fs/cgroup/memory/asbx");
    if !memory
        .parent()
        .unwrap()
        .join("memory.limit_in_bytes")
        .exists()
    {
        return Ok(Outcome::Skip("no cgroup v1 memory hierarchy".into()));
    }
    let exe = std::env::current_exe().unwrap();
    let zygote = asbx_jail::Zygote::start(&exe).map_err(|e| e.to_string())?;
    let prefix = format!("zygote-{}-", zygote.pid());
    // name -> inode of the spares' memory cgroups.
    let spares = || -> Vec<(String, u64)> {
        std::fs::read_dir(memory)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| {
                let ino = e.metadata().map(|m| m.ino()).unwrap_or(0);
                (e.file_name().to_string_lossy().into_owned(), ino)
            })
            .collect()
    };
    // With their pids and freezer children, not their memory children
    // (made when a sandbox asks).
    let pids = Path::new("/sys/fs/cgroup/pids/asbx");
    let full = |s: &[(String, u64)]| {
        s.len() == 4
            && s.iter().all(|(n, _)| {
                pids.join(n).join("tools").is_dir() && !memory.join(n).join("tools").exists()
            })
    };
    ensure(
        eventually(Duration::from_secs(5), || full(&spares())),
        format!("four spares with children: {:?}", spares()),
    )?;
    let before = spares();
    // Spares a while old: the sandbox's cgroups count as new all the same
    // (a sweep leaves new empty cgroups alone).
    std::thread::sleep(Duration::from_millis(1100));
    let asked = std::time::SystemTime::now();

    let mut sbx = Sbx::new(
        "printf t >&$ASBX_CGROUP_REQUEST_FD && read -r -n1 -u $ASBX_CGROUP_REQUEST_FD a; \
         read -r l; exit 3",
    );
    sbx.policy.limits.memory_bytes = Some(96 << 20);
    sbx.policy.limits.pids = Some(64);
    let (pid, in_w, out_r, err_r) = zygote_fork(&zygote, &sbx)?;
    let mine = memory.join(&sbx.policy.cgroup);
    let read = |p: PathBuf| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    // Limits are written and init moved before the agent runs; `tools`'s
    // memory cgroup once the sandbox asked for it.
    let moved = eventually(Duration::from_secs(5), || {
        !read(mine.join("cgroup.procs")).is_empty() && mine.join("tools").is_dir()
    });
    let ino = std::fs::metadata(&mine).map(|m| m.ino()).unwrap_or(0);
    let made = std::fs::metadata(&mine).and_then(|m| m.modified()).ok();
    let limits = (
        read(mine.join("memory.limit_in_bytes")),
        read(mine.join("tools/memory.limit_in_bytes")),
        read(
            Path::new("/sys/fs/cgroup/pids/asbx")
                .join(&sbx.policy.cgroup)
                .join("mcp/pids.max"),
        ),
    );
    let mut in_w = in_w;
    in_w.write_all(b"go\n").unwrap();
    drop(in_w);
    let (out, err, status) = zygote_collect(pid, out_r, err_r)?;
    ensure(
        status == nix::sys::wait::WaitStatus::Exited(Pid::from_raw(pid), 3),
        format!("{status:?}: {out} {err}"),
    )?;
    ensure(moved, "init never joined its memory cgroup")?;
    ensure(
        before.iter().any(|(_, i)| *i == ino),
        format!("the sandbox's memory cgroup (inode {ino}) is not one of the spares {before:?}"),
    )?;
    ensure(
        made.is_some_and(|t| t >= asked - Duration::from_millis(20)),
        format!("the renamed cgroup kept its spare's age: {made:?}, asked at {asked:?}"),
    )?;
    // 96 MiB less a reserve of max(64 MiB, 1/8), at most half: 48 MiB; 64
    // pids less max(8, 1/8): 56.
    ensure(
        limits
            == (
                (96u64 << 20).to_string(),
                (48u64 << 20).to_string(),
                "56".into(),
            ),
        format!("limits (sandbox memory, tools memory, mcp pids): {limits:?}"),
    )?;
    ensure(
        eventually(Duration::from_secs(5), || !mine.exists()),
        "the sandbox's cgroups outlived it",
    )?;

    // A zygote killed with its spares made: dropping its handle removes them.
    ensure(
        eventually(Duration::from_secs(5), || full(&spares())),
        format!("the spares were made again: {:?}", spares()),
    )?;
    kill(Pid::from_raw(zygote.pid() as i32), Signal::SIGKILL).map_err(|e| e.to_string())?;
    drop(zygote);
    ensure(
        spares().is_empty(),
        format!("a killed zygote's spares left: {:?}", spares()),
    )?;
    pass()
}

/// `Zygote::fork` with a report socket: the supervisor reports the main process's end
/// (its exit code, 4 bytes little-endian) on the socket it was given, the
/// code it then exits with; a main process killed by a signal reports 128 +
/// the signal; and a sandbox whose set-up fails reports nothing (its exit
/// says it).
fn zygote_supervisors_report_the_end_on_their_socket() -> R {
    use std::os::fd::AsFd;
    let exe = std::env::current_exe().unwrap();
    let zygote = asbx_jail::Zygote::start(&exe).map_err(|e| e.to_string())?;
    let run = |sbx: &Sbx| -> Result<(Vec<u8>, nix::sys::wait::WaitStatus), String> {
        let (ours, theirs) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::Stream,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let (pid, in_w, out_r, err_r) = zygote_fork_reporting(&zygote, sbx, Some(theirs.as_fd()))?;
        drop((theirs, in_w));
        let (_, _, status) = zygote_collect(pid, out_r, err_r)?;
        let mut report = Vec::new();
        std::fs::File::from(ours).read_to_end(&mut report).unwrap();
        Ok((report, status))
    };
    let (report, status) = run(&Sbx::new("exit 7"))?;
    ensure(
        report == 7i32.to_le_bytes() && matches!(status, nix::sys::wait::WaitStatus::Exited(_, 7)),
        format!("exit 7: report {report:?}, {status:?}"),
    )?;
    let (report, status) = run(&Sbx::new("kill -TERM $$"))?;
    ensure(
        report == 143i32.to_le_bytes()
            && matches!(status, nix::sys::wait::WaitStatus::Exited(_, 143)),
        format!("SIGTERM: report {report:?}, {status:?}"),
    )?;
    let mut bad = Sbx::new("exit 0");
    bad.policy.argv = vec!["/no/such/program".into()];
    let (report, status) = run(&bad)?;
    ensure(
        report.is_empty() && !matches!(status, nix::sys::wait::WaitStatus::Exited(_, 0)),
        format!("failed set-up: report {report:?}, {status:?}"),
    )?;
    pass()
}

/// Forks `sbx`'s supervisor through `zygote`, with fresh pipes as its stdio:
/// its pid and our ends (stdin, stdout, stderr).
fn zygote_fork(
    zygote: &asbx_jail::Zygote,
    sbx: &Sbx,
) -> Result<(i32, std::fs::File, std::fs::File, std::fs::File), String> {
    zygote_fork_reporting(zygote, sbx, None)
}

/// [`zygote_fork`], the supervisor reporting the sandbox's end on `report`.
fn zygote_fork_reporting(
    zygote: &asbx_jail::Zygote,
    sbx: &Sbx,
    report: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<(i32, std::fs::File, std::fs::File, std::fs::File), String> {
    use std::os::fd::AsFd;
    let json = serde_json::to_vec(&sbx.policy).unwrap();
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let (in_r, in_w) = pipe();
    let (out_r, out_w) = pipe();
    let (err_r, err_w) = pipe();
    let pid = zygote
        .fork(&json, [in_r.as_fd(), out_w.as_fd(), err_w.as_fd()], report)
        .map_err(|e| e.to_string())?;
    Ok((pid, in_w.into(), out_r.into(), err_r.into()))
}

/// Reads a forked supervisor's stdout and stderr to their ends and reaps it.
fn zygote_collect(
    pid: i32,
    mut out_r: std::fs::File,
    mut err_r: std::fs::File,
) -> Result<(String, String, nix::sys::wait::WaitStatus), String> {
    let mut out = String::new();
    out_r.read_to_string(&mut out).unwrap();
    let mut err = String::new();
    err_r.read_to_string(&mut err).unwrap();
    let status = nix::sys::wait::waitpid(Pid::from_raw(pid), None).map_err(|e| e.to_string())?;
    Ok((out, err, status))
}
