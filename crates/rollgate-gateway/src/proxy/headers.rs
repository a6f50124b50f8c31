//! The headers of one hop: which are never passed on (the connection's
//! own, and those a `Connection` header names), what a revision is sent,
//! and what a client is given back.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::wire::Wire;
use crate::routing::{Direct, Target};

/// Headers of one hop, never passed on: the connection's own, and those
/// the gateway sets itself (`host`, `content-length`). (Names, not
/// `HeaderName`s: a `const` array of those is built and dropped at every
/// use.)
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "host",
    "content-length",
];

fn hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(&name.as_str())
}

/// The headers a `Connection` header names: of this hop too (RFC 9110,
/// 7.6.1), never passed on. Empty without one (the common case costs a
/// lookup).
fn named_by_connection(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        // `keep-alive`, `close` and the like: no header to drop beyond the
        // hop-by-hop ones (the common case allocates nothing).
        .filter(|t| {
            !t.eq_ignore_ascii_case("close")
                && !HOP_BY_HOP.iter().any(|h| h.eq_ignore_ascii_case(t))
        })
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect()
}

/// The headers a revision is sent: the client's, without this hop's, its
/// `Accept-Encoding` and any the revision sets itself; then the revision's
/// own; a plain-HTTP upstream's `Host` unless the revision set one; and the
/// answer asked for unencoded.
pub(super) fn upstream_headers(
    headers: &HeaderMap,
    target: &Target,
    direct: Option<&Direct>,
    wire: Wire,
) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(headers.len() + target.headers.len() + 2);
    let named = named_by_connection(headers);
    for (k, v) in headers {
        let overridden = target.headers.iter().any(|(name, _)| name == k);
        if !hop_by_hop(k) && k != header::ACCEPT_ENCODING && !overridden && !named.contains(k) {
            out.append(k.clone(), v.clone());
        }
    }
    // The revision's own headers (a `Host`, an auth token).
    for (k, v) in &target.headers {
        out.append(k.clone(), v.clone());
    }
    if let Some(d) = direct
        && !out.contains_key(header::HOST)
    {
        out.insert(header::HOST, d.host.clone());
    }
    // Answers are measured, so the gateway asks for them unencoded;
    // the client gets them unencoded too (identity is always
    // acceptable to it), and the gateway spends no CPU on compression.
    match wire {
        Wire::Rest => out.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        ),
        Wire::Grpc => {
            // gRPC's own: trailers expected (`te` is hop-by-hop, so it
            // is set here, not passed on), messages uncompressed.
            out.insert(header::TE, HeaderValue::from_static("trailers"));
            out.insert(
                HeaderName::from_static("grpc-accept-encoding"),
                HeaderValue::from_static("identity"),
            )
        }
    };
    out
}

/// The upstream's headers a client is given: hop-by-hop ones dropped (in
/// place: an answer has one or two of them, and removing those costs less
/// than copying all the others).
pub(super) fn passed_on(mut headers: HeaderMap) -> HeaderMap {
    for name in named_by_connection(&headers) {
        headers.remove(name);
    }
    let mut present = 0u16;
    for k in headers.keys() {
        if let Some(i) = HOP_BY_HOP.iter().position(|h| *h == k.as_str()) {
            present |= 1 << i;
        }
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(*name);
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use http::header::{HeaderMap, HeaderValue};

    /// An answer's headers reach the client without the hop-by-hop ones
    /// (every value of each), the others kept with all their values, in
    /// order within each name (the order HTTP gives meaning to: the
    /// relative order of different names carries none, and removing in
    /// place may change it); a map without any is returned as it came.
    #[test]
    fn only_hop_by_hop_headers_are_dropped() {
        // A header the `Connection` header names is of this hop too.
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("X-Secret-Hop, close"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("x-kept", HeaderValue::from_static("2"));
        let out = super::passed_on(h);
        assert!(out.get("x-secret-hop").is_none() && out.get("connection").is_none());
        assert_eq!(out.get("x-kept").map(|v| v.as_bytes()), Some(&b"2"[..]));
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("content-type", "application/json"),
            ("connection", "keep-alive"),
            ("set-cookie", "a=1"),
            ("keep-alive", "timeout=5"),
            ("set-cookie", "b=2"),
            ("content-length", "27"),
            ("proxy-connection", "close"),
            ("x-model", "m"),
            ("trailer", "grpc-status"),
            ("upgrade", "h2c"),
            ("te", "trailers"),
            ("host", "upstream:8080"),
            ("transfer-encoding", "chunked"),
            ("connection", "x-model"),
        ] {
            h.append(k, HeaderValue::from_static(v));
        }
        let out = super::passed_on(h);
        let mut kept: Vec<(&str, Vec<&str>)> = out
            .keys()
            .map(|k| {
                let values = out.get_all(k).iter().map(|v| v.to_str().unwrap_or("?"));
                (k.as_str(), values.collect())
            })
            .collect();
        kept.sort();
        assert_eq!(
            kept,
            [
                ("content-type", vec!["application/json"]),
                ("set-cookie", vec!["a=1", "b=2"]),
                // x-model is named by `Connection: x-model`: of this hop.
            ]
        );
        let mut plain = HeaderMap::new();
        plain.append("content-type", HeaderValue::from_static("text/plain"));
        assert_eq!(super::passed_on(plain.clone()), plain);
    }
}
