//! `asbx doctor`: what this host offers each isolation profile, and the
//! command or setting that fixes what is missing.
//!
//! The isolation layers come from the jail's own startup probes (`asbx jail
//! --check`, the report `asbx up` and `asbx runner` refuse to start on), so
//! the doctor and the runner never disagree; the doctor adds the host
//! settings around them: the user-namespace sysctls, `kernel.pid_max`, the
//! open-file limit, the data folder's file system and, when given, the
//! runners' reachability from the workspace (`SANDBOX_URL`). Each row is
//! ✓ or ✗ with the fix; the exit status is 1 when the chosen profile (the
//! default, `strict`, unless `--profile` or `ASBX_PROFILE` says otherwise)
//! can't run here, or the data folder or a runner is unusable.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use asbx_protocol::jail::{IsolationProfile, JailProfile, Layer, LayerReport};

use crate::cli::DoctorArgs;
use crate::cmd::{FDS_PER_SANDBOX, layer_report, sandbox_exe};

/// How long a runner may take to answer `/healthz`.
const RUNNER_TIMEOUT: Duration = Duration::from_secs(3);
/// Free space under which the data folder gets a ✗ (not fatal).
const LOW_SPACE_BYTES: u64 = 512 << 20;
/// Descriptors the runner keeps for itself beside its sandboxes'.
const OWN_FDS: u64 = 1024;

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    ok: bool,
    /// What was checked, and what was found.
    what: String,
    /// The exact command or setting that fixes it, when not ok.
    fix: Option<String>,
    /// A failure means the chosen profile can't run (else it is a limit).
    fatal: bool,
}

impl Row {
    fn pass(what: impl Into<String>) -> Row {
        Row {
            ok: true,
            what: what.into(),
            fix: None,
            fatal: false,
        }
    }

    fn fail(what: impl Into<String>, fix: impl Into<String>, fatal: bool) -> Row {
        Row {
            ok: false,
            what: what.into(),
            fix: Some(fix.into()),
            fatal,
        }
    }
}

/// A titled group of rows.
#[derive(Debug)]
struct Section {
    title: String,
    rows: Vec<Row>,
}

/// `asbx doctor`.
pub(crate) fn run(args: &DoctorArgs) -> ExitCode {
    let chosen = args.profile.as_str();
    let mut sections = Vec::new();
    match IsolationProfile::parse(chosen) {
        Some(_) => {}
        None => {
            eprintln!(
                "asbx doctor: unknown profile {chosen:?}: use strict, namespaces or unconfined"
            );
            return ExitCode::from(2);
        }
    }
    let exe = sandbox_exe();
    for profile in [JailProfile::Strict, JailProfile::Namespaces] {
        let name = IsolationProfile::Jail(profile).as_str();
        let fatal = name == chosen;
        let rows = match exe
            .as_ref()
            .map_err(|e| format!("{e:#}"))
            .and_then(|exe| layer_report(exe, name).map_err(|e| format!("{e:#}")))
        {
            Ok(report) => layer_rows(&report, fatal),
            Err(e) => vec![Row::fail(
                format!("the layer probe: {e}"),
                "reinstall asbx (the `asbx-sandbox` binary beside `asbx`, or `asbx` itself, runs the probe)",
                fatal,
            )],
        };
        let title = match (name == chosen, profile) {
            (true, _) => format!("profile {name} (the one chosen)"),
            (false, JailProfile::Strict) => format!("profile {name} (the strongest)"),
            (false, JailProfile::Namespaces) => {
                format!("profile {name} (weaker: no cgroups, no Landlock)")
            }
        };
        sections.push(Section { title, rows });
    }
    let mut host = userns_rows();
    host.push(pid_max_row(args.max_sandboxes, args.pids));
    host.push(nofile_row(args.max_sandboxes));
    host.push(favordynmods_row(
        &std::fs::read_to_string("/proc/self/mounts").unwrap_or_default(),
    ));
    host.push(data_row(&args.data));
    sections.push(Section {
        title: "host".into(),
        rows: host,
    });
    sections.push(Section {
        title: "runners (from the workspace)".into(),
        rows: runner_rows(&args.sandbox_url),
    });
    let failed = sections
        .iter()
        .flat_map(|s| &s.rows)
        .any(|r| !r.ok && r.fatal);
    let mut out = render(&sections);
    if failed {
        let _ = writeln!(
            out,
            "\n✗ profile `{chosen}` can't run here: fix the rows marked ✗ (needed) above, \
             or pick a weaker profile (--profile namespaces, or --profile unconfined) if you accept that."
        );
    } else {
        let _ = writeln!(out, "\n✓ profile `{chosen}` can run here.");
    }
    print_out(&out);
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn print_out(text: &str) {
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn render(sections: &[Section]) -> String {
    let mut out = String::from("asbx doctor: what this host offers each isolation profile\n");
    for s in sections {
        let _ = writeln!(out, "\n{}:", s.title);
        for r in &s.rows {
            let mark = if r.ok { "✓" } else { "✗" };
            let needed = if !r.ok && r.fatal { " (needed)" } else { "" };
            let _ = writeln!(out, "  {mark} {}{needed}", r.what);
            if let Some(fix) = &r.fix {
                let _ = writeln!(out, "      fix: {fix}");
            }
        }
    }
    out
}

/// The jail's report as rows: a layer the profile does not need is listed,
/// never fatal.
fn layer_rows(report: &LayerReport, chosen: bool) -> Vec<Row> {
    report
        .layers
        .iter()
        .map(|l| {
            let what = match (&l.detail, l.required) {
                (Some(d), true) => format!("{}: {d}", l.name),
                (Some(d), false) => format!("{}: {d} (not needed by this profile)", l.name),
                (None, true) => l.name.clone(),
                (None, false) => format!("{} (not needed by this profile)", l.name),
            };
            if l.available {
                Row::pass(what)
            } else {
                Row::fail(what, layer_fix(l), chosen && l.required)
            }
        })
        .collect()
}

/// The fix for a missing layer of the jail's report.
fn layer_fix(l: &Layer) -> String {
    let ns = |config: &str| {
        format!(
            "a kernel built with {config}=y; in a container, run it with \
             `--cap-add SYS_ADMIN --security-opt seccomp=unconfined --security-opt apparmor=unconfined` \
             (Kubernetes: `privileged: true`, docs/deploy.md)"
        )
    };
    match l.name.as_str() {
        "root" => "run the runner as root: `sudo asbx up` (or the systemd unit / container as uid 0, docs/deploy.md)".into(),
        "user_namespace" => format!(
            "`sudo sysctl -w user.max_user_namespaces=15000`{}; {}",
            if read_sysctl("kernel/unprivileged_userns_clone").is_some() {
                " and `sudo sysctl -w kernel.unprivileged_userns_clone=1`"
            } else {
                ""
            },
            ns("CONFIG_USER_NS")
        ),
        "pid_namespace" => ns("CONFIG_PID_NS"),
        "mount_namespace" => ns("CONFIG_NAMESPACES"),
        "network_namespace" => ns("CONFIG_NET_NS"),
        "ipc_namespace" => ns("CONFIG_IPC_NS"),
        "uts_namespace" => ns("CONFIG_UTS_NS"),
        "cgroup_namespace" => ns("CONFIG_CGROUPS"),
        "pivot_root" => "mounts must be allowed: run as root on the host, or the container with \
                         `--cap-add SYS_ADMIN --security-opt apparmor=unconfined`"
            .into(),
        "cgroups" => "cgroup v2: delegate the controllers, `echo '+memory +pids +cpu' | sudo tee \
                      /sys/fs/cgroup/cgroup.subtree_control` (under systemd: `Delegate=yes` in the \
                      unit); cgroup v1: mount the memory, pids and cpu hierarchies under \
                      /sys/fs/cgroup; in a container: `--cgroupns=host` with /sys/fs/cgroup \
                      writable. Or run `--profile namespaces` (no cgroups)"
            .into(),
        "seccomp" => "a kernel built with CONFIG_SECCOMP_FILTER=y; in a container, a seccomp \
                      profile that allows seccomp(2) and prctl(2) (`--security-opt seccomp=unconfined`)"
            .into(),
        "landlock" => "Landlock (Linux 5.13+, CONFIG_SECURITY_LANDLOCK=y) must be an active LSM: \
                       add `lsm=landlock,lockdown,yama,integrity,apparmor,bpf` to \
                       GRUB_CMDLINE_LINUX in /etc/default/grub, `sudo update-grub`, reboot. \
                       Or run `--profile namespaces` (no Landlock)"
            .into(),
        other => format!("see docs/deploy.md for the `{other}` layer"),
    }
}

/// A value under `/proc/sys`, trimmed.
fn read_sysctl(path: &str) -> Option<String> {
    std::fs::read_to_string(Path::new("/proc/sys").join(path))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// The sysctls that switch user namespaces off.
fn userns_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    match read_sysctl("user/max_user_namespaces").and_then(|v| v.parse::<u64>().ok()) {
        Some(0) => rows.push(Row::fail(
            "user.max_user_namespaces = 0: user namespaces are off",
            "`sudo sysctl -w user.max_user_namespaces=15000` (persist it in /etc/sysctl.d/90-asbx.conf)",
            false,
        )),
        Some(n) => rows.push(Row::pass(format!("user.max_user_namespaces = {n}"))),
        None => rows.push(Row::fail(
            "user.max_user_namespaces: unreadable (a kernel without user namespaces?)",
            "a kernel built with CONFIG_USER_NS=y",
            false,
        )),
    }
    if let Some(v) = read_sysctl("kernel/apparmor_restrict_unprivileged_userns") {
        let what = format!("kernel.apparmor_restrict_unprivileged_userns = {v}");
        // The runner runs as root: the restriction binds only unprivileged
        // callers, so it is reported, never fatal.
        rows.push(if v == "0" {
            Row::pass(what)
        } else {
            Row::fail(
                format!("{what} (binds only a runner that is not root)"),
                "`sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`",
                false,
            )
        });
    }
    rows
}

/// `kernel.pid_max` against the most processes the sandboxes may hold.
fn pid_max_row(max_sandboxes: usize, pids: u64) -> Row {
    let want = (max_sandboxes as u64)
        .saturating_mul(pids)
        .saturating_add(OWN_FDS);
    match read_sysctl("kernel/pid_max").and_then(|v| v.parse::<u64>().ok()) {
        Some(n) if n >= want => Row::pass(format!(
            "kernel.pid_max = {n} (room for {max_sandboxes} sandboxes × {pids} processes)"
        )),
        Some(n) => Row::fail(
            format!(
                "kernel.pid_max = {n}: {max_sandboxes} sandboxes × {pids} processes need {want}"
            ),
            format!(
                "`sudo sysctl -w kernel.pid_max={}`, or fewer sandboxes (ASBX_MAX_SANDBOXES)",
                want.next_power_of_two().clamp(32_768, 4_194_304)
            ),
            false,
        ),
        None => Row::fail(
            "kernel.pid_max: unreadable",
            "mount /proc (the runner reads it)",
            false,
        ),
    }
}

/// The open-file limit against what the sandboxes hold.
fn nofile_row(max_sandboxes: usize) -> Row {
    use nix::sys::resource::{Resource, getrlimit};
    let want = (max_sandboxes as u64)
        .saturating_mul(FDS_PER_SANDBOX)
        .saturating_add(OWN_FDS);
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if hard >= want => Row::pass(format!(
            "open files: soft {soft}, hard {hard} (the runner raises the soft limit; \
             {max_sandboxes} sandboxes need {want})"
        )),
        Ok((soft, hard)) => Row::fail(
            format!("open files: soft {soft}, hard {hard}: {max_sandboxes} sandboxes need {want}"),
            format!(
                "`ulimit -Hn {want}` before starting (systemd: `LimitNOFILE={want}`; \
                 containers: `--ulimit nofile={want}`), or fewer sandboxes (ASBX_MAX_SANDBOXES)"
            ),
            false,
        ),
        Err(e) => Row::fail(
            format!("open files: {e}"),
            "check the process limits",
            false,
        ),
    }
}

/// Whether a cgroup hierarchy is mounted with `favordynmods`, read from
/// `mounts` (`/proc/self/mounts`). Without it a task moving between cgroups
/// (a cold sandbox joining its own) takes the kernel's cgroup-wide
/// threadgroup lock for writing, which waits out a whole RCU grace period
/// when no move happened within the last one, holding the cgroup lock all
/// the while (measured: up to 20 ms; a cold dispatch's p99 4.6 times its
/// median here, 2 times with it). The setting is the kernel's, for every
/// hierarchy; only a cgroup2 mount takes it (a v1 remount refuses it).
fn favordynmods_row(mounts: &str) -> Row {
    let cgroups: Vec<(&str, &str, &str)> = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [_, at, kind @ ("cgroup" | "cgroup2"), opts, ..] => Some((*at, *kind, *opts)),
                _ => None,
            }
        })
        .collect();
    if cgroups.is_empty() {
        return Row::pass("cgroups: none mounted (the strict profile needs them: see above)");
    }
    if let Some((at, _, _)) = cgroups
        .iter()
        .find(|(_, _, opts)| opts.split(',').any(|o| o == "favordynmods"))
    {
        return Row::pass(format!(
            "cgroups: favordynmods on {at} (a sandbox joins its cgroups without waiting for RCU)"
        ));
    }
    let fix = match cgroups.iter().find(|(_, kind, _)| *kind == "cgroup2") {
        Some((at, _, _)) => format!("`sudo mount -o remount,favordynmods {at}`"),
        None => "`sudo mkdir -p /run/asbx-cgroup2 && sudo mount -t cgroup2 -o favordynmods none \
                 /run/asbx-cgroup2` (an empty cgroup2 mount is enough)"
            .to_owned(),
    };
    Row::fail(
        "cgroups: no hierarchy has favordynmods: a cold sandbox joining its cgroups can wait \
         out an RCU grace period (up to 20 ms measured) and hold the cgroup lock meanwhile",
        format!(
            "{fix}: the kernel's setting for every hierarchy (forks and exits cost a little more); \
             cold p99 went from 4.6 to 2 times the median (docs/performance.md)"
        ),
        false,
    )
}

/// The nearest folder of `path` that exists (itself, or an ancestor).
fn existing_ancestor(path: &Path) -> Option<PathBuf> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().ok()?.join(path)
    };
    abs.ancestors().find(|p| p.is_dir()).map(Path::to_path_buf)
}

/// The data folder: writable, on a local file system, with room.
fn data_row(data: &Path) -> Row {
    use nix::sys::statfs::statfs;
    use nix::unistd::{AccessFlags, access};
    let shown = data.display();
    let fix_owner = format!(
        "`sudo mkdir -p {shown} && sudo chown $(id -u) {shown}`, or point ASBX_DATA (--data) at a writable local folder"
    );
    let Some(dir) = existing_ancestor(data) else {
        return Row::fail(
            format!("data folder {shown}: no folder of it exists"),
            fix_owner,
            true,
        );
    };
    if data.exists() && !data.is_dir() {
        return Row::fail(
            format!("data folder {shown}: not a folder"),
            fix_owner,
            true,
        );
    }
    if access(dir.as_path(), AccessFlags::W_OK | AccessFlags::X_OK).is_err() {
        return Row::fail(
            format!("data folder {shown}: {} is not writable", dir.display()),
            fix_owner,
            true,
        );
    }
    let fs = match statfs(dir.as_path()) {
        Ok(fs) => fs,
        Err(e) => return Row::fail(format!("data folder {shown}: {e}"), fix_owner, true),
    };
    let kind = fs_name(fs.filesystem_type().0 as i64);
    let free = fs.blocks_available().saturating_mul(fs.block_size() as u64);
    let what = format!(
        "data folder {shown}: {kind}, {} MiB free, writable",
        free >> 20
    );
    if matches!(kind, "nfs" | "cifs" | "smb2" | "fuse") {
        return Row::fail(
            format!("{what}: SQLite's WAL needs a local file system"),
            "point ASBX_DATA (--data) at a local disk, or use PostgreSQL (DATABASE_URL)",
            false,
        );
    }
    if kind == "tmpfs" {
        return Row::fail(
            format!("{what}: tmpfs forgets everything at reboot"),
            "point ASBX_DATA (--data) at a folder on a disk",
            false,
        );
    }
    if free < LOW_SPACE_BYTES {
        return Row::fail(
            format!("{what}: less than {} MiB free", LOW_SPACE_BYTES >> 20),
            "free some space there, or point ASBX_DATA (--data) elsewhere",
            false,
        );
    }
    Row::pass(what)
}

/// A file system's name from its magic number.
fn fs_name(magic: i64) -> &'static str {
    match magic {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlay",
        0x6969 => "nfs",
        0xFF53_4D42 => "cifs",
        0xFE53_4D42 => "smb2",
        0x6573_5546 => "fuse",
        0x2FC1_2FC1 => "zfs",
        _ => "a file system",
    }
}

/// Each runner's `GET /healthz`, as the workspace would ask it.
fn runner_rows(urls: &[String]) -> Vec<Row> {
    if urls.is_empty() {
        return vec![Row::pass(
            "none given (SANDBOX_URL): `asbx up` runs its own runner",
        )];
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return vec![Row::fail(
                format!("runners: cannot start the runtime: {e}"),
                "check the process limits",
                true,
            )];
        }
    };
    rt.block_on(async {
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(RUNNER_TIMEOUT)
            .build();
        let Ok(client) = client else {
            return vec![Row::fail("runners: no HTTP client", "reinstall asbx", true)];
        };
        let mut rows = Vec::new();
        for url in urls {
            rows.push(runner_row(&client, url).await);
        }
        rows
    })
}

async fn runner_row(client: &reqwest::Client, url: &str) -> Row {
    let fix = format!(
        "start `asbx runner` there (ASBX_LISTEN), open the way from this host to it, \
         or correct SANDBOX_URL ({url})"
    );
    // The runner's routes sit under its URL's path, as the workspace joins them.
    let health = url::Url::parse(url).and_then(|mut base| {
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        base.join("healthz")
    });
    let health = match health {
        Ok(h) if matches!(h.scheme(), "http" | "https") => h,
        _ => return Row::fail(format!("runner {url}: not an http(s) URL"), fix, true),
    };
    match client.get(health).send().await {
        Ok(r) if r.status().is_success() => {
            let body: serde_json::Value = r.json().await.unwrap_or_default();
            let field = |k: &str| body.get(k).map_or("?".to_owned(), ToString::to_string);
            Row::pass(format!(
                "runner {url}: reachable (profile {}, {} free of {})",
                body.get("profile").and_then(|v| v.as_str()).unwrap_or("?"),
                field("free"),
                field("capacity")
            ))
        }
        Ok(r) => Row::fail(
            format!("runner {url}: /healthz answered {}", r.status()),
            fix,
            true,
        ),
        Err(e) => Row::fail(
            format!("runner {url}: unreachable ({})", error_chain(&e)),
            fix,
            true,
        ),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let _ = write!(out, ": {c}");
        cur = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(layers: &[(&str, bool, bool)]) -> LayerReport {
        LayerReport {
            layers: layers
                .iter()
                .map(|(name, available, required)| Layer {
                    name: (*name).into(),
                    available: *available,
                    required: *required,
                    detail: None,
                })
                .collect(),
        }
    }

    #[test]
    fn a_missing_needed_layer_of_the_chosen_profile_is_fatal_with_its_fix() {
        let r = report(&[
            ("seccomp", true, true),
            ("landlock", false, true),
            ("cgroups", false, false),
        ]);
        let rows = layer_rows(&r, true);
        assert!(rows[0].ok);
        assert!(!rows[1].ok && rows[1].fatal);
        assert!(rows[1].fix.as_deref().unwrap().contains("lsm=landlock"));
        // Not needed by the profile: reported, not fatal.
        assert!(!rows[2].ok && !rows[2].fatal);
        // Another profile than the chosen one: never fatal.
        assert!(layer_rows(&r, false).iter().all(|r| !r.fatal));
        let text = render(&[Section {
            title: "profile strict".into(),
            rows,
        }]);
        assert!(text.contains("✓ seccomp"), "{text}");
        assert!(text.contains("✗ landlock (needed)"), "{text}");
        assert!(text.contains("      fix: Landlock"), "{text}");
    }

    #[test]
    fn every_layer_of_the_probe_has_a_fix_of_its_own() {
        for name in [
            "root",
            "user_namespace",
            "pid_namespace",
            "mount_namespace",
            "network_namespace",
            "ipc_namespace",
            "uts_namespace",
            "cgroup_namespace",
            "pivot_root",
            "cgroups",
            "seccomp",
            "landlock",
        ] {
            let fix = layer_fix(&Layer {
                name: name.into(),
                available: false,
                required: true,
                detail: None,
            });
            assert!(!fix.starts_with("see docs/deploy.md"), "{name}: {fix}");
        }
    }

    #[test]
    fn pid_max_and_descriptors_are_measured_against_the_sandboxes() {
        assert!(pid_max_row(1, 1).ok);
        let huge = pid_max_row(1 << 20, 1 << 20);
        assert!(!huge.ok && !huge.fatal, "{huge:?}");
        assert!(huge.fix.unwrap().contains("kernel.pid_max=4194304"));
        let many = nofile_row(usize::MAX / 16);
        assert!(!many.ok && many.fix.unwrap().contains("LimitNOFILE="));
    }

    #[test]
    fn favordynmods_is_found_on_any_cgroup_mount_and_its_fix_names_a_cgroup2_one() {
        let v1 = "cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0\n";
        let v2 = "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";
        let on = "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime,favordynmods 0 0\n";
        let row = favordynmods_row(&format!("{v1}{v2}"));
        assert!(!row.ok && !row.fatal, "{row:?}");
        assert!(
            row.fix
                .unwrap()
                .contains("mount -o remount,favordynmods /sys/fs/cgroup/unified")
        );
        let row = favordynmods_row(v1);
        assert!(
            !row.ok
                && row
                    .fix
                    .unwrap()
                    .contains("mount -t cgroup2 -o favordynmods")
        );
        let row = favordynmods_row(&format!("{v1}{on}"));
        assert!(
            row.ok && row.what.contains("/sys/fs/cgroup/unified"),
            "{row:?}"
        );
        // Only the options field counts, not a path that holds the word.
        let row = favordynmods_row("cgroup2 /x/favordynmods cgroup2 rw 0 0\n");
        assert!(!row.ok, "{row:?}");
    }

    #[test]
    fn an_unusable_data_folder_is_fatal() {
        let dir = tempfile::tempdir().unwrap();
        assert!(data_row(dir.path()).ok || !data_row(dir.path()).fatal);
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let row = data_row(&file);
        assert!(!row.ok && row.fatal, "{row:?}");
    }
}
