//! Platforms (os / architecture / variant), normalised the way containerd's platform matching
//! normalises them, so `arm64/v8`, `aarch64` and `arm64` are one platform and `arm` means `arm/v7`.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Serialize, Serializer};

/// One platform an image can run on. The names are shared (interned): ten thousand cached images
/// name the same handful of operating systems and architectures.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Platform {
    #[serde(serialize_with = "as_str")]
    pub os: Arc<str>,
    #[serde(serialize_with = "as_str")]
    pub architecture: Arc<str>,
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "as_opt_str")]
    pub variant: Option<Arc<str>>,
}

fn as_str<S: Serializer>(value: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(value)
}

fn as_opt_str<S: Serializer>(value: &Option<Arc<str>>, s: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(v) => s.serialize_str(v),
        None => s.serialize_none(),
    }
}

/// Distinct names kept; past this, names are allocated per use (a registry inventing names must
/// not grow memory without bound).
const MAX_INTERNED: usize = 1024;

fn intern(name: &str) -> Arc<str> {
    static NAMES: OnceLock<Mutex<HashSet<Arc<str>>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Mutex::default)
        .lock()
        .expect("platform name table poisoned");
    if let Some(known) = names.get(name) {
        return known.clone();
    }
    let new: Arc<str> = Arc::from(name);
    if names.len() < MAX_INTERNED {
        names.insert(new.clone());
    }
    new
}

impl Platform {
    /// Builds a normalised platform from what a manifest or image config says.
    pub fn normalized(os: &str, architecture: &str, variant: Option<&str>) -> Self {
        let os = match os.to_ascii_lowercase().as_str() {
            "macos" => "darwin".to_owned(),
            other => other.to_owned(),
        };
        let (architecture, variant) = super::arch::normalize(
            &architecture.to_ascii_lowercase(),
            &variant.unwrap_or_default().to_ascii_lowercase(),
        );
        Self {
            os: intern(&os),
            architecture: intern(&architecture),
            variant: (!variant.is_empty()).then(|| intern(&variant)),
        }
    }

    /// Whether each name is a valid Kubernetes label value — what the `kubernetes.io/os` and
    /// `kubernetes.io/arch` node labels a patch selects on can hold: at most 63 characters,
    /// ASCII letters, digits, `-`, `_` and `.`, beginning and ending with a letter or digit.
    /// A registry can name anything; only such names may reach a patch.
    pub fn is_label_safe(&self) -> bool {
        let names = [
            Some(&self.os),
            Some(&self.architecture),
            self.variant.as_ref(),
        ];
        names.into_iter().flatten().all(|name| is_label_value(name))
    }

    /// Attestation and other non-runnable entries in an index say `unknown/unknown`.
    pub fn is_unknown(&self) -> bool {
        &*self.os == "unknown" || &*self.architecture == "unknown" || self.os.is_empty()
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(variant) = &self.variant {
            write!(f, "/{variant}")?;
        }
        Ok(())
    }
}

/// A non-empty Kubernetes label value: `[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?`.
fn is_label_value(name: &str) -> bool {
    let bytes = name.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    bytes.len() <= 63
        && first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_label_values_are_label_safe() {
        let ok = |os: &str, arch: &str, variant: Option<&str>| {
            Platform::normalized(os, arch, variant).is_label_safe()
        };
        assert!(ok("linux", "amd64", None));
        assert!(ok("linux", "arm", Some("v7")));
        assert!(ok("wasi", "wasm32", None));
        assert!(ok("linux", "my_arch.2-b", None));
        assert!(ok("linux", &"a".repeat(63), None));
        assert!(!ok("linux", &"a".repeat(64), None));
        for bad in [
            "",
            "-arm",
            "arm-",
            "arm64 x",
            "arm/64",
            "ärm",
            "a\u{2028}b",
            "x:y",
        ] {
            assert!(!ok("linux", bad, None), "{bad:?}");
            assert!(!ok(bad, "amd64", None), "{bad:?}");
        }
        assert!(!ok("linux", "arm", Some("v7 ")));
    }

    #[test]
    fn normalizes_like_containerd() {
        let cases: &[(&str, &str, Option<&str>, &str)] = &[
            ("linux", "amd64", None, "linux/amd64"),
            ("Linux", "x86_64", None, "linux/amd64"),
            ("linux", "x86-64", Some("v1"), "linux/amd64"),
            ("linux", "amd64", Some("v3"), "linux/amd64/v3"),
            ("linux", "arm64", Some("v8"), "linux/arm64"),
            ("linux", "aarch64", None, "linux/arm64"),
            ("linux", "arm64", Some("8"), "linux/arm64"),
            ("linux", "arm64", Some("9.0"), "linux/arm64/v9"),
            ("linux", "arm", None, "linux/arm/v7"),
            ("linux", "arm", Some("7"), "linux/arm/v7"),
            ("linux", "arm", Some("6"), "linux/arm/v6"),
            ("linux", "armhf", None, "linux/arm/v7"),
            ("linux", "armel", None, "linux/arm/v6"),
            ("linux", "i386", Some("x"), "linux/386"),
            ("linux", "s390x", None, "linux/s390x"),
            ("linux", "ppc64le", None, "linux/ppc64le"),
            ("windows", "amd64", None, "windows/amd64"),
            ("macos", "arm64", None, "darwin/arm64"),
            ("linux", "riscv64", Some(""), "linux/riscv64"),
        ];
        for (os, arch, variant, want) in cases {
            assert_eq!(
                Platform::normalized(os, arch, *variant).to_string(),
                *want,
                "{os}/{arch}/{variant:?}"
            );
        }
        assert!(Platform::normalized("unknown", "unknown", None).is_unknown());
        assert!(!Platform::normalized("linux", "amd64", None).is_unknown());
    }
}
