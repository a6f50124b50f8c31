//! Every request's id (`x-request-id`): the client's, when it sent a
//! usable one, else one made here. It goes upstream with the request (and
//! its shadow copy: both arms' logs name the same request) and back on
//! every answer, the gateway's own refusals included, so that a user, a
//! model server's log and a label sent later can all name one request.

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

/// The header carrying it.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
pub(super) const REQUEST_ID: HeaderName = HeaderName::from_static(REQUEST_ID_HEADER);

/// The longest client id kept; a longer one (or one with other than
/// visible ASCII) is replaced, not echoed.
const MAX_CLIENT_ID: usize = 128;

/// The client's id if usable, else a new one, set on the request (to go
/// upstream with it) only then.
pub(super) fn of(headers: &mut HeaderMap) -> HeaderValue {
    if let Some(theirs) = headers.get(&REQUEST_ID).filter(|v| usable(v.as_bytes())) {
        return theirs.clone();
    }
    let id = made();
    headers.insert(REQUEST_ID, id.clone());
    id
}

fn usable(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= MAX_CLIENT_ID && id.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// A new id: 128 random bits (32 hex digits) from the thread's
/// cryptographically secure generator, without a lock or a syscall per
/// request. Unguessable on purpose: a label sent later names a request by
/// its id, so a client able to predict the ids the gateway will make could
/// send its own request under one first and have a real request's label
/// judge its answer.
fn made() -> HeaderValue {
    let v: u128 = rand::random();
    // Hex by hand: `format!` costs more than the rest of the id together
    // (measured with callgrind, bench/results/gateway.md).
    let mut id = [0u8; 32];
    hex((v >> 64) as u64, &mut id[..16]);
    hex(v as u64, &mut id[16..]);
    HeaderValue::from_bytes(&id).unwrap_or(HeaderValue::from_static("0"))
}

/// `v` as 16 lowercase hex digits into `out`.
fn hex(v: u64, out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, o) in out.iter_mut().enumerate() {
        *o = DIGITS[((v >> (60 - 4 * i)) & 0xf) as usize];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usable_client_id_is_kept_and_any_other_replaced() {
        let made_one = of(&mut HeaderMap::new());
        assert_eq!(made_one.len(), 32);
        assert!(
            made_one.as_bytes().iter().all(u8::is_ascii_hexdigit),
            "{made_one:?}"
        );
        assert_ne!(of(&mut HeaderMap::new()), made_one, "each made id is new");
        let mut h = HeaderMap::new();
        h.insert(&REQUEST_ID, HeaderValue::from_static("order-42/a"));
        assert_eq!(of(&mut h), "order-42/a");
        for bad in ["", "has space", &"x".repeat(129)] {
            h.insert(
                &REQUEST_ID,
                HeaderValue::from_str(bad).expect("a header value"),
            );
            let id = of(&mut h);
            assert_ne!(id.as_bytes(), bad.as_bytes(), "{bad:?} replaced");
            assert_eq!(id.len(), 32);
            assert_eq!(
                h.get(&REQUEST_ID),
                Some(&id),
                "the request carries it upstream"
            );
        }
        let mut out = [0u8; 16];
        hex(0xabc, &mut out);
        assert_eq!(out, *b"0000000000000abc");
    }
}
