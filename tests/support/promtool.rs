//! Shared by the gateway's and the controller's tests (included by path):
//! the metrics endpoints must satisfy Prometheus's own linter.

/// `promtool check metrics` (Debian's `prometheus`) finds nothing to
/// complain about in `text`. CI installs it; locally it may be absent.
pub fn promtool_accepts(text: &str) {
    use std::io::Write as _;
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(_) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped promtool: not installed (apt-get install prometheus)");
            return;
        }
        Err(e) => panic!("promtool is needed in CI (apt-get install prometheus): {e}"),
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
