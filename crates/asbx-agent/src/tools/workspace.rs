//! The in-sandbox workspace API, reached through the gateway's
//! `/workspace/` route with the session's `asbx_ws_` bearer
//! (`EnvResponse.workspace`, docs/protocol.md §3): the chat's (or run's)
//! file bag and the chat's history.
//!
//! - [`fetch_attachments`]: before the setup script, each attachment is
//!   streamed to its relative path in the working directory (never whole in
//!   memory) and checked against its declared size and SHA-256; any failure
//!   ends the turn (`attachment_failed`).
//! - [`WorkspaceTools`]: the tools `workspace_list_files`,
//!   `workspace_read_file`, `workspace_create_file` and `chat_history`,
//!   offered only when the session has workspace access; results are bounded
//!   by the tool output limit.
//! - [`default_skill`]: the `asbx_files` skill that explains them.
//!
//! Files are written like `write_file` writes them: walked from the working
//! directory without following symlinks, `0664`, handed to the tool user
//! when possible.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use asbx_protocol::callback::{AttachmentRef, Skill, WorkspaceAccess};
use asbx_protocol::gateway::WORKSPACE_PREFIX;
use asbx_protocol::rules::limits;
use asbx_protocol::rules::names::check_relative_path;
use bytes::Bytes;
use futures::TryStreamExt;
use http::{Method, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::context::{DISPLAY_BYTES, ToolContext, ToolOutput, cut};
use super::files::{DIR_MODE, FILE_MODE, components, create_regular, open_dir, open_root};
use crate::gateway_client::{GatewayClient, GatewayError};
use crate::providers::ToolSpec;

/// Largest file the tools move in either direction (the bag's limit).
pub(crate) const MAX_FILE_BYTES: u64 = limits::MAX_BAG_FILE_BYTES as u64;
/// How long fetching one attachment may take.
pub(crate) const ATTACHMENT_TIMEOUT: Duration = Duration::from_secs(300);
/// The name of the default skill.
pub(crate) const SKILL_NAME: &str = "asbx_files";
/// The tools' names.
pub(crate) const NAMES: [&str; 4] = [
    "workspace_list_files",
    "workspace_read_file",
    "workspace_create_file",
    "chat_history",
];

/// A failure of the workspace API or of writing what it sent.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WsError {
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    #[error("the workspace answered {status}: {body}")]
    Status { status: StatusCode, body: String },
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Mismatch(String),
}

impl WsError {
    fn status(&self) -> Option<StatusCode> {
        match self {
            WsError::Gateway(e) => e.status(),
            WsError::Status { status, .. } => Some(*status),
            WsError::Refused(_) | WsError::Mismatch(_) => None,
        }
    }

    /// The message a tool gives the model.
    fn for_model(&self) -> String {
        match self.status() {
            Some(StatusCode::UNAUTHORIZED) => {
                format!("the workspace refused this session's token: {self}")
            }
            Some(StatusCode::NOT_FOUND) => format!("not found in this chat's files: {self}"),
            Some(_) | None => self.to_string(),
        }
    }
}

/// The workspace API of this session.
#[derive(Debug, Clone)]
pub(crate) struct WorkspaceApi {
    gw: GatewayClient,
    auth: String,
}

/// A file id the gateway will forward: 1 to 128 of `[A-Za-z0-9._~-]`, not
/// `.` or `..`.
fn check_id(id: &str) -> Result<(), WsError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'));
    if ok {
        Ok(())
    } else {
        Err(WsError::Refused(format!("{id:?} is not a file id")))
    }
}

/// Percent-encodes a query value (everything but unreserved characters and `/`).
fn encode_query(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Reads at most `limit` bytes of an error answer, for its message.
async fn error_of(resp: hyper::Response<Incoming>) -> WsError {
    let status = resp.status();
    let body = crate::gateway_client::read_body(resp.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body[..body.len().min(1024)]).into_owned();
    WsError::Status { status, body: text }
}

impl WorkspaceApi {
    pub(crate) fn new(gw: GatewayClient, access: &WorkspaceAccess) -> Self {
        WorkspaceApi {
            gw,
            auth: format!("Bearer {}", access.token),
        }
    }

    async fn get(&self, rest: &str) -> Result<hyper::Response<Incoming>, WsError> {
        let path = format!("{WORKSPACE_PREFIX}{rest}");
        let resp = self
            .gw
            .send_body(
                Method::GET,
                &path,
                &[(header::AUTHORIZATION.as_str(), &self.auth)],
                http_body_util::Empty::<Bytes>::new(),
            )
            .await?;
        if !resp.status().is_success() {
            return Err(error_of(resp).await);
        }
        Ok(resp)
    }

    async fn get_json(&self, rest: &str) -> Result<Value, WsError> {
        let resp = self.get(rest).await?;
        let body = crate::gateway_client::read_body(
            resp.into_body(),
            crate::gateway_client::MAX_BODY_BYTES,
        )
        .await?;
        serde_json::from_slice(&body).map_err(|e| WsError::Gateway(GatewayError::Json(e)))
    }

    /// `GET files`.
    pub(crate) async fn list(&self) -> Result<Value, WsError> {
        self.get_json("files").await
    }

    /// `GET history?limit=N`.
    pub(crate) async fn history(&self, limit: u32) -> Result<Value, WsError> {
        self.get_json(&format!("history?limit={limit}")).await
    }

    /// `GET files/{id}`: the first `cap` bytes and the whole size.
    pub(crate) async fn read_head(
        &self,
        id: &str,
        cap: usize,
    ) -> Result<(Vec<u8>, usize), WsError> {
        check_id(id)?;
        let resp = self.get(&format!("files/{id}")).await?;
        let declared = content_length(&resp);
        let mut body = resp.into_body();
        let mut head = Vec::new();
        let mut seen = 0usize;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(GatewayError::Http)?;
            if let Ok(data) = frame.into_data() {
                seen += data.len();
                let room = cap.saturating_sub(head.len());
                head.extend_from_slice(&data[..data.len().min(room)]);
                if head.len() >= cap && declared.is_some() {
                    // The size is known: no need to read the rest.
                    break;
                }
            }
        }
        let total = declared.map_or(seen, |d| usize::try_from(d).unwrap_or(usize::MAX));
        Ok((head, total))
    }

    /// `GET files/{id}` streamed to `path` (relative to `workdir`): checked
    /// against `expect` (size, sha256) when given, else against the
    /// answer's `content-length` and `x-asbx-sha256`.
    pub(crate) async fn save(
        &self,
        id: &str,
        workdir: &Path,
        path: &str,
        owner: Option<(u32, u32)>,
        expect: Option<(u64, &str)>,
    ) -> Result<Saved, WsError> {
        check_id(id)?;
        check_relative_path(path).map_err(|e| WsError::Refused(format!("{path}: {e}")))?;
        let resp = self.get(&format!("files/{id}")).await?;
        let header_sha = resp
            .headers()
            .get("x-asbx-sha256")
            .and_then(|v| v.to_str().ok())
            .map(str::to_ascii_lowercase);
        let (size, sha) = match expect {
            Some((size, sha)) => (Some(size), Some(sha.to_ascii_lowercase())),
            None => (content_length(&resp), header_sha),
        };
        let max = size.unwrap_or(MAX_FILE_BYTES);
        if max > MAX_FILE_BYTES {
            return Err(WsError::Refused(format!(
                "{path}: {max} bytes is over the {MAX_FILE_BYTES} byte limit"
            )));
        }
        let (w, p) = (workdir.to_path_buf(), path.to_owned());
        let (dir, name, file) = tokio::task::spawn_blocking(move || create_file(&w, &p, owner))
            .await
            .map_err(|e| WsError::Refused(format!("{path}: {e}")))?
            .map_err(WsError::Refused)?;
        let written = write_checked(
            tokio::fs::File::from_std(file),
            resp.into_body(),
            path,
            max,
            size,
            sha,
        )
        .await;
        if written.is_err() {
            // Nothing half-written or unchecked stays behind.
            let _ = nix::unistd::unlinkat(
                &dir,
                name.as_os_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
        written
    }

    /// `POST files?path=..` with `body` (`len` bytes) as `mime`.
    pub(crate) async fn create<B>(
        &self,
        path: &str,
        mime: &str,
        len: u64,
        body: B,
    ) -> Result<Value, WsError>
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let uri = format!("{WORKSPACE_PREFIX}files?path={}", encode_query(path));
        let len = len.to_string();
        let resp = self
            .gw
            .send_body(
                Method::POST,
                &uri,
                &[
                    (header::AUTHORIZATION.as_str(), &self.auth),
                    (header::CONTENT_TYPE.as_str(), mime),
                    (header::CONTENT_LENGTH.as_str(), &len),
                ],
                body,
            )
            .await?;
        if !resp.status().is_success() {
            return Err(error_of(resp).await);
        }
        let body = crate::gateway_client::read_body(resp.into_body(), 1024 * 1024).await?;
        serde_json::from_slice(&body).map_err(|e| WsError::Gateway(GatewayError::Json(e)))
    }
}

/// Streams `body` into `file`, at most `max` bytes, and checks the size and
/// SHA-256 when known.
async fn write_checked(
    mut file: tokio::fs::File,
    mut body: Incoming,
    path: &str,
    max: u64,
    size: Option<u64>,
    sha: Option<String>,
) -> Result<Saved, WsError> {
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(GatewayError::Http)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        written += data.len() as u64;
        if written > max {
            return Err(WsError::Mismatch(format!(
                "{path}: more than the {max} bytes declared"
            )));
        }
        hasher.update(&data);
        file.write_all(&data)
            .await
            .map_err(|e| WsError::Refused(format!("{path}: {e}")))?;
    }
    file.flush()
        .await
        .map_err(|e| WsError::Refused(format!("{path}: {e}")))?;
    let got = hex::encode(hasher.finalize());
    if let Some(size) = size
        && written != size
    {
        return Err(WsError::Mismatch(format!(
            "{path}: got {written} bytes, {size} declared"
        )));
    }
    if let Some(sha) = sha
        && got != sha
    {
        return Err(WsError::Mismatch(format!(
            "{path}: SHA-256 {got} does not match the declared {sha}"
        )));
    }
    Ok(Saved {
        bytes: written,
        sha256: got,
    })
}

fn content_length(resp: &hyper::Response<Incoming>) -> Option<u64> {
    resp.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// What [`WorkspaceApi::save`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Saved {
    pub(crate) bytes: u64,
    pub(crate) sha256: String,
}

/// Creates (or truncates) `path` under `workdir` like `write_file` does;
/// returns its folder and name too, to remove it again.
fn create_file(
    workdir: &Path,
    path: &str,
    owner: Option<(u32, u32)>,
) -> Result<(std::os::fd::OwnedFd, std::ffi::OsString, std::fs::File), String> {
    let comps = components(workdir, path)?;
    let Some((name, dirs)) = comps.split_last() else {
        return Err(format!("{path}: is a directory"));
    };
    let dir = open_dir(open_root(workdir)?, dirs, Some(DIR_MODE), path)?;
    let (fd, st) = create_regular(&dir, name, FILE_MODE, path)?;
    if st.st_uid == nix::unistd::geteuid().as_raw() {
        let _ = nix::sys::stat::fchmod(
            fd.as_fd(),
            nix::sys::stat::Mode::from_bits_truncate(FILE_MODE),
        );
    }
    if let Some((uid, gid)) = owner {
        let _ = nix::unistd::fchown(
            fd.as_fd(),
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        );
    }
    Ok((dir, name.clone(), std::fs::File::from(fd)))
}

/// Streams every attachment into the working directory, checked. The first
/// failure is returned as `(path, reason)`.
pub(crate) async fn fetch_attachments(
    api: &WorkspaceApi,
    ctx: &ToolContext,
    attachments: &[AttachmentRef],
) -> Result<u64, (String, String)> {
    let mut total = 0;
    for a in attachments {
        let saved = tokio::time::timeout(
            ATTACHMENT_TIMEOUT,
            api.save(
                &a.id,
                &ctx.workdir,
                &a.path,
                ctx.tool_user,
                Some((a.size, &a.sha256)),
            ),
        )
        .await;
        match saved {
            Ok(Ok(s)) => total += s.bytes,
            Ok(Err(e)) => return Err((a.path.clone(), e.to_string())),
            Err(_) => {
                return Err((
                    a.path.clone(),
                    format!("timed out after {ATTACHMENT_TIMEOUT:?}"),
                ));
            }
        }
    }
    Ok(total)
}

/// The `asbx_files` skill's scripts: the same API with plain `curl`, from
/// `ASBX_WORKSPACE_URL` and `ASBX_WORKSPACE_TOKEN` (`crate::workspace_relay`),
/// so a shell step or another skill's script can use the bag too.
const SKILL_SCRIPTS: [(&str, &str); 5] = [
    (
        "scripts/common.sh",
        "# Sourced by the other scripts: the workspace API of this session.\n\
: \"${ASBX_WORKSPACE_URL:?no workspace API in this session}\"\n\
: \"${ASBX_WORKSPACE_TOKEN:?no workspace API in this session}\"\n\
ws_curl() { curl -sS --fail-with-body -H \"Authorization: Bearer $ASBX_WORKSPACE_TOKEN\" \"$@\"; }\n\
urlencode() {\n\
  local LC_ALL=C s=\"$1\" out='' c i\n\
  for ((i = 0; i < ${#s}; i++)); do\n\
    c=\"${s:i:1}\"\n\
    case \"$c\" in [A-Za-z0-9._~/-]) out+=\"$c\" ;; *) out+=$(printf '%%%02X' \"'$c\") ;; esac\n\
  done\n\
  printf '%s' \"$out\"\n\
}\n",
    ),
    (
        "scripts/list.sh",
        "#!/bin/bash\n\
# Lists the bag's files as JSON: {\"files\": [{id, path, mimeType, size, sha256}]}.\n\
set -euo pipefail\n\
. \"$(dirname \"$0\")/common.sh\"\n\
ws_curl \"$ASBX_WORKSPACE_URL/files\"\n",
    ),
    (
        "scripts/get.sh",
        "#!/bin/bash\n\
# get.sh ID [OUT]: a bag file's bytes, to OUT (default: standard output).\n\
set -euo pipefail\n\
. \"$(dirname \"$0\")/common.sh\"\n\
ws_curl -o \"${2:-/dev/stdout}\" \"$ASBX_WORKSPACE_URL/files/$1\"\n",
    ),
    (
        "scripts/put.sh",
        "#!/bin/bash\n\
# put.sh FILE [NAME [MIME]]: puts FILE into the bag as NAME (default: FILE).\n\
set -euo pipefail\n\
. \"$(dirname \"$0\")/common.sh\"\n\
name=\"${2:-$1}\"\n\
mime=\"${3:-application/octet-stream}\"\n\
ws_curl -X POST -H \"Content-Type: $mime\" --data-binary \"@$1\" \\\n\
  \"$ASBX_WORKSPACE_URL/files?path=$(urlencode \"$name\")\"\n",
    ),
    (
        "scripts/history.sh",
        "#!/bin/bash\n\
# history.sh [LIMIT]: the chat's latest messages as JSON, oldest first.\n\
set -euo pipefail\n\
. \"$(dirname \"$0\")/common.sh\"\n\
ws_curl \"$ASBX_WORKSPACE_URL/history?limit=${1:-20}\"\n",
    ),
];

/// The `asbx_files` skill: how to use the workspace tools and its scripts.
pub(crate) fn default_skill() -> Skill {
    let text = "# Files of this chat\n\n\
The user's files live in the chat's file bag in the workspace. Tools:\n\n\
- `workspace_list_files {}`: every file of the bag (id, path, mimeType, size, sha256).\n\
- `workspace_read_file {\"id\"}`: a text file's content (cut at the tool output limit); \
with `\"saveAs\": \"relative/path\"` the bytes are saved in the working directory instead \
(use this for binary or large files, then work on them with `shell`).\n\
- `workspace_create_file {\"path\", \"content\"}` or `{\"path\", \"fromPath\"}`: puts a \
file into the bag, where the user sees it at once; `mimeType` is optional.\n\
- `chat_history {\"limit\"}`: the chat's latest messages, oldest first.\n\n\
The same API from `shell` (and from any script): `$ASBX_WORKSPACE_URL` with the bearer \
`$ASBX_WORKSPACE_TOKEN`, e.g. `curl -H \"Authorization: Bearer $ASBX_WORKSPACE_TOKEN\" \
\"$ASBX_WORKSPACE_URL/files\"`. Scripts of this skill (`.skills/asbx_files/`): \
`scripts/list.sh`, `scripts/get.sh ID [OUT]`, `scripts/put.sh FILE [NAME [MIME]]`, \
`scripts/history.sh [LIMIT]`.\n\n\
Files the user attached to this message are already in the working directory under \
`attachments/`. A file the user should get goes into the bag with \
`workspace_create_file`; files left under `out/` are also stored when the turn ends.\n";
    let mut files = BTreeMap::from([(
        asbx_protocol::rules::skills::INSTRUCTIONS.to_owned(),
        text.to_owned(),
    )]);
    for (path, script) in SKILL_SCRIPTS {
        files.insert(path.to_owned(), script.to_owned());
    }
    Skill {
        name: SKILL_NAME.into(),
        description: "How to read the user's files and attachments and hand files back \
                      (the chat's file bag), with tools or with curl."
            .into(),
        files,
    }
}

/// The workspace tools of a session that has workspace access.
#[derive(Debug, Clone)]
pub(crate) struct WorkspaceTools {
    api: WorkspaceApi,
}

impl WorkspaceTools {
    pub(crate) fn new(api: WorkspaceApi) -> Self {
        WorkspaceTools { api }
    }

    pub(crate) fn offers(&self, name: &str) -> bool {
        NAMES.contains(&name)
    }

    pub(crate) fn specs(&self) -> Vec<ToolSpec> {
        vec![
            ToolSpec {
                name: NAMES[0].into(),
                description: "List the files of this chat's file bag in the workspace \
                              (id, path, mimeType, size, sha256)."
                    .into(),
                parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
            },
            ToolSpec {
                name: NAMES[1].into(),
                description: "Read a file of the chat's file bag by id: its text, or with \
                              saveAs, save its bytes at that path in the working directory."
                    .into(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "id": {"type": "string", "description": "The file id (workspace_list_files)."},
                        "saveAs": {"type": "string", "description": "Relative path to save the file at."}
                    },
                    "required": ["id"],
                    "additionalProperties": false
                }),
            },
            ToolSpec {
                name: NAMES[2].into(),
                description: "Create a file in the chat's file bag (the user sees it), from \
                              text content or from a file of the working directory."
                    .into(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "The file's name in the bag, e.g. summary.md."},
                        "content": {"type": "string", "description": "The text content."},
                        "fromPath": {"type": "string", "description": "Or: a file of the working directory to upload."},
                        "mimeType": {"type": "string", "description": "Optional; guessed from the path."}
                    },
                    "required": ["path"],
                    "additionalProperties": false
                }),
            },
            ToolSpec {
                name: NAMES[3].into(),
                description: "The chat's latest messages, oldest first.".into(),
                parameters: json!({
                    "type": "object",
                    "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": limits::MAX_HISTORY_MESSAGES}},
                    "additionalProperties": false
                }),
            },
        ]
    }

    /// Runs one call, bounded by the tool timeout.
    pub(crate) async fn call(&self, ctx: &ToolContext, name: &str, args: &Value) -> ToolOutput {
        match tokio::time::timeout(ctx.timeout, self.dispatch(ctx, name, args)).await {
            Ok(out) => out,
            Err(_) => ToolOutput::failed(format!(
                "{name} timed out after {} ms",
                ctx.timeout.as_millis()
            )),
        }
    }

    async fn dispatch(&self, ctx: &ToolContext, name: &str, args: &Value) -> ToolOutput {
        let str_arg = |key: &str| args.get(key).and_then(Value::as_str);
        let fail = |e: WsError| ToolOutput::failed(e.for_model());
        match name {
            "workspace_list_files" => match self.api.list().await {
                Ok(v) => text_output(&v.to_string(), ctx.output_bytes),
                Err(e) => fail(e),
            },
            "workspace_read_file" => {
                let Some(id) = str_arg("id") else {
                    return ToolOutput::failed("workspace_read_file needs a string argument `id`");
                };
                match str_arg("saveAs") {
                    Some(path) => match self
                        .api
                        .save(id, &ctx.workdir, path, ctx.tool_user, None)
                        .await
                    {
                        Ok(s) => ToolOutput {
                            model_text: format!(
                                "saved {} bytes to {path} (sha256 {})",
                                s.bytes, s.sha256
                            ),
                            display: Ok(
                                json!({"path": path, "bytes": s.bytes, "sha256": s.sha256}),
                            ),
                        },
                        Err(e) => fail(e),
                    },
                    None => match self.api.read_head(id, ctx.output_bytes).await {
                        Ok((head, total)) => ToolOutput {
                            model_text: cut(&head, total, ctx.output_bytes),
                            display: Ok(json!(cut(&head, total, DISPLAY_BYTES))),
                        },
                        Err(e) => fail(e),
                    },
                }
            }
            "workspace_create_file" => self.create(ctx, args).await,
            "chat_history" => {
                let limit = args
                    .get("limit")
                    .and_then(Value::as_u64)
                    .map_or(limits::DEFAULT_HISTORY_MESSAGES as u64, |n| {
                        n.clamp(1, limits::MAX_HISTORY_MESSAGES as u64)
                    }) as u32;
                match self.api.history(limit).await {
                    Ok(v) => text_output(&history_text(&v), ctx.output_bytes),
                    Err(e) => fail(e),
                }
            }
            other => ToolOutput::failed(format!("unknown tool {other:?}")),
        }
    }

    async fn create(&self, ctx: &ToolContext, args: &Value) -> ToolOutput {
        let str_arg = |key: &str| args.get(key).and_then(Value::as_str);
        let Some(path) = str_arg("path") else {
            return ToolOutput::failed("workspace_create_file needs a string argument `path`");
        };
        if let Err(e) = check_relative_path(path) {
            return ToolOutput::failed(format!("path {path:?}: {e}"));
        }
        let mime = str_arg("mimeType").map_or_else(
            || {
                mime_guess::from_path(path)
                    .first_or_octet_stream()
                    .essence_str()
                    .to_owned()
            },
            str::to_owned,
        );
        let created = match (str_arg("content"), str_arg("fromPath")) {
            (Some(content), None) => {
                let body = Bytes::from(content.to_owned());
                let len = body.len() as u64;
                if len > MAX_FILE_BYTES {
                    return ToolOutput::failed(format!(
                        "content is over the {MAX_FILE_BYTES} byte limit"
                    ));
                }
                self.api
                    .create(path, &mime, len, http_body_util::Full::new(body))
                    .await
            }
            (None, Some(from)) => {
                if let Err(e) = check_relative_path(from) {
                    return ToolOutput::failed(format!("fromPath {from:?}: {e}"));
                }
                let (w, f) = (ctx.workdir.clone(), from.to_owned());
                let opened = tokio::task::spawn_blocking(move || open_for_upload(&w, &f)).await;
                let (file, len) = match opened {
                    Ok(Ok(v)) => v,
                    Ok(Err(e)) => return ToolOutput::failed(e),
                    Err(e) => return ToolOutput::failed(format!("{from}: {e}")),
                };
                let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file))
                    .map_ok(hyper::body::Frame::data);
                self.api
                    .create(path, &mime, len, http_body_util::StreamBody::new(stream))
                    .await
            }
            _ => {
                return ToolOutput::failed(
                    "workspace_create_file needs exactly one of `content` and `fromPath`",
                );
            }
        };
        match created {
            Ok(v) => {
                let out = json!({"id": v["id"], "path": v["path"], "size": v["size"]});
                ToolOutput {
                    model_text: out.to_string(),
                    display: Ok(out),
                }
            }
            Err(e) => ToolOutput::failed(e.for_model()),
        }
    }
}

/// Opens a regular file of the working directory (no symlink) for upload,
/// with its size, refusing one over [`MAX_FILE_BYTES`].
fn open_for_upload(workdir: &Path, path: &str) -> Result<(std::fs::File, u64), String> {
    use nix::fcntl::{OFlag, openat};
    use nix::sys::stat::{Mode, fstat};
    let comps = components(workdir, path)?;
    let Some((name, dirs)) = comps.split_last() else {
        return Err(format!("{path}: is a directory"));
    };
    let dir = open_dir(open_root(workdir)?, dirs, None, path)?;
    let fd = openat(
        dir.as_fd(),
        name.as_os_str(),
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| super::files::errno_msg(path, e))?;
    let st = fstat(fd.as_fd()).map_err(|e| super::files::errno_msg(path, e))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(format!("{path}: not a regular file"));
    }
    let len = u64::try_from(st.st_size).unwrap_or(u64::MAX);
    if len > MAX_FILE_BYTES {
        return Err(format!(
            "{path}: {len} bytes is over the {MAX_FILE_BYTES} byte limit"
        ));
    }
    Ok((std::fs::File::from(fd), len))
}

fn text_output(text: &str, cap: usize) -> ToolOutput {
    ToolOutput {
        model_text: cut(text.as_bytes(), text.len(), cap),
        display: Ok(json!(cut(text.as_bytes(), text.len(), DISPLAY_BYTES))),
    }
}

/// `role: text` per message, a blank line between.
fn history_text(v: &Value) -> String {
    let Some(messages) = v.get("messages").and_then(Value::as_array) else {
        return v.to_string();
    };
    if messages.is_empty() {
        return "(no messages)".into();
    }
    messages
        .iter()
        .map(|m| {
            format!(
                "{}: {}",
                m.get("role").and_then(Value::as_str).unwrap_or("?"),
                m.get("text").and_then(Value::as_str).unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_queries() {
        assert!(check_id("f_1-a").is_ok());
        for bad in ["", "..", ".", "a/b", "a%2e", "a b", &"x".repeat(129)] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
        assert_eq!(encode_query("out/a b&c=d.txt"), "out/a%20b%26c%3Dd.txt");
        assert_eq!(encode_query("é"), "%C3%A9");
    }

    #[test]
    fn history_is_role_and_text() {
        let v = json!({"messages": [
            {"role": "user", "text": "hi", "createdAt": 1},
            {"role": "assistant", "text": "hello", "createdAt": 2}
        ]});
        assert_eq!(history_text(&v), "user: hi\n\nassistant: hello");
        assert_eq!(history_text(&json!({"messages": []})), "(no messages)");
    }

    #[test]
    fn the_default_skill_keeps_the_rules() {
        asbx_protocol::rules::skills::check(&default_skill()).unwrap();
    }
}
