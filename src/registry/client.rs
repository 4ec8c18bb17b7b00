//! The registry client: thin HTTP over one shared `reqwest` connection pool, speaking the
//! distribution API's read side (manifest and blob GETs) and its auth (anonymous, Basic, Bearer
//! tokens).
//!
//! Why not `oci-client` here: it sends an extra `GET /v2/` before every request to a registry
//! without auth, doubling the registry round trips of a cold lookup (measured in BENCHMARKS.md),
//! and gives no per-request hook for metrics or size limits. The test suite still pushes its
//! fixtures with `oci-client`.

mod answers;
mod auth;
mod digests;
mod redirects;

use std::collections::{HashMap, HashSet};
use std::hash::RandomState;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, WWW_AUTHENTICATE};
use reqwest::StatusCode;

use self::answers::{rate_limit_of, read_capped, status_error, transport_error, CONNECTION_FAILED};
use self::auth::{AuthorizationKey, CachedAuthorization};
use self::digests::{shown_reference, verify_digest};
use self::redirects::redirect_policy;
use super::access::{AccessRules, FilteringResolver};
use super::bounds::LookupBounds;
use super::challenge::{self, Challenge};
use super::children::{ChildKey, Children};
use super::credentials::Credential;
use super::manifest::ACCEPT as MANIFEST_TYPES;
use super::{FetchError, ManifestSource, RegistryObserver, RequestMethod};

pub(crate) use self::answers::error_chain;
pub use self::auth::parse_token_response;
pub(crate) use self::digests::{is_digest, sha256_digest};

/// Manifests are small; the OCI distribution spec asks registries to accept up to 4 MiB.
pub(crate) const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// Image configs are a few KiB.
pub(crate) const MAX_CONFIG_BYTES: usize = 4 << 20;
/// Transport settings shared by every request.
#[derive(Clone, Debug)]
pub struct TransportSettings {
    pub connect_timeout: Duration,
    /// Longest wait for any read; the lookup deadline bounds the whole lookup on top.
    pub read_timeout: Duration,
    /// `host:port` of registries (and token services) spoken to over plain http. Matched
    /// ignoring case, like host names everywhere else.
    pub insecure_registries: Vec<String>,
    /// Extra trusted roots (PEM bundles), on top of the system's.
    pub extra_roots_pem: Vec<Vec<u8>>,
    /// Which hosts may be contacted at all (image hosts, mirrors, token realms, redirects).
    pub access: AccessRules,
}

pub(crate) struct RegistryClient {
    http: reqwest::Client,
    /// Lower-cased.
    insecure: Arc<HashSet<String>>,
    access: Arc<AccessRules>,
    authorizations: Mutex<HashMap<AuthorizationKey, CachedAuthorization>>,
    hasher: RandomState,
    observer: Option<Arc<dyn RegistryObserver>>,
    /// Manifests by digest and config blobs, read once across lookups.
    children: Children,
}

impl RegistryClient {
    pub(crate) fn set_observer(&mut self, observer: Arc<dyn RegistryObserver>) {
        self.observer = Some(observer);
    }

    /// Counts a request, and reads the registry's rate-limit headers from its answer.
    fn observe(&self, host: &str, method: RequestMethod, response: Option<&reqwest::Response>) {
        if let Some(observer) = &self.observer {
            observer.registry_request(host, method, response.map(|r| r.status().as_u16()));
            if let Some(limit) = response.and_then(|r| rate_limit_of(r.headers())) {
                observer.rate_limit(host, limit);
            }
        }
    }

    pub(crate) fn new(settings: &TransportSettings) -> Result<Self, FetchError> {
        let mut roots = Vec::new();
        for pem in &settings.extra_roots_pem {
            roots.extend(reqwest::Certificate::from_pem_bundle(pem).map_err(|e| {
                FetchError::Transport {
                    reason: format!("bad registry CA bundle: {e}"),
                    cause: String::new(),
                }
            })?);
        }
        let insecure: Arc<HashSet<String>> = Arc::new(
            settings
                .insecure_registries
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
        );
        let access = Arc::new(settings.access.clone());
        let http = reqwest::Client::builder()
            .redirect(redirect_policy(access.clone(), insecure.clone()))
            .dns_resolver(FilteringResolver::new(access.clone()))
            .connect_timeout(settings.connect_timeout)
            .read_timeout(settings.read_timeout)
            // Idle connections go soon, and no more are kept per host than lookups may run
            // there at once: a Pod naming many hosts must not leave thousands of sockets open.
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(super::MAX_LOOKUPS_PER_HOST)
            .user_agent(concat!("tolerable/", env!("CARGO_PKG_VERSION")))
            .tls_certs_merge(roots)
            .build()
            .map_err(|e| FetchError::Transport {
                reason: format!("cannot build the registry client: {}", error_chain(&e)),
                cause: String::new(),
            })?;
        Ok(Self {
            http,
            insecure,
            access,
            authorizations: Mutex::default(),
            hasher: RandomState::new(),
            observer: None,
            children: Children::default(),
        })
    }

    /// A fingerprint of a credential, for cache keys (process-local, not reversible).
    pub(crate) fn fingerprint(&self, credential: &Credential) -> u64 {
        credential.fingerprint(&self.hasher)
    }

    /// A fingerprint of a named source of credentials (a plugin), for cache keys.
    pub(crate) fn fingerprint_label(&self, label: &str) -> u64 {
        use std::hash::BuildHasher as _;
        self.hasher.hash_one(("source", label))
    }

    /// Requests to `host` (an API host such as `registry-1.docker.io`) with `credential`, their
    /// answers read within the lookup's `bounds`.
    pub(crate) fn source<'a>(
        &'a self,
        host: &str,
        credential: Option<&'a Credential>,
        bounds: &'a LookupBounds,
    ) -> HostSource<'a> {
        HostSource {
            client: self,
            host: host.to_owned(),
            fingerprint: credential.map(|c| self.fingerprint(c)),
            credential,
            bounds,
        }
    }

    fn scheme_for(&self, host_port: &str) -> &'static str {
        if self.insecure.contains(&host_port.to_ascii_lowercase()) {
            "http"
        } else {
            "https"
        }
    }

    /// Whether the access rules let `url`'s host be contacted; `what` names it in the error.
    fn permit(&self, url: &reqwest::Url, what: &str) -> Result<(), FetchError> {
        self.access.check_url(url).map_err(|denied| {
            tracing::info!(url = ?url.as_str(), %denied, "registry access rules refused a host");
            FetchError::NotAllowed(format!("tolerable may not contact {what}: {denied}"))
        })
    }
}

/// One registry host, one credential (or none).
pub(crate) struct HostSource<'a> {
    client: &'a RegistryClient,
    host: String,
    credential: Option<&'a Credential>,
    fingerprint: Option<u64>,
    /// Every body read holds its bytes from the lookup's share while it arrives.
    bounds: &'a LookupBounds,
}

impl HostSource<'_> {
    /// GET `/v2/<repository>/<kind>/<reference>`: the body (at most `max_bytes`) and headers.
    async fn get(
        &self,
        repository: &str,
        kind: &str,
        reference: &str,
        accept: Option<&str>,
        max_bytes: usize,
    ) -> Result<(Bytes, HeaderMap), FetchError> {
        let path = Path {
            repository,
            kind,
            reference,
        };
        let response = self.request(RequestMethod::Get, &path, accept).await?;
        let headers = response.headers().clone();
        // The registry has answered: from here a stall is the image's content stalling.
        let what = shown_reference(reference);
        let reading = self.bounds.reading_body(what);
        let body = read_capped(
            response,
            max_bytes,
            (self.bounds, &self.host),
            Some(&reading),
        )
        .await?;
        Ok((body, headers))
    }

    /// `method` `/v2/<repository>/<kind>/<reference>`, answering one auth challenge if needed:
    /// the 200 answer, or the error any other status means.
    async fn request(
        &self,
        method: RequestMethod,
        &Path {
            repository,
            kind,
            reference,
        }: &Path<'_>,
        accept: Option<&str>,
    ) -> Result<reqwest::Response, FetchError> {
        let url = format!(
            "{}://{}/v2/{repository}/{kind}/{reference}",
            self.client.scheme_for(&self.host),
            self.host
        );
        // Until a 200's headers are here (the challenge, the token and any error body
        // included), a lookup that runs out of time waited on the registry.
        let _awaiting = self.bounds.awaiting_answer();
        let parsed = reqwest::Url::parse(&url)
            .map_err(|_| FetchError::Malformed(format!("{url:?} is not a URL")))?;
        self.client
            .permit(&parsed, &format!("registry {}", self.host))?;
        let cached = self.cached_authorization(repository);
        let had_cached = cached.is_some();
        let mut response = self.send(method, &url, accept, cached).await?;
        if response.status() == StatusCode::UNAUTHORIZED {
            // A cached token may have been revoked, or this is the first request: answer the
            // challenge once.
            let challenges: Vec<Challenge> = response
                .headers()
                .get_all(WWW_AUTHENTICATE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(challenge::parse)
                .collect();
            if had_cached {
                tracing::debug!(host = %self.host, repository, "cached authorization refused; renewing");
            }
            let Some(authorization) = self.answer(repository, &challenges).await? else {
                return Err(FetchError::Unauthorized);
            };
            response = self.send(method, &url, accept, Some(authorization)).await?;
        }
        let status = response.status();
        if status != StatusCode::OK {
            return Err(status_error(status, response, (self.bounds, &self.host)).await);
        }
        Ok(response)
    }

    async fn send(
        &self,
        method: RequestMethod,
        url: &str,
        accept: Option<&str>,
        authorization: Option<HeaderValue>,
    ) -> Result<reqwest::Response, FetchError> {
        let mut request = match method {
            RequestMethod::Get => self.client.http.get(url),
            RequestMethod::Head => self.client.http.head(url),
        };
        if let Some(accept) = accept {
            request = request.header(ACCEPT, accept);
        }
        if let Some(authorization) = authorization {
            request = request.header(AUTHORIZATION, authorization);
        }
        let started = Instant::now();
        let result = request.send().await;
        self.client
            .observe(&self.host, method, result.as_ref().ok());
        if let Ok(response) = &result {
            tracing::debug!(
                host = %self.host, method = method.label(), status = response.status().as_u16(),
                elapsed_us = started.elapsed().as_micros() as u64, "registry request"
            );
        }
        result.map_err(|e| transport_error(&e, &self.host, CONNECTION_FAILED))
    }
}

impl HostSource<'_> {
    /// The digest the registry names for manifest `reference` (a tag), from a HEAD: no body,
    /// and no count against Docker Hub's pull rate limit. `None` when the registry sends no
    /// (usable) `Docker-Content-Digest`.
    pub(crate) async fn head_digest(
        &self,
        repository: &str,
        reference: &str,
    ) -> Result<Option<String>, FetchError> {
        let accept = MANIFEST_TYPES.join(", ");
        let path = Path {
            repository,
            kind: "manifests",
            reference,
        };
        let response = self
            .request(RequestMethod::Head, &path, Some(&accept))
            .await?;
        Ok(response
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .filter(|digest| is_digest(digest))
            .map(str::to_owned))
    }
}

impl ManifestSource for HostSource<'_> {
    async fn manifest(
        &self,
        repository: &str,
        reference: &str,
    ) -> Result<(Bytes, String), FetchError> {
        if reference.contains(':') {
            let read = Box::pin(async {
                let (body, _) = self.get_manifest(repository, reference).await?;
                verify_digest(reference, &body)?;
                Ok(body)
            });
            let key = self.child_key(repository, reference, false);
            let marked = (self.bounds, shown_reference(reference));
            let body = self.client.children.get_or_read(key, read, marked).await?;
            return Ok((body, reference.to_owned()));
        }
        let (body, headers) = self.get_manifest(repository, reference).await?;
        let digest = match headers
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
        {
            Some(header) => {
                verify_digest(header, &body)?;
                header.to_owned()
            }
            None => sha256_digest(&body),
        };
        Ok((body, digest))
    }

    async fn blob(&self, repository: &str, digest: &str) -> Result<Bytes, FetchError> {
        let read = Box::pin(async {
            let (body, _) = self
                .get(repository, "blobs", digest, None, MAX_CONFIG_BYTES)
                .await?;
            verify_digest(digest, &body)?;
            Ok(body)
        });
        let key = self.child_key(repository, digest, true);
        let marked = (self.bounds, shown_reference(digest));
        self.client.children.get_or_read(key, read, marked).await
    }
}

impl HostSource<'_> {
    /// GET a manifest (tag or digest), unchecked.
    async fn get_manifest(
        &self,
        repository: &str,
        reference: &str,
    ) -> Result<(Bytes, HeaderMap), FetchError> {
        let accept = MANIFEST_TYPES.join(", ");
        self.get(
            repository,
            "manifests",
            reference,
            Some(&accept),
            MAX_MANIFEST_BYTES,
        )
        .await
    }

    /// The key of child `digest` of `repository` read through this source.
    fn child_key(&self, repository: &str, digest: &str, blob: bool) -> ChildKey {
        ChildKey {
            host: self.host.clone(),
            repository: repository.to_owned(),
            credential: self.fingerprint,
            digest: digest.to_owned(),
            blob,
        }
    }
}

/// The path of a distribution API request: `/v2/<repository>/<kind>/<reference>`.
struct Path<'a> {
    repository: &'a str,
    kind: &'a str,
    reference: &'a str,
}
