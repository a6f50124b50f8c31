//! Starting a peer's process for a test (nginx, Envoy, an API server):
//! a free port, and a bounded wait until it listens. A peer that is not
//! installed is skipped with a note locally and fails in CI (`CI` set).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a peer may take to listen.
const LISTEN_WITHIN: Duration = Duration::from_secs(20);

/// An address on 127.0.0.1 free a moment ago.
pub fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").to_string()
}

/// Starts a data plane with `command` and waits (bounded: 20 s) until it
/// listens on `addr`; `None` (locally, with a note) where the program is
/// not installed, a failure in CI. `log` is shown if it never listens.
pub fn listening(command: &mut Command, what: &str, addr: &str, log: &str) -> Option<Child> {
    let mut child = match command.stdout(Stdio::null()).stderr(Stdio::null()).spawn() {
        Ok(child) => child,
        Err(_) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: needs {what}");
            return None;
        }
        Err(e) => panic!("CI needs {what}: {e}"),
    };
    let started = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        if started.elapsed() > LISTEN_WITHIN {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} did not listen on {addr}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{what} exited ({status}) before it listened on {addr}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(child)
}

/// Stops an nginx started in the foreground with `-c conf`: `nginx -s
/// stop` (the master stops its workers; killing the master alone would
/// leave them running), then the master reaped, killed if it has not
/// exited within 5 s.
pub fn stop_nginx(binary: &str, conf: &str, master: &mut Child) {
    let _ = Command::new(binary)
        .args(["-c", conf, "-s", "stop"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        if let Ok(Some(_)) = master.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = master.kill();
    let _ = master.wait();
}
