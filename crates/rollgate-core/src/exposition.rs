//! Metrics exposition formats. The gateway and the controller render
//! OpenMetrics (the format `prometheus-client` writes); a scraper that does
//! not ask for it (`Accept` without `application/openmetrics-text`: curl,
//! `promtool check metrics`, older Prometheus) gets the Prometheus text
//! format 0.0.4 instead. Pure text, shared by both: written by hand because
//! `prometheus-client` encodes OpenMetrics only.

/// The content type of the Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The content type of OpenMetrics text.
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether a scraper's `Accept` header asks for OpenMetrics.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// OpenMetrics text as the Prometheus text format: a counter's HELP and
/// TYPE name its `_total` samples, an info metric is a gauge named
/// `<name>_info`, and `# UNIT` and `# EOF` lines go.
pub fn openmetrics_to_prometheus_text(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    // A family's HELP line waits for its TYPE, which decides its name.
    let mut help: Option<(&str, &str)> = None;
    for line in om.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "unknown" => (name.to_string(), "untyped"),
                other => (name.to_string(), other),
            };
            if let Some((_, text)) = help.take() {
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        } else {
            if let Some((name, text)) = help.take() {
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_info_are_named_by_their_samples() {
        let om = "# HELP rollgate_requests Requests.\n\
                  # TYPE rollgate_requests counter\n\
                  rollgate_requests_total{model=\"m\"} 3\n\
                  # HELP rollgate_build The running build.\n\
                  # TYPE rollgate_build info\n\
                  rollgate_build_info{version=\"0.1.0\"} 1\n\
                  # HELP rollgate_in_flight Requests in flight.\n\
                  # TYPE rollgate_in_flight gauge\n\
                  rollgate_in_flight 0\n\
                  # EOF\n";
        assert_eq!(
            openmetrics_to_prometheus_text(om),
            "# HELP rollgate_requests_total Requests.\n\
             # TYPE rollgate_requests_total counter\n\
             rollgate_requests_total{model=\"m\"} 3\n\
             # HELP rollgate_build_info The running build.\n\
             # TYPE rollgate_build_info gauge\n\
             rollgate_build_info{version=\"0.1.0\"} 1\n\
             # HELP rollgate_in_flight Requests in flight.\n\
             # TYPE rollgate_in_flight gauge\n\
             rollgate_in_flight 0\n"
        );
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
        )));
        assert!(!wants_openmetrics(Some("text/plain")));
        assert!(!wants_openmetrics(None));
    }
}
