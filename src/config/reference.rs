//! The reference of every config key, printed from the code: each section file describes its
//! keys once ([`SectionDoc`], [`KeyDoc`]: prose, example, what the deployed file sets), the
//! defaults are the sections' own `Default` serialized, and this module writes them out as
//! `tolerable.toml`, `kustomize/base/tolerable.toml`, the key tables of
//! `docs/configuration.md` and the chart's `config` values and schema. `tolerable reference`
//! (`cmd/reference.rs`) puts them in their files; `tests/project/generated.rs` fails when a
//! committed file differs from what it prints.

use std::fmt::Write as _;

use super::deprecated::FLAT_KEYS;
use super::source::variable_of_key;
use super::{policy, registry, server, workloads, Sections};

/// One key of a section, described once.
pub(super) struct KeyDoc {
    pub(super) key: &'static str,
    /// One line for the table of docs/configuration.md (Markdown).
    pub(super) meaning: &'static str,
    /// The comment above the key in tolerable.toml, line by line (empty: none, the key follows
    /// the one before without a blank line).
    pub(super) about: &'static [&'static str],
    /// A value written commented out when the key has no default (`# key = example`); for a
    /// table-valued key, the line written commented out under its header.
    pub(super) example: Option<&'static str>,
    /// A short comment after the value on the key's line (`refuse | warn`).
    pub(super) inline: Option<&'static str>,
    /// The default as the docs' table words it, where the value alone would not say it.
    pub(super) default_note: Option<&'static str>,
    /// The deployed file (kustomize/base, the chart's values) sets the key to its example: the
    /// paths where the Pod mounts its files, the separate metrics port.
    pub(super) deployed: bool,
}

/// One section: its place in tolerable.toml and docs/configuration.md, and its keys.
pub(super) struct SectionDoc {
    pub(super) name: &'static str,
    /// A heading comment before the section, starting a group of sections.
    pub(super) banner: Option<&'static str>,
    /// The comment above the section's header in tolerable.toml.
    pub(super) about: &'static [&'static str],
    /// The paragraph under the section's heading in docs/configuration.md (empty: none).
    pub(super) intro: &'static str,
    pub(super) keys: &'static [KeyDoc],
}

/// Every section, in the order of [`super::SECTIONS`] (a unit test keeps them equal).
pub(super) const SECTION_DOCS: &[&SectionDoc] = &[
    &server::SERVER_DOC,
    &server::TLS_DOC,
    &server::LOG_DOC,
    &policy::POLICY_DOC,
    &policy::TOLERATIONS_DOC,
    &policy::ARCHITECTURE_TOLERATIONS_DOC,
    &policy::NODES_DOC,
    &policy::EVENTS_DOC,
    &policy::CRASHES_DOC,
    &registry::CREDENTIALS_DOC,
    &registry::REGISTRY_DOC,
    &registry::CACHE_DOC,
    &registry::SHARED_CACHE_DOC,
    &registry::BREAKER_DOC,
    &workloads::WORKLOADS_DOC,
];

/// Keys only an environment variable may set: not in the chart's values (a Secret gives them).
const ENVIRONMENT_ONLY: &[&str] = &["shared_cache.password"];

/// Which tolerable.toml: the shipped one (every key at its default), or kustomize's deployed
/// one (the keys marked `deployed` set to their examples).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    Shipped,
    Deployed,
}

const SHIPPED_HEADER: &str =
    "# tolerable configuration. Every key is optional; the values below are the defaults.\n";
const DEPLOYED_HEADER: &str = "\
# tolerable configuration as deployed by kustomize: the repository's tolerable.toml with the paths
# of the mounted certificate and credential volumes set, and /metrics on its own port.
# Every key is optional; the values below are the defaults.
";
const HEADER: &str = "\
# Keys are grouped in sections. Every key can be overridden per cluster by an environment
# variable TOLERABLE_<SECTION>__<KEY> (upper case, two underscores between section and key, e.g.
# TOLERABLE_CACHE__STALE_IF_ERROR=\"30m\"; lists comma-separated, e.g.
# TOLERABLE_REGISTRY__INSECURE=\"a:5000, b:5000\"; maps name=value, e.g.
# TOLERABLE_REGISTRY__MIRRORS=\"docker.io=mirror.example:5000\").
# The flat keys of earlier versions (cache_stale_if_error, TOLERABLE_CACHE_STALE_IF_ERROR) are
# still read, with a warning naming the new key; a key written both ways in the file, or both
# ways in the environment, stops start-up (docs/configuration.md lists them all).
# The file itself is chosen with --config FILE or TOLERABLE_CONFIG; without either,
# ./tolerable.toml is read when it exists. A bad value stops start-up with the key, the variable
# or file it came from, and the reason; so does an unknown key, with the nearest known one.
# Printed by `tolerable reference` from src/config/ (make generate): edit the keys there.
";

/// Every section's defaults as its `Default` has them, serialized: the one copy of the
/// defaults (a key without one, an `Option` at `None`, is absent).
fn defaults() -> toml::Table {
    toml::Table::try_from(Sections::default()).expect("the sections serialize to TOML")
}

/// A section's defaults.
fn section_defaults(defaults: &toml::Table, section: &str) -> toml::Table {
    match defaults.get(section) {
        Some(toml::Value::Table(table)) => table.clone(),
        _ => toml::Table::new(),
    }
}

/// An example's TOML text as a value.
fn example_value(key: &KeyDoc) -> toml::Value {
    let example = key.example.expect("a deployed key has an example");
    let table: toml::Table = toml::from_str(&format!("v = {example}"))
        .unwrap_or_else(|e| panic!("{}'s example is not a TOML value: {e}", key.key));
    table["v"].clone()
}

/// The key's value in `profile`, when it has one.
fn value_of(defaults: &toml::Table, key: &KeyDoc, profile: Profile) -> Option<toml::Value> {
    if profile == Profile::Deployed && key.deployed {
        return Some(example_value(key));
    }
    defaults.get(key.key).cloned()
}

/// A value as TOML writes it inline (`"text"`, `["a", "b"]`, `{ k = "v" }`).
fn inline(value: &toml::Value) -> String {
    match value {
        toml::Value::String(text) => quoted(text),
        toml::Value::Array(items) => {
            let items: Vec<String> = items.iter().map(inline).collect();
            format!("[{}]", items.join(", "))
        }
        toml::Value::Table(table) if table.is_empty() => "{}".into(),
        toml::Value::Table(table) => {
            let items: Vec<String> = table
                .iter()
                .map(|(k, v)| format!("{} = {}", quoted(k), inline(v)))
                .collect();
            format!("{{ {} }}", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// A string as a JSON string: a valid TOML basic string and YAML double-quoted scalar.
fn quoted(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

/// A value as YAML writes it in flow style (the chart's values).
fn yaml(value: &toml::Value) -> String {
    match value {
        toml::Value::String(text) => quoted(text),
        toml::Value::Array(items) => {
            let items: Vec<String> = items.iter().map(yaml).collect();
            format!("[{}]", items.join(", "))
        }
        toml::Value::Table(table) => {
            let items: Vec<String> = table
                .iter()
                .map(|(k, v)| format!("{}: {}", quoted(k), yaml(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        other => other.to_string(),
    }
}

fn comment(out: &mut String, lines: &[&str]) {
    for line in lines {
        if line.is_empty() {
            out.push_str("#\n");
        } else {
            let _ = writeln!(out, "# {line}");
        }
    }
}

/// tolerable.toml as `profile` has it.
pub fn config_toml(profile: Profile) -> String {
    let defaults = defaults();
    let mut out = String::from(match profile {
        Profile::Shipped => SHIPPED_HEADER,
        Profile::Deployed => DEPLOYED_HEADER,
    });
    out.push_str(HEADER);
    for section in SECTION_DOCS {
        out.push('\n');
        if let Some(banner) = section.banner {
            let _ = writeln!(out, "# --- {banner} {}", "-".repeat(87 - banner.len()));
        }
        comment(&mut out, section.about);
        let _ = writeln!(out, "[{}]", section.name);
        let values = section_defaults(&defaults, section.name);
        for (i, key) in section.keys.iter().enumerate() {
            if key.key.starts_with('<') {
                continue; // a map's entries, named freely: the comment above shows them
            }
            toml_key(&mut out, (section.name, &values), key, profile, i > 0);
        }
    }
    out
}

/// One key of tolerable.toml: its comment, then the key set to its value, or commented out
/// with its example; a table-valued key as its own table, the example commented out in it.
fn toml_key(
    out: &mut String,
    (section, values): (&str, &toml::Table),
    key: &KeyDoc,
    profile: Profile,
    after: bool,
) {
    let value = value_of(values, key, profile);
    if let Some(toml::Value::Table(table)) = &value {
        out.push('\n');
        comment(out, key.about);
        let _ = writeln!(out, "[{section}.{}]", key.key);
        for (k, v) in table {
            let _ = writeln!(out, "{} = {}", quoted(k), inline(v));
        }
        if let Some(example) = key.example {
            let _ = writeln!(out, "# {example}");
        }
        return;
    }
    if after && !key.about.is_empty() {
        out.push('\n');
    }
    comment(out, key.about);
    let line = match (&value, key.example) {
        (Some(value), _) => format!("{} = {}", key.key, inline(value)),
        (None, Some(example)) => format!("# {} = {example}", key.key),
        (None, None) => format!("# {} =", key.key),
    };
    match key.inline {
        Some(note) => {
            let _ = writeln!(out, "{line}  # {note}");
        }
        None => {
            let _ = writeln!(out, "{line}");
        }
    }
}

/// docs/configuration.md's tables of keys, a heading per section.
pub fn configuration_md_keys() -> String {
    let defaults = defaults();
    let mut out = String::new();
    for (i, section) in SECTION_DOCS.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let _ = writeln!(out, "### `[{}]`\n", section.name);
        if !section.intro.is_empty() {
            let _ = writeln!(out, "{}\n", section.intro);
        }
        out.push_str("| key | variable | default | meaning |\n| --- | --- | --- | --- |\n");
        let values = section_defaults(&defaults, section.name);
        for key in section.keys {
            let default = match (key.default_note, values.get(key.key)) {
                (Some(note), _) => note.to_owned(),
                (None, Some(value)) => format!("`{}`", inline(value)),
                (None, None) if key.deployed => format!(
                    "unset (`{}` in the Deployment)",
                    inline(&example_value(key))
                ),
                (None, None) => "unset".to_owned(),
            };
            let variable = variable_of_key(&format!("{}.{}", section.name, key.key));
            let _ = writeln!(
                out,
                "| `{}` | `{variable}` | {default} | {} |",
                key.key, key.meaning
            );
        }
    }
    out
}

/// docs/configuration.md's table of the deprecated flat keys.
pub fn configuration_md_deprecated() -> String {
    let mut out = String::from(
        "| flat key | its variable | now | its variable |\n| --- | --- | --- | --- |\n",
    );
    for (old, section, key) in FLAT_KEYS {
        let _ = writeln!(
            out,
            "| `{old}` | `TOLERABLE_{}` | `[{section}] {key}` | `{}` |",
            old.to_ascii_uppercase(),
            variable_of_key(&format!("{section}.{key}"))
        );
    }
    out
}

/// The chart's `config` values: the deployed file's keys that have a value, as YAML.
pub fn values_yaml_config() -> String {
    let defaults = defaults();
    let mut out = String::from("config:\n");
    for section in SECTION_DOCS {
        let values = section_defaults(&defaults, section.name);
        let set: Vec<(&str, toml::Value)> = section
            .keys
            .iter()
            .filter_map(|key| Some((key.key, value_of(&values, key, Profile::Deployed)?)))
            .collect();
        if set.is_empty() {
            let _ = writeln!(out, "  {}: {{}}", section.name);
            continue;
        }
        let _ = writeln!(out, "  {}:", section.name);
        for (key, value) in set {
            let _ = writeln!(out, "    {key}: {}", yaml(&value));
        }
    }
    out
}

/// values.schema.json's `config` property (indented as it sits in the file): every section
/// and key tolerable takes, nothing else.
pub fn values_schema_config() -> String {
    let mut sections = Vec::new();
    for section in SECTION_DOCS {
        let name = section.name;
        if section.keys.iter().any(|k| k.key.starts_with('<')) {
            sections.push(format!(
                "        \"{name}\": {{\n          \"type\": \"object\",\n          \"description\": \"tolerable.toml's [{name}]: a template or a list of them per architecture (docs/configuration.md)\",\n          \"additionalProperties\": {{\n            \"type\": [\n              \"object\",\n              \"array\"\n            ]\n          }}\n        }}"
            ));
            continue;
        }
        let keys: Vec<String> = section
            .keys
            .iter()
            .filter(|k| !ENVIRONMENT_ONLY.contains(&format!("{name}.{}", k.key).as_str()))
            .map(|k| format!("            \"{}\": {{}}", k.key))
            .collect();
        let secret = if section
            .keys
            .iter()
            .any(|k| ENVIRONMENT_ONLY.contains(&format!("{name}.{}", k.key).as_str()))
        {
            "; the password is never in this file: sharedCache.passwordSecret"
        } else {
            ""
        };
        sections.push(format!(
            "        \"{name}\": {{\n          \"type\": \"object\",\n          \"description\": \"tolerable.toml's [{name}] (docs/configuration.md); tolerable checks the values at start{secret}\",\n          \"additionalProperties\": false,\n          \"properties\": {{\n{}\n          }}\n        }}",
            keys.join(",\n")
        ));
    }
    format!(
        "    \"config\": {{\n      \"type\": \"object\",\n      \"additionalProperties\": false,\n      \"properties\": {{\n{}\n      }},\n      \"description\": \"tolerable.toml by section and key (docs/configuration.md): a section or key tolerable does not have is refused\"\n    }}\n",
        sections.join(",\n")
    )
}
