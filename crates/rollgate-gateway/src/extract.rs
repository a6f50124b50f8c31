//! Reading predictions out of model responses, and comparing two answers.
//!
//! Protocol-aware defaults (KServe V1: `/predictions`; OIP V2: the first
//! output tensor), overridable by a JSON pointer. One [`Prediction`] per
//! instance of a batch. An instance may be a label (string or bool), a number
//! (a regression output, or an integer class), a vector of probabilities
//! (class = argmax, confidence = max) or an object with `label`/`class`/
//! `prediction` and `probabilities`/`scores`/`confidence`.

use rollgate_core::Protocol;
use serde_json::Value;

/// One instance's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// The predicted class, if the output is a classification.
    pub class: Option<String>,
    /// The model's confidence in `class`, if it reports one.
    pub confidence: Option<f64>,
    /// The numeric output, if it is a number.
    pub value: Option<f64>,
}

/// The response could not be read as predictions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid model output: {0}")]
pub struct ExtractError(pub String);

fn bad(msg: impl Into<String>) -> ExtractError {
    ExtractError(msg.into())
}

mod direct;

/// Extracts the predictions of a response body.
pub fn extract(
    protocol: Protocol,
    pointer: Option<&str>,
    body: &[u8],
) -> Result<Vec<Prediction>, ExtractError> {
    let read = match (protocol, pointer) {
        (Protocol::OipV2, None) => direct::v2_output(None, body),
        (_, None) => direct::member("predictions", body),
        (_, Some(p)) => top_member(p).and_then(|key| direct::member(key, body)),
    };
    match read {
        Some(predictions) => Ok(predictions),
        None => extract_general(protocol, pointer, body),
    }
}

/// The member a JSON pointer names when it names one of the top-level
/// object's (`/name`, nothing to unescape).
fn top_member(pointer: &str) -> Option<&str> {
    pointer
        .strip_prefix('/')
        .filter(|k| !k.contains(['/', '~']))
}

/// [`extract`] through a `Value` of the whole document: any document, and
/// what is wrong with one that cannot be read.
fn extract_general(
    protocol: Protocol,
    pointer: Option<&str>,
    body: &[u8],
) -> Result<Vec<Prediction>, ExtractError> {
    let doc: Value = serde_json::from_slice(body).map_err(|e| bad(format!("not JSON: {e}")))?;
    if protocol == Protocol::OipV2 && pointer.is_none() {
        return extract_v2(&doc);
    }
    let pointer = pointer.unwrap_or("/predictions");
    let node = doc
        .pointer(pointer)
        .ok_or_else(|| bad(format!("no value at {pointer}")))?;
    match node {
        Value::Array(items) => items.iter().map(instance).collect(),
        other => Ok(vec![instance(other)?]),
    }
}

/// OIP V2: the output tensor named `name` (e.g. `predict_proba`), read
/// with its shape, wherever it is among the outputs.
pub fn extract_v2_output(name: &str, body: &[u8]) -> Result<Vec<Prediction>, ExtractError> {
    match direct::v2_output(Some(name), body) {
        Some(predictions) => Ok(predictions),
        None => extract_v2_output_general(name, body),
    }
}

fn extract_v2_output_general(name: &str, body: &[u8]) -> Result<Vec<Prediction>, ExtractError> {
    let doc: Value = serde_json::from_slice(body).map_err(|e| bad(format!("not JSON: {e}")))?;
    let out = doc
        .get("outputs")
        .and_then(Value::as_array)
        .and_then(|outs| {
            outs.iter()
                .find(|o| o.get("name").and_then(Value::as_str) == Some(name))
        })
        .ok_or_else(|| bad(format!("no output named {name:?}")))?;
    read_tensor(out)
}

/// OIP V2: `outputs[0]` with `data` and `shape`; a `[n, k]` shape with
/// `k > 1` is `n` rows of class scores.
fn extract_v2(doc: &Value) -> Result<Vec<Prediction>, ExtractError> {
    let out = doc
        .pointer("/outputs/0")
        .ok_or_else(|| bad("no outputs[0]"))?;
    read_tensor(out)
}

/// One V2 output tensor: `data` in the layout of `shape`.
fn read_tensor(out: &Value) -> Result<Vec<Prediction>, ExtractError> {
    let data = out
        .get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("outputs[0].data is not an array"))?;
    let shape: Vec<usize> = out
        .get("shape")
        .and_then(Value::as_array)
        .map(|s| {
            s.iter()
                .filter_map(Value::as_u64)
                .map(|d| d as usize)
                .collect()
        })
        .unwrap_or_default();
    read_rows(data, &shape)
}

/// OIP over gRPC: the output tensor named `output` of a
/// `ModelInferResponse` (else the first), read as its JSON twin is: its
/// values from the typed contents of its datatype, or from the raw
/// contents (little-endian, as Triton sends them).
pub fn extract_oip(
    output: Option<&str>,
    response: &rollgate_oip::ModelInferResponse,
) -> Result<Vec<Prediction>, ExtractError> {
    let index = match output {
        Some(name) => response
            .outputs
            .iter()
            .position(|o| o.name == name)
            .ok_or_else(|| bad(format!("no output named {name:?}")))?,
        None => 0,
    };
    let tensor = response
        .outputs
        .get(index)
        .ok_or_else(|| bad("no outputs[0]"))?;
    let data = match response.raw_output_contents.get(index) {
        Some(raw) => raw_values(&tensor.datatype, raw)?,
        None => typed_values(&tensor.datatype, tensor.contents.as_ref())?,
    };
    let shape: Vec<usize> = tensor.shape.iter().map(|&d| d.max(0) as usize).collect();
    read_rows(&data, &shape)
}

fn typed_values(
    datatype: &str,
    c: Option<&rollgate_oip::InferTensorContents>,
) -> Result<Vec<Value>, ExtractError> {
    let Some(c) = c else {
        return Ok(Vec::new());
    };
    let num = |x: f64| Value::from(x);
    Ok(match datatype {
        "BOOL" => c.bool_contents.iter().map(|&b| Value::Bool(b)).collect(),
        "INT8" | "INT16" | "INT32" => c.int_contents.iter().map(|&x| Value::from(x)).collect(),
        "INT64" => c.int64_contents.iter().map(|&x| Value::from(x)).collect(),
        "UINT8" | "UINT16" | "UINT32" => c.uint_contents.iter().map(|&x| Value::from(x)).collect(),
        "UINT64" => c.uint64_contents.iter().map(|&x| Value::from(x)).collect(),
        "FP32" => c.fp32_contents.iter().map(|&x| num(f64::from(x))).collect(),
        "FP64" => c.fp64_contents.iter().map(|&x| num(x)).collect(),
        "BYTES" => c
            .bytes_contents
            .iter()
            .map(|b| Value::String(String::from_utf8_lossy(b).into_owned()))
            .collect(),
        other => return Err(bad(format!("datatype {other:?} has no typed contents"))),
    })
}

/// Raw tensor contents: fixed-width little-endian elements, or for BYTES
/// each element's 4-byte little-endian length, then its bytes.
fn raw_values(datatype: &str, raw: &[u8]) -> Result<Vec<Value>, ExtractError> {
    fn each<const N: usize>(
        raw: &[u8],
        f: impl Fn([u8; N]) -> Value,
    ) -> Result<Vec<Value>, ExtractError> {
        let (elements, rest) = raw.as_chunks::<N>();
        if !rest.is_empty() {
            return Err(bad(format!(
                "raw contents of {} bytes are not {N}-byte elements",
                raw.len()
            )));
        }
        Ok(elements.iter().map(|&e| f(e)).collect())
    }
    match datatype {
        "BOOL" => each::<1>(raw, |b| Value::Bool(b[0] != 0)),
        "INT8" => each::<1>(raw, |b| Value::from(i8::from_le_bytes(b))),
        "UINT8" => each::<1>(raw, |b| Value::from(b[0])),
        "INT16" => each::<2>(raw, |b| Value::from(i16::from_le_bytes(b))),
        "UINT16" => each::<2>(raw, |b| Value::from(u16::from_le_bytes(b))),
        "INT32" => each::<4>(raw, |b| Value::from(i32::from_le_bytes(b))),
        "UINT32" => each::<4>(raw, |b| Value::from(u32::from_le_bytes(b))),
        "INT64" => each::<8>(raw, |b| Value::from(i64::from_le_bytes(b))),
        "UINT64" => each::<8>(raw, |b| Value::from(u64::from_le_bytes(b))),
        "FP32" => each::<4>(raw, |b| Value::from(f64::from(f32::from_le_bytes(b)))),
        "FP64" => each::<8>(raw, |b| Value::from(f64::from_le_bytes(b))),
        "BYTES" => {
            let mut out = Vec::new();
            let mut rest = raw;
            while !rest.is_empty() {
                let (len, tail) = rest
                    .split_first_chunk::<4>()
                    .ok_or_else(|| bad("raw BYTES element without its length"))?;
                let len = u32::from_le_bytes(*len) as usize;
                if tail.len() < len {
                    return Err(bad("raw BYTES element longer than the contents"));
                }
                out.push(Value::String(
                    String::from_utf8_lossy(&tail[..len]).into_owned(),
                ));
                rest = &tail[len..];
            }
            Ok(out)
        }
        other => Err(bad(format!(
            "raw contents of datatype {other:?} cannot be read"
        ))),
    }
}

/// A tensor's values in the layout of `shape`: a `[n, k]` shape with
/// `k > 1` is `n` rows of class scores; otherwise one instance per value.
fn read_rows(data: &[Value], shape: &[usize]) -> Result<Vec<Prediction>, ExtractError> {
    if shape.len() == 2 && shape[1] > 1 {
        let width = shape[1];
        if data.len() != shape[0] * width {
            return Err(bad("outputs[0].data does not match its shape"));
        }
        return data
            .chunks(width)
            .map(|row| probabilities(row).ok_or_else(|| bad("scores must be numbers")))
            .collect();
    }
    data.iter().map(instance).collect()
}

fn probabilities(row: &[Value]) -> Option<Prediction> {
    let scores: Option<Vec<f64>> = row.iter().map(Value::as_f64).collect();
    argmax(&scores?)
}

/// Class scores as a prediction: the class of the highest score (the last
/// of equal ones), and that score as its confidence.
fn argmax(scores: &[f64]) -> Option<Prediction> {
    let (i, &max) = scores
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))?;
    Some(Prediction {
        class: Some(i.to_string()),
        confidence: Some(max),
        value: None,
    })
}

fn instance(v: &Value) -> Result<Prediction, ExtractError> {
    Ok(match v {
        Value::String(s) => Prediction {
            class: Some(s.clone()),
            confidence: None,
            value: None,
        },
        Value::Bool(b) => Prediction {
            class: Some(b.to_string()),
            confidence: None,
            value: None,
        },
        Value::Number(n) => {
            let x = n.as_f64().ok_or_else(|| bad("number out of range"))?;
            Prediction {
                // Integer outputs are classes too (e.g. 0/1 labels).
                class: (n.is_i64() || n.is_u64()).then(|| n.to_string()),
                confidence: None,
                value: Some(x),
            }
        }
        Value::Array(row) => {
            probabilities(row).ok_or_else(|| bad("an instance array must be numeric scores"))?
        }
        Value::Object(o) => {
            let class = ["label", "class", "prediction"]
                .iter()
                .find_map(|k| o.get(*k))
                .map(|c| match c {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                });
            let scores = ["probabilities", "scores"]
                .iter()
                .find_map(|k| o.get(*k))
                .and_then(Value::as_array)
                .and_then(|row| probabilities(row));
            let confidence = ["confidence", "probability", "score"]
                .iter()
                .find_map(|k| o.get(*k))
                .and_then(Value::as_f64)
                .or(scores.as_ref().and_then(|p| p.confidence));
            let class = class.or(scores.and_then(|p| p.class));
            if class.is_none() && confidence.is_none() {
                return Err(bad("object instance without label or scores"));
            }
            Prediction {
                class,
                confidence,
                value: None,
            }
        }
        Value::Null => return Err(bad("null instance")),
    })
}

/// Whether two answers to the same instance agree: same class, or numbers
/// within `tolerance` of each other.
pub fn agree(champion: &Prediction, shadow: &Prediction, tolerance: f64) -> bool {
    match (&champion.class, &shadow.class, champion.value, shadow.value) {
        (_, _, Some(a), Some(b)) => (a - b).abs() <= tolerance,
        (Some(a), Some(b), _, _) => a == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use rollgate_oip::{InferOutputTensor, InferTensorContents, ModelInferResponse};

    fn oip_response(outputs: Vec<InferOutputTensor>, raw: Vec<Vec<u8>>) -> ModelInferResponse {
        ModelInferResponse {
            model_name: "m".into(),
            outputs,
            raw_output_contents: raw,
            ..Default::default()
        }
    }

    fn tensor(
        name: &str,
        datatype: &str,
        shape: Vec<i64>,
        c: Option<InferTensorContents>,
    ) -> InferOutputTensor {
        InferOutputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape,
            contents: c,
            ..Default::default()
        }
    }

    /// A protobuf answer reads as its JSON twin does: typed or raw
    /// contents, by name or first, rows of scores or one value each.
    #[test]
    fn oip_protobuf_answers_read_like_their_json_twins() {
        let scores = InferTensorContents {
            fp64_contents: vec![0.2, 0.8, 0.9, 0.1],
            ..Default::default()
        };
        let labels = InferTensorContents {
            int64_contents: vec![1, 0],
            ..Default::default()
        };
        let r = oip_response(
            vec![
                tensor("predict", "INT64", vec![2], Some(labels)),
                tensor("predict_proba", "FP64", vec![2, 2], Some(scores)),
            ],
            vec![],
        );
        let json = serde_json::json!({ "outputs": [
            { "name": "predict", "shape": [2], "datatype": "INT64", "data": [1, 0] },
            { "name": "predict_proba", "shape": [2, 2], "datatype": "FP64", "data": [0.2, 0.8, 0.9, 0.1] },
        ]})
        .to_string();
        assert_eq!(
            extract_oip(Some("predict_proba"), &r).expect("read"),
            extract_v2_output("predict_proba", json.as_bytes()).expect("read")
        );
        assert_eq!(
            extract_oip(None, &r).expect("read"),
            extract(Protocol::OipV2, None, json.as_bytes()).expect("read")
        );
        let classes: Vec<_> = extract_oip(Some("predict_proba"), &r)
            .expect("read")
            .into_iter()
            .map(|p| p.class)
            .collect();
        assert_eq!(classes, vec![Some("1".to_string()), Some("0".to_string())]);
        assert!(extract_oip(Some("nope"), &r).is_err());

        // Raw little-endian contents, as Triton sends them.
        let raw: Vec<u8> = [0.25f32, 0.75, 0.6, 0.4]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let r = oip_response(vec![tensor("p", "FP32", vec![2, 2], None)], vec![raw]);
        let read = extract_oip(None, &r).expect("raw FP32");
        assert_eq!(read[0].class.as_deref(), Some("1"));
        assert_eq!(read[1].confidence, Some(f64::from(0.6f32)));
        let mut raw = Vec::new();
        for s in ["cat", "dog"] {
            raw.extend_from_slice(&(s.len() as u32).to_le_bytes());
            raw.extend_from_slice(s.as_bytes());
        }
        let r = oip_response(vec![tensor("label", "BYTES", vec![2], None)], vec![raw]);
        let read = extract_oip(None, &r).expect("raw BYTES");
        assert_eq!(read[1].class.as_deref(), Some("dog"));
        let r = oip_response(
            vec![tensor("p", "FP32", vec![1], None)],
            vec![vec![1, 2, 3]],
        );
        assert!(extract_oip(None, &r).is_err(), "3 bytes are no FP32");
        let r = oip_response(
            vec![tensor("label", "BYTES", vec![1], None)],
            vec![vec![9, 0, 0, 0, b'x']],
        );
        assert!(
            extract_oip(None, &r).is_err(),
            "a length beyond the contents"
        );
    }

    use super::*;

    fn classes(p: &[Prediction]) -> Vec<Option<&str>> {
        p.iter().map(|p| p.class.as_deref()).collect()
    }

    #[test]
    fn a_v2_output_is_chosen_by_name_and_keeps_its_shape() {
        let body = br#"{"outputs":[
            {"name":"predict","shape":[2],"datatype":"INT64","data":[1,0]},
            {"name":"predict_proba","shape":[2,2],"datatype":"FP64","data":[0.1,0.9,0.8,0.2]}]}"#;
        let p = extract_v2_output("predict_proba", body).expect("valid");
        assert_eq!(classes(&p), [Some("1"), Some("0")]);
        assert_eq!(p[0].confidence, Some(0.9));
        let predict = extract_v2_output("predict", body).expect("valid");
        assert_eq!(classes(&predict), [Some("1"), Some("0")]);
        assert!(extract_v2_output("nope", body).is_err());
    }

    #[test]
    fn kserve_v1_probabilities_give_argmax_and_max() {
        let p = extract(
            Protocol::KserveV1,
            None,
            br#"{"predictions":[[0.1,0.9],[0.7,0.3]]}"#,
        )
        .expect("valid");
        assert_eq!(classes(&p), vec![Some("1"), Some("0")]);
        assert_eq!(p[0].confidence, Some(0.9));
    }

    #[test]
    fn kserve_v1_labels_and_numbers() {
        let p = extract(
            Protocol::KserveV1,
            None,
            br#"{"predictions":["cat", 1, 2.5, true]}"#,
        )
        .expect("valid");
        assert_eq!(
            classes(&p),
            vec![Some("cat"), Some("1"), None, Some("true")]
        );
        assert_eq!(p[2].value, Some(2.5));
    }

    #[test]
    fn oip_v2_reads_the_first_output_by_shape() {
        let body = br#"{"model_name":"m","outputs":[{"name":"p","shape":[2,2],"datatype":"FP32","data":[0.2,0.8,0.6,0.4]}]}"#;
        let p = extract(Protocol::OipV2, None, body).expect("valid");
        assert_eq!(classes(&p), vec![Some("1"), Some("0")]);
        let flat = br#"{"outputs":[{"name":"y","shape":[3],"datatype":"INT64","data":[1,0,1]}]}"#;
        assert_eq!(
            classes(&extract(Protocol::OipV2, None, flat).expect("valid")),
            vec![Some("1"), Some("0"), Some("1")]
        );
    }

    #[test]
    fn json_pointer_and_objects() {
        let body = br#"{"result":{"items":[{"label":"fraud","confidence":0.97},{"probabilities":[0.3,0.7]}]}}"#;
        let p = extract(Protocol::Json, Some("/result/items"), body).expect("valid");
        assert_eq!(classes(&p), vec![Some("fraud"), Some("1")]);
        assert_eq!(p[0].confidence, Some(0.97));
        assert_eq!(p[1].confidence, Some(0.7));
    }

    #[test]
    fn unreadable_outputs_are_errors() {
        for body in [
            &b"not json"[..],
            br#"{"nope":1}"#,
            br#"{"predictions":[null]}"#,
            br#"{"predictions":[{}]}"#,
        ] {
            assert!(
                extract(Protocol::KserveV1, None, body).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let mismatched = br#"{"outputs":[{"shape":[2,2],"data":[0.1,0.9,0.5]}]}"#;
        assert!(extract(Protocol::OipV2, None, mismatched).is_err());
    }

    #[test]
    fn agreement_uses_class_or_numeric_tolerance() {
        let c = |s: &str| Prediction {
            class: Some(s.into()),
            confidence: None,
            value: None,
        };
        let v = |x: f64| Prediction {
            class: None,
            confidence: None,
            value: Some(x),
        };
        assert!(agree(&c("a"), &c("a"), 0.0));
        assert!(!agree(&c("a"), &c("b"), 0.0));
        assert!(agree(&v(1.0), &v(1.05), 0.1));
        assert!(!agree(&v(1.0), &v(1.5), 0.1));
        assert!(!agree(&c("a"), &v(1.0), 0.1));
    }
}
