//! Every request's id (`x-request-id`): the client's, when it sent a
//! usable one, else one made here. It goes upstream with the request (and
//! its shadow copy: both arms' logs name the same request) and back on
//! every answer, the gateway's own refusals included, so that a user, a
//! model server's log and a label sent later can all name one request.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

/// The header carrying it.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
pub(super) const REQUEST_ID: HeaderName = HeaderName::from_static(REQUEST_ID_HEADER);

/// The longest client id kept; a longer one (or one with other than
/// visible ASCII) is replaced, not echoed.
const MAX_CLIENT_ID: usize = 128;

/// The client's id if usable, else a new one.
pub(super) fn of(headers: &HeaderMap) -> HeaderValue {
    headers
        .get(&REQUEST_ID)
        .filter(|v| usable(v.as_bytes()))
        .cloned()
        .unwrap_or_else(made)
}

fn usable(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= MAX_CLIENT_ID && id.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// A new id: this process's random prefix and a counter (32 hex digits),
/// unique across processes and restarts without a lock or a syscall per
/// request. Not a secret, and not meant to be unguessable.
fn made() -> HeaderValue {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        // The standard library's per-process random keys, with the time
        // and the process id mixed in.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        h.finish()
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let id = format!("{prefix:016x}{n:016x}");
    HeaderValue::from_str(&id).unwrap_or(HeaderValue::from_static("0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usable_client_id_is_kept_and_any_other_replaced() {
        let mut h = HeaderMap::new();
        let made_one = of(&h);
        assert_eq!(made_one.len(), 32);
        assert_ne!(of(&h), made_one, "each made id is new");
        h.insert(&REQUEST_ID, HeaderValue::from_static("order-42/a"));
        assert_eq!(of(&h), "order-42/a");
        for bad in ["", "has space", &"x".repeat(129)] {
            h.insert(
                &REQUEST_ID,
                HeaderValue::from_str(bad).expect("a header value"),
            );
            let id = of(&h);
            assert_ne!(id.as_bytes(), bad.as_bytes(), "{bad:?} replaced");
            assert_eq!(id.len(), 32);
        }
    }
}
