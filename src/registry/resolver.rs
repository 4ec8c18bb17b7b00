//! The resolver: parses the reference, picks the registry host (a mirror first, then the
//! origin), takes a lookup turn, asks the host's circuit breaker, tries each credential in
//! order, revalidates a tag's last answer with a HEAD or walks the manifest tree, and caches
//! the answer (a tag's also under its digest).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::bounds::{LookupBounds, RegistryBytes, REGISTRY_BYTES_BUDGET};
use super::breaker::{BreakerSettings, CircuitBreakers};
use super::cache::{CacheKey, CacheSettings, Learned, LookupCache};
use super::client::{HostSource, RegistryClient, TransportSettings};
use super::clock::{Clock, SystemClock};
use super::credentials::helper::{DockerHelpers, Helper};
use super::credentials::plugins::{helper_label, CredentialPlugins, PluginFailure};
use super::credentials::provider::Provider;
use super::shared::{Keys, Shared, SharedCache, SharedCacheSettings};
use super::turns::LookupTurns;
use super::walk::{verify, walk, Checked, Walked};
use super::{
    Credential, CredentialStore, FetchError, ImageFact, ImagePlatforms, ImageReference,
    LookupError, Provenance, RegistryObserver, Revalidation, MAX_TRACKED_HOSTS,
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

/// Where a lookup's credentials come from, in the order they are tried (then anonymous).
#[derive(Clone, Debug)]
enum Source {
    /// A pull secret's, a credential file's, the Docker config's.
    Credential(Credential),
    /// A credential provider plugin (by index), run when reached.
    Provider(usize),
    /// The Docker config's credential helper for the registry, run when reached.
    Helper(Helper),
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
struct Budget {
    deadline: Instant,
    timeout: Duration,
}

/// What one host answered for one credential.
enum Fetched {
    Walked(Walked),
    /// An answer already known: the tag's last one (same digest), or its new digest's.
    Known(Arc<ImagePlatforms>),
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
        self.resolve_within(image, first, self.settings.lookup_timeout)
            .await
    }

    /// [`Resolver::resolve_with`] for a caller who can wait only `budget` (an admission whose
    /// API server times out sooner than `lookup_timeout`): a registry lookup then ends by itself
    /// within the budget, so a hung registry is still counted by its circuit breaker rather than
    /// abandoned unnoticed.
    pub(crate) async fn resolve_within(
        &self,
        image: &str,
        first: &CredentialStore,
        budget: Duration,
    ) -> Result<Arc<ImagePlatforms>, LookupError> {
        let timeout = budget.min(self.settings.lookup_timeout);
        let reference = ImageReference::parse(image)?;
        let chain = self.chain(&reference, first);
        let key = CacheKey::new(
            &reference,
            chain
                .iter()
                .map(|source| self.fingerprint(source))
                .collect(),
        );
        // The warm path stays small: the registry lookup's future is large (tens of KiB of
        // state for HTTP, TLS and auth), and moving it around costs every admission, hit or miss.
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
            bounds: LookupBounds::new(self.registry_bytes.clone()),
        };
        Box::pin(self.resolve_uncached(key, asked, timeout)).await
    }

    /// Each platform the image's index claims, checked against the image config of the manifest
    /// it names (`inspect --verify`, `audit --verify`; never at admission: one blob GET per
    /// child). Asks as a lookup does — the mirror first, then the image's registry, with the
    /// same credentials in the same order — without the cache, within `budget`.
    pub(crate) async fn verify(
        &self,
        image: &str,
        first: &CredentialStore,
        budget: Duration,
    ) -> Result<Vec<Checked>, LookupError> {
        let reference = ImageReference::parse(image)?;
        // Every claimed child costs a manifest and a blob: the index's own limit bounds them.
        let bounds = LookupBounds::with_limits(
            self.registry_bytes.clone(),
            super::bounds::LOOKUP_BYTES_SHARE,
            2 * super::MAX_INDEX_ENTRIES + 1,
        );
        if let Some(mirror) = self.settings.mirrors.get(reference.registry()) {
            let chain: Vec<&Credential> = self.credentials.for_registry(mirror).iter().collect();
            let share = crate::budget::mirror_share(budget);
            match self
                .verify_at(&reference, ((mirror.as_str(), &bounds), &chain), share)
                .await
            {
                Ok(checked) => return Ok(checked),
                Err(e) => {
                    tracing::info!(image = ?image, mirror = ?mirror, error = ?e.to_string(), "mirror failed; asking the origin registry")
                }
            }
        }
        let chain: Vec<&Credential> = first
            .for_registry(reference.registry())
            .iter()
            .chain(self.credentials.for_registry(reference.registry()))
            .collect();
        self.verify_at(
            &reference,
            ((reference.api_host(), &bounds), &chain),
            budget,
        )
        .await
    }

    /// [`Resolver::verify`] at one host: each credential in turn, then anonymous.
    async fn verify_at(
        &self,
        reference: &ImageReference,
        ((host, bounds), chain): ((&str, &LookupBounds), &[&Credential]),
        budget: Duration,
    ) -> Result<Vec<Checked>, LookupError> {
        let shown = reference.to_string();
        let mut tried = Vec::new();
        let attempts = chain.iter().map(|c| Some(*c)).chain(std::iter::once(None));
        for credential in attempts {
            tried.push(
                credential
                    .map_or("anonymous", Credential::source)
                    .to_owned(),
            );
            let source = self.client.source(host, credential, bounds);
            let checked = verify(
                &source,
                reference.repository(),
                reference.manifest_reference(),
            );
            let checked =
                tokio::time::timeout(budget, checked)
                    .await
                    .map_err(|_| LookupError::Timeout {
                        reference: shown.clone(),
                        after: budget,
                    })?;
            match checked {
                Err(FetchError::Unauthorized) => continue,
                Err(e) => return Err(e.into_lookup(&shown, host, &tried.join(", "))),
                Ok(checked) => return Ok(checked),
            }
        }
        Err(FetchError::Unauthorized.into_lookup(&shown, host, &tried.join(", ")))
    }

    /// The sources to try for `reference`: `first` (a Pod's pull secrets), the credential
    /// providers matching the image, the configured credentials, the Docker config's helper.
    fn chain(&self, reference: &ImageReference, first: &CredentialStore) -> Vec<Source> {
        let registry = reference.registry();
        let image = format!("{registry}/{}", reference.repository());
        let statics = |store: &CredentialStore| {
            store
                .for_registry(registry)
                .iter()
                .cloned()
                .map(Source::Credential)
                .collect::<Vec<_>>()
        };
        let mut chain = statics(first);
        chain.extend(self.plugins.providers_for(&image).map(Source::Provider));
        chain.extend(statics(&self.credentials));
        chain.extend(
            self.plugins
                .helper_for(registry)
                .cloned()
                .map(Source::Helper),
        );
        chain
    }

    /// A source's part of a cache key: two lookups trying different sources must not share an
    /// answer.
    fn fingerprint(&self, source: &Source) -> u64 {
        match source {
            Source::Credential(credential) => self.client.fingerprint(credential),
            Source::Provider(index) => self
                .client
                .fingerprint_label(&self.plugins.provider_label(*index)),
            Source::Helper(helper) => self.client.fingerprint_label(&helper_label(helper)),
        }
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
        let budget = Budget {
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
        let result = self.lookup(asked, last, budget).await;
        if let Some((shared, keys)) = shared {
            let left = budget.deadline.saturating_duration_since(Instant::now());
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

    /// Uncached lookup: the mirror (if any) first, then the origin, all within `budget`. `last`
    /// is the tag's last answer, to revalidate.
    async fn lookup(
        &self,
        asked: &Asked,
        last: Option<&Arc<ImagePlatforms>>,
        budget: Budget,
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
            let mirror_budget = Budget {
                deadline: now
                    + crate::budget::mirror_share(budget.deadline.saturating_duration_since(now)),
                timeout: crate::budget::mirror_share(budget.timeout),
            };
            match self
                .lookup_at(asked, (mirror, &mirror_chain), last, mirror_budget)
                .await
            {
                Ok(found) => return Ok(found),
                Err(e) => tracing::info!(
                    image = ?reference.to_string(), mirror = ?mirror, error = ?e.to_string(),
                    "mirror failed; asking the origin registry"
                ),
            }
        }
        self.lookup_at(asked, (reference.api_host(), &asked.chain), last, budget)
            .await
    }

    /// One registry host with its credentials, through its circuit breaker and within `budget`.
    async fn lookup_at(
        &self,
        asked: &Asked,
        (host, chain): (&str, &[Source]),
        last: Option<&Arc<ImagePlatforms>>,
        Budget { deadline, timeout }: Budget,
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
            // The registry answered, and then the image's manifest or blob stalled: the image's
            // own failure, however long the registry took.
            (Err(_), Some(what)) => Err(LookupError::Stalled {
                reference: reference.to_string(),
                what,
            }),
            // The registry had less than half the budget because this lookup waited its turn
            // behind others: tolerable's own limit cut it short, not the registry.
            (Err(_), None) if deadline.saturating_duration_since(turn_started) < timeout / 2 => {
                return Err(LookupError::Throttled {
                    reference: reference.to_string(),
                    after: timeout,
                });
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

    /// How lookups name a plugin source.
    fn label(&self, source: &Source) -> String {
        match source {
            Source::Credential(credential) => credential.source().to_owned(),
            Source::Provider(index) => self.plugins.provider_label(*index),
            Source::Helper(helper) => helper_label(helper),
        }
    }

    /// What a plugin source gives for the image, within its share of what is left before
    /// `deadline`.
    async fn plugin_credentials(
        &self,
        source: &Source,
        reference: &ImageReference,
        deadline: tokio::time::Instant,
    ) -> Result<Vec<Credential>, PluginFailure> {
        let now = tokio::time::Instant::now();
        let plugin_deadline =
            now + crate::budget::credential_plugin_share(deadline.saturating_duration_since(now));
        let observer = self.observer.as_deref();
        let registry = reference.registry();
        match source {
            Source::Credential(credential) => Ok(vec![credential.clone()]),
            Source::Provider(index) => {
                let image = format!("{registry}/{}", reference.repository());
                self.plugins
                    .provider_credentials(*index, &image, registry, plugin_deadline, observer)
                    .await
            }
            Source::Helper(helper) => {
                self.plugins
                    .helper_credentials(helper, registry, plugin_deadline, observer)
                    .await
            }
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
                    digest: walked.digest,
                    media_type: walked.media_type,
                    served_by: host.to_owned(),
                    fact: Arc::new(ImageFact {
                        platforms: walked.platforms,
                        artifact: walked.artifact,
                        credentials: provenance,
                        stale: None,
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

    /// The image's platforms from one host with one credential. A tag with a last answer is
    /// revalidated with a HEAD (and, with a shared cache, any tag is asked for its digest
    /// first): the same digest keeps the answer, a digest whose answer is known (here or in the
    /// shared cache) gives that one, and only a new digest is fetched (by digest, so the answer
    /// is the one the HEAD named). Anything else — a digest reference, a tag seen for the first
    /// time without a shared cache, a host that names no digest on HEAD — walks the manifest
    /// tree.
    async fn fetch(
        &self,
        source: &HostSource<'_>,
        asked: &Asked,
        host: &str,
        last: Option<&Arc<ImagePlatforms>>,
    ) -> Result<Fetched, FetchError> {
        let repository = asked.reference.repository();
        let reference = asked.reference.manifest_reference();
        let head_first = !asked.reference.is_immutable()
            && (last.is_some() || asked.shared_keys.is_some())
            && self.names_digests_on_head(host);
        if !head_first {
            return Ok(Fetched::Walked(
                walk(source, repository, reference, &asked.bounds).await?,
            ));
        }
        let named = match source.head_digest(repository, reference).await {
            // A registry that does not do HEAD (405, 501…) is treated as one naming no digest.
            Err(FetchError::Status { code, .. }) if code != 429 && code != 503 => None,
            named => named?,
        };
        let (outcome, fetched) = match (named, last) {
            (Some(digest), Some(last)) if digest == last.digest => {
                (Revalidation::Unchanged, Fetched::Known(last.clone()))
            }
            (Some(digest), _) => match self.known_answer(asked, &digest).await {
                Some(found) => (Revalidation::KnownDigest, Fetched::Known(found)),
                None => match self.fetched_elsewhere(asked, &digest).await {
                    Some(found) => (Revalidation::KnownDigest, Fetched::Known(found)),
                    None => {
                        let walked = walk(source, repository, &digest, &asked.bounds).await?;
                        (Revalidation::Changed, Fetched::Walked(walked))
                    }
                },
            },
            (None, _) => {
                self.remember_no_head_digest(host);
                let walked = walk(source, repository, reference, &asked.bounds).await?;
                (Revalidation::NoDigest, Fetched::Walked(walked))
            }
        };
        if let Some(observer) = self.observer.as_ref().filter(|_| last.is_some()) {
            observer.revalidated(outcome);
        }
        Ok(fetched)
    }

    /// With a shared cache, one replica fetches a digest new to all: it claims the fetch, and
    /// the others wait for its answer (`budget::shared_fetch_wait` at most, then fetch it
    /// themselves). `None`: this replica is to fetch it.
    async fn fetched_elsewhere(&self, asked: &Asked, digest: &str) -> Option<Arc<ImagePlatforms>> {
        let (shared, keys) = self.shared.as_ref().zip(asked.shared_keys.as_ref())?;
        let timeout = self.settings.lookup_timeout;
        let share = crate::budget::shared_cache_share(timeout);
        if shared.claim(keys, digest, timeout, share).await {
            return None;
        }
        let wait = crate::budget::shared_fetch_wait(timeout);
        let found = Arc::new(shared.wait_for(keys, digest, wait, share).await?);
        self.cache
            .remember(asked.digest_key(digest), found.clone())
            .await;
        Some(found)
    }

    /// The answer for `digest` of the asked repository, from the in-memory cache or else the
    /// shared one (then kept in memory too).
    async fn known_answer(&self, asked: &Asked, digest: &str) -> Option<Arc<ImagePlatforms>> {
        let key = asked.digest_key(digest);
        if let Some(found) = self.cache.known(&key).await {
            return Some(found);
        }
        let (shared, keys) = self.shared.as_ref().zip(asked.shared_keys.as_ref())?;
        let share = crate::budget::shared_cache_share(self.settings.lookup_timeout);
        let found = Arc::new(shared.get_digest(keys, digest, share).await?);
        self.cache.remember(key, found.clone()).await;
        Some(found)
    }

    fn names_digests_on_head(&self, host: &str) -> bool {
        !self
            .no_head_digest
            .lock()
            .expect("not poisoned")
            .contains(host)
    }

    /// `host` sent no digest on a HEAD: its tags are revalidated with a GET from now on.
    fn remember_no_head_digest(&self, host: &str) {
        let mut hosts = self.no_head_digest.lock().expect("not poisoned");
        if hosts.len() < MAX_TRACKED_HOSTS && hosts.insert(host.to_owned()) {
            tracing::info!(registry = ?host, "registry names no Docker-Content-Digest on HEAD: its tags are revalidated with a GET");
        }
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

/// The lookup's keys in the shared cache: only when every source is a credential. A plugin's
/// credentials are minted per run (and its name is no identity other replicas share), so such
/// lookups keep to the in-memory cache.
fn shared_keys(
    shared: &SharedCache,
    reference: &ImageReference,
    chain: &[Source],
    fingerprints: &[u64],
) -> Option<Keys> {
    let credentials: Vec<Credential> = chain
        .iter()
        .map(|source| match source {
            Source::Credential(credential) => Some(credential.clone()),
            _ => None,
        })
        .collect::<Option<_>>()?;
    Some(shared.keys(reference, &credentials, fingerprints))
}
