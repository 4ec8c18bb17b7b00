//! The flat keys of before the sections (`cache_stale_if_error`), still read — from the file
//! and as `TOLERABLE_CACHE_STALE_IF_ERROR` — as their keys in a section (`[cache]
//! stale_if_error`, `TOLERABLE_CACHE__STALE_IF_ERROR`), each with a warning naming the new key.
//! One key written both ways in one place (the file, or the environment) is refused: which
//! one was meant is not for tolerable to guess. A variable of either form overrides the
//! file's key of either form, as variables always do.

use std::collections::HashMap;
use std::path::Path;

use super::source::{key_of_variable, variable_of_key};
use super::ConfigError;

/// Every flat key that moved: (flat key, section, key in the section). The keys that were
/// tables already (`[tolerations]`, `[architecture_tolerations]`) kept their place.
pub(crate) const FLAT_KEYS: &[(&str, &str, &str)] = &[
    ("listen_addr", "server", "listen_addr"),
    ("metrics_addr", "server", "metrics_addr"),
    ("worker_threads", "server", "worker_threads"),
    ("max_connections", "server", "max_connections"),
    (
        "max_connections_per_peer",
        "server",
        "max_connections_per_peer",
    ),
    ("max_requests_in_flight", "server", "max_requests_in_flight"),
    ("request_read_timeout", "server", "request_read_timeout"),
    (
        "connection_idle_timeout",
        "server",
        "connection_idle_timeout",
    ),
    ("ssl_cert_path", "tls", "cert_path"),
    ("ssl_key_path", "tls", "key_path"),
    ("tls_reload_name_check", "tls", "reload_name_check"),
    ("log_level", "log", "level"),
    ("log_format", "log", "format"),
    (
        "supported_architectures",
        "policy",
        "supported_architectures",
    ),
    ("default_architectures", "policy", "default_architectures"),
    ("skip_namespaces", "policy", "skip_namespaces"),
    ("steering", "policy", "steering"),
    ("preferred_architecture", "policy", "preferred_architecture"),
    (
        "on_no_common_architecture",
        "policy",
        "on_no_common_architecture",
    ),
    ("on_lookup_failure", "policy", "on_lookup_failure"),
    ("enforce", "policy", "enforce"),
    ("max_containers_per_pod", "policy", "max_containers_per_pod"),
    ("max_images_per_pod", "policy", "max_images_per_pod"),
    // Never a flat key in a release, but named so where it was asked for (issue 25's
    // `TOLERABLE_MATCH_NODE_LABELS`): read, with the warning that names the sectioned form.
    ("match_node_labels", "policy", "match_node_labels"),
    ("watch_nodes", "nodes", "watch"),
    ("manage_node_taints", "nodes", "manage_taints"),
    ("read_pull_secrets", "credentials", "read_pull_secrets"),
    ("registry_credential_path", "credentials", "files_path"),
    ("docker_config_path", "credentials", "docker_config_path"),
    (
        "credential_provider_config",
        "credentials",
        "provider_config",
    ),
    (
        "credential_provider_bin_dir",
        "credentials",
        "provider_bin_dir",
    ),
    ("lookup_timeout", "registry", "lookup_timeout"),
    ("registry_connect_timeout", "registry", "connect_timeout"),
    ("registry_ca_path", "registry", "ca_path"),
    ("insecure_registries", "registry", "insecure"),
    ("registry_allowlist", "registry", "allowlist"),
    ("registry_denylist", "registry", "denylist"),
    ("registry_mirrors", "registry", "mirrors"),
    ("cache_tag_ttl", "cache", "tag_ttl"),
    ("cache_digest_ttl", "cache", "digest_ttl"),
    ("cache_failure_ttl", "cache", "failure_ttl"),
    ("cache_stale_if_error", "cache", "stale_if_error"),
    ("cache_max_entries", "cache", "max_entries"),
    ("cache_url", "shared_cache", "url"),
    ("cache_password_file", "shared_cache", "password_file"),
    ("cache_password", "shared_cache", "password"),
    ("cache_ca_path", "shared_cache", "ca_path"),
    ("circuit_breaker_failures", "circuit_breaker", "failures"),
    ("circuit_breaker_cooldown", "circuit_breaker", "cooldown"),
];

/// The section and key a flat key moved to.
pub(super) fn moved(flat: &str) -> Option<(&'static str, &'static str)> {
    FLAT_KEYS
        .iter()
        .find(|(old, _, _)| *old == flat)
        .map(|(_, section, key)| (*section, *key))
}

/// How the reference and the warnings write a sectioned key: `[cache] stale_if_error`.
pub(crate) fn shown(section: &str, key: &str) -> String {
    format!("`[{section}] {key}`")
}

/// Moves the file's flat keys into their sections; the warnings, one per key moved.
pub(super) fn rewrite_file(
    path: &Path,
    table: &mut toml::Table,
) -> Result<Vec<String>, ConfigError> {
    let place = format!("config file {}: ", path.display());
    let mut warnings = Vec::new();
    for (old, section, key) in FLAT_KEYS {
        let Some(value) = table.remove(*old) else {
            continue;
        };
        let new = shown(section, key);
        let entry = table
            .entry(*section)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(inner) = entry else {
            return Err(ConfigError::Key {
                key: (*section).to_owned(),
                origin: super::Origin::File(path.to_owned()),
                reason: format!("is not a table, and `{old}` belongs in it as {new}"),
            });
        };
        if inner.contains_key(*key) {
            return Err(ConfigError::BothForms {
                place,
                old: format!("`{old}`"),
                new,
            });
        }
        inner.insert((*key).to_owned(), value);
        warnings.push(format!("{place}`{old}` is deprecated: use {new}"));
    }
    Ok(warnings)
}

/// The environment with the flat keys' variables renamed.
pub(super) struct RenamedEnv {
    /// The variables as config-rs is to read them.
    pub(super) variables: HashMap<String, String>,
    /// Each variable's name as read, and as the operator wrote it.
    pub(super) written_as: Vec<(String, String)>,
    /// One per variable renamed.
    pub(super) warnings: Vec<String>,
}

/// Renames the flat keys' variables to their sections' (`TOLERABLE_CACHE_URL` →
/// `TOLERABLE_SHARED_CACHE__URL`).
pub(super) fn rewrite_env(env: HashMap<String, String>) -> Result<RenamedEnv, ConfigError> {
    let mut out = HashMap::new();
    let mut names = Vec::new();
    let mut warnings = Vec::new();
    let mut sorted: Vec<(String, String)> = env.clone().into_iter().collect();
    sorted.sort();
    for (name, value) in sorted {
        let flat = key_of_variable(&name);
        let Some((section, key)) = moved(&flat) else {
            names.push((name.clone(), name.clone()));
            out.insert(name, value);
            continue;
        };
        let renamed = variable_of_key(&format!("{section}.{key}"));
        let new = shown(section, key);
        if env.contains_key(&renamed) {
            return Err(ConfigError::BothForms {
                place: "environment: ".into(),
                old: name,
                new: format!("{renamed} ({new})"),
            });
        }
        warnings.push(format!(
            "environment variable {name}: `{flat}` is deprecated: use {renamed} ({new})"
        ));
        names.push((renamed.clone(), name));
        out.insert(renamed, value);
    }
    Ok(RenamedEnv {
        variables: out,
        written_as: names,
        warnings,
    })
}
