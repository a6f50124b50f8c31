//! gRPC's length-prefixed messages (one per unary call), and the rewrite of
//! a request's model name.

use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{DecodeContext, WireType, decode_key, encode_key, encode_varint, skip_field};

/// A body that is not one gRPC message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("a gRPC message needs a 5-byte prefix, got {0} bytes")]
    Short(usize),
    #[error("the prefix announces {announced} bytes, the body has {actual}")]
    Length { announced: usize, actual: usize },
    #[error("not a protobuf message: {0}")]
    Protobuf(String),
}

/// `message` framed for the wire: uncompressed, its length, its bytes.
pub fn encode(message: &impl prost::Message) -> Bytes {
    let len = message.encoded_len();
    let mut out = BytesMut::with_capacity(5 + len);
    out.put_u8(0);
    out.put_u32(len as u32);
    // Cannot fail: the buffer has room for `encoded_len` bytes.
    let _ = message.encode(&mut out);
    out.freeze()
}

/// Message bytes already encoded, framed for the wire uncompressed.
pub fn frame(message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + message.len());
    out.put_u8(0);
    out.put_u32(message.len() as u32);
    out.put_slice(message);
    out.freeze()
}

/// The one message of a unary call's body: whether it is compressed (by
/// the call's `grpc-encoding`), and its bytes.
pub fn unframe(body: &[u8]) -> Result<(bool, &[u8]), FrameError> {
    if body.len() < 5 {
        return Err(FrameError::Short(body.len()));
    }
    let announced = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let message = &body[5..];
    if message.len() != announced {
        return Err(FrameError::Length {
            announced,
            actual: message.len(),
        });
    }
    Ok((body[0] & 1 == 1, message))
}

/// `message` with its field 1 set to `name`, every other field copied as
/// it came. Field 1 is the model's name in `ModelInferRequest`,
/// `ModelReadyRequest` and `ModelMetadataRequest` alike; rewriting it on
/// the wire keeps fields this crate does not model.
pub fn rename(message: &[u8], name: &str) -> Result<Vec<u8>, FrameError> {
    let bad = |e: prost::DecodeError| FrameError::Protobuf(e.to_string());
    let mut out = Vec::with_capacity(message.len() + name.len());
    encode_key(1, WireType::LengthDelimited, &mut out);
    encode_varint(name.len() as u64, &mut out);
    out.extend_from_slice(name.as_bytes());
    let mut rest = message;
    while !rest.is_empty() {
        let before = rest;
        let (tag, wire) = decode_key(&mut rest).map_err(bad)?;
        skip_field(wire, tag, &mut rest, DecodeContext::default()).map_err(bad)?;
        let field = &before[..before.len() - rest.len()];
        if !(tag == 1 && wire == WireType::LengthDelimited) {
            out.extend_from_slice(field);
        }
    }
    Ok(out)
}

/// The model a request names in its field 1 (`ModelInferRequest`'s
/// `model_name`, `ModelReadyRequest`'s and `ModelMetadataRequest`'s
/// `name`), read without decoding the rest.
pub fn model_name(message: &[u8]) -> Result<String, FrameError> {
    #[derive(Clone, PartialEq, prost::Message)]
    struct Named {
        #[prost(string, tag = "1")]
        name: String,
    }
    <Named as prost::Message>::decode(message)
        .map(|n| n.name)
        .map_err(|e| FrameError::Protobuf(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::*;
    use prost::Message;

    fn request() -> ModelInferRequest {
        ModelInferRequest {
            model_name: "fraud".into(),
            model_version: "7".into(),
            id: "req-1".into(),
            inputs: vec![InferInputTensor {
                name: "x".into(),
                datatype: "FP64".into(),
                shape: vec![2, 2],
                contents: Some(InferTensorContents {
                    fp64_contents: vec![1.0, -2.0, 3.5, 0.0],
                    ..Default::default()
                }),
                ..Default::default()
            }],
            raw_input_contents: vec![vec![1, 2, 3]],
            ..Default::default()
        }
    }

    #[test]
    fn a_framed_message_unframes_to_itself() {
        let framed = encode(&request());
        let (compressed, message) = unframe(&framed).expect("one message");
        assert!(!compressed);
        assert_eq!(
            ModelInferRequest::decode(message).expect("decodes"),
            request()
        );
    }

    #[test]
    fn bodies_that_are_not_one_message_are_refused() {
        assert_eq!(unframe(&[0, 0, 0]), Err(FrameError::Short(3)));
        let framed = encode(&request());
        let mut two = framed.to_vec();
        two.extend_from_slice(&framed);
        assert!(matches!(unframe(&two), Err(FrameError::Length { .. })));
        assert!(matches!(
            unframe(&framed[..framed.len() - 1]),
            Err(FrameError::Length { .. })
        ));
        assert_eq!(unframe(&[1, 0, 0, 0, 1, 9]), Ok((true, &[9u8][..])));
    }

    #[test]
    fn rename_changes_the_name_and_nothing_else() {
        let original = request().encode_to_vec();
        let renamed = rename(&original, "champion").expect("renamed");
        let back = ModelInferRequest::decode(&renamed[..]).expect("decodes");
        assert_eq!(model_name(&renamed).as_deref(), Ok("champion"));
        assert_eq!(model_name(&original).as_deref(), Ok("fraud"));
        assert_eq!(
            back,
            ModelInferRequest {
                model_name: "champion".into(),
                ..request()
            }
        );
        // The same rewrite serves the other requests naming a model.
        let ready = ModelReadyRequest {
            name: "fraud".into(),
            version: "1".into(),
        }
        .encode_to_vec();
        let back =
            ModelReadyRequest::decode(&rename(&ready, "b").expect("renamed")[..]).expect("decodes");
        assert_eq!((back.name.as_str(), back.version.as_str()), ("b", "1"));
        // An empty message gains the name; garbage is refused.
        let back = ModelInferRequest::decode(&rename(&[], "m").expect("empty")[..]).expect("ok");
        assert_eq!(back.model_name, "m");
        assert!(rename(&[0x0a, 0x05, b'a'], "m").is_err());
    }
}
