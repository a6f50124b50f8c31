//! The nginx adapter: the model's routing as an include file of nginx's
//! own directives (one `upstream` per revision, `split_clients` on the
//! sticky key, the routing version in a variable), written atomically,
//! then nginx reloaded by the configured command and the version read back
//! from a URL the reloaded nginx serves. A reload that fails puts the
//! previous file back, so a bad routing never breaks the next reload.

use std::time::Duration;

use super::{AdapterError, Desired, ident, write_atomically};
use crate::http::HttpClient;

/// The mark of an include file rollgate wrote: the only kind it replaces.
pub const WRITTEN_BY: &str = "Written by rollgate";

/// The include file for `desired`, splitting on the nginx variable `key`.
/// It defines `$rollgate_<model>_upstream` (for `proxy_pass
/// http://$rollgate_<model>_upstream;`) and `$rollgate_<model>_version`.
pub fn render(desired: &Desired, key: &str) -> Result<String, AdapterError> {
    let model = ident(&desired.model);
    let mut out = format!(
        "# {WRITTEN_BY} for model {:?}, routing {}: rewritten at every\n\
         # routing change, do not edit.\n",
        desired.model, desired.version
    );
    let mut upstreams = Vec::new();
    for arm in &desired.arms {
        let authority = arm
            .upstream
            .strip_prefix("http://")
            .ok_or_else(|| AdapterError::Unroutable {
                upstream: arm.upstream.clone(),
                why: "the nginx adapter proxies plain http:// upstreams".into(),
            })?
            .split('/')
            .next()
            .unwrap_or_default();
        let name = format!("rollgate_{model}_{}", ident(&arm.revision));
        out.push_str(&format!(
            "upstream {name} {{\n    server {authority};\n    keepalive 16;\n}}\n"
        ));
        upstreams.push((name, arm.weight_bp));
    }
    out.push_str(&format!(
        "split_clients \"{key}\" $rollgate_{model}_upstream {{\n"
    ));
    let live: Vec<&(String, u32)> = upstreams.iter().filter(|(_, w)| *w > 0).collect();
    for (i, (name, w)) in live.iter().enumerate() {
        if i + 1 == live.len() {
            out.push_str(&format!("    * {name};\n"));
        } else {
            out.push_str(&format!("    {}.{:02}% {name};\n", w / 100, w % 100));
        }
    }
    out.push_str("}\n");
    out.push_str(&format!(
        "map $host $rollgate_{model}_version {{\n    default \"{}\";\n}}\n",
        desired.version
    ));
    Ok(out)
}

pub(super) async fn apply(
    http: &HttpClient,
    include_file: &str,
    reload: &[String],
    confirm_url: &str,
    key: &str,
    desired: &Desired,
) -> Result<(), AdapterError> {
    let io = |what: &str, e: std::io::Error| AdapterError::Io(format!("{what}: {e}"));
    let text = render(desired, key)?;
    let previous = std::fs::read(include_file).ok();
    // Only a file rollgate wrote (or seeded) is replaced: a declaration
    // whose name a model fills must never overwrite the operator's own.
    if let Some(p) = &previous
        && !String::from_utf8_lossy(p).contains(WRITTEN_BY)
    {
        return Err(AdapterError::Io(format!(
            "{include_file} was not written by rollgate (no {WRITTEN_BY:?} line): left as it \
             is; seed it with `rollgate data-plane seed`"
        )));
    }
    write_atomically(include_file, text.as_bytes()).map_err(|e| io(include_file, e))?;
    if let Err(e) = run(reload).await {
        if let Some(previous) = previous {
            let _ = write_atomically(include_file, &previous);
        }
        return Err(e);
    }
    // A reload starts new workers and lets the old ones finish: read the
    // version until the new configuration answers (bounded by the
    // caller's timeout as well).
    let mut got = String::new();
    for _ in 0..50 {
        if let Some((200, body)) = http.get(confirm_url).await {
            got = String::from_utf8_lossy(&body).trim().to_string();
            if got == desired.version {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(AdapterError::OtherVersion {
        want: desired.version.clone(),
        got,
    })
}

async fn run(command: &[String]) -> Result<(), AdapterError> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| AdapterError::Io("no reload command".into()))?;
    let out = tokio::process::Command::new(program)
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| AdapterError::Io(format!("{program}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(AdapterError::Io(format!(
            "{} exited with {}: {}",
            command.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::super::Arm;
    use super::*;

    fn desired(weight_bp: u32) -> Desired {
        let mut arms = vec![Arm {
            role: "champion",
            revision: "r1".into(),
            upstream: "http://127.0.0.1:9001".into(),
            weight_bp: 10_000 - weight_bp,
        }];
        if weight_bp > 0 {
            arms.push(Arm {
                role: "candidate",
                revision: "r2".into(),
                upstream: "http://127.0.0.1:9002/".into(),
                weight_bp,
            });
        }
        Desired {
            model: "fraud-v.2".into(),
            version: "7.3".into(),
            rollout: Some(7),
            epoch: 3,
            arms,
        }
    }

    #[test]
    fn the_split_names_each_revision_and_the_version() {
        let text = render(&desired(2_050), "$http_x_user").expect("render");
        assert!(text.contains("upstream rollgate_fraud_v_2_r2 {\n    server 127.0.0.1:9002;"));
        assert!(text.contains(
            "split_clients \"$http_x_user\" $rollgate_fraud_v_2_upstream {\n    \
             79.50% rollgate_fraud_v_2_r1;\n    * rollgate_fraud_v_2_r2;\n}"
        ));
        assert!(text.contains("map $host $rollgate_fraud_v_2_version {\n    default \"7.3\";"));
        // Champion only: everyone to it.
        let only = render(&desired(0), "$http_x_user").expect("render");
        assert!(
            only.contains("{\n    * rollgate_fraud_v_2_r1;\n}"),
            "{only}"
        );
        assert!(!only.contains("r2"));
    }

    #[test]
    fn https_upstreams_are_refused() {
        let mut d = desired(100);
        d.arms[1].upstream = "https://model:443".into();
        assert!(matches!(
            render(&d, "$k"),
            Err(AdapterError::Unroutable { .. })
        ));
    }
}
