//! The real registry client: thin I/O over `oci-client`, one client per (registry host,
//! credential), because an `oci_client::Client` keeps the first credential it sees per registry.

use std::collections::HashMap;
use std::hash::RandomState;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use super::credentials::Credential;
use super::manifest::ACCEPT;
use super::{FetchError, ManifestSource};

/// Config blobs are a few KiB; anything this big is not an image config.
const MAX_BLOB_BYTES: usize = 4 << 20;

/// Transport settings shared by every client.
#[derive(Clone, Debug)]
pub struct TransportSettings {
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// `host:port` of registries spoken to over plain http.
    pub insecure_registries: Vec<String>,
    /// Extra trusted roots (PEM), on top of the system's.
    pub extra_roots_pem: Vec<Vec<u8>>,
}

/// Builds and keeps `oci_client::Client`s.
pub struct ClientPool {
    settings: TransportSettings,
    clients: Mutex<HashMap<(String, Option<u64>), Client>>,
    hasher: RandomState,
}

impl ClientPool {
    pub fn new(settings: TransportSettings) -> Self {
        Self {
            settings,
            clients: Mutex::default(),
            hasher: RandomState::new(),
        }
    }

    pub fn fingerprint(&self, credential: &Credential) -> u64 {
        credential.fingerprint(&self.hasher)
    }

    /// A source speaking to `host` (the API host, e.g. `registry-1.docker.io`) with `credential`.
    pub fn source(
        &self,
        host: &str,
        credential: Option<&Credential>,
    ) -> Result<OciSource, FetchError> {
        let key = (host.to_owned(), credential.map(|c| self.fingerprint(c)));
        let mut clients = self.clients.lock().expect("client pool lock poisoned");
        let client = match clients.get(&key) {
            Some(client) => client.clone(),
            None => {
                let client = self.build_client()?;
                clients.insert(key, client.clone());
                client
            }
        };
        let auth = match credential {
            Some(c) => RegistryAuth::Basic(c.user().to_owned(), c.secret().to_owned()),
            None => RegistryAuth::Anonymous,
        };
        Ok(OciSource {
            client,
            auth: Arc::new(auth),
            host: host.to_owned(),
        })
    }

    fn build_client(&self) -> Result<Client, FetchError> {
        let s = &self.settings;
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(s.insecure_registries.clone()),
            extra_root_certificates: s
                .extra_roots_pem
                .iter()
                .map(|pem| Certificate {
                    encoding: CertificateEncoding::Pem,
                    data: pem.clone(),
                })
                .collect(),
            connect_timeout: Some(s.connect_timeout),
            read_timeout: Some(s.read_timeout),
            user_agent: concat!("tolerable/", env!("CARGO_PKG_VERSION")),
            ..ClientConfig::default()
        };
        // `Client::new` would silently fall back to defaults on a bad config.
        Client::try_from(config)
            .map_err(|e| FetchError::Transport(format!("cannot build registry client: {e}")))
    }
}

/// One registry host, one credential.
#[derive(Clone)]
pub struct OciSource {
    client: Client,
    auth: Arc<RegistryAuth>,
    host: String,
}

impl OciSource {
    fn reference(&self, repository: &str, reference: &str) -> Reference {
        if reference.contains(':') {
            Reference::with_digest(
                self.host.clone(),
                repository.to_owned(),
                reference.to_owned(),
            )
        } else {
            Reference::with_tag(
                self.host.clone(),
                repository.to_owned(),
                reference.to_owned(),
            )
        }
    }
}

impl ManifestSource for OciSource {
    async fn manifest(
        &self,
        repository: &str,
        reference: &str,
    ) -> Result<(Bytes, String), FetchError> {
        let reference = self.reference(repository, reference);
        self.client
            .pull_manifest_raw(&reference, &self.auth, &ACCEPT)
            .await
            .map_err(FetchError::from)
    }

    async fn blob(&self, repository: &str, digest: &str) -> Result<Bytes, FetchError> {
        let reference = self.reference(repository, digest);
        let mut stream = self
            .client
            .pull_blob_stream(&reference, digest)
            .await
            .map_err(FetchError::from)?;
        if stream
            .content_length
            .is_some_and(|n| n > MAX_BLOB_BYTES as u64)
        {
            return Err(FetchError::TooLarge);
        }
        let mut body = Vec::new();
        while let Some(chunk) = stream.stream.next().await {
            let chunk = chunk.map_err(|e| FetchError::Transport(error_chain(&e)))?;
            if body.len() + chunk.len() > MAX_BLOB_BYTES {
                return Err(FetchError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.into())
    }
}

impl From<OciDistributionError> for FetchError {
    fn from(e: OciDistributionError) -> Self {
        use OciDistributionError as E;
        match e {
            E::UnauthorizedError { .. } | E::AuthenticationFailure(_) => Self::Unauthorized,
            E::RegistryError { envelope, .. } => {
                use oci_client::errors::OciErrorCode as C;
                let message = envelope
                    .errors
                    .iter()
                    .map(|e| format!("{:?}: {}", e.code, e.message))
                    .collect::<Vec<_>>()
                    .join("; ");
                let codes = || envelope.errors.iter().map(|e| &e.code);
                if codes().any(|c| {
                    matches!(
                        c,
                        C::ManifestUnknown | C::NameUnknown | C::BlobUnknown | C::NotFound
                    )
                }) {
                    Self::NotFound
                } else if codes().any(|c| matches!(c, C::Unauthorized | C::Denied)) {
                    Self::Unauthorized
                } else if codes().any(|c| matches!(c, C::Toomanyrequests)) {
                    Self::Status { code: 429, message }
                } else {
                    Self::Status { code: 400, message }
                }
            }
            E::ServerError { code: 404, .. } => Self::NotFound,
            E::ServerError {
                code: 401 | 403, ..
            } => Self::Unauthorized,
            E::ServerError { code, message, .. } => Self::Status {
                code,
                message: message.chars().take(200).collect(),
            },
            E::DigestError(e) => Self::Malformed(format!("digest mismatch: {e}")),
            E::RequestError(e) => Self::Transport(error_chain(&e)),
            E::ManifestParsingError(m) | E::VersionedParsingError(m) => Self::Malformed(m),
            other => Self::Transport(error_chain(&other)),
        }
    }
}

/// An error and its causes on one line: reqwest's top-level message ("error sending request")
/// hides the useful part ("connection refused", "certificate unknown").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}
