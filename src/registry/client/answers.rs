//! Reading a registry's answers: bodies within the lookup's bounds, error statuses as the
//! spec's codes only, rate-limit headers, and a request that got no answer as a terse
//! failure with its cause beside it.

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use serde::Deserialize;

use super::redirects::RedirectRefused;
use crate::registry::bounds::{LookupBounds, ReadingBody};
use crate::registry::{FetchError, RateLimit};

/// What an admission warning says about any failure to connect: refused, not TLS, a bad
/// certificate and a timed-out handshake look the same, so a Pod author cannot use tolerable as
/// a port scanner. The detail is in the debug log.
pub(super) const CONNECTION_FAILED: &str = "connection failed";

/// Docker Hub's rate-limit headers (`ratelimit-limit: 100;w=21600`, `ratelimit-remaining:
/// 76;w=21600`), as numbers; `None` when the answer carries neither.
pub(super) fn rate_limit_of(headers: &HeaderMap) -> Option<RateLimit> {
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

/// First capacity of a body buffer; it doubles as bytes arrive.
const INITIAL_BODY_CAPACITY: usize = 16 << 10;

/// Reads a body of at most `max_bytes` into one buffer whose every byte of capacity is first
/// reserved from the lookup's `bounds`: a declared length at once (so children that declare
/// more than the lookup's share end it before sending it), an undeclared one as the bytes
/// arrive (waiting for room in `host`'s share, see [`crate::registry::bounds`]). The buffer
/// itself grows as the bytes arrive, so a body that stalls occupies only what it sent. The
/// reservation ends with the read. A `content` body (a manifest or blob being read) that
/// stalls past the read timeout is [`FetchError::Stalled`].
pub(super) async fn read_capped(
    mut response: reqwest::Response,
    max_bytes: usize,
    (bounds, host): (&LookupBounds, &str),
    content: Option<&ReadingBody<'_>>,
) -> Result<Bytes, FetchError> {
    let declared = response.content_length();
    if declared.is_some_and(|n| n > max_bytes as u64) {
        return Err(FetchError::TooLarge);
    }
    // The buffer grows no larger than the declared length (a body longer than it declared is
    // hyper's error), nor than `max_bytes`.
    let ceiling = declared.map_or(max_bytes, |n| (n as usize).min(max_bytes));
    let mut reserved = bounds.reservation(host, content);
    reserved
        .grow_to(ceiling.min(declared.map_or(0, |n| n as usize)))
        .await?;
    let content = content.map(ReadingBody::what);
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
            reserved.grow_to(capacity).await?;
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
pub(super) async fn status_error(
    status: StatusCode,
    response: reqwest::Response,
    bounds: (&LookupBounds, &str),
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

/// A request that got no answer. A redirect the policy refused is said as such; anything else
/// (refused, not TLS, a bad certificate, a timeout) is `public` and nothing more, with the
/// detail beside it as the cause (for `inspect` and `review`, never the webhook's answers) and
/// in the debug log, quoted.
pub(super) fn transport_error(e: &reqwest::Error, host: &str, public: &str) -> FetchError {
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

/// Whether TLS was spoken to a server that answered without it: rustls read the answer's first
/// bytes (`HTTP/1.1 400…`) as a record of no known type. The rustls error sits inside the
/// socket's `io::Error`s (nested: the connector wraps tokio-rustls's), whose `source()` skips
/// what they wrap, so each `io::Error` is opened.
fn answered_without_tls(e: &reqwest::Error) -> bool {
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = source {
        let mut inner: Option<&(dyn std::error::Error + 'static)> = Some(s);
        while let Some(error) = inner {
            if matches!(
                error.downcast_ref::<rustls::Error>(),
                Some(rustls::Error::InvalidMessage(
                    rustls::InvalidMessage::InvalidContentType
                ))
            ) {
                return true;
            }
            inner = error
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .map(|wrapped| wrapped as &(dyn std::error::Error + 'static));
        }
        source = s.source();
    }
    false
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
    if answered_without_tls(e) {
        // rustls's own words ("corrupt message of type InvalidContentType") do not say what
        // happened: the most common cause is a local or in-cluster registry on plain HTTP.
        cause = format!(
            "it answered without TLS (a registry on plain HTTP must be listed in [registry] \
             insecure): {cause}"
        );
    }
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
    use reqwest::header::HeaderValue;

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
}
