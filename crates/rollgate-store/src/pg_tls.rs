//! TLS to PostgreSQL, as libpq's `sslmode` means it, over rustls.
//!
//! tokio-postgres reads `sslmode` itself but knows only `disable`,
//! `prefer` and `require`, and leaves verification to the TLS connector;
//! so the store URL's `sslmode`, `sslrootcert`, `sslcert` and `sslkey` are
//! taken out here, and the connector verifies as libpq would:
//! `verify-full` the chain and the host name, `verify-ca` the chain only,
//! `require` and `prefer` encrypt without authenticating the server
//! (unless `sslrootcert` is given: then as `verify-ca`, as libpq does).
//! `prefer` (libpq's default) falls back to a plain connection when the
//! server offers no TLS; `disable` never tries.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use postgres::config::SslMode;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use crate::StoreError;

/// `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// The store URL's TLS settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    pub mode: Mode,
    pub root_cert: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

const NAMES: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// Splits the TLS settings off a store URL (`postgres://…?sslmode=…` or
/// `key=value …`): the URL without them, and the settings.
pub(crate) fn split(url: &str) -> Result<(String, Settings), StoreError> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    let rest = if let Some((base, query)) = url.split_once('?').filter(|_| url.contains("://")) {
        // Every other parameter is kept byte for byte (re-encoding would
        // turn `%20` into `+`, which the driver does not decode).
        let mut kept = Vec::new();
        for segment in query.split('&') {
            let mut decoded = form_urlencoded::parse(segment.as_bytes());
            match decoded.next() {
                Some((k, v)) if NAMES.contains(&k.as_ref()) => {
                    pairs.push((k.into_owned(), v.into_owned()));
                }
                _ => kept.push(segment),
            }
        }
        if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        }
    } else if url.contains("://") {
        url.to_string()
    } else {
        let kept: Vec<&str> = url
            .split_whitespace()
            .filter(|kv| match kv.split_once('=') {
                Some((k, v)) if NAMES.contains(&k) => {
                    pairs.push((k.to_string(), v.trim_matches('\'').to_string()));
                    false
                }
                _ => true,
            })
            .collect();
        // Anything else naming a TLS setting (`sslmode = require`, with
        // spaces) would be read by the driver and then overridden here:
        // refused rather than silently weakened.
        if let Some(odd) = kept.iter().find(|t| t.starts_with("ssl")) {
            return Err(StoreError::Invalid(format!(
                "store URL: cannot read the TLS setting at {odd:?}: write key=value without \
                 spaces or quotes (sslmode=verify-full sslrootcert=/path/ca.pem)"
            )));
        }
        kept.join(" ")
    };
    let mut s = Settings {
        mode: Mode::Prefer,
        root_cert: None,
        cert: None,
        key: None,
    };
    for (k, v) in pairs {
        match k.as_str() {
            "sslmode" => {
                s.mode = match v.as_str() {
                    "disable" => Mode::Disable,
                    "prefer" => Mode::Prefer,
                    "require" => Mode::Require,
                    "verify-ca" => Mode::VerifyCa,
                    "verify-full" => Mode::VerifyFull,
                    other => {
                        return Err(StoreError::Invalid(format!(
                            "store URL: sslmode {other:?} is not one of disable, prefer, \
                             require, verify-ca, verify-full"
                        )));
                    }
                }
            }
            "sslrootcert" => s.root_cert = Some(PathBuf::from(v)),
            "sslcert" => s.cert = Some(PathBuf::from(v)),
            _ => s.key = Some(PathBuf::from(v)),
        }
    }
    if s.cert.is_some() != s.key.is_some() {
        return Err(StoreError::Invalid(
            "store URL: sslcert and sslkey go together (a client certificate and its key)".into(),
        ));
    }
    if matches!(s.mode, Mode::VerifyCa | Mode::VerifyFull) && s.root_cert.is_none() {
        // libpq reads ~/.postgresql/root.crt; rollgate asks to be told.
        return Err(StoreError::Invalid(
            "store URL: sslmode verify-ca and verify-full need sslrootcert=PATH (the CA that \
             signed the server's certificate)"
                .into(),
        ));
    }
    Ok((rest, s))
}

impl Settings {
    /// tokio-postgres's own setting for this mode.
    pub fn ssl_mode(&self) -> SslMode {
        match self.mode {
            Mode::Disable => SslMode::Disable,
            Mode::Prefer => SslMode::Prefer,
            _ => SslMode::Require,
        }
    }

    /// The rustls connector for this mode; `None` for `disable`.
    pub fn connector(
        &self,
    ) -> Result<Option<tokio_postgres_rustls::MakeRustlsConnect>, StoreError> {
        if self.mode == Mode::Disable {
            return Ok(None);
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = match &self.root_cert {
            Some(path) => Some(Arc::new(roots(path)?)),
            None => None,
        };
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(invalid)?;
        let verifier: Arc<dyn ServerCertVerifier> = match (self.mode, roots) {
            (Mode::VerifyFull, Some(roots)) => {
                WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
                    .build()
                    .map_err(invalid)?
            }
            (_, Some(roots)) => Arc::new(ChainOnly(
                WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
                    .build()
                    .map_err(invalid)?,
            )),
            (_, None) => Arc::new(Unauthenticated(provider)),
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let certs = CertificateDer::pem_file_iter(cert)
                    .and_then(|c| c.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| file_error(cert, e))?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error(key, e))?;
                builder.with_client_auth_cert(certs, key).map_err(invalid)?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Some(tokio_postgres_rustls::MakeRustlsConnect::new(config)))
    }
}

fn invalid(e: impl std::fmt::Display) -> StoreError {
    StoreError::Invalid(format!("store URL TLS settings: {e}"))
}

fn file_error(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Invalid(format!("store URL TLS file {}: {e}", path.display()))
}

fn roots(path: &Path) -> Result<RootCertStore, StoreError> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|c| c.collect::<Result<Vec<_>, _>>())
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no certificate in it"));
    }
    for c in certs {
        roots.add(c).map_err(|e| file_error(path, e))?;
    }
    Ok(roots)
}

/// `verify-ca`: the chain must lead to the CA; the name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `require` and `prefer` without a CA: encrypted, the server not
/// authenticated (libpq's meaning; use `verify-full` to authenticate it).
/// The handshake's signatures are still checked.
#[derive(Debug)]
struct Unauthenticated(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unauthenticated {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_settings_are_split_off_both_url_forms() {
        let (rest, s) = split(
            "postgres://u@db:5432/rg?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&options=-c%20search_path%3Dx",
        )
        .expect("url");
        assert_eq!(
            rest,
            "postgres://u@db:5432/rg?application_name=x&options=-c%20search_path%3Dx"
        );
        assert_eq!(s.mode, Mode::VerifyFull);
        assert_eq!(s.root_cert.as_deref(), Some(Path::new("/etc/ca.pem")));
        let (rest, s) = split("host=db user=u sslmode=require dbname=rg").expect("kv");
        assert_eq!(rest, "host=db user=u dbname=rg");
        assert_eq!(s.mode, Mode::Require);
        let (rest, s) = split("postgres://u@db/rg").expect("plain");
        assert_eq!(
            (rest.as_str(), s.mode),
            ("postgres://u@db/rg", Mode::Prefer)
        );
        for bad in [
            "postgres://u@db/rg?sslmode=allow-everything",
            "postgres://u@db/rg?sslmode=verify-full",
            "postgres://u@db/rg?sslmode=require&sslcert=/c.pem",
            "host=db sslmode = require",
        ] {
            assert!(matches!(split(bad), Err(StoreError::Invalid(_))), "{bad}");
        }
    }
}
