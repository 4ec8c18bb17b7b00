//! The resolver: parses the reference, picks the registry host (a mirror first, then the
//! origin), takes a lookup turn, asks the host's circuit breaker, tries each credential in
//! order, walks the manifest tree, and caches the answer.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::breaker::{BreakerSettings, CircuitBreakers};
use super::cache::{CacheKey, CacheSettings, LookupCache};
use super::client::{RegistryClient, TransportSettings};
use super::clock::{Clock, SystemClock};
use super::credentials::helper::{DockerHelpers, Helper};
use super::credentials::plugins::{helper_label, CredentialPlugins, PluginFailure};
use super::credentials::provider::Provider;
use super::turns::LookupTurns;
use super::walk::walk;
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
        // One clock for the cache and the breakers, so their notions of "now" agree.
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        Ok(Self {
            client,
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
        Box::pin(self.resolve_uncached(key, reference, chain, timeout)).await
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

    /// The cache had no fresh answer: ask the registry (once, however many callers wait).
    async fn resolve_uncached(
        &self,
        key: CacheKey,
        reference: ImageReference,
        chain: Vec<Source>,
        timeout: Duration,
    ) -> Result<Arc<ImagePlatforms>, LookupError> {
        // Another caller may be asking the registry for the same key: then this one waited for
        // its answer (a hit), and `resolve` never ran.
        let mut asked_registry = false;
        let result = self
            .cache
            .get_or_resolve(key, async {
                asked_registry = true;
                let deadline = tokio::time::Instant::now() + timeout;
                self.lookup(&reference, &chain, deadline, timeout).await
            })
            .await;
        self.observe(!asked_registry, &result);
        result
    }

    /// Uncached lookup: the mirror (if any) first, then the origin, all before `deadline`.
    async fn lookup(
        &self,
        reference: &ImageReference,
        chain: &[Source],
        deadline: tokio::time::Instant,
        timeout: Duration,
    ) -> Result<Arc<ImagePlatforms>, LookupError> {
        if let Some(mirror) = self.settings.mirrors.get(reference.registry()) {
            let mirror_chain: Vec<Source> = self
                .credentials
                .for_registry(mirror)
                .iter()
                .cloned()
                .map(Source::Credential)
                .collect();
            // A hung mirror gets half the time, so the origin still gets its chance.
            let now = tokio::time::Instant::now();
            let mirror_deadline =
                now + crate::budget::mirror_share(deadline.saturating_duration_since(now));
            match self
                .lookup_at(
                    reference,
                    mirror,
                    &mirror_chain,
                    mirror_deadline,
                    crate::budget::mirror_share(timeout),
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
        chain: &[Source],
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
            tokio::time::timeout_at(deadline, self.try_sources(reference, host, chain, deadline));
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

    /// Tries each source in turn, then anonymous; only an authorization failure (or a plugin
    /// that gave nothing) moves on.
    async fn try_sources(
        &self,
        reference: &ImageReference,
        host: &str,
        chain: &[Source],
        deadline: tokio::time::Instant,
    ) -> Result<Arc<ImagePlatforms>, LookupError> {
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
                if let Some(done) = self
                    .attempt(reference, host, Some(credential), &tried)
                    .await
                {
                    return done;
                }
            }
        }
        tried.push("anonymous".to_owned());
        match self.attempt(reference, host, None, &tried).await {
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

    /// One walk of the image with `credential` (`None`: anonymous); `None` when the registry
    /// refused it, so the next is tried. `tried` names every source tried so far.
    async fn attempt(
        &self,
        reference: &ImageReference,
        host: &str,
        credential: Option<&Credential>,
        tried: &[String],
    ) -> Option<Result<Arc<ImagePlatforms>, LookupError>> {
        let shown = reference.to_string();
        let label = credential.map_or("anonymous", Credential::source);
        let source = self.client.source(host, credential);
        let walked = walk(
            &source,
            reference.repository(),
            reference.manifest_reference(),
        )
        .await;
        Some(match walked {
            Ok(walked) if walked.platforms.is_empty() && walked.artifact.is_none() => {
                Err(LookupError::NoPlatforms { reference: shown })
            }
            Ok(walked) => {
                tracing::debug!(image = ?shown, host = ?host, credential = ?label, digest = ?walked.digest, "resolved");
                Ok(Arc::new(ImagePlatforms {
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
                }))
            }
            Err(FetchError::Unauthorized) => {
                tracing::debug!(image = ?shown, host = ?host, credential = ?label, "registry refused this credential");
                return None;
            }
            Err(e) => Err(e.into_lookup(&shown, host, &tried.join(", "))),
        })
    }

    /// Entries currently cached (for metrics and tests).
    pub(crate) async fn cached_entries(&self) -> u64 {
        self.cache.entry_count().await
    }
}
