//! Image platform resolution: on which platforms can this image run? Answered from the registry's
//! manifests and image configs, never from layers.
//!
//! [`Resolver`] is the entry point: it parses the reference, picks the registry host (a mirror
//! first, then the origin), tries each credential in order, walks the manifest tree, and caches
//! the answer. The walk itself ([`walk`]) is generic over [`ManifestSource`], the I/O boundary.

pub mod access;
pub mod cache;
pub mod challenge;
pub mod client;
pub mod credentials;
pub mod manifest;
pub mod reference;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{StreamExt as _, TryStreamExt as _};

use self::cache::{CacheKey, CacheSettings, LookupCache};
use self::client::{RegistryClient, TransportSettings};
pub use self::credentials::{Credential, CredentialStore};
use self::manifest::{ManifestError, ParsedManifest};
pub use self::reference::{ImageReference, ReferenceError};
pub use crate::mutate::facts::{ImageFact, Provenance, Staleness};
pub use crate::mutate::platform::Platform;

/// An index inside an index inside an index is already unusual; deeper is a loop or an attack.
pub const MAX_INDEX_DEPTH: usize = 3;
/// Most manifests one index may list (real multi-platform images list a few dozen, with their
/// attestations); a longer one is refused rather than walked.
pub const MAX_INDEX_ENTRIES: usize = 512;
/// Most distinct platforms one image may report (answers, annotations and logs stay small).
pub const MAX_PLATFORMS: usize = 64;
/// Child manifests of one index fetched at the same time.
const CHILD_FETCHES: usize = 4;
/// Registry lookups in flight at once, in all and per registry host: a Pod naming thousands of
/// images (or many such Pods) cannot open thousands of connections. Lookups beyond wait their
/// turn within their own deadline.
pub const MAX_LOOKUPS_IN_FLIGHT: usize = 64;
pub const MAX_LOOKUPS_PER_HOST: usize = 16;

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
    pub fn as_stale(&self, error: &LookupError, age: Duration) -> Self {
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
pub fn short_duration(d: Duration) -> String {
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
    },
    #[error("{reference}: registry answered HTTP {status}: {message}")]
    Registry {
        reference: String,
        status: u16,
        message: String,
        /// A 429's `Retry-After`, for the circuit breaker.
        retry_after: Option<Duration>,
    },
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
            | Self::Unreachable { reference, .. }
            | Self::Registry { reference, .. }
            | Self::CircuitOpen { reference, .. } => format!("{reference}: "),
        };
        text.strip_prefix(&prefix)
            .map_or(text.clone(), str::to_owned)
    }

    /// Whether the registry was unavailable (down, hung, overloaded, rate limiting) rather than
    /// answering: only then may a last known answer stand in, and only then does the circuit
    /// breaker count it.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Timeout { .. }
            | Self::Throttled { .. }
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
    /// An index listing more than [`MAX_INDEX_ENTRIES`] manifests, or an image with more than
    /// [`MAX_PLATFORMS`] platforms.
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
    /// No answer; the text is safe to show (it never says why the connection failed).
    Transport(String),
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
            Self::Transport(reason) => LookupError::Unreachable {
                reference,
                registry: host.to_owned(),
                reason,
            },
        }
    }
}

/// Told about every registry request and cache lookup (metrics implement it).
pub trait RegistryObserver: Send + Sync {
    /// `status` is `None` when no HTTP answer came (connect error, timeout).
    fn registry_request(&self, host: &str, status: Option<u16>);
    fn cache_lookup(&self, hit: bool);
    /// The circuit breaker stopped asking `host` (it failed repeatedly or asked to back off).
    fn circuit_opened(&self, _host: &str) {}
    /// A last known answer was served because its registry is unavailable.
    fn stale_answer(&self) {}
}

/// The I/O boundary: one registry host with one credential.
pub trait ManifestSource: Sync {
    /// The manifest body and its digest. `reference` is a tag or a digest.
    fn manifest(
        &self,
        repository: &str,
        reference: &str,
    ) -> impl Future<Output = Result<(Bytes, String), FetchError>> + Send;
    fn blob(
        &self,
        repository: &str,
        digest: &str,
    ) -> impl Future<Output = Result<Bytes, FetchError>> + Send;
}

/// The result of walking one manifest tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Walked {
    pub digest: String,
    pub media_type: &'static str,
    pub platforms: Vec<Platform>,
    /// The config media type of a platform-less artifact (then `platforms` is empty).
    pub artifact: Option<String>,
}

/// Walks from `reference` (tag or digest) to the set of platforms. An index answers in one
/// request when its entries carry platforms; entries without one, and single manifests, cost a
/// config blob read each (done concurrently).
pub async fn walk(
    source: &impl ManifestSource,
    repository: &str,
    reference: &str,
) -> Result<Walked, FetchError> {
    let (body, digest) = source.manifest(repository, reference).await?;
    let parsed = match manifest::parse_manifest(&body, None) {
        Ok(parsed) => parsed,
        // A single manifest whose config is not an image config names no platform: an
        // artifact, pulled the same on every node (image volumes carry such).
        Err(ManifestError::NotAnImage { media_type }) => {
            return Ok(Walked {
                digest,
                media_type: manifest::single_manifest_type(&body),
                platforms: Vec::new(),
                artifact: Some(media_type),
            })
        }
        Err(e) => return Err(FetchError::Manifest(e)),
    };
    let media_type = manifest::known_media_type(parsed.media_type());
    let mut platforms = platforms_of(source, repository, parsed, 0).await?;
    platforms.sort();
    platforms.dedup();
    if platforms.len() > MAX_PLATFORMS {
        return Err(FetchError::TooMany(
            "the image names more than 64 platforms",
        ));
    }
    platforms.shrink_to_fit();
    Ok(Walked {
        digest,
        media_type,
        platforms,
        artifact: None,
    })
}

fn platforms_of<'a, S: ManifestSource>(
    source: &'a S,
    repository: &'a str,
    parsed: ParsedManifest,
    depth: usize,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Vec<Platform>, FetchError>> + Send + 'a>> {
    Box::pin(async move {
        match parsed {
            ParsedManifest::Schema1 { platform, .. } => Ok(vec![platform]),
            ParsedManifest::Image { config, .. } => {
                let blob = source.blob(repository, &config.digest).await?;
                Ok(vec![
                    manifest::parse_image_config(&blob).map_err(FetchError::Manifest)?
                ])
            }
            ParsedManifest::Index { entries, .. } => {
                if entries.len() > MAX_INDEX_ENTRIES {
                    return Err(FetchError::TooMany(
                        "the image index lists more than 512 manifests",
                    ));
                }
                let mut known = Vec::new();
                let mut unknown: Vec<String> = Vec::new();
                for entry in entries {
                    match entry.platform {
                        // A nested index's own platform field is not trusted: read it.
                        Some(p) if !entry.is_index() => known.push(p),
                        // Each child once, however often the index lists it.
                        _ if unknown.contains(&entry.descriptor.digest) => {}
                        _ => unknown.push(entry.descriptor.digest),
                    }
                }
                if !unknown.is_empty() && depth >= MAX_INDEX_DEPTH {
                    return Err(FetchError::TooDeep);
                }
                // A few children at a time: an index is a list the registry's owner chose.
                let children: Vec<Vec<Platform>> =
                    futures_util::stream::iter(unknown.into_iter().map(move |digest| async move {
                        let (body, _) = source.manifest(repository, &digest).await?;
                        let child =
                            manifest::parse_manifest(&body, None).map_err(FetchError::Manifest);
                        match child {
                            Ok(child) => platforms_of(source, repository, child, depth + 1).await,
                            // An artifact inside an index (a signature, an SBOM) is not a platform.
                            Err(FetchError::Manifest(
                                ManifestError::NotAnImage { .. }
                                | ManifestError::UnknownType { .. },
                            )) => Ok(Vec::new()),
                            Err(e) => Err(e),
                        }
                    }))
                    .buffered(CHILD_FETCHES)
                    .try_collect()
                    .await?;
                known.extend(children.into_iter().flatten());
                known.retain(|p| !p.is_unknown());
                Ok(known)
            }
        }
    })
}

/// Everything the resolver needs, resolved from config at start-up.
#[derive(Clone, Debug)]
pub struct ResolverSettings {
    pub transport: TransportSettings,
    /// Registry (as images name it) → mirror host to ask first.
    pub mirrors: BTreeMap<String, String>,
    /// The deadline for one lookup, all retries and fallbacks included.
    pub lookup_timeout: Duration,
    pub cache: CacheSettings,
    pub breaker: BreakerSettings,
}

/// Resolves images to platforms: mirrors, credentials, cache.
pub struct Resolver {
    settings: ResolverSettings,
    credentials: CredentialStore,
    client: RegistryClient,
    cache: LookupCache,
    breakers: CircuitBreakers,
    turns: LookupTurns,
    observer: Option<Arc<dyn RegistryObserver>>,
}

impl Resolver {
    /// Fails only if the transport cannot be built (a CA bundle that does not parse).
    pub fn new(
        settings: ResolverSettings,
        credentials: CredentialStore,
    ) -> Result<Self, LookupError> {
        let client = RegistryClient::new(&settings.transport)
            .map_err(|e| e.into_lookup("registry client", "-", ""))?;
        Ok(Self {
            client,
            cache: LookupCache::new(&settings.cache),
            breakers: CircuitBreakers::new(settings.breaker.clone()),
            turns: LookupTurns::default(),
            settings,
            credentials,
            observer: None,
        })
    }

    /// Reports registry requests and cache lookups to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn RegistryObserver>) -> Self {
        self.client.set_observer(observer.clone());
        self.observer = Some(observer);
        self
    }

    /// Platforms of `image`, using the configured credentials.
    pub async fn resolve(&self, image: &str) -> Result<Arc<ImagePlatforms>, LookupError> {
        self.resolve_with(image, &CredentialStore::default()).await
    }

    /// Platforms of `image`, trying the credentials `first` holds for the image's registry (a
    /// Pod's pull secrets), then the configured ones, then anonymous access. A credential is only
    /// ever sent to the registry it is for.
    pub async fn resolve_with(
        &self,
        image: &str,
        first: &CredentialStore,
    ) -> Result<Arc<ImagePlatforms>, LookupError> {
        self.resolve_within(image, first, self.settings.lookup_timeout)
            .await
    }

    /// [`Resolver::resolve_with`] for a caller who can wait only `budget` (an admission whose
    /// API server times out sooner than `lookup_timeout`): a registry lookup then ends by itself
    /// within the budget, so a hung registry is still counted by its circuit breaker rather than
    /// abandoned unnoticed.
    pub async fn resolve_within(
        &self,
        image: &str,
        first: &CredentialStore,
        budget: Duration,
    ) -> Result<Arc<ImagePlatforms>, LookupError> {
        let timeout = budget.min(self.settings.lookup_timeout);
        let reference = ImageReference::parse(image)?;
        let chain: Vec<Credential> = first
            .for_registry(reference.registry())
            .iter()
            .chain(self.credentials.for_registry(reference.registry()))
            .cloned()
            .collect();
        let key = CacheKey::new(
            &reference,
            chain.iter().map(|c| self.client.fingerprint(c)).collect(),
        );
        // The warm path stays small: the registry lookup's future is large (tens of KiB of
        // state for HTTP, TLS and auth), and moving it around costs every admission, hit or miss.
        if let Some(fresh) = self.cache.fresh(&key).await {
            self.observe(true, &fresh);
            return fresh;
        }
        Box::pin(self.resolve_uncached(key, reference, chain, timeout)).await
    }

    /// Counts a lookup's cache outcome, and an answer served from the last known result.
    fn observe(&self, cache_hit: bool, result: &Result<Arc<ImagePlatforms>, LookupError>) {
        if let Some(observer) = &self.observer {
            observer.cache_lookup(cache_hit);
            if result
                .as_ref()
                .is_ok_and(|found| found.fact.stale.is_some())
            {
                observer.stale_answer();
            }
        }
    }

    /// The cache had no fresh answer: ask the registry (once, however many callers wait).
    async fn resolve_uncached(
        &self,
        key: CacheKey,
        reference: ImageReference,
        chain: Vec<Credential>,
        timeout: Duration,
    ) -> Result<Arc<ImagePlatforms>, LookupError> {
        let missed = std::sync::atomic::AtomicBool::new(false);
        let result = self
            .cache
            .get_or_resolve(key, async {
                missed.store(true, std::sync::atomic::Ordering::Relaxed);
                let deadline = tokio::time::Instant::now() + timeout;
                self.lookup(&reference, &chain, deadline, timeout).await
            })
            .await;
        self.observe(!missed.load(std::sync::atomic::Ordering::Relaxed), &result);
        result
    }

    /// Uncached lookup: the mirror (if any) first, then the origin, all before `deadline`.
    async fn lookup(
        &self,
        reference: &ImageReference,
        chain: &[Credential],
        deadline: tokio::time::Instant,
        timeout: Duration,
    ) -> Result<Arc<ImagePlatforms>, LookupError> {
        if let Some(mirror) = self.settings.mirrors.get(reference.registry()) {
            let mirror_chain: Vec<Credential> = self.credentials.for_registry(mirror).to_vec();
            // A hung mirror gets half the time, so the origin still gets its chance.
            let now = tokio::time::Instant::now();
            let mirror_deadline = now + deadline.saturating_duration_since(now) / 2;
            match self
                .lookup_at(
                    reference,
                    mirror,
                    &mirror_chain,
                    mirror_deadline,
                    timeout / 2,
                )
                .await
            {
                Ok(found) => return Ok(found),
                Err(e) => tracing::info!(
                    image = ?reference.to_string(), mirror = ?mirror, error = ?e.to_string(),
                    "mirror failed; asking the origin registry"
                ),
            }
        }
        self.lookup_at(reference, reference.api_host(), chain, deadline, timeout)
            .await
    }

    /// One registry host, through its circuit breaker and within `deadline`.
    async fn lookup_at(
        &self,
        reference: &ImageReference,
        host: &str,
        chain: &[Credential],
        deadline: tokio::time::Instant,
        timeout: Duration,
    ) -> Result<Arc<ImagePlatforms>, LookupError> {
        // Our own bound first: a lookup that never got its turn is no failure of the registry's,
        // and must not take the breaker's half-open probe slot either.
        let Ok(_turn) = tokio::time::timeout_at(deadline, self.turns.take(host)).await else {
            return Err(LookupError::Throttled {
                reference: reference.to_string(),
                after: timeout,
            });
        };
        if let Err(open) = self.breakers.check(host, self.settings.lookup_timeout) {
            return Err(LookupError::CircuitOpen {
                reference: reference.to_string(),
                registry: host.to_owned(),
                retry_in_secs: open.retry_in.as_secs().max(1),
                cause: open.cause,
            });
        }
        let turn_started = tokio::time::Instant::now();
        let attempt =
            tokio::time::timeout_at(deadline, self.try_credentials(reference, host, chain));
        let result = match attempt.await {
            Ok(result) => result,
            // The registry had less than half the budget because this lookup waited its turn
            // behind others: tolerable's own limit cut it short, not the registry.
            Err(_) if deadline.saturating_duration_since(turn_started) < timeout / 2 => {
                return Err(LookupError::Throttled {
                    reference: reference.to_string(),
                    after: timeout,
                });
            }
            Err(_) => Err(LookupError::Timeout {
                reference: reference.to_string(),
                after: timeout,
            }),
        };
        match &result {
            Err(e) if e.is_unavailable() => {
                let retry_after = match e {
                    LookupError::Registry { retry_after, .. } => *retry_after,
                    _ => None,
                };
                if self.breakers.failure(host, &e.reason(), retry_after) {
                    tracing::warn!(registry = ?host, error = ?e.to_string(), "registry unavailable: circuit open, not asking it for a while");
                    if let Some(observer) = &self.observer {
                        observer.circuit_opened(host);
                    }
                }
            }
            // Any answer from the registry, even "not found", shows it is up.
            _ => self.breakers.success(host),
        }
        result
    }

    /// Tries each credential in turn, then anonymous; only an authorization failure moves on.
    async fn try_credentials(
        &self,
        reference: &ImageReference,
        host: &str,
        chain: &[Credential],
    ) -> Result<Arc<ImagePlatforms>, LookupError> {
        let shown = reference.to_string();
        let attempts = chain.iter().map(Some).chain(std::iter::once(None));
        let mut tried = Vec::new();
        for credential in attempts {
            let label = credential
                .map_or("anonymous", Credential::source)
                .to_owned();
            tried.push(label.clone());
            let source = self.client.source(host, credential);
            match walk(
                &source,
                reference.repository(),
                reference.manifest_reference(),
            )
            .await
            {
                Ok(walked) if walked.platforms.is_empty() && walked.artifact.is_none() => {
                    return Err(LookupError::NoPlatforms { reference: shown });
                }
                Ok(walked) => {
                    tracing::debug!(image = ?shown, host = ?host, credential = ?label, digest = ?walked.digest, "resolved");
                    return Ok(Arc::new(ImagePlatforms {
                        digest: walked.digest,
                        media_type: walked.media_type,
                        served_by: host.to_owned(),
                        fact: Arc::new(ImageFact {
                            platforms: walked.platforms,
                            artifact: walked.artifact,
                            credentials: credential.map_or(Provenance::Anonymous, |c| {
                                Provenance::Credential(c.shared_source())
                            }),
                            stale: None,
                        }),
                    }));
                }
                Err(FetchError::Unauthorized) => {
                    tracing::debug!(image = ?shown, host = ?host, credential = ?label, "registry refused this credential");
                }
                Err(e) => return Err(e.into_lookup(&shown, host, &tried.join(", "))),
            }
        }
        Err(FetchError::Unauthorized.into_lookup(&shown, host, &tried.join(", ")))
    }

    /// Entries currently cached (for metrics and tests).
    pub async fn cached_entries(&self) -> u64 {
        self.cache.entry_count().await
    }
}

/// Turns for registry lookups: at most [`MAX_LOOKUPS_IN_FLIGHT`] at once, and
/// [`MAX_LOOKUPS_PER_HOST`] per registry host. Waiters are served first come, first served.
struct LookupTurns {
    all: Arc<tokio::sync::Semaphore>,
    hosts: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

impl Default for LookupTurns {
    fn default() -> Self {
        Self {
            all: Arc::new(tokio::sync::Semaphore::new(MAX_LOOKUPS_IN_FLIGHT)),
            hosts: std::sync::Mutex::default(),
        }
    }
}

/// A lookup's turn: both permits, given back when it ends.
struct Turn {
    _host: tokio::sync::OwnedSemaphorePermit,
    _all: tokio::sync::OwnedSemaphorePermit,
}

impl LookupTurns {
    async fn take(&self, host: &str) -> Turn {
        let per_host = {
            let mut hosts = self.hosts.lock().expect("turns lock poisoned");
            // Images can name any host: forget the idle ones rather than grow.
            if hosts.len() >= MAX_TRACKED_HOSTS && !hosts.contains_key(host) {
                hosts.retain(|_, s| s.available_permits() < MAX_LOOKUPS_PER_HOST);
            }
            hosts
                .entry(host.to_owned())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(MAX_LOOKUPS_PER_HOST)))
                .clone()
        };
        // Host first: a queue for one busy registry does not hold turns others could use.
        let host_permit = per_host
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let all_permit = self
            .all
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        Turn {
            _host: host_permit,
            _all: all_permit,
        }
    }
}

/// When to stop asking a registry host.
#[derive(Clone, Debug)]
pub struct BreakerSettings {
    /// Consecutive "unavailable" failures (connect errors, timeouts, 5xx, 429) that open the
    /// circuit; 0 never opens it (a 429's `Retry-After` is honoured regardless).
    pub failures: u32,
    /// How long an open circuit stays open before the registry is tried again.
    pub cooldown: Duration,
}

/// A `Retry-After` longer than this is not believed (a misconfigured registry must not switch
/// lookups off for a day).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// Per-host circuit breakers. Closed: requests flow, unavailable failures are counted. Open:
/// lookups fail at once (the cache serves last known answers meanwhile). Half-open, after the
/// cooldown: one lookup goes through as a probe while the others still fail fast; its failure
/// re-opens the circuit, its success closes it.
struct CircuitBreakers {
    settings: BreakerSettings,
    hosts: std::sync::Mutex<std::collections::HashMap<String, HostHealth>>,
}

#[derive(Default)]
struct HostHealth {
    consecutive_failures: u32,
    open_until: Option<std::time::Instant>,
    cause: String,
    /// Half-open: when the one request let through after the cooldown went out.
    probe_since: Option<std::time::Instant>,
}

struct Open {
    retry_in: Duration,
    cause: String,
}

/// Hosts remembered at most (images can name any host; failures must not grow memory forever).
const MAX_TRACKED_HOSTS: usize = 1024;

impl CircuitBreakers {
    fn new(settings: BreakerSettings) -> Self {
        Self {
            settings,
            hosts: std::sync::Mutex::default(),
        }
    }

    /// Whether a request may go to `host` now. After the cooldown exactly one request (the
    /// probe) goes; the others keep failing fast until it answers, or until `probe_timeout`
    /// has passed without an answer (a probe abandoned by its caller must not wedge the breaker).
    fn check(&self, host: &str, probe_timeout: Duration) -> Result<(), Open> {
        let mut hosts = self.hosts.lock().expect("breaker lock poisoned");
        let Some(health) = hosts.get_mut(host) else {
            return Ok(());
        };
        let Some(until) = health.open_until else {
            return Ok(());
        };
        let now = std::time::Instant::now();
        if let Some(retry_in) = until.checked_duration_since(now).filter(|d| !d.is_zero()) {
            return Err(Open {
                retry_in,
                cause: health.cause.clone(),
            });
        }
        match health.probe_since {
            Some(since) if now.duration_since(since) < probe_timeout => Err(Open {
                retry_in: probe_timeout.saturating_sub(now.duration_since(since)),
                cause: health.cause.clone(),
            }),
            _ => {
                health.probe_since = Some(now);
                Ok(())
            }
        }
    }

    fn success(&self, host: &str) {
        let mut hosts = self.hosts.lock().expect("breaker lock poisoned");
        if hosts.remove(host).is_some_and(|h| h.open_until.is_some()) {
            tracing::info!(registry = ?host, "registry answers again: circuit closed");
        }
    }

    /// Counts a failure; true when this opened the circuit.
    fn failure(&self, host: &str, cause: &str, retry_after: Option<Duration>) -> bool {
        let now = std::time::Instant::now();
        let mut hosts = self.hosts.lock().expect("breaker lock poisoned");
        if hosts.len() >= MAX_TRACKED_HOSTS && !hosts.contains_key(host) {
            hosts.retain(|_, h| h.open_until.is_some_and(|until| until > now));
            if hosts.len() >= MAX_TRACKED_HOSTS {
                return false;
            }
        }
        let health = hosts.entry(host.to_owned()).or_default();
        health.consecutive_failures = health.consecutive_failures.saturating_add(1);
        health.cause = cause.to_owned();
        let open_for = match retry_after {
            Some(after) => Some(after.min(MAX_RETRY_AFTER)),
            None if self.settings.failures > 0
                && health.consecutive_failures >= self.settings.failures =>
            {
                Some(self.settings.cooldown)
            }
            None => None,
        };
        let Some(open_for) = open_for else {
            return false;
        };
        let was_open = health.open_until.is_some_and(|until| until > now);
        health.open_until = Some(now + open_for);
        health.probe_since = None;
        !was_open
    }
}
