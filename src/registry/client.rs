//! The registry client: thin HTTP over one shared `reqwest` connection pool, speaking the
//! distribution API's read side (manifest and blob GETs) and its auth (anonymous, Basic, Bearer
//! tokens).
//!
//! Why not `oci-client` here: it sends an extra `GET /v2/` before every request to a registry
//! without auth, doubling the registry round trips of a cold lookup (measured in BENCHMARKS.md),
//! and gives no per-request hook for metrics or size limits. The test suite still pushes its
//! fixtures with `oci-client`.

use std::collections::{HashMap, HashSet};
use std::hash::RandomState;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, WWW_AUTHENTICATE};
use reqwest::StatusCode;
use serde::Deserialize;

use super::access::{AccessRules, FilteringResolver};
use super::bounds::LookupBounds;
use super::challenge::{self, Challenge};
use super::credentials::Credential;
use super::manifest::ACCEPT as MANIFEST_TYPES;
use super::{FetchError, ManifestSource, RateLimit, RegistryObserver, RequestMethod};

/// Manifests are small; the OCI distribution spec asks registries to accept up to 4 MiB.
pub(crate) const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// Image configs are a few KiB.
pub(crate) const MAX_CONFIG_BYTES: usize = 4 << 20;
/// Token lifetime when the token service does not say (the Docker token spec's default).
const DEFAULT_TOKEN_SECONDS: u64 = 60;
/// Registries redirect blob (and some manifest) GETs to a storage host or CDN, once; a longer
/// chain is a loop or a hostile registry walking tolerable around a network.
const MAX_REDIRECTS: usize = 3;
/// What an admission warning says about any failure to connect: refused, not TLS, a bad
/// certificate and a timed-out handshake look the same, so a Pod author cannot use tolerable as
/// a port scanner. The detail is in the debug log.
const CONNECTION_FAILED: &str = "connection failed";

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

/// An `Authorization` value we may reuse, and until when.
struct CachedAuthorization {
    value: HeaderValue,
    valid_until: Instant,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct AuthorizationKey {
    host: String,
    repository: String,
    credential: Option<u64>,
}

pub(crate) struct RegistryClient {
    http: reqwest::Client,
    /// Lower-cased.
    insecure: Arc<HashSet<String>>,
    access: Arc<AccessRules>,
    authorizations: Mutex<HashMap<AuthorizationKey, CachedAuthorization>>,
    hasher: RandomState,
    observer: Option<Arc<dyn RegistryObserver>>,
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

/// Whether `url` (plain http) names a host listed in `insecure_registries`: as `host:port`, or
/// as `host` alone for port 80.
fn listed_insecure(insecure: &HashSet<String>, url: &reqwest::Url) -> bool {
    let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
    let port = url.port_or_known_default().unwrap_or_default();
    insecure.contains(&format!("{host}:{port}")) || (port == 80 && insecure.contains(&host))
}

/// Why a redirect must not be followed: reqwest hands it back as the request's error.
#[derive(Debug)]
struct RedirectRefused(String);

impl std::fmt::Display for RedirectRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RedirectRefused {}

/// `/v2/<name>/manifests/<reference>` or `/v2/<name>/blobs/<digest>`: the requests the OCI
/// distribution spec lets a registry redirect. (A realm URL shaped like one gains nothing: its
/// redirects meet the same rules.)
fn is_content_path(path: &str) -> bool {
    path.strip_prefix("/v2/").is_some_and(|rest| {
        rest.rsplit_once('/').is_some_and(|(front, reference)| {
            !reference.is_empty()
                && front
                    .strip_suffix("/manifests")
                    .or_else(|| front.strip_suffix("/blobs"))
                    .is_some_and(|repository| !repository.is_empty())
        })
    })
}

/// Redirects are followed only as the distribution spec needs them (manifest and blob GETs),
/// at most [`MAX_REDIRECTS`] hops, to https (plain http only for a host in
/// `insecure_registries`, and never after https), and only to hosts the access rules allow.
/// reqwest drops `Authorization` whenever the host, port or scheme changes, so credentials
/// never follow a redirect to another host.
fn redirect_policy(
    access: Arc<AccessRules>,
    insecure: Arc<HashSet<String>>,
) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        let next = attempt.url();
        let previous = attempt.previous();
        let refusal = if previous.len() > MAX_REDIRECTS {
            Some(format!("more than {MAX_REDIRECTS} redirects"))
        } else if !previous.first().is_some_and(|u| is_content_path(u.path())) {
            Some("a redirect of a token request".to_owned())
        } else {
            match next.scheme() {
                "https" => None,
                "http"
                    if listed_insecure(&insecure, next)
                        && previous.iter().all(|u| u.scheme() == "http") =>
                {
                    None
                }
                "http" => Some("a redirect to plain http".to_owned()),
                _ => Some("a redirect to another protocol".to_owned()),
            }
            .or_else(|| {
                access
                    .check_url(next)
                    .err()
                    .map(|denied| format!("a redirect to a host that is {denied}"))
            })
        };
        match refusal {
            None => attempt.follow(),
            Some(why) => {
                tracing::info!(
                    from = ?previous.last().map(reqwest::Url::as_str), to = ?next.as_str(), %why,
                    "registry redirect refused"
                );
                attempt.error(RedirectRefused(format!("refused {why}")))
            }
        }
    })
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
    fn key(&self, repository: &str) -> AuthorizationKey {
        AuthorizationKey {
            host: self.host.clone(),
            repository: repository.to_owned(),
            credential: self.fingerprint,
        }
    }

    fn cached_authorization(&self, repository: &str) -> Option<HeaderValue> {
        let mut cache = self
            .client
            .authorizations
            .lock()
            .expect("authorization cache poisoned");
        let key = self.key(repository);
        match cache.get(&key) {
            Some(cached) if cached.valid_until > Instant::now() => Some(cached.value.clone()),
            Some(_) => {
                cache.remove(&key);
                None
            }
            None => None,
        }
    }

    fn remember_authorization(&self, repository: &str, value: HeaderValue, lifetime: Duration) {
        let mut cache = self
            .client
            .authorizations
            .lock()
            .expect("authorization cache poisoned");
        let now = Instant::now();
        // Expired entries of other images would otherwise pile up.
        if cache.len() >= 10_000 {
            cache.retain(|_, cached| cached.valid_until > now);
        }
        cache.insert(
            self.key(repository),
            CachedAuthorization {
                value,
                valid_until: now + lifetime,
            },
        );
    }

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
        let _reading = self.bounds.reading_body(what);
        let body = read_capped(response, max_bytes, self.bounds, Some(what)).await?;
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
            return Err(status_error(status, response, self.bounds).await);
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

    /// Works out the `Authorization` for a challenge; `None` when we have nothing to offer.
    async fn answer(
        &self,
        repository: &str,
        challenges: &[Challenge],
    ) -> Result<Option<HeaderValue>, FetchError> {
        if let Some(bearer) = challenges.iter().find(|c| c.scheme == "bearer") {
            let (value, lifetime) = self.fetch_token(bearer, repository).await?;
            self.remember_authorization(repository, value.clone(), lifetime);
            return Ok(Some(value));
        }
        if challenges.iter().any(|c| c.scheme == "basic") {
            let Some(credential) = self.credential else {
                return Ok(None);
            };
            let value = basic_authorization(credential);
            // Basic credentials do not expire; re-checked whenever the registry says 401.
            self.remember_authorization(repository, value.clone(), Duration::from_secs(3600));
            return Ok(Some(value));
        }
        Ok(None)
    }

    /// Asks the challenge's token service for a pull token for `repository`.
    async fn fetch_token(
        &self,
        challenge: &Challenge,
        repository: &str,
    ) -> Result<(HeaderValue, Duration), FetchError> {
        let realm = challenge
            .param("realm")
            .ok_or_else(|| FetchError::Malformed("Bearer challenge without a realm".into()))?;
        let realm_url = reqwest::Url::parse(realm).map_err(|_| {
            FetchError::Malformed(format!("Bearer challenge realm {realm:?} is not a URL"))
        })?;
        let realm_host = format!(
            "{}:{}",
            realm_url.host_str().unwrap_or_default(),
            realm_url.port_or_known_default().unwrap_or_default()
        );
        // A realm is the registry's word: a hostile registry names an internal URL. Only https
        // (or a token service listed as insecure), and only a host the access rules allow.
        if realm_url.scheme() != "https" && !listed_insecure(&self.client.insecure, &realm_url) {
            return Err(FetchError::NotAllowed(if self.credential.is_some() {
                format!(
                    "refusing to send credentials to the plain-http token service {realm_host} (list it in insecure_registries to allow)"
                )
            } else {
                format!(
                    "refusing the plain-http token service {realm_host} (list it in insecure_registries to allow)"
                )
            }));
        }
        self.client.permit(&realm_url, "its token service")?;
        let scope = format!("repository:{repository}:pull");
        let mut realm_url = realm_url;
        {
            let mut query = realm_url.query_pairs_mut();
            query.append_pair("scope", &scope);
            if let Some(service) = challenge.param("service") {
                query.append_pair("service", service);
            }
        }
        let mut request = self.client.http.get(realm_url);
        if let Some(credential) = self.credential {
            request = request.header(AUTHORIZATION, basic_authorization(credential));
        }
        let response = request.send().await;
        self.client
            .observe(&realm_host, RequestMethod::Get, response.as_ref().ok());
        let response = response
            .map_err(|e| transport_error(&e, &realm_host, "token service: connection failed"))?;
        match response.status() {
            StatusCode::OK => {}
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                return Err(FetchError::Unauthorized)
            }
            // The status only: the body of a URL a registry named is nobody's business.
            status => {
                return Err(FetchError::Status {
                    code: status.as_u16(),
                    message: format!(
                        "token service answered {}",
                        status.canonical_reason().unwrap_or("an error")
                    ),
                })
            }
        }
        let body = read_capped(response, 1 << 20, self.bounds, None).await?;
        parse_token_response(&body)
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

/// `sha256:<64 hex>` or `sha512:<128 hex>`: a digest a manifest can be fetched and checked by.
pub(crate) fn is_digest(text: &str) -> bool {
    let hex_of = |hex: &str, len: usize| {
        hex.len() == len && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    match text.split_once(':') {
        Some(("sha256", hex)) => hex_of(hex, 64),
        Some(("sha512", hex)) => hex_of(hex, 128),
        _ => false,
    }
}

impl ManifestSource for HostSource<'_> {
    async fn manifest(
        &self,
        repository: &str,
        reference: &str,
    ) -> Result<(Bytes, String), FetchError> {
        let accept = MANIFEST_TYPES.join(", ");
        let (body, headers) = self
            .get(
                repository,
                "manifests",
                reference,
                Some(&accept),
                MAX_MANIFEST_BYTES,
            )
            .await?;
        let digest = if reference.contains(':') {
            verify_digest(reference, &body)?;
            reference.to_owned()
        } else {
            match headers
                .get("docker-content-digest")
                .and_then(|v| v.to_str().ok())
            {
                Some(header) => {
                    verify_digest(header, &body)?;
                    header.to_owned()
                }
                None => sha256_digest(&body),
            }
        };
        Ok((body, digest))
    }

    async fn blob(&self, repository: &str, digest: &str) -> Result<Bytes, FetchError> {
        let (body, _) = self
            .get(repository, "blobs", digest, None, MAX_CONFIG_BYTES)
            .await?;
        verify_digest(digest, &body)?;
        Ok(body)
    }
}

/// The path of a distribution API request: `/v2/<repository>/<kind>/<reference>`.
struct Path<'a> {
    repository: &'a str,
    kind: &'a str,
    reference: &'a str,
}

/// Docker Hub's rate-limit headers (`ratelimit-limit: 100;w=21600`, `ratelimit-remaining:
/// 76;w=21600`), as numbers; `None` when the answer carries neither.
fn rate_limit_of(headers: &HeaderMap) -> Option<RateLimit> {
    let number = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next()?.trim().parse::<u64>().ok())
    };
    let limit = RateLimit {
        limit: number("ratelimit-limit"),
        remaining: number("ratelimit-remaining"),
    };
    (limit != RateLimit::default()).then_some(limit)
}

fn basic_authorization(credential: &Credential) -> HeaderValue {
    let raw = format!("{}:{}", credential.user(), credential.secret());
    let mut value = HeaderValue::from_str(&format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("Basic"));
    value.set_sensitive(true);
    value
}

#[derive(Deserialize)]
struct TokenResponse {
    token: Option<String>,
    access_token: Option<String>,
    expires_in: Option<u64>,
}

/// The longest `expires_in` believed: a day.
const MAX_TOKEN_SECONDS: u64 = 86_400;

/// A token service's answer: `token` or `access_token`, and `expires_in` (default 60 s). The
/// token is reused for nine tenths of its life, so it is never sent just as it expires.
pub fn parse_token_response(body: &[u8]) -> Result<(HeaderValue, Duration), FetchError> {
    let response: TokenResponse = serde_json::from_slice(body).map_err(|_| {
        FetchError::Malformed("token service answered with something other than a token".into())
    })?;
    let token = response
        .token
        .filter(|t| !t.is_empty())
        .or(response.access_token.filter(|t| !t.is_empty()))
        .ok_or_else(|| FetchError::Malformed("token service answered without a token".into()))?;
    let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
        FetchError::Malformed("token service answered with an unusable token".into())
    })?;
    value.set_sensitive(true);
    // Capped: a token service's `expires_in` is its word, and a day is longer than any token
    // needs keeping (an unbounded one would overflow the lifetime below).
    let seconds = response
        .expires_in
        .unwrap_or(DEFAULT_TOKEN_SECONDS)
        .clamp(1, MAX_TOKEN_SECONDS);
    Ok((value, Duration::from_millis(seconds * 900)))
}

/// First capacity of a body buffer; it doubles as bytes arrive.
const INITIAL_BODY_CAPACITY: usize = 16 << 10;

/// Reads a body of at most `max_bytes` into one buffer whose every byte of capacity is first
/// reserved from the lookup's `bounds`: a declared length at once (so children that declare
/// more than the lookup's share end it before sending it), an undeclared one as the bytes
/// arrive. The buffer itself grows as the bytes arrive, so a body that stalls occupies only
/// what it sent. The reservation ends with the read. A `content` body (a manifest or blob,
/// named so) that stalls past the read timeout is [`FetchError::Stalled`].
async fn read_capped(
    mut response: reqwest::Response,
    max_bytes: usize,
    bounds: &LookupBounds,
    content: Option<&str>,
) -> Result<Bytes, FetchError> {
    let declared = response.content_length();
    if declared.is_some_and(|n| n > max_bytes as u64) {
        return Err(FetchError::TooLarge);
    }
    // The buffer grows no larger than the declared length (a body longer than it declared is
    // hyper's error), nor than `max_bytes`.
    let ceiling = declared.map_or(max_bytes, |n| (n as usize).min(max_bytes));
    let mut reserved = bounds.reservation();
    reserved.grow_to(ceiling.min(declared.map_or(0, |n| n as usize)))?;
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| match content {
        Some(what) if e.is_timeout() => FetchError::Stalled(what.to_owned()),
        _ => transport_error(&e, "-", CONNECTION_FAILED),
    })? {
        let needed = body.len() + chunk.len();
        if needed > max_bytes {
            return Err(FetchError::TooLarge);
        }
        if needed > body.capacity() {
            let capacity = needed
                .max(body.capacity() * 2)
                .max(INITIAL_BODY_CAPACITY)
                .min(ceiling.max(needed));
            reserved.grow_to(capacity)?;
            body.reserve_exact(capacity - body.len());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.into())
}

#[derive(Deserialize)]
struct ErrorEnvelope {
    errors: Vec<ErrorEntry>,
}

#[derive(Deserialize)]
struct ErrorEntry {
    #[serde(default)]
    code: String,
}

/// The error codes of the distribution spec (and distribution's own `UNKNOWN`, `UNAVAILABLE`):
/// the only words of an error body that reach a message.
const ERROR_CODES: &[&str] = &[
    "BLOB_UNKNOWN",
    "BLOB_UPLOAD_INVALID",
    "BLOB_UPLOAD_UNKNOWN",
    "DIGEST_INVALID",
    "MANIFEST_BLOB_UNKNOWN",
    "MANIFEST_INVALID",
    "MANIFEST_UNKNOWN",
    "MANIFEST_UNVERIFIED",
    "NAME_INVALID",
    "NAME_UNKNOWN",
    "SIZE_INVALID",
    "UNAUTHORIZED",
    "DENIED",
    "UNSUPPORTED",
    "TOOMANYREQUESTS",
    "UNKNOWN",
    "UNAVAILABLE",
];

/// A non-success answer as an error: the status and the spec's error codes, never the body's
/// text. The URL may have been named by a Pod or a hostile registry (a redirect, a realm), and
/// an internal service's error page must not come back in an admission warning.
async fn status_error(
    status: StatusCode,
    response: reqwest::Response,
    bounds: &LookupBounds,
) -> FetchError {
    match status {
        StatusCode::NOT_FOUND => return FetchError::NotFound,
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => return FetchError::Unauthorized,
        StatusCode::TOO_MANY_REQUESTS => {
            return FetchError::RateLimited {
                retry_after: response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(retry_after_seconds)
                    .filter(|after| !after.is_zero()),
            }
        }
        _ => {}
    }
    let body = read_capped(response, 64 << 10, bounds, None)
        .await
        .unwrap_or_default();
    FetchError::Status {
        code: status.as_u16(),
        message: error_codes(&body)
            .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_owned()),
    }
}

/// The known error codes an error body names (`MANIFEST_UNKNOWN, DENIED`), if any.
fn error_codes(body: &[u8]) -> Option<String> {
    let envelope: ErrorEnvelope = serde_json::from_slice(body).ok()?;
    let mut codes: Vec<&str> = envelope
        .errors
        .iter()
        .filter_map(|e| ERROR_CODES.iter().copied().find(|known| *known == e.code))
        .collect();
    codes.dedup();
    codes.truncate(4);
    (!codes.is_empty()).then(|| codes.join(", "))
}

/// `Retry-After` in delta-seconds (what registries send; an HTTP-date is not believed, and the
/// breaker's own cooldown applies instead).
fn retry_after_seconds(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

pub(crate) fn sha256_digest(body: &[u8]) -> String {
    hex_digest(
        "sha256",
        ring::digest::digest(&ring::digest::SHA256, body).as_ref(),
    )
}

fn hex_digest(algorithm: &str, bytes: &[u8]) -> String {
    let mut out = String::with_capacity(algorithm.len() + 1 + bytes.len() * 2);
    out.push_str(algorithm);
    out.push(':');
    for b in bytes {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Checks `body` against `expected` (`sha256:…` or `sha512:…`).
fn verify_digest(expected: &str, body: &[u8]) -> Result<(), FetchError> {
    let actual = match expected.split_once(':') {
        Some(("sha256", _)) => sha256_digest(body),
        Some(("sha512", _)) => hex_digest(
            "sha512",
            ring::digest::digest(&ring::digest::SHA512, body).as_ref(),
        ),
        _ => {
            return Err(FetchError::Malformed(format!(
                "unsupported digest {}",
                shown_digest(expected)
            )))
        }
    };
    if actual == expected {
        Ok(())
    } else {
        Err(FetchError::Malformed(format!(
            "content does not match its digest (expected {}, got {actual})",
            shown_digest(expected)
        )))
    }
}

/// A digest as a message may repeat it (`algorithm:hex`, short): `expected` may come from a
/// response header, and a header's free text must not reach a warning.
fn shown_digest(digest: &str) -> &str {
    let plausible = digest.len() <= 160
        && digest.split_once(':').is_some_and(|(algorithm, hex)| {
            !algorithm.is_empty()
                && algorithm.bytes().all(|b| b.is_ascii_alphanumeric())
                && !hex.is_empty()
                && hex.bytes().all(|b| b.is_ascii_hexdigit())
        });
    if plausible {
        digest
    } else {
        "(unrecognised)"
    }
}

/// A manifest reference or blob digest as a message may repeat it: a digest as
/// [`shown_digest`] shows it, a tag as it is (the reference parser checked it; anything else
/// is unrecognised).
fn shown_reference(reference: &str) -> &str {
    let tag = (1..=128).contains(&reference.len())
        && reference
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    match reference.contains(':') {
        true => shown_digest(reference),
        false if tag => reference,
        false => "(unrecognised)",
    }
}

/// A request that got no answer. A redirect the policy refused is said as such; anything else
/// (refused, not TLS, a bad certificate, a timeout) is `public` and nothing more, with the
/// detail beside it as the cause (for `inspect` and `review`, never the webhook's answers) and
/// in the debug log, quoted.
fn transport_error(e: &reqwest::Error, host: &str, public: &str) -> FetchError {
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = source {
        if let Some(refused) = s.downcast_ref::<RedirectRefused>() {
            return FetchError::NotAllowed(refused.0.clone());
        }
        source = s.source();
    }
    tracing::debug!(%host, error = ?error_chain(e), "registry request failed");
    FetchError::Transport {
        reason: public.to_owned(),
        cause: transport_cause(e),
    }
}

/// The longest cause a terminal is shown.
const MAX_CAUSE_CHARS: usize = 300;

/// Why a request got no answer, for an operator: the error's causes below reqwest's own
/// message (which names the URL: a realm or redirect URL is the registry's word, and may carry
/// user info), with control characters dropped and the length capped. The causes are the
/// resolver's, the socket's and TLS's words — never a header or a body (a body is read only
/// after an answer, and an answer is no transport error).
fn transport_cause(e: &reqwest::Error) -> String {
    let mut cause = match std::error::Error::source(e) {
        Some(source) => error_chain(source),
        None if e.is_timeout() => "timed out".to_owned(),
        None => String::new(),
    };
    if e.is_timeout() && !cause.contains("timed out") {
        cause = if cause.is_empty() {
            "timed out".to_owned()
        } else {
            format!("timed out: {cause}")
        };
    }
    cause
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_CAUSE_CHARS)
        .collect()
}

/// An error and its causes on one line: reqwest's top-level message ("error sending request")
/// hides the useful part ("connection refused", "invalid peer certificate: UnknownIssuer").
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_responses() {
        let (value, life) = parse_token_response(br#"{"token":"abc","expires_in":300}"#).unwrap();
        assert_eq!(value.to_str().unwrap(), "Bearer abc");
        assert!(value.is_sensitive());
        assert_eq!(life, Duration::from_secs(270));
        let (value, life) = parse_token_response(br#"{"access_token":"xyz"}"#).unwrap();
        assert_eq!(value.to_str().unwrap(), "Bearer xyz");
        assert_eq!(life, Duration::from_secs(54));
        // An absurd lifetime is capped at a day (kept 90 % of it), never overflowed to zero.
        let huge = format!(r#"{{"token":"abc","expires_in":{}}}"#, u64::MAX);
        let (_, life) = parse_token_response(huge.as_bytes()).unwrap();
        assert_eq!(life, Duration::from_secs(86_400 * 9 / 10));
        let (value, _) = parse_token_response(br#"{"token":"","access_token":"t2"}"#).unwrap();
        assert_eq!(value.to_str().unwrap(), "Bearer t2");
        for bad in [
            &br#"{}"#[..],
            b"not json",
            br#"{"token":"a\nb"}"#,
            br#"{"token":7}"#,
        ] {
            let err = parse_token_response(bad).unwrap_err();
            assert!(matches!(err, FetchError::Malformed(_)), "{bad:?}");
        }
    }

    #[test]
    fn digests() {
        let d = sha256_digest(b"hello");
        assert_eq!(
            d,
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        verify_digest(&d, b"hello").unwrap();
        assert!(verify_digest(&d, b"hellO").is_err());
        assert!(verify_digest("md5:abc", b"hello").is_err());
        let err = verify_digest("sha256:SECRET text", b"hello").unwrap_err();
        assert!(!format!("{err:?}").contains("SECRET"), "{err:?}");
        let err = verify_digest("SECRET", b"hello").unwrap_err();
        assert!(!format!("{err:?}").contains("SECRET"), "{err:?}");
        let sha512 = hex_digest(
            "sha512",
            ring::digest::digest(&ring::digest::SHA512, b"x").as_ref(),
        );
        verify_digest(&sha512, b"x").unwrap();
    }

    #[test]
    fn only_real_digests_are_taken_from_a_head() {
        assert!(is_digest(&sha256_digest(b"x")));
        let sha512 = hex_digest(
            "sha512",
            ring::digest::digest(&ring::digest::SHA512, b"x").as_ref(),
        );
        assert!(is_digest(&sha512));
        for bad in [
            "",
            "sha256:",
            "sha256:abc",
            "md5:d41d8cd98f00b204e9800998ecf8427e",
            &format!("sha256:{}", "A".repeat(64)),
            &format!("sha256:{}/../x", "a".repeat(64)),
        ] {
            assert!(!is_digest(bad), "{bad}");
        }
    }

    #[test]
    fn only_manifest_and_blob_requests_are_redirected() {
        for path in [
            "/v2/app/manifests/v1",
            "/v2/org/app/blobs/sha256:abc",
            "/v2/manifests/manifests/v1",
        ] {
            assert!(is_content_path(path), "{path}");
        }
        for path in [
            "/token",
            "/v2/",
            "/v2/manifests/v1",
            "/v2/app/manifests/",
            "/v2/app/tags/list",
            "/latest/meta-data/",
        ] {
            assert!(!is_content_path(path), "{path}");
        }
    }

    #[test]
    fn insecure_registries_ignore_case_and_name_the_port() {
        let insecure: HashSet<String> =
            ["localhost:5000", "plain.example"].map(String::from).into();
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        assert!(listed_insecure(
            &insecure,
            &url("http://LocalHost:5000/token")
        ));
        assert!(listed_insecure(
            &insecure,
            &url("http://plain.example/token")
        ));
        assert!(listed_insecure(
            &insecure,
            &url("http://plain.example:80/token")
        ));
        assert!(!listed_insecure(
            &insecure,
            &url("http://localhost:5001/token")
        ));
        assert!(!listed_insecure(
            &insecure,
            &url("http://plain.example:8080/token")
        ));
    }

    #[test]
    fn error_bodies_give_only_known_codes() {
        let body = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"secret internal detail","detail":{"x":1}},{"code":"DENIED"},{"code":"Injected free text"}]}"#;
        assert_eq!(
            error_codes(body).as_deref(),
            Some("MANIFEST_UNKNOWN, DENIED")
        );
        assert_eq!(error_codes(br#"{"errors":[{"code":"SECRET"}]}"#), None);
        assert_eq!(error_codes(b"<html>secret</html>"), None);
    }

    #[test]
    fn rate_limit_headers_as_docker_hub_sends_them() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, HeaderValue::from_static(value));
            }
            map
        };
        let hub = headers(&[
            ("ratelimit-limit", "100;w=21600"),
            ("ratelimit-remaining", "76;w=21600"),
            ("docker-ratelimit-source", "192.0.2.1"),
        ]);
        assert_eq!(
            rate_limit_of(&hub),
            Some(RateLimit {
                limit: Some(100),
                remaining: Some(76)
            })
        );
        let plain = headers(&[("RateLimit-Remaining", " 0 ")]);
        assert_eq!(
            rate_limit_of(&plain),
            Some(RateLimit {
                limit: None,
                remaining: Some(0)
            })
        );
        assert_eq!(rate_limit_of(&headers(&[])), None);
        let junk = headers(&[("ratelimit-limit", "lots"), ("ratelimit-remaining", "-1")]);
        assert_eq!(rate_limit_of(&junk), None);
    }

    #[test]
    fn basic_header_is_sensitive_and_hidden_from_debug() {
        let value = basic_authorization(&Credential::new("u", "p4ss", "test"));
        assert!(value.is_sensitive());
        assert!(!format!("{value:?}").contains("dTpwNHNz"));
    }
}
