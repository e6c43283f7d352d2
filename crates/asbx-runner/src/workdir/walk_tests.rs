//! Tests of the host-side walk and restore: links kept as links, bounds,
//! nothing written through a link, a restored file not read again.

use std::os::unix::fs::{PermissionsExt, symlink};

use asbx_protocol::workdir::WorkdirEntry;
use nix::fcntl::{OFlag, open};
use nix::sys::stat::Mode;

use super::*;
use crate::workdir::restore;

fn root(dir: &std::path::Path) -> OwnedFd {
    open(dir, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap()
}

const BIG: Bounds = Bounds {
    max_entries: 1000,
    max_bytes: 1 << 30,
};

#[test]
fn captures_files_folders_and_links_as_links() {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("src/deep")).unwrap();
    std::fs::write(t.path().join("src/a.py"), b"print(1)\n").unwrap();
    std::fs::write(t.path().join("src/deep/b"), b"print(1)\n").unwrap();
    std::fs::set_permissions(
        t.path().join("src/a.py"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    symlink("/etc/shadow", t.path().join("shadow")).unwrap();
    symlink("/", t.path().join("slash")).unwrap();
    std::fs::hard_link(t.path().join("src/a.py"), t.path().join("hard")).unwrap();
    nix::unistd::mkfifo(&t.path().join("fifo"), Mode::from_bits_truncate(0o644)).unwrap();
    // The agent's installed skills are left out at the top only.
    std::fs::create_dir_all(t.path().join(".skills/x")).unwrap();
    std::fs::write(t.path().join(".skills/x/SKILL.md"), b"# x\n").unwrap();
    std::fs::create_dir_all(t.path().join("src/deep/.skills")).unwrap();

    let c = capture(&root(t.path()), BIG, &Known::new()).unwrap();
    let paths: Vec<&str> = c.manifest.entries.iter().map(|e| e.path()).collect();
    assert_eq!(
        paths,
        [
            "hard",
            "shadow",
            "slash",
            "src",
            "src/a.py",
            "src/deep",
            "src/deep/.skills",
            "src/deep/b"
        ]
    );
    assert_eq!(c.manifest.check(1000), Ok(()));
    assert!(c.manifest.entries.contains(&WorkdirEntry::Symlink {
        path: "shadow".into(),
        target: "/etc/shadow".into()
    }));
    // Nothing was read through the link to `/`: only the three files.
    assert_eq!(c.hashed, 3);
    assert_eq!(c.manifest.hashes().len(), 1, "same bytes, one blob");
    assert!(matches!(
        &c.manifest.entries[4],
        WorkdirEntry::File {
            mode: 0o755,
            size: 9,
            ..
        }
    ));
}

#[test]
fn counts_and_bytes_are_bounded() {
    let t = tempfile::tempdir().unwrap();
    for i in 0..20 {
        std::fs::write(t.path().join(format!("f{i}")), vec![b'x'; 100]).unwrap();
    }
    let few = Bounds {
        max_entries: 10,
        max_bytes: 1 << 30,
    };
    assert_eq!(
        capture(&root(t.path()), few, &Known::new()).unwrap_err(),
        CaptureError::TooManyEntries(10)
    );
    let small = Bounds {
        max_entries: 100,
        max_bytes: 1000,
    };
    assert!(matches!(
        capture(&root(t.path()), small, &Known::new()).unwrap_err(),
        CaptureError::TooManyBytes(_)
    ));
}

#[test]
fn restore_writes_inside_and_a_round_trip_is_exact() {
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(src.path().join("src")).unwrap();
    std::fs::write(src.path().join("src/a.py"), b"hello").unwrap();
    symlink("../outside", src.path().join("src/up")).unwrap();
    let c = capture(&root(src.path()), BIG, &Known::new()).unwrap();

    let dst = tempfile::tempdir().unwrap();
    let fd = root(dst.path());
    restore::make_tree(&fd, &c.manifest, None).unwrap();
    let mut f = restore::create_file(&fd, "src/a.py", 0o644, None).unwrap();
    std::io::Write::write_all(&mut f, b"hello").unwrap();
    let stamp = restore::stamp(&f).unwrap();
    drop(f);
    assert_eq!(
        std::fs::read_link(dst.path().join("src/up"))
            .unwrap()
            .to_str(),
        Some("../outside")
    );

    // A file whose restore stamp still holds is not read again; one whose
    // bytes changed is.
    let sha = c.manifest.hashes()[0].clone();
    let known = Known::from([("src/a.py".to_owned(), (stamp, sha.clone()))]);
    let again = capture(&fd, BIG, &known).unwrap();
    assert_eq!(again.hashed, 0);
    assert_eq!(again.manifest, c.manifest);
    std::fs::write(dst.path().join("src/a.py"), b"HELLO").unwrap();
    let changed = capture(&fd, BIG, &known).unwrap();
    assert_eq!(changed.hashed, 1);
    assert_ne!(changed.manifest.hashes()[0], sha);
}

#[test]
fn restore_never_goes_through_a_link() {
    let outside = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    symlink(outside.path(), dst.path().join("src")).unwrap();
    let fd = root(dst.path());
    // A file below a folder that is a link: refused, nothing written outside.
    assert!(restore::create_file(&fd, "src/a.py", 0o644, None).is_err());
    // A file over an existing link: refused too.
    symlink(outside.path().join("x"), dst.path().join("x")).unwrap();
    assert!(restore::create_file(&fd, "x", 0o644, None).is_err());
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    // Positive control: a plain path is written.
    assert!(restore::create_file(&fd, "y", 0o644, None).is_ok());
}
