//! The Open Inference Protocol's gRPC service, on the REST port (HTTP/2
//! with prior knowledge or by ALPN; the accept loop tells them apart), as
//! KServe's and MLServer's model servers answer it. The same model, the
//! same faults, the same answers as `POST /v2/models/{name}/infer`.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use prost::Message;
use rollgate_net::WholeBody;
use rollgate_oip::{self as oip, Code, Method};

use crate::config::{Fault, ServerConfig};

/// Answers a gRPC call: the response, its status, and whether it was an
/// inference of the served model.
pub(crate) async fn handle(
    cfg: &ServerConfig,
    req: Request<Incoming>,
) -> (Response<WholeBody>, Code, bool) {
    let Some(method) = Method::of_path(req.uri().path()) else {
        return failed(Code::Unimplemented, "unknown method");
    };
    let (parts, body) = req.into_parts();
    let Ok(body) = Limited::new(body, LIMIT).collect().await else {
        return failed(
            Code::InvalidArgument,
            "could not read the body (limit 8 MiB)",
        );
    };
    let body = body.to_bytes();
    let message = match oip::read_message(&parts.headers, &body, LIMIT) {
        Ok(m) => m,
        Err(e @ oip::MessageError::Encoding(_)) => {
            return failed(Code::Unimplemented, &e.to_string());
        }
        Err(e) => return failed(Code::InvalidArgument, &e.to_string()),
    };
    let message = &message[..];
    let name = cfg.name.as_str();
    let not_served = |m: &str| failed(Code::NotFound, &format!("model {m:?} is not served here"));
    match method {
        Method::ServerLive => ok(&oip::ServerLiveResponse { live: true }),
        Method::ServerReady => ok(&oip::ServerReadyResponse { ready: true }),
        Method::ServerMetadata => ok(&oip::ServerMetadataResponse {
            name: "rollgate-modelkit".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: Vec::new(),
        }),
        Method::ModelReady => match oip::ModelReadyRequest::decode(message) {
            Ok(r) if r.name == name => ok(&oip::ModelReadyResponse { ready: true }),
            Ok(r) => not_served(&r.name),
            Err(e) => failed(Code::InvalidArgument, &e.to_string()),
        },
        Method::ModelMetadata => match oip::ModelMetadataRequest::decode(message) {
            Ok(r) if r.name == name => {
                let tensor = |n: &str, width: i64| oip::TensorMetadata {
                    name: n.into(),
                    datatype: "FP64".into(),
                    shape: vec![-1, width],
                };
                ok(&oip::ModelMetadataResponse {
                    name: name.into(),
                    versions: Vec::new(),
                    platform: "rollgate-linear".into(),
                    inputs: vec![tensor("x", cfg.model.weights.len() as i64)],
                    outputs: vec![tensor("probabilities", 2)],
                })
            }
            Ok(r) => not_served(&r.name),
            Err(e) => failed(Code::InvalidArgument, &e.to_string()),
        },
        Method::ModelInfer => {
            let request = match oip::ModelInferRequest::decode(message) {
                Ok(r) => r,
                Err(e) => return failed(Code::InvalidArgument, &e.to_string()),
            };
            if request.model_name != name {
                return not_served(&request.model_name);
            }
            let (resp, code) = infer(cfg, &request).await;
            (resp, code, true)
        }
    }
}

const LIMIT: usize = 8 << 20;

async fn infer(
    cfg: &ServerConfig,
    request: &oip::ModelInferRequest,
) -> (Response<WholeBody>, Code) {
    let width = cfg.model.weights.len();
    let features = match features(request) {
        Ok(f) if !f.is_empty() && f.len() % width == 0 => f,
        Ok(_) => {
            let message = format!("inputs[0] must hold rows of {width} features");
            return status_only(Code::InvalidArgument, &message);
        }
        Err(e) => return status_only(Code::InvalidArgument, &e),
    };
    let mut data = Vec::with_capacity(features.len() / width * 2);
    for row in features.chunks(width) {
        match cfg.model.predict_proba(row) {
            Ok(p) => data.extend_from_slice(&p),
            Err(e) => return status_only(Code::InvalidArgument, &e),
        }
    }
    match cfg.faults.inject().await {
        Some(Fault::Unavailable) => return status_only(Code::Unavailable, "model unavailable"),
        Some(Fault::Failure) => return status_only(Code::Internal, "injected failure"),
        None => {}
    }
    let rows = (data.len() / 2) as i64;
    let answer = oip::ModelInferResponse {
        model_name: cfg.name.clone(),
        id: request.id.clone(),
        outputs: vec![oip::InferOutputTensor {
            name: "probabilities".into(),
            datatype: "FP64".into(),
            shape: vec![rows, 2],
            contents: Some(oip::InferTensorContents {
                fp64_contents: data,
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    (message(&answer), Code::Ok)
}

/// `inputs[0]`'s values as numbers: FP64, FP32 or INT64 contents, or raw
/// little-endian FP64/FP32.
fn features(request: &oip::ModelInferRequest) -> Result<Vec<f64>, String> {
    let input = request
        .inputs
        .first()
        .ok_or("the request must have inputs[0]")?;
    if let Some(raw) = request.raw_input_contents.first() {
        let (values, rest): (Vec<f64>, &[u8]) = match input.datatype.as_str() {
            "FP64" => {
                let (c, rest) = raw.as_chunks::<8>();
                (c.iter().map(|&b| f64::from_le_bytes(b)).collect(), rest)
            }
            "FP32" => {
                let (c, rest) = raw.as_chunks::<4>();
                (
                    c.iter()
                        .map(|&b| f64::from(f32::from_le_bytes(b)))
                        .collect(),
                    rest,
                )
            }
            other => return Err(format!("raw inputs of datatype {other:?} are not read")),
        };
        return if rest.is_empty() {
            Ok(values)
        } else {
            Err("raw input contents are not whole elements".into())
        };
    }
    let c = input.contents.as_ref().ok_or("inputs[0] has no contents")?;
    Ok(match input.datatype.as_str() {
        "FP64" => c.fp64_contents.clone(),
        "FP32" => c.fp32_contents.iter().map(|&x| f64::from(x)).collect(),
        "INT64" => c.int64_contents.iter().map(|&x| x as f64).collect(),
        other => return Err(format!("inputs of datatype {other:?} are not read")),
    })
}

fn ok(m: &impl Message) -> (Response<WholeBody>, Code, bool) {
    (message(m), Code::Ok, false)
}

fn failed(code: Code, why: &str) -> (Response<WholeBody>, Code, bool) {
    let (resp, code) = status_only(code, why);
    (resp, code, false)
}

/// A message, then status OK in the trailers.
fn message(m: &impl Message) -> Response<WholeBody> {
    oip::answer(WholeBody::with_trailers(
        oip::encode(m),
        Some(oip::ok_trailers()),
    ))
}

/// No message: the status in the headers ("trailers-only").
fn status_only(code: Code, why: &str) -> (Response<WholeBody>, Code) {
    (
        oip::trailers_only(WholeBody::new(Bytes::new()), code, why),
        code,
    )
}
