//! Where each key came from (an environment variable or the file), so an error names what the
//! operator wrote; and the check that every key written is one tolerable knows, with the nearest
//! known key suggested.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use super::{RawConfig, RawTemplate, RawTolerations, RawWeighted, ENV_PREFIX};

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
    /// `variables`: `TOLERABLE_*` config variables (name, value).
    pub(crate) fn new<'a>(
        file: Option<(&Path, &toml::Table)>,
        variables: impl IntoIterator<Item = &'a String>,
    ) -> Self {
        let variables = variables
            .into_iter()
            .map(|name| (key_of_variable(name), name.clone()))
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
            Some(super::ConfigError::UnknownKey {
                origin: Origin::Variable(name.clone()),
                key: key.clone(),
                nearest: variable_of_key(&nearest),
            })
        });
        let file = self.file.iter().flat_map(|(path, keys)| {
            keys.iter().map(|key| {
                let nearest = nearest_key(key)?;
                Some(super::ConfigError::UnknownKey {
                    origin: Origin::File(path.clone()),
                    key: key.clone(),
                    nearest: format!("`{nearest}`"),
                })
            })
        });
        variables.chain(file).flatten().next()
    }
}

/// `TOLERABLE_TOLERATIONS__EFFECT` → `tolerations.effect`, as config-rs reads it.
fn key_of_variable(name: &str) -> String {
    let key = name
        .strip_prefix(ENV_PREFIX)
        .and_then(|k| k.strip_prefix('_'))
        .unwrap_or(name);
    key.to_ascii_lowercase().replace("__", ".")
}

/// `tolerations.effect` → `TOLERABLE_TOLERATIONS__EFFECT`.
fn variable_of_key(key: &str) -> String {
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
/// known; a map's entries (`registry_mirrors.<registry>`, `architecture_tolerations.<arch>`)
/// may be named anything; what lies below a plain value is left to its type check.
fn nearest_key(key: &str) -> Option<String> {
    let path: Vec<&str> = key.split('.').collect();
    let top = field_names::<RawConfig>();
    let (known, at) = match path.as_slice() {
        [first, ..] if !top.contains(first) => (top, 0),
        ["tolerations", _, ..] => (field_names::<RawTolerations>(), 1),
        ["architecture_tolerations", _, _, ..] => (field_names::<RawTemplate>(), 2),
        ["preferred_architecture", _, ..] => (field_names::<RawWeighted>(), 1),
        _ => return None,
    };
    if known.contains(&path[at]) {
        return None;
    }
    let nearest = known
        .iter()
        .min_by_key(|candidate| edit_distance(path[at], candidate))?;
    let mut out = path[..at].to_vec();
    out.push(nearest);
    Some(out.join("."))
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
        let top = field_names::<RawConfig>();
        assert!(top.contains(&"lookup_timeout") && top.contains(&"registry_mirrors"));
        assert_eq!(
            field_names::<RawTolerations>(),
            ["key", "operator", "effect", "toleration_seconds"]
        );
        assert_eq!(field_names::<RawWeighted>(), ["architecture", "weight"]);
    }

    #[test]
    fn nearest_keys() {
        for (key, want) in [
            ("lookup_timeout", None),
            ("lookup_timeot", Some("lookup_timeout")),
            ("registry_mirror", Some("registry_mirrors")),
            ("tolerations.efect", Some("tolerations.effect")),
            ("tolerations.effect", None),
            ("registry_mirrors.docker.io", None),
            ("architecture_tolerations.arm64", None),
            (
                "architecture_tolerations.arm64.vale",
                Some("architecture_tolerations.arm64.value"),
            ),
            (
                "preferred_architecture.wieght",
                Some("preferred_architecture.weight"),
            ),
            // Below a plain value: its type check reports it.
            ("skip_namespaces.x", None),
        ] {
            assert_eq!(nearest_key(key).as_deref(), want, "{key}");
        }
    }

    #[test]
    fn origins() {
        let table: toml::Table = r#"
            lookup_timeout = "3s"
            [registry_mirrors]
            "docker.io" = "mirror.gcr.io"
            [[architecture_tolerations.arm64]]
            key = "k"
        "#
        .parse()
        .unwrap();
        let variables = ["TOLERABLE_TOLERATIONS__EFFECT".to_owned()];
        let sources = Sources::new(Some((Path::new("/etc/t.toml"), &table)), &variables);
        let file = Origin::File("/etc/t.toml".into());
        let variable = Origin::Variable("TOLERABLE_TOLERATIONS__EFFECT".into());
        for (key, want) in [
            ("lookup_timeout", &file),
            ("registry_mirrors.docker.io", &file),
            ("registry_mirrors", &file),
            ("architecture_tolerations.arm64[0].key", &file),
            ("tolerations.effect", &variable),
            ("tolerations", &variable),
            ("lookup_timeout_x", &Origin::Default),
            ("cache_tag_ttl", &Origin::Default),
        ] {
            assert_eq!(&sources.origin_of(key), want, "{key}");
        }
    }
}
