//! `[registry]`, `[cache]`, `[shared_cache]`, `[circuit_breaker]` and `[credentials]`: how images
//! are looked up — the hosts and their rules, the caches, the breaker, and the credentials —
//! checked into the registry's [`ResolverSettings`] and the credential sources.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::reference::{KeyDoc, SectionDoc};
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
#[derive(Debug, Deserialize, Serialize)]
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
#[derive(Debug, Deserialize, Serialize)]
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
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct SharedCacheSection {
    url: String,
    password_file: Option<PathBuf>,
    /// Only an environment variable may write it; never printed (the reference lists the key
    /// without a value).
    #[serde(skip_serializing)]
    pub(super) password: Option<Password>,
    ca_path: Option<PathBuf>,
}

/// `[circuit_breaker]` as written, per registry host.
#[derive(Debug, Deserialize, Serialize)]
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
#[derive(Debug, Deserialize, Serialize)]
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

pub(super) const CREDENTIALS_DOC: SectionDoc = SectionDoc {
    name: "credentials",
    banner: Some("Registries"),
    about: &[],
    intro: "",
    keys: &[
        KeyDoc {
            key: "read_pull_secrets",
            meaning: "read Pods' and ServiceAccounts' imagePullSecrets from the API (needs `get` on secrets and serviceaccounts)",
            about: &[
                "Read each Pod's imagePullSecrets and its ServiceAccount's from the API server and use them for",
                "the Pod's images (before the credential files below, then anonymous access). Needs RBAC: get on",
                "secrets and serviceaccounts (shipped in kustomize/base). false: no API access is needed at all.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "files_path",
            meaning: "directory of `<registry>.toml` credential files (`user`, `secret`)",
            about: &[
                "Directory of per-registry credential files: <registry>.toml with `user` and `secret`",
                "(see creds.example/). Docker Hub is docker.io.toml; host:port is written host_port.toml.",
            ],
            example: Some("\"/etc/tolerable/creds\""),
            inline: None,
            default_note: None,
            deployed: true,
        },
        KeyDoc {
            key: "docker_config_path",
            meaning: "a Docker `config.json` with more credentials; its `credHelpers` / `credsStore` helpers are run",
            about: &[
                "A Docker config.json / .dockerconfigjson file ({\"auths\": {...}}) with more credentials, tried",
                "after the files above. Its credential helpers are run as Docker runs them",
                "(docker-credential-<name> get, looked for in provider_bin_dir, then on PATH): a",
                "registry's own credHelpers entry instead of its auths entry, else credsStore after the auths",
                "entry. A helper's answer is kept 5 minutes.",
            ],
            example: Some("\"/etc/tolerable/docker/config.json\""),
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "provider_config",
            meaning: "the kubelet's CredentialProviderConfig (`kubelet.config.k8s.io/v1` or `v1beta1`): credential provider plugins to run for the images they match; needs `provider_bin_dir`",
            about: &[
                "Kubelet image credential provider plugins (ecr-credential-provider, auth-provider-gcp,",
                "acr-credential-provider, …): the kubelet's own CredentialProviderConfig file",
                "(kubelet.config.k8s.io/v1 or v1beta1, YAML or JSON) — the one your nodes use, unchanged — and",
                "the directory of the plugins it names (the kubelet's --image-credential-provider-config and",
                "--image-credential-provider-bin-dir). An image matching a provider's matchImages is looked up",
                "with the credentials its plugin gives: after the Pod's pull secrets, before the files above.",
                "The config needs the bin dir; the bin dir alone holds Docker credential helpers.",
            ],
            example: Some("\"/etc/tolerable/credential-providers/config.yaml\""),
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "provider_bin_dir",
            meaning: "the directory of those plugins; also searched for `docker-credential-<name>` helpers before `PATH`",
            about: &[],
            example: Some("\"/usr/local/lib/tolerable/credential-providers\""),
            inline: None,
            default_note: None,
            deployed: false,
        },
    ],
};

pub(super) const REGISTRY_DOC: SectionDoc = SectionDoc {
    name: "registry",
    banner: None,
    about: &[],
    intro: "",
    keys: &[
        KeyDoc {
            key: "lookup_timeout",
            meaning: "budget of one image lookup, every round trip included (at most 30s)",
            about: &[
                "Budget for one image lookup, all registry round trips, mirrors and fallbacks included.",
                "Keep it well inside the webhook's timeoutSeconds (10 s by default). At most 30s.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "connect_timeout",
            meaning: "TCP connect timeout",
            about: &[
                "TCP connect timeout for registries.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "ca_path",
            meaning: "extra CA certificates (PEM) for registries",
            about: &[
                "Extra CA certificates (PEM bundle) trusted for registries, on top of the system's.",
            ],
            example: Some("\"/etc/tolerable/registry-ca.pem\""),
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "insecure",
            meaning: "`host:port` spoken to over plain http",
            about: &[
                "host:port of registries (and token services) spoken to over plain http. Everything else is https.",
                "Names ignore case. A redirect never goes from https down to http, listed or not.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "allowlist",
            meaning: "hosts tolerable may contact (registries, mirrors, token realms, redirect targets): `host`, `host:port`, `*.example.com`, `*.dkr.ecr.*.amazonaws.com`, an address, `address:port` (`10.0.0.5:5000`, `[fd00::5]:5000`) or a CIDR; empty: every host not denied",
            about: &[
                "Which hosts tolerable may contact at all: image registries, mirrors, token services (Bearer",
                "realms) and redirect targets. Entries: a host name (any port), host:port (that port only),",
                "wildcards (\"*.example.com\": a leading * is one or more labels; \"*.dkr.ecr.*.amazonaws.com\":",
                "an inner * is exactly one), an address or a CIDR network (every port), or an address with",
                "a port: \"10.0.0.5:5000\", \"[fd00::5]:5000\" (that port only). Case is ignored.",
                "Names are also judged by the addresses they resolve to, when tolerable connects; the port is",
                "not known there, so an address with a port allows only images and URLs written with that",
                "address (allow a name as host:port), and in the denylist it denies that address on every port",
                "for names that resolve to it.",
                "Empty allowlist: every host not denied. Non-empty: only what it names (a name it does not",
                "name is allowed when it resolves into one of its networks).",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "denylist",
            meaning: "hosts never contacted, same forms; wins over the allowlist. Setting it replaces the list, but the two link-local entries stay denied unless the allowlist names an address or network inside them",
            about: &[
                "Setting the denylist replaces this list, but the two link-local entries stay denied anyway",
                "(cloud metadata services are never a registry): to reach such an address, name it (or a",
                "network inside 169.254.0.0/16) in the allowlist and leave it out of the denylist.",
                "A denylist entry always wins over the allowlist.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "mirrors",
            meaning: "table `[registry.mirrors]`: registry → mirror host asked first (in a variable `docker.io=mirror.example:5000, quay.io=…`)",
            about: &[
                "Registry -> mirror host to ask first (for rate limits and outages); on any mirror failure the",
                "origin is asked. Registry names as images spell them; Docker Hub is \"docker.io\". In the",
                "environment: TOLERABLE_REGISTRY__MIRRORS=\"docker.io=mirror.gcr.io, quay.io=quay-mirror.example\".",
            ],
            example: Some("\"docker.io\" = \"mirror.gcr.io\""),
            inline: None,
            default_note: None,
            deployed: false,
        },
    ],
};

pub(super) const CACHE_DOC: SectionDoc = SectionDoc {
    name: "cache",
    banner: None,
    about: &[],
    intro: "The in-memory cache of answers.",
    keys: &[
        KeyDoc {
            key: "tag_ttl",
            meaning: "how long an answer by tag is trusted; then a HEAD revalidates it",
            about: &[
                "Answers by tag are trusted this long (tags move), then revalidated with a HEAD (free on Docker",
                "Hub; a GET only when the tag moved to a digest not known yet); answers by digest are immutable",
                "and kept longer (bounded to free memory); failures only briefly, so an outage is not hammered.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "digest_ttl",
            meaning: "how long an answer by digest is kept",
            about: &[],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "failure_ttl",
            meaning: "how long a failure is remembered",
            about: &[],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "stale_if_error",
            meaning: "how long a tag's last known answer may stand in while its registry is unavailable (`\"0s\"`: never)",
            about: &[
                "Stale-if-error: while a registry is unavailable (down, hung, 5xx, 429), a tag's last known",
                "answer is still used this long after it stopped being fresh, with a warning saying so.",
                "\"0s\" turns it off. An authoritative answer (not found, unauthorized) is never papered over.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "max_entries",
            meaning: "most images remembered (an entry over 1 KiB counts once per KiB); failures get a tenth of that",
            about: &[
                "Most images remembered at once (an answer over 1 KiB counts once per started KiB, so the",
                "cache is bounded in bytes too). Failures are kept apart, in a tenth of that.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
    ],
};

pub(super) const SHARED_CACHE_DOC: SectionDoc = SectionDoc {
    name: "shared_cache",
    banner: None,
    about: &[
        "Shared cache (opt-in): Redis or Valkey behind the in-memory cache, shared by every replica.",
        "A replica asks it before any registry and writes what it learns (answers by digest for",
        "[cache] digest_ttl, a tag's digest for tag_ttl, failures for failure_ttl), so a cluster asks a",
        "registry once per tag and TTL, and a restarted replica starts warm. Slow or down: the",
        "in-memory cache answers alone (a warning, tolerable_shared_cache_* metrics), and it reconnects",
        "by itself. \"redis://host:6379/0\", \"rediss://…\" (TLS), valkey:// and valkeys:// too; \"\" turns",
        "it off. The password comes from a file or TOLERABLE_SHARED_CACHE__PASSWORD (from a Secret),",
        "never from this file, and is never logged.",
    ],
    intro: "Redis or Valkey behind the in-memory cache, shared by every replica (opt-in).",
    keys: &[
        KeyDoc {
            key: "url",
            meaning: "`redis://host:6379/0`, `rediss://…` (TLS), `valkey://`, `valkeys://`",
            about: &[],
            example: None,
            inline: None,
            default_note: Some("`\"\"` (off)"),
            deployed: false,
        },
        KeyDoc {
            key: "password_file",
            meaning: "file holding the password (read at start)",
            about: &[],
            example: Some("\"/etc/tolerable/cache/password\""),
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "password",
            meaning: "the password, from the environment only (from a Secret); refused in the file, never logged",
            about: &[],
            example: Some("(environment only: TOLERABLE_SHARED_CACHE__PASSWORD)"),
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "ca_path",
            meaning: "roots (PEM) to trust for `rediss://` instead of the system's",
            about: &[
                "Roots to trust for rediss:// instead of the system's (e.g. Memorystore's server CA), PEM.",
            ],
            example: Some("\"/etc/tolerable/cache/ca.pem\""),
            inline: None,
            default_note: None,
            deployed: false,
        },
    ],
};

pub(super) const BREAKER_DOC: SectionDoc = SectionDoc {
    name: "circuit_breaker",
    banner: None,
    about: &[
        "Circuit breaker, per registry host: after this many consecutive failures of the registry",
        "(connect errors, timeouts, 5xx, 429) it is left alone for `cooldown`, then one probe lookup is",
        "let through; lookups meanwhile fail at once (or use the last known answer). 0 turns it off.",
        "A 429's Retry-After (in seconds, at most 10 minutes) is always honoured.",
    ],
    intro: "Per registry host.",
    keys: &[
        KeyDoc {
            key: "failures",
            meaning: "consecutive registry failures that stop tolerable asking it (`0`: never)",
            about: &[],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "cooldown",
            meaning: "how long it is then left alone, before one probe lookup",
            about: &[],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
    ],
};
