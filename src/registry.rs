//! Image platform resolution: on which platforms can this image run? Answered from the registry's
//! manifests and image configs, never from layers.
//!
//! [`Resolver`] (in `resolver`) is the entry point: it parses the reference, picks the registry
//! host (a mirror first, then the origin), takes a lookup turn (`turns`), asks the host's circuit
//! breaker (`breaker`), tries each credential in order, walks the manifest tree, and caches the
//! answer. The walk itself (`walk`) is generic over `ManifestSource`, the I/O boundary; what one
//! lookup may cost — fetches, turns, registry bytes in flight — is bounded in `bounds`.
//! The breaker and the cache read time from an injected `clock`, so their tests move time by hand.

pub mod access;
mod bounds;
mod breaker;
pub mod cache;
pub mod challenge;
mod children;
pub mod client;
pub mod clock;
pub(crate) mod credentials;
pub mod manifest;
pub(crate) mod reference;
mod resolver;
mod shared;
mod turns;
mod walk;

use std::sync::Arc;
use std::time::Duration;

use self::manifest::ManifestError;

pub use self::breaker::BreakerSettings;
pub use self::credentials::{Credential, CredentialStore};
pub use self::reference::{ImageReference, ReferenceError};
pub use self::resolver::{Resolver, ResolverSettings};
pub use self::shared::SharedCacheSettings;
pub(crate) use self::walk::Checked;
pub use self::walk::ManifestSource;
pub use crate::mutate::facts::{ImageFact, Provenance, Staleness};
pub use crate::mutate::platform::Platform;

/// An index inside an index inside an index is already unusual; deeper is a loop or an attack.
pub const MAX_INDEX_DEPTH: usize = 3;
/// Most manifests one index may list (real multi-platform images list a few dozen, with their
/// attestations); a longer one is refused rather than walked.
pub(crate) const MAX_INDEX_ENTRIES: usize = 512;
/// Most distinct platforms one image may report (answers, annotations and logs stay small).
pub(crate) const MAX_PLATFORMS: usize = 64;
/// Registry lookups in flight at once, in all and per registry host: a Pod naming thousands of
/// images (or many such Pods) cannot open thousands of connections. Lookups beyond wait their
/// turn within their own deadline.
pub(crate) const MAX_LOOKUPS_IN_FLIGHT: usize = 64;
pub(crate) const MAX_LOOKUPS_PER_HOST: usize = 16;
/// Hosts remembered at most by the lookup turns and the breakers (images can name any host;
/// failures must not grow memory forever).
const MAX_TRACKED_HOSTS: usize = 1024;

/// What the registry said about one image: where the answer came from, and the decision
/// core's [`ImageFact`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagePlatforms {
    /// Digest of the top-level manifest or index.
    pub digest: String,
    /// One of the manifest types in [`manifest::ACCEPT`] (or schema 1).
    pub media_type: &'static str,
    /// The host that answered (a mirror or the origin's API host).
    pub served_by: String,
    /// What the decision reads; shared, so handing it to an admission copies nothing.
    pub fact: Arc<ImageFact>,
}

impl ImagePlatforms {
    /// This answer served again, `age` after the registry gave it, because a refresh failed with
    /// `error`.
    pub(crate) fn as_stale(&self, error: &LookupError, age: Duration) -> Self {
        Self {
            fact: Arc::new(ImageFact {
                stale: Some(Staleness {
                    cause: error.reason(),
                    age,
                }),
                ..(*self.fact).clone()
            }),
            ..self.clone()
        }
    }
}

/// `4s` or `1520ms`: a budget as a person reads it (budgets are derived from deadlines, so
/// `{:?}` would print `1.519993898s`).
pub(crate) fn short_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Why an image's platforms could not be determined. Each message names the image and is safe
/// to show to a user: no credential, token or header ever goes into one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    #[error(transparent)]
    InvalidReference(#[from] ReferenceError),
    #[error("{reference}: not found in the registry (no such repository, tag or digest)")]
    NotFound { reference: String },
    #[error("{reference}: the registry refused access (tried: {tried})")]
    Unauthorized { reference: String, tried: String },
    #[error("{reference}: not a container image (media type {media_type})")]
    NotAnImage {
        reference: String,
        media_type: String,
    },
    #[error("{reference}: {reason}")]
    Malformed { reference: String, reason: String },
    #[error("{reference}: the image index lists no runnable platform")]
    NoPlatforms { reference: String },
    #[error("{reference}: lookup did not finish within {}", short_duration(*.after))]
    Timeout { reference: String, after: Duration },
    /// tolerable's own bound on lookups in flight kept this one waiting until its deadline: not
    /// the registry's fault, so its circuit breaker does not count it and nothing is cached.
    #[error("{reference}: not looked up within {}: too many lookups in flight", short_duration(*.after))]
    Throttled { reference: String, after: Duration },
    /// The access rules (`registry_allowlist`, `registry_denylist`, the link-local addresses,
    /// `insecure_registries` for plain http) forbid a host the lookup needed.
    #[error("{reference}: {reason}")]
    NotAllowed { reference: String, reason: String },
    /// No connection: refused, not TLS, a bad certificate and a timeout read the same (`reason`
    /// says only which step: the registry or its token service); the debug log has the detail.
    #[error("{reference}: registry {registry} unreachable: {reason}")]
    Unreachable {
        reference: String,
        registry: String,
        reason: String,
        /// Why, for an operator at a terminal: never in the message (see [`LookupError::cause`]).
        cause: String,
    },
    #[error("{reference}: registry answered HTTP {status}: {message}")]
    Registry {
        reference: String,
        status: u16,
        message: String,
        /// A 429's `Retry-After`, for the circuit breaker.
        retry_after: Option<Duration>,
    },
    /// The image is more than one lookup may cost (manifests and blobs to read, bytes in flight
    /// at once): the image's own doing, so its registry's circuit breaker does not count it.
    #[error("{reference}: too costly to look up: {limit} (tolerable's bound for one image)")]
    OverLimit { reference: String, limit: String },
    /// The lookup waited for room in the registry bytes in flight (the process budget, its
    /// registry's or its namespace's share, spent by other lookups) until its deadline:
    /// tolerable's own bound, like `Throttled` — not counted by the breaker, not cached.
    #[error("{reference}: not looked up: too many registry bytes in flight")]
    Busy { reference: String },
    /// The registry answered a manifest or blob request (status and headers) and then sent
    /// its body too slowly to finish in time: the image's own content, so its registry's
    /// circuit breaker does not count it (five such images must not switch the registry off
    /// for every other tenant); a registry that does not answer at all still counts.
    #[error("{reference}: the registry's answer for {what} stalled")]
    Stalled { reference: String, what: String },
    /// The circuit breaker: the registry failed repeatedly (or asked us to back off), so it is
    /// left alone for a while instead of being hammered.
    #[error("{reference}: not asking registry {registry} again for {retry_in_secs}s (last failure: {cause})")]
    CircuitOpen {
        reference: String,
        registry: String,
        retry_in_secs: u64,
        cause: String,
    },
}

/// The core's view of a failed lookup: its kind, and the reason without the image in front.
impl From<&LookupError> for crate::mutate::LookupFailure {
    fn from(error: &LookupError) -> Self {
        use crate::mutate::LookupFailure as Failure;
        let reason = error.reason();
        match error {
            LookupError::InvalidReference(_) => Failure::InvalidReference(reason),
            LookupError::NotFound { .. } => Failure::NotFound(reason),
            LookupError::Unauthorized { .. } => Failure::Unauthorized(reason),
            LookupError::NotAnImage { .. }
            | LookupError::Malformed { .. }
            | LookupError::NoPlatforms { .. } => Failure::NotAnImage(reason),
            LookupError::NotAllowed { .. } => Failure::NotAllowed(reason),
            LookupError::OverLimit { .. } | LookupError::Stalled { .. } => {
                Failure::OverLimit(reason)
            }
            LookupError::Timeout { .. }
            | LookupError::Throttled { .. }
            | LookupError::Busy { .. }
            | LookupError::Unreachable { .. }
            | LookupError::Registry { .. }
            | LookupError::CircuitOpen { .. } => Failure::Unavailable(reason),
        }
    }
}

impl LookupError {
    /// The message without the image reference in front, for callers that name the image
    /// themselves.
    pub fn reason(&self) -> String {
        let text = self.to_string();
        let prefix = match self {
            Self::InvalidReference(_) => return text,
            Self::NotFound { reference }
            | Self::Unauthorized { reference, .. }
            | Self::NotAnImage { reference, .. }
            | Self::Malformed { reference, .. }
            | Self::NoPlatforms { reference }
            | Self::Timeout { reference, .. }
            | Self::Throttled { reference, .. }
            | Self::NotAllowed { reference, .. }
            | Self::OverLimit { reference, .. }
            | Self::Stalled { reference, .. }
            | Self::Busy { reference }
            | Self::Unreachable { reference, .. }
            | Self::Registry { reference, .. }
            | Self::CircuitOpen { reference, .. } => format!("{reference}: "),
        };
        text.strip_prefix(&prefix)
            .map_or(text.clone(), str::to_owned)
    }

    /// Why the registry could not be reached — "dns error: failed to lookup address
    /// information: Name or service not known", "tcp connect error: Connection refused (os error
    /// 111)", "invalid peer certificate: UnknownIssuer" — for `inspect` and `review` to print
    /// beside the message. The transport's chain of causes only: never a URL, credential,
    /// header or remote body. Never in the webhook's warnings or annotations, which keep the
    /// terse message: a Pod author must not use tolerable as a port scanner.
    pub fn cause(&self) -> Option<&str> {
        match self {
            Self::Unreachable { cause, .. } if !cause.is_empty() => Some(cause),
            _ => None,
        }
    }

    /// Whether the registry was unavailable (down, hung, overloaded, rate limiting) rather than
    /// answering: only then may a last known answer stand in, and only then does the circuit
    /// breaker count it.
    pub(crate) fn is_unavailable(&self) -> bool {
        match self {
            Self::Timeout { .. }
            | Self::Throttled { .. }
            | Self::Busy { .. }
            | Self::Unreachable { .. }
            | Self::CircuitOpen { .. } => true,
            Self::Registry { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }

    /// A bounded label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::InvalidReference(_) => "invalid_reference",
            Self::NotFound { .. } => "not_found",
            Self::Unauthorized { .. } => "unauthorized",
            Self::NotAnImage { .. } => "not_an_image",
            Self::Malformed { .. } => "malformed",
            Self::NoPlatforms { .. } => "no_platforms",
            Self::Timeout { .. } => "timeout",
            Self::Throttled { .. } => "throttled",
            Self::NotAllowed { .. } => "not_allowed",
            Self::OverLimit { .. } => "over_limit",
            Self::Busy { .. } => "busy",
            Self::Stalled { .. } => "stalled",
            Self::Unreachable { .. } => "unreachable",
            Self::Registry { .. } => "registry_error",
            Self::CircuitOpen { .. } => "circuit_open",
        }
    }
}

/// What went wrong talking to one registry host, before it is tied to an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchError {
    NotFound,
    Unauthorized,
    TooLarge,
    Malformed(String),
    Manifest(ManifestError),
    TooDeep,
    /// An index listing more than `MAX_INDEX_ENTRIES` (512) manifests, or an image with more than
    /// `MAX_PLATFORMS` (64) platforms.
    TooMany(&'static str),
    Status {
        code: u16,
        message: String,
    },
    /// HTTP 429, with the registry's `Retry-After` when it sent one in seconds.
    RateLimited {
        retry_after: Option<Duration>,
    },
    /// A host the access rules forbid (or a redirect or realm that would reach one).
    NotAllowed(String),
    /// The lookup reached one of its own bounds (`bounds`): which one.
    OverLimit(String),
    /// The process-wide budget of registry bytes in flight is spent.
    Busy,
    /// The body of a manifest or blob (named) stalled after the registry's 200.
    Stalled(String),
    /// No answer: `reason` is safe to show anywhere (it never says why the connection
    /// failed); `cause` says why, for an operator's terminal only (see [`LookupError::cause`]).
    Transport {
        reason: String,
        cause: String,
    },
}

impl FetchError {
    fn into_lookup(self, reference: &str, host: &str, tried: &str) -> LookupError {
        let reference = reference.to_owned();
        match self {
            Self::NotFound => LookupError::NotFound { reference },
            Self::Unauthorized => LookupError::Unauthorized {
                reference,
                tried: tried.to_owned(),
            },
            Self::TooLarge => LookupError::Malformed {
                reference,
                reason: "manifest or config larger than 4 MiB".into(),
            },
            Self::Malformed(reason) => LookupError::Malformed { reference, reason },
            Self::Manifest(
                ManifestError::NotAnImage { media_type }
                | ManifestError::UnknownType { media_type },
            ) => LookupError::NotAnImage {
                reference,
                media_type,
            },
            Self::Manifest(e) => LookupError::Malformed {
                reference,
                reason: e.to_string(),
            },
            Self::TooDeep => LookupError::Malformed {
                reference,
                reason: format!("image indexes nested deeper than {MAX_INDEX_DEPTH}"),
            },
            Self::TooMany(what) => LookupError::Malformed {
                reference,
                reason: what.to_owned(),
            },
            Self::Status { code, message } => LookupError::Registry {
                reference,
                status: code,
                message,
                retry_after: None,
            },
            Self::RateLimited { retry_after } => LookupError::Registry {
                reference,
                status: 429,
                message: match retry_after {
                    Some(after) => format!("rate limited (Retry-After: {}s)", after.as_secs()),
                    None => "rate limited".into(),
                },
                retry_after,
            },
            Self::NotAllowed(reason) => LookupError::NotAllowed { reference, reason },
            Self::OverLimit(limit) => LookupError::OverLimit { reference, limit },
            Self::Busy => LookupError::Busy { reference },
            Self::Stalled(what) => LookupError::Stalled { reference, what },
            Self::Transport { reason, cause } => LookupError::Unreachable {
                reference,
                registry: host.to_owned(),
                reason,
                cause,
            },
        }
    }
}

/// The HTTP method of a registry request: a manifest GET counts against Docker Hub's pull rate
/// limit, a HEAD does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum RequestMethod {
    Get,
    Head,
}

impl RequestMethod {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Head => "HEAD",
        }
    }
}

/// What a registry said of its rate limit (Docker Hub's `ratelimit-limit` and
/// `ratelimit-remaining`, e.g. `100;w=21600`): requests per window, and those left.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RateLimit {
    pub(crate) limit: Option<u64>,
    pub(crate) remaining: Option<u64>,
}

/// What revalidating a tag's answer with a HEAD found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Revalidation {
    /// The same digest: the answer renewed, no GET.
    Unchanged,
    /// The tag moved to a digest whose answer was known: no GET.
    KnownDigest,
    /// The tag moved to a new digest: its manifest was fetched.
    Changed,
    /// The registry named no digest: the tag was fetched with a GET (and is from now on).
    NoDigest,
}

impl Revalidation {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Unchanged => "unchanged",
            Self::KnownDigest => "known_digest",
            Self::Changed => "changed",
            Self::NoDigest => "no_digest",
        }
    }
}

/// Told about every registry request and cache lookup (metrics implement it).
pub(crate) trait RegistryObserver: Send + Sync {
    /// `status` is `None` when no HTTP answer came (connect error, timeout).
    fn registry_request(&self, host: &str, method: RequestMethod, status: Option<u16>);
    /// `host` answered with rate-limit headers.
    fn rate_limit(&self, _host: &str, _limit: RateLimit) {}
    fn cache_lookup(&self, hit: bool);
    /// The circuit breaker stopped asking `host` (it failed repeatedly or asked to back off).
    fn circuit_opened(&self, _host: &str) {}
    /// A last known answer was served because its registry is unavailable.
    fn stale_answer(&self) {}
    /// A tag's answer was revalidated with a HEAD.
    fn revalidated(&self, _outcome: Revalidation) {}
    /// The shared cache was asked for a lookup: `hit`, `miss`, `error` (it failed or took too
    /// long) or `skipped` (it failed a moment ago, and is left alone for a while).
    fn shared_cache_lookup(&self, _result: &'static str) {}
    /// A registry's answer was written to the shared cache: `ok`, `error` or `skipped`.
    fn shared_cache_write(&self, _result: &'static str) {}
    /// Registry bytes in flight rose (or, negative, fell) by `change`.
    fn registry_bytes(&self, _change: i64) {}
    /// A lookup's answer from `host` waited for room in the registry bytes: `room` (it got
    /// some) or `deadline` (its lookup ended first).
    fn registry_bytes_wait(&self, _host: &str, _result: &'static str) {}
    /// Whether the shared cache answered the last request.
    fn shared_cache_up(&self, _up: bool) {}
    /// A credential plugin ran: `result` is `ok`, `failed` (non-zero exit), `invalid_response`,
    /// `timeout`, `not_started`, or a helper's `none` (it holds no credential).
    fn credential_plugin_run(&self, _plugin: &str, _result: &'static str, _elapsed: Duration) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutate::LookupFailure;

    /// The core learns the kind of a failure and a reason without the image in front (it
    /// names the image itself).
    #[test]
    fn lookup_errors_reach_the_core_by_kind() {
        let reference = "r.example/app:1".to_owned();
        let cases = [
            (
                LookupError::NotFound {
                    reference: reference.clone(),
                },
                "NotFound",
            ),
            (
                LookupError::Unauthorized {
                    reference: reference.clone(),
                    tried: "anonymous".into(),
                },
                "Unauthorized",
            ),
            (
                LookupError::Timeout {
                    reference: reference.clone(),
                    after: Duration::from_secs(1),
                },
                "Unavailable",
            ),
            (
                LookupError::NoPlatforms {
                    reference: reference.clone(),
                },
                "NotAnImage",
            ),
        ];
        for (error, kind) in cases {
            let failure = LookupFailure::from(&error);
            assert!(format!("{failure:?}").starts_with(kind), "{failure:?}");
            assert!(!failure.reason().contains(&reference), "{failure}");
            assert_eq!(failure.reason(), error.reason());
        }
    }
}
