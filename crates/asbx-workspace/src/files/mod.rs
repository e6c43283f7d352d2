//! Files: the blob folder (bytes by SHA-256), file rows, downloads.
//!
//! Written-back files arrive through `callbacks`, uploads to a chat's bag
//! through `chats`; both store here. This feature uses no other feature.

pub(crate) mod api;
pub(crate) mod blobs;
pub(crate) mod store;

use crate::wire::FileInfo;

/// The public view of a stored file.
pub(crate) fn file_info(f: &store::FileRow) -> FileInfo {
    FileInfo {
        id: f.id.clone(),
        path: f.path.clone(),
        mime_type: f.mime_type.clone(),
        size: f.size,
        created_at: f.created_at,
        url: format!("/api/files/{}", f.id),
    }
}

/// The last component of a path, made safe for a `Content-Disposition`
/// `filename` and a shell word (ASCII letters, digits, `.`, `-`, `_`).
pub(crate) fn ascii_file_name(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    let cleaned: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if cleaned.trim_matches(['.', '_']).is_empty() {
        "file".to_owned()
    } else {
        cleaned
    }
}

/// A stored file as the audit log sees it: where it belongs, its path and
/// size, never its bytes.
pub(crate) fn audit_seen(file: &store::FileRow) -> crate::audit::FileSeen<'_> {
    crate::audit::FileSeen {
        workspace: &file.workspace_id,
        run_id: file.run_id.as_deref(),
        path: &file.path,
        size: file.size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_sanitized() {
        assert_eq!(ascii_file_name("dir/report.pdf"), "report.pdf");
        assert_eq!(ascii_file_name("a\"b;c.txt"), "a_b_c.txt");
        assert_eq!(ascii_file_name(".."), "file");
    }
}
