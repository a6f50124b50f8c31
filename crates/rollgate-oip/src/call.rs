//! What every gRPC peer of a unary call writes and reads around the
//! message: the content type, the status (in trailers, or in the headers of
//! a "trailers-only" answer), its percent-encoded message, and a message
//! compressed with gzip. The gateway and the model kit both answer calls,
//! so this lives here, once.

use std::borrow::Cow;

use http::Response;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::{Code, FrameError, unframe};

pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
pub const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");

/// A message that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("messages compressed with {0:?} cannot be read")]
    Encoding(String),
    #[error("gzip: {0}")]
    Gzip(#[from] std::io::Error),
    #[error("the message inflates beyond {0} bytes")]
    TooLarge(usize),
}

/// The one message of a unary call's body, uncompressed: one compressed
/// with gzip (the call's `grpc-encoding`) is inflated within `limit`
/// bytes; other encodings cannot be read.
pub fn read_message<'a>(
    headers: &HeaderMap,
    body: &'a [u8],
    limit: usize,
) -> Result<Cow<'a, [u8]>, MessageError> {
    use std::io::Read;
    let (compressed, message) = unframe(body)?;
    if !compressed {
        return Ok(Cow::Borrowed(message));
    }
    let encoding = headers
        .get(GRPC_ENCODING)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    if !encoding.eq_ignore_ascii_case("gzip") {
        return Err(MessageError::Encoding(encoding));
    }
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(message)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)?;
    if out.len() > limit {
        return Err(MessageError::TooLarge(limit));
    }
    Ok(Cow::Owned(out))
}

/// An answer: `body` (a framed message) with gRPC's content type; its
/// trailers are the body's.
pub fn answer<B>(body: B) -> Response<B> {
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    r
}

/// The trailers of a call that succeeded.
pub fn ok_trailers() -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert(GRPC_STATUS, HeaderValue::from_static(Code::Ok.as_header()));
    t
}

/// A call ended without a message ("trailers-only": the status in the
/// headers), as gRPC clients expect instead of an HTTP error status.
pub fn trailers_only<B>(empty: B, code: Code, message: &str) -> Response<B> {
    let mut r = answer(empty);
    let h = r.headers_mut();
    h.insert(GRPC_STATUS, HeaderValue::from_static(code.as_header()));
    if let Ok(v) = HeaderValue::from_str(&percent_encoded(message)) {
        h.insert(GRPC_MESSAGE, v);
    }
    r
}

/// `grpc-message` is percent-encoded: anything outside printable ASCII,
/// and `%` itself.
fn percent_encoded(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(
            percent_encoded("no model \"x\" 100%"),
            "no model \"x\" 100%25"
        );
        assert_eq!(percent_encoded("é\n"), "%C3%A9%0A");
    }

    #[test]
    fn trailers_only_carries_the_status_and_its_message() {
        let r = trailers_only((), Code::NotFound, "no model \"x\"");
        assert_eq!(r.headers()[GRPC_STATUS], "5");
        assert_eq!(r.headers()[GRPC_MESSAGE], "no model \"x\"");
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/grpc");
        assert_eq!(ok_trailers()[GRPC_STATUS], "0");
    }

    #[test]
    fn gzip_messages_are_read_within_the_limit_and_others_refused() {
        use std::io::Write;
        let bytes = b"a message, twice: a message".to_vec();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&bytes).expect("gzip");
        let gz = gz.finish().expect("gzip");
        let mut framed = vec![1];
        framed.extend_from_slice(&(gz.len() as u32).to_be_bytes());
        framed.extend_from_slice(&gz);
        let mut h = HeaderMap::new();
        assert!(matches!(
            read_message(&h, &framed, 1 << 20),
            Err(MessageError::Encoding(e)) if e.is_empty()
        ));
        h.insert(GRPC_ENCODING, HeaderValue::from_static("gzip"));
        assert_eq!(
            read_message(&h, &framed, 1 << 20).expect("read"),
            &bytes[..]
        );
        assert!(matches!(
            read_message(&h, &framed, 2),
            Err(MessageError::TooLarge(2))
        ));
        let plain = crate::frame(&bytes);
        assert_eq!(read_message(&h, &plain, 2).expect("read"), &bytes[..]);
        assert!(matches!(
            read_message(&h, &framed[..7], 2),
            Err(MessageError::Frame(_))
        ));
    }
}
