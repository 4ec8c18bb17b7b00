//! The shapes of values the sections share: words (a key taking one of an enum's words, refused
//! by validation naming the key), lists and maps that an environment variable writes as one
//! string, numbers that arrive as text, and a password `Debug` never shows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::mutate::{OnLookupFailure, OnNoCommonArchitecture, Steering, TolerationOperator};

/// A key that takes one of a set of words, spelled as serde's derive spells the enum's variants
/// (`rename_all`). A word outside the set is kept rather than refused while deserializing, so
/// validation reports it the way it reports every bad value: `config key `steering`: "sideways"
/// is not off, node_selector or node_affinity`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Word<T> {
    Known(T),
    Unknown {
        text: String,
        /// The words the enum takes.
        expected: &'static [&'static str],
    },
}

/// An enum a config key takes one word of: the config's own enums through their serde derive,
/// the core's through a mirror here (the core crate has no serde derive for them, and the
/// orphan rule keeps this crate from giving them one).
pub(super) trait Words: Sized {
    fn from_word(
        words: serde::de::value::StrDeserializer<'_, UnknownWord>,
    ) -> Result<Self, UnknownWord>;

    /// The word, as the config writes it (the reference prints the defaults with it).
    fn serialize_word<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error>;
}

impl<T: Words> Word<T> {
    /// `text`, trimmed, as one of `T`'s words.
    pub(super) fn parse(text: &str) -> Self {
        let text = text.trim();
        let words = serde::de::value::StrDeserializer::<UnknownWord>::new(text);
        match T::from_word(words) {
            Ok(word) => Self::Known(word),
            Err(UnknownWord(expected)) => Self::Unknown {
                text: text.to_owned(),
                expected,
            },
        }
    }

    pub(super) fn get(self, key: &str) -> Result<T, ConfigError> {
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

impl<T: Words> Serialize for Word<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Known(word) => word.serialize_word(serializer),
            Self::Unknown { text, .. } => serializer.serialize_str(text),
        }
    }
}

impl<'de, T: Words> Deserialize<'de> for Word<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Self::parse(&String::deserialize(deserializer)?))
    }
}

/// Why serde's derive refused a word: the words it takes.
#[derive(Debug)]
pub(super) struct UnknownWord(&'static [&'static str]);

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

/// The words of the core's enums through a mirror deriving them with `#[serde(remote = …)]`:
/// the words live here, with the config, and the core stays free of serde derives.
macro_rules! words_of {
    ($($mirror:ident => $remote:ty),* $(,)?) => {$(
        impl Words for $remote {
            fn from_word(
                words: serde::de::value::StrDeserializer<'_, UnknownWord>,
            ) -> Result<Self, UnknownWord> {
                $mirror::deserialize(words)
            }

            fn serialize_word<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                $mirror::serialize(self, serializer)
            }
        }
    )*};
}

/// The words of the config's own enums, as their serde derive spells them.
macro_rules! words_by_serde {
    ($($local:ty),* $(,)?) => {$(
        impl $crate::config::values::Words for $local {
            fn from_word(
                words: serde::de::value::StrDeserializer<'_, $crate::config::values::UnknownWord>,
            ) -> Result<Self, $crate::config::values::UnknownWord> {
                <Self as serde::Deserialize>::deserialize(words)
            }

            fn serialize_word<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                <Self as serde::Serialize>::serialize(self, serializer)
            }
        }
    )*};
}
pub(super) use words_by_serde;

/// The words of the core's enums, mirrored for `#[serde(remote)]`.
mod words {
    use super::*;

    #[derive(Deserialize, Serialize)]
    #[serde(remote = "Steering", rename_all = "snake_case")]
    pub(crate) enum SteeringWords {
        Off,
        NodeSelector,
        NodeAffinity,
    }

    #[derive(Deserialize, Serialize)]
    #[serde(remote = "OnNoCommonArchitecture", rename_all = "snake_case")]
    pub(crate) enum OnNoCommonArchitectureWords {
        Deny,
        Warn,
    }

    #[derive(Deserialize, Serialize)]
    #[serde(remote = "OnLookupFailure", rename_all = "snake_case")]
    pub(crate) enum OnLookupFailureWords {
        Allow,
        Deny,
        Gate,
    }

    #[derive(Deserialize, Serialize)]
    #[serde(remote = "TolerationOperator")]
    pub(crate) enum TolerationOperatorWords {
        Equal,
        Exists,
    }
}

words_of!(
    SteeringWords => Steering,
    OnNoCommonArchitectureWords => OnNoCommonArchitecture,
    OnLookupFailureWords => OnLookupFailure,
    TolerationOperatorWords => TolerationOperator,
);
use words::*;

/// The shared cache's password as written (only an environment variable may write it): never
/// shown, not even by `Debug`.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub(super) struct Password(pub(super) String);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A list written as a TOML array or, in an environment variable, as `a, b, c`. Items are
/// trimmed and empty items dropped.
#[derive(Debug, Default, Serialize)]
#[serde(transparent)]
pub(super) struct List(pub(super) Vec<String>);

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
#[derive(Debug, Default, Serialize)]
#[serde(transparent)]
pub(super) struct TextMap(pub(super) BTreeMap<String, String>);

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

/// A number as TOML writes it, or as an environment variable does (text): config-rs hands
/// variables over as strings, and an untagged enum cannot convert them itself.
pub(super) fn number_or_text<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<i64>, D::Error> {
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
