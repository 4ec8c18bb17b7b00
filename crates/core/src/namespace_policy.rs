//! Per-namespace policy: what the platform team wrote on a Namespace, read into the few values
//! the decision takes from it. Pure: the shell (the namespace watch, `review`'s command line,
//! a Namespace in `review`'s input) hands over the Namespace's labels and annotations; this
//! reads them once, and the decision takes the result as a fact of the request.
//!
//! Where each key is read from — as the recorded Namespaces carry them:
//! - `tolerable.io/enforce` (`"true"` / `"false"`) and `tolerable.io/skip` (`"true"`) are
//!   **labels**: the webhook configuration's `namespaceSelector` can only select on labels (a
//!   skipped namespace is never even sent to tolerable), and `kubectl get ns -l` lists them.
//! - `tolerable.io/preferred-architecture` (`"arm64=80, amd64=20"`, one architecture, or
//!   `none`) is an **annotation**: `=`, `,` and spaces are not allowed in a label value.
//!
//! A key in the other place, or a value that does not parse, is ignored with a problem naming
//! the key and the reason (the decision warns of it; it never fails an admission).
//!
//! Precedence, strongest first: the Pod's own label or annotation, the Namespace, the config.

use std::collections::BTreeMap;

use super::arch::KUBERNETES_ARCHITECTURES;
use super::explain;
use super::{WeightedArchitecture, PREFERRED_KEY, PREFERRED_WEIGHT, SKIP_KEY};

/// Label (on a Namespace) or label / annotation (on a Pod): `"false"` for report only, `"true"`
/// to enforce whatever `[policy] enforce` says.
pub const ENFORCE_KEY: &str = "tolerable.io/enforce";

/// Label (on a Namespace) or label / annotation (on a Pod): `"true"` to pin each image by tag
/// to the digest the decision was made on, `"false"` not to, whatever `[policy] pin_digests`
/// says.
pub const PIN_DIGEST_KEY: &str = "tolerable.io/pin-digest";

/// Longest piece of a malformed value quoted back in a warning (annotation values may be
/// large; the warning only needs to show which one).
const QUOTED_VALUE_BYTES: usize = 64;

/// What one Namespace's labels and annotations say, read once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespacePolicy {
    /// `tolerable.io/enforce`; `None`: not said (or malformed).
    pub enforce: Option<bool>,
    /// `tolerable.io/skip=true`.
    pub skip: bool,
    /// `tolerable.io/pin-digest`; `None`: not said (or malformed).
    pub pin_digest: Option<bool>,
    /// `tolerable.io/preferred-architecture`; `Some(empty)`: `none` (no preference, whatever
    /// the config prefers); `None`: not said (or malformed).
    pub preferred: Option<Vec<WeightedArchitecture>>,
    /// Each malformed or misplaced key, and why it was ignored.
    pub problems: Vec<NamespaceProblem>,
}

/// A key on a Namespace that was ignored, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceProblem {
    pub key: &'static str,
    pub reason: String,
}

impl NamespacePolicy {
    /// Reads a Namespace's `metadata.labels` and `metadata.annotations`.
    pub fn from_metadata(
        labels: Option<&BTreeMap<String, String>>,
        annotations: Option<&BTreeMap<String, String>>,
    ) -> Self {
        let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
        let annotation = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
        let mut policy = Self::default();
        for key in [ENFORCE_KEY, SKIP_KEY, PIN_DIGEST_KEY] {
            if annotation(key).is_some() {
                policy.problem(key, "read from the Namespace's labels, not its annotations (the webhook's namespaceSelector sees only labels)".into());
            }
        }
        if label(PREFERRED_KEY).is_some() {
            policy.problem(PREFERRED_KEY, "read from the Namespace's annotations, not its labels (a weighted list is no valid label value)".into());
        }
        if let Some(value) = label(ENFORCE_KEY) {
            match boolean(value) {
                Ok(enforce) => policy.enforce = Some(enforce),
                Err(reason) => policy.problem(ENFORCE_KEY, reason),
            }
        }
        if let Some(value) = label(SKIP_KEY) {
            match boolean(value) {
                Ok(skip) => policy.skip = skip,
                Err(reason) => policy.problem(SKIP_KEY, reason),
            }
        }
        if let Some(value) = label(PIN_DIGEST_KEY) {
            match boolean(value) {
                Ok(pin) => policy.pin_digest = Some(pin),
                Err(reason) => policy.problem(PIN_DIGEST_KEY, reason),
            }
        }
        if let Some(value) = annotation(PREFERRED_KEY) {
            match preference(value) {
                Ok(preferred) => policy.preferred = Some(preferred),
                Err(reason) => policy.problem(PREFERRED_KEY, reason),
            }
        }
        policy
    }

    /// Whether the Namespace says anything tolerable reads (a Namespace that does not need
    /// not be kept).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// What was ignored, one line per key, for a log line or a warning.
    pub fn problems(&self) -> impl Iterator<Item = String> + '_ {
        self.problems
            .iter()
            .map(|p| format!("{} ignored: {}", p.key, p.reason))
    }

    fn problem(&mut self, key: &'static str, reason: String) {
        self.problems.push(NamespaceProblem { key, reason });
    }
}

/// `"true"` or `"false"`, exactly (as the API server's own boolean labels are written).
fn boolean(value: &str) -> Result<bool, String> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(format!("{} is not \"true\" or \"false\"", quoted(other))),
    }
}

/// `none`, one architecture (weight 50) or `arch=weight, arch=weight` (weights 1–100), each
/// architecture a Kubernetes name, once.
fn preference(value: &str) -> Result<Vec<WeightedArchitecture>, String> {
    if value.trim() == "none" {
        return Ok(Vec::new());
    }
    let mut out: Vec<WeightedArchitecture> = Vec::new();
    for item in value.split(',').map(str::trim) {
        if item.is_empty() {
            continue;
        }
        let (arch, weight) = match item.split_once('=') {
            None => (item, PREFERRED_WEIGHT),
            Some((arch, weight)) => match weight.trim().parse::<i32>() {
                Ok(w) if (1..=100).contains(&w) => (arch.trim(), w),
                _ => {
                    return Err(format!(
                        "{}: the weight is not a number from 1 to 100",
                        quoted(item)
                    ))
                }
            },
        };
        if !KUBERNETES_ARCHITECTURES.contains(&arch) {
            return Err(format!(
                "{} is not a Kubernetes architecture name (one of {})",
                quoted(arch),
                KUBERNETES_ARCHITECTURES.join(", ")
            ));
        }
        if out.iter().any(|w| w.architecture == arch) {
            return Err(format!("{arch} is named twice"));
        }
        out.push(WeightedArchitecture {
            architecture: arch.to_owned(),
            weight,
        });
    }
    if out.is_empty() {
        return Err("names no architecture (write none for no preference)".into());
    }
    Ok(out)
}

/// A value quoted back, cut to [`QUOTED_VALUE_BYTES`].
fn quoted(value: &str) -> String {
    format!("{:?}", explain::cut(value.to_owned(), QUOTED_VALUE_BYTES))
}

/// Which level of policy decided something (for the decision annotation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Pod,
    Namespace,
    Config,
}

/// Whether the decision is carried out, and which level said so: the Pod's own
/// `tolerable.io/enforce` (label or annotation), else its Namespace's, else `[policy] enforce`.
/// A malformed value on the Pod is ignored, with `warning` saying so.
pub fn enforce(
    pod_value: Option<&str>,
    namespace: Option<&NamespacePolicy>,
    config: bool,
) -> (bool, Level, Option<String>) {
    switch(
        ENFORCE_KEY,
        pod_value,
        namespace.and_then(|n| n.enforce),
        config,
    )
}

/// Whether images by tag are pinned to the decided digest, and which level said so: the Pod's
/// own `tolerable.io/pin-digest` (label or annotation), else its Namespace's label, else
/// `[policy] pin_digests`. A malformed value on the Pod is ignored, with `warning` saying so.
pub fn pin_digests(
    pod_value: Option<&str>,
    namespace: Option<&NamespacePolicy>,
    config: bool,
) -> (bool, Level, Option<String>) {
    switch(
        PIN_DIGEST_KEY,
        pod_value,
        namespace.and_then(|n| n.pin_digest),
        config,
    )
}

/// A `"true"` / `"false"` switch: the Pod's value, else the Namespace's, else the config's.
fn switch(
    key: &str,
    pod_value: Option<&str>,
    namespace: Option<bool>,
    config: bool,
) -> (bool, Level, Option<String>) {
    let mut warning = None;
    if let Some(value) = pod_value {
        match boolean(value) {
            Ok(on) => return (on, Level::Pod, None),
            Err(reason) => warning = Some(format!("the Pod's {key} ignored: {reason}")),
        }
    }
    match namespace {
        Some(on) => (on, Level::Namespace, warning),
        None => (config, Level::Config, warning),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn read(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> NamespacePolicy {
        NamespacePolicy::from_metadata(Some(&map(labels)), Some(&map(annotations)))
    }

    fn weighted(list: &[(&str, i32)]) -> Vec<WeightedArchitecture> {
        list.iter()
            .map(|(a, w)| WeightedArchitecture {
                architecture: (*a).to_owned(),
                weight: *w,
            })
            .collect()
    }

    #[test]
    fn the_recorded_namespaces_read_as_labelled() {
        let name = ("kubernetes.io/metadata.name", "x");
        let team_a = read(&[name, (ENFORCE_KEY, "false")], &[]);
        assert_eq!(team_a.enforce, Some(false));
        assert!(team_a.problems.is_empty() && !team_a.skip && team_a.preferred.is_none());
        let batch = read(&[name], &[(PREFERRED_KEY, "arm64=80, amd64=20")]);
        assert_eq!(
            batch.preferred,
            Some(weighted(&[("arm64", 80), ("amd64", 20)]))
        );
        let team_b = read(&[name, (SKIP_KEY, "true")], &[]);
        assert!(team_b.skip);
        assert!(read(&[name], &[]).is_empty(), "nothing tolerable reads");
        assert!(NamespacePolicy::from_metadata(None, None).is_empty());
    }

    #[test]
    fn good_values() {
        let cases: &[(&str, Option<Vec<WeightedArchitecture>>)] = &[
            ("arm64", Some(weighted(&[("arm64", PREFERRED_WEIGHT)]))),
            ("none", Some(Vec::new())),
            (
                " amd64 = 100 ,arm64=1,",
                Some(weighted(&[("amd64", 100), ("arm64", 1)])),
            ),
        ];
        for (value, expected) in cases {
            let read = read(&[], &[(PREFERRED_KEY, value)]);
            assert_eq!(&read.preferred, expected, "{value:?}");
            assert!(read.problems.is_empty(), "{value:?}: {:?}", read.problems);
        }
        assert_eq!(read(&[(ENFORCE_KEY, "true")], &[]).enforce, Some(true));
        let not_skipped = read(&[(SKIP_KEY, "false")], &[]);
        assert!(!not_skipped.skip && not_skipped.problems.is_empty());
    }

    /// Labels, annotations, the key ignored and why.
    type Malformed = (
        &'static [(&'static str, &'static str)],
        &'static [(&'static str, &'static str)],
        &'static str,
        &'static str,
    );

    fn malformed() -> Vec<Malformed> {
        vec![
            (
                &[(ENFORCE_KEY, "False")],
                &[],
                ENFORCE_KEY,
                "\"False\" is not \"true\" or \"false\"",
            ),
            (
                &[(SKIP_KEY, "yes")],
                &[],
                SKIP_KEY,
                "\"yes\" is not \"true\" or \"false\"",
            ),
            (
                &[],
                &[(PREFERRED_KEY, "arm64=0")],
                PREFERRED_KEY,
                "\"arm64=0\": the weight is not a number from 1 to 100",
            ),
            (
                &[],
                &[(PREFERRED_KEY, "arm64=eighty")],
                PREFERRED_KEY,
                "the weight is not a number",
            ),
            (
                &[],
                &[(PREFERRED_KEY, "aarch64=80")],
                PREFERRED_KEY,
                "\"aarch64\" is not a Kubernetes architecture name",
            ),
            (
                &[],
                &[(PREFERRED_KEY, "arm64, arm64=20")],
                PREFERRED_KEY,
                "arm64 is named twice",
            ),
            (
                &[],
                &[(PREFERRED_KEY, " , ")],
                PREFERRED_KEY,
                "names no architecture",
            ),
            (
                &[],
                &[(PREFERRED_KEY, "")],
                PREFERRED_KEY,
                "names no architecture",
            ),
            (
                &[(PREFERRED_KEY, "arm64")],
                &[],
                PREFERRED_KEY,
                "read from the Namespace's annotations, not its labels",
            ),
            (
                &[],
                &[(ENFORCE_KEY, "false")],
                ENFORCE_KEY,
                "read from the Namespace's labels, not its annotations",
            ),
            (
                &[],
                &[(SKIP_KEY, "true")],
                SKIP_KEY,
                "read from the Namespace's labels",
            ),
        ]
    }

    #[test]
    fn malformed_values_are_ignored_with_the_key_and_the_reason() {
        let cases = malformed();
        for (labels, annotations, key, reason) in &cases {
            let read = read(labels, annotations);
            assert_eq!(read.enforce, None, "{labels:?} {annotations:?}");
            assert!(!read.skip);
            assert_eq!(read.preferred, None);
            assert_eq!(read.problems.len(), 1, "{:?}", read.problems);
            assert_eq!(read.problems[0].key, *key);
            assert!(
                read.problems[0].reason.contains(reason),
                "{:?}",
                read.problems
            );
            assert!(!read.is_empty(), "kept, to warn of it");
        }
        // A huge value is quoted back cut.
        let huge = "x".repeat(100_000);
        let read = read(&[], &[(PREFERRED_KEY, &huge)]);
        assert!(
            read.problems[0].reason.len() < 300,
            "{}",
            read.problems[0].reason
        );
    }

    #[test]
    fn enforce_pod_over_namespace_over_config() {
        let report_only = NamespacePolicy {
            enforce: Some(false),
            ..NamespacePolicy::default()
        };
        let silent = NamespacePolicy::default();
        let cases = [
            (None, None, true, (true, Level::Config)),
            (None, Some(&silent), false, (false, Level::Config)),
            (None, Some(&report_only), true, (false, Level::Namespace)),
            (Some("true"), Some(&report_only), false, (true, Level::Pod)),
            (Some("false"), None, true, (false, Level::Pod)),
        ];
        for (pod, namespace, config, expected) in cases {
            let (enforce, level, warning) = enforce(pod, namespace, config);
            assert_eq!((enforce, level), expected, "{pod:?} {namespace:?} {config}");
            assert_eq!(warning, None);
        }
        let (enforce, level, warning) = enforce(Some("no"), Some(&report_only), true);
        assert_eq!((enforce, level), (false, Level::Namespace));
        assert!(warning
            .unwrap()
            .contains("\"no\" is not \"true\" or \"false\""));
    }
}
