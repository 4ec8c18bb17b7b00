//! Architecture names: the one table of the names Kubernetes (Go's GOARCH) uses and of the
//! other spellings of them, for the two readers of architecture names. An image's platform is
//! read as containerd reads it (only containerd's own aliases: an image saying `x64` runs on no
//! node as amd64); a name an operator writes in the config must be a GOARCH name, and any alias
//! here is what the refusal suggests instead (`x86_64` → `amd64`).
//!
//! In the core (pure, no imports from the shell), so the core normalises platforms with it and
//! the config calls it.

/// Architecture names as Kubernetes (Go's GOARCH) writes them in the `kubernetes.io/arch` label.
pub const KUBERNETES_ARCHITECTURES: &[&str] = &[
    "386", "amd64", "arm", "arm64", "loong64", "mips", "mips64", "mips64le", "mipsle", "ppc64",
    "ppc64le", "riscv64", "s390x", "wasm",
];

/// Who spells an architecture this way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spelling {
    /// containerd's platform matching reads it as the GOARCH name: an image's platform that says
    /// it runs where the GOARCH name runs.
    Containerd,
    /// Other tools (`uname -m`, Debian, Docker Hub's tag prefixes, vendors): only ever a
    /// suggestion for a name written in the config.
    Other,
}

/// Another name for a GOARCH architecture.
#[derive(Clone, Copy, Debug)]
pub struct Alias {
    pub name: &'static str,
    pub goarch: &'static str,
    /// The variant containerd gives a platform of this name, whatever variant it says; `None`:
    /// its own variant, normalised as the GOARCH name's.
    pub variant: Option<&'static str>,
    pub spelling: Spelling,
}

const fn containerd(
    name: &'static str,
    goarch: &'static str,
    variant: Option<&'static str>,
) -> Alias {
    Alias {
        name,
        goarch,
        variant,
        spelling: Spelling::Containerd,
    }
}

const fn other(name: &'static str, goarch: &'static str) -> Alias {
    Alias {
        name,
        goarch,
        variant: None,
        spelling: Spelling::Other,
    }
}

/// Every alias, lower case.
pub const ALIASES: &[Alias] = &[
    containerd("x86_64", "amd64", None),
    containerd("x86-64", "amd64", None),
    containerd("aarch64", "arm64", None),
    containerd("armhf", "arm", Some("v7")),
    containerd("armel", "arm", Some("v6")),
    containerd("i386", "386", Some("")),
    other("x64", "amd64"),
    other("amd", "amd64"),
    other("intel", "amd64"),
    other("arm64v8", "arm64"),
    other("armv8", "arm64"),
    other("armv8l", "arm64"),
    other("aarch64_be", "arm64"),
    other("armv7l", "arm"),
    other("armv7", "arm"),
    other("armv6l", "arm"),
    other("armv6", "arm"),
    other("arm32v7", "arm"),
    other("arm32v6", "arm"),
    other("i486", "386"),
    other("i586", "386"),
    other("i686", "386"),
    other("x86", "386"),
    other("ppc64el", "ppc64le"),
    other("powerpc64le", "ppc64le"),
    other("ppc64le_", "ppc64le"),
    other("powerpc64", "ppc64"),
    other("riscv", "riscv64"),
    other("riscv64gc", "riscv64"),
    other("s390", "s390x"),
    other("zarch", "s390x"),
    other("loongarch64", "loong64"),
];

/// `name` (lower case) as an alias of the given spellings.
pub fn alias(name: &str, spellings: &[Spelling]) -> Option<&'static Alias> {
    ALIASES
        .iter()
        .find(|a| spellings.contains(&a.spelling) && a.name == name)
}

/// The GOARCH name for any other spelling of it (lower case), for a suggestion.
pub fn goarch_for(name: &str) -> Option<&'static str> {
    alias(name, &[Spelling::Containerd, Spelling::Other]).map(|a| a.goarch)
}

/// An image platform's architecture and variant (lower case) as containerd normalises them:
/// its alias read, then the variant spelled as containerd spells it for that architecture.
pub fn normalize(arch: &str, variant: &str) -> (String, String) {
    let (arch, variant) = normalized(arch, variant);
    (arch.to_owned(), variant.to_owned())
}

/// [`normalize`] without allocating: each name borrowed from the input or from the alias
/// table. The node matcher normalises every platform it accepts on every admission.
pub fn normalized<'a, 'v>(arch: &'a str, variant: &'v str) -> (&'a str, &'v str) {
    let (arch, variant) = match alias(arch, &[Spelling::Containerd]) {
        Some(alias) => (alias.goarch, alias.variant.unwrap_or(variant)),
        None => (arch, variant),
    };
    let variant = match (arch, variant) {
        ("amd64", "v1") => "",
        ("arm64", "8" | "v8" | "v8.0") => "",
        ("arm64", "9" | "9.0" | "v9.0") => "v9",
        ("arm", "" | "7") => "v7",
        ("arm", "5") => "v5",
        ("arm", "6") => "v6",
        ("arm", "8") => "v8",
        (_, other) => other,
    };
    (arch, variant)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every alias either of the two former tables knew (the config's suggestions, and
    /// containerd's normalisation in `platform.rs`), with its GOARCH name.
    #[test]
    fn every_alias_names_its_goarch() {
        let config_suggestions = [
            ("x86_64", "amd64"),
            ("x86-64", "amd64"),
            ("x64", "amd64"),
            ("amd", "amd64"),
            ("intel", "amd64"),
            ("aarch64", "arm64"),
            ("arm64v8", "arm64"),
            ("armv8", "arm64"),
            ("armv8l", "arm64"),
            ("aarch64_be", "arm64"),
            ("armv7l", "arm"),
            ("armv7", "arm"),
            ("armhf", "arm"),
            ("armv6l", "arm"),
            ("armv6", "arm"),
            ("armel", "arm"),
            ("arm32v7", "arm"),
            ("arm32v6", "arm"),
            ("i386", "386"),
            ("i486", "386"),
            ("i586", "386"),
            ("i686", "386"),
            ("x86", "386"),
            ("ppc64el", "ppc64le"),
            ("powerpc64le", "ppc64le"),
            ("ppc64le_", "ppc64le"),
            ("powerpc64", "ppc64"),
            ("riscv", "riscv64"),
            ("riscv64gc", "riscv64"),
            ("s390", "s390x"),
            ("zarch", "s390x"),
            ("loongarch64", "loong64"),
        ];
        for (name, goarch) in config_suggestions {
            assert_eq!(goarch_for(name), Some(goarch), "{name}");
        }
        assert_eq!(ALIASES.len(), config_suggestions.len(), "an alias untested");
        for name in KUBERNETES_ARCHITECTURES {
            assert_eq!(goarch_for(name), None, "{name} is no alias");
        }
        for alias in ALIASES {
            assert!(
                KUBERNETES_ARCHITECTURES.contains(&alias.goarch),
                "{alias:?}"
            );
        }
    }

    #[test]
    fn containerd_reads_only_its_own_aliases() {
        for (arch, variant, want) in [
            ("x86_64", "", ("amd64", "")),
            ("x86-64", "v1", ("amd64", "")),
            ("x86_64", "v3", ("amd64", "v3")),
            ("amd64", "v1", ("amd64", "")),
            ("aarch64", "", ("arm64", "")),
            ("aarch64", "v8", ("arm64", "")),
            ("arm64", "8", ("arm64", "")),
            ("arm64", "v8.0", ("arm64", "")),
            ("arm64", "9", ("arm64", "v9")),
            ("arm64", "v9.0", ("arm64", "v9")),
            ("armhf", "", ("arm", "v7")),
            ("armhf", "v6", ("arm", "v7")),
            ("armel", "", ("arm", "v6")),
            ("arm", "", ("arm", "v7")),
            ("arm", "5", ("arm", "v5")),
            ("arm", "6", ("arm", "v6")),
            ("arm", "8", ("arm", "v8")),
            ("i386", "x", ("386", "")),
            ("386", "x", ("386", "x")),
            // Other tools' names are no platform containerd would run as the GOARCH one.
            ("x64", "", ("x64", "")),
            ("armv7l", "", ("armv7l", "")),
            ("ppc64el", "", ("ppc64el", "")),
        ] {
            let got = normalize(arch, variant);
            assert_eq!((got.0.as_str(), got.1.as_str()), want, "{arch}/{variant}");
        }
    }
}
