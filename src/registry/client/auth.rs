//! A registry's auth, as its challenge asks: Basic with the credential, or a Bearer token from
//! the challenge's token service (a realm the access rules allow, over https), each reused for
//! its life per host, repository and credential.

use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::header::{HeaderValue, AUTHORIZATION};
use reqwest::StatusCode;
use serde::Deserialize;

use super::answers::{read_capped, transport_error};
use super::redirects::listed_insecure;
use super::HostSource;
use crate::registry::challenge::Challenge;
use crate::registry::credentials::Credential;
use crate::registry::{FetchError, RequestMethod};

/// Token lifetime when the token service does not say (the Docker token spec's default).
const DEFAULT_TOKEN_SECONDS: u64 = 60;
/// An `Authorization` value we may reuse, and until when.
pub(super) struct CachedAuthorization {
    value: HeaderValue,
    valid_until: Instant,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct AuthorizationKey {
    host: String,
    repository: String,
    credential: Option<u64>,
}

impl HostSource<'_> {
    fn key(&self, repository: &str) -> AuthorizationKey {
        AuthorizationKey {
            host: self.host.clone(),
            repository: repository.to_owned(),
            credential: self.fingerprint,
        }
    }

    pub(super) fn cached_authorization(&self, repository: &str) -> Option<HeaderValue> {
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

    /// Works out the `Authorization` for a challenge; `None` when we have nothing to offer.
    pub(super) async fn answer(
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
        let body = read_capped(response, 1 << 20, (self.bounds, &self.host), None).await?;
        parse_token_response(&body)
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
    fn basic_header_is_sensitive_and_hidden_from_debug() {
        let value = basic_authorization(&Credential::new("u", "p4ss", "test"));
        assert!(value.is_sensitive());
        assert!(!format!("{value:?}").contains("dTpwNHNz"));
    }
}
