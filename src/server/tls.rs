//! Serving certificates: loaded and checked before the port is bound, and reloaded without a
//! restart when cert-manager rotates them. A Secret volume rotates by swapping a `..data`
//! symlink, so the files are re-read by path on an interval (inotify on the old files would never
//! fire); a half-written or mismatched pair keeps the old certificate, and so does a valid
//! certificate that no longer covers a DNS name or IP address the starting one did (the
//! Service's names, or the address a `url` webhook calls: the API server would refuse it and
//! every admission would fail), and a file over [`MAX_PEM_BYTES`] (never read into memory).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

use crate::metrics::Metrics;

/// How often the certificate files are re-read.
pub(crate) const RELOAD_INTERVAL: Duration = Duration::from_secs(1);
/// A reload failing the same way again is logged at most this often (and counted every time).
pub(crate) const REPEATED_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// Largest certificate or key file read: a chain of a few certificates is a few KiB, and the
/// files are re-read every second, so a huge file (a mistake, or a volume someone else can
/// write) must cost nothing but the warning.
pub const MAX_PEM_BYTES: u64 = 1 << 20;

/// What a reload does with a certificate that drops a name: a setting, defined with the
/// config's `[tls]` section.
pub use crate::config::NameCheck;

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
    #[error(
        "{key} {path}: {size} bytes, larger than any certificate or key file ({MAX_PEM_BYTES} \
         bytes at most); not read"
    )]
    TooLarge {
        key: &'static str,
        path: PathBuf,
        size: u64,
    },
    #[error("cannot generate a self-signed certificate: {0}")]
    Generate(String),
    #[error(
        "tls.cert_path {path}: does not cover {missing:?}, which the certificate served since \
         start-up does; keeping that one (tls.reload_name_check = \"warn\" would serve it)"
    )]
    NamesDropped { path: PathBuf, missing: Vec<String> },
}

/// The DNS names and IP addresses (subject alternative names) a certificate is for.
pub(crate) fn subject_names(cert: &CertificateDer<'_>) -> Vec<String> {
    let mut names: Vec<String> = webpki::EndEntityCert::try_from(cert)
        .map(|cert| cert.valid_dns_names().map(str::to_owned).collect())
        .unwrap_or_default();
    names.extend(
        crate::x509::ip_addresses(cert)
            .iter()
            .map(|ip| ip.to_string()),
    );
    names
}

/// Whether `cert` is valid for `name` (a DNS name or an IP address), as a TLS client would
/// check it. A wildcard `name` must be in the certificate as written.
fn covers(cert: &CertificateDer<'_>, name: &str) -> bool {
    let Ok(end_entity) = webpki::EndEntityCert::try_from(cert) else {
        return false;
    };
    match rustls::pki_types::ServerName::try_from(name) {
        Ok(server_name) => end_entity
            .verify_is_valid_for_subject_name(&server_name)
            .is_ok(),
        Err(_) => end_entity
            .valid_dns_names()
            .any(|presented| presented.eq_ignore_ascii_case(name)),
    }
}

/// Parses a PEM certificate chain and private key into a checked pair.
pub(crate) fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Invalid {
            key: "tls.cert_path",
            path: cert_path.to_owned(),
            reason: format!("not a PEM certificate chain: {e}"),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Invalid {
            key: "tls.cert_path",
            path: cert_path.to_owned(),
            reason: "holds no certificate".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Invalid {
        key: "tls.key_path",
        path: key_path.to_owned(),
        reason: format!("not a PEM private key: {e}"),
    })?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key, &provider).map_err(|e| TlsError::Invalid {
        key: "tls.key_path",
        path: key_path.to_owned(),
        reason: format!("does not match the certificate: {e}"),
    })
}

/// The file at `path`, unless it is over [`MAX_PEM_BYTES`] (then not read at all: its size is
/// checked first, and the read stops past the limit if the file grows meanwhile).
fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    use std::io::Read as _;
    let failed = |source| TlsError::Read {
        key,
        path: path.to_owned(),
        source,
    };
    let too_large = |size| TlsError::TooLarge {
        key,
        path: path.to_owned(),
        size,
    };
    let file = std::fs::File::open(path).map_err(failed)?;
    let size = file.metadata().map_err(failed)?.len();
    if size > MAX_PEM_BYTES {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(failed)?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// The serving certificate, swappable while connections are being accepted.
pub struct CertStore {
    current: ArcSwap<CertifiedKey>,
    /// Certificate and key files; `None` for a generated, fixed certificate.
    files: Option<(PathBuf, PathBuf)>,
    /// The bytes the current certificate was built from, to notice a change.
    loaded: std::sync::Mutex<(Vec<u8>, Vec<u8>)>,
    /// The DNS names and IP addresses of the certificate served at start: every reload must
    /// keep covering them.
    names: Vec<String>,
    name_check: NameCheck,
}

/// What a reload did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reloaded {
    /// The files have not changed.
    Unchanged,
    /// A new certificate is served.
    Swapped,
    /// A new certificate is served although it drops these names ([`NameCheck::Warn`]).
    SwappedWithoutNames(Vec<String>),
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
        let cert_pem = read("tls.cert_path", cert_path)?;
        let key_pem = read("tls.key_path", key_path)?;
        let key = certified_key(&cert_pem, &key_pem, cert_path, key_path)?;
        let names = key.end_entity_cert().map(subject_names).unwrap_or_default();
        Ok(Self {
            current: ArcSwap::from_pointee(key),
            files: Some((cert_path.to_owned(), key_path.to_owned())),
            loaded: std::sync::Mutex::new((cert_pem, key_pem)),
            names,
            name_check: NameCheck::default(),
        })
    }

    /// Sets what a reload does with a certificate that drops a starting DNS name or address.
    pub fn with_name_check(mut self, name_check: NameCheck) -> Self {
        self.name_check = name_check;
        self
    }

    /// `notAfter` of the certificate served now, in seconds since the Unix epoch.
    pub(crate) fn not_after(&self) -> Option<i64> {
        let current = self.current.load();
        crate::x509::not_after(current.end_entity_cert().ok()?)
    }

    /// The DNS names and IP addresses every reloaded certificate must cover.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// A fixed certificate (the generated self-signed one).
    pub(crate) fn fixed(key: CertifiedKey) -> Self {
        Self {
            current: ArcSwap::from_pointee(key),
            files: None,
            loaded: std::sync::Mutex::default(),
            names: Vec::new(),
            name_check: NameCheck::default(),
        }
    }

    /// Re-reads the files; swaps in the new pair if it changed and is valid (and, unless
    /// [`NameCheck::Warn`], covers the starting DNS names and IP addresses). A file over
    /// [`MAX_PEM_BYTES`] is not read. Returns what happened, or why the
    /// reload failed (the old certificate stays, and the next reload tries again).
    pub fn reload(&self) -> Result<Reloaded, TlsError> {
        let Some((cert_path, key_path)) = &self.files else {
            return Ok(Reloaded::Unchanged);
        };
        let cert_pem = read("tls.cert_path", cert_path)?;
        let key_pem = read("tls.key_path", key_path)?;
        // The bytes are plain data: still consistent if a holder panicked.
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if loaded.0 == cert_pem && loaded.1 == key_pem {
            return Ok(Reloaded::Unchanged);
        }
        let key = certified_key(&cert_pem, &key_pem, cert_path, key_path)?;
        let missing: Vec<String> = match key.end_entity_cert() {
            Ok(cert) => self
                .names
                .iter()
                .filter(|name| !covers(cert, name))
                .cloned()
                .collect(),
            Err(_) => self.names.clone(),
        };
        if !missing.is_empty() && self.name_check == NameCheck::Refuse {
            return Err(TlsError::NamesDropped {
                path: cert_path.clone(),
                missing,
            });
        }
        self.current.store(Arc::new(key));
        *loaded = (cert_pem, key_pem);
        Ok(if missing.is_empty() {
            Reloaded::Swapped
        } else {
            Reloaded::SwappedWithoutNames(missing)
        })
    }

    /// Polls for rotations until the task is dropped.
    pub(crate) async fn watch(self: Arc<Self>, metrics: Option<Arc<Metrics>>) {
        if self.files.is_none() {
            return;
        }
        let mut tick = tokio::time::interval(RELOAD_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut errors = ErrorLog::default();
        loop {
            tick.tick().await;
            let store = self.clone();
            let result = match tokio::task::spawn_blocking(move || store.reload()).await {
                Ok(result) => result,
                Err(e) => Err(TlsError::Invalid {
                    key: "tls.cert_path",
                    path: self.files.as_ref().map(|f| f.0.clone()).unwrap_or_default(),
                    reason: format!("the reload task failed: {e}"),
                }),
            };
            let ok = match result {
                Ok(Reloaded::Unchanged) => continue,
                Ok(Reloaded::Swapped) => {
                    tracing::info!("serving certificate reloaded");
                    errors.clear();
                    true
                }
                Ok(Reloaded::SwappedWithoutNames(missing)) => {
                    tracing::error!(
                        ?missing,
                        "serving certificate reloaded although it does not cover names the \
                         starting certificate did: the API server will refuse it for them \
                         (tls.reload_name_check = \"warn\")"
                    );
                    errors.clear();
                    true
                }
                Err(e) => {
                    // Rotations are not atomic across two files, so one failure is routine; a
                    // failure that persists is logged again every minute, and every one counts.
                    errors.failed(&e.to_string(), Instant::now());
                    false
                }
            };
            if let Some(m) = &metrics {
                m.certificate_reload(ok);
                m.set_certificate_expiry(self.not_after());
            }
        }
    }

    /// The rustls server configuration: h2 and HTTP/1.1 (the API server speaks HTTP/1.1).
    pub(crate) fn server_config(self: &Arc<Self>) -> Arc<ServerConfig> {
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

/// Logs reload errors: a new error at once, the same one again at most every
/// [`REPEATED_ERROR_LOG_INTERVAL`], with how often it happened meanwhile.
#[derive(Debug, Default)]
struct ErrorLog {
    last: Option<(String, Instant)>,
    repeated: u64,
}

impl ErrorLog {
    /// Whether this failure was logged.
    fn failed(&mut self, error: &str, now: Instant) -> bool {
        let log = match &self.last {
            Some((last, at)) if last == error => {
                now.duration_since(*at) >= REPEATED_ERROR_LOG_INTERVAL
            }
            _ => true,
        };
        if log {
            tracing::warn!(
                error,
                repeated_since_last_logged = self.repeated,
                "serving certificate not reloaded; keeping the current one"
            );
            self.last = Some((error.to_owned(), now));
            self.repeated = 0;
        } else {
            self.repeated += 1;
        }
        log
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// A generated certificate authority and serving certificate, for running without cert-manager.
pub(crate) struct SelfSigned {
    pub(crate) ca_pem: String,
    pub(crate) key: CertifiedKey,
}

/// Generates a CA and a serving certificate for `names` (DNS names or IP addresses).
pub(crate) fn self_signed(names: &[String]) -> Result<SelfSigned, TlsError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_error_is_logged_once_a_minute() {
        let mut log = ErrorLog::default();
        let start = Instant::now();
        assert!(log.failed("a", start));
        assert!(!log.failed("a", start + Duration::from_secs(1)));
        assert!(!log.failed("a", start + Duration::from_secs(59)));
        assert_eq!(log.repeated, 2);
        assert!(log.failed("a", start + Duration::from_secs(61)));
        assert!(
            log.failed("b", start + Duration::from_secs(62)),
            "a new error"
        );
        log.clear();
        assert!(
            log.failed("b", start + Duration::from_secs(63)),
            "after a success"
        );
    }

    fn leaf(names: &[&str]) -> CertifiedKey {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        self_signed(&names).unwrap().key
    }

    #[test]
    fn names_are_covered_as_a_client_checks_them() {
        let key = leaf(&[
            "tolerable.tolerable-system.svc",
            "*.example.com",
            "10.96.0.10",
            "fd00::10",
        ]);
        let cert = key.end_entity_cert().unwrap();
        assert_eq!(
            subject_names(cert),
            [
                "tolerable.tolerable-system.svc",
                "*.example.com",
                "10.96.0.10",
                "fd00::10"
            ]
        );
        assert!(covers(cert, "10.96.0.10"));
        assert!(covers(cert, "fd00::10"));
        assert!(!covers(cert, "10.96.0.11"));
        assert!(!covers(cert, "fd00::11"));
        assert!(covers(cert, "tolerable.tolerable-system.svc"));
        assert!(covers(cert, "a.example.com"));
        assert!(covers(cert, "*.example.com"));
        assert!(!covers(cert, "tolerable.other.svc"));
        assert!(!covers(cert, "*.other.com"));
    }
}
