//! The body of every response the gateway gives, over either wire.

use bytes::Bytes;
use http::header::HeaderMap;
use rollgate_net::WholeBody;

use crate::stream::Streamed;

/// What the gateway answers: whole (bytes, then trailers for gRPC), or an
/// answer beyond the response limit passed on as it arrives.
#[derive(Debug)]
pub(crate) enum Body {
    Whole(WholeBody),
    Streamed(Box<Streamed>),
}

impl Body {
    pub fn new(data: Bytes) -> Body {
        Body::Whole(WholeBody::new(data))
    }

    pub fn with_trailers(data: Bytes, trailers: Option<HeaderMap>) -> Body {
        Body::Whole(WholeBody::with_trailers(data, trailers))
    }
}

impl Default for Body {
    fn default() -> Body {
        Body::Whole(WholeBody::default())
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Body::Whole(b) => std::pin::Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|f| f.map_err(|never| match never {}))),
            Body::Streamed(s) => std::pin::Pin::new(s.as_mut()).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Whole(b) => b.is_end_stream(),
            Body::Streamed(s) => s.is_end_stream(),
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            Body::Whole(b) => b.size_hint(),
            Body::Streamed(s) => s.size_hint(),
        }
    }
}
