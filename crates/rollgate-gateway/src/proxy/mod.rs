//! The request path: route, forward, measure, and maybe mirror.
//!
//! The gateway measures and never judges. Failures are attributed to the
//! revision that caused them (5xx, timeout, connect error, unreadable
//! output); a client's 4xx is counted apart; gateway limits (413, 503 at
//! capacity) are the gateway's own and count against no revision. Request
//! and response payloads are never logged.
//!
//! A call goes through `endpoint` (what it asks for, over REST or gRPC),
//! `admission` (its body read, a capacity slot, a tester's pin, the split),
//! `forward` (sent to a revision and its answer read back, with the hop's
//! `headers` and content `encoding`), `answer` (counted against that
//! revision and made the user's response) and `mirror` (a copy sent to the
//! shadow, paired with the champion's answer); `wire` is what differs
//! between REST and gRPC (with `crate::grpc`, gRPC's side of it). The
//! imports read one way: endpoint → admission → mirror → answer → forward
//! → headers, encoding → wire.

mod admission;
mod answer;
mod encoding;
mod endpoint;
mod forward;
mod headers;
mod mirror;
mod request_id;
mod wire;

pub use answer::REVISION_HEADER;
pub(crate) use endpoint::handle;
pub use request_id::REQUEST_ID_HEADER;
