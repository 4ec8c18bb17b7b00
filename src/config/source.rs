//! Where each key came from (an environment variable or the file), so an error names what the
//! operator wrote; and the check that every key written is one tolerable knows, with the nearest
//! known key suggested.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use super::deprecated::FLAT_KEYS;
use super::policy::{RawTemplate, RawWeighted};
use super::{ENV_PREFIX, SECTIONS};

/// Where a value came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Origin {
    /// Not written: the default.
    #[default]
    Default,
    /// The environment variable of that name.
    Variable(String),
    /// The config file at that path.
    File(PathBuf),
}

impl std::fmt::Display for Origin {
    /// A prefix for an error: empty for a default.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Default => Ok(()),
            Self::Variable(name) => write!(f, "environment variable {name}: "),
            Self::File(path) => write!(f, "config file {}: ", path.display()),
        }
    }
}

/// The keys the file and the environment write, as dotted paths (`tolerations.effect`).
#[derive(Debug, Default)]
pub(crate) struct Sources {
    /// Each variable's key path, with the variable's name.
    variables: Vec<(String, String)>,
    /// The file, with the key paths it writes (array items under their array's path).
    file: Option<(PathBuf, Vec<String>)>,
}

impl Sources {
    /// `variables`: `TOLERABLE_*` config variables, each as config-rs reads it (a deprecated
    /// name renamed) and as the operator wrote it.
    pub(crate) fn new(
        file: Option<(&Path, &toml::Table)>,
        variables: impl IntoIterator<Item = (String, String)>,
    ) -> Self {
        let variables = variables
            .into_iter()
            .map(|(read, written)| (key_of_variable(&read), written))
            .collect();
        let file = file.map(|(path, table)| {
            let mut keys = Vec::new();
            table_keys("", table, &mut keys);
            (path.to_owned(), keys)
        });
        Self { variables, file }
    }

    /// Where `key` (or the value it lies in, or a value inside it) was written; a variable wins
    /// over the file, as it does when they are merged.
    pub(crate) fn origin_of(&self, key: &str) -> Origin {
        // config-rs writes array items as `key[0]`: the file's paths have no index.
        let key: String = key.split('[').next().unwrap_or(key).to_owned();
        if let Some((_, name)) = self.variables.iter().find(|(k, _)| related(k, &key)) {
            return Origin::Variable(name.clone());
        }
        match &self.file {
            Some((path, keys)) if keys.iter().any(|k| related(k, &key)) => {
                Origin::File(path.clone())
            }
            _ => Origin::Default,
        }
    }

    /// The first key written that tolerable does not know, as an error naming where it came
    /// from and the nearest known key.
    pub(crate) fn unknown_key(&self) -> Option<super::ConfigError> {
        let variables = self.variables.iter().map(|(key, name)| {
            let nearest = nearest_key(key)?;
            let origin = Origin::Variable(name.clone());
            Some(unknown(origin, key, variable_of_key(&nearest), &nearest))
        });
        let file = self.file.iter().flat_map(|(path, keys)| {
            keys.iter().map(|key| {
                let nearest = nearest_key(key)?;
                let origin = Origin::File(path.clone());
                Some(unknown(origin, key, format!("`{nearest}`"), &nearest))
            })
        });
        variables.chain(file).flatten().next()
    }
}

/// The error for `key`, unknown, whose nearest known key is `nearest` (`spelled` as where it
/// was written spells keys): the same field in another section is said to belong there.
fn unknown(origin: Origin, key: &str, spelled: String, nearest: &str) -> super::ConfigError {
    match (key.split_once('.'), nearest.split_once('.')) {
        (Some((written, field)), Some((section, known)))
            if field == known && written != section =>
        {
            super::ConfigError::WrongSection {
                origin,
                key: key.to_owned(),
                section: section.to_owned(),
                nearest: spelled,
            }
        }
        _ => super::ConfigError::UnknownKey {
            origin,
            key: key.to_owned(),
            nearest: spelled,
        },
    }
}

/// The key `section.field` of another section when `key` is `written.field` and `field` is
/// one of that section's own (a key written in the wrong section).
fn in_another_section(key: &str) -> Option<String> {
    let (written, field) = key.split_once('.')?;
    super::known_keys().into_iter().find(|known| {
        known
            .split_once('.')
            .is_some_and(|(section, f)| f == field && section != written)
    })
}

/// `TOLERABLE_TOLERATIONS__EFFECT` → `tolerations.effect`, as config-rs reads it.
pub(super) fn key_of_variable(name: &str) -> String {
    let key = name
        .strip_prefix(ENV_PREFIX)
        .and_then(|k| k.strip_prefix('_'))
        .unwrap_or(name);
    key.to_ascii_lowercase().replace("__", ".")
}

/// `tolerations.effect` → `TOLERABLE_TOLERATIONS__EFFECT`.
pub(super) fn variable_of_key(key: &str) -> String {
    format!(
        "{ENV_PREFIX}_{}",
        key.replace('.', "__").to_ascii_uppercase()
    )
}

/// Whether `a` and `b` are the same key, or one lies inside the other.
fn related(a: &str, b: &str) -> bool {
    let inside = |inner: &str, outer: &str| {
        inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    };
    inside(a, b) || inside(b, a)
}

/// Every value's key path in `table` (a table inside an array under the array's path).
fn table_keys(prefix: &str, table: &toml::Table, keys: &mut Vec<String>) {
    for (name, value) in table {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        match value {
            toml::Value::Table(inner) => table_keys(&path, inner, keys),
            toml::Value::Array(items) if items.iter().any(toml::Value::is_table) => {
                for item in items {
                    if let toml::Value::Table(inner) = item {
                        table_keys(&path, inner, keys);
                    }
                }
            }
            _ => keys.push(path),
        }
    }
}

/// `None` when `key` is known; else the known key nearest to it. The sections' fields are
/// known; a map's entries (`registry.mirrors.<registry>`, `architecture_tolerations.<arch>`)
/// may be named anything; what lies below a plain value is left to its type check. A key
/// outside every section is compared with every section's keys and with the deprecated flat
/// keys (suggesting the key in its section), so `lookup_timout` suggests
/// `registry.lookup_timeout`.
fn nearest_key(key: &str) -> Option<String> {
    let path: Vec<&str> = key.split('.').collect();
    let section = SECTIONS.iter().find(|(name, _)| *name == path[0]);
    let (inner, at): (&[&str], usize) = match (section, path.as_slice()) {
        (None, _) => return nearest_anywhere(&path[..path.len().min(2)].join(".")),
        (Some((_, None)), ["architecture_tolerations", _, _, ..]) => {
            (field_names::<RawTemplate>(), 2)
        }
        (Some(_), ["policy", "preferred_architecture", _, ..]) => (field_names::<RawWeighted>(), 2),
        (Some((_, Some(keys))), [_, field, ..]) if !keys().contains(field) => {
            let written = path[..2].join(".");
            return in_another_section(&written).or_else(|| nearest_anywhere(&written));
        }
        _ => return None,
    };
    if inner.contains(&path[at]) {
        return None;
    }
    let nearest = inner
        .iter()
        .min_by_key(|candidate| edit_distance(path[at], candidate))?;
    let mut out = path[..at].to_vec();
    out.push(nearest);
    Some(out.join("."))
}

/// The key, of every section's (`section.key`) and the deprecated flat ones, nearest to
/// `written`, as its key in a section.
fn nearest_anywhere(written: &str) -> Option<String> {
    let sectioned = super::known_keys()
        .into_iter()
        .map(|key| (key.clone(), key));
    let flat = FLAT_KEYS
        .iter()
        .map(|(old, section, key)| ((*old).to_owned(), format!("{section}.{key}")));
    sectioned
        .chain(flat)
        .min_by_key(|(spelled, _)| edit_distance(written, spelled))
        .map(|(_, key)| key)
}

/// Levenshtein distance: the fewest insertions, deletions and substitutions of characters that
/// turn `a` into `b`.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    // `row[j]`: the distance between the part of `a` seen so far and `b[..j]`.
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

/// The keys a section takes, as serde's derive names them: the derive hands a struct's field
/// names to `deserialize_struct`, where this deserializer records them and stops. Taken from
/// the structs themselves, the list cannot drift from them.
pub(crate) fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    struct Fields<'a>(&'a mut &'static [&'static str]);

    impl<'de> serde::Deserializer<'de> for Fields<'_> {
        type Error = serde::de::value::Error;

        fn deserialize_any<V: serde::de::Visitor<'de>>(
            self,
            _: V,
        ) -> Result<V::Value, Self::Error> {
            Err(serde::de::Error::custom("not a struct"))
        }

        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(serde::de::Error::custom("fields recorded"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }

    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Fields(&mut fields));
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distances() {
        for (a, b, want) in [
            ("", "", 0),
            ("abc", "", 3),
            ("", "abc", 3),
            ("lookup_timeout", "lookup_timeout", 0),
            ("lookup_timout", "lookup_timeout", 1),
            ("lookup_timeot", "lookup_timeout", 1),
            ("lookup_timeout", "lookup_timeouts_", 2),
            ("kitten", "sitting", 3),
            ("flaw", "lawn", 2),
        ] {
            assert_eq!(edit_distance(a, b), want, "{a} → {b}");
            assert_eq!(edit_distance(b, a), want, "{b} → {a}");
        }
    }

    #[test]
    fn the_sections_fields_come_from_the_structs() {
        let top = field_names::<super::super::Sections>();
        assert_eq!(
            top,
            SECTIONS.iter().map(|(name, _)| *name).collect::<Vec<_>>()
        );
        assert_eq!(
            field_names::<super::super::policy::TolerationsSection>(),
            ["key", "operator", "effect", "toleration_seconds"]
        );
        assert_eq!(field_names::<RawWeighted>(), ["architecture", "weight"]);
    }

    #[test]
    fn nearest_keys() {
        for (key, want) in [
            ("registry.lookup_timeout", None),
            ("registry.lookup_timeot", Some("registry.lookup_timeout")),
            // A flat key misspelt: its key in its section.
            ("lookup_timeot", Some("registry.lookup_timeout")),
            ("registry_mirror", Some("registry.mirrors")),
            ("cache_stale_if_eror", Some("cache.stale_if_error")),
            // A key in another section's table, or a section misspelt.
            ("registry.stale_if_error", Some("cache.stale_if_error")),
            // A real key in the wrong section: that key, not a nearer one of this section.
            ("policy.lookup_timeout", Some("registry.lookup_timeout")),
            ("server.tag_ttl", Some("cache.tag_ttl")),
            ("cahce.tag_ttl", Some("cache.tag_ttl")),
            ("tolerations.efect", Some("tolerations.effect")),
            ("tolerations.effect", None),
            ("registry.mirrors.docker.io", None),
            ("architecture_tolerations.arm64", None),
            (
                "architecture_tolerations.arm64.vale",
                Some("architecture_tolerations.arm64.value"),
            ),
            (
                "policy.preferred_architecture.wieght",
                Some("policy.preferred_architecture.weight"),
            ),
            // Below a plain value: its type check reports it.
            ("policy.skip_namespaces.x", None),
            ("server", None),
        ] {
            assert_eq!(nearest_key(key).as_deref(), want, "{key}");
        }
    }

    #[test]
    fn origins() {
        let table: toml::Table = r#"
            [registry]
            lookup_timeout = "3s"
            [registry.mirrors]
            "docker.io" = "mirror.gcr.io"
            [[architecture_tolerations.arm64]]
            key = "k"
        "#
        .parse()
        .unwrap();
        let variables = [
            (
                "TOLERABLE_TOLERATIONS__EFFECT".to_owned(),
                "TOLERABLE_TOLERATIONS__EFFECT".to_owned(),
            ),
            (
                "TOLERABLE_CACHE__TAG_TTL".to_owned(),
                "TOLERABLE_CACHE_TAG_TTL".to_owned(),
            ),
        ];
        let sources = Sources::new(Some((Path::new("/etc/t.toml"), &table)), variables);
        let file = Origin::File("/etc/t.toml".into());
        let variable = Origin::Variable("TOLERABLE_TOLERATIONS__EFFECT".into());
        for (key, want) in [
            ("registry.lookup_timeout", &file),
            ("registry.mirrors.docker.io", &file),
            ("registry.mirrors", &file),
            ("architecture_tolerations.arm64[0].key", &file),
            ("tolerations.effect", &variable),
            ("tolerations", &variable),
            ("registry.lookup_timeout_x", &Origin::Default),
            ("cache.digest_ttl", &Origin::Default),
            // A deprecated variable is named as written.
            (
                "cache.tag_ttl",
                &Origin::Variable("TOLERABLE_CACHE_TAG_TTL".into()),
            ),
        ] {
            assert_eq!(&sources.origin_of(key), want, "{key}");
        }
    }
}
