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

use super::challenge::{self, Challenge};
use super::credentials::Credential;
use super::manifest::ACCEPT as MANIFEST_TYPES;
use super::{FetchError, ManifestSource, RegistryObserver};

/// Manifests are small; the OCI distribution spec asks registries to accept up to 4 MiB.
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// Image configs are a few KiB.
pub const MAX_CONFIG_BYTES: usize = 4 << 20;
/// Token lifetime when the token service does not say (the Docker token spec's default).
const DEFAULT_TOKEN_SECONDS: u64 = 60;

/// Transport settings shared by every request.
#[derive(Clone, Debug)]
pub struct TransportSettings {
    pub connect_timeout: Duration,
    /// Longest wait for any read; the lookup deadline bounds the whole lookup on top.
    pub read_timeout: Duration,
    /// `host:port` of registries (and token services) spoken to over plain http.
    pub insecure_registries: Vec<String>,
    /// Extra trusted roots (PEM bundles), on top of the system's.
    pub extra_roots_pem: Vec<Vec<u8>>,
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

pub struct RegistryClient {
    http: reqwest::Client,
    insecure: HashSet<String>,
    authorizations: Mutex<HashMap<AuthorizationKey, CachedAuthorization>>,
    hasher: RandomState,
    observer: Option<Arc<dyn RegistryObserver>>,
}

impl RegistryClient {
    pub fn set_observer(&mut self, observer: Arc<dyn RegistryObserver>) {
        self.observer = Some(observer);
    }

    fn observe(&self, host: &str, status: Option<u16>) {
        if let Some(observer) = &self.observer {
            observer.registry_request(host, status);
        }
    }

    pub fn new(settings: &TransportSettings) -> Result<Self, FetchError> {
        let mut roots = Vec::new();
        for pem in &settings.extra_roots_pem {
            roots.extend(
                reqwest::Certificate::from_pem_bundle(pem)
                    .map_err(|e| FetchError::Transport(format!("bad registry CA bundle: {e}")))?,
            );
        }
        let http = reqwest::Client::builder()
            .connect_timeout(settings.connect_timeout)
            .read_timeout(settings.read_timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .user_agent(concat!("tolerable/", env!("CARGO_PKG_VERSION")))
            .tls_certs_merge(roots)
            .build()
            .map_err(|e| {
                FetchError::Transport(format!(
                    "cannot build the registry client: {}",
                    error_chain(&e)
                ))
            })?;
        Ok(Self {
            http,
            insecure: settings.insecure_registries.iter().cloned().collect(),
            authorizations: Mutex::default(),
            hasher: RandomState::new(),
            observer: None,
        })
    }

    /// A fingerprint of a credential, for cache keys (process-local, not reversible).
    pub fn fingerprint(&self, credential: &Credential) -> u64 {
        credential.fingerprint(&self.hasher)
    }

    /// Requests to `host` (an API host such as `registry-1.docker.io`) with `credential`.
    pub fn source<'a>(&'a self, host: &str, credential: Option<&'a Credential>) -> HostSource<'a> {
        HostSource {
            client: self,
            host: host.to_owned(),
            fingerprint: credential.map(|c| self.fingerprint(c)),
            credential,
        }
    }

    fn scheme_for(&self, host_port: &str) -> &'static str {
        if self.insecure.contains(host_port) {
            "http"
        } else {
            "https"
        }
    }
}

/// One registry host, one credential (or none).
pub struct HostSource<'a> {
    client: &'a RegistryClient,
    host: String,
    credential: Option<&'a Credential>,
    fingerprint: Option<u64>,
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

    /// GET `/v2/<repository>/<kind>/<reference>`, answering one auth challenge if needed.
    async fn get(
        &self,
        repository: &str,
        kind: &str,
        reference: &str,
        accept: Option<&str>,
        max_bytes: usize,
    ) -> Result<(Bytes, HeaderMap), FetchError> {
        let url = format!(
            "{}://{}/v2/{repository}/{kind}/{reference}",
            self.client.scheme_for(&self.host),
            self.host
        );
        let cached = self.cached_authorization(repository);
        let had_cached = cached.is_some();
        let mut response = self.send(&url, accept, cached).await?;
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
            response = self.send(&url, accept, Some(authorization)).await?;
        }
        let status = response.status();
        if status != StatusCode::OK {
            return Err(status_error(status, response).await);
        }
        let headers = response.headers().clone();
        let body = read_capped(response, max_bytes).await?;
        Ok((body, headers))
    }

    async fn send(
        &self,
        url: &str,
        accept: Option<&str>,
        authorization: Option<HeaderValue>,
    ) -> Result<reqwest::Response, FetchError> {
        let mut request = self.client.http.get(url);
        if let Some(accept) = accept {
            request = request.header(ACCEPT, accept);
        }
        if let Some(authorization) = authorization {
            request = request.header(AUTHORIZATION, authorization);
        }
        let started = Instant::now();
        let result = request.send().await;
        self.client.observe(
            &self.host,
            result.as_ref().ok().map(|r| r.status().as_u16()),
        );
        match &result {
            Ok(response) => tracing::debug!(
                host = %self.host, status = response.status().as_u16(), elapsed_us = started.elapsed().as_micros() as u64,
                "registry request"
            ),
            Err(e) => {
                tracing::debug!(host = %self.host, error = %transport_reason(e), "registry request failed")
            }
        }
        result.map_err(|e| FetchError::Transport(transport_reason(&e)))
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
        if realm_url.scheme() != "https"
            && self.credential.is_some()
            && !self.client.insecure.contains(&realm_host)
        {
            return Err(FetchError::Transport(format!(
                "refusing to send credentials to the plain-http token service {realm_host} (list it in insecure_registries to allow)"
            )));
        }
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
        self.client.observe(
            &realm_host,
            response.as_ref().ok().map(|r| r.status().as_u16()),
        );
        let response = response.map_err(|e| {
            FetchError::Transport(format!(
                "token service {realm_host}: {}",
                transport_reason(&e)
            ))
        })?;
        match response.status() {
            StatusCode::OK => {}
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                return Err(FetchError::Unauthorized)
            }
            status => {
                let mut e = status_error(status, response).await;
                if let FetchError::Status { message, .. } = &mut e {
                    *message = format!("token service: {message}");
                }
                return Err(e);
            }
        }
        let body = read_capped(response, 1 << 20).await?;
        parse_token_response(&body)
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
    let seconds = response.expires_in.unwrap_or(DEFAULT_TOKEN_SECONDS).max(1);
    Ok((value, Duration::from_millis(seconds * 900)))
}

async fn read_capped(
    mut response: reqwest::Response,
    max_bytes: usize,
) -> Result<Bytes, FetchError> {
    if response
        .content_length()
        .is_some_and(|n| n > max_bytes as u64)
    {
        return Err(FetchError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| FetchError::Transport(transport_reason(&e)))?
    {
        if body.len() + chunk.len() > max_bytes {
            return Err(FetchError::TooLarge);
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
    #[serde(default)]
    message: String,
}

async fn status_error(status: StatusCode, response: reqwest::Response) -> FetchError {
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
    let body = read_capped(response, 64 << 10).await.unwrap_or_default();
    let message = match serde_json::from_slice::<ErrorEnvelope>(&body) {
        Ok(envelope) if !envelope.errors.is_empty() => envelope
            .errors
            .iter()
            .map(|e| format!("{}: {}", e.code, e.message))
            .collect::<Vec<_>>()
            .join("; "),
        _ => String::from_utf8_lossy(&body).trim().to_owned(),
    };
    // One line, bounded: this ends up in logs and admission warnings.
    let message: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(200)
        .collect();
    FetchError::Status {
        code: status.as_u16(),
        message: if message.is_empty() {
            status.canonical_reason().unwrap_or("").to_owned()
        } else {
            message
        },
    }
}

/// `Retry-After` in delta-seconds (what registries send; an HTTP-date is not believed, and the
/// breaker's own cooldown applies instead).
fn retry_after_seconds(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

pub fn sha256_digest(body: &[u8]) -> String {
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
                "unsupported digest {expected:?}"
            )))
        }
    };
    if actual == expected {
        Ok(())
    } else {
        Err(FetchError::Malformed(format!(
            "content does not match its digest (expected {expected}, got {actual})"
        )))
    }
}

/// Why a request failed, short enough for an admission warning: what failed (connect, timeout,
/// body) and the root cause, without reqwest's "error sending request for url (…)" preamble (the
/// host is named by the caller).
pub(crate) fn transport_reason(e: &reqwest::Error) -> String {
    let mut root: &dyn std::error::Error = e;
    while let Some(source) = root.source() {
        root = source;
    }
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connect failed"
    } else if e.is_body() || e.is_decode() {
        "reading the answer failed"
    } else {
        "request failed"
    };
    if std::ptr::addr_eq(root, e as &dyn std::error::Error) {
        return format!("{what}: {e}");
    }
    format!("{what}: {root}")
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
        let sha512 = hex_digest(
            "sha512",
            ring::digest::digest(&ring::digest::SHA512, b"x").as_ref(),
        );
        verify_digest(&sha512, b"x").unwrap();
    }

    #[test]
    fn basic_header_is_sensitive_and_hidden_from_debug() {
        let value = basic_authorization(&Credential::new("u", "p4ss", "test"));
        assert!(value.is_sensitive());
        assert!(!format!("{value:?}").contains("dTpwNHNz"));
    }
}
