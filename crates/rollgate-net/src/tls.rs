//! TLS with rustls (the `ring` provider): a listener's certificate, read
//! from files and reloaded when they change, and what a client trusts
//! (the public roots, a team's own CA) and presents (a client certificate
//! for mTLS).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use serde::{Deserialize, Serialize};

/// A TLS file that could not be used, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("{0}")]
    Config(String),
}

fn invalid(path: &Path, message: impl std::fmt::Display) -> TlsError {
    TlsError::Invalid {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// The one crypto provider: every config names it, so nothing depends on
/// a process-wide default being installed.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// TLS on a listener (`[gateway.tls]`, `[api.tls]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerTls {
    /// PEM certificate chain, leaf first. Replaced files are picked up
    /// without a restart (new connections get the new certificate).
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM CA certificates: when set, every client must present a
    /// certificate signed by one of them (mTLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca_file: Option<PathBuf>,
}

/// What a client trusts and presents (`[gateway.upstream_tls]`, the CLI's
/// `--ca-cert`). The default trusts the public web roots only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientTls {
    /// PEM CA certificates trusted beside the public roots (a team's own
    /// CA for its model servers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// A client certificate chain (PEM) presented to servers that ask for
    /// one (mTLS); needs `key_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Every certificate in a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(path, "holds no certificate"));
    }
    Ok(certs)
}

/// The private key in a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| invalid(path, format!("no PEM private key: {e}")))
}

fn roots(ca_file: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(ca_file)? {
        roots
            .add(cert)
            .map_err(|e| invalid(ca_file, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// A certificate and key pair that belong together.
fn certified_key(cert_file: &Path, key_file: &Path) -> Result<CertifiedKey, TlsError> {
    let certs = load_certs(cert_file)?;
    let key = load_key(key_file)?;
    CertifiedKey::from_der(certs, key, &provider()).map_err(|e| {
        invalid(
            key_file,
            format!("does not fit {}: {e}", cert_file.display()),
        )
    })
}

/// When a file was last written and its length: what "changed" means.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// A listener's certificate, swapped whole when its files change: a
/// handshake reads the current one, so a renewal (cert-manager, certbot)
/// needs no restart. A replacement that does not load (half written, a key
/// that does not fit) keeps the certificate in use and is tried again.
#[derive(Debug)]
pub struct ReloadingCert {
    cert_file: PathBuf,
    key_file: PathBuf,
    current: ArcSwap<CertifiedKey>,
    /// The files' stamps when last tried, loaded or not.
    tried: Mutex<(Stamp, Stamp)>,
}

impl ReloadingCert {
    /// Loads the pair; an error names the file at fault.
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<ReloadingCert, TlsError> {
        let stamps = (stamp(cert_file), stamp(key_file));
        let key = certified_key(cert_file, key_file)?;
        Ok(ReloadingCert {
            cert_file: cert_file.to_path_buf(),
            key_file: key_file.to_path_buf(),
            current: ArcSwap::from_pointee(key),
            tried: Mutex::new(stamps),
        })
    }

    /// Reloads if either file changed since last tried. `Ok(true)`: a new
    /// certificate is in use.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = (stamp(&self.cert_file), stamp(&self.key_file));
        {
            let mut tried = self.tried.lock().unwrap_or_else(|p| p.into_inner());
            if *tried == now {
                return Ok(false);
            }
            *tried = now;
        }
        let key = certified_key(&self.cert_file, &self.key_file)?;
        self.current.store(Arc::new(key));
        Ok(true)
    }

    /// The certificate chain in use (leaf first).
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.current.load().cert.clone()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// A listener's TLS: the acceptor and its reloading certificate.
#[derive(Clone)]
pub struct ServerTls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    pub cert: Arc<ReloadingCert>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert", &self.cert)
            .finish_non_exhaustive()
    }
}

impl ListenerTls {
    /// The acceptor, offering HTTP/2 and HTTP/1.1 by ALPN.
    pub fn server(&self) -> Result<ServerTls, TlsError> {
        let cert = Arc::new(ReloadingCert::load(&self.cert_file, &self.key_file)?);
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match &self.client_ca_file {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                        .build()
                        .map_err(|e| invalid(ca, e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_cert_resolver(cert.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            cert,
        })
    }
}

impl ClientTls {
    /// Checks the files now, so a bad one is a start-up error naming it.
    pub fn validate(&self) -> Result<(), TlsError> {
        self.config().map(drop)
    }

    /// The client config: public roots plus `ca_file`, and the client
    /// certificate when one is set.
    pub fn config(&self) -> Result<rustls::ClientConfig, TlsError> {
        let mut trusted = RootCertStore::empty();
        trusted.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(ca) = &self.ca_file {
            for cert in load_certs(ca)? {
                trusted
                    .add(cert)
                    .map_err(|e| invalid(ca, format!("not a usable CA certificate: {e}")))?;
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(trusted);
        match (&self.cert_file, &self.key_file) {
            (None, None) => Ok(builder.with_no_client_auth()),
            (Some(cert), Some(key)) => {
                let certs = load_certs(cert)?;
                let key_der = load_key(key)?;
                builder
                    .with_client_auth_cert(certs, key_der)
                    .map_err(|e| invalid(key, format!("does not fit {}: {e}", cert.display())))
            }
            _ => Err(TlsError::Config(
                "a client certificate needs both cert_file and key_file".into(),
            )),
        }
    }
}
