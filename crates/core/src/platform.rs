//! Platforms (os / architecture / variant), normalised the way containerd's platform matching
//! normalises them, so `arm64/v8`, `aarch64` and `arm64` are one platform and `arm` means `arm/v7`.

use std::borrow::Cow;
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

impl Platform {
    /// `os/architecture[/variant]`, as `Display` writes it, appended without a formatter: the
    /// decision's summary names every image's platforms on every admission.
    pub fn push_to(&self, out: &mut String) {
        out.push_str(&self.os);
        out.push('/');
        out.push_str(&self.architecture);
        if let Some(variant) = &self.variant {
            out.push('/');
            out.push_str(variant);
        }
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

/// What containerd's default matcher on a node accepts besides the node's own platform: what
/// the operator says of its nodes (containerd cannot tell tolerable which CPUs and kernels they
/// have).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeRuntime<'a> {
    /// The variant the node's CPU meets (normalised as an image's); `None`: not said, the
    /// architecture's baseline (amd64 v1, arm64 v8, arm v7) is sure and a higher one unknown.
    pub variant: Option<&'a str>,
    /// `[policy] amd64_runs_386`: the amd64 kernels run 32-bit x86 code.
    pub amd64_runs_386: bool,
    /// `[policy] arm64_runs_arm32`: the arm64 CPUs run AArch32 code at EL0.
    pub arm64_runs_arm32: bool,
}

/// Whether, and how, a node runs an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Runs {
    /// The node pulls this platform of the image (the best containerd's matcher accepts);
    /// `own`: the node's own platform (no other would be worth saying).
    Pulls {
        platform: Platform,
        own: bool,
    },
    /// Only a platform of the node's architecture needing a variant nothing says the node's CPU
    /// meets: the node may run it or not (as containerd detects its CPU).
    Unverified(Platform),
    No,
}

/// The baseline variant containerd gives a node of `arch` (normalised), when none is said.
fn baseline_variant(arch: &str) -> &'static str {
    match arch {
        "arm" => "v7",
        _ => "",
    }
}

/// `vN` (or `N`) as N.
fn version(variant: &str) -> Option<u32> {
    variant.strip_prefix('v').unwrap_or(variant).parse().ok()
}

/// One platform a node's matcher accepts: architecture and variant, normalised. Borrowed (from
/// the node's names or static text) but for arm64's minor levels: the matcher is built for every
/// candidate architecture on every admission.
type Accepted<'a> = (&'a str, Cow<'a, str>);

/// `v{level}`, without allocating for the levels containerd knows.
fn level(level: u32) -> Cow<'static, str> {
    const LEVELS: [&str; 10] = ["v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9"];
    match LEVELS.get(level as usize) {
        Some(name) => Cow::Borrowed(name),
        None => Cow::Owned(format!("v{level}")),
    }
}

/// The platforms (architecture, variant) containerd's `platforms.Only` accepts on a node of
/// `arch` / `variant`, best first (its ordering decides which one a node pulls): amd64 vN
/// accepts amd64 vN…v1, then 386; arm vN accepts arm vN…v5; arm64 v8.x accepts v8.x…v8.0,
/// arm64 v9.x accepts v9.x…v9.0 then v8.(x+5)…v8.0, and then arm v8…v5. 386 and the 32-bit
/// arm ones only where `runtime` says the kernel or the CPU runs them (containerd itself
/// always accepts them; a node that cannot run them fails the container at start).
fn accepted<'a>(arch: &'a str, variant: &'a str, runtime: &NodeRuntime<'_>) -> Vec<Accepted<'a>> {
    let mut out: Vec<Accepted<'a>> = vec![(arch, Cow::Borrowed(variant))];
    match arch {
        "amd64" => {
            for n in (1..version(variant).unwrap_or(1)).rev() {
                out.push((arch, level(n)));
            }
            if runtime.amd64_runs_386 {
                out.push(("386", Cow::Borrowed("")));
            }
        }
        "arm" => {
            for n in (5..version(variant).unwrap_or(0)).rev() {
                out.push((arch, level(n)));
            }
        }
        "arm64" => {
            let variant = if variant.is_empty() { "v8" } else { variant };
            let (major, minor) = variant.split_once('.').unwrap_or((variant, "0"));
            if let (Some(mut major @ 8..), Ok(mut minor)) = (version(major), minor.parse::<u32>()) {
                if major == 9 {
                    out.extend((0..minor).rev().map(|m| (arch, arm64_variant(9, m))));
                    (major, minor) = (8, minor + 5);
                    out.push((arch, arm64_variant(8, minor)));
                }
                out.extend((0..minor).rev().map(|m| (arch, arm64_variant(major, m))));
            }
            if runtime.arm64_runs_arm32 {
                out.extend((5..=8).rev().map(|n| ("arm", level(n))));
            }
        }
        _ => {}
    }
    for (a, v) in &mut out {
        let (arch, variant) = super::arch::normalized(a, v);
        if variant != v.as_ref() {
            *v = Cow::Owned(variant.to_owned());
        }
        *a = arch;
    }
    out
}

fn arm64_variant(major: u32, minor: u32) -> Cow<'static, str> {
    if minor == 0 {
        level(major)
    } else {
        Cow::Owned(format!("v{major}.{minor}"))
    }
}

/// Whether a node of `os` / `arch` runs an image of `platforms` (normalised), as containerd's
/// default matcher decides on it: the platform it pulls, or one that needs a CPU variant the
/// node is not known to have, or none.
pub fn node_runs(os: &str, arch: &str, platforms: &[Platform], runtime: &NodeRuntime<'_>) -> Runs {
    let variant = runtime.variant.unwrap_or_else(|| baseline_variant(arch));
    let (arch, variant) = super::arch::normalized(arch, variant);
    let on_os = || platforms.iter().filter(|p| &*p.os == os);
    let find = |a: &str, v: &str| {
        on_os().find(|p| *p.architecture == *a && p.variant.as_deref().unwrap_or("") == v)
    };
    // The node's own platform is the best there is (rank 0 of `accepted`): most images have it,
    // and then the rest of the list is never built.
    if let Some(platform) = find(arch, variant) {
        return Runs::Pulls {
            platform: platform.clone(),
            own: true,
        };
    }
    let accepted = accepted(arch, variant, runtime);
    let best = accepted
        .iter()
        .enumerate()
        .skip(1)
        .find_map(|(rank, (a, v))| find(a, v).map(|p| (rank, p)));
    if let Some((rank, platform)) = best {
        return Runs::Pulls {
            platform: platform.clone(),
            own: rank == 0,
        };
    }
    match on_os().find(|p| *p.architecture == *arch) {
        Some(platform) if runtime.variant.is_none() => Runs::Unverified(platform.clone()),
        _ => Runs::No,
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

    /// `push_to` writes what `Display` writes, with and without a variant.
    #[test]
    fn pushed_platforms_read_as_displayed() {
        for text in ["linux/amd64", "linux/arm/v7", "windows/amd64"] {
            let parts: Vec<&str> = text.split('/').collect();
            let platform = Platform {
                os: parts[0].into(),
                architecture: parts[1].into(),
                variant: parts.get(2).map(|v| (*v).into()),
            };
            let mut pushed = String::from("x ");
            platform.push_to(&mut pushed);
            assert_eq!(pushed, format!("x {platform}"));
            assert_eq!(platform.to_string(), text);
        }
    }

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

    fn parse(text: &str) -> Platform {
        let parts: Vec<&str> = text.split('/').collect();
        Platform::normalized(parts[0], parts[1], parts.get(2).copied())
    }

    /// Whether a node of `node` (`os/arch[/variant]`, the variant said) runs an image of only
    /// `image`.
    fn runs(node: &str, image: &str, amd64_runs_386: bool, arm64_runs_arm32: bool) -> bool {
        let node = parse(node);
        let runtime = NodeRuntime {
            variant: Some(node.variant.as_deref().unwrap_or("")),
            amd64_runs_386,
            arm64_runs_arm32,
        };
        let runs = node_runs(&node.os, &node.architecture, &[parse(image)], &runtime);
        assert!(
            !matches!(runs, Runs::Unverified(_)),
            "{node} said its variant"
        );
        matches!(runs, Runs::Pulls { .. })
    }

    /// containerd's own `TestOnly` table (platforms/compare_test.go), with both settings on as
    /// containerd's matcher assumes: each node, the images it accepts and those it refuses.
    #[rustfmt::skip]
    const CONTAINERD_ONLY: &[(&str, &[&str], &[&str])] = &[
            (
                "linux/amd64",
                &["linux/amd64", "linux/386"],
                &[
                    "linux/amd64/v2",
                    "linux/arm/v7",
                    "linux/arm64",
                    "windows/amd64",
                    "windows/arm",
                ],
            ),
            (
                "linux/amd64/v2",
                &[
                    "linux/amd64",
                    "linux/amd64/v1",
                    "linux/amd64/v2",
                    "linux/386",
                ],
                &[
                    "linux/amd64/v3",
                    "linux/amd64/v4",
                    "linux/arm/v7",
                    "linux/arm64",
                    "windows/amd64",
                ],
            ),
            (
                "linux/386",
                &["linux/386"],
                &[
                    "linux/amd64",
                    "linux/arm/v7",
                    "linux/arm64",
                    "windows/amd64",
                ],
            ),
            (
                "windows/amd64",
                &["windows/amd64"],
                &["linux/amd64", "linux/arm/v7", "linux/arm64", "windows/arm"],
            ),
            (
                "linux/arm/v8",
                &[
                    "linux/arm",
                    "linux/arm/v5",
                    "linux/arm/v6",
                    "linux/arm/v7",
                    "linux/arm/v8",
                ],
                &[
                    "linux/amd64",
                    "linux/arm/v4",
                    "linux/arm64",
                    "windows/amd64",
                ],
            ),
            (
                "linux/arm/v7",
                &["linux/arm", "linux/arm/v5", "linux/arm/v6", "linux/arm/v7"],
                &["linux/amd64", "linux/arm/v4", "linux/arm/v8", "linux/arm64"],
            ),
            (
                "linux/arm/v6",
                &["linux/arm/v5", "linux/arm/v6"],
                &[
                    "linux/amd64",
                    "linux/arm",
                    "linux/arm/v4",
                    "linux/arm/v7",
                    "linux/arm/v8",
                    "linux/arm64",
                ],
            ),
            (
                "linux/arm/v5",
                &["linux/arm/v5"],
                &[
                    "linux/arm",
                    "linux/arm/v4",
                    "linux/arm/v6",
                    "linux/arm/v7",
                    "linux/arm64",
                ],
            ),
            (
                "linux/arm/v4",
                &["linux/arm/v4"],
                &["linux/arm", "linux/arm/v5", "linux/arm/v6", "linux/arm64"],
            ),
            (
                "linux/arm64/v9",
                &[
                    "linux/arm",
                    "linux/arm/v5",
                    "linux/arm/v6",
                    "linux/arm/v7",
                    "linux/arm/v8",
                    "linux/arm64",
                    "linux/arm64/v8",
                    "linux/arm64/v8.1",
                    "linux/arm64/v8.2",
                    "linux/arm64/v8.3",
                    "linux/arm64/v8.4",
                    "linux/arm64/v8.5",
                    "linux/arm64/v9",
                    "linux/arm64/v9.0",
                ],
                &[
                    "linux/amd64",
                    "linux/arm/v4",
                    "windows/amd64",
                    "linux/arm64/v8.6",
                ],
            ),
            (
                "linux/arm64/v8.1",
                &[
                    "linux/arm",
                    "linux/arm/v5",
                    "linux/arm/v8",
                    "linux/arm64",
                    "linux/arm64/v8",
                    "linux/arm64/v8.1",
                ],
                &[
                    "linux/amd64",
                    "linux/arm/v4",
                    "linux/arm/v9",
                    "linux/arm64/v9",
                    "linux/arm64/v8.2",
                ],
            ),
            (
                "linux/arm64",
                &[
                    "linux/arm",
                    "linux/arm/v5",
                    "linux/arm/v6",
                    "linux/arm/v7",
                    "linux/arm/v8",
                    "linux/arm64",
                    "linux/arm64/v8",
                ],
                &[
                    "linux/amd64",
                    "linux/arm/v4",
                    "linux/arm/v9",
                    "linux/arm64/v9",
                    "linux/arm64/v8.1",
                    "windows/arm",
                ],
            ),
            (
                "linux/arm64/v9.2",
                &[
                    "linux/arm64/v9.1",
                    "linux/arm64/v9",
                    "linux/arm64/v8.7",
                    "linux/arm64",
                ],
                &["linux/arm64/v9.3", "linux/arm64/v8.8"],
            ),
            (
                "linux/s390x",
                &["linux/s390x"],
                &["linux/amd64", "linux/s390x/z15"],
            ),
    ];

    /// Every row of [`CONTAINERD_ONLY`].
    #[test]
    fn matches_as_containerd_only_does() {
        for (node, accepted, refused) in CONTAINERD_ONLY {
            for image in *accepted {
                assert!(runs(node, image, true, true), "{node} should run {image}");
            }
            for image in *refused {
                assert!(
                    !runs(node, image, true, true),
                    "{node} should not run {image}"
                );
            }
        }
    }

    /// containerd's `OnlyStrict` (no lower platforms) is what the two settings turn off for the
    /// 32-bit platforms: an amd64 kernel without 32-bit support, an arm64 CPU without AArch32.
    #[test]
    fn the_settings_refuse_32_bit_platforms() {
        assert!(!runs("linux/amd64", "linux/386", false, true));
        assert!(runs("linux/amd64", "linux/amd64", false, false));
        for image in ["linux/arm", "linux/arm/v5", "linux/arm/v6", "linux/arm/v8"] {
            assert!(!runs("linux/arm64", image, true, false), "{image}");
            assert!(!runs("linux/arm64/v9", image, true, false), "{image}");
        }
        assert!(runs("linux/arm64/v9", "linux/arm64/v8.5", true, false));
    }

    /// Which platform a node pulls follows containerd's ordering, best first; a variant the
    /// node is not said to meet is unverified, not refused.
    #[test]
    fn pulls_the_best_platform_and_says_what_it_cannot_know() {
        let baseline = |amd64_runs_386| NodeRuntime {
            variant: None,
            amd64_runs_386,
            arm64_runs_arm32: false,
        };
        let image = [
            parse("linux/386"),
            parse("linux/amd64/v2"),
            parse("linux/amd64"),
        ];
        assert_eq!(
            node_runs("linux", "amd64", &image, &baseline(true)),
            Runs::Pulls {
                platform: parse("linux/amd64"),
                own: true
            }
        );
        let v2 = NodeRuntime {
            variant: Some("v2"),
            ..baseline(true)
        };
        assert_eq!(
            node_runs("linux", "amd64", &image, &v2),
            Runs::Pulls {
                platform: parse("linux/amd64/v2"),
                own: true
            }
        );
        let old = [parse("linux/386")];
        assert_eq!(
            node_runs("linux", "amd64", &old, &baseline(true)),
            Runs::Pulls {
                platform: parse("linux/386"),
                own: false
            }
        );
        assert_eq!(
            node_runs("linux", "amd64", &old, &baseline(false)),
            Runs::No
        );
        let v3 = [parse("linux/amd64/v3")];
        assert_eq!(
            node_runs("linux", "amd64", &v3, &baseline(true)),
            Runs::Unverified(parse("linux/amd64/v3"))
        );
        assert_eq!(node_runs("linux", "amd64", &v3, &v2), Runs::No);
        assert_eq!(
            node_runs("windows", "amd64", &v3, &baseline(true)),
            Runs::No
        );
    }
}
