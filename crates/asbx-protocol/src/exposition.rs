//! The metrics exposition both servers answer `GET /metrics` with: the
//! Prometheus text format 0.0.4, which every Prometheus and
//! `promtool check metrics` read. `prometheus-client` writes OpenMetrics
//! text; [`to_prometheus_text`] turns it into 0.0.4, once, for both.

/// The `Content-Type` of what [`to_prometheus_text`] returns.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The OpenMetrics text `prometheus-client` writes, as the Prometheus text
/// format 0.0.4: a counter's `# HELP`/`# TYPE` name its `_total` samples,
/// and there is no `# UNIT` and no `# EOF`.
pub fn to_prometheus_text(open: &str) -> String {
    let counters: std::collections::HashSet<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len() + 16 * counters.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let head = ["# HELP ", "# TYPE "]
            .into_iter()
            .find(|p| line.starts_with(p));
        match head {
            Some(p) => {
                let rest = &line[p.len()..];
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(p);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                out.push(' ');
                out.push_str(tail);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_by_their_samples_and_eof_is_dropped() {
        let open = "# HELP asbx_lines Lines streamed.\n# TYPE asbx_lines counter\n\
                    asbx_lines_total 7\n# HELP asbx_live Live.\n# TYPE asbx_live gauge\n\
                    # UNIT asbx_live seconds\nasbx_live 2\n# EOF\n";
        assert_eq!(
            to_prometheus_text(open),
            "# HELP asbx_lines_total Lines streamed.\n# TYPE asbx_lines_total counter\n\
             asbx_lines_total 7\n# HELP asbx_live Live.\n# TYPE asbx_live gauge\nasbx_live 2\n"
        );
    }
}
