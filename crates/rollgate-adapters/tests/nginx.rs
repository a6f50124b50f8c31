//! The nginx adapter against a real nginx on 127.0.0.1 (Debian's; `CI`
//! fails without it, a local run skips), seeded by the adapter itself.

use std::process::{Child, Command};
use std::time::Duration;

use rollgate_adapters::kit::{self, Proxy, Upstreams};
use rollgate_adapters::{HttpClient, for_plane};
use rollgate_store::DataPlane;

/// An nginx in the foreground (its pid is the child's), stopped and
/// reaped when dropped.
struct Nginx {
    binary: String,
    child: Child,
    conf: String,
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        kit::stop_nginx(&self.binary, &self.conf, &mut self.child);
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
/// proxied by its split, the version it serves for confirmation.
fn conf(d: &str, include: &str, addr: &str) -> String {
    format!(
        "daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
         error_log {d}/error.log warn;\nevents {{ worker_connections 256; }}\n\
         http {{\n  access_log off;\n\
         client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         include {include};\n\
         server {{\n    listen {addr};\n\
         location / {{\n      proxy_pass http://$rollgate_m_upstream;\n\
         proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }}\n\
         location = /rollgate/routing/m {{ return 200 $rollgate_m_version; }}\n  }}\n}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nginx_adapter_passes_the_kit() {
    let upstreams = Upstreams::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_string_lossy().into_owned();
    let (binary, addr) = (binary(), kit::free_addr());
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
    for (path, contents) in
        rollgate_adapters::seed(&plane, kit::MODEL, &upstreams.champion_url()).expect("seed")
    {
        std::fs::write(path, contents).expect("seed");
    }
    std::fs::write(&nginx_conf, conf(&d, &include, &addr)).expect("nginx.conf");
    let log = format!("{d}/error.log");
    let Some(child) = kit::listening(
        Command::new(&binary).args(["-c", &nginx_conf, "-e", &log]),
        "nginx (apt-get install nginx)",
        &addr,
        &log,
    ) else {
        return;
    };
    let _nginx = Nginx {
        binary,
        child,
        conf: nginx_conf,
        _dir: dir,
    };
    let peer = Proxy {
        adapter: for_plane(&plane, &HttpClient::new(Duration::from_secs(2))),
        url: format!("http://{addr}/"),
    };
    kit::run(&peer, &upstreams).await;
}
