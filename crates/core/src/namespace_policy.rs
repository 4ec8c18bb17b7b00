//! Per-namespace policy: what the platform team wrote on a Namespace, read into the knobs the
//! decision takes from it (`knobs::Knobs`, with the same parsers a Pod's own values go through).
//! Pure: the shell (the namespace watch, `review`'s command line, a Namespace in `review`'s
//! input) hands over the Namespace's labels and annotations; this reads them once, and the
//! decision takes the result as a fact of the request.
//!
//! Where each key is read from — as the recorded Namespaces carry them (`Knob::on_namespace`):
//! - `tolerable.io/enforce`, `tolerable.io/skip` and `tolerable.io/pin-digest` (`"true"` /
//!   `"false"`) are **labels**: the webhook configuration's `namespaceSelector` can only select
//!   on labels (a skipped namespace is never even sent to tolerable), and `kubectl get ns -l`
//!   lists them.
//! - `tolerable.io/preferred-architecture` (`"arm64=80, amd64=20"`, one architecture, or
//!   `none`) is an **annotation**: `=`, `,` and spaces are not allowed in a label value.
//!
//! A key in the other place, or a value that does not parse, is ignored with a problem naming
//! the key and the reason (the decision warns of it; it never fails an admission).
//!
//! Precedence, strongest first: the Pod's own label or annotation, the Namespace, the config
//! (`knobs::resolve`).

use std::collections::BTreeMap;

use super::knobs::Knobs;
pub use super::knobs::Problem as NamespaceProblem;

/// What one Namespace's labels and annotations say, read once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespacePolicy {
    /// Each knob the Namespace sets.
    pub knobs: Knobs,
    /// Each malformed or misplaced key, and why it was ignored.
    pub problems: Vec<NamespaceProblem>,
}

impl NamespacePolicy {
    /// Reads a Namespace's `metadata.labels` and `metadata.annotations`.
    pub fn from_metadata(
        labels: Option<&BTreeMap<String, String>>,
        annotations: Option<&BTreeMap<String, String>>,
    ) -> Self {
        let (knobs, problems) = Knobs::of_namespace(labels, annotations);
        Self { knobs, problems }
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::knobs::{resolve, ConfigKnobs, Level};
    use crate::{WeightedArchitecture, ENFORCE_KEY, PREFERRED_KEY, PREFERRED_WEIGHT, SKIP_KEY};

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
        assert_eq!(team_a.knobs.enforce, Some(false));
        assert!(team_a.problems.is_empty() && team_a.knobs.skip.is_none());
        assert!(team_a.knobs.preferred.is_none());
        let batch = read(&[name], &[(PREFERRED_KEY, "arm64=80, amd64=20")]);
        assert_eq!(
            batch.knobs.preferred,
            Some(weighted(&[("arm64", 80), ("amd64", 20)]))
        );
        let team_b = read(&[name, (SKIP_KEY, "true")], &[]);
        assert_eq!(team_b.knobs.skip, Some(true));
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
            assert_eq!(&read.knobs.preferred, expected, "{value:?}");
            assert!(read.problems.is_empty(), "{value:?}: {:?}", read.problems);
        }
        assert_eq!(
            read(&[(ENFORCE_KEY, "true")], &[]).knobs.enforce,
            Some(true)
        );
        let not_skipped = read(&[(SKIP_KEY, "false")], &[]);
        assert_eq!(not_skipped.knobs.skip, Some(false));
        assert!(not_skipped.problems.is_empty());
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
            assert!(read.knobs.is_empty(), "{labels:?} {annotations:?}");
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
        let report_only = read(&[(ENFORCE_KEY, "false")], &[]);
        let silent = NamespacePolicy::default();
        let config = |enforce| ConfigKnobs {
            enforce,
            skip: false,
            pin_digests: false,
            preferred: Vec::new(),
        };
        let cases = [
            (None, None, true, (true, Level::Config)),
            (None, Some(&silent), false, (false, Level::Config)),
            (None, Some(&report_only), true, (false, Level::Namespace)),
            (Some("true"), Some(&report_only), false, (true, Level::Pod)),
            (Some("false"), None, true, (false, Level::Pod)),
            // Malformed on the Pod: ignored (a problem), the Namespace's decides.
            (
                Some("no"),
                Some(&report_only),
                true,
                (false, Level::Namespace),
            ),
        ];
        for (pod, namespace, enforce, expected) in cases {
            let (own, problems) = Knobs::of_pod(|key| pod.filter(|_| key == ENFORCE_KEY));
            assert_eq!(
                problems.len(),
                usize::from(pod == Some("no")),
                "{problems:?}"
            );
            let settings = resolve(&own, namespace.map(|n| &n.knobs), config(enforce));
            let got = (settings.enforce.value, settings.enforce.level);
            assert_eq!(got, expected, "{pod:?} {namespace:?} {enforce}");
        }
    }
}
