//! What the gateway's test files share: routes of one model `m`.
#![allow(dead_code)] // each test file uses its own part of these

use rollgate_core::Protocol;
use rollgate_gateway::{ModelRoute, Upstream};

/// An upstream of revision `revision` at `url`.
pub fn up(revision: &str, url: &str) -> Upstream {
    Upstream {
        revision: revision.into(),
        url: url.into(),
        timeout: None,
        served_name: None,
        headers: Default::default(),
        grpc_url: None,
    }
}

/// Model `m` (KServe V1) served by its champion at `champion` only.
pub fn route(champion: &str) -> ModelRoute {
    ModelRoute {
        name: "m".into(),
        protocol: Protocol::KserveV1,
        json_path: None,
        key_field: None,
        salt: None,
        assignment: Default::default(),
        output_pointer: None,
        output: None,
        confidence_threshold: 0.9,
        numeric_tolerance: 1e-6,
        fallback_to_champion: false,
        champion: up("champ", champion),
        candidate: None,
        shadow: None,
        epoch: None,
        mirror_only: false,
        pinning: false,
        record_answers: false,
    }
}

/// One HTTP/1.1 request off a raw connection (headers, then a
/// `Content-Length` body), for upstreams that answer byte by byte: its head
/// in lower case and its body. `buf` keeps what was read beyond it. `None`
/// when the connection ends first.
pub async fn read_request(
    conn: &mut tokio::net::TcpStream,
    buf: &mut Vec<u8>,
) -> Option<(String, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let mut chunk = [0u8; 4096];
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = buf[head_end..head_end + len].to_vec();
    buf.drain(..head_end + len);
    Some((head, body))
}
