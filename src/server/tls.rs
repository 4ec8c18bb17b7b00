//! Serving certificates: loaded and checked before the port is bound, and reloaded without a
//! restart when cert-manager rotates them. A Secret volume rotates by swapping a `..data`
//! symlink, so the files are re-read by path on an interval (inotify on the old files would never
//! fire); a half-written or mismatched pair keeps the old certificate.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

use crate::metrics::Metrics;

/// How often the certificate files are re-read.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {key} {path}: {source}")]
    Read {
        key: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{key} {path}: {reason}")]
    Invalid {
        key: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("cannot generate a self-signed certificate: {0}")]
    Generate(String),
}

/// Parses a PEM certificate chain and private key into a checked pair.
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Invalid {
            key: "ssl_cert_path",
            path: cert_path.to_owned(),
            reason: format!("not a PEM certificate chain: {e}"),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Invalid {
            key: "ssl_cert_path",
            path: cert_path.to_owned(),
            reason: "holds no certificate".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Invalid {
        key: "ssl_key_path",
        path: key_path.to_owned(),
        reason: format!("not a PEM private key: {e}"),
    })?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key, &provider).map_err(|e| TlsError::Invalid {
        key: "ssl_key_path",
        path: key_path.to_owned(),
        reason: format!("does not match the certificate: {e}"),
    })
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        key,
        path: path.to_owned(),
        source,
    })
}

/// The serving certificate, swappable while connections are being accepted.
pub struct CertStore {
    current: ArcSwap<CertifiedKey>,
    /// Certificate and key files; `None` for a generated, fixed certificate.
    files: Option<(PathBuf, PathBuf)>,
    /// The bytes the current certificate was built from, to notice a change.
    loaded: std::sync::Mutex<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for CertStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertStore")
            .field("files", &self.files)
            .finish()
    }
}

impl CertStore {
    /// Loads the pair now; start-up fails on a bad one.
    pub fn from_files(cert_path: &Path, key_path: &Path) -> Result<Self, TlsError> {
        let cert_pem = read("ssl_cert_path", cert_path)?;
        let key_pem = read("ssl_key_path", key_path)?;
        let key = certified_key(&cert_pem, &key_pem, cert_path, key_path)?;
        Ok(Self {
            current: ArcSwap::from_pointee(key),
            files: Some((cert_path.to_owned(), key_path.to_owned())),
            loaded: std::sync::Mutex::new((cert_pem, key_pem)),
        })
    }

    /// A fixed certificate (the generated self-signed one).
    pub fn fixed(key: CertifiedKey) -> Self {
        Self {
            current: ArcSwap::from_pointee(key),
            files: None,
            loaded: std::sync::Mutex::default(),
        }
    }

    /// Re-reads the files; swaps in the new pair if it changed and is valid. Returns whether a
    /// reload happened, or why it failed (the old certificate stays).
    pub fn reload(&self) -> Result<bool, TlsError> {
        let Some((cert_path, key_path)) = &self.files else {
            return Ok(false);
        };
        let cert_pem = read("ssl_cert_path", cert_path)?;
        let key_pem = read("ssl_key_path", key_path)?;
        let mut loaded = self.loaded.lock().expect("cert store lock poisoned");
        if loaded.0 == cert_pem && loaded.1 == key_pem {
            return Ok(false);
        }
        let key = certified_key(&cert_pem, &key_pem, cert_path, key_path)?;
        self.current.store(Arc::new(key));
        *loaded = (cert_pem, key_pem);
        Ok(true)
    }

    /// Polls for rotations until the task is dropped.
    pub async fn watch(self: Arc<Self>, metrics: Option<Arc<Metrics>>) {
        if self.files.is_none() {
            return;
        }
        let mut tick = tokio::time::interval(RELOAD_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_error = String::new();
        loop {
            tick.tick().await;
            let store = self.clone();
            let result = tokio::task::spawn_blocking(move || store.reload())
                .await
                .unwrap_or(Ok(false));
            match result {
                Ok(true) => {
                    tracing::info!("serving certificate reloaded");
                    last_error.clear();
                    if let Some(m) = &metrics {
                        m.certificate_reload(true);
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    // Rotations are not atomic across two files: say it once, keep serving.
                    let text = e.to_string();
                    if text != last_error {
                        tracing::warn!(error = %text, "serving certificate not reloaded; keeping the current one");
                        if let Some(m) = &metrics {
                            m.certificate_reload(false);
                        }
                        last_error = text;
                    }
                }
            }
        }
    }

    /// The rustls server configuration: h2 and HTTP/1.1 (the API server speaks HTTP/1.1).
    pub fn server_config(self: &Arc<Self>) -> Arc<ServerConfig> {
        let mut config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_no_client_auth()
                .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// A generated certificate authority and serving certificate, for running without cert-manager.
pub struct SelfSigned {
    pub ca_pem: String,
    pub key: CertifiedKey,
}

/// Generates a CA and a serving certificate for `names` (DNS names or IP addresses).
pub fn self_signed(names: &[String]) -> Result<SelfSigned, TlsError> {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let generate = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "tolerable self-signed CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().map_err(generate)?)
        .map_err(generate)?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(generate)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "tolerable");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(generate)?;
    let cert = params.signed_by(&key, &ca).map_err(generate)?;
    let certified = certified_key(
        cert.pem().as_bytes(),
        key.serialize_pem().as_bytes(),
        Path::new("(generated)"),
        Path::new("(generated)"),
    )?;
    Ok(SelfSigned {
        ca_pem: ca.pem(),
        key: certified,
    })
}
