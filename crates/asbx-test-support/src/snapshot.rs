//! Snapshots with filters: one macro, [`asbx_snapshot!`](crate::asbx_snapshot),
//! for every snapshot test of the workspace.
//!
//! A snapshot pins a whole answer (a problem body, an NDJSON stream, an SSE
//! stream), so a change to any field shows in review. What changes from run
//! to run (random ids, times, temporary paths, and where asked for, sequence
//! numbers) is replaced by a placeholder first, by regex [`Filters`], so the
//! snapshot is stable. The shape follows uv's `uv_snapshot!`: the default
//! filters, or the caller's list.
//!
//! ```ignore
//! asbx_snapshot!("stream_401", problem);                    // JSON, default filters
//! asbx_snapshot!(text: "chat_turn_sse", sse_body);          // text as it is
//! asbx_snapshot!(filters: with_seqs(), text: "run", body);  // the caller's filters
//! ```
//!
//! Snapshot files are `snapshots/<name>.snap` beside the test's source (no
//! module prefix); `INSTA_UPDATE` and `cargo insta` work as usual.

pub use insta;

/// Regex filters, `(pattern, replacement)`, applied in order.
pub type Filters = Vec<(&'static str, &'static str)>;

/// What every snapshot gets: random ids (32 or 24 hex digits, as the
/// workspace and the runner mint them), Unix-millisecond times and
/// durations in JSON fields, ISO 8601 times, and temporary paths.
pub fn default_filters() -> Filters {
    vec![
        // Times in JSON fields (`"ts":1732700000000`, `"createdAt": 1732...`).
        (
            r#""(ts|createdAt|updatedAt|startedAt|endedAt|expiresAt)":( ?)\d{10,}"#,
            r#""$1":$2"[TIME]""#,
        ),
        (
            r#""(durationMs|elapsedMs)":( ?)\d+"#,
            r#""$1":$2"[DURATION]""#,
        ),
        (
            r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})",
            "[ISO TIME]",
        ),
        // Temporary folders (`/tmp/.tmpAbC123`, `/tmp/asbx-...`).
        (r"/tmp/[A-Za-z0-9._-]+", "[TEMP]"),
        // Random ids: 128 bits as 32 hex digits, a test's 96-bit suffix.
        (r"\b[0-9a-f]{32}\b", "[ID]"),
        (r"\b[0-9a-f]{24}\b", "[ID]"),
    ]
}

/// [`default_filters`], and sequence numbers too (`"seq": N`, SSE `id: N`):
/// for streams whose count of lines before a point may vary.
pub fn with_seqs() -> Filters {
    let mut f = default_filters();
    f.push((r#""seq":( ?)\d+"#, r#""seq":$1"[SEQ]""#));
    f.push((r"(?m)^id: ?\d+$", "id: [SEQ]"));
    f
}

/// The settings a snapshot is taken under: `filters`, and no module prefix
/// in the file name.
pub fn settings(filters: &Filters) -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_prepend_module_to_snapshot(false);
    for (pattern, with) in filters {
        s.add_filter(pattern, *with);
    }
    s
}

/// Asserts a snapshot, after [`settings`]' filters.
///
/// - `asbx_snapshot!(name, value)`: `value` (anything `Serialize`) as
///   pretty JSON;
/// - `asbx_snapshot!(text: name, text)`: a text (an NDJSON or SSE body) as
///   it is;
/// - either one after `filters: <Filters>,` to replace the default filters.
#[macro_export]
macro_rules! asbx_snapshot {
    (filters: $filters:expr, text: $name:expr, $text:expr) => {{
        let settings = $crate::snapshot::settings(&$filters);
        let text: &str = ::std::convert::AsRef::<str>::as_ref(&$text);
        settings.bind(|| $crate::snapshot::insta::assert_snapshot!($name, text));
    }};
    (filters: $filters:expr, $name:expr, $value:expr) => {{
        let settings = $crate::snapshot::settings(&$filters);
        settings.bind(|| $crate::snapshot::insta::assert_json_snapshot!($name, $value));
    }};
    (text: $name:expr, $text:expr) => {
        $crate::asbx_snapshot!(filters: $crate::snapshot::default_filters(), text: $name, $text)
    };
    ($name:expr, $value:expr) => {
        $crate::asbx_snapshot!(filters: $crate::snapshot::default_filters(), $name, $value)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"seq":3,"ts":1732700000123,"sessionId":"full-0123456789abcdef01234567","durationMs":12,"id":"0123456789abcdef0123456789abcdef","path":"/tmp/.tmpAbC12/out","at":"2026-11-27T13:20:00.5Z","sha":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}"#;
    const SSE: &str = "id: 7\nevent: step\ndata: {\"seq\": 7}\n";

    #[test]
    fn the_default_filters_hide_ids_times_and_paths_and_keep_the_rest() {
        settings(&default_filters()).bind(|| {
            insta::assert_snapshot!(LINE, @r#"{"seq":3,"ts":"[TIME]","sessionId":"full-[ID]","durationMs":"[DURATION]","id":"[ID]","path":"[TEMP]/out","at":"[ISO TIME]","sha":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}"#);
            insta::assert_snapshot!(SSE, @r#"
            id: 7
            event: step
            data: {"seq": 7}
            "#);
        });
    }

    #[test]
    fn with_seqs_hides_sequence_numbers_too() {
        settings(&with_seqs()).bind(|| {
            insta::assert_snapshot!(SSE, @r#"
            id: [SEQ]
            event: step
            data: {"seq": "[SEQ]"}
            "#);
        });
    }
}
