//! A real nginx on 127.0.0.1 whose routing of [`MODEL`] the nginx adapter
//! sets: the nginx adapter's own peer, and the data plane standing in for
//! a Kubernetes route's (whose controller a test plays).

use std::process::{Child, Command};
use std::time::Duration;

use rollgate_store::DataPlane;

use super::{MODEL, free_addr, listening, stop_nginx};
use crate::{Adapter, HttpClient, for_plane};

/// An nginx in the foreground (its pid is the child's), stopped and
/// reaped when dropped.
#[derive(Debug)]
pub struct Nginx {
    binary: String,
    child: Child,
    conf: String,
    /// Its `DataPlane::Nginx` declaration.
    pub plane: DataPlane,
    /// Where it listens (`host:port`).
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        stop_nginx(&self.binary, &self.conf, &mut self.child);
    }
}

/// nginx where Debian puts it, else as `PATH` finds it.
fn binary() -> String {
    if std::path::Path::new("/usr/sbin/nginx").exists() {
        "/usr/sbin/nginx".into()
    } else {
        "nginx".into()
    }
}

/// nginx's configuration: the adapter's include file, `location /`
/// proxied by its split (who answered in `x-upstream`), a copy of every
/// request to `mirror_to` when given (nginx's `mirror`: a subrequest with
/// the same headers and body, its answer thrown away), the version it
/// serves for confirmation.
fn conf(d: &str, include: &str, addr: &str, mirror_to: Option<&str>) -> String {
    let (mirror, mirror_location) = match mirror_to {
        Some(to) => (
            "mirror /rollgate-mirror;\n      ".to_string(),
            format!(
                "location = /rollgate-mirror {{ internal; proxy_pass http://{to}$request_uri;\n\
                 proxy_http_version 1.1; proxy_set_header Connection \"\"; }}\n"
            ),
        ),
        None => (String::new(), String::new()),
    };
    format!(
        "daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
         error_log {d}/error.log warn;\nevents {{ worker_connections 256; }}\n\
         http {{\n  access_log off;\n\
         client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         include {include};\n\
         server {{\n    listen {addr};\n\
         location / {{\n      {mirror}proxy_pass http://$rollgate_m_upstream;\n\
         proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n\
         add_header X-Upstream $upstream_addr always;\n    }}\n\
         {mirror_location}\
         location = /rollgate/routing/m {{ return 200 $rollgate_m_version; }}\n  }}\n}}\n"
    )
}

impl Nginx {
    /// An nginx routing [`MODEL`] to `champion` (an upstream URL: the
    /// adapter's seed) until its adapter says otherwise, mirroring every
    /// request to `mirror_to` (`host:port`, rollgate's gateway) when
    /// given; `None` (locally, with a note) where nginx is absent, a
    /// failure in CI.
    pub fn start(champion: &str, mirror_to: Option<&str>) -> Option<Nginx> {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().to_string_lossy().into_owned();
        let (binary, addr) = (binary(), free_addr());
        let (include, nginx_conf) = (format!("{d}/rollgate-m.conf"), format!("{d}/nginx.conf"));
        let plane = DataPlane::Nginx {
            include_file: include.clone(),
            reload_command: vec![
                binary.clone(),
                "-c".into(),
                nginx_conf.clone(),
                "-s".into(),
                "reload".into(),
            ],
            confirm_url: format!("http://{addr}/rollgate/routing/m"),
            key: "$http_x_rollgate_key".into(),
        };
        // nginx needs the variables the include defines to start: the seed.
        for (path, contents) in crate::seed(&plane, MODEL, champion).expect("seed") {
            std::fs::write(path, contents).expect("seed");
        }
        std::fs::write(&nginx_conf, conf(&d, &include, &addr, mirror_to)).expect("nginx.conf");
        let log = format!("{d}/error.log");
        let child = listening(
            Command::new(&binary).args(["-c", &nginx_conf, "-e", &log]),
            "nginx (apt-get install nginx)",
            &addr,
            &log,
        )?;
        Some(Nginx {
            binary,
            child,
            conf: nginx_conf,
            plane,
            addr,
            _dir: dir,
        })
    }

    /// Its adapter.
    pub fn adapter(&self) -> Box<dyn Adapter> {
        for_plane(&self.plane, &HttpClient::new(Duration::from_secs(2)))
    }
}
