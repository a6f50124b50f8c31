//! Content encoding: answers are measured unencoded, so an upstream's
//! gzip or deflate is decoded (within the response limit), and an answer is
//! gzip-compressed for a client that accepts it, as a reverse proxy does.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};

/// Answers at least this large are compressed for a client that accepts
/// gzip (smaller ones gain less than the header costs).
const COMPRESS_FROM: usize = 1024;

/// Whether the client accepts gzip (`Accept-Encoding` lists `gzip` or `*`
/// without `q=0`).
pub(super) fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let coding = parts.next().unwrap_or("");
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
        })
}

/// Whether the answer's `Vary` already names `Accept-Encoding` (or `*`):
/// an upstream that compresses says so too, and saying it twice is noise.
fn varies_by_encoding(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|name| {
            let name = name.trim();
            name == "*" || name.eq_ignore_ascii_case("accept-encoding")
        })
}

/// The answer, gzip-compressed (fast level) when the client accepts it,
/// it is large enough and not already encoded. Answers are measured
/// unencoded (the gateway asks upstreams for identity); compressing for the
/// client is the gateway's own job, like a reverse proxy's.
pub(super) fn compressed(headers: &mut HeaderMap, body: Bytes) -> Bytes {
    if body.len() < COMPRESS_FROM || headers.contains_key(header::CONTENT_ENCODING) {
        return body;
    }
    match gzip(&body) {
        Some(out) => {
            headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            if !varies_by_encoding(headers) {
                headers.append(header::VARY, HeaderValue::from_static("accept-encoding"));
            }
            Bytes::from(out)
        }
        None => body,
    }
}

/// `data` as a gzip member (RFC 1952), deflated by a compressor kept per
/// thread. Written here rather than with `flate2::write::GzEncoder`, which
/// builds a fresh deflate state (hundreds of KiB, zeroed) for every answer:
/// measured, that tripled the gateway's CPU per 1 KiB answer
/// (bench/results/gateway.md, "Compressing for clients").
fn gzip(data: &[u8]) -> Option<Vec<u8>> {
    use flate2::{Compress, Compression, FlushCompress, Status};
    thread_local! {
        static DEFLATE: std::cell::RefCell<Compress> =
            std::cell::RefCell::new(Compress::new(Compression::fast(), false));
    }
    // Header: magic, deflate, no flags, no mtime, no extra flags, unknown OS.
    let mut out = Vec::with_capacity(data.len() / 2 + 64);
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255]);
    let done = DEFLATE.with(|d| {
        let mut d = d.borrow_mut();
        d.reset();
        // Each pass either finishes or fills the reserved room; bounded all
        // the same.
        for _ in 0..1024 {
            let read = d.total_in() as usize;
            if out.capacity() - out.len() < 64 {
                out.reserve(data.len() / 2 + 64);
            }
            match d.compress_vec(&data[read..], &mut out, FlushCompress::Finish) {
                Ok(Status::StreamEnd) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
        false
    });
    if !done {
        return None;
    }
    let mut crc = flate2::Crc::new();
    crc.update(data);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    Some(out)
}

/// The answer unencoded: an upstream that compresses despite being asked
/// for identity (gzip or deflate) is decoded, within `limit` bytes, and the
/// `Content-Encoding` dropped, so the answer is measured and passed on as
/// what it is; `None` when it decodes to more than `limit`. Anything else
/// (another encoding, a body that does not decode) is passed on as it
/// came.
pub(super) fn decoded(headers: &mut HeaderMap, body: Bytes, limit: usize) -> Option<Bytes> {
    use std::io::Read;
    let Some(encoding) = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase())
    else {
        return Some(body);
    };
    let mut out = Vec::new();
    let cap = limit as u64 + 1;
    let read = match encoding.as_str() {
        "gzip" | "x-gzip" => flate2::read::MultiGzDecoder::new(&body[..])
            .take(cap)
            .read_to_end(&mut out),
        "deflate" => flate2::read::ZlibDecoder::new(&body[..])
            .take(cap)
            .read_to_end(&mut out),
        "identity" => {
            headers.remove(header::CONTENT_ENCODING);
            return Some(body);
        }
        _ => return Some(body),
    };
    match read {
        Ok(n) if n <= limit => {
            headers.remove(header::CONTENT_ENCODING);
            Some(Bytes::from(out))
        }
        Ok(_) => None,
        Err(_) => Some(body),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use http::header::{HeaderMap, HeaderValue};

    /// Compressible and incompressible answers, small and large, and the
    /// same compressor reused: each decodes to what went in.
    #[test]
    fn gzip_members_decode_to_the_input() {
        let mut seed = 7u64;
        let mut noise = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u8
        };
        let inputs: Vec<Vec<u8>> = vec![
            br#"{"predictions":[[0.1,0.9]]}"#.repeat(200),
            (0..300_000).map(|_| noise()).collect(),
            vec![b'x'; 1],
        ];
        for input in inputs.iter().chain(inputs.iter()) {
            let out = super::gzip(input).expect("gzip");
            let mut back = Vec::new();
            flate2::read::GzDecoder::new(&out[..])
                .read_to_end(&mut back)
                .expect("a valid gzip member");
            assert_eq!(&back, input);
        }
    }

    /// An upstream that names `Accept-Encoding` in `Vary` is not echoed a
    /// second time when the gateway compresses.
    #[test]
    fn accept_encoding_is_named_in_vary_once() {
        let big = bytes::Bytes::from(vec![b'a'; super::COMPRESS_FROM * 2]);
        for upstream_vary in [
            None,
            Some("Accept-Encoding"),
            Some("origin, accept-encoding"),
        ] {
            let mut h = HeaderMap::new();
            if let Some(v) = upstream_vary {
                h.insert(http::header::VARY, HeaderValue::from_static(v));
            }
            let _ = super::compressed(&mut h, big.clone());
            let named = h
                .get_all(http::header::VARY)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .filter(|n| n.trim().eq_ignore_ascii_case("accept-encoding"))
                .count();
            assert_eq!(named, 1, "{upstream_vary:?}: {h:?}");
        }
    }
}
