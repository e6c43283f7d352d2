//! Real dispatches whose tools attack the sandbox (issue 3). Each probe runs
//! inside a jailed sandbox through the scripted model's `shell` tool.

use std::collections::HashMap;
use std::time::Duration;

use asbx_protocol::callback::EnvResponse;
use asbx_protocol::{Event, StepStatus};
use serde_json::json;

use crate::harness::*;

/// Parses `name=value` lines printed by a probe script.
fn verdicts(out: &str) -> HashMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

const PROBE: &str = r#"probe() { if ( eval "$2" ) >/dev/null 2>&1; then echo "$1=ALLOWED"; else echo "$1=denied"; fi; }
py_probe() { if python3 -c "$2" >/dev/null 2>&1; then echo "$1=ALLOWED"; else echo "$1=denied"; fi; }
"#;

#[tokio::test]
async fn escape_attempts_fail() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let host_dir = tempfile::tempdir().unwrap();
    let secret = host_dir.path().join("secret.txt");
    let secret_path = secret.display().to_string();
    std::fs::write(&secret, "host secret").unwrap();
    let runner_data_s = runner
        .data
        .path()
        .canonicalize()
        .unwrap()
        .display()
        .to_string();
    let py = |code: &str| format!("'{code}'");
    let script = format!(
        "{PROBE}\
probe read_host_file 'cat {secret_path}'
probe list_runner_state 'ls {runner_data_s}'
probe write_root 'touch /asbx-escape'
probe write_usr 'touch /usr/asbx-escape'
probe write_etc 'touch /etc/asbx-escape'
probe write_work 'touch /work/ok && test -f /work/ok'
probe write_tmp 'touch /tmp/ok && test -f /tmp/ok'
probe mount 'mkdir -p /tmp/m && mount -t tmpfs none /tmp/m'
probe unshare_user 'unshare -U true'
probe unshare_net 'unshare -n true'
probe su 'su -c id root </dev/null'
py_probe ptrace {ptrace}
py_probe vsock {vsock}
py_probe raw_socket {raw}
py_probe packet_socket {packet}
py_probe io_uring {uring}
py_probe bpf {bpf}
py_probe keyctl {keyctl}
py_probe gateway_socket 'import socket; socket.socket(socket.AF_UNIX).connect(\"/run/asbx/gateway.sock\")'
py_probe proxy_socket 'import socket; socket.socket(socket.AF_UNIX).connect(\"/run/asbx/proxy.sock\")'
py_probe control_unix_socket 'import socket; a=socket.socket(socket.AF_UNIX); a.bind(\"/tmp/own.sock\"); a.listen(1); socket.socket(socket.AF_UNIX).connect(\"/tmp/own.sock\")'
py_probe control_inet_socket 'import socket; socket.socket(socket.AF_INET, socket.SOCK_STREAM)'
py_probe control_ctypes_syscall 'import ctypes,sys; l=ctypes.CDLL(None,use_errno=True); sys.exit(0 if l.syscall(39)>0 else 1)'
echo nnp=$(awk '/^NoNewPrivs/ {{print $2}}' /proc/self/status)
echo capeff=$(awk '/^CapEff/ {{print $2}}' /proc/self/status)
echo uid=$(id -u)
echo procs=$(ls /proc | grep -c '^[0-9]')
echo hostname=$(cat /proc/sys/kernel/hostname)
echo sockets=$(for f in /proc/$$/fd/*; do readlink $f; done | grep -c socket)
echo request_env=${{ASBX_CGROUP_REQUEST_FD:-none}}
",
        ptrace = py(
            "import ctypes,sys; l=ctypes.CDLL(None,use_errno=True); sys.exit(0 if l.ptrace(16, 1, 0, 0)==0 else 1)"
        ),
        vsock = py("import socket; socket.socket(40, socket.SOCK_STREAM)"),
        raw = py(
            "import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)"
        ),
        packet = py("import socket; socket.socket(17, socket.SOCK_RAW, 0)"),
        uring = py(
            "import ctypes,sys; l=ctypes.CDLL(None,use_errno=True); p=ctypes.create_string_buffer(120); sys.exit(0 if l.syscall(425, 4, p)>=0 else 1)"
        ),
        bpf = py(
            "import ctypes,sys; l=ctypes.CDLL(None,use_errno=True); p=ctypes.create_string_buffer(128); sys.exit(0 if l.syscall(321, 0, p, 128)>=0 else 1)"
        ),
        keyctl = py(
            "import ctypes,sys; l=ctypes.CDLL(None,use_errno=True); sys.exit(0 if l.syscall(250, 0, -3, 0)>=0 else 1)"
        ),
    );
    let (out, _) = shell(&runner, &ws, &script).await;
    let v = verdicts(&out);
    for denied in [
        "read_host_file",
        "list_runner_state",
        "write_root",
        "write_usr",
        "write_etc",
        "mount",
        "unshare_user",
        "unshare_net",
        "su",
        "ptrace",
        "vsock",
        "raw_socket",
        "packet_socket",
        "io_uring",
        "bpf",
        "keyctl",
        "gateway_socket",
        "proxy_socket",
    ] {
        assert_eq!(
            v.get(denied).map(String::as_str),
            Some("denied"),
            "{denied} in {out}"
        );
    }
    // Controls: the probe machinery itself works, so "denied" means denied.
    for allowed in [
        "write_work",
        "write_tmp",
        "control_inet_socket",
        "control_ctypes_syscall",
        "control_unix_socket",
    ] {
        assert_eq!(
            v.get(allowed).map(String::as_str),
            Some("ALLOWED"),
            "{allowed} in {out}"
        );
    }
    assert_eq!(v["nnp"], "1", "{out}");
    assert_eq!(v["capeff"], "0000000000000000", "{out}");
    assert_ne!(v["uid"], "0", "{out}");
    let procs: u32 = v["procs"].parse().unwrap();
    assert!(procs < 10, "/proc shows {procs} processes: {out}");
    assert_eq!(v["hostname"], "sandbox");
    // The agent's socket for its child memory cgroups stays the agent's.
    assert_eq!(v["sockets"], "0", "a tool inherited a socket: {out}");
    assert_eq!(v["request_env"], "none", "{out}");
    runner.assert_clean().await;
}

#[tokio::test]
async fn another_sandbox_and_the_host_loopback_are_out_of_reach() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    // A host service on loopback that must see no connection.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let acc = accepted.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            acc.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    // A long-running neighbour whose working directory the probe hunts for.
    let t1 = ws.mint(&session_id("neighbour"));
    let neighbour_body =
        ws.body(&t1, &script(json!([{"tool": "shell", "args": {"command": "echo neighbour-secret > mine.txt; sleep 110"}}])));
    let res = post_stream(&runner.url, &neighbour_body).await;
    let neighbour = crate::dispatch::read_until(
        res,
        |e| matches!(e, Event::Step(s) if s.status == StepStatus::Running),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let neighbour_work = runner.sessions_dir().join(&t1.session).join("work");
    let script = format!(
        "{PROBE}\
probe neighbour_file 'cat {nw}/mine.txt'
probe neighbour_grep 'grep -rs neighbour-secret / --exclude-dir=proc --exclude-dir=sys -l | grep -q .'
probe host_tcp 'python3 -c \"import socket; socket.create_connection((\\\"127.0.0.1\\\", {port}), 2)\"'
probe bash_tcp 'timeout 3 bash -c \"echo > /dev/tcp/127.0.0.1/{port}\"'
probe outside_dns 'python3 -c \"import socket; socket.create_connection((\\\"1.1.1.1\\\", 53), 2)\"'
echo ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' ')
",
        nw = neighbour_work.display(),
    );
    let (out, _) = shell(&runner, &ws, &script).await;
    let v = verdicts(&out);
    for denied in [
        "neighbour_file",
        "neighbour_grep",
        "host_tcp",
        "bash_tcp",
        "outside_dns",
    ] {
        assert_eq!(
            v.get(denied).map(String::as_str),
            Some("denied"),
            "{denied} in {out}"
        );
    }
    assert_eq!(v["ifaces"], "lo", "only loopback: {out}");
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "host service was reached"
    );
    drop(neighbour);
    runner.assert_clean().await;
}

#[tokio::test]
async fn a_tool_cannot_forge_lines_or_touch_the_agent() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let forged = r#"{"type":"result","message":"FORGED"}"#;
    let script = format!(
        "{PROBE}\
for p in /proc/[0-9]*; do echo '{forged}' > $p/fd/1 2>/dev/null && echo wrote=$p; done
probe write_parent_stdout 'echo {q} > /proc/$PPID/fd/1'
probe kill_agent 'kill -STOP $PPID'
probe read_agent_env 'cat /proc/$PPID/environ'
probe read_agent_mem 'head -c 1 /proc/$PPID/mem'
echo agent_uid=$(awk '/^Uid/ {{print $2}}' /proc/$PPID/status) me=$(id -u)
",
        q = "'{\"type\":\"result\",\"message\":\"FORGED\"}'"
    );
    let (out, lines) = shell(&runner, &ws, &script).await;
    let all = serde_json::to_string(&lines).unwrap();
    let forged_results = lines
        .iter()
        .filter(|l| matches!(&l.event, Event::Result(r) if r.message.contains("FORGED")))
        .count();
    assert_eq!(
        forged_results, 0,
        "a forged result reached the stream: {all}"
    );
    assert!(matches!(terminal(&lines), Event::Result(r) if r.message == "ok"));
    let v = verdicts(&out);
    for denied in [
        "write_parent_stdout",
        "kill_agent",
        "read_agent_env",
        "read_agent_mem",
    ] {
        assert_eq!(
            v.get(denied).map(String::as_str),
            Some("denied"),
            "{denied} in {out}"
        );
    }
    assert!(
        !out.contains("wrote="),
        "wrote into some process's stdout: {out}"
    );
    runner.assert_clean().await;
}

#[tokio::test]
async fn hostile_workloads_stay_inside_while_a_neighbour_finishes() {
    let runner = RunnerProc::start(&[
        ("ASBX_SANDBOX_MEMORY_MB", "128"),
        ("ASBX_SANDBOX_PIDS", "64"),
        ("ASBX_SANDBOX_DISK_MB", "32"),
        ("ASBX_SANDBOX_CPU_PERCENT", "50"),
    ]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    // A marker only this test's CPU spin carries, so the check below can't
    // mistake another process's busy loop for a survivor.
    let spin_marker = format!("spin{}", rand::random::<u32>());
    let spin = format!("timeout 4 bash -c '{spin_marker}=1; while :; do :; done'; echo spun");
    let attacks = [
        (
            "fork",
            "timeout 8 bash -c ':(){ :|:& };:' ; sleep 1; echo forkbomb-over",
        ),
        (
            "memory",
            "timeout 8 python3 -c 'b=[]\nwhile True: b.append(bytearray(16<<20))'; echo exit=$?",
        ),
        (
            "disk",
            "dd if=/dev/zero of=/work/fill bs=1M count=100 2>&1; dd if=/dev/zero of=/tmp/fill bs=1M count=100 2>&1; df -m /work /tmp | tail -2",
        ),
        ("cpu", spin.as_str()),
        (
            "flood",
            "head -c 50000000 /dev/zero | tr '\\0' x; seq 1 200000 >&2; echo flooded",
        ),
    ];
    let mut handles = Vec::new();
    for (name, cmd) in attacks {
        let t = ws.mint(&session_id(name));
        let body = ws.body(
            &t,
            &script(json!([{"tool": "shell", "args": {"command": cmd}}, {"say": "survived"}])),
        );
        let url = runner.url.clone();
        handles.push((
            name,
            tokio::spawn(async move { dispatch(&url, &body).await }),
        ));
    }
    // The neighbour: an ordinary turn that must finish normally meanwhile.
    let (_, neighbour) = shell(&runner, &ws, "echo neighbour-ok").await;
    assert!(matches!(terminal(&neighbour), Event::Result(r) if r.message == "ok"));
    let health = reqwest::get(format!("{}/healthz", runner.url))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    for (name, h) in handles {
        let (status, lines, _) = h.await.unwrap();
        assert_eq!(status, 200);
        assert_well_formed(&lines);
        let results = serde_json::to_string(&shell_results(&lines)).unwrap();
        match name {
            "memory" => assert!(
                results.contains("exit=137") || results.contains("MemoryError"),
                "{results}"
            ),
            "disk" => assert!(results.contains("No space left"), "{results}"),
            // The bomb's orphans may hold every pid of its sandbox, so the
            // step may end either way; what matters is that the turn ends,
            // its neighbour finished and nothing is left (checked below).
            "fork" => {
                let all = serde_json::to_string(&lines).unwrap();
                assert!(
                    all.contains("forkbomb-over")
                        || all.contains("Resource temporarily unavailable")
                        || all.contains("\"status\":\"failed\""),
                    "{all}"
                );
            }
            "flood" => {
                // 50 MB of output reach the client as a bounded, truncated step.
                assert!(
                    results.len() < 64 * 1024,
                    "{} bytes of step result",
                    results.len()
                );
                assert!(matches!(terminal(&lines), Event::Result(r) if r.message == "survived"));
            }
            _ => {}
        }
    }
    // The runner is unharmed and no host process of the attacks is left.
    assert!(pids_with(&spin_marker).is_empty());
    runner.assert_clean().await;
}

#[tokio::test]
async fn tools_reach_the_network_only_through_the_allow_list() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    ws.set_env(EnvResponse {
        allowed_hosts: vec!["127.0.0.2".into(), "169.254.169.254".into()],
        ..Default::default()
    });
    let script = r#"echo proxy=$HTTP_PROXY
python3 - <<'PY'
import urllib.request, urllib.error
for url in ["http://not-allowed.example/", "https://not-allowed.example/", "http://127.0.0.2:9/", "http://169.254.169.254/latest/meta-data/"]:
    try:
        urllib.request.urlopen(url, timeout=5)
        print(url, "=ALLOWED")
    except urllib.error.HTTPError as e:
        print(url, "=refused", e.code)
    except Exception as e:
        print(url, "=refused", type(e).__name__, e)
PY
"#;
    let (out, _) = shell(&runner, &ws, script).await;
    assert!(out.contains("proxy=http://127.0.0.1:"), "{out}");
    assert!(!out.contains("=ALLOWED"), "{out}");
    assert!(
        out.contains("http://not-allowed.example/ =refused 403"),
        "{out}"
    );
    assert!(
        out.contains("https://not-allowed.example/ =refused") && out.contains("403"),
        "{out}"
    );
    assert!(
        out.contains("http://127.0.0.2:9/ =refused 403"),
        "allowed, but loopback: {out}"
    );
    assert!(
        out.contains("http://169.254.169.254/latest/meta-data/ =refused 403"),
        "allowed, but link-local metadata: {out}"
    );
    runner.assert_clean().await;
}

/// Two runners on one host claim their own blocks of host uids
/// (`asbx_runner` `uids::UidClaim`, under `/run/asbx-uids`): their sandboxes
/// never run as the same host user, which would share per-user kernel
/// state (process counts, inotify and message-queue limits) across them.
/// The uid map a sandbox sees names its host ids.
#[tokio::test]
async fn two_runners_on_one_host_hand_out_distinct_host_uids() {
    if profile() == "unconfined" {
        return; // no uid maps without the jail
    }
    let (a, b) = (RunnerProc::start(&[]), RunnerProc::start(&[]));
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    // `inside outside count` per line: the host ids the sandbox maps, from
    // its uid 1000's to past its last.
    let host_ids = |out: &str| -> (u64, u64) {
        let maps: Vec<[u64; 3]> = out
            .lines()
            .filter_map(|l| {
                let f: Vec<u64> = l
                    .split_whitespace()
                    .filter_map(|v| v.parse().ok())
                    .collect();
                <[u64; 3]>::try_from(f).ok()
            })
            .collect();
        let first = maps
            .iter()
            .find(|m| m[0] == 1000)
            .unwrap_or_else(|| panic!("no uid map line for 1000: {out}"));
        let end = maps.iter().map(|m| m[1] + m[2]).max().unwrap_or(0);
        (first[1], end)
    };
    let (out_a, _) = shell(&a, &ws, "cat /proc/self/uid_map").await;
    let (out_b, _) = shell(&b, &ws, "cat /proc/self/uid_map").await;
    let (ra, rb) = (host_ids(&out_a), host_ids(&out_b));
    assert!(ra.0 >= 1_000_000 && rb.0 >= 1_000_000, "{ra:?} {rb:?}");
    // Each runner's uids lie in blocks of 65,536 of its own.
    let (block_a, block_b) = (ra.0 >> 16, rb.0 >> 16);
    assert_ne!(block_a, block_b, "a: {out_a} b: {out_b}");
    assert_eq!((ra.1 - 1) >> 16, block_a, "{ra:?}");
    assert_eq!((rb.1 - 1) >> 16, block_b, "{rb:?}");
    let held = |block: u64| std::fs::metadata(format!("/run/asbx-uids/block-{block}.lock")).is_ok();
    assert!(held(block_a) && held(block_b));
    a.assert_clean().await;
    b.assert_clean().await;
}

/// `/proc/self/mountinfo` and `/proc/self/cgroup` inside a sandbox name no
/// host path and no pid of the host (issue 13, item 8): not the runner's
/// data folder, not its pid (which the warm sandboxes' names carry), not
/// where the `asbx` binary is installed, nothing under the host's `/work` or
/// `/tmp`. The run folder and the binary come from tmpfs mounted nowhere on
/// the host (root `/`), cgroups read from the sandbox's cgroup namespace.
/// Positive control: the table is readable and lists the sandbox's own
/// mounts, the run folder and the binary among them.
#[tokio::test]
async fn mountinfo_and_cgroup_name_no_host_path() {
    let runner = RunnerProc::start(&[]);
    let ws = FakeWorkspace::start(scripted("scripted:test")).await;
    let (out, lines) = shell(
        &runner,
        &ws,
        // Root, mount point and source of each mount (the tool's output is
        // capped; the other fields carry options only).
        "awk '{print $4, $5, $(NF-1)}' /proc/self/mountinfo; echo ---; cat /proc/self/cgroup",
    )
    .await;
    let (mountinfo, cgroup) = out
        .split_once("---\n")
        .unwrap_or_else(|| panic!("no output: {lines:?}"));
    let mut mounts = HashMap::new();
    for line in mountinfo.lines() {
        if let [root, point, source] = line.split(' ').collect::<Vec<_>>()[..] {
            mounts.insert(point.to_owned(), (root.to_owned(), source.to_owned()));
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
        assert!(
            mounts.contains_key(point),
            "{point} not listed: {mountinfo}"
        );
    }
    let data = runner.data.path();
    let mut host_paths = vec![data.display().to_string()];
    host_paths.push(data.canonicalize().unwrap().display().to_string());
    let exe_dir = std::path::Path::new(ASBX).parent().unwrap();
    host_paths.push(exe_dir.display().to_string());
    host_paths.push(exe_dir.canonicalize().unwrap().display().to_string());
    for host in &host_paths {
        assert!(!out.contains(host.as_str()), "{host} shows: {out}");
    }
    let pid = runner.pid().to_string();
    let names_pid = |s: &str| s.split(|c: char| !c.is_ascii_digit()).any(|n| n == pid);
    // `/work`, `/tmp` and `/dev/shm` are folders of the sandbox's own tmpfs
    // bound onto themselves: their root is their own path in it.
    for point in ["/work", "/tmp", "/dev/shm"] {
        let (root, source) = &mounts[point];
        assert_eq!(
            (root.as_str(), source.as_str()),
            (point, "tmpfs"),
            "{mountinfo}"
        );
    }
    for (point, (root, source)) in &mounts {
        if matches!(point.as_str(), "/work" | "/tmp" | "/dev/shm") {
            continue;
        }
        for field in [root, source] {
            assert!(
                !field.starts_with("/work")
                    && !field.starts_with("/tmp")
                    && !field.contains("/proc/")
                    && !names_pid(field),
                "{point} shows a host path or the runner's pid ({field}): {mountinfo}"
            );
        }
    }
    // The tool's cgroups, relative to the sandbox's: its own or `tools`.
    assert!(
        !cgroup.is_empty()
            && cgroup
                .lines()
                .all(|l| matches!(l.rsplit(':').next(), Some("/" | "/tools"))),
        "{cgroup}"
    );
    runner.assert_clean().await;
}

/// The agent is the sandbox's init, with no `execve` (`entry: agent`):
/// seen from the host, a warm sandbox's agent holds
/// exactly the agent's capabilities (sealed: none inheritable or ambient),
/// `no_new_privs` and a seccomp filter, calls itself `asbx-agent`, and
/// neither its executable nor any file it maps is a host path outside the
/// system folders: the binary is the runner's detached copy (`/asbx`). The
/// sandbox's cgroup holds the agent, pid 1 of the sandbox, and nothing
/// else, at the lowest CPU weight (it was booted in the background).
#[tokio::test]
async fn the_warm_agent_is_forked_sealed_and_maps_no_host_path() {
    let runner = RunnerProc::start(&[]);
    if profile() != "strict" {
        asbx_test_support::skip(
            "the_warm_agent_is_forked_sealed_and_maps_no_host_path",
            "needs the strict profile's cgroups to find the sandbox",
        );
        return;
    }
    let mut cgroups = Vec::new();
    for _ in 0..200 {
        cgroups = runner.warm_cgroups();
        if !cgroups.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cgroup = cgroups.first().expect("a warm sandbox");
    // Booted in the background: the lowest CPU weight until a dispatch takes
    // it. (The memory cgroup is made first: the cpu one, and its weight, may
    // not be there yet; a weight that never comes fails below.)
    let mut shares = String::new();
    for _ in 0..200 {
        shares = std::fs::read_to_string(format!("/sys/fs/cgroup/cpu/asbx/{cgroup}/cpu.shares"))
            .unwrap_or_default();
        if shares.trim() == "2" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(shares.trim(), "2", "a warm sandbox's cpu.shares");
    let procs_file = format!("/sys/fs/cgroup/memory/asbx/{cgroup}/cgroup.procs");
    let cmdline = |pid: i32| {
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        String::from_utf8_lossy(raw.split(|b| *b == 0).next().unwrap_or(&[])).into_owned()
    };
    // The agent is in the cgroup once init was moved there, and named once
    // it started; wait for both.
    let mut procs: Vec<i32> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for _ in 0..200 {
        procs = std::fs::read_to_string(&procs_file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        names = procs.iter().map(|p| cmdline(*p)).collect();
        if names.iter().any(|n| n == "asbx-agent") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        {
            let mut n = names.clone();
            n.sort();
            n
        },
        ["asbx-agent"],
        "the sandbox's processes: {procs:?}"
    );
    let agent = procs[names.iter().position(|n| n == "asbx-agent").unwrap()];
    let status = std::fs::read_to_string(format!("/proc/{agent}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_else(|| panic!("{name} not in {status}"))
            .to_owned()
    };
    // CAP_SETGID (6), CAP_SETUID (7) and CAP_KILL (5).
    assert_eq!(field("CapEff:"), "00000000000000e0", "{status}");
    assert_eq!(field("CapPrm:"), "00000000000000e0", "{status}");
    assert_eq!(field("CapInh:"), "0000000000000000", "{status}");
    assert_eq!(field("CapAmb:"), "0000000000000000", "{status}");
    assert_eq!(field("NoNewPrivs:"), "1", "{status}");
    assert_eq!(field("Seccomp:"), "2", "{status}");
    assert!(
        field("NSpid:").ends_with("\t1"),
        "pid 1 of the sandbox: {status}"
    );
    let exe = std::fs::read_link(format!("/proc/{agent}/exe")).unwrap();
    assert_eq!(exe, std::path::Path::new("/asbx"), "the agent's executable");
    let maps = std::fs::read_to_string(format!("/proc/{agent}/maps")).unwrap();
    let files: Vec<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.starts_with('/'))
        .collect();
    assert!(
        files.contains(&"/asbx"),
        "control: the binary is mapped: {maps}"
    );
    for path in files {
        assert!(
            path == "/asbx" || path.starts_with("/usr/") || path.starts_with("/lib"),
            "the agent maps {path}: {maps}"
        );
    }
    drop(runner);
}
