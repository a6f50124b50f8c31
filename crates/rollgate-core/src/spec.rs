//! One validator for what a model and its upstreams may be: used by the
//! admin API (422 naming the field), the store (before anything is
//! written) and the gateway (before a route is compiled), so nothing the
//! API accepts is refused by a gateway later.

use crate::protocol::Protocol;

/// A spec field that is not acceptable, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    pub field: String,
    pub message: String,
}

fn bad(field: &str, message: impl Into<String>) -> SpecError {
    SpecError {
        field: field.to_string(),
        message: message.into(),
    }
}

/// A model name: 1–128 characters of `[A-Za-z0-9._-]` (it is a path
/// segment of every protocol's URLs).
pub fn check_model_name(name: &str) -> Result<(), SpecError> {
    // `.` and `..` would name directories where a name fills a path.
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(bad(
            "name",
            format!("must be 1-128 characters of [A-Za-z0-9._-], not . or .., got {name:?}"),
        ))
    }
}

/// How a model is routed and read.
#[derive(Debug, Clone, Copy)]
pub struct ModelShape<'a> {
    pub protocol: Protocol,
    pub json_path: Option<&'a str>,
    pub key_field: Option<&'a str>,
    pub output_pointer: Option<&'a str>,
    pub confidence_threshold: Option<f64>,
    /// OIP V2: the output tensor's name.
    pub output: Option<&'a str>,
}

/// A JSON pointer (RFC 6901) is empty or starts with `/`.
fn check_pointer(field: &str, p: Option<&str>) -> Result<(), SpecError> {
    match p {
        Some(p) if !p.starts_with('/') => Err(bad(
            field,
            format!("a JSON pointer starts with '/', got {p:?}"),
        )),
        _ => Ok(()),
    }
}

/// The gateway's own endpoints, which no model's path may take.
pub const RESERVED_PATHS: [&str; 6] = [
    "/healthz",
    "/metrics",
    "/rollgate/stats",
    "/v2",
    "/v2/health/live",
    "/v2/health/ready",
];

/// Whether a `json` model's path would take a gateway endpoint or the
/// paths of the KServe V1 and Open Inference Protocol models.
pub fn reserved_path(path: &str) -> bool {
    RESERVED_PATHS.contains(&path)
        || ["/v1/models/", "/v2/models/", "/rollgate/"]
            .iter()
            .any(|prefix| path.starts_with(prefix))
}

/// The fields of a model's spec, each on its own.
pub fn check_model(m: &ModelShape) -> Result<(), SpecError> {
    match (m.protocol, m.json_path) {
        (Protocol::Json, Some(p)) if reserved_path(p) => {
            return Err(bad(
                "json_path",
                format!(
                    "{p:?} is the gateway's own or another protocol's path ({}, /v1/models/..., \
                     /v2/models/..., /rollgate/...)",
                    RESERVED_PATHS.join(", ")
                ),
            ));
        }
        (Protocol::Json, Some(p)) if p.starts_with('/') && !p.contains(char::is_whitespace) => {}
        (Protocol::Json, p) => {
            return Err(bad(
                "json_path",
                format!("a json model needs a path starting with '/', got {p:?}"),
            ));
        }
        (_, Some(_)) => {
            return Err(bad("json_path", "only json models are served on a path"));
        }
        (_, None) => {}
    }
    match (m.protocol, m.output) {
        (Protocol::OipV2, Some(o)) if o.trim().is_empty() => {
            return Err(bad("output", "must name an output tensor"));
        }
        (Protocol::OipV2, _) | (_, None) => {}
        (_, Some(_)) => {
            return Err(bad("output", "only oip_v2 models name an output tensor"));
        }
    }
    if m.output.is_some() && m.output_pointer.is_some() {
        return Err(bad("output", "give output or output_pointer, not both"));
    }
    check_pointer("key_field", m.key_field)?;
    check_pointer("output_pointer", m.output_pointer)?;
    if let Some(t) = m.confidence_threshold
        && !(0.0..=1.0).contains(&t)
    {
        return Err(bad(
            "confidence_threshold",
            format!("must be in [0, 1], got {t}"),
        ));
    }
    Ok(())
}

/// A header the gateway sends upstream: a valid HTTP header name and value
/// (no line breaks), and not one the gateway owns (hop-by-hop, length).
pub fn check_header(name: &str, value: &str) -> Result<(), SpecError> {
    let field = format!("headers.{name}");
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return Err(bad(&field, "not a valid header name"));
    }
    if value.chars().any(|c| c == '\r' || c == '\n' || c == '\0') {
        return Err(bad(&field, "a header value cannot contain line breaks"));
    }
    let owned = [
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "upgrade",
        "content-length",
        "accept-encoding",
    ];
    if owned.iter().any(|o| o.eq_ignore_ascii_case(name)) {
        return Err(bad(&field, "set by the gateway itself"));
    }
    Ok(())
}

/// An upstream base URL: `http://` or `https://`, a host and an optional
/// port and path. (An `https://` upstream is verified against the public
/// roots and the gateway's `upstream_tls.ca_file`.)
pub fn check_upstream_url(field: &str, url: &str) -> Result<(), SpecError> {
    let url = url.trim();
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return Err(bad(
            field,
            format!("must be an http:// or https:// URL, got {url:?}"),
        ));
    };
    let authority = rest.split('/').next().unwrap_or("");
    let valid =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']' | '_');
    if authority.is_empty() || !authority.chars().all(valid) || url.contains(char::is_whitespace) {
        return Err(bad(
            field,
            format!("must be http://host[:port][/path], got {url:?}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(protocol: Protocol) -> ModelShape<'static> {
        ModelShape {
            protocol,
            json_path: None,
            key_field: None,
            output_pointer: None,
            confidence_threshold: None,
            output: None,
        }
    }

    #[test]
    fn each_bad_field_is_named() {
        let field = |m: ModelShape| check_model(&m).err().map(|e| e.field);
        assert_eq!(field(shape(Protocol::KserveV1)), None);
        assert_eq!(field(shape(Protocol::Json)).as_deref(), Some("json_path"));
        let json = ModelShape {
            json_path: Some("/score"),
            ..shape(Protocol::Json)
        };
        assert_eq!(field(json), None);
        assert_eq!(
            field(ModelShape {
                json_path: Some("score"),
                ..json
            })
            .as_deref(),
            Some("json_path")
        );
        assert_eq!(
            field(ModelShape {
                key_field: Some("user"),
                ..json
            })
            .as_deref(),
            Some("key_field")
        );
        assert_eq!(
            field(ModelShape {
                output_pointer: Some("outputs/0"),
                ..shape(Protocol::OipV2)
            })
            .as_deref(),
            Some("output_pointer")
        );
        assert_eq!(
            field(ModelShape {
                confidence_threshold: Some(1.5),
                ..json
            })
            .as_deref(),
            Some("confidence_threshold")
        );
        assert_eq!(
            field(ModelShape {
                json_path: Some("/x"),
                ..shape(Protocol::KserveV1)
            })
            .as_deref(),
            Some("json_path")
        );
    }

    #[test]
    fn upstreams_are_http_or_https_with_a_host() {
        for ok in [
            "http://127.0.0.1:8080",
            "https://m:443",
            "https://models.internal",
            "http://models.internal/v1",
            "http://[::1]:9",
        ] {
            assert_eq!(check_upstream_url("upstream", ok), Ok(()), "{ok}");
        }
        for bad in [
            "ftp://m",
            "https://",
            "http://",
            "http:// m",
            "127.0.0.1:80",
            "",
        ] {
            let e = check_upstream_url("upstream", bad).expect_err(bad);
            assert_eq!(e.field, "upstream");
        }
        assert!(
            check_upstream_url("u", "ftp://m")
                .expect_err("ftp")
                .message
                .contains("https://")
        );
    }

    #[test]
    fn a_json_path_never_takes_another_endpoint() {
        let shape = |p| ModelShape {
            protocol: Protocol::Json,
            json_path: Some(p),
            key_field: None,
            output_pointer: None,
            confidence_threshold: None,
            output: None,
        };
        for taken in [
            "/healthz",
            "/metrics",
            "/rollgate/stats",
            "/v2/health/ready",
            "/v1/models/fraud:predict",
            "/v2/models/fraud/infer",
        ] {
            let e = check_model(&shape(taken)).expect_err(taken);
            assert!(e.to_string().contains("json_path"), "{e}");
        }
        assert!(check_model(&shape("/score/fraud")).is_ok());
    }

    #[test]
    fn names_are_path_segments() {
        assert!(check_model_name("fraud-v2.1_x").is_ok());
        for bad in ["", ".", "..", "a/b", "a:b", "a b", &"x".repeat(129)] {
            assert!(check_model_name(bad).is_err(), "{bad}");
        }
    }
}
