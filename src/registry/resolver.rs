//! The resolver: parses the reference, picks the registry host (a mirror first, then the
//! origin), takes a lookup turn, asks the host's circuit breaker, tries each credential in
//! order, revalidates a tag's last answer with a HEAD or walks the manifest tree, and caches
//! the answer (a tag's also under its digest).

mod revalidate;
mod sources;
mod verify;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use self::revalidate::Fetched;
use self::sources::{shared_keys, Source};
use super::bounds::{LookupBounds, RegistryBytes, REGISTRY_BYTES_BUDGET};
use super::breaker::{BreakerSettings, CircuitBreakers};
use super::cache::{CacheKey, CacheSettings, Learned, LookupCache};
use super::client::{RegistryClient, TransportSettings};
use super::clock::{Clock, SystemClock};
use super::credentials::helper::DockerHelpers;
use super::credentials::plugins::CredentialPlugins;
use super::credentials::provider::Provider;
use super::shared::{Keys, Shared, SharedCache, SharedCacheSettings};
use super::turns::LookupTurns;
use super::{
    Credential, CredentialStore, FetchError, ImageFact, ImagePlatforms, ImageReference,
    LookupError, Provenance, RegistryObserver,
};

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
    /// The shared cache behind the in-memory one (`cache_url`), if any.
    pub shared_cache: Option<SharedCacheSettings>,
}

/// Resolves images to platforms: mirrors, credentials, cache.
pub struct Resolver {
    settings: ResolverSettings,
    credentials: CredentialStore,
    plugins: CredentialPlugins,
    clock: Arc<dyn Clock>,
    client: RegistryClient,
    cache: LookupCache,
    shared: Option<SharedCache>,
    breakers: CircuitBreakers,
    turns: LookupTurns,
    /// Registry bytes in flight, all lookups together; each lookup holds a share.
    registry_bytes: Arc<RegistryBytes>,
    /// Hosts whose HEAD answers name no digest: their tags are revalidated with a GET.
    no_head_digest: Mutex<HashSet<String>>,
    observer: Option<Arc<dyn RegistryObserver>>,
    /// Cache keys of images asked for without a Pod's own credentials.
    known_keys: KnownKeys,
}

/// The cache key of each image asked for without a Pod's own credentials (no pull secrets:
/// most Pods), by the image as the Pod names it. Without them the key is a function of the
/// name alone — the configured credentials and plugins are fixed once lookups start — and
/// computing it (the reference parsed and normalised, the chain of credential sources, their
/// fingerprints) was ~8,000 of a warm admission's ~200,000 instructions (BENCHMARKS.md, session
/// 12); a hit here costs a hash of the name. Bounded: forgotten all at once when full (a Pod
/// author naming ever new images costs only the recomputation, never memory).
#[derive(Default)]
struct KnownKeys(Mutex<std::collections::HashMap<Box<str>, Arc<CacheKey>>>);

impl KnownKeys {
    const MAX: usize = 4096;

    fn get(&self, image: &str) -> Option<Arc<CacheKey>> {
        let keys = self.0.lock().unwrap_or_else(|e| e.into_inner());
        keys.get(image).cloned()
    }

    fn insert(&self, image: &str, key: &CacheKey) {
        let mut keys = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if keys.len() >= Self::MAX {
            keys.clear();
        }
        keys.insert(image.into(), Arc::new(key.clone()));
    }
}

/// One image as asked for: the reference, the credentials to try in order, and their
/// fingerprints (the identity every cache key of the lookup carries).
struct Asked {
    reference: ImageReference,
    chain: Vec<Source>,
    identity: Vec<u64>,
    /// Its keys in the shared cache, when there is one.
    shared_keys: Option<Keys>,
    /// What asking the registry may cost, over every host and credential tried.
    bounds: LookupBounds,
}

impl Asked {
    /// Where the answer for `digest` of the same repository is kept.
    fn digest_key(&self, digest: &str) -> CacheKey {
        CacheKey::new(&self.reference.with_digest(digest), self.identity.clone())
    }
}

/// The time a lookup has: its deadline, and the timeout it was derived from (for messages).
#[derive(Clone, Copy)]
struct LookupDeadline {
    deadline: Instant,
    timeout: Duration,
}

impl Resolver {
    /// Fails only if the transport cannot be built (a CA bundle that does not parse).
    pub fn new(
        settings: ResolverSettings,
        credentials: CredentialStore,
    ) -> Result<Self, LookupError> {
        let client = RegistryClient::new(&settings.transport)
            .map_err(|e| e.into_lookup("registry client", "-", ""))?;
        // One clock for the cache and the breakers, so their notions of "now" agree.
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let shared = match &settings.shared_cache {
            Some(shared) => Some(SharedCache::new(shared.clone(), clock.clone()).map_err(
                |reason| {
                    let cause = String::new();
                    FetchError::Transport { reason, cause }.into_lookup("shared cache", "-", "")
                },
            )?),
            None => None,
        };
        Ok(Self {
            client,
            shared,
            cache: LookupCache::with_clock(&settings.cache, clock.clone()),
            breakers: CircuitBreakers::new(settings.breaker.clone(), clock.clone()),
            plugins: CredentialPlugins::new(
                Vec::new(),
                DockerHelpers::default(),
                settings.cache.failure_ttl,
                clock.clone(),
            ),
            clock,
            turns: LookupTurns::default(),
            registry_bytes: Arc::new(RegistryBytes::new(REGISTRY_BYTES_BUDGET, None)),
            no_head_digest: Mutex::default(),
            settings,
            credentials,
            observer: None,
            known_keys: KnownKeys::default(),
        })
    }

    /// Asks these kubelet credential provider plugins for the images they match (after a Pod's
    /// pull secrets, before the configured credentials), and the Docker config's credential
    /// helpers for their registries (after the configured credentials).
    pub(crate) fn with_credential_plugins(
        mut self,
        providers: Vec<Provider>,
        helpers: DockerHelpers,
    ) -> Self {
        self.plugins = CredentialPlugins::new(
            providers,
            helpers,
            self.settings.cache.failure_ttl,
            self.clock.clone(),
        );
        self
    }

    /// Reports registry requests and cache lookups to `observer`.
    pub(crate) fn with_observer(mut self, observer: Arc<dyn RegistryObserver>) -> Self {
        self.client.set_observer(observer.clone());
        if let Some(shared) = &mut self.shared {
            shared.set_observer(observer.clone());
        }
        // Built before any lookup, so nothing is held yet.
        self.registry_bytes = Arc::new(RegistryBytes::new(
            REGISTRY_BYTES_BUDGET,
            Some(observer.clone()),
        ));
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
        self.resolve_within(image, first, self.settings.lookup_timeout, None)
            .await
    }

    /// [`Resolver::resolve_with`] for a caller who can wait only `budget` (an admission whose
    /// API server times out sooner than `lookup_timeout`): a registry lookup then ends by itself
    /// within the budget, so a hung registry is still counted by its circuit breaker rather than
    /// abandoned unnoticed. `namespace`: the Pod's, whose share of the registry bytes its
    /// lookups hold (see [`super::bounds`]).
    pub(crate) async fn resolve_within(
        &self,
        image: &str,
        first: &CredentialStore,
        budget: Duration,
        namespace: Option<&str>,
    ) -> Result<Arc<ImagePlatforms>, LookupError> {
        let timeout = budget.min(self.settings.lookup_timeout);
        // The warm path stays small: the registry lookup's future is large (tens of KiB of
        // state for HTTP, TLS and auth), and moving it around costs every admission, hit or miss.
        let without_pod_credentials = first.is_empty();
        if let Some(key) = without_pod_credentials
            .then(|| self.known_keys.get(image))
            .flatten()
        {
            if let Some(fresh) = self.cache.fresh(&key).await {
                self.observe(true, &fresh);
                return fresh;
            }
        }
        let reference = ImageReference::parse(image)?;
        let chain = self.chain(&reference, first);
        let key = CacheKey::new(
            &reference,
            chain
                .iter()
                .map(|source| self.fingerprint(source))
                .collect(),
        );
        if without_pod_credentials {
            self.known_keys.insert(image, &key);
        }
        if let Some(fresh) = self.cache.fresh(&key).await {
            self.observe(true, &fresh);
            return fresh;
        }
        let shared_keys = self
            .shared
            .as_ref()
            .and_then(|shared| shared_keys(shared, &reference, &chain, key.credentials()));
        let asked = Asked {
            identity: key.credentials().to_vec(),
            reference,
            chain,
            shared_keys,
            bounds: LookupBounds::new(self.registry_bytes.clone(), namespace),
        };
        Box::pin(self.resolve_uncached(key, asked, timeout)).await
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

    /// The cache had no fresh answer: ask the registry (once, however many callers wait). A
    /// tag's answer is also kept under its digest.
    async fn resolve_uncached(
        &self,
        key: CacheKey,
        asked: Asked,
        timeout: Duration,
    ) -> Result<Arc<ImagePlatforms>, LookupError> {
        // Another caller may be asking the registry for the same key: then this one waited for
        // its answer (a hit), and `resolve` never ran.
        let mut asked_registry = false;
        let (asked, flag) = (&asked, &mut asked_registry);
        let result = self
            .cache
            .get_or_resolve(key, |last| async move {
                *flag = true;
                self.learn(asked, last.as_ref(), timeout).await
            })
            .await;
        self.observe(!asked_registry, &result);
        result
    }

    /// Learns the image's platforms within `timeout`: from the shared cache if it knows them,
    /// else from the registry (`last`, the tag's last answer, to revalidate), and then tells the
    /// shared cache. A tag's answer is also kept under its digest.
    async fn learn(
        &self,
        asked: &Asked,
        last: Option<&Arc<ImagePlatforms>>,
        timeout: Duration,
    ) -> Result<Learned, LookupError> {
        let time = LookupDeadline {
            deadline: Instant::now() + timeout,
            timeout,
        };
        let share = crate::budget::shared_cache_share(timeout);
        let shared = self.shared.as_ref().zip(asked.shared_keys.as_ref());
        if let Some((shared, keys)) = shared {
            let known =
                |digest: String| async move { self.cache.known(&asked.digest_key(&digest)).await };
            match shared.get(keys, &asked.reference, known, share).await {
                Shared::Found(learned) => {
                    self.remember_by_digest(asked, &learned.found).await;
                    return Ok(learned);
                }
                Shared::Failed(error) => return Err(error),
                Shared::Miss => {}
            }
        }
        let result = self.lookup(asked, last, time).await;
        if let Some((shared, keys)) = shared {
            let left = time.deadline.saturating_duration_since(Instant::now());
            let cache = &self.settings.cache;
            shared.put(keys, &result, cache, share.min(left)).await;
        }
        let found = result?;
        self.remember_by_digest(asked, &found).await;
        Ok(Learned::from(found))
    }

    /// Keeps a tag's answer under its digest too.
    async fn remember_by_digest(&self, asked: &Asked, found: &Arc<ImagePlatforms>) {
        if !asked.reference.is_immutable() {
            let key = asked.digest_key(&found.digest);
            self.cache.remember(key, found.clone()).await;
        }
    }

    /// Uncached lookup: the mirror (if any) first, then the origin, all within `time`. `last`
    /// is the tag's last answer, to revalidate.
    async fn lookup(
        &self,
        asked: &Asked,
        last: Option<&Arc<ImagePlatforms>>,
        time: LookupDeadline,
    ) -> Result<Arc<ImagePlatforms>, LookupError> {
        let reference = &asked.reference;
        if let Some(mirror) = self.settings.mirrors.get(reference.registry()) {
            let mirror_chain: Vec<Source> = self
                .credentials
                .for_registry(mirror)
                .iter()
                .cloned()
                .map(Source::Credential)
                .collect();
            // A hung mirror gets half the time, so the origin still gets its chance.
            let now = Instant::now();
            let mirror_time = LookupDeadline {
                deadline: now
                    + crate::budget::mirror_share(time.deadline.saturating_duration_since(now)),
                timeout: crate::budget::mirror_share(time.timeout),
            };
            match self
                .lookup_at(asked, (mirror, &mirror_chain), last, mirror_time)
                .await
            {
                Ok(found) => return Ok(found),
                Err(e) => tracing::info!(
                    image = ?reference.to_string(), mirror = ?mirror, error = ?e.to_string(),
                    "mirror failed; asking the origin registry"
                ),
            }
        }
        self.lookup_at(asked, (reference.api_host(), &asked.chain), last, time)
            .await
    }

    /// One registry host with its credentials, through its circuit breaker and within `time`.
    async fn lookup_at(
        &self,
        asked: &Asked,
        (host, chain): (&str, &[Source]),
        last: Option<&Arc<ImagePlatforms>>,
        LookupDeadline { deadline, timeout }: LookupDeadline,
    ) -> Result<Arc<ImagePlatforms>, LookupError> {
        let reference = &asked.reference;
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
        let turn_started = Instant::now();
        // Pinned here rather than moved into the timeout, so that when the deadline comes the
        // requests it made still say what they were waiting for.
        let mut attempt = std::pin::pin!(self.try_sources(asked, (host, chain), last, deadline));
        let timed = tokio::time::timeout_at(deadline, attempt.as_mut()).await;
        let stalled = timed
            .is_err()
            .then(|| asked.bounds.stalled_body())
            .flatten();
        let result = match (timed, stalled) {
            (Ok(result), _) => result,
            // It waited for room in the registry bytes others held (its registry's share spent
            // by its own stalled answers, or the budget by everyone's): busy, not the registry.
            (Err(_), None) if asked.bounds.waiting_for_room() => Err(LookupError::Busy {
                reference: reference.to_string(),
            }),
            // The registry answered, and then the image's manifest or blob stalled: the image's
            // own failure, however long the registry took.
            (Err(_), Some(what)) => Err(LookupError::Stalled {
                reference: reference.to_string(),
                what,
            }),
            // The registry had less than half the budget because this lookup waited its turn
            // behind others: tolerable's own limit cut it short, not the registry.
            (Err(_), None)
                if !crate::budget::registry_had_its_chance(
                    deadline.saturating_duration_since(turn_started),
                    timeout,
                ) =>
            {
                return Err(LookupError::Throttled {
                    reference: reference.to_string(),
                    after: timeout,
                });
            }
            // Its bodies waited for room most of the time, and the registry was asked again
            // only as the deadline came (room freed by lookups that ended a moment before):
            // busy, not the registry.
            (Err(_), None)
                if !crate::budget::registry_had_its_chance(
                    deadline
                        .saturating_duration_since(turn_started)
                        .saturating_sub(asked.bounds.waited_for_room()),
                    timeout,
                ) =>
            {
                Err(LookupError::Busy {
                    reference: reference.to_string(),
                })
            }
            (Err(_), None) => Err(LookupError::Timeout {
                reference: reference.to_string(),
                after: timeout,
            }),
        };
        match &result {
            // The image's own bounds, or tolerable's on all lookups: the registry did nothing
            // wrong, and did not show it is up either.
            Err(
                LookupError::OverLimit { .. }
                | LookupError::Busy { .. }
                | LookupError::Stalled { .. },
            ) => {}
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

    /// Tries each source in turn, then anonymous; only an authorization failure (or a plugin
    /// that gave nothing) moves on.
    async fn try_sources(
        &self,
        asked: &Asked,
        (host, chain): (&str, &[Source]),
        last: Option<&Arc<ImagePlatforms>>,
        deadline: Instant,
    ) -> Result<Arc<ImagePlatforms>, LookupError> {
        let reference = &asked.reference;
        let mut tried = Vec::new();
        for source in chain {
            let credentials = match source {
                Source::Credential(credential) => vec![credential.clone()],
                // Boxed: a plugin run's future is large, and only some lookups need one.
                plugin => {
                    match Box::pin(self.plugin_credentials(plugin, reference, deadline)).await {
                        Ok(found) if found.is_empty() => {
                            tried.push(format!("{} (none for this image)", self.label(plugin)));
                            continue;
                        }
                        Ok(found) => found,
                        Err(failed) => {
                            tried.push(failed.to_string());
                            continue;
                        }
                    }
                }
            };
            for credential in &credentials {
                tried.push(credential.source().to_owned());
                let attempt = self.attempt(asked, (host, Some(credential)), last, &tried);
                if let Some(done) = attempt.await {
                    return done;
                }
            }
        }
        tried.push("anonymous".to_owned());
        match self.attempt(asked, (host, None), last, &tried).await {
            Some(done) => done,
            None => Err(FetchError::Unauthorized.into_lookup(
                &reference.to_string(),
                host,
                &tried.join(", "),
            )),
        }
    }

    /// One fetch of the image with `credential` (`None`: anonymous); `None` when the registry
    /// refused it, so the next is tried. `tried` names every source tried so far.
    async fn attempt(
        &self,
        asked: &Asked,
        (host, credential): (&str, Option<&Credential>),
        last: Option<&Arc<ImagePlatforms>>,
        tried: &[String],
    ) -> Option<Result<Arc<ImagePlatforms>, LookupError>> {
        let shown = asked.reference.to_string();
        let label = credential.map_or("anonymous", Credential::source);
        let source = self.client.source(host, credential, &asked.bounds);
        let provenance = credential.map_or(Provenance::Anonymous, |c| {
            Provenance::Credential(c.shared_source())
        });
        Some(match self.fetch(&source, asked, host, last).await {
            Ok(Fetched::Known(found)) => Ok(opened_by(found, provenance)),
            Ok(Fetched::Walked(walked))
                if walked.platforms.is_empty() && walked.artifact.is_none() =>
            {
                Err(LookupError::NoPlatforms { reference: shown })
            }
            Ok(Fetched::Walked(walked)) => {
                tracing::debug!(image = ?shown, host = ?host, credential = ?label, digest = ?walked.digest, "resolved");
                if walked.ignored > 0 {
                    tracing::warn!(image = ?shown, ignored = walked.ignored, "the image names platforms whose OS, architecture or variant is not a valid Kubernetes label value: ignored");
                }
                Ok(Arc::new(ImagePlatforms {
                    digest: walked.digest.clone(),
                    media_type: walked.media_type,
                    served_by: host.to_owned(),
                    fact: Arc::new(ImageFact {
                        platforms: walked.platforms,
                        artifact: walked.artifact,
                        credentials: provenance,
                        stale: None,
                        digest: Some(walked.digest),
                    }),
                }))
            }
            Err(FetchError::Unauthorized) => {
                tracing::debug!(image = ?shown, host = ?host, credential = ?label, "registry refused this credential");
                return None;
            }
            Err(e) => Err(e.into_lookup(&shown, host, &tried.join(", "))),
        })
    }

    /// Registry bytes the lookups hold now (`tolerable_registry_bytes_in_flight`).
    pub fn registry_bytes_in_flight(&self) -> usize {
        self.registry_bytes.in_flight()
    }

    /// Entries currently cached (for metrics and tests).
    pub(crate) async fn cached_entries(&self) -> u64 {
        self.cache.entry_count().await
    }
}

/// `found`, as opened by `provenance` now (and no longer stale, since the registry answered).
fn opened_by(found: Arc<ImagePlatforms>, provenance: Provenance) -> Arc<ImagePlatforms> {
    if found.fact.credentials == provenance && found.fact.stale.is_none() {
        return found;
    }
    Arc::new(ImagePlatforms {
        fact: Arc::new(ImageFact {
            credentials: provenance,
            stale: None,
            ..(*found.fact).clone()
        }),
        ..(*found).clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(image: &str) -> CacheKey {
        CacheKey::new(&ImageReference::parse(image).unwrap(), vec![1, 2])
    }

    #[test]
    fn known_keys_give_back_what_was_kept_and_forget_everything_when_full() {
        let known = KnownKeys::default();
        assert!(known.get("app:1").is_none());
        known.insert("app:1", &key("app:1"));
        assert_eq!(*known.get("app:1").unwrap(), key("app:1"));
        assert!(
            known.get("docker.io/library/app:1").is_none(),
            "by the name as written"
        );
        for i in 2..=KnownKeys::MAX {
            known.insert(&format!("app:{i}"), &key(&format!("app:{i}")));
        }
        assert!(known.get("app:1").is_some(), "still below the bound");
        known.insert("other:1", &key("other:1"));
        assert!(known.get("app:1").is_none(), "forgotten at the bound");
        assert_eq!(*known.get("other:1").unwrap(), key("other:1"));
    }
}
