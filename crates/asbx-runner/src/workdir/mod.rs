//! A chat's working directory kept between turns (CONTRACT §11), on the
//! runner's side: restore the dispatch's manifest into the fresh sandbox's
//! working directory before the agent gets its bootstrap, and capture it
//! when the turn ended, once the sandbox's processes are gone, both from
//! the host through one descriptor of that directory ([`walk`],
//! [`restore`]). Bytes go to and come from the workspace's blob store
//! (`{agent_url}/workdir/...`, behind the dispatch's `workdir.token`, which
//! the sandbox never sees); a capture sends only the blobs the workspace
//! says it lacks.

mod restore;
mod walk;

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

use asbx_protocol::workdir::{
    MissingRequest, MissingResponse, SnapshotReport, WorkdirDispatch, WorkdirEntry, routes,
};
use futures::StreamExt as _;
use nix::fcntl::{OFlag, open};
use nix::sys::stat::Mode;
use tokio::io::AsyncWriteExt as _;

pub(crate) use restore::Owner;
use walk::{Bounds, Captured, Known, capture};

/// How many blobs move at once.
const PARALLEL: usize = 8;
/// How long a jail may take to finish building its root.
const READY_WAIT: Duration = Duration::from_secs(30);
/// How often a blob is asked for before the restore gives up, and the first
/// pause between tries (doubled each time: about 3 s in all). A workspace
/// node dying or a load balancer moving on answers a try with a broken
/// connection or a `5xx`; the next try reaches a live node.
const FETCH_TRIES: u32 = 5;
const FETCH_BACKOFF: Duration = Duration::from_millis(200);

/// Why a restore failed.
#[derive(Debug)]
pub enum RestoreError {
    /// The workspace did not give a blob (after a few tries).
    Fetch(String),
    /// The manifest or this host refused it.
    Local(String),
}

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreError::Fetch(e) | RestoreError::Local(e) => f.write_str(e),
        }
    }
}

/// A dispatch's working directory, held open from before the agent starts
/// until the capture, so the capture reads it after the sandbox's
/// namespaces are gone.
#[derive(Debug)]
pub struct Workdir {
    root: OwnedFd,
    spec: WorkdirDispatch,
    agent_url: String,
    client: reqwest::Client,
    known: Known,
}

impl Workdir {
    /// Opens the sandbox's working directory: the host folder of an
    /// unconfined agent, or a jail's `/work` through its init's root (once
    /// the jail has built it: init has left the host's user namespace).
    pub async fn open(
        spec: WorkdirDispatch,
        agent_url: &str,
        client: reqwest::Client,
        supervisor: Option<u32>,
        workdir: &str,
    ) -> Result<Workdir, String> {
        let path = match supervisor {
            None => Path::new(workdir).to_path_buf(),
            Some(pid) => {
                let init = wait_for_init(pid).await?;
                Path::new("/proc")
                    .join(init.to_string())
                    .join("root")
                    .join(workdir.trim_start_matches('/'))
            }
        };
        let root = open(
            &path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("opening the working directory: {e}"))?;
        Ok(Workdir {
            root,
            spec,
            agent_url: agent_url.trim_end_matches('/').to_owned(),
            client,
            known: Known::new(),
        })
    }

    /// Whether the directory is captured when the turn ends (a run that
    /// only starts from a chat's directory keeps nothing).
    pub(crate) fn captures(&self) -> bool {
        self.spec.capture
    }

    fn url(&self, route: &str) -> String {
        format!("{}/{route}", self.agent_url)
    }

    /// Restores `workdir.restore`, if any, before the agent starts.
    pub async fn restore(&mut self, owner: restore::Owner) -> Result<(), RestoreError> {
        let Some(mut manifest) = self.spec.restore.take() else {
            return Ok(());
        };
        manifest.drop_installed();
        let local = RestoreError::Local;
        manifest.check(self.spec.max_entries).map_err(local)?;
        let root = self.root.try_clone().map_err(|e| local(e.to_string()))?;
        let tree = manifest.clone();
        tokio::task::spawn_blocking(move || restore::make_tree(&root, &tree, owner))
            .await
            .map_err(|e| local(e.to_string()))?
            .map_err(|e| local(format!("restoring the working directory: {e}")))?;
        let this: &Workdir = self;
        let fetches: Vec<_> = manifest
            .entries
            .into_iter()
            .filter_map(|e| match e {
                WorkdirEntry::File {
                    path, mode, sha256, ..
                } => Some(this.fetch(path, mode, sha256, owner)),
                WorkdirEntry::Dir { .. } | WorkdirEntry::Symlink { .. } => None,
            })
            .collect();
        let mut fetches = futures::stream::iter(fetches).buffer_unordered(PARALLEL);
        let mut known = Known::new();
        while let Some(done) = fetches.next().await {
            let (path, stamp, sha) = done?;
            known.insert(path, (stamp, sha));
        }
        drop(fetches);
        self.known = known;
        Ok(())
    }

    /// Writes one file from its blob.
    async fn fetch(
        &self,
        path: String,
        mode: u32,
        sha: String,
        owner: restore::Owner,
    ) -> Result<(String, walk::Stamp, String), RestoreError> {
        let fail = |e: &dyn std::fmt::Display| format!("restoring {path}: {e}");
        let local = |e: &dyn std::fmt::Display| RestoreError::Local(fail(e));
        let res = self
            .blob(&sha)
            .await
            .map_err(|e| RestoreError::Fetch(fail(&e)))?;
        let root = self.root.try_clone().map_err(|e| local(&e))?;
        let file = restore::create_file(&root, &path, mode, owner).map_err(|e| local(&e))?;
        let mut file = tokio::fs::File::from_std(file);
        let mut body = res.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| RestoreError::Fetch(fail(&e)))?;
            file.write_all(&chunk).await.map_err(|e| local(&e))?;
        }
        let file = file.into_std().await;
        let stamp = restore::stamp(&file).map_err(|e| local(&e))?;
        Ok((path, stamp, sha))
    }

    /// The workspace's answer for blob `sha`, its body still to read; a
    /// broken connection or a `5xx` is tried again (an answer that says
    /// no, `4xx`, is not).
    async fn blob(&self, sha: &str) -> Result<reqwest::Response, String> {
        let url = self.url(&format!("{}/{sha}", routes::BLOBS));
        let mut pause = FETCH_BACKOFF;
        let mut tries = 0;
        loop {
            tries += 1;
            let why = match self
                .client
                .get(&url)
                .bearer_auth(&self.spec.token)
                .send()
                .await
            {
                Ok(res) if res.status().is_success() => return Ok(res),
                Ok(res) if !res.status().is_server_error() => {
                    return Err(format!("the workspace answered {}", res.status()));
                }
                Ok(res) => format!("the workspace answered {}", res.status()),
                Err(e) => e.to_string(),
            };
            if tries >= FETCH_TRIES {
                return Err(format!("{why} ({tries} tries)"));
            }
            tracing::info!(
                blob = sha,
                tries,
                why,
                "fetching a working directory blob again"
            );
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }

    /// Captures the directory (the sandbox's processes gone) and sends it:
    /// the blobs the workspace lacks, then the manifest, or why it was not
    /// kept.
    pub async fn capture_and_send(self) -> Result<(), String> {
        let bounds = Bounds {
            max_entries: self.spec.max_entries,
            max_bytes: self.spec.max_bytes,
        };
        let root = self.root.try_clone().map_err(|e| e.to_string())?;
        let known = self.known.clone();
        let captured = tokio::task::spawn_blocking(move || capture(&root, bounds, &known))
            .await
            .map_err(|e| e.to_string())?;
        let report = match captured {
            Ok(c) => {
                self.send_blobs(&c).await?;
                SnapshotReport {
                    manifest: Some(c.manifest),
                    error: None,
                }
            }
            Err(e) => SnapshotReport {
                manifest: None,
                error: Some(e.to_string()),
            },
        };
        let res = self
            .client
            .post(self.url(routes::SNAPSHOT))
            .bearer_auth(&self.spec.token)
            .json(&report)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !res.status().is_success() {
            return Err(format!(
                "the workspace answered {} to the snapshot",
                res.status()
            ));
        }
        Ok(())
    }

    async fn send_blobs(&self, c: &Captured) -> Result<(), String> {
        if c.sources.is_empty() {
            return Ok(());
        }
        let res = self
            .client
            .post(self.url(routes::MISSING))
            .bearer_auth(&self.spec.token)
            .json(&MissingRequest {
                hashes: c.manifest.hashes(),
            })
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !res.status().is_success() {
            return Err(format!(
                "the workspace answered {} to the missing blobs",
                res.status()
            ));
        }
        let missing: MissingResponse = res.json().await.map_err(|e| e.to_string())?;
        let sends: Vec<_> = missing
            .missing
            .into_iter()
            .filter_map(|sha| {
                let path = c.sources.get(&sha)?.clone();
                Some(self.send_blob(sha, path))
            })
            .collect();
        let mut sends = futures::stream::iter(sends).buffer_unordered(PARALLEL);
        while let Some(sent) = sends.next().await {
            sent?;
        }
        Ok(())
    }

    async fn send_blob(&self, sha: String, path: String) -> Result<(), String> {
        let (parent, name) = walk::split(&path);
        let dir = walk::open_dir_beneath(&self.root, parent).map_err(|e| format!("{path}: {e}"))?;
        let fd = walk::open_regular(&dir, std::ffi::OsStr::new(name)).map_err(|e| e.to_string())?;
        let file = tokio::fs::File::from_std(std::fs::File::from(fd));
        let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(file));
        let res = self
            .client
            .put(self.url(&format!("{}/{sha}", routes::BLOBS)))
            .bearer_auth(&self.spec.token)
            .body(body)
            .send()
            .await
            .map_err(|e| format!("{path}: {e}"))?;
        if !res.status().is_success() {
            return Err(format!("the workspace answered {} to {path}", res.status()));
        }
        Ok(())
    }
}

/// The pid of the supervisor's child in other namespaces (the sandbox's
/// init), once it has unshared its user namespace, which it does after
/// building `/work`.
async fn wait_for_init(supervisor: u32) -> Result<u32, String> {
    let ours = std::fs::read_link("/proc/self/ns/user").map_err(|e| e.to_string())?;
    let started = std::time::Instant::now();
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children"))
                .map_err(|e| format!("listing the sandbox's processes: {e}"))?;
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
        {
            if let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/user"))
                && ns != ours
            {
                return Ok(pid);
            }
        }
        if started.elapsed() > READY_WAIT {
            return Err("the sandbox did not come up".into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
