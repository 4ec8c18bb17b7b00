//! `[registry]`, `[cache]`, `[shared_cache]`, `[circuit_breaker]` and `[credentials]`: how images
//! are looked up — the hosts and their rules, the caches, the breaker, and the credentials —
//! checked into the registry's [`ResolverSettings`] and the credential sources.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::values::{List, Password, TextMap};
use super::{parse_duration, ConfigError};
use crate::registry::access::{AccessRules, LINK_LOCAL};
use crate::registry::cache::CacheSettings;
use crate::registry::client::TransportSettings;
use crate::registry::credentials::normalize_registry_key;
use crate::registry::credentials::provider::{self, Provider};
use crate::registry::{BreakerSettings, ResolverSettings, SharedCacheSettings};

/// The API server waits at most 30 s for a webhook; a lookup must fit well inside.
const MAX_LOOKUP_TIMEOUT: Duration = Duration::from_secs(30);

/// `[registry]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RegistrySection {
    lookup_timeout: String,
    connect_timeout: String,
    ca_path: Option<PathBuf>,
    insecure: List,
    allowlist: List,
    denylist: List,
    mirrors: TextMap,
}

impl Default for RegistrySection {
    fn default() -> Self {
        Self {
            lookup_timeout: "4s".into(),
            connect_timeout: "2s".into(),
            ca_path: None,
            insecure: List::default(),
            allowlist: List::default(),
            denylist: List(LINK_LOCAL.map(String::from).to_vec()),
            mirrors: TextMap::default(),
        }
    }
}

/// `[cache]` as written: the in-memory cache of answers.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct CacheSection {
    tag_ttl: String,
    digest_ttl: String,
    failure_ttl: String,
    stale_if_error: String,
    max_entries: u64,
}

impl Default for CacheSection {
    fn default() -> Self {
        Self {
            tag_ttl: "5m".into(),
            digest_ttl: "24h".into(),
            failure_ttl: "10s".into(),
            stale_if_error: "1h".into(),
            max_entries: 20_000,
        }
    }
}

/// `[shared_cache]` as written: Redis or Valkey behind the in-memory cache.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct SharedCacheSection {
    url: String,
    password_file: Option<PathBuf>,
    /// Only an environment variable may write it.
    pub(super) password: Option<Password>,
    ca_path: Option<PathBuf>,
}

/// `[circuit_breaker]` as written, per registry host.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct BreakerSection {
    failures: u32,
    cooldown: String,
}

impl Default for BreakerSection {
    fn default() -> Self {
        Self {
            failures: 5,
            cooldown: "30s".into(),
        }
    }
}

/// `[credentials]` as written: where registry credentials come from besides anonymous access.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct CredentialsSection {
    pub(super) read_pull_secrets: bool,
    pub(super) files_path: Option<PathBuf>,
    pub(super) docker_config_path: Option<PathBuf>,
    provider_config: Option<PathBuf>,
    pub(super) provider_bin_dir: Option<PathBuf>,
}

impl Default for CredentialsSection {
    fn default() -> Self {
        Self {
            read_pull_secrets: true,
            files_path: None,
            docker_config_path: None,
            provider_config: None,
            provider_bin_dir: None,
        }
    }
}

/// The lookups' settings: the registry's timeouts, hosts and rules, the caches and the breaker.
pub(super) fn validate(
    registry: &RegistrySection,
    cache: &CacheSection,
    shared_cache: &SharedCacheSection,
    breaker: &BreakerSection,
) -> Result<ResolverSettings, ConfigError> {
    let lookup_timeout = parse_duration("registry.lookup_timeout", &registry.lookup_timeout)?;
    if lookup_timeout.is_zero() || lookup_timeout > MAX_LOOKUP_TIMEOUT {
        return Err(ConfigError::key(
            "registry.lookup_timeout",
            "must be above 0 and at most 30s (the API server's longest webhook timeout)",
        ));
    }
    let connect_timeout = parse_duration("registry.connect_timeout", &registry.connect_timeout)?;
    if connect_timeout.is_zero() {
        return Err(ConfigError::key(
            "registry.connect_timeout",
            "must be above 0",
        ));
    }
    let access = AccessRules::new(&registry.allowlist.0, &registry.denylist.0).map_err(|e| {
        // The registry names its lists by their flat keys: `registry_allowlist`.
        let list = e.key.strip_prefix("registry_").unwrap_or(e.key);
        ConfigError::key(&format!("registry.{list}"), e.reason)
    })?;
    let extra_roots_pem = match &registry.ca_path {
        Some(path) => vec![read_ca_bundle("registry.ca_path", path)?],
        None => Vec::new(),
    };
    Ok(ResolverSettings {
        transport: TransportSettings {
            connect_timeout,
            read_timeout: lookup_timeout,
            insecure_registries: validate_insecure(&registry.insecure)?,
            extra_roots_pem,
            access,
        },
        mirrors: validate_mirrors(&registry.mirrors)?,
        lookup_timeout,
        cache: cache.validate()?,
        breaker: breaker.validate()?,
        shared_cache: shared_cache.validate()?,
    })
}

impl SharedCacheSection {
    /// `url` and its password (a file, or the environment) and CA. Errors never repeat the
    /// password, in the URL or elsewhere.
    fn validate(&self) -> Result<Option<SharedCacheSettings>, ConfigError> {
        if self.url.trim().is_empty() {
            let stray = [
                ("shared_cache.password_file", self.password_file.is_some()),
                ("shared_cache.password", self.password.is_some()),
                ("shared_cache.ca_path", self.ca_path.is_some()),
            ];
            return match stray.into_iter().find(|(_, set)| *set) {
                Some((key, _)) => Err(ConfigError::key(key, "is set, but shared_cache.url is not")),
                None => Ok(None),
            };
        }
        let password = match (&self.password_file, &self.password) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::key(
                    "shared_cache.password_file",
                    "and shared_cache.password are both set: give the password once",
                ))
            }
            (Some(path), None) => Some(read_password(path)?),
            (None, password) => password.clone().map(|p| p.0),
        };
        let ca_pem = match &self.ca_path {
            Some(path) => Some(read_ca_bundle("shared_cache.ca_path", path)?),
            None => None,
        };
        let settings = SharedCacheSettings::new(&self.url, password, ca_pem)
            .map_err(|reason| ConfigError::key("shared_cache.url", reason))?;
        settings
            .check()
            .map_err(|reason| ConfigError::key("shared_cache.url", reason))?;
        Ok(Some(settings))
    }
}

/// The password in `path` (one line; surrounding whitespace dropped), read once at start-up.
fn read_password(path: &Path) -> Result<String, ConfigError> {
    let key = "shared_cache.password_file";
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

impl CacheSection {
    fn validate(&self) -> Result<CacheSettings, ConfigError> {
        if self.max_entries == 0 {
            return Err(ConfigError::key("cache.max_entries", "must be at least 1"));
        }
        Ok(CacheSettings {
            tag_ttl: parse_duration("cache.tag_ttl", &self.tag_ttl)?,
            digest_ttl: parse_duration("cache.digest_ttl", &self.digest_ttl)?,
            failure_ttl: parse_duration("cache.failure_ttl", &self.failure_ttl)?,
            stale_ttl: parse_duration("cache.stale_if_error", &self.stale_if_error)?,
            max_entries: self.max_entries,
        })
    }
}

impl BreakerSection {
    fn validate(&self) -> Result<BreakerSettings, ConfigError> {
        let breaker = BreakerSettings {
            failures: self.failures,
            cooldown: parse_duration("circuit_breaker.cooldown", &self.cooldown)?,
        };
        if breaker.failures > 0 && breaker.cooldown.is_zero() {
            return Err(ConfigError::key(
                "circuit_breaker.cooldown",
                "must be above 0 (set circuit_breaker.failures = 0 to turn the breaker off)",
            ));
        }
        Ok(breaker)
    }
}

/// Host names ignore case: `Registry.Example.com:5000` is the host images call
/// `registry.example.com:5000`.
fn validate_insecure(hosts: &List) -> Result<Vec<String>, ConfigError> {
    hosts
        .0
        .iter()
        .map(|r| {
            crate::registry::reference::validate_host(r)
                .map(|()| r.to_ascii_lowercase())
                .map_err(|why| ConfigError::key("registry.insecure", format!("{r:?}: {why}")))
        })
        .collect()
}

fn validate_mirrors(raw: &TextMap) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut mirrors = BTreeMap::new();
    for (registry, mirror) in &raw.0 {
        let key = format!("registry.mirrors.{registry}");
        let mirror = mirror.trim().to_owned();
        crate::registry::reference::validate_host(&mirror)
            .map_err(|why| ConfigError::key(&key, format!("mirror {mirror:?}: {why}")))?;
        mirrors.insert(normalize_registry_key(registry), mirror);
    }
    Ok(mirrors)
}

impl CredentialsSection {
    /// The credential files exist; the kubelet's CredentialProviderConfig is read, with why any
    /// of its providers were skipped.
    pub(super) fn validate(&self) -> Result<(Vec<Provider>, Vec<String>), ConfigError> {
        for (key, path) in [
            ("credentials.files_path", &self.files_path),
            ("credentials.docker_config_path", &self.docker_config_path),
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
        self.providers()
    }

    /// The kubelet's CredentialProviderConfig, whose plugins are in `provider_bin_dir` (which
    /// may also hold Docker credential helpers on its own).
    fn providers(&self) -> Result<(Vec<Provider>, Vec<String>), ConfigError> {
        const CONFIG: &str = "credentials.provider_config";
        const BIN_DIR: &str = "credentials.provider_bin_dir";
        if let Some(bin_dir) = &self.provider_bin_dir {
            if !bin_dir.is_dir() {
                return Err(ConfigError::key(
                    BIN_DIR,
                    format!("{} is not a directory", bin_dir.display()),
                ));
            }
        }
        match (&self.provider_config, &self.provider_bin_dir) {
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
