//! Reading the common answers straight into predictions, without building
//! a `serde_json::Value` of the whole document first.
//!
//! Every measured answer is read, and the tree's maps, key strings and
//! frees were a tenth of the instructions of a proxied request
//! (`bench/results/gateway.md`). Here the document is walked once: the
//! wanted member is read into predictions as it is parsed, every other
//! member into a `Value` and dropped (so the document is checked exactly
//! as the general reader checks it).
//!
//! These readers only ever succeed with what the general reader in
//! `super` would return; anything else (a duplicate member, an unusual
//! shape, an error) is `None`, and the caller reads the document the
//! general way, which also says what is wrong (property test
//! `direct_reading_agrees_with_the_general_reader`).

use std::fmt;

use serde::Deserialize as _;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::{Prediction, argmax, instance, read_rows};

/// The instances at the top-level member `key` (`{"<key>": …}`): a list
/// of instances, or one.
pub(super) fn member(key: &str, body: &[u8]) -> Option<Vec<Prediction>> {
    whole(
        body,
        Member {
            key,
            read: Instances,
        },
    )
}

/// OIP V2: the output tensor named `name`, or the first (`None`), read in
/// the layout of its shape.
pub(super) fn v2_output(name: Option<&str>, body: &[u8]) -> Option<Vec<Prediction>> {
    let tensor = whole(
        body,
        Member {
            key: "outputs",
            read: Outputs { name },
        },
    )??;
    let Some(Value::Array(data)) = &tensor.data else {
        return None;
    };
    let shape: Vec<usize> = match &tensor.shape {
        Some(Value::Array(s)) => s
            .iter()
            .filter_map(Value::as_u64)
            .map(|d| d as usize)
            .collect(),
        _ => Vec::new(),
    };
    read_rows(data, &shape).ok()
}

/// The whole document read by `seed`, with nothing but whitespace after.
fn whole<'de, S: DeserializeSeed<'de>>(body: &'de [u8], seed: S) -> Option<S::Value> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let read = seed.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(read)
}

/// A top-level object's member `key`, read by `read`; any other member is
/// read as a `Value` and dropped. A missing or repeated `key` is an error.
struct Member<'k, R> {
    key: &'k str,
    read: R,
}

impl<'de, R: DeserializeSeed<'de> + Clone> DeserializeSeed<'de> for Member<'_, R> {
    type Value = R::Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<R::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, R: DeserializeSeed<'de> + Clone> Visitor<'de> for Member<'_, R> {
    type Value = R::Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "an object with {:?}", self.key)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<R::Value, A::Error> {
        let mut found = None;
        while let Some(wanted) = map.next_key_seed(IsKey(self.key))? {
            if !wanted {
                map.next_value::<Value>()?;
            } else if found.is_some() {
                return Err(de::Error::custom("repeated member"));
            } else {
                found = Some(map.next_value_seed(self.read.clone())?);
            }
        }
        found.ok_or_else(|| de::Error::custom("no such member"))
    }
}

/// Whether an object's key is the one wanted (compared where it was
/// parsed, not copied).
struct IsKey<'k>(&'k str);

impl<'de> DeserializeSeed<'de> for IsKey<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for IsKey<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        Ok(v == self.0)
    }
}

/// A list of instances, or one instance.
#[derive(Clone, Copy)]
struct Instances;

impl<'de> DeserializeSeed<'de> for Instances {
    type Value = Vec<Prediction>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// A lone instance's reading, as a list of one.
macro_rules! one {
    ($($visit:ident($t:ty)),*) => {$(
        fn $visit<E: de::Error>(self, v: $t) -> Result<Self::Value, E> {
            Instance.$visit(v).map(|p| vec![p])
        }
    )*};
}

impl<'de> Visitor<'de> for Instances {
    type Value = Vec<Prediction>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("instances")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(1));
        while let Some(p) = seq.next_element_seed(Instance)? {
            out.push(p);
        }
        Ok(out)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Instance.visit_map(map).map(|p| vec![p])
    }
    one!(
        visit_str(&str),
        visit_bool(bool),
        visit_u64(u64),
        visit_i64(i64),
        visit_f64(f64)
    );
}

/// One instance, read as `super::instance` reads its `Value`.
#[derive(Clone, Copy)]
struct Instance;

impl<'de> DeserializeSeed<'de> for Instance {
    type Value = Prediction;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Prediction, D::Error> {
        d.deserialize_any(self)
    }
}

fn label(class: String) -> Prediction {
    Prediction {
        class: Some(class),
        confidence: None,
        value: None,
    }
}

impl<'de> Visitor<'de> for Instance {
    type Value = Prediction;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an instance")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Prediction, E> {
        Ok(label(v.to_owned()))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Prediction, E> {
        Ok(label(v.to_string()))
    }
    // Integer outputs are classes too (e.g. 0/1 labels).
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Prediction, E> {
        Ok(Prediction {
            value: Some(v as f64),
            ..label(v.to_string())
        })
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Prediction, E> {
        Ok(Prediction {
            value: Some(v as f64),
            ..label(v.to_string())
        })
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Prediction, E> {
        Ok(Prediction {
            class: None,
            confidence: None,
            value: Some(v),
        })
    }
    /// Class scores: numbers only.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Prediction, A::Error> {
        let mut scores = Vec::with_capacity(seq.size_hint().unwrap_or(4));
        while let Some(x) = seq.next_element_seed(Score)? {
            scores.push(x);
        }
        argmax(&scores).ok_or_else(|| de::Error::custom("no scores"))
    }
    /// An object instance (rarer, with several spellings): read as a
    /// `Value` and by the general reader.
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Prediction, A::Error> {
        let v = Value::deserialize(de::value::MapAccessDeserializer::new(map))?;
        instance(&v).map_err(de::Error::custom)
    }
}

/// A number (`Value::as_f64`); anything else is an error.
#[derive(Clone, Copy)]
struct Score;

impl<'de> DeserializeSeed<'de> for Score {
    type Value = f64;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<f64, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Score {
    type Value = f64;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a score")
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
        Ok(v as f64)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
        Ok(v as f64)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
        Ok(v)
    }
}

/// One V2 output tensor's members that are read.
#[derive(Default)]
struct Tensor {
    data: Option<Value>,
    shape: Option<Value>,
}

/// V2 `outputs`: the tensor named `name` (the first whose `name` is that
/// string), or the first. `None` inside: no such tensor.
#[derive(Clone, Copy)]
struct Outputs<'n> {
    name: Option<&'n str>,
}

impl<'de> DeserializeSeed<'de> for Outputs<'_> {
    type Value = Option<Tensor>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Outputs<'_> {
    type Value = Option<Tensor>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("outputs")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut chosen = None;
        while chosen.is_none() {
            let Some((name, tensor)) = seq.next_element_seed(TensorSeed)? else {
                break;
            };
            if self.name.is_none() || name.as_ref().and_then(Value::as_str) == self.name {
                chosen = Some(tensor);
            }
        }
        while seq.next_element::<Value>()?.is_some() {}
        Ok(chosen)
    }
}

/// One output tensor (an object): its `name`, `data` and `shape`, each
/// at most once.
#[derive(Clone, Copy)]
struct TensorSeed;

impl<'de> DeserializeSeed<'de> for TensorSeed {
    type Value = (Option<Value>, Tensor);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TensorSeed {
    type Value = (Option<Value>, Tensor);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an output tensor")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut name = None;
        let mut t = Tensor::default();
        while let Some(key) = map.next_key_seed(TensorKey)? {
            let slot = match key {
                Some(TensorField::Name) => &mut name,
                Some(TensorField::Data) => &mut t.data,
                Some(TensorField::Shape) => &mut t.shape,
                None => {
                    map.next_value::<Value>()?;
                    continue;
                }
            };
            if slot.is_some() {
                return Err(de::Error::custom("repeated member"));
            }
            *slot = Some(map.next_value()?);
        }
        Ok((name, t))
    }
}

enum TensorField {
    Name,
    Data,
    Shape,
}

/// A tensor's key: one of the members read, or `None`.
struct TensorKey;

impl<'de> DeserializeSeed<'de> for TensorKey {
    type Value = Option<TensorField>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for TensorKey {
    type Value = Option<TensorField>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(match v {
            "name" => Some(TensorField::Name),
            "data" => Some(TensorField::Data),
            "shape" => Some(TensorField::Shape),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rollgate_core::Protocol;

    use super::super::{extract, extract_general, extract_v2_output_general};
    use super::{member, v2_output};

    /// JSON text, objects' keys drawn from the names the readers look
    /// for, repeated keys included (which a `Value` cannot hold).
    fn json() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_string()),
            any::<bool>().prop_map(|b| b.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            (-10.0..10.0f64).prop_map(|x| format!("{x:?}")),
            Just("-0".to_string()),
            Just("1e400".to_string()),
            Just("0.5e-3".to_string()),
            prop::sample::select(vec![
                "\"cat\"",
                "\"\"",
                "\"a\\u00e9\"",
                "\"x\\\"y\"",
                "\"\\ud800\""
            ])
            .prop_map(str::to_string),
        ];
        leaf.prop_recursive(4, 40, 5, |inner| {
            let key = prop::sample::select(vec![
                "predictions",
                "outputs",
                "out",
                "name",
                "data",
                "shape",
                "label",
                "class",
                "prediction",
                "probabilities",
                "scores",
                "confidence",
                "other",
            ]);
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                prop::collection::vec((key, inner), 0..5).prop_map(|members| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(k, v)| format!("\"{k}\":{v}"))
                        .collect();
                    format!("{{{}}}", members.join(","))
                }),
            ]
        })
    }

    /// Documents shaped like answers (so the direct readers succeed
    /// often), and anything.
    fn answers() -> impl Strategy<Value = String> {
        let number = prop_oneof![
            any::<i32>().prop_map(|n| n.to_string()),
            (0.0..1.0f64).prop_map(|x| format!("{x:?}")),
        ];
        let scores =
            prop::collection::vec(number.clone(), 0..4).prop_map(|s| format!("[{}]", s.join(",")));
        let instance = prop_oneof![number.clone(), scores.clone(), json()];
        prop_oneof![
            prop::collection::vec(instance.clone(), 0..4)
                .prop_map(|i| format!("{{\"predictions\":[{}]}}", i.join(","))),
            (instance, json()).prop_map(|(i, other)| format!(
                "{{\"other\":{other},\"out\":{i}}}"
            )),
            (
                prop::collection::vec(number, 0..7),
                prop::collection::vec(0u8..4, 0..3),
                prop::sample::select(vec!["\"a\"", "\"b\"", "1"]),
                json(),
            )
                .prop_map(|(data, shape, name, other)| {
                    let shape: Vec<String> = shape.iter().map(u8::to_string).collect();
                    format!(
                        "{{\"model_name\":\"m\",\"outputs\":[{other},{{\"name\":{name},\"shape\":[{}],\"data\":[{}]}},{{\"name\":\"a\",\"data\":[1,2],\"shape\":[1,2]}}]}}",
                        shape.join(","),
                        data.join(",")
                    )
                }),
            json(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever a direct reader returns, the general reader returns
        /// too; where it returns nothing, `extract` is the general reader.
        #[test]
        fn direct_reading_agrees_with_the_general_reader(doc in answers()) {
            let body = doc.as_bytes();
            if let Some(p) = member("predictions", body) {
                prop_assert_eq!(Ok(p), extract_general(Protocol::KserveV1, None, body));
            }
            if let Some(p) = member("out", body) {
                prop_assert_eq!(Ok(p), extract_general(Protocol::Json, Some("/out"), body));
            }
            if let Some(p) = v2_output(None, body) {
                prop_assert_eq!(Ok(p), extract_general(Protocol::OipV2, None, body));
            }
            for name in ["a", "b"] {
                if let Some(p) = v2_output(Some(name), body) {
                    prop_assert_eq!(Ok(p), extract_v2_output_general(name, body));
                }
            }
            for (protocol, pointer) in [
                (Protocol::KserveV1, None),
                (Protocol::Json, Some("/out")),
                (Protocol::OipV2, None),
            ] {
                prop_assert_eq!(
                    extract(protocol, pointer, body),
                    extract_general(protocol, pointer, body)
                );
            }
        }
    }

    /// The answers real model servers give are read directly (the
    /// property above is not won by never reading anything).
    #[test]
    fn the_common_answers_are_read_directly() {
        for (key, body) in [
            (
                "predictions",
                &br#"{"predictions":[[0.1,0.9],[0.7,0.3]]}"#[..],
            ),
            (
                "predictions",
                br#"{"predictions":["cat", 1, -2, 2.5, true]}"#,
            ),
            (
                "predictions",
                br#"{"predictions":[{"label":"x","confidence":0.9}]}"#,
            ),
            ("out", br#"{"id":"7","out":3}"#),
        ] {
            assert!(
                member(key, body).is_some(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let v2 = br#"{"model_name":"m","id":"1","parameters":{},"outputs":[
            {"name":"predict","shape":[2],"datatype":"INT64","data":[1,0]},
            {"name":"predict_proba","shape":[2,2],"datatype":"FP64","data":[0.1,0.9,0.8,0.2]}]}"#;
        assert!(v2_output(None, v2).is_some());
        let named = v2_output(Some("predict_proba"), v2).expect("read directly");
        assert_eq!(named[1].class.as_deref(), Some("0"));
        assert_eq!(Ok(named), extract_v2_output_general("predict_proba", v2));
    }

    /// A repeated member is left to the general reader (which keeps the
    /// last, as `serde_json` does).
    #[test]
    fn a_repeated_member_is_read_the_general_way() {
        let body = br#"{"predictions":[1],"predictions":["b"]}"#;
        assert_eq!(member("predictions", body), None);
        let p = extract(Protocol::KserveV1, None, body).expect("valid");
        assert_eq!(p[0].class.as_deref(), Some("b"));
    }
}
