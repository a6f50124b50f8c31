//! The nginx adapter: the model's routing as an include file of nginx's
//! own directives (one `upstream` per revision, `split_clients` on the
//! sticky key, the routing version in a variable, the generation in a
//! comment), written atomically, then nginx reloaded by the configured
//! command and the version read back from a URL the reloaded nginx
//! serves. A reload that fails puts the previous file back, so a bad
//! routing never breaks the next reload.

use std::time::Duration;

use futures::future::BoxFuture;

use crate::error::not_older;
use crate::{Adapter, AdapterError, Desired, HttpClient, ident, write_atomically};

/// The mark of an include file rollgate wrote: the only kind it replaces.
pub const WRITTEN_BY: &str = "Written by rollgate";

/// The comment that records an include file's generation (absent: 0, as
/// in a seed or a file written before generations were recorded).
const GENERATION: &str = "# generation ";

/// A model's nginx, as its `DataPlane::Nginx` declares it.
#[derive(Debug)]
pub(crate) struct Nginx {
    /// Unpooled ([`HttpClient::unpooled`]): every read a new connection.
    pub http: HttpClient,
    pub include_file: String,
    pub reload_command: Vec<String>,
    pub confirm_url: String,
    pub key: String,
}

impl Adapter for Nginx {
    fn kind(&self) -> &'static str {
        "nginx"
    }

    fn send<'a>(&'a self, desired: &'a Desired) -> BoxFuture<'a, Result<(), AdapterError>> {
        Box::pin(self.apply_and_confirm(desired))
    }

    fn seed_files(&self, desired: &Desired) -> Result<Vec<(String, String)>, AdapterError> {
        Ok(vec![(
            self.include_file.clone(),
            render(desired, &self.key)?,
        )])
    }
}

/// The include file for `desired`, splitting on the nginx variable `key`.
/// It defines `$rollgate_<model>_upstream` (for `proxy_pass
/// http://$rollgate_<model>_upstream;`) and `$rollgate_<model>_version`.
pub fn render(desired: &Desired, key: &str) -> Result<String, AdapterError> {
    let model = ident(&desired.model);
    let mut out = format!(
        "# {WRITTEN_BY} for model {:?}, routing {}: rewritten at every\n\
         # routing change, do not edit.\n\
         {GENERATION}{} (never replaced by a lower one)\n",
        desired.model, desired.version, desired.generation
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

/// The generation an include file records (0 if it records none).
fn generation_of(text: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let digits = l.strip_prefix(GENERATION)?;
            let end = digits
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(digits.len());
            digits[..end].parse().ok()
        })
        .unwrap_or(0)
}

impl Nginx {
    async fn apply_and_confirm(&self, desired: &Desired) -> Result<(), AdapterError> {
        let include_file = self.include_file.as_str();
        let io = |what: &str, e: std::io::Error| AdapterError::Io(format!("{what}: {e}"));
        let text = render(desired, &self.key)?;
        let previous = std::fs::read(include_file).ok();
        if let Some(p) = &previous {
            let p = String::from_utf8_lossy(p);
            // Only a file rollgate wrote (or seeded) is replaced: a
            // declaration whose name a model fills must never overwrite
            // the operator's own.
            if !p.contains(WRITTEN_BY) {
                return Err(AdapterError::Io(format!(
                    "{include_file} was not written by rollgate (no {WRITTEN_BY:?} line): left \
                     as it is; seed it with `rollgate data-plane seed`"
                )));
            }
            not_older(generation_of(&p), desired.generation)?;
        }
        write_atomically(include_file, text.as_bytes()).map_err(|e| io(include_file, e))?;
        if let Err(e) = run(&self.reload_command).await {
            if let Some(previous) = previous {
                let _ = write_atomically(include_file, &previous);
            }
            return Err(e);
        }
        self.confirm(&desired.version).await
    }

    /// A reload starts new workers and, 100 ms later (nginx's master
    /// waits that long), tells the old ones to stop accepting: until then
    /// a new connection may still reach the old configuration. Reads the
    /// version on new connections until the new one has answered every
    /// read for [`STEADY_FOR`] (5 s at most, bounded by the caller's
    /// timeout as well).
    async fn confirm(&self, version: &str) -> Result<(), AdapterError> {
        let mut got = String::new();
        let mut since: Option<tokio::time::Instant> = None;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while tokio::time::Instant::now() < deadline {
            let read = self.http.get(&self.confirm_url);
            since = match tokio::time::timeout_at(deadline, read).await {
                Ok(Some((200, body))) => {
                    got = String::from_utf8_lossy(&body).trim().to_string();
                    (got == version).then(|| since.unwrap_or_else(tokio::time::Instant::now))
                }
                _ => None,
            };
            if since.is_some_and(|t| t.elapsed() >= STEADY_FOR) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Err(AdapterError::OtherVersion {
            want: version.to_string(),
            got,
        })
    }
}

/// How long every read must answer the new version: longer than nginx's
/// master lets old and new workers accept side by side (100 ms).
const STEADY_FOR: Duration = Duration::from_millis(300);

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
    use super::*;
    use crate::Arm;

    fn desired(weight_bp: u32) -> Desired {
        let mut arms = vec![Arm {
            role: "champion",
            revision: "r1".into(),
            upstream: "http://127.0.0.1:9001".into(),
            weight_bp: 10_000 - weight_bp,
            predictor: None,
        }];
        if weight_bp > 0 {
            arms.push(Arm {
                role: "candidate",
                revision: "r2".into(),
                upstream: "http://127.0.0.1:9002/".into(),
                weight_bp,
                predictor: None,
            });
        }
        Desired {
            model: "fraud-v.2".into(),
            version: "7.3".into(),
            rollout: Some(7),
            epoch: 3,
            generation: 41,
            shadow: None,
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
    fn the_file_records_its_generation() {
        let text = render(&desired(100), "$k").expect("render");
        assert_eq!(generation_of(&text), 41, "{text}");
        // A seed, or a file from before generations: 0.
        assert_eq!(generation_of("# Written by rollgate (a seed)\n"), 0);
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

    /// An include file of the operator's own (no mark), or one of a higher
    /// generation, is left byte for byte; nothing is reloaded.
    #[tokio::test]
    async fn an_operators_file_or_a_newer_routing_is_left_as_it_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let at = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
        let nginx = Nginx {
            http: HttpClient::unpooled(Duration::from_secs(1)),
            include_file: at("m.conf"),
            reload_command: vec!["touch".into(), at("reloaded")],
            confirm_url: "http://127.0.0.1:9/v".into(),
            key: "$k".into(),
        };
        let operators = "upstream mine { server 10.0.0.1:80; }\n";
        std::fs::write(at("m.conf"), operators).expect("write");
        let e = nginx.apply(&desired(100)).await.expect_err("refused");
        assert!(matches!(e, AdapterError::Io(_)), "{e}");
        let mut newer = desired(0);
        newer.generation = 42;
        let newer = render(&newer, "$k").expect("render");
        std::fs::write(at("m.conf"), &newer).expect("write");
        let e = nginx.apply(&desired(100)).await.expect_err("refused");
        assert!(
            matches!(e, AdapterError::Stale { have: 42, want: 41 }),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(at("m.conf")).expect("read"), newer);
        assert!(!std::path::Path::new(&at("reloaded")).exists());
    }
}
