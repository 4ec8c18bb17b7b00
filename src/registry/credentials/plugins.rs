//! Credentials that plugins give: kubelet credential provider plugins (`credential_provider_config`)
//! run as the kubelet runs them, with the kubelet's cache rules.
//!
//! A plugin runs only when a lookup needs it (the lookup cache answered nothing), inside the
//! lookup's budget ([`crate::budget::credential_plugin_share`]), at most [`MAX_PLUGIN_RUNS`] at
//! once. Its answer is cached by its `cacheKeyType` (`Image`: the repository; `Registry`: the
//! registry host; `Global`: every image) for its `cacheDuration`, else the provider's
//! `defaultCacheDuration` (`0s`: not cached). Lookups needing the same cache key share one run:
//! until a provider has answered once, its runs take turns (its key type is not known yet). A
//! failed run — a non-zero exit, an answer that is not a CredentialProviderResponse of the
//! provider's apiVersion, no answer by the deadline — is cached for `cache_failure_ttl`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use moka::future::Cache;
use moka::Expiry;
use serde::Deserialize;

use super::exec;
use super::helper::{self, DockerHelpers, Helper};
use super::image_match::{best_first, ImagePattern};
use super::provider::Provider;
use super::Credential;
use crate::registry::clock::Clock;
use crate::registry::RegistryObserver;

/// Plugin processes running at once, in all: a flood of images matching an Image-keyed provider
/// cannot fork thousands of processes.
pub(crate) const MAX_PLUGIN_RUNS: usize = 8;
/// Cached answers and failures, in all.
const MAX_CACHED: u64 = 10_000;
/// Secrets plugins gave lately, scrubbed from their stderr (besides what looks like one).
const REMEMBERED_SECRETS: usize = 64;
/// How long a Docker credential helper's answer is kept (its protocol says nothing about it).
pub(crate) const HELPER_CACHE_TTL: Duration = Duration::from_secs(300);

/// Why a plugin gave no credentials. Its text is safe to show: the plugin's name, what went
/// wrong (exit status, a scrubbed and trimmed stderr), never a credential.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{plugin} failed: {reason}")]
pub(crate) struct PluginFailure {
    /// `credential provider <name>`.
    pub(crate) plugin: String,
    pub(crate) reason: String,
}

/// A provider's answer, as cached: its auth entries by key pattern.
type Auth = Arc<[(ImagePattern, Credential)]>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyType {
    Image,
    Registry,
    Global,
}

impl KeyType {
    fn index(self) -> usize {
        self as usize
    }
}

/// One cached run.
struct Slot {
    answer: Result<Auth, PluginFailure>,
    until: Instant,
}

struct SlotExpiry(Arc<dyn Clock>);

impl Expiry<String, Arc<Slot>> for SlotExpiry {
    fn expire_after_create(&self, _: &String, slot: &Arc<Slot>, _: Instant) -> Option<Duration> {
        Some(slot.until.saturating_duration_since(self.0.now()))
    }
}

struct ProviderState {
    provider: Provider,
    /// The `cacheKeyType` of its last answer; `None` before the first.
    key_type: Mutex<Option<KeyType>>,
}

impl ProviderState {
    fn label(&self) -> String {
        format!("credential provider {}", self.provider.name)
    }

    /// The cache keys of `image` (`registry/repository`) by key type.
    fn keys(&self, image: &str, registry: &str) -> [String; 3] {
        let name = &self.provider.name;
        [
            format!("{name}\0image\0{image}"),
            format!("{name}\0registry\0{registry}"),
            format!("{name}\0global"),
        ]
    }
}

/// A failed run, and whether to remember it (a run that never got its turn is not the plugin's
/// failure).
struct RunError {
    reason: String,
    cache: bool,
}

/// A provider's answer, checked.
struct Answered {
    key_type: KeyType,
    duration: Option<Duration>,
    auth: Auth,
}

pub(crate) struct CredentialPlugins {
    providers: Vec<ProviderState>,
    helpers: DockerHelpers,
    secrets: Mutex<VecDeque<String>>,
    cache: Cache<String, Arc<Slot>>,
    flights: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
    runs: tokio::sync::Semaphore,
    failure_ttl: Duration,
    clock: Arc<dyn Clock>,
}

impl CredentialPlugins {
    pub(crate) fn new(
        providers: Vec<Provider>,
        helpers: DockerHelpers,
        failure_ttl: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            providers: providers
                .into_iter()
                .map(|provider| ProviderState {
                    provider,
                    key_type: Mutex::default(),
                })
                .collect(),
            helpers,
            secrets: Mutex::default(),
            cache: Cache::builder()
                .max_capacity(MAX_CACHED)
                .expire_after(SlotExpiry(clock.clone()))
                .build(),
            flights: Mutex::default(),
            runs: tokio::sync::Semaphore::new(MAX_PLUGIN_RUNS),
            failure_ttl,
            clock,
        }
    }

    /// The providers to ask for `image` (`registry/repository`), in the config file's order.
    pub(crate) fn providers_for<'a>(&'a self, image: &'a str) -> impl Iterator<Item = usize> + 'a {
        self.providers
            .iter()
            .enumerate()
            .filter(move |(_, state)| state.provider.matches(image))
            .map(|(i, _)| i)
    }

    /// `credential provider <name>`, as lookups name it.
    pub(crate) fn provider_label(&self, index: usize) -> String {
        self.providers[index].label()
    }

    /// The credentials provider `index` gives for `image` (`registry/repository`), best match
    /// first (none when its answer has no entry for the image): from the cache, or from one run
    /// ended by `deadline`.
    pub(crate) async fn provider_credentials(
        &self,
        index: usize,
        image: &str,
        registry: &str,
        deadline: tokio::time::Instant,
        observer: Option<&dyn RegistryObserver>,
    ) -> Result<Vec<Credential>, PluginFailure> {
        let state = &self.providers[index];
        let keys = state.keys(image, registry);
        let auth = match self.cached(&keys).await {
            Some(cached) => cached?,
            None => {
                self.run_once(state, &keys, image, deadline, observer)
                    .await?
            }
        };
        Ok(best_first(image, &auth).into_iter().cloned().collect())
    }

    /// A fresh cached run under any of `keys`; an answer wins over a failure.
    async fn cached(&self, keys: &[String]) -> Option<Result<Auth, PluginFailure>> {
        let now = self.clock.now();
        let mut failure = None;
        for key in keys {
            let Some(slot) = self.cache.get(key).await else {
                continue;
            };
            match &slot.answer {
                _ if now >= slot.until => {}
                Ok(auth) => return Some(Ok(auth.clone())),
                Err(failed) => failure = failure.or_else(|| Some(failed.clone())),
            }
        }
        failure.map(Err)
    }

    /// The lock lookups needing the cache key `key` take turns on.
    fn flight(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut flights = self.flights.lock().expect("flights lock poisoned");
        if let Some(lock) = flights.get(key).and_then(Weak::upgrade) {
            return lock;
        }
        if flights.len() >= 1024 {
            flights.retain(|_, lock| lock.strong_count() > 0);
        }
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        flights.insert(key.to_owned(), Arc::downgrade(&lock));
        lock
    }

    /// Runs the provider once for everyone waiting on the same cache key, and caches the
    /// outcome.
    async fn run_once(
        &self,
        state: &ProviderState,
        keys: &[String; 3],
        image: &str,
        deadline: tokio::time::Instant,
        observer: Option<&dyn RegistryObserver>,
    ) -> Result<Auth, PluginFailure> {
        let known = *state.key_type.lock().expect("key type lock poisoned");
        let flight_key = &keys[known.unwrap_or(KeyType::Global).index()];
        let lock = self.flight(flight_key);
        let failure = |reason: String| PluginFailure {
            plugin: state.label(),
            reason,
        };
        let Ok(_turn) = tokio::time::timeout_at(deadline, lock.lock()).await else {
            return Err(failure("still running for another lookup".into()));
        };
        if let Some(cached) = self.cached(keys).await {
            return cached;
        }
        match self.run_provider(state, image, deadline, observer).await {
            Ok(answered) => {
                *state.key_type.lock().expect("key type lock poisoned") = Some(answered.key_type);
                self.remember_secrets(&answered.auth);
                let ttl = answered
                    .duration
                    .unwrap_or(state.provider.default_cache_duration);
                if !ttl.is_zero() {
                    let key = keys[answered.key_type.index()].clone();
                    self.remember(key, Ok(answered.auth.clone()), ttl).await;
                }
                Ok(answered.auth)
            }
            Err(error) => {
                let failed = failure(error.reason);
                tracing::warn!(plugin = %state.provider.name, error = %failed.reason, "credential provider plugin failed");
                if error.cache {
                    self.remember(flight_key.clone(), Err(failed.clone()), self.failure_ttl)
                        .await;
                }
                Err(failed)
            }
        }
    }

    /// Secrets plugins gave lately: scrubbed from what they print on stderr.
    fn remember_secrets(&self, auth: &Auth) {
        let mut secrets = self.secrets.lock().expect("secrets lock poisoned");
        for (_, credential) in auth.iter() {
            if !secrets.iter().any(|s| s == credential.secret()) {
                secrets.push_back(credential.secret().to_owned());
            }
        }
        while secrets.len() > REMEMBERED_SECRETS {
            secrets.pop_front();
        }
    }

    fn known_secrets(&self) -> Vec<String> {
        let secrets = self.secrets.lock().expect("secrets lock poisoned");
        secrets.iter().cloned().collect()
    }

    async fn remember(&self, key: String, answer: Result<Auth, PluginFailure>, ttl: Duration) {
        let until = self.clock.now() + ttl;
        self.cache
            .insert(key, Arc::new(Slot { answer, until }))
            .await;
    }

    /// One run of the provider for `image`, within its turn and `deadline`; counted.
    async fn run_provider(
        &self,
        state: &ProviderState,
        image: &str,
        deadline: tokio::time::Instant,
        observer: Option<&dyn RegistryObserver>,
    ) -> Result<Answered, RunError> {
        let provider = &state.provider;
        let Ok(_run) = tokio::time::timeout_at(deadline, self.runs.acquire()).await else {
            return Err(RunError {
                reason: format!("not run: {MAX_PLUGIN_RUNS} plugins were running already"),
                cache: false,
            });
        };
        let request = serde_json::json!({
            "apiVersion": provider.api_version,
            "kind": "CredentialProviderRequest",
            "image": image,
        });
        let secrets = self.known_secrets();
        let started = Instant::now();
        let finished = exec::run(
            &provider.program,
            &provider.args,
            &provider.env,
            request.to_string().as_bytes(),
            deadline,
            &secrets,
        )
        .await;
        let (result, label) = match finished {
            Err(e) => (Err(e.to_string()), e.metric_label()),
            Ok(done) if !done.status.success() => (Err(exit_reason(&done)), "failed"),
            Ok(done) => match parse_response(&done, provider, &state.label()) {
                Ok(answered) => (Ok(answered), "ok"),
                Err(why) => (Err(why), "invalid_response"),
            },
        };
        if let Some(observer) = observer {
            observer.credential_plugin_run(&provider.name, label, started.elapsed());
        }
        result.map_err(|reason| RunError {
            reason,
            cache: true,
        })
    }
}

impl CredentialPlugins {
    /// The Docker credential helper to ask for `registry`, if the Docker config names one.
    pub(crate) fn helper_for(&self, registry: &str) -> Option<&Helper> {
        self.helpers.for_registry(registry)
    }

    /// What `helper` holds for `registry` (none, or one credential): from the cache (kept
    /// [`HELPER_CACHE_TTL`]), or from one run of `get` ended by `deadline`.
    pub(crate) async fn helper_credentials(
        &self,
        helper: &Helper,
        registry: &str,
        deadline: tokio::time::Instant,
        observer: Option<&dyn RegistryObserver>,
    ) -> Result<Vec<Credential>, PluginFailure> {
        let key = format!("{}\0{registry}", helper.program_name);
        let keys = [key];
        let failure = |reason: String| PluginFailure {
            plugin: helper_label(helper),
            reason,
        };
        let auth = match self.cached(&keys).await {
            Some(cached) => cached?,
            None => {
                let lock = self.flight(&keys[0]);
                let Ok(_turn) = tokio::time::timeout_at(deadline, lock.lock()).await else {
                    return Err(failure("still running for another lookup".into()));
                };
                match self.cached(&keys).await {
                    Some(cached) => cached?,
                    None => {
                        self.run_helper(helper, registry, &keys[0], deadline, observer)
                            .await?
                    }
                }
            }
        };
        Ok(auth.iter().map(|(_, c)| c.clone()).collect())
    }

    /// One run of `helper get` for `registry`; its outcome cached under `key`.
    async fn run_helper(
        &self,
        helper: &Helper,
        registry: &str,
        key: &str,
        deadline: tokio::time::Instant,
        observer: Option<&dyn RegistryObserver>,
    ) -> Result<Auth, PluginFailure> {
        let label = helper_label(helper);
        let Ok(_run) = tokio::time::timeout_at(deadline, self.runs.acquire()).await else {
            return Err(PluginFailure {
                plugin: label,
                reason: format!("not run: {MAX_PLUGIN_RUNS} plugins were running already"),
            });
        };
        let started = Instant::now();
        let finished = exec::run(
            &helper.program,
            &["get".to_owned()],
            &[],
            helper::server_url(registry).as_bytes(),
            deadline,
            &self.known_secrets(),
        )
        .await;
        let (result, metric) = helper_outcome(finished, registry, &label, &self.known_secrets());
        if let Some(observer) = observer {
            observer.credential_plugin_run(&helper.program_name, metric, started.elapsed());
        }
        match result {
            Ok(auth) => {
                self.remember_secrets(&auth);
                self.remember(key.to_owned(), Ok(auth.clone()), HELPER_CACHE_TTL)
                    .await;
                Ok(auth)
            }
            Err(reason) => {
                let failed = PluginFailure {
                    plugin: label,
                    reason,
                };
                tracing::warn!(plugin = %helper.program_name, error = %failed.reason, "docker credential helper failed");
                self.remember(key.to_owned(), Err(failed.clone()), self.failure_ttl)
                    .await;
                Err(failed)
            }
        }
    }
}

/// `credential helper docker-credential-<name>`, as lookups name it.
pub(crate) fn helper_label(helper: &Helper) -> String {
    format!("credential helper {}", helper.program_name)
}

/// A helper run's credentials (none when it holds none), or why it gave none; and the result
/// counted.
fn helper_outcome(
    finished: Result<exec::Finished, exec::ExecError>,
    registry: &str,
    label: &str,
    secrets: &[String],
) -> (Result<Auth, String>, &'static str) {
    let none = || Arc::from(Vec::new());
    let done = match finished {
        Ok(done) => done,
        Err(e) => return (Err(e.to_string()), e.metric_label()),
    };
    if !done.status.success() {
        if helper::says_not_found(&done.stdout) || helper::says_not_found(done.stderr.as_bytes()) {
            return (Ok(none()), "none");
        }
        let mut reason = exit_reason(&done);
        // Helpers print their errors on stdout.
        if done.stderr.is_empty() && !done.stdout.is_empty() {
            reason = format!("{reason}: {}", exec::scrub(&done.stdout, secrets));
        }
        return (Err(reason), "failed");
    }
    if done.stdout_overflow {
        return (
            Err(format!("printed more than {} bytes", exec::MAX_STDOUT)),
            "invalid_response",
        );
    }
    match helper::parse_answer(&done.stdout) {
        Ok(None) => (Ok(none()), "none"),
        Ok(Some((user, secret))) => match ImagePattern::parse_auth_key(registry) {
            Ok(pattern) => (
                Ok(Arc::from(vec![(
                    pattern,
                    Credential::new(user, secret, label),
                )])),
                "ok",
            ),
            Err(why) => (Err(why), "invalid_response"),
        },
        Err(why) => (Err(why), "invalid_response"),
    }
}

/// `exit status 3: <stderr>` or `killed by signal 9: <stderr>`.
pub(crate) fn exit_reason(done: &exec::Finished) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    let status = match (done.status.code(), done.status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "ended abnormally".to_owned(),
    };
    if done.stderr.is_empty() {
        status
    } else {
        format!("{status}: {}", done.stderr)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Response {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    cache_key_type: String,
    cache_duration: Option<String>,
    #[serde(default)]
    auth: Option<BTreeMap<String, AuthEntry>>,
}

#[derive(Deserialize)]
struct AuthEntry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
}

/// `text` when it is a short word of the API's alphabet, else a stand-in: what a plugin printed
/// is only quoted when it cannot be a secret.
fn shown(text: &str) -> String {
    let plain = text.len() <= 64
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "./-".contains(c));
    if plain {
        format!("{text:?}")
    } else {
        "something else".to_owned()
    }
}

/// The plugin's stdout as a CredentialProviderResponse of the provider's apiVersion. Errors
/// never quote the answer beyond a word of the API's alphabet (it holds secrets).
fn parse_response(
    done: &exec::Finished,
    provider: &Provider,
    label: &str,
) -> Result<Answered, String> {
    if done.stdout_overflow {
        return Err(format!("printed more than {} bytes", exec::MAX_STDOUT));
    }
    let response: Response = serde_json::from_slice(&done.stdout).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Data => {
                "a JSON document that is not a CredentialProviderResponse"
            }
            _ => "invalid JSON",
        };
        format!("printed {what} (line {}, column {})", e.line(), e.column())
    })?;
    if response.kind != "CredentialProviderResponse" {
        return Err(format!(
            "answered kind {}, not CredentialProviderResponse",
            shown(&response.kind)
        ));
    }
    if response.api_version != provider.api_version {
        return Err(format!(
            "answered apiVersion {}, not {} (the provider's apiVersion)",
            shown(&response.api_version),
            provider.api_version
        ));
    }
    let key_type = match response.cache_key_type.as_str() {
        "Image" => KeyType::Image,
        "Registry" => KeyType::Registry,
        "Global" => KeyType::Global,
        other => {
            return Err(format!(
                "answered cacheKeyType {}, not Image, Registry or Global",
                shown(other)
            ))
        }
    };
    let duration = match &response.cache_duration {
        Some(text) => Some(
            crate::duration::parse_go(text)
                .map_err(|_| format!("answered cacheDuration {}, not a duration", shown(text)))?,
        ),
        None => None,
    };
    Ok(Answered {
        key_type,
        duration,
        auth: auth_entries(response.auth.unwrap_or_default(), label),
    })
}

/// The usable entries of an `auth` map, each under its key's pattern.
fn auth_entries(auth: BTreeMap<String, AuthEntry>, label: &str) -> Auth {
    auth.into_iter()
        .filter_map(|(key, entry)| {
            if entry.username.is_empty() && entry.password.is_empty() {
                return None;
            }
            match ImagePattern::parse_auth_key(&key) {
                Ok(pattern) => Some((
                    pattern,
                    Credential::new(entry.username, entry.password, label),
                )),
                Err(why) => {
                    tracing::warn!(plugin = %label, %why, "credential provider answered an auth key that is not an image pattern; ignored");
                    None
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::clock::ManualClock;

    const IMAGE: &str = "registry.example:5000/team/app";
    const REGISTRY: &str = "registry.example:5000";

    /// The tests' plugin (tests/data/credential-plugins), with `env`, counting its runs.
    struct Plugin {
        runs: tempfile::NamedTempFile,
        plugins: CredentialPlugins,
        clock: Arc<ManualClock>,
    }

    impl Plugin {
        fn new(default_cache: Duration, env: &[(&str, &str)]) -> Self {
            let runs = tempfile::NamedTempFile::new().unwrap();
            let mut all: Vec<(String, String)> = env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            all.push(("PLUGIN_RUNS".into(), runs.path().display().to_string()));
            let provider = Provider {
                name: "test-provider".into(),
                match_images: vec![ImagePattern::parse(REGISTRY).unwrap()],
                default_cache_duration: default_cache,
                api_version: "credentialprovider.kubelet.k8s.io/v1",
                program: concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/data/credential-plugins/credential-provider"
                )
                .into(),
                args: Vec::new(),
                env: all,
            };
            let clock = ManualClock::new();
            let plugins = CredentialPlugins::new(
                vec![provider],
                DockerHelpers::default(),
                Duration::from_secs(10),
                clock.clone(),
            );
            Self {
                runs,
                plugins,
                clock,
            }
        }

        async fn ask(&self, image: &str) -> Result<Vec<Credential>, PluginFailure> {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            self.plugins
                .provider_credentials(0, image, REGISTRY, deadline, None)
                .await
        }

        fn runs(&self) -> usize {
            std::fs::read_to_string(self.runs.path())
                .unwrap()
                .lines()
                .count()
        }
    }

    #[tokio::test]
    async fn answers_are_kept_for_their_cache_duration_by_their_key_type() {
        let plugin = Plugin::new(
            Duration::ZERO,
            &[
                ("PLUGIN_USER", "u"),
                ("PLUGIN_PASSWORD", "p"),
                ("PLUGIN_CACHE_KEY_TYPE", "Image"),
                ("PLUGIN_CACHE_DURATION", "10m0s"),
            ],
        );
        let found = plugin.ask(IMAGE).await.unwrap();
        assert_eq!((found[0].user(), found[0].secret()), ("u", "p"));
        assert_eq!(found[0].source(), "credential provider test-provider");
        plugin.ask(IMAGE).await.unwrap();
        assert_eq!(plugin.runs(), 1);
        // Another repository: another key.
        plugin.ask(&format!("{REGISTRY}/team/other")).await.unwrap();
        assert_eq!(plugin.runs(), 2);
        plugin.clock.advance(Duration::from_secs(599));
        plugin.ask(IMAGE).await.unwrap();
        assert_eq!(plugin.runs(), 2);
        plugin.clock.advance(Duration::from_secs(2));
        plugin.ask(IMAGE).await.unwrap();
        assert_eq!(plugin.runs(), 3);
    }

    #[tokio::test]
    async fn without_a_cache_duration_the_providers_default_holds() {
        let plugin = Plugin::new(
            Duration::from_secs(60),
            &[("PLUGIN_USER", "u"), ("PLUGIN_PASSWORD", "p")],
        );
        // Registry key type: every repository of the registry shares the answer.
        plugin.ask(IMAGE).await.unwrap();
        plugin.ask(&format!("{REGISTRY}/team/other")).await.unwrap();
        assert_eq!(plugin.runs(), 1);
        plugin.clock.advance(Duration::from_secs(61));
        plugin.ask(IMAGE).await.unwrap();
        assert_eq!(plugin.runs(), 2);
    }

    #[tokio::test]
    async fn failures_are_kept_briefly_and_never_show_the_secret() {
        let plugin = Plugin::new(
            Duration::from_secs(60),
            &[("PLUGIN_MODE", "fail"), ("PLUGIN_PASSWORD", "s3cr3t-pw")],
        );
        let failed = plugin.ask(IMAGE).await.unwrap_err();
        let shown = failed.to_string();
        assert!(
            shown.starts_with("credential provider test-provider failed: exit status 3: ")
                && shown.contains("AccessDenied"),
            "{shown}"
        );
        assert!(!shown.contains("s3cr3t-pw"), "{shown}");
        assert_eq!(plugin.ask(IMAGE).await.unwrap_err(), failed);
        assert_eq!(plugin.runs(), 1);
        plugin.clock.advance(Duration::from_secs(11));
        plugin.ask(IMAGE).await.unwrap_err();
        assert_eq!(plugin.runs(), 2);
    }

    #[tokio::test]
    async fn the_best_matching_auth_entry_comes_first() {
        let plugin = Plugin::new(
            Duration::from_secs(60),
            &[
                ("PLUGIN_USER", "u"),
                ("PLUGIN_PASSWORD", "p"),
                ("PLUGIN_AUTH_KEY", "registry.example:5000/other"),
            ],
        );
        // The only entry is for another path: no credential for this image.
        assert!(plugin.ask(IMAGE).await.unwrap().is_empty());
        let auth = auth_entries(
            [
                ("*.example:5000", "broad"),
                ("registry.example:5000/team", "team"),
                ("https://registry.example:5000/v2/", "host"),
            ]
            .into_iter()
            .map(|(k, u)| {
                (
                    k.to_owned(),
                    AuthEntry {
                        username: u.into(),
                        password: "p".into(),
                    },
                )
            })
            .collect(),
            "credential provider x",
        );
        let users: Vec<&str> = best_first(IMAGE, &auth)
            .into_iter()
            .map(Credential::user)
            .collect();
        assert_eq!(users, ["team", "host", "broad"]);
    }
}
