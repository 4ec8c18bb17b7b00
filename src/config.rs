//! Configuration: `tolerable.toml`, overridden key by key by `TOLERABLE_<KEY>` environment
//! variables, resolved once at start-up into a validated, immutable [`Config`]. A bad value stops
//! start-up with an error naming the key, where it was written (the variable, or the file) and
//! the reason; a key tolerable does not know, with the nearest one it does.
//!
//! [`RawConfig::default`] holds the defaults, the one copy: the shipped `tolerable.toml` writes
//! them out, and a test keeps the two equal.

mod source;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::mutate::arch::{self, KUBERNETES_ARCHITECTURES};
use crate::mutate::{
    OnLookupFailure, OnNoCommonArchitecture, Policy, Steering, TolerationOperator,
    TolerationTemplate, WeightedArchitecture, PREFERRED_WEIGHT,
};
use crate::registry::access::{AccessRules, LINK_LOCAL};
use crate::registry::cache::CacheSettings;
use crate::registry::client::TransportSettings;
use crate::registry::credentials::helper::DockerHelpers;
use crate::registry::credentials::normalize_registry_key;
use crate::registry::credentials::parse_docker_config;
use crate::registry::credentials::provider::{self, Provider};
use crate::registry::{BreakerSettings, CredentialStore, ResolverSettings, SharedCacheSettings};
use crate::server::tls::NameCheck;
use crate::server::ServerLimits;
pub use source::Origin;
use source::Sources;

pub(crate) const ENV_PREFIX: &str = "TOLERABLE";
/// The variable naming the config file; not itself a config key.
pub(crate) const CONFIG_PATH_ENV: &str = "TOLERABLE_CONFIG";
/// Read when neither `--config` nor `TOLERABLE_CONFIG` names a file, if it exists.
pub(crate) const DEFAULT_CONFIG_FILE: &str = "tolerable.toml";
/// The API server waits at most 30 s for a webhook; a lookup must fit well inside.
const MAX_LOOKUP_TIMEOUT: Duration = Duration::from_secs(30);
/// More threads than this is a typo, not a tuning.
const MAX_WORKER_THREADS: usize = 256;
/// More connections or requests than this is a typo: the fd limit is far lower.
const MAX_CONNECTIONS_LIMIT: usize = 1_000_000;
/// The API server's default webhook timeout: reading a request must end well before it.
const DEFAULT_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest idle timeout accepted.
const MAX_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read, or is not TOML.
    #[error("config file {path}: {reason}")]
    File { path: PathBuf, reason: String },
    /// A value that is not what its key takes.
    #[error("{origin}config key `{key}`: {reason}")]
    Key {
        key: String,
        origin: Origin,
        reason: String,
    },
    /// A value of the wrong type, as the deserializer words it (`… for key `x``).
    #[error("{origin}{message} for key `{key}`")]
    Type {
        key: String,
        origin: Origin,
        message: String,
    },
    /// A key tolerable does not know; `nearest` is the known one nearest to it, spelled as
    /// where it was written spells keys (a variable's name, or the file's key).
    #[error("{origin}unknown field `{key}`; did you mean {nearest}?")]
    UnknownKey {
        origin: Origin,
        key: String,
        nearest: String,
    },
    #[error("configuration: {0}")]
    Other(String),
}

impl ConfigError {
    fn key(key: &str, reason: impl Into<String>) -> Self {
        Self::Key {
            key: key.to_owned(),
            origin: Origin::Default,
            reason: reason.into(),
        }
    }

    /// The error with where its key was written.
    fn located(mut self, sources: &Sources) -> Self {
        if let Self::Key { key, origin, .. } | Self::Type { key, origin, .. } = &mut self {
            *origin = sources.origin_of(key);
        }
        self
    }

    /// config-rs's error: a value's type error keeps its key, to be located.
    fn from_merge(e: config::ConfigError) -> Self {
        let (key, message) = match &e {
            config::ConfigError::Type {
                key: Some(key),
                unexpected,
                expected,
                ..
            } => (
                key,
                format!("invalid type: {unexpected}, expected {expected}"),
            ),
            config::ConfigError::At {
                key: Some(key),
                error,
                ..
            } => (key, error.to_string()),
            _ => return Self::Other(e.to_string()),
        };
        Self::Type {
            key: key.clone(),
            origin: Origin::Default,
            message,
        }
    }
}

/// A key that takes one of a set of words, spelled as serde's derive spells the enum's variants
/// (`rename_all`). A word outside the set is kept rather than refused while deserializing, so
/// validation reports it the way it reports every bad value: `config key `steering`: "sideways"
/// is not off, node_selector or node_affinity`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Word<T> {
    Known(T),
    Unknown {
        text: String,
        /// The words the enum takes.
        expected: &'static [&'static str],
    },
}

impl<T: DeserializeOwned> Word<T> {
    /// `text`, trimmed, as one of `T`'s words.
    fn parse(text: &str) -> Self {
        let text = text.trim();
        let words = serde::de::value::StrDeserializer::<UnknownWord>::new(text);
        match T::deserialize(words) {
            Ok(word) => Self::Known(word),
            Err(UnknownWord(expected)) => Self::Unknown {
                text: text.to_owned(),
                expected,
            },
        }
    }

    fn get(self, key: &str) -> Result<T, ConfigError> {
        match self {
            Self::Known(word) => Ok(word),
            Self::Unknown { text, expected } => {
                let words: Vec<&str> = expected
                    .iter()
                    .map(|w| if w.is_empty() { "empty" } else { w })
                    .collect();
                let listed = match words.split_last() {
                    Some((last, [])) => (*last).to_owned(),
                    Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                    None => "known".to_owned(),
                };
                Err(ConfigError::key(key, format!("{text:?} is not {listed}")))
            }
        }
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Word<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Self::parse(&String::deserialize(deserializer)?))
    }
}

/// Why serde's derive refused a word: the words it takes.
#[derive(Debug)]
struct UnknownWord(&'static [&'static str]);

impl std::fmt::Display for UnknownWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not one of {:?}", self.0)
    }
}

impl std::error::Error for UnknownWord {}

impl serde::de::Error for UnknownWord {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        Self(&[])
    }

    fn unknown_variant(_: &str, expected: &'static [&'static str]) -> Self {
        Self(expected)
    }
}

/// Deserialize for enums of other modules through a mirror deriving it with
/// `#[serde(remote = …)]`: the words live here, with the config, and the core stays free of
/// serde.
macro_rules! words_of {
    ($($mirror:ident => $remote:ty),* $(,)?) => {$(
        impl<'de> Deserialize<'de> for $remote {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                $mirror::deserialize(d)
            }
        }
    )*};
}

/// The words of the core's enums and of [`NameCheck`], mirrored for `#[serde(remote)]`.
mod words {
    use super::*;

    #[derive(Deserialize)]
    #[serde(remote = "Steering", rename_all = "snake_case")]
    pub(crate) enum SteeringWords {
        Off,
        NodeSelector,
        NodeAffinity,
    }

    #[derive(Deserialize)]
    #[serde(remote = "OnNoCommonArchitecture", rename_all = "snake_case")]
    pub(crate) enum OnNoCommonArchitectureWords {
        Deny,
        Warn,
    }

    #[derive(Deserialize)]
    #[serde(remote = "OnLookupFailure", rename_all = "snake_case")]
    pub(crate) enum OnLookupFailureWords {
        Allow,
        Deny,
    }

    #[derive(Deserialize)]
    #[serde(remote = "TolerationOperator")]
    pub(crate) enum TolerationOperatorWords {
        Equal,
        Exists,
    }

    #[derive(Deserialize)]
    #[serde(remote = "NameCheck", rename_all = "snake_case")]
    pub(crate) enum NameCheckWords {
        Refuse,
        Warn,
    }
}

words_of!(
    SteeringWords => Steering,
    OnNoCommonArchitectureWords => OnNoCommonArchitecture,
    OnLookupFailureWords => OnLookupFailure,
    TolerationOperatorWords => TolerationOperator,
    NameCheckWords => NameCheck,
);
use words::*;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogFormat {
    #[default]
    Text,
    Json,
}

/// A taint's effect a toleration matches; empty: every effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
    #[serde(rename = "")]
    Any,
}

impl TaintEffect {
    fn as_str(self) -> &'static str {
        match self {
            Self::NoSchedule => "NoSchedule",
            Self::PreferNoSchedule => "PreferNoSchedule",
            Self::NoExecute => "NoExecute",
            Self::Any => "",
        }
    }
}

/// The file and environment as written, before validation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawConfig {
    ssl_cert_path: Option<PathBuf>,
    ssl_key_path: Option<PathBuf>,
    listen_addr: String,
    metrics_addr: Option<String>,
    supported_architectures: List,
    tolerations: RawTolerations,
    architecture_tolerations: BTreeMap<String, RawTemplates>,
    skip_namespaces: List,
    steering: Word<Steering>,
    preferred_architecture: Option<RawPreference>,
    on_no_common_architecture: Word<OnNoCommonArchitecture>,
    on_lookup_failure: Word<OnLookupFailure>,
    max_containers_per_pod: usize,
    max_images_per_pod: usize,
    enforce: bool,
    read_pull_secrets: bool,
    watch_nodes: bool,
    default_architectures: List,
    manage_node_taints: bool,
    log_level: String,
    log_format: Word<LogFormat>,
    worker_threads: usize,
    max_connections: usize,
    /// Unset: half of `max_connections`.
    max_connections_per_peer: Option<usize>,
    max_requests_in_flight: usize,
    request_read_timeout: String,
    connection_idle_timeout: String,
    tls_reload_name_check: Word<NameCheck>,
    registry_credential_path: Option<PathBuf>,
    docker_config_path: Option<PathBuf>,
    credential_provider_config: Option<PathBuf>,
    credential_provider_bin_dir: Option<PathBuf>,
    registry_ca_path: Option<PathBuf>,
    insecure_registries: List,
    registry_mirrors: TextMap,
    lookup_timeout: String,
    registry_connect_timeout: String,
    cache_tag_ttl: String,
    cache_digest_ttl: String,
    cache_failure_ttl: String,
    cache_stale_if_error: String,
    cache_max_entries: u64,
    circuit_breaker_failures: u32,
    circuit_breaker_cooldown: String,
    registry_allowlist: List,
    registry_denylist: List,
    cache_url: String,
    cache_password_file: Option<PathBuf>,
    cache_password: Option<Password>,
    cache_ca_path: Option<PathBuf>,
}

/// The shared cache's password as written (only an environment variable may write it): never
/// shown, not even by `Debug`.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
struct Password(String);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Default for RawConfig {
    /// The defaults: `tolerable.toml` writes each of them out.
    fn default() -> Self {
        Self {
            ssl_cert_path: None,
            ssl_key_path: None,
            listen_addr: "0.0.0.0:8443".into(),
            metrics_addr: None,
            supported_architectures: List(vec!["arm64".into()]),
            tolerations: RawTolerations::default(),
            architecture_tolerations: BTreeMap::new(),
            skip_namespaces: List(vec!["kube-system".into()]),
            steering: Word::Known(Steering::NodeAffinity),
            preferred_architecture: None,
            on_no_common_architecture: Word::Known(OnNoCommonArchitecture::Deny),
            on_lookup_failure: Word::Known(OnLookupFailure::Allow),
            max_containers_per_pod: 1000,
            max_images_per_pod: 100,
            enforce: true,
            read_pull_secrets: true,
            watch_nodes: true,
            default_architectures: List(vec!["amd64".into()]),
            manage_node_taints: false,
            log_level: "info".into(),
            log_format: Word::Known(LogFormat::Text),
            worker_threads: 0,
            max_connections: 1000,
            max_connections_per_peer: None,
            max_requests_in_flight: 256,
            request_read_timeout: "5s".into(),
            connection_idle_timeout: "120s".into(),
            tls_reload_name_check: Word::Known(NameCheck::Refuse),
            registry_credential_path: None,
            docker_config_path: None,
            credential_provider_config: None,
            credential_provider_bin_dir: None,
            registry_ca_path: None,
            insecure_registries: List::default(),
            registry_mirrors: TextMap::default(),
            lookup_timeout: "4s".into(),
            registry_connect_timeout: "2s".into(),
            cache_tag_ttl: "5m".into(),
            cache_digest_ttl: "24h".into(),
            cache_failure_ttl: "10s".into(),
            cache_stale_if_error: "1h".into(),
            cache_max_entries: 20_000,
            circuit_breaker_failures: 5,
            circuit_breaker_cooldown: "30s".into(),
            registry_allowlist: List::default(),
            registry_denylist: List(LINK_LOCAL.map(String::from).to_vec()),
            cache_url: String::new(),
            cache_password_file: None,
            cache_password: None,
            cache_ca_path: None,
        }
    }
}

/// `[tolerations]`: the toleration added for each tolerated architecture.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawTolerations {
    key: String,
    operator: Word<TolerationOperator>,
    effect: Word<TaintEffect>,
    toleration_seconds: Option<i64>,
}

impl Default for RawTolerations {
    fn default() -> Self {
        Self {
            key: "kubernetes.io/arch".into(),
            operator: Word::Known(TolerationOperator::Equal),
            effect: Word::Known(TaintEffect::NoSchedule),
            toleration_seconds: None,
        }
    }
}

/// `[architecture_tolerations.<arch>]`: one toleration (a table), several (an array of
/// tables), or, in an environment variable, `key[=value][:effect], …` (no value: the
/// architecture; value `*`: operator Exists).
#[derive(Clone, Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a toleration table, a list of them, or \"key=value:effect, …\""
)]
enum RawTemplates {
    Text(String),
    One(RawTemplate),
    Many(Vec<RawTemplate>),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTemplate {
    key: String,
    #[serde(default)]
    operator: Option<Word<TolerationOperator>>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    effect: Option<Word<TaintEffect>>,
    #[serde(default, deserialize_with = "number_or_text")]
    toleration_seconds: Option<i64>,
}

/// A number as TOML writes it, or as an environment variable does (text): config-rs hands
/// variables over as strings, and an untagged enum cannot convert them itself.
fn number_or_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Number(i64),
        Text(String),
    }
    match Option::<Raw>::deserialize(d)? {
        None => Ok(None),
        Some(Raw::Number(n)) => Ok(Some(n)),
        Some(Raw::Text(t)) => t
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("{t:?} is not a whole number"))),
    }
}

impl RawTemplates {
    fn into_list(self, key: &str) -> Result<Vec<RawTemplate>, ConfigError> {
        match self {
            Self::One(one) => Ok(vec![one]),
            Self::Many(many) => Ok(many),
            Self::Text(text) => text
                .split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .map(|item| RawTemplate::from_text(key, item))
                .collect(),
        }
    }
}

impl RawTemplate {
    /// One `key[=value][:effect]` item of `key`'s text form.
    fn from_text(key: &str, item: &str) -> Result<Self, ConfigError> {
        let (key_value, effect) = match item.rsplit_once(':') {
            Some((kv, effect)) => (kv, Some(Word::parse(effect))),
            None => (item, None),
        };
        let (taint_key, value) = match key_value.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (key_value, None),
        };
        if taint_key.is_empty() {
            return Err(ConfigError::key(
                key,
                format!("{item:?} is not key[=value][:effect]"),
            ));
        }
        let operator = if value == Some("*") {
            TolerationOperator::Exists
        } else {
            TolerationOperator::Equal
        };
        Ok(Self {
            key: taint_key.to_owned(),
            operator: Some(Word::Known(operator)),
            value: value.filter(|v| *v != "*").map(str::to_owned),
            effect,
            toleration_seconds: None,
        })
    }
}

/// `preferred_architecture`: one architecture (weight 50), a list of
/// `{ architecture, weight }` tables, or, in an environment variable, `arm64=80, amd64=20`.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "an architecture, or a list of { architecture, weight }"
)]
enum RawPreference {
    Text(String),
    Weighted(Vec<RawWeighted>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWeighted {
    architecture: String,
    weight: i64,
}

/// A list written as a TOML array or, in an environment variable, as `a, b, c`. Items are
/// trimmed and empty items dropped.
#[derive(Debug, Default)]
struct List(Vec<String>);

impl<'de> Deserialize<'de> for List {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged, expecting = "a list of strings or a comma-separated string")]
        enum Raw {
            One(String),
            Many(Vec<String>),
        }
        let items = match Raw::deserialize(deserializer)? {
            Raw::One(text) => text.split(',').map(str::to_owned).collect(),
            Raw::Many(items) => items,
        };
        Ok(Self(
            items
                .into_iter()
                .map(|item| item.trim().to_owned())
                .filter(|item| !item.is_empty())
                .collect(),
        ))
    }
}

/// A map of names to strings written as a TOML table or, in an environment variable (whose
/// name cannot hold a key such as `docker.io`), as `name=value, name=value`. Items are trimmed
/// and empty items dropped.
#[derive(Debug, Default)]
struct TextMap(BTreeMap<String, String>);

impl<'de> Deserialize<'de> for TextMap {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged, expecting = "a map, or \"name=value, …\"")]
        enum Raw {
            Text(String),
            Table(BTreeMap<String, String>),
        }
        let text = match Raw::deserialize(deserializer)? {
            Raw::Table(table) => return Ok(Self(table)),
            Raw::Text(text) => text,
        };
        let mut map = BTreeMap::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match item.split_once('=') {
                Some((name, value)) if !name.trim().is_empty() => {
                    map.insert(name.trim().to_owned(), value.trim().to_owned())
                }
                // Ends as the type errors do, so that it reads "… expected a map for key `x`".
                _ => {
                    return Err(serde::de::Error::custom(format!(
                    "{item:?} is not name=value (in one string: \"name=value, …\"); expected a map"
                )))
                }
            };
        }
        Ok(Self(map))
    }
}

/// Validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Serving certificate and key; `None` makes `serve` generate a self-signed pair.
    pub tls_files: Option<(PathBuf, PathBuf)>,
    pub listen_addr: SocketAddr,
    /// Where `/metrics` is served on its own, over plain HTTP; `None`: on the webhook port.
    pub metrics_addr: Option<SocketAddr>,
    pub policy: Policy,
    /// Read each Pod's image pull secrets (and its ServiceAccount's) from the API server.
    pub read_pull_secrets: bool,
    /// Watch Nodes: also tolerate taints the templates do not, count the architectures seen
    /// when deciding whether to steer; `/readyz` waits for the first sync.
    pub watch_nodes: bool,
    /// Node tainting (`tolerable nodes`, `manage_node_taints`): default architectures stay
    /// untainted, supported ones get their first template's taint, others are left alone.
    pub(crate) taint_policy: crate::taints::TaintPolicy,
    /// `serve` keeps new nodes tainted as they join.
    pub manage_node_taints: bool,
    pub(crate) log_level: String,
    pub(crate) log_format: LogFormat,
    /// Threads answering requests; `None`: one per CPU available to the process (a container's
    /// CPU limit included).
    pub(crate) worker_threads: Option<usize>,
    /// Connection and request limits of `serve` (see [`ServerLimits`]).
    pub server_limits: ServerLimits,
    /// What a certificate reload does with a certificate that drops a DNS name.
    pub(crate) tls_reload_name_check: NameCheck,
    pub(crate) registry_credential_path: Option<PathBuf>,
    pub(crate) docker_config_path: Option<PathBuf>,
    /// Where the credential plugins are: the providers' and, before `PATH`, Docker's helpers.
    pub(crate) credential_provider_bin_dir: Option<PathBuf>,
    /// Kubelet credential provider plugins (`credential_provider_config`), in the file's order.
    pub(crate) credential_providers: Vec<Provider>,
    /// Why providers of the file were skipped (logged when the credentials are assembled).
    pub(crate) credential_provider_warnings: Vec<String>,
    pub resolver: ResolverSettings,
}

impl Config {
    /// Reads the config file (if any) and overlays `env` (the process environment in `main`; a
    /// plain map in tests, so no test mutates the process environment).
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let file = file.map(read_file).transpose()?;
        // Empty variables are left out, as if unset.
        let env: HashMap<String, String> = env
            .into_iter()
            .filter(|(k, _)| is_config_variable(k))
            .map(|(k, v)| (k, v.trim().to_owned()))
            .filter(|(_, v)| !v.is_empty())
            .collect();
        let sources = Sources::new(
            file.as_ref()
                .map(|(path, _, table)| (path.as_path(), table)),
            env.keys(),
        );
        if let Some(unknown) = sources.unknown_key() {
            return Err(unknown);
        }
        let mut builder = config::Config::builder();
        if let Some((_, text, _)) = &file {
            builder = builder.add_source(config::File::from_str(text, config::FileFormat::Toml));
        }
        // Values stay strings (`try_parsing(false)`): config-rs would turn `386` into a number
        // and split lists without trimming. [`List`] splits and trims them itself.
        let environment = config::Environment::with_prefix(ENV_PREFIX)
            .prefix_separator("_")
            .separator("__")
            .try_parsing(false)
            .source(Some(env));
        let raw: RawConfig = builder
            .add_source(environment)
            .build()
            .and_then(config::Config::try_deserialize)
            .map_err(|e| ConfigError::from_merge(e).located(&sources))?;
        if raw.cache_password.is_some() {
            if let origin @ Origin::File(_) = sources.origin_of("cache_password") {
                return Err(ConfigError::Key {
                    key: "cache_password".into(),
                    origin,
                    reason: "a password does not belong in the config file: set TOLERABLE_CACHE_PASSWORD (from a Secret) or cache_password_file".into(),
                });
            }
        }
        Self::validate(raw).map_err(|e| e.located(&sources))
    }

    /// Reads the config the CLI names: `--config` / `TOLERABLE_CONFIG`, else `./tolerable.toml`
    /// when present, else defaults; then the `TOLERABLE_*` environment.
    pub(crate) fn from_process(explicit: Option<&Path>) -> Result<Self, ConfigError> {
        let default = Path::new(DEFAULT_CONFIG_FILE);
        let file = explicit.or_else(|| default.is_file().then_some(default));
        Self::load(file, std::env::vars())
    }

    /// Each section checked by its own function, in the order of `tolerable.toml`'s sections.
    fn validate(raw: RawConfig) -> Result<Self, ConfigError> {
        tracing_subscriber::EnvFilter::try_new(&raw.log_level)
            .map_err(|e| ConfigError::key("log_level", format!("{:?}: {e}", raw.log_level)))?;
        let log_format = raw.log_format.clone().get("log_format")?;
        let worker_threads = validate_worker_threads(raw.worker_threads)?;
        let server_limits = validate_server_limits(&raw)?;
        let tls_reload_name_check = raw
            .tls_reload_name_check
            .clone()
            .get("tls_reload_name_check")?;
        let resolver = validate_registries(&raw)?;
        validate_credential_paths(&raw)?;
        let (credential_providers, credential_provider_warnings) =
            validate_credential_providers(&raw)?;
        let tls_files = validate_tls_files(&raw)?;
        let (listen_addr, metrics_addr) = validate_addresses(&raw)?;
        let policy = validate_policy(&raw)?;
        Ok(Self {
            tls_files,
            listen_addr,
            metrics_addr,
            taint_policy: crate::taints::TaintPolicy::from_policy(&policy),
            policy,
            read_pull_secrets: raw.read_pull_secrets,
            watch_nodes: raw.watch_nodes,
            manage_node_taints: raw.manage_node_taints,
            log_level: raw.log_level,
            log_format,
            worker_threads,
            server_limits,
            tls_reload_name_check,
            registry_credential_path: raw.registry_credential_path,
            docker_config_path: raw.docker_config_path,
            credential_provider_bin_dir: raw.credential_provider_bin_dir,
            credential_providers,
            credential_provider_warnings,
            resolver,
        })
    }

    /// The registry credentials the config points at (files, then the Docker config's `auths`),
    /// and the Docker config's credential helpers, each found in `credential_provider_bin_dir`
    /// or on `PATH`.
    pub(crate) fn credentials(&self) -> Result<(CredentialStore, DockerHelpers), ConfigError> {
        let mut store = match &self.registry_credential_path {
            Some(dir) => CredentialStore::load_dir(dir)
                .map_err(|e| ConfigError::key("registry_credential_path", e.to_string()))?,
            None => CredentialStore::default(),
        };
        let mut helpers = DockerHelpers::default();
        if let Some(path) = &self.docker_config_path {
            let key = "docker_config_path";
            let shown = path.display().to_string();
            let json =
                std::fs::read(path).map_err(|e| ConfigError::key(key, format!("{shown}: {e}")))?;
            helpers = DockerHelpers::from_docker_config(&json, &self.helper_dirs())
                .map_err(|why| ConfigError::key(key, format!("{shown}: {why}")))?;
            let (entries, warnings) = parse_docker_config(&json, &shown)
                .map_err(|e| ConfigError::key(key, e.to_string()))?;
            // A registry with a helper of its own is asked only through it, as Docker does.
            for (registry, credential) in entries {
                if !helpers.has_own(&registry) {
                    store.add(&registry, credential);
                }
            }
            for warning in warnings {
                tracing::warn!("{warning}");
            }
        }
        for warning in &self.credential_provider_warnings {
            tracing::warn!("{warning}");
        }
        for provider in &self.credential_providers {
            tracing::info!(
                provider = %provider.name,
                match_images = ?provider.match_images.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "credential provider plugin configured"
            );
        }
        Ok((store, helpers))
    }

    /// Where Docker credential helpers are looked for: `credential_provider_bin_dir`, then
    /// `PATH`.
    fn helper_dirs(&self) -> Vec<PathBuf> {
        self.credential_provider_bin_dir
            .iter()
            .cloned()
            .chain(std::env::split_paths(
                &std::env::var_os("PATH").unwrap_or_default(),
            ))
            .collect()
    }
}

/// The file's path, text and table: its keys are checked and located before config-rs merges
/// the text with the environment.
fn read_file(path: &Path) -> Result<(PathBuf, String, toml::Table), ConfigError> {
    let bad = |reason: String| ConfigError::File {
        path: path.to_owned(),
        reason,
    };
    if !path.is_file() {
        return Err(bad("not found or not a file".into()));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let table = text
        .parse()
        .map_err(|e: toml::de::Error| bad(e.to_string()))?;
    Ok((path.to_owned(), text, table))
}

fn validate_worker_threads(worker_threads: usize) -> Result<Option<usize>, ConfigError> {
    if worker_threads > MAX_WORKER_THREADS {
        return Err(ConfigError::key(
            "worker_threads",
            format!("{worker_threads} is more than {MAX_WORKER_THREADS} (0: one per CPU)"),
        ));
    }
    Ok((worker_threads > 0).then_some(worker_threads))
}

/// The abuse limits of `serve`: every bound is checked, so a typo cannot switch one off.
fn validate_server_limits(raw: &RawConfig) -> Result<ServerLimits, ConfigError> {
    let max_connections_per_peer = raw
        .max_connections_per_peer
        .unwrap_or((raw.max_connections / 2).max(1));
    for (key, n) in [
        ("max_connections", raw.max_connections),
        ("max_connections_per_peer", max_connections_per_peer),
        ("max_requests_in_flight", raw.max_requests_in_flight),
    ] {
        if !(1..=MAX_CONNECTIONS_LIMIT).contains(&n) {
            return Err(ConfigError::key(
                key,
                format!("{n} is not between 1 and {MAX_CONNECTIONS_LIMIT}"),
            ));
        }
    }
    let request_read_timeout = parse_duration("request_read_timeout", &raw.request_read_timeout)?;
    if request_read_timeout.is_zero() || request_read_timeout >= DEFAULT_WEBHOOK_TIMEOUT {
        return Err(ConfigError::key(
            "request_read_timeout",
            "must be above 0 and below 10s (the API server's default webhook timeout)",
        ));
    }
    let connection_idle_timeout =
        parse_duration("connection_idle_timeout", &raw.connection_idle_timeout)?;
    if connection_idle_timeout.is_zero() || connection_idle_timeout > MAX_IDLE_TIMEOUT {
        return Err(ConfigError::key(
            "connection_idle_timeout",
            "must be above 0 and at most 1h",
        ));
    }
    if max_connections_per_peer > raw.max_connections {
        return Err(ConfigError::key(
            "max_connections_per_peer",
            format!(
                "{max_connections_per_peer} is above max_connections ({})",
                raw.max_connections
            ),
        ));
    }
    Ok(ServerLimits {
        max_connections: raw.max_connections,
        max_connections_per_peer,
        max_requests_in_flight: raw.max_requests_in_flight,
        request_read_timeout,
        connection_idle_timeout,
    })
}

/// The registry section: timeouts, cache, breaker, then the hosts.
fn validate_registries(raw: &RawConfig) -> Result<ResolverSettings, ConfigError> {
    let lookup_timeout = parse_duration("lookup_timeout", &raw.lookup_timeout)?;
    if lookup_timeout.is_zero() || lookup_timeout > MAX_LOOKUP_TIMEOUT {
        return Err(ConfigError::key(
            "lookup_timeout",
            "must be above 0 and at most 30s (the API server's longest webhook timeout)",
        ));
    }
    let connect_timeout =
        parse_duration("registry_connect_timeout", &raw.registry_connect_timeout)?;
    if connect_timeout.is_zero() {
        return Err(ConfigError::key(
            "registry_connect_timeout",
            "must be above 0",
        ));
    }
    let cache = validate_cache(raw)?;
    let shared_cache = validate_shared_cache(raw)?;
    let breaker = validate_breaker(raw)?;
    let insecure_registries = validate_insecure_registries(&raw.insecure_registries)?;
    let access = AccessRules::new(&raw.registry_allowlist.0, &raw.registry_denylist.0)
        .map_err(|e| ConfigError::key(e.key, e.reason))?;
    let mirrors = validate_mirrors(&raw.registry_mirrors)?;
    let extra_roots_pem = match &raw.registry_ca_path {
        Some(path) => vec![read_ca_bundle("registry_ca_path", path)?],
        None => Vec::new(),
    };
    Ok(ResolverSettings {
        transport: TransportSettings {
            connect_timeout,
            read_timeout: lookup_timeout,
            insecure_registries,
            extra_roots_pem,
            access,
        },
        mirrors,
        lookup_timeout,
        cache,
        breaker,
        shared_cache,
    })
}

/// `cache_url` and its password (a file, or `TOLERABLE_CACHE_PASSWORD`) and CA. Errors never
/// repeat the password, in the URL or elsewhere.
fn validate_shared_cache(raw: &RawConfig) -> Result<Option<SharedCacheSettings>, ConfigError> {
    if raw.cache_url.trim().is_empty() {
        let stray = [
            ("cache_password_file", raw.cache_password_file.is_some()),
            ("cache_password", raw.cache_password.is_some()),
            ("cache_ca_path", raw.cache_ca_path.is_some()),
        ];
        return match stray.into_iter().find(|(_, set)| *set) {
            Some((key, _)) => Err(ConfigError::key(key, "is set, but cache_url is not")),
            None => Ok(None),
        };
    }
    let password = match (&raw.cache_password_file, &raw.cache_password) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::key(
                "cache_password_file",
                "and cache_password are both set: give the password once",
            ))
        }
        (Some(path), None) => Some(read_password(path)?),
        (None, password) => password.clone().map(|p| p.0),
    };
    let ca_pem = match &raw.cache_ca_path {
        Some(path) => Some(read_ca_bundle("cache_ca_path", path)?),
        None => None,
    };
    let settings = SharedCacheSettings::new(&raw.cache_url, password, ca_pem)
        .map_err(|reason| ConfigError::key("cache_url", reason))?;
    settings
        .check()
        .map_err(|reason| ConfigError::key("cache_url", reason))?;
    Ok(Some(settings))
}

/// The password in `path` (one line; surrounding whitespace dropped), read once at start-up.
fn read_password(path: &Path) -> Result<String, ConfigError> {
    let key = "cache_password_file";
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::key(key, format!("{}: {e}", path.display())))?;
    let password = text.trim();
    if password.is_empty() {
        return Err(ConfigError::key(
            key,
            format!("{} is empty", path.display()),
        ));
    }
    Ok(password.to_owned())
}

fn validate_cache(raw: &RawConfig) -> Result<CacheSettings, ConfigError> {
    if raw.cache_max_entries == 0 {
        return Err(ConfigError::key("cache_max_entries", "must be at least 1"));
    }
    Ok(CacheSettings {
        tag_ttl: parse_duration("cache_tag_ttl", &raw.cache_tag_ttl)?,
        digest_ttl: parse_duration("cache_digest_ttl", &raw.cache_digest_ttl)?,
        failure_ttl: parse_duration("cache_failure_ttl", &raw.cache_failure_ttl)?,
        stale_ttl: parse_duration("cache_stale_if_error", &raw.cache_stale_if_error)?,
        max_entries: raw.cache_max_entries,
    })
}

fn validate_breaker(raw: &RawConfig) -> Result<BreakerSettings, ConfigError> {
    let breaker = BreakerSettings {
        failures: raw.circuit_breaker_failures,
        cooldown: parse_duration("circuit_breaker_cooldown", &raw.circuit_breaker_cooldown)?,
    };
    if breaker.failures > 0 && breaker.cooldown.is_zero() {
        return Err(ConfigError::key(
            "circuit_breaker_cooldown",
            "must be above 0 (set circuit_breaker_failures = 0 to turn the breaker off)",
        ));
    }
    Ok(breaker)
}

/// Host names ignore case: `Registry.Example.com:5000` is the host images call
/// `registry.example.com:5000`.
fn validate_insecure_registries(hosts: &List) -> Result<Vec<String>, ConfigError> {
    hosts
        .0
        .iter()
        .map(|r| {
            crate::registry::reference::validate_host(r)
                .map(|()| r.to_ascii_lowercase())
                .map_err(|why| ConfigError::key("insecure_registries", format!("{r:?}: {why}")))
        })
        .collect()
}

fn validate_mirrors(raw: &TextMap) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut mirrors = BTreeMap::new();
    for (registry, mirror) in &raw.0 {
        let key = format!("registry_mirrors.{registry}");
        let mirror = mirror.trim().to_owned();
        crate::registry::reference::validate_host(&mirror)
            .map_err(|why| ConfigError::key(&key, format!("mirror {mirror:?}: {why}")))?;
        mirrors.insert(normalize_registry_key(registry), mirror);
    }
    Ok(mirrors)
}

fn validate_credential_paths(raw: &RawConfig) -> Result<(), ConfigError> {
    for (key, path) in [
        ("registry_credential_path", &raw.registry_credential_path),
        ("docker_config_path", &raw.docker_config_path),
    ] {
        if let Some(path) = path {
            if !path.exists() {
                return Err(ConfigError::key(
                    key,
                    format!("{} does not exist", path.display()),
                ));
            }
        }
    }
    Ok(())
}

/// The kubelet's CredentialProviderConfig, whose plugins are in `credential_provider_bin_dir`
/// (which may also hold Docker credential helpers on its own).
fn validate_credential_providers(
    raw: &RawConfig,
) -> Result<(Vec<Provider>, Vec<String>), ConfigError> {
    const CONFIG: &str = "credential_provider_config";
    const BIN_DIR: &str = "credential_provider_bin_dir";
    if let Some(bin_dir) = &raw.credential_provider_bin_dir {
        if !bin_dir.is_dir() {
            return Err(ConfigError::key(
                BIN_DIR,
                format!("{} is not a directory", bin_dir.display()),
            ));
        }
    }
    match (
        &raw.credential_provider_config,
        &raw.credential_provider_bin_dir,
    ) {
        (Some(config), Some(bin_dir)) => {
            provider::load(config, bin_dir).map_err(|why| ConfigError::key(CONFIG, why))
        }
        (Some(_), None) => Err(ConfigError::key(
            BIN_DIR,
            format!("must be set with {CONFIG} (the directory of the plugins it names)"),
        )),
        (None, _) => Ok((Vec::new(), Vec::new())),
    }
}

fn validate_tls_files(raw: &RawConfig) -> Result<Option<(PathBuf, PathBuf)>, ConfigError> {
    match (&raw.ssl_cert_path, &raw.ssl_key_path) {
        (Some(cert), Some(key)) => {
            for (k, path) in [("ssl_cert_path", cert), ("ssl_key_path", key)] {
                if !path.exists() {
                    return Err(ConfigError::key(
                        k,
                        format!("{} does not exist", path.display()),
                    ));
                }
            }
            Ok(Some((cert.clone(), key.clone())))
        }
        (Some(_), None) => Err(ConfigError::key(
            "ssl_key_path",
            "must be set with ssl_cert_path",
        )),
        (None, Some(_)) => Err(ConfigError::key(
            "ssl_cert_path",
            "must be set with ssl_key_path",
        )),
        (None, None) => Ok(None),
    }
}

fn validate_addresses(raw: &RawConfig) -> Result<(SocketAddr, Option<SocketAddr>), ConfigError> {
    let address = |key: &str, text: &str, example: &str| {
        text.trim().parse::<SocketAddr>().map_err(|_| {
            ConfigError::key(
                key,
                format!("{text:?} is not an address:port (e.g. {example})"),
            )
        })
    };
    let listen_addr = address("listen_addr", &raw.listen_addr, "0.0.0.0:8443")?;
    let metrics_addr = match raw.metrics_addr.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(text) => Some(address("metrics_addr", text, "0.0.0.0:9090")?),
    };
    if metrics_addr.is_some_and(|m| m.port() == listen_addr.port() && m.port() != 0) {
        return Err(ConfigError::key(
            "metrics_addr",
            "must use another port than listen_addr",
        ));
    }
    Ok((listen_addr, metrics_addr))
}

/// An architecture name as nodes label them (`amd64`, `arm64`, `s390x`, `ppc64le`, `386`, …):
/// another spelling would match no node (or, as a default architecture, leave every node of the
/// real one to be tainted).
fn validate_arch(key: &str, arch: &str) -> Result<String, ConfigError> {
    if KUBERNETES_ARCHITECTURES.contains(&arch) {
        return Ok(arch.to_owned());
    }
    let reason = match arch::goarch_for(&arch.to_ascii_lowercase()) {
        Some(goarch) => format!(
            "{arch:?} is not a Kubernetes architecture name; nodes label it kubernetes.io/arch={goarch} (use {goarch:?})"
        ),
        None => format!(
            "{arch:?} is not a Kubernetes architecture name (one of {})",
            KUBERNETES_ARCHITECTURES.join(", ")
        ),
    };
    Err(ConfigError::key(key, reason))
}

fn validate_arch_list(key: &str, list: &List) -> Result<BTreeSet<String>, ConfigError> {
    list.0.iter().map(|a| validate_arch(key, a)).collect()
}

/// The policy section: architectures, tolerations, steering, and what to do when in doubt.
fn validate_policy(raw: &RawConfig) -> Result<Policy, ConfigError> {
    let supported_architectures =
        validate_arch_list("supported_architectures", &raw.supported_architectures)?;
    let default_architectures =
        validate_arch_list("default_architectures", &raw.default_architectures)?;
    if default_architectures.is_empty() {
        return Err(ConfigError::key(
            "default_architectures",
            "name at least one architecture (tainting every node would leave no untainted pool)",
        ));
    }
    let toleration = validate_default_toleration(&raw.tolerations)?;
    let architecture_tolerations =
        validate_architecture_tolerations(&raw.architecture_tolerations, &supported_architectures)?;
    Ok(Policy {
        supported_architectures,
        default_architectures,
        toleration,
        architecture_tolerations,
        steering: raw.steering.clone().get("steering")?,
        preferred_architectures: validate_preference(raw.preferred_architecture.as_ref())?,
        on_no_common_architecture: raw
            .on_no_common_architecture
            .clone()
            .get("on_no_common_architecture")?,
        on_lookup_failure: raw.on_lookup_failure.clone().get("on_lookup_failure")?,
        skip_namespaces: raw.skip_namespaces.0.iter().cloned().collect(),
        max_containers_per_pod: at_least_one("max_containers_per_pod", raw.max_containers_per_pod)?,
        max_images_per_pod: at_least_one("max_images_per_pod", raw.max_images_per_pod)?,
        enforce: raw.enforce,
    })
}

fn at_least_one(key: &str, n: usize) -> Result<usize, ConfigError> {
    if n == 0 {
        return Err(ConfigError::key(key, "must be at least 1"));
    }
    Ok(n)
}

/// `[tolerations]`: a template whose value is the architecture.
fn validate_default_toleration(raw: &RawTolerations) -> Result<TolerationTemplate, ConfigError> {
    validate_template(
        "tolerations",
        RawTemplate {
            key: raw.key.clone(),
            operator: Some(raw.operator.clone()),
            value: None,
            effect: Some(raw.effect.clone()),
            toleration_seconds: raw.toleration_seconds,
        },
    )
}

/// `[architecture_tolerations.<arch>]`: only for supported architectures, at least one each.
fn validate_architecture_tolerations(
    raw: &BTreeMap<String, RawTemplates>,
    supported_architectures: &BTreeSet<String>,
) -> Result<BTreeMap<String, Vec<TolerationTemplate>>, ConfigError> {
    let mut out = BTreeMap::new();
    for (arch, templates) in raw {
        let key = format!("architecture_tolerations.{arch}");
        let arch = validate_arch(&key, arch)?;
        if !supported_architectures.contains(&arch) {
            return Err(ConfigError::key(
                &key,
                format!("{arch} is not in supported_architectures, so it is never tolerated"),
            ));
        }
        let templates = templates
            .clone()
            .into_list(&key)?
            .into_iter()
            .map(|t| validate_template(&key, t))
            .collect::<Result<Vec<_>, _>>()?;
        if templates.is_empty() {
            return Err(ConfigError::key(&key, "name at least one toleration"));
        }
        out.insert(arch, templates);
    }
    Ok(out)
}

/// One toleration template under `section` (`tolerations` or `architecture_tolerations.<arch>`).
fn validate_template(section: &str, raw: RawTemplate) -> Result<TolerationTemplate, ConfigError> {
    let field = |name: &str| format!("{section}.{name}");
    let key = raw.key.trim().to_owned();
    let label_key_ok = !key.is_empty()
        && key.len() <= 316
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'));
    if !label_key_ok {
        return Err(ConfigError::key(
            &field("key"),
            format!("{key:?} is not a taint key"),
        ));
    }
    let operator = match raw.operator {
        Some(operator) => operator.get(&field("operator"))?,
        None => TolerationOperator::Equal,
    };
    let value = validate_template_value(&field("value"), operator, raw.value)?;
    let effect = match raw.effect {
        Some(effect) => effect.get(&field("effect"))?,
        None => TaintEffect::NoSchedule,
    };
    if raw.toleration_seconds.is_some() && effect != TaintEffect::NoExecute {
        return Err(ConfigError::key(
            &field("toleration_seconds"),
            "Kubernetes allows tolerationSeconds only with effect NoExecute",
        ));
    }
    Ok(TolerationTemplate {
        key,
        operator,
        value,
        effect: effect.as_str().to_owned(),
        toleration_seconds: raw.toleration_seconds,
    })
}

/// A template's value: a label value, and none with operator Exists.
fn validate_template_value(
    key: &str,
    operator: TolerationOperator,
    value: Option<String>,
) -> Result<Option<String>, ConfigError> {
    let value = value.map(|v| v.trim().to_owned());
    if operator == TolerationOperator::Exists && value.is_some() {
        return Err(ConfigError::key(
            key,
            "must not be set with operator Exists (it tolerates every value)",
        ));
    }
    if let Some(v) = &value {
        let ok = v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !ok {
            return Err(ConfigError::key(key, format!("{v:?} is not a taint value")));
        }
    }
    Ok(value)
}

fn validate_preference(
    raw: Option<&RawPreference>,
) -> Result<Vec<WeightedArchitecture>, ConfigError> {
    let key = "preferred_architecture";
    let items: Vec<(String, i64)> = match raw {
        None => Vec::new(),
        Some(RawPreference::Weighted(list)) => list
            .iter()
            .map(|w| (w.architecture.clone(), w.weight))
            .collect(),
        Some(RawPreference::Text(text)) => text
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(|item| match item.split_once('=') {
                None => Ok((item.to_owned(), i64::from(PREFERRED_WEIGHT))),
                Some((arch, weight)) => weight
                    .trim()
                    .parse()
                    .map(|w| (arch.trim().to_owned(), w))
                    .map_err(|_| {
                        ConfigError::key(key, format!("{item:?}: the weight is not a number"))
                    }),
            })
            .collect::<Result<_, _>>()?,
    };
    let mut out: Vec<WeightedArchitecture> = Vec::new();
    for (arch, weight) in items {
        let architecture = validate_arch(key, arch.trim())?;
        if !(1..=100).contains(&weight) {
            return Err(ConfigError::key(
                key,
                format!("{architecture}: weight {weight} is not between 1 and 100"),
            ));
        }
        if out.iter().any(|w| w.architecture == architecture) {
            return Err(ConfigError::key(
                key,
                format!("{architecture} is named twice"),
            ));
        }
        out.push(WeightedArchitecture {
            architecture,
            weight: weight as i32,
        });
    }
    Ok(out)
}

/// `TOLERABLE_*` variables that are config keys. Kubernetes injects `<SERVICE>_SERVICE_HOST`,
/// `<SERVICE>_PORT_…` for every Service in the namespace, so a Service named `tolerable` must not
/// make start-up fail on unknown keys.
fn is_config_variable(name: &str) -> bool {
    let Some(key) = name.strip_prefix("TOLERABLE_") else {
        return false;
    };
    name != CONFIG_PATH_ENV
        && !key.starts_with("SERVICE_")
        && key != "PORT"
        && !key.starts_with("PORT_")
}

/// `500ms`, `4s`, `5m`, `24h`, or a bare number of seconds.
fn parse_duration(key: &str, text: &str) -> Result<Duration, ConfigError> {
    crate::duration::parse_config(text).map_err(|why| ConfigError::key(key, why))
}

fn read_ca_bundle(key: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::CertificateDer;
    let pem = std::fs::read(path)
        .map_err(|e| ConfigError::key(key, format!("{}: {e}", path.display())))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ConfigError::key(key, format!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(ConfigError::key(
            key,
            format!("{} holds no PEM certificate", path.display()),
        ));
    }
    Ok(pem)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        vars.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn write(dir: &tempfile::TempDir, text: &str) -> PathBuf {
        let path = dir.path().join("tolerable.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn defaults() {
        let c = Config::load(None, env(&[])).unwrap();
        assert_eq!(
            c.policy,
            Policy::default(),
            "Policy::default() is the documented one"
        );
        assert_eq!(c.resolver.lookup_timeout, Duration::from_secs(4));
        assert_eq!(
            c.server_limits,
            ServerLimits::default(),
            "ServerLimits::default() is the documented one"
        );
        assert_eq!(c.tls_reload_name_check, NameCheck::Refuse);
        assert_eq!(c.resolver.cache.tag_ttl, Duration::from_secs(300));
        assert_eq!(c.log_format, LogFormat::Text);
        assert!(c.resolver.mirrors.is_empty());
        assert_eq!(c.listen_addr.to_string(), "0.0.0.0:8443");
        assert!(c.tls_files.is_none());
        assert_eq!(
            c.policy.supported_architectures,
            BTreeSet::from(["arm64".to_owned()])
        );
        assert_eq!(c.policy.steering, Steering::NodeAffinity);
        assert_eq!(c.policy.toleration.key, "kubernetes.io/arch");
        assert_eq!(c.policy.toleration.effect, "NoSchedule");
        assert_eq!(c.policy.on_lookup_failure, OnLookupFailure::Allow);
        assert_eq!(
            c.policy.on_no_common_architecture,
            OnNoCommonArchitecture::Deny
        );
    }

    #[test]
    fn original_tolerable_keys_and_nested_environment() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("tls.crt");
        let key = dir.path().join("tls.key");
        std::fs::write(&cert, "x").unwrap();
        std::fs::write(&key, "x").unwrap();
        let path = write(
            &dir,
            &format!(
                r#"
                ssl_cert_path = {cert:?}
                ssl_key_path = {key:?}
                registry_credential_path = {creds:?}
                supported_architectures = ["arm64", "s390x"]
                log_level = "debug"
                [tolerations]
                key = "example.com/arch"
                operator = "Exists"
                effect = "NoExecute"
                toleration_seconds = 30
                "#,
                creds = dir.path()
            ),
        );
        let c = Config::load(Some(&path), env(&[])).unwrap();
        assert_eq!(c.tls_files, Some((cert.clone(), key.clone())));
        assert_eq!(c.policy.supported_architectures.len(), 2);
        assert_eq!(c.policy.toleration.operator, TolerationOperator::Exists);
        assert_eq!(c.policy.toleration.toleration_seconds, Some(30));

        let c = Config::load(
            Some(&path),
            env(&[
                (
                    "TOLERABLE_SUPPORTED_ARCHITECTURES",
                    "arm64, s390x,ppc64le , 386",
                ),
                ("TOLERABLE_TOLERATIONS__EFFECT", "NoExecute"),
                ("TOLERABLE_TOLERATIONS__TOLERATION_SECONDS", "60"),
                ("TOLERABLE_STEERING", "node_selector"),
                ("TOLERABLE_SKIP_NAMESPACES", "kube-system, monitoring"),
                ("TOLERABLE_PREFERRED_ARCHITECTURE", "arm64"),
                ("TOLERABLE_ON_LOOKUP_FAILURE", "deny"),
                ("TOLERABLE_LISTEN_ADDR", "127.0.0.1:9443"),
                ("TOLERABLE_READ_PULL_SECRETS", "false"),
                ("TOLERABLE_WATCH_NODES", "0"),
                ("TOLERABLE_DEFAULT_ARCHITECTURES", "amd64, arm64"),
                ("TOLERABLE_MANAGE_NODE_TAINTS", "true"),
            ]),
        )
        .unwrap();
        assert_eq!(
            c.policy.supported_architectures,
            BTreeSet::from(["386", "arm64", "ppc64le", "s390x"].map(String::from))
        );
        assert_eq!(c.policy.toleration.toleration_seconds, Some(60));
        assert_eq!(c.policy.steering, Steering::NodeSelector);
        assert!(c.policy.skip_namespaces.contains("monitoring"));
        assert_eq!(
            c.policy.preferred_architectures,
            [WeightedArchitecture {
                architecture: "arm64".into(),
                weight: PREFERRED_WEIGHT
            }]
        );
        assert_eq!(c.policy.on_lookup_failure, OnLookupFailure::Deny);
        assert_eq!(c.listen_addr.port(), 9443);
        assert!(!c.read_pull_secrets);
        assert!(!c.watch_nodes);
        assert_eq!(c.taint_policy.default_architectures.len(), 2);
        assert!(c.manage_node_taints);
    }

    #[test]
    fn file_then_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            &dir,
            r#"
            lookup_timeout = "3s"
            insecure_registries = ["127.0.0.1:5000"]
            log_format = "json"
            [registry_mirrors]
            "docker.io" = "mirror.gcr.io"
            "#,
        );
        let c = Config::load(Some(&path), env(&[])).unwrap();
        assert_eq!(c.resolver.lookup_timeout, Duration::from_secs(3));
        assert_eq!(c.resolver.transport.insecure_registries, ["127.0.0.1:5000"]);
        assert_eq!(c.resolver.mirrors["docker.io"], "mirror.gcr.io");
        assert_eq!(c.log_format, LogFormat::Json);

        let c = Config::load(
            Some(&path),
            env(&[
                ("TOLERABLE_LOOKUP_TIMEOUT", "1500ms"),
                (
                    "TOLERABLE_INSECURE_REGISTRIES",
                    " localhost:5000 , 10.0.0.1:80,",
                ),
                ("TOLERABLE_CACHE_MAX_ENTRIES", "77"),
                ("TOLERABLE_CONFIG", "/elsewhere.toml"),
                // Injected by Kubernetes for a Service named tolerable.
                ("TOLERABLE_SERVICE_HOST", "10.0.0.9"),
                ("TOLERABLE_PORT_443_TCP", "tcp://10.0.0.9:443"),
                ("TOLERABLE_PORT", "tcp://10.0.0.9:443"),
                ("OTHER_LOOKUP_TIMEOUT", "9s"),
            ]),
        )
        .unwrap();
        assert_eq!(c.resolver.lookup_timeout, Duration::from_millis(1500));
        assert_eq!(
            c.resolver.transport.insecure_registries,
            ["localhost:5000", "10.0.0.1:80"]
        );
        assert_eq!(c.resolver.cache.max_entries, 77);
    }

    /// Variables with a bad value, and the key the error must name.
    const BAD_VALUES: &[(&[(&str, &str)], &str)] = &[
        (&[("TOLERABLE_LOOKUP_TIMEOUT", "soon")], "lookup_timeout"),
        (&[("TOLERABLE_LOOKUP_TIMEOUT", "0s")], "lookup_timeout"),
        (&[("TOLERABLE_LOOKUP_TIMEOUT", "1m")], "lookup_timeout"),
        (&[("TOLERABLE_CACHE_TAG_TTL", "5y")], "cache_tag_ttl"),
        (
            &[("TOLERABLE_CACHE_MAX_ENTRIES", "lots")],
            "cache_max_entries",
        ),
        (&[("TOLERABLE_CACHE_MAX_ENTRIES", "0")], "cache_max_entries"),
        (&[("TOLERABLE_WORKER_THREADS", "100000")], "worker_threads"),
        (&[("TOLERABLE_WORKER_THREADS", "two")], "worker_threads"),
        (&[("TOLERABLE_MAX_CONNECTIONS", "0")], "max_connections"),
        (
            &[("TOLERABLE_MAX_CONNECTIONS_PER_PEER", "0")],
            "max_connections_per_peer",
        ),
        (
            &[("TOLERABLE_MAX_CONNECTIONS_PER_PEER", "1001")],
            "max_connections_per_peer",
        ),
        (
            &[("TOLERABLE_MAX_REQUESTS_IN_FLIGHT", "0")],
            "max_requests_in_flight",
        ),
        (
            &[("TOLERABLE_REQUEST_READ_TIMEOUT", "10s")],
            "request_read_timeout",
        ),
        (
            &[("TOLERABLE_REQUEST_READ_TIMEOUT", "0s")],
            "request_read_timeout",
        ),
        (
            &[("TOLERABLE_CONNECTION_IDLE_TIMEOUT", "0s")],
            "connection_idle_timeout",
        ),
        (
            &[("TOLERABLE_TLS_RELOAD_NAME_CHECK", "ignore")],
            "tls_reload_name_check",
        ),
        (&[("TOLERABLE_LOG_FORMAT", "xml")], "log_format"),
        (&[("TOLERABLE_LOG_LEVEL", "info,[")], "log_level"),
        (
            &[("TOLERABLE_INSECURE_REGISTRIES", "bad host:1")],
            "insecure_registries",
        ),
        (
            &[("TOLERABLE_REGISTRY_CA_PATH", "/nonexistent/ca.pem")],
            "registry_ca_path",
        ),
        (
            &[("TOLERABLE_REGISTRY_CREDENTIAL_PATH", "/nonexistent/creds")],
            "registry_credential_path",
        ),
        (&[("TOLERABLE_LOOKUP_TIMEOT", "1s")], "lookup_timeot"),
        (
            &[("TOLERABLE_SUPPORTED_ARCHITECTURES", "arm64,ARM 64")],
            "supported_architectures",
        ),
        (
            &[("TOLERABLE_TOLERATIONS__OPERATOR", "Maybe")],
            "tolerations.operator",
        ),
        (
            &[("TOLERABLE_TOLERATIONS__EFFECT", "NoRun")],
            "tolerations.effect",
        ),
        (
            &[("TOLERABLE_TOLERATIONS__TOLERATION_SECONDS", "30")],
            "tolerations.toleration_seconds",
        ),
        (
            &[("TOLERABLE_TOLERATIONS__KEY", "bad key")],
            "tolerations.key",
        ),
        (&[("TOLERABLE_TOLERATIONS__COLOR", "red")], "color"),
        (&[("TOLERABLE_STEERING", "sideways")], "steering"),
        (
            &[("TOLERABLE_PREFERRED_ARCHITECTURE", "Arm64")],
            "preferred_architecture",
        ),
        (
            &[("TOLERABLE_ON_NO_COMMON_ARCHITECTURE", "shrug")],
            "on_no_common_architecture",
        ),
        (
            &[("TOLERABLE_ON_LOOKUP_FAILURE", "panic")],
            "on_lookup_failure",
        ),
        (&[("TOLERABLE_LISTEN_ADDR", "8443")], "listen_addr"),
        (&[("TOLERABLE_METRICS_ADDR", "9090")], "metrics_addr"),
        (
            &[("TOLERABLE_METRICS_ADDR", "0.0.0.0:8443")],
            "metrics_addr",
        ),
        (
            &[("TOLERABLE_READ_PULL_SECRETS", "maybe")],
            "read_pull_secrets",
        ),
        (
            &[("TOLERABLE_SSL_CERT_PATH", "/nonexistent.crt")],
            "ssl_key_path",
        ),
        (
            &[("TOLERABLE_SSL_KEY_PATH", "/nonexistent.key")],
            "ssl_cert_path",
        ),
        (
            &[
                ("TOLERABLE_SSL_CERT_PATH", "/nonexistent.crt"),
                ("TOLERABLE_SSL_KEY_PATH", "/nonexistent.key"),
            ],
            "ssl_cert_path",
        ),
    ];

    #[test]
    fn bad_values_name_the_key() {
        let cases = BAD_VALUES;
        for (vars, key) in cases {
            let err = Config::load(None, env(vars)).unwrap_err().to_string();
            assert!(err.contains(key), "{vars:?}: {err}");
        }
    }

    #[test]
    fn bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "lookup_timeout = \n");
        let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(err.contains("tolerable.toml"), "{err}");

        let path = write(&dir, "[registry_mirrors]\n\"docker.io\" = \"not a host\"\n");
        let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(err.contains("registry_mirrors.docker.io"), "{err}");

        let path = write(&dir, "unknown_key = 1\n");
        let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(err.contains("unknown_key"), "{err}");

        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "not a certificate").unwrap();
        let path = write(&dir, &format!("registry_ca_path = {:?}\n", ca));
        let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(
            err.contains("registry_ca_path") && err.contains("no PEM"),
            "{err}"
        );

        let missing = dir.path().join("missing.toml");
        let err = Config::load(Some(&missing), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.toml"), "{err}");
    }

    #[test]
    fn registry_access_lists() {
        let c = Config::load(None, env(&[])).unwrap();
        assert_eq!(c.resolver.transport.access, AccessRules::default());
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        assert!(c
            .resolver
            .transport
            .access
            .check_url(&url("http://169.254.169.254/"))
            .is_err());

        let c = Config::load(
            None,
            env(&[
                (
                    "TOLERABLE_REGISTRY_ALLOWLIST",
                    "*.dkr.ecr.*.amazonaws.com, Registry.Example.com:5000, 10.0.0.0/8",
                ),
                ("TOLERABLE_REGISTRY_DENYLIST", "10.6.0.0/16"),
                ("TOLERABLE_INSECURE_REGISTRIES", "Registry.Example.com:5000"),
            ]),
        )
        .unwrap();
        let access = &c.resolver.transport.access;
        assert!(access
            .check_url(&url("http://registry.example.com:5000/v2/"))
            .is_ok());
        // A name no rule names: its addresses must be in an allowed network.
        assert!(access.check_url(&url("https://ghcr.io/v2/")).is_ok());
        assert!(access
            .address_allowed("ghcr.io", "140.82.121.3".parse().unwrap())
            .is_err());
        assert!(access
            .address_allowed("ghcr.io", "10.1.2.3".parse().unwrap())
            .is_ok());
        assert!(access.check_url(&url("https://10.6.1.1/v2/")).is_err());
        // The denylist was replaced, and the link-local addresses are still denied.
        assert!(access.check_url(&url("http://169.254.169.254/")).is_err());
        assert_eq!(
            c.resolver.transport.insecure_registries,
            ["registry.example.com:5000"]
        );

        for (key, value) in [
            ("TOLERABLE_REGISTRY_DENYLIST", "10.0.0.1/8"),
            ("TOLERABLE_REGISTRY_DENYLIST", "169.254.0.0/40"),
            ("TOLERABLE_REGISTRY_ALLOWLIST", "reg*.example.com"),
            // An address may take a port; a network may not.
            ("TOLERABLE_REGISTRY_ALLOWLIST", "10.0.0.0/8:5000"),
        ] {
            let err = Config::load(None, env(&[(key, value)]))
                .unwrap_err()
                .to_string();
            let name = key.trim_start_matches("TOLERABLE_").to_ascii_lowercase();
            assert!(
                err.contains(&format!("`{name}`")) && err.contains(value),
                "{value}: {err}"
            );
        }
    }

    #[test]
    fn shipped_config_is_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, include_str!("../tolerable.toml"));
        let shipped = Config::load(Some(&path), env(&[])).unwrap();
        let defaults = Config::load(None, env(&[])).unwrap();
        assert_eq!(format!("{shipped:?}"), format!("{defaults:?}"));
    }

    /// A file with per-architecture templates (one list, one table) and weighted preferences.
    fn architecture_tolerations_file(dir: &tempfile::TempDir) -> PathBuf {
        write(
            dir,
            r#"
        supported_architectures = ["arm64", "s390x"]
        preferred_architecture = [{ architecture = "arm64", weight = 80 },
                                  { architecture = "amd64", weight = 20 }]
        [[architecture_tolerations.arm64]]
        key = "arm64"
        value = "true"
        [[architecture_tolerations.arm64]]
        key = "kubernetes.io/arch"
        effect = "NoExecute"
        toleration_seconds = 60
        [architecture_tolerations.s390x]
        key = "example.com/pool"
        operator = "Exists"
        "#,
        )
    }

    #[test]
    fn architecture_tolerations_in_toml() {
        let dir = tempfile::tempdir().unwrap();
        let path = architecture_tolerations_file(&dir);
        let c = Config::load(Some(&path), env(&[])).unwrap();
        let arm = &c.policy.architecture_tolerations["arm64"];
        assert_eq!(arm.len(), 2);
        assert_eq!(
            (
                arm[0].key.as_str(),
                arm[0].value.as_deref(),
                arm[0].effect.as_str()
            ),
            ("arm64", Some("true"), "NoSchedule")
        );
        assert_eq!(arm[1].toleration_seconds, Some(60));
        let s390x = &c.policy.architecture_tolerations["s390x"];
        assert_eq!(s390x[0].operator, TolerationOperator::Exists);
        assert_eq!(
            c.policy.templates_for("ppc64le"),
            std::slice::from_ref(&c.policy.toleration)
        );
        assert_eq!(
            c.policy.taint_keys(),
            BTreeSet::from(["arm64", "example.com/pool", "kubernetes.io/arch"].map(String::from))
        );
        assert_eq!(
            c.policy
                .preferred_architectures
                .iter()
                .map(|w| (w.architecture.as_str(), w.weight))
                .collect::<Vec<_>>(),
            [("arm64", 80), ("amd64", 20)]
        );
        // Node tainting follows the first template.
        assert_eq!(
            c.taint_policy.architecture_taints["arm64"].to_string(),
            "arm64=true:NoSchedule"
        );
    }

    #[test]
    fn architecture_tolerations_in_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = architecture_tolerations_file(&dir);
        let c = Config::load(
            Some(&path),
            env(&[
                (
                    "TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64",
                    "arm64=true:NoSchedule, kubernetes.io/arch, team=*:NoExecute",
                ),
                ("TOLERABLE_PREFERRED_ARCHITECTURE", "arm64=90, amd64"),
            ]),
        )
        .unwrap();
        // A nested variable for one field of a table.
        let nested = Config::load(
            Some(&path),
            env(&[
                (
                    "TOLERABLE_ARCHITECTURE_TOLERATIONS__S390X__EFFECT",
                    "NoExecute",
                ),
                (
                    "TOLERABLE_ARCHITECTURE_TOLERATIONS__S390X__TOLERATION_SECONDS",
                    "45",
                ),
            ]),
        )
        .unwrap();
        let s390x = &nested.policy.architecture_tolerations["s390x"][0];
        assert_eq!(
            (s390x.effect.as_str(), s390x.toleration_seconds),
            ("NoExecute", Some(45))
        );
        let arm = &c.policy.architecture_tolerations["arm64"];
        let shown: Vec<String> = arm
            .iter()
            .map(|t| format!("{:?}", t.for_architecture("arm64")))
            .collect();
        assert_eq!(arm.len(), 3, "{shown:?}");
        assert_eq!(arm[1].value, None);
        assert_eq!(
            arm[1].for_architecture("arm64").value.as_deref(),
            Some("arm64")
        );
        assert_eq!(arm[2].operator, TolerationOperator::Exists);
        assert_eq!(arm[2].effect, "NoExecute");
        assert_eq!(c.policy.preferred_architectures[0].weight, 90);
        assert_eq!(c.policy.preferred_architectures[1].weight, PREFERRED_WEIGHT);
    }

    #[test]
    fn architecture_names_are_kubernetes_names_with_a_suggestion() {
        for (vars, key, suggestion) in [
            (
                [("TOLERABLE_SUPPORTED_ARCHITECTURES", "aarch64")],
                "supported_architectures",
                "\"arm64\"",
            ),
            (
                [("TOLERABLE_DEFAULT_ARCHITECTURES", "x86_64")],
                "default_architectures",
                "\"amd64\"",
            ),
            (
                [("TOLERABLE_SUPPORTED_ARCHITECTURES", "armv7l")],
                "supported_architectures",
                "\"arm\"",
            ),
            (
                [("TOLERABLE_PREFERRED_ARCHITECTURE", "i686")],
                "preferred_architecture",
                "\"386\"",
            ),
            (
                [("TOLERABLE_SUPPORTED_ARCHITECTURES", "sparc")],
                "supported_architectures",
                "one of 386, amd64",
            ),
        ] {
            let err = Config::load(None, env(&vars)).unwrap_err().to_string();
            assert!(
                err.contains(key) && err.contains(suggestion),
                "{vars:?}: {err}"
            );
        }
        for arch in [
            "amd64", "arm64", "arm", "s390x", "ppc64le", "386", "riscv64",
        ] {
            Config::load(None, env(&[("TOLERABLE_SUPPORTED_ARCHITECTURES", arch)]))
                .unwrap_or_else(|e| panic!("{arch}: {e}"));
        }
    }

    #[test]
    fn bad_templates_and_preferences_name_the_key() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("TOLERABLE_ARCHITECTURE_TOLERATIONS__S390X", "k=v")],
                "architecture_tolerations.s390x",
            ),
            (
                &[("TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64", "bad key=v")],
                "architecture_tolerations.arm64.key",
            ),
            (
                &[("TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64", "k=v:NoRun")],
                "architecture_tolerations.arm64.effect",
            ),
            (
                &[("TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64", "=v")],
                "architecture_tolerations.arm64",
            ),
            (
                &[("TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64", " , ")],
                "architecture_tolerations.arm64",
            ),
            (
                &[("TOLERABLE_PREFERRED_ARCHITECTURE", "arm64=0")],
                "preferred_architecture",
            ),
            (
                &[("TOLERABLE_PREFERRED_ARCHITECTURE", "arm64=101")],
                "preferred_architecture",
            ),
            (
                &[("TOLERABLE_PREFERRED_ARCHITECTURE", "arm64=lots")],
                "preferred_architecture",
            ),
            (
                &[("TOLERABLE_PREFERRED_ARCHITECTURE", "arm64, arm64=3")],
                "preferred_architecture",
            ),
        ];
        for (vars, key) in cases {
            let err = Config::load(None, env(vars)).unwrap_err().to_string();
            assert!(err.contains(key), "{vars:?}: {err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            &dir,
            "[architecture_tolerations.arm64]\nkey = \"k\"\noperator = \"Exists\"\nvalue = \"v\"\n",
        );
        let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(
            err.contains("architecture_tolerations.arm64.value"),
            "{err}"
        );
    }

    #[test]
    fn durations() {
        for (text, want) in [
            ("250ms", Duration::from_millis(250)),
            ("4s", Duration::from_secs(4)),
            ("4", Duration::from_secs(4)),
            ("5m", Duration::from_secs(300)),
            ("24h", Duration::from_secs(86400)),
        ] {
            assert_eq!(parse_duration("k", text).unwrap(), want, "{text}");
        }
        for bad in ["", "s", "1.5s", "-1s", "1d", "99999999999999999999h"] {
            assert!(parse_duration("k", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn server_limits_from_the_environment() {
        let c = Config::load(
            None,
            env(&[
                ("TOLERABLE_MAX_CONNECTIONS", "50"),
                ("TOLERABLE_MAX_CONNECTIONS_PER_PEER", "20"),
                ("TOLERABLE_MAX_REQUESTS_IN_FLIGHT", "7"),
                ("TOLERABLE_REQUEST_READ_TIMEOUT", "1500ms"),
                ("TOLERABLE_CONNECTION_IDLE_TIMEOUT", "2s"),
                ("TOLERABLE_TLS_RELOAD_NAME_CHECK", "warn"),
            ]),
        )
        .unwrap();
        assert_eq!(
            c.server_limits,
            ServerLimits {
                max_connections: 50,
                max_connections_per_peer: 20,
                max_requests_in_flight: 7,
                request_read_timeout: Duration::from_millis(1500),
                connection_idle_timeout: Duration::from_secs(2),
            }
        );
        assert_eq!(c.tls_reload_name_check, NameCheck::Warn);
    }

    #[test]
    fn shipped_config_names_every_key() {
        // Set, or commented out with its example: `# ssl_cert_path = …`.
        let shipped = include_str!("../tolerable.toml");
        let written = |key: &str| {
            shipped.lines().any(|line| {
                let line = line.trim_start_matches(['#', ' ']);
                line.starts_with(&format!("{key} =")) || line.starts_with(&format!("[{key}]"))
            })
        };
        let fields = source::field_names::<RawConfig>();
        assert!(fields.len() > 40, "{fields:?}");
        for key in fields.iter().chain(source::field_names::<RawTolerations>()) {
            assert!(written(key), "tolerable.toml does not document `{key}`");
        }
    }

    #[test]
    fn unknown_keys_are_named_where_written_with_the_nearest_key() {
        let err = Config::load(None, env(&[("TOLERABLE_LOOKUP_TIMOUT", "1s")]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "environment variable TOLERABLE_LOOKUP_TIMOUT: unknown field `lookup_timout`; \
             did you mean TOLERABLE_LOOKUP_TIMEOUT?"
        );
        let err = Config::load(None, env(&[("TOLERABLE_TOLERATIONS__EFECT", "NoExecute")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("TOLERABLE_TOLERATIONS__EFECT")
                && err.contains("did you mean TOLERABLE_TOLERATIONS__EFFECT?"),
            "{err}"
        );
        let err = Config::load(
            None,
            env(&[("TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64__VALU", "x")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("did you mean TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64__VALUE?"),
            "{err}"
        );

        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "[tolerations]\nefect = \"NoExecute\"\n");
        let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "config file {}: unknown field `tolerations.efect`; did you mean `tolerations.effect`?",
                path.display()
            )
        );
        let path = write(
            &dir,
            "registry_mirror = { \"docker.io\" = \"mirror.gcr.io\" }\n",
        );
        let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(
            err.contains("tolerable.toml") && err.contains("did you mean `registry_mirrors`?"),
            "{err}"
        );
        // Map entries are named freely, and empty variables are as if unset.
        let path = write(
            &dir,
            "[registry_mirrors]\n\"my.registry\" = \"mirror.example\"\n",
        );
        Config::load(Some(&path), env(&[("TOLERABLE_NO_SUCH_KEY", " ")])).unwrap();
    }

    #[test]
    fn credential_providers_from_the_environment_with_errors_naming_the_key() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let plugin = bin.join("ecr-credential-provider");
        std::fs::write(&plugin, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let file = dir.path().join("providers.yaml");
        std::fs::write(
            &file,
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
             - name: ecr-credential-provider\n  matchImages: [\"*.dkr.ecr.*.amazonaws.com\"]\n\
             \x20 defaultCacheDuration: 12h\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n",
        )
        .unwrap();
        let (file, bin) = (file.to_str().unwrap(), bin.to_str().unwrap());
        let config = Config::load(
            None,
            env(&[
                ("TOLERABLE_CREDENTIAL_PROVIDER_CONFIG", file),
                ("TOLERABLE_CREDENTIAL_PROVIDER_BIN_DIR", bin),
            ]),
        )
        .unwrap();
        assert_eq!(
            config.credential_providers[0].name,
            "ecr-credential-provider"
        );
        assert!(Config::load(None, env(&[]))
            .unwrap()
            .credential_providers
            .is_empty());

        let err = |vars: &[(&str, &str)]| Config::load(None, env(vars)).unwrap_err().to_string();
        let alone = err(&[("TOLERABLE_CREDENTIAL_PROVIDER_CONFIG", file)]);
        assert!(
            alone.contains("config key `credential_provider_bin_dir`: must be set with credential_provider_config"),
            "{alone}"
        );
        let empty_bin = dir.path().to_str().unwrap();
        let missing = err(&[
            ("TOLERABLE_CREDENTIAL_PROVIDER_CONFIG", file),
            ("TOLERABLE_CREDENTIAL_PROVIDER_BIN_DIR", empty_bin),
        ]);
        assert!(
            missing.starts_with("environment variable TOLERABLE_CREDENTIAL_PROVIDER_CONFIG: config key `credential_provider_config`: ")
                && missing.contains("provider \"ecr-credential-provider\": no executable"),
            "{missing}"
        );
    }

    #[test]
    fn bad_values_name_the_variable_or_the_file() {
        for (var, value, key) in [
            ("TOLERABLE_LOOKUP_TIMEOUT", "soon", "lookup_timeout"),
            ("TOLERABLE_CACHE_MAX_ENTRIES", "lots", "cache_max_entries"),
            ("TOLERABLE_STEERING", "sideways", "steering"),
            (
                "TOLERABLE_TOLERATIONS__EFFECT",
                "NoRun",
                "tolerations.effect",
            ),
            (
                "TOLERABLE_REGISTRY_MIRRORS",
                "docker.io=not a host",
                "registry_mirrors",
            ),
            (
                "TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64",
                "k=v:NoRun",
                "architecture_tolerations.arm64.effect",
            ),
        ] {
            let err = Config::load(None, env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with(&format!("environment variable {var}: "))
                    && err.contains(&format!("`{key}")),
                "{var}={value}: {err}"
            );
        }

        let dir = tempfile::tempdir().unwrap();
        let path = write(
            &dir,
            "steering = \"sideways\"\n[tolerations]\nkey = \"k\"\n",
        );
        let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "config file {}: config key `steering`: \"sideways\" is not off, node_selector or node_affinity",
                path.display()
            )
        );
        // The variable overrides the file, and is the one named.
        let err = Config::load(Some(&path), env(&[("TOLERABLE_STEERING", "up")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "environment variable TOLERABLE_STEERING: config key `steering`: \"up\""
            ),
            "{err}"
        );
        let path = write(&dir, "cache_max_entries = -1\n");
        let err = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("config file {}: ", path.display()))
                && err.ends_with("for key `cache_max_entries`"),
            "{err}"
        );
        // A key left at its default that another one makes wrong: no source to name.
        let err = Config::load(None, env(&[("TOLERABLE_SSL_CERT_PATH", "/tls.crt")]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "config key `ssl_key_path`: must be set with ssl_cert_path"
        );
    }

    #[test]
    fn words_name_the_key_and_the_words_it_takes() {
        for (var, value, want) in [
            (
                "TOLERABLE_LOG_FORMAT",
                "xml",
                "config key `log_format`: \"xml\" is not text or json",
            ),
            (
                "TOLERABLE_TOLERATIONS__EFFECT",
                "NoRun",
                "config key `tolerations.effect`: \"NoRun\" is not NoSchedule, PreferNoSchedule, NoExecute or empty",
            ),
            (
                "TOLERABLE_TLS_RELOAD_NAME_CHECK",
                "ignore",
                "config key `tls_reload_name_check`: \"ignore\" is not refuse or warn",
            ),
            (
                "TOLERABLE_ON_NO_COMMON_ARCHITECTURE",
                "shrug",
                "config key `on_no_common_architecture`: \"shrug\" is not deny or warn",
            ),
            (
                "TOLERABLE_ON_LOOKUP_FAILURE",
                "panic",
                "config key `on_lookup_failure`: \"panic\" is not allow or deny",
            ),
        ] {
            let err = Config::load(None, env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(err.ends_with(want), "{err}");
        }
        // Trimmed, in the file as in the environment; empty: every effect.
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            &dir,
            "log_format = \" json \"\n[tolerations]\neffect = \"\"\noperator = \"Exists\"\n",
        );
        let c = Config::load(Some(&path), env(&[])).unwrap();
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.policy.toleration.effect, "");
        assert_eq!(c.policy.toleration.operator, TolerationOperator::Exists);
    }

    #[test]
    fn registry_mirrors_from_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            &dir,
            "[registry_mirrors]\n\"docker.io\" = \"mirror.gcr.io\"\n\"ghcr.io\" = \"ghcr.example\"\n",
        );
        let c = Config::load(
            Some(&path),
            env(&[(
                "TOLERABLE_REGISTRY_MIRRORS",
                " docker.io = mirror.example:5000, Quay.IO=quay-mirror.example ,",
            )]),
        )
        .unwrap();
        // The variable replaces the file's table, as a list variable replaces a list.
        assert_eq!(
            c.resolver.mirrors,
            BTreeMap::from(
                [
                    ("docker.io", "mirror.example:5000"),
                    ("quay.io", "quay-mirror.example")
                ]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
            )
        );
        for bad in ["docker.io", "=mirror.example", "docker.io=mirror, quay.io"] {
            let err = Config::load(None, env(&[("TOLERABLE_REGISTRY_MIRRORS", bad)]))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("environment variable TOLERABLE_REGISTRY_MIRRORS: ")
                    && err.contains("is not name=value")
                    && err.ends_with("for key `registry_mirrors`"),
                "{bad}: {err}"
            );
        }
    }
}
