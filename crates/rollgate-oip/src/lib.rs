//! The Open Inference Protocol's gRPC service (`inference.GRPCInferenceService`,
//! KServe's and MLServer's `dataplane.proto`) as it travels: its messages,
//! gRPC's framing and status codes.
//!
//! The messages are written out with prost's derive rather than generated
//! by `prost-build`, which needs `protoc` at build time; they follow the
//! `.proto` field for field (tags included), and prost skips fields it does
//! not know, so a server's additions are tolerated. The gateway rewrites
//! only one field of a request (the model's name, [`rename`]), on the wire,
//! so nothing it does not model is lost.

mod call;
mod frame;
mod messages;
mod status;

pub use call::{
    GRPC_ENCODING, GRPC_MESSAGE, GRPC_STATUS, MessageError, answer, ok_trailers, read_message,
    trailers_only,
};
pub use frame::{FrameError, encode, frame, model_name, rename, unframe};
pub use messages::*;
pub use status::Code;

/// The service's full name, as it appears in request paths.
pub const SERVICE: &str = "inference.GRPCInferenceService";

/// The service's methods rollgate knows; others are passed over as unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    ServerLive,
    ServerReady,
    ServerMetadata,
    ModelReady,
    ModelMetadata,
    ModelInfer,
}

impl Method {
    /// The method a request path names (`/inference.GRPCInferenceService/ModelInfer`).
    pub fn of_path(path: &str) -> Option<Method> {
        let name = path
            .strip_prefix('/')?
            .strip_prefix(SERVICE)?
            .strip_prefix('/')?;
        Some(match name {
            "ServerLive" => Method::ServerLive,
            "ServerReady" => Method::ServerReady,
            "ServerMetadata" => Method::ServerMetadata,
            "ModelReady" => Method::ModelReady,
            "ModelMetadata" => Method::ModelMetadata,
            "ModelInfer" => Method::ModelInfer,
            _ => return None,
        })
    }

    /// The request path of this method.
    pub fn path(self) -> &'static str {
        match self {
            Method::ServerLive => "/inference.GRPCInferenceService/ServerLive",
            Method::ServerReady => "/inference.GRPCInferenceService/ServerReady",
            Method::ServerMetadata => "/inference.GRPCInferenceService/ServerMetadata",
            Method::ModelReady => "/inference.GRPCInferenceService/ModelReady",
            Method::ModelMetadata => "/inference.GRPCInferenceService/ModelMetadata",
            Method::ModelInfer => "/inference.GRPCInferenceService/ModelInfer",
        }
    }
}

/// Whether a request's `content-type` is gRPC's (`application/grpc`, with
/// or without a `+proto` suffix or parameters).
pub fn is_grpc(content_type: &[u8]) -> bool {
    content_type
        .get(..16)
        .is_some_and(|p| p.eq_ignore_ascii_case(b"application/grpc"))
        && matches!(content_type.get(16), None | Some(b'+' | b';'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_methods_and_back() {
        for m in [
            Method::ServerLive,
            Method::ServerReady,
            Method::ServerMetadata,
            Method::ModelReady,
            Method::ModelMetadata,
            Method::ModelInfer,
        ] {
            assert_eq!(Method::of_path(m.path()), Some(m));
        }
        assert_eq!(
            Method::of_path("/inference.GRPCInferenceService/RepositoryIndex"),
            None
        );
        assert_eq!(Method::of_path("/other.Service/ModelInfer"), None);
        assert_eq!(Method::of_path("ModelInfer"), None);
    }

    #[test]
    fn grpc_content_types() {
        assert!(is_grpc(b"application/grpc"));
        assert!(is_grpc(b"application/grpc+proto"));
        assert!(is_grpc(b"Application/GRPC; charset=x"));
        assert!(!is_grpc(b"application/grpc-web"));
        assert!(!is_grpc(b"application/json"));
        assert!(!is_grpc(b"application/grp"));
    }
}
