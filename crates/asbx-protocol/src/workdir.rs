//! A chat's working directory kept between turns (CONTRACT §11): the
//! manifest the runner captures when a turn ends and restores into the
//! next turn's sandbox, and the routes and limits both ends agree on.
//!
//! A manifest lists folders, regular files (by SHA-256, the bytes stored
//! once in the workspace's blob store) and symlinks, kept as links (their
//! targets are never followed, on capture or restore). Paths are relative
//! and checked by [`check_path`] on both ends.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Longest path in a manifest, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest symlink target kept, in bytes.
pub const MAX_LINK_BYTES: usize = 4096;
/// Default bound on the entries a snapshot may hold.
pub const DEFAULT_MAX_ENTRIES: usize = 10_000;
/// Default bound on a snapshot's total file bytes (the default disk cap).
pub const DEFAULT_MAX_BYTES: u64 = 1024 * 1024 * 1024;

/// The runner's routes below a dispatch's `agent_url`, behind the
/// dispatch's `workdir.token` (never handed to the sandbox).
pub mod routes {
    /// `POST`: `{"hashes": [..]}` → `{"missing": [..]}`.
    pub const MISSING: &str = "workdir/missing";
    /// `PUT {BLOBS}/{sha256}`: one file's bytes; `GET`: the same, for a
    /// hash the dispatch's restore names.
    pub const BLOBS: &str = "workdir/blobs";
    /// `POST`: a [`super::SnapshotReport`], once the sandbox is gone.
    pub const SNAPSHOT: &str = "workdir/snapshot";
}

/// One entry of a working directory.
///
/// - `path`: relative, `/`-separated ([`check_path`]).
/// - `mode`: the permission bits (`0o7777` masked to `0o777`).
/// - `size`, `sha256`: a regular file's length and hex SHA-256.
/// - `target`: a symlink's target, kept as text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "camelCase", deny_unknown_fields)]
pub enum WorkdirEntry {
    Dir {
        path: String,
        mode: u32,
    },
    File {
        path: String,
        mode: u32,
        size: u64,
        sha256: String,
    },
    Symlink {
        path: String,
        target: String,
    },
}

impl WorkdirEntry {
    pub fn path(&self) -> &str {
        match self {
            WorkdirEntry::Dir { path, .. }
            | WorkdirEntry::File { path, .. }
            | WorkdirEntry::Symlink { path, .. } => path,
        }
    }
}

/// A working directory: parents listed before their children.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkdirManifest {
    pub entries: Vec<WorkdirEntry>,
}

impl WorkdirManifest {
    /// Total bytes of its files.
    pub fn bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| match e {
                WorkdirEntry::File { size, .. } => *size,
                _ => 0,
            })
            .sum()
    }

    /// Its distinct file hashes.
    pub fn hashes(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .entries
            .iter()
            .filter_map(|e| match e {
                WorkdirEntry::File { sha256, .. } => Some(sha256.clone()),
                _ => None,
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Leaves out the entries [`is_installed`] names (a snapshot taken
    /// before they were left out of captures still lists them).
    pub fn drop_installed(&mut self) {
        self.entries.retain(|e| !is_installed(e.path()));
    }

    /// Checks every entry: paths ([`check_path`]), hashes, modes, each
    /// parent listed as a folder before its children, no path twice, at
    /// most `max_entries`.
    pub fn check(&self, max_entries: usize) -> Result<(), String> {
        if self.entries.len() > max_entries {
            return Err(format!("more than {max_entries} entries"));
        }
        let mut dirs = std::collections::HashSet::new();
        let mut seen = std::collections::HashSet::new();
        for e in &self.entries {
            let path = e.path();
            check_path(path).map_err(|m| format!("{path:?}: {m}"))?;
            if !seen.insert(path) {
                return Err(format!("{path:?}: listed twice"));
            }
            if let Some((parent, _)) = path.rsplit_once('/')
                && !dirs.contains(parent)
            {
                return Err(format!("{path:?}: its folder is not listed before it"));
            }
            match e {
                WorkdirEntry::Dir { mode, .. } => {
                    check_mode(*mode)?;
                    dirs.insert(path);
                }
                WorkdirEntry::File { mode, sha256, .. } => {
                    check_mode(*mode)?;
                    if !is_sha256(sha256) {
                        return Err(format!("{path:?}: sha256 must be 64 lowercase hex digits"));
                    }
                }
                WorkdirEntry::Symlink { target, .. } => {
                    if target.is_empty() || target.len() > MAX_LINK_BYTES || target.contains('\0') {
                        return Err(format!("{path:?}: bad symlink target"));
                    }
                }
            }
        }
        Ok(())
    }
}

fn check_mode(mode: u32) -> Result<(), String> {
    if mode > 0o777 {
        return Err(format!("mode {mode:o} is more than 0777"));
    }
    Ok(())
}

/// Whether `path` is in the folder the agent installs skill bundles into at
/// every run's start ([`crate::rules::skills::DIR`]): made from the run's
/// config, not the chat's files, so neither kept nor restored. Restoring
/// it would also hand the tool user files the agent then writes.
pub fn is_installed(path: &str) -> bool {
    let dir = crate::rules::skills::DIR;
    path.strip_prefix(dir)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Whether `s` is a lowercase hex SHA-256.
pub fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A manifest path: relative, no empty, `.` or `..` components, no control
/// characters, at most [`MAX_PATH_BYTES`], components at most 255 bytes.
pub fn check_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(format!("longer than {MAX_PATH_BYTES} bytes"));
    }
    if path.starts_with('/') {
        return Err("must be relative".to_owned());
    }
    if path.chars().any(char::is_control) {
        return Err("must not contain control characters".to_owned());
    }
    for c in path.split('/') {
        match c {
            "" | "." | ".." => return Err("must not contain empty, . or .. components".to_owned()),
            c if c.len() > crate::rules::names::MAX_COMPONENT_BYTES => {
                return Err("has a component longer than 255 bytes".to_owned());
            }
            _ => {}
        }
    }
    Ok(())
}

/// `workdir` of a dispatch: the runner captures the sandbox's working
/// directory when the turn ends and, with `restore`, starts it from that.
///
/// - `token`: the bearer of the `workdir/...` routes ([`routes`]).
/// - `restore`: the directory to restore before the agent starts.
/// - `max_entries`, `max_bytes`: the capture's bounds.
/// - `capture`: whether the directory is captured and sent when the turn
///   ends (default `true`); `false` for a run that only starts from a
///   chat's directory (`POST /api/runs` with `workdir.from`), which keeps
///   nothing (left out of the JSON when `true`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkdirDispatch {
    pub token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<WorkdirManifest>,
    #[serde(default = "default_max_entries")]
    pub max_entries: usize,
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
    #[serde(default = "default_capture", skip_serializing_if = "is_true")]
    pub capture: bool,
}

fn default_capture() -> bool {
    true
}

// serde's `skip_serializing_if` passes a reference.
fn is_true(v: &bool) -> bool {
    *v
}

fn default_max_entries() -> usize {
    DEFAULT_MAX_ENTRIES
}

fn default_max_bytes() -> u64 {
    DEFAULT_MAX_BYTES
}

/// The body of `POST {agent_url}/workdir/snapshot`: the captured manifest
/// (its blobs already stored), or why the capture was refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotReport {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<WorkdirManifest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `POST {agent_url}/workdir/missing`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MissingRequest {
    pub hashes: Vec<String>,
}

/// Its answer: the hashes the workspace lacks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MissingResponse {
    pub missing: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> WorkdirEntry {
        WorkdirEntry::File {
            path: path.into(),
            mode: 0o644,
            size: 1,
            sha256: "a".repeat(64),
        }
    }

    #[test]
    fn paths_stay_inside() {
        for bad in [
            "",
            "/etc/passwd",
            "a/../b",
            "..",
            "./a",
            "a//b",
            "a/",
            "a\nb",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
        for good in ["a", "src/a.py", ".git/HEAD", "a\\b", "é"] {
            assert!(check_path(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn the_installed_skills_are_not_kept() {
        for inside in [".skills", ".skills/x/SKILL.md"] {
            assert!(is_installed(inside), "{inside}");
        }
        for outside in [".skillsx", "skills/a", "a/.skills/b", ".skill"] {
            assert!(!is_installed(outside), "{outside}");
        }
        let dir = |path: &str| WorkdirEntry::Dir {
            path: path.into(),
            mode: 0o755,
        };
        let mut m = WorkdirManifest {
            entries: vec![
                dir(".skills"),
                dir(".skills/x"),
                file(".skills/x/SKILL.md"),
                file(".skillsx"),
                file("a"),
            ],
        };
        m.drop_installed();
        let left: Vec<&str> = m.entries.iter().map(WorkdirEntry::path).collect();
        assert_eq!(left, [".skillsx", "a"]);
    }

    #[test]
    fn manifests_list_parents_first_and_bound_entries() {
        let dir = WorkdirEntry::Dir {
            path: "src".into(),
            mode: 0o755,
        };
        let ok = WorkdirManifest {
            entries: vec![dir.clone(), file("src/a.py")],
        };
        assert_eq!(ok.check(10), Ok(()));
        assert!(ok.check(1).is_err());
        let orphan = WorkdirManifest {
            entries: vec![file("src/a.py")],
        };
        assert!(orphan.check(10).is_err());
        let twice = WorkdirManifest {
            entries: vec![dir.clone(), dir],
        };
        assert!(twice.check(10).is_err());
        let mode = WorkdirManifest {
            entries: vec![WorkdirEntry::Dir {
                path: "x".into(),
                mode: 0o4755,
            }],
        };
        assert!(mode.check(10).is_err());
    }
}
