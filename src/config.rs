//! Configuration: `tolerable.toml`, overridden key by key by `TOLERABLE_<KEY>` environment
//! variables, resolved once at start-up into a validated, immutable [`Config`]. A bad value stops
//! start-up with an error naming the key, where it was written (the variable, or the file) and
//! the reason; a key tolerable does not know, with the nearest one it does.
//!
//! The keys are grouped in sections (`[server]`, `[tls]`, `[log]`, `[policy]`, `[tolerations]`,
//! `[architecture_tolerations]`, `[nodes]`, `[events]`, `[crashes]`, `[credentials]`, `[registry]`, `[cache]`,
//! `[shared_cache]`, `[circuit_breaker]`, `[workloads]`), each read and checked by its own module next to
//! the settings it builds; a section's variable is `TOLERABLE_<SECTION>__<KEY>`. The flat keys of
//! before the sections are still read, with a warning ([`deprecated`]).
//!
//! Each section's `Default` holds its defaults, the one copy (the policy's and the server
//! limits' read from [`Policy::default`] and [`ServerLimits::default`]); each section's file
//! describes its keys once ([`reference`]), and `tolerable reference` prints the shipped
//! `tolerable.toml`, its deployed copies and the docs' tables from the two.

mod deprecated;
mod policy;
pub(crate) mod reference;
mod registry;
mod server;
mod source;
#[cfg(test)]
mod tests;
mod values;
mod workloads;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::mutate::Policy;
use crate::registry::credentials::helper::DockerHelpers;
use crate::registry::credentials::parse_docker_config;
use crate::registry::credentials::provider::Provider;
use crate::registry::{CredentialStore, ResolverSettings};
use policy::{
    CrashesSection, EventsSection, NodesSection, PolicySection, RawTemplates, TolerationsSection,
};
use registry::{
    BreakerSection, CacheSection, CredentialsSection, RegistrySection, SharedCacheSection,
};
pub(crate) use server::LogFormat;
use server::{LogSection, ServerSection, TlsSection};
pub use server::{NameCheck, ServerLimits};
pub use source::Origin;
use source::Sources;

pub(crate) const ENV_PREFIX: &str = "TOLERABLE";
/// The variable naming the config file; not itself a config key.
pub(crate) const CONFIG_PATH_ENV: &str = "TOLERABLE_CONFIG";
/// The namespace tolerable runs in, set from the downward API (`metadata.namespace`) by the
/// kustomize base and the chart; not itself a config key.
pub(crate) const OWN_NAMESPACE_ENV: &str = "POD_NAMESPACE";
/// Read when neither `--config` nor `TOLERABLE_CONFIG` names a file, if it exists.
pub(crate) const DEFAULT_CONFIG_FILE: &str = "tolerable.toml";
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
    /// A key of one section written in another (`[policy] lookup_timeout`): where it belongs,
    /// rather than a different key of the section it was written in.
    #[error("{origin}unknown field `{key}`: this key belongs in [{section}] ({nearest})")]
    WrongSection {
        origin: Origin,
        key: String,
        section: String,
        nearest: String,
    },
    /// A key written both in its deprecated flat form and in its section, in one place.
    #[error("{place}{old} and {new} set the same key: remove the deprecated {old}")]
    BothForms {
        place: String,
        old: String,
        new: String,
    },
    #[error("configuration: {0}")]
    Other(String),
}

impl ConfigError {
    pub(crate) fn key(key: &str, reason: impl Into<String>) -> Self {
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

/// The file and environment as written, by section, before validation.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
struct Sections {
    server: ServerSection,
    tls: TlsSection,
    log: LogSection,
    policy: PolicySection,
    tolerations: TolerationsSection,
    architecture_tolerations: BTreeMap<String, RawTemplates>,
    nodes: NodesSection,
    events: EventsSection,
    crashes: CrashesSection,
    credentials: CredentialsSection,
    registry: RegistrySection,
    cache: CacheSection,
    shared_cache: SharedCacheSection,
    circuit_breaker: BreakerSection,
    workloads: workloads::WorkloadsSection,
}

/// The keys of a section: serde's field names of its struct.
type Keys = fn() -> &'static [&'static str];

/// Each section (in [`Sections`]' order) and the keys it takes; `None`: a map, its entries
/// named freely.
const SECTIONS: &[(&str, Option<Keys>)] = &[
    ("server", Some(source::field_names::<ServerSection>)),
    ("tls", Some(source::field_names::<TlsSection>)),
    ("log", Some(source::field_names::<LogSection>)),
    ("policy", Some(source::field_names::<PolicySection>)),
    (
        "tolerations",
        Some(source::field_names::<TolerationsSection>),
    ),
    ("architecture_tolerations", None),
    ("nodes", Some(source::field_names::<NodesSection>)),
    ("events", Some(source::field_names::<EventsSection>)),
    ("crashes", Some(source::field_names::<CrashesSection>)),
    (
        "credentials",
        Some(source::field_names::<CredentialsSection>),
    ),
    ("registry", Some(source::field_names::<RegistrySection>)),
    ("cache", Some(source::field_names::<CacheSection>)),
    (
        "shared_cache",
        Some(source::field_names::<SharedCacheSection>),
    ),
    (
        "circuit_breaker",
        Some(source::field_names::<BreakerSection>),
    ),
    (
        "workloads",
        Some(source::field_names::<workloads::WorkloadsSection>),
    ),
];

/// Every key tolerable knows, as `section.key` (`architecture_tolerations.<arch>` for the
/// map): what the reference documents and the shipped file lists.
pub(crate) fn known_keys() -> Vec<String> {
    SECTIONS
        .iter()
        .flat_map(|(section, keys)| match keys {
            Some(keys) => keys().iter().map(|k| format!("{section}.{k}")).collect(),
            None => vec![format!("{section}.<arch>")],
        })
        .collect()
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
    /// `[policy] namespace_policy`: read per-namespace policy from Namespaces (`serve` watches
    /// them, `review --kubeconfig` and `audit` list them).
    pub namespace_policy: bool,
    /// Watch Nodes: also tolerate taints the templates do not, count the architectures seen
    /// when deciding whether to steer; `/readyz` waits for the first sync.
    pub watch_nodes: bool,
    /// Node tainting (`tolerable nodes`, `manage_node_taints`): default architectures stay
    /// untainted, supported ones get their first template's taint, others are left alone.
    pub(crate) taint_policy: crate::taints::TaintPolicy,
    /// `serve` keeps new nodes tainted as they join.
    pub manage_node_taints: bool,
    /// `[events] on_admission`: a Warning Event on the controller owner of each Pod whose
    /// images share no node architecture or could not be looked up.
    pub events_on_admission: bool,
    /// `[crashes] watch`: the crash-signal watch (BackOff Events → wrong-architecture crashes).
    pub crash_watch: bool,
    /// `[crashes] heal`: the crash watch deletes the Pods of wrong-architecture crashes for
    /// their controllers to recreate elsewhere.
    pub crash_heal: bool,
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
    /// `[policy] gate_timeout`: how long the gate controller waits for a gated Pod's lookups
    /// before releasing it unchanged.
    pub gate_timeout: Duration,
    /// A warning for each deprecated key written, logged at start-up.
    pub(crate) deprecations: Vec<String>,
    /// `[workloads] pod_specs` and the built-in table: where each kind keeps its Pod
    /// templates (`review`).
    pub(crate) kinds: std::sync::Arc<crate::kinds::Kinds>,
}

impl Config {
    /// Reads the config file (if any) and overlays `env` (the process environment in `main`; a
    /// plain map in tests, so no test mutates the process environment).
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut file = file.map(read_file).transpose()?;
        let env: Vec<(String, String)> = env.into_iter().collect();
        let own_namespace = env
            .iter()
            .find(|(k, v)| k == OWN_NAMESPACE_ENV && !v.trim().is_empty())
            .map(|(_, v)| v.trim().to_owned());
        let mut deprecations = match &mut file {
            Some((path, table)) => deprecated::rewrite_file(path, table)?,
            None => Vec::new(),
        };
        // Empty variables are left out, as if unset.
        let env: HashMap<String, String> = env
            .into_iter()
            .filter(|(k, _)| is_config_variable(k))
            .map(|(k, v)| (k, v.trim().to_owned()))
            .filter(|(_, v)| !v.is_empty())
            .collect();
        let env = deprecated::rewrite_env(env)?;
        deprecations.extend(env.warnings);
        let sources = Sources::new(
            file.as_ref().map(|(path, table)| (path.as_path(), table)),
            env.written_as,
        );
        if let Some(unknown) = sources.unknown_key() {
            return Err(unknown);
        }
        let sections = merge(
            file.as_ref().map(|(_, table)| table),
            env.variables,
            &sources,
        )?;
        if sections.shared_cache.password.is_some() {
            if let origin @ Origin::File(_) = sources.origin_of("shared_cache.password") {
                return Err(ConfigError::Key {
                    key: "shared_cache.password".into(),
                    origin,
                    reason: "a password does not belong in the config file: set TOLERABLE_SHARED_CACHE__PASSWORD (from a Secret) or shared_cache.password_file".into(),
                });
            }
        }
        let mut config = Self::validate(sections).map_err(|e| e.located(&sources))?;
        config.deprecations = deprecations;
        config.policy.own_namespace = own_namespace;
        Ok(config)
    }

    /// Logs a warning for each deprecated key written (once logging is set up, at start-up).
    pub(crate) fn warn_deprecated_keys(&self) {
        for warning in &self.deprecations {
            tracing::warn!("{warning}");
        }
    }

    /// Reads the config the CLI names: `--config` / `TOLERABLE_CONFIG`, else `./tolerable.toml`
    /// when present, else defaults; then the `TOLERABLE_*` environment.
    pub(crate) fn from_process(explicit: Option<&Path>) -> Result<Self, ConfigError> {
        let default = Path::new(DEFAULT_CONFIG_FILE);
        let file = explicit.or_else(|| default.is_file().then_some(default));
        Self::load(file, std::env::vars())
    }

    /// Each section checked by its own module, in the order of `tolerable.toml`'s sections.
    fn validate(sections: Sections) -> Result<Self, ConfigError> {
        let (log_level, log_format) = sections.log.validate()?;
        let server = sections.server.validate()?;
        let (tls_files, tls_reload_name_check) = sections.tls.validate()?;
        let resolver = registry::validate(
            &sections.registry,
            &sections.cache,
            &sections.shared_cache,
            &sections.circuit_breaker,
        )?;
        let (credential_providers, credential_provider_warnings) =
            sections.credentials.validate()?;
        let mut policy = sections
            .policy
            .validate(&sections.tolerations, &sections.architecture_tolerations)?;
        policy.fallback_to_logs_on_error = sections.crashes.fallback_to_logs_on_error;
        let credentials = sections.credentials;
        let gate_timeout = sections.policy.gate_timeout()?;
        let kinds = sections.workloads.validate()?;
        Ok(Self {
            kinds,
            gate_timeout,
            tls_files,
            listen_addr: server.listen_addr,
            metrics_addr: server.metrics_addr,
            taint_policy: crate::taints::TaintPolicy::from_policy(&policy),
            policy,
            read_pull_secrets: credentials.read_pull_secrets,
            namespace_policy: sections.policy.namespace_policy,
            watch_nodes: sections.nodes.watch,
            manage_node_taints: sections.nodes.manage_taints,
            events_on_admission: sections.events.on_admission,
            crash_watch: sections.crashes.watch,
            crash_heal: sections.crashes.heal()?,
            log_level,
            log_format,
            worker_threads: server.worker_threads,
            server_limits: server.limits,
            tls_reload_name_check,
            registry_credential_path: credentials.files_path,
            docker_config_path: credentials.docker_config_path,
            credential_provider_bin_dir: credentials.provider_bin_dir,
            credential_providers,
            credential_provider_warnings,
            resolver,
            deprecations: Vec::new(),
        })
    }

    /// The registry credentials the config points at (files, then the Docker config's `auths`),
    /// and the Docker config's credential helpers, each found in `credential_provider_bin_dir`
    /// or on `PATH`.
    pub(crate) fn credentials(&self) -> Result<(CredentialStore, DockerHelpers), ConfigError> {
        let mut store = match &self.registry_credential_path {
            Some(dir) => CredentialStore::load_dir(dir)
                .map_err(|e| ConfigError::key("credentials.files_path", e.to_string()))?,
            None => CredentialStore::default(),
        };
        let mut helpers = DockerHelpers::default();
        if let Some(path) = &self.docker_config_path {
            let key = "credentials.docker_config_path";
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

/// The file's path and table: its keys are moved out of the deprecated flat form, checked and
/// located before config-rs merges it with the environment.
fn read_file(path: &Path) -> Result<(PathBuf, toml::Table), ConfigError> {
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
    Ok((path.to_owned(), table))
}

/// The file's table and the variables, merged by config-rs (a variable wins) into the sections.
fn merge(
    file: Option<&toml::Table>,
    env: HashMap<String, String>,
    sources: &Sources,
) -> Result<Sections, ConfigError> {
    let mut builder = config::Config::builder();
    if let Some(table) = file {
        let text = toml::to_string(table).map_err(|e| ConfigError::Other(e.to_string()))?;
        builder = builder.add_source(config::File::from_str(&text, config::FileFormat::Toml));
    }
    // Values stay strings (`try_parsing(false)`): config-rs would turn `386` into a number
    // and split lists without trimming. `List` splits and trims them itself.
    let environment = config::Environment::with_prefix(ENV_PREFIX)
        .prefix_separator("_")
        .separator("__")
        .try_parsing(false)
        .source(Some(env));
    builder
        .add_source(environment)
        .build()
        .and_then(config::Config::try_deserialize)
        .map_err(|e| ConfigError::from_merge(e).located(sources))
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
