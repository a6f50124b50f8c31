//! Bodies larger than their limit, passed on as they arrive.
//!
//! The gateway reads an answer whole, up to `max_response_bytes`, because
//! it measures it (predictions, pairing), may compress it for the client
//! and, whole, can count its outcome at once. An answer that outgrows the
//! limit while nothing needs it whole (a `json` model whose output is not
//! read, a metadata call) is not refused: what was read is sent on, then
//! the rest as it comes, so it costs no more memory than the limit. Its
//! outcome is counted when it ends: complete, broken, or past the
//! revision's timeout.
//!
//! Requests alike, with `max_body_bytes`: read whole when they fit (so a
//! call can be sent again on a fresh connection, or mirrored); beyond the
//! limit, streamed to the one revision that serves them when nothing needs
//! them whole (no shadow, no sticky key to find in the body).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use rollgate_core::{FailureClass, RevisionStats};

use crate::recorder::Sharded;

/// An answer's body as read.
pub(crate) enum Read {
    /// Whole, within the limit: its bytes and trailers.
    Whole(Bytes, Option<Box<HeaderMap>>),
    /// Beyond the limit: the part read, and the rest still to come.
    Partial(Bytes, Incoming),
}

/// Why a body could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadError {
    /// Beyond the limit, and it may not stream.
    TooLarge,
    /// Broken off by its sender.
    Broken,
}

/// Reads `body` whole if it fits in `limit` bytes; else, when `may_stream`,
/// stops at the limit and keeps the rest unread.
pub(crate) async fn read(
    mut body: Incoming,
    limit: usize,
    may_stream: bool,
) -> Result<Read, ReadError> {
    let mut first: Option<Bytes> = None;
    let mut more = BytesMut::new();
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| ReadError::Broken)?;
        let frame = match frame.into_data() {
            Ok(data) => {
                let read = first.as_ref().map_or(0, Bytes::len) + more.len() + data.len();
                if read > limit {
                    if !may_stream {
                        return Err(ReadError::TooLarge);
                    }
                    let mut prefix = BytesMut::from(first.unwrap_or_default());
                    prefix.extend_from_slice(&more);
                    prefix.extend_from_slice(&data);
                    return Ok(Read::Partial(prefix.freeze(), body));
                }
                // One chunk (the usual answer) is kept as it came; more
                // are joined.
                match &first {
                    None => first = Some(data),
                    Some(_) => more.extend_from_slice(&data),
                }
                continue;
            }
            Err(frame) => frame,
        };
        if let Ok(t) = frame.into_trailers() {
            trailers = Some(Box::new(t));
        }
    }
    let whole = match first {
        None => Bytes::new(),
        Some(first) if more.is_empty() => first,
        Some(first) => {
            let mut all = BytesMut::with_capacity(first.len() + more.len());
            all.extend_from_slice(&first);
            all.extend_from_slice(&more);
            all.freeze()
        }
    };
    Ok(Read::Whole(whole, trailers))
}

/// A request body beyond the limit: the part read, then the rest as the
/// client sends it (bounded by the revision's timeout, which covers the
/// whole call).
#[derive(Debug)]
pub(crate) struct Prefixed {
    prefix: Option<Bytes>,
    rest: Incoming,
}

impl Prefixed {
    pub fn new(prefix: Bytes, rest: Incoming) -> Prefixed {
        Prefixed {
            prefix: Some(prefix),
            rest,
        }
    }
}

impl Body for Prefixed {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        match this.prefix.take() {
            Some(prefix) => Poll::Ready(Some(Ok(Frame::data(prefix)))),
            None => Pin::new(&mut this.rest).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        prefixed_hint(self.prefix.as_ref(), &self.rest)
    }
}

/// The size of a part read and a rest to come.
fn prefixed_hint(prefix: Option<&Bytes>, rest: &Incoming) -> SizeHint {
    let prefix = prefix.map_or(0, |p| p.len() as u64);
    let rest = rest.size_hint();
    let mut hint = SizeHint::new();
    hint.set_lower(prefix + rest.lower());
    if let Some(upper) = rest.upper() {
        hint.set_upper(prefix + upper);
    }
    hint
}

/// What is sent upstream: a body held whole, or one streamed (boxed: a
/// request is moved through hyper's client a few times).
pub(crate) type Outgoing = http_body_util::Either<http_body_util::Full<Bytes>, Box<Prefixed>>;

/// Where an answer's outcome is counted: a revision's stats (borrowed on
/// the request path, shared by a streamed answer) and the key's unit group.
pub(crate) struct Tally<S = Arc<Sharded<RevisionStats>>> {
    pub stats: S,
    pub unit: u16,
}

impl<S: std::ops::Deref<Target = Sharded<RevisionStats>>> Tally<S> {
    pub fn failure(&self, class: FailureClass) {
        self.stats.with(|s| {
            s.record_failure(class);
            s.unit_mut(self.unit).record_failures(1);
        });
    }

    pub fn client_error(&self) {
        self.stats.with(|s| {
            s.record_client_error();
            s.unit_mut(self.unit).record_client_error();
        });
    }

    /// A success, with the classes of its read predictions.
    pub fn success<'a>(&self, latency_us: u64, classes: impl Iterator<Item = &'a str>) {
        self.stats.with(|s| {
            s.record_success(latency_us, classes);
            s.unit_mut(self.unit).record_success(latency_us);
        });
    }

    /// An answer of `status` that arrived in full after `latency_us`, its
    /// output not read.
    pub fn answered(&self, status: StatusCode, latency_us: u64) {
        if status.is_server_error() {
            self.failure(FailureClass::Upstream5xx);
        } else if status.is_client_error() {
            self.client_error();
        } else {
            self.success(latency_us, std::iter::empty());
        }
    }
}

/// Why a streamed answer ended before its end.
#[derive(Debug, thiserror::Error)]
enum Cut {
    #[error("the model's answer did not finish within the revision's timeout")]
    Deadline,
    #[error("the model's answer broke off: {0}")]
    Broken(hyper::Error),
}

/// An answer passed on as it arrives: the part read, then the rest,
/// bounded by the revision's deadline. Counted (when `tally` is set) once
/// it ends; one whose client goes away first stays uncounted, as an
/// unanswered request does.
pub(crate) struct Streamed {
    prefix: Option<Bytes>,
    rest: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    status: StatusCode,
    started: Instant,
    tally: Option<Tally>,
    ended: bool,
}

impl Streamed {
    pub fn new(
        prefix: Bytes,
        rest: Incoming,
        status: StatusCode,
        (started, deadline): (Instant, Instant),
        tally: Option<Tally>,
    ) -> Streamed {
        Streamed {
            prefix: Some(prefix),
            rest,
            deadline: Box::pin(tokio::time::sleep_until(deadline.into())),
            status,
            started,
            tally,
            ended: false,
        }
    }

    fn end(&mut self, outcome: Result<(), FailureClass>) {
        self.ended = true;
        if let Some(t) = self.tally.take() {
            match outcome {
                Ok(()) => t.answered(self.status, self.started.elapsed().as_micros() as u64),
                Err(class) => t.failure(class),
            }
        }
    }

    /// Reads the rest and throws it away (a mirrored answer nobody
    /// receives), then counts it.
    pub async fn drain(mut self) {
        let mut body = Pin::new(&mut self);
        while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            if frame.is_err() {
                break;
            }
        }
    }
}

impl std::fmt::Debug for Streamed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streamed")
            .field("status", &self.status)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl Body for Streamed {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(prefix) = this.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        if this.ended {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.rest).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                // A server that knows the length stops polling once it is
                // sent: the end is seen here, not at a final `None`.
                if this.rest.is_end_stream() {
                    this.end(Ok(()));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.end(Err(FailureClass::Upstream5xx));
                Poll::Ready(Some(Err(Box::new(Cut::Broken(e)))))
            }
            Poll::Ready(None) => {
                this.end(Ok(()));
                Poll::Ready(None)
            }
            Poll::Pending => {
                if this.deadline.as_mut().poll(cx).is_ready() {
                    this.end(Err(FailureClass::Timeout));
                    return Poll::Ready(Some(Err(Box::new(Cut::Deadline))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.prefix.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        prefixed_hint(self.prefix.as_ref(), &self.rest)
    }
}
