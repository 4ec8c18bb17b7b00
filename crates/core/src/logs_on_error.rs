//! `[crashes] fallback_to_logs_on_error` (issue 38): at admission, each init container and
//! container whose `terminationMessagePolicy` is the default gets `FallbackToLogsOnError`, so
//! when one fails the kubelet copies its log's last lines (at most 80 lines, 2 KiB) into
//! `lastState.terminated.message` — where the crash watch reads a runtime's exec format error
//! without reading logs. Once set, deciding again adds nothing (reinvocation).
//!
//! The default is `File` as well as none: the API server writes `File` into every container
//! that sets no policy before any mutating webhook sees the Pod (the recorded AdmissionReviews
//! in `tests/data/` all carry it), so a `File` the Pod chose cannot be told from the default.
//! Turning it into `FallbackToLogsOnError` keeps what `File` does — the termination-message
//! file is still read first — and adds the log's last lines only when that file is empty and
//! the container failed. `FallbackToLogsOnError` set by the Pod, or any other value, is kept.

use super::patch::{Operation, PatchValue};
use super::{Decision, PodView, SlotKind};

/// The value set.
pub const FALLBACK_TO_LOGS_ON_ERROR: &str = "FallbackToLogsOnError";

/// Whether a container's `terminationMessagePolicy` is the default (none, or the API server's
/// `File`).
pub fn is_default(policy: Option<&str>) -> bool {
    matches!(policy, None | Some("File"))
}

/// Whether a Pod decided as `decision` gets the policy: one tolerable patches (placed, or
/// gated); a Pod left unchanged (opted out, a skipped namespace, its images unknown or sharing
/// no architecture and let through) stays exactly as it came, and a denied one gets no patch.
pub(crate) fn applies(decision: &Decision) -> bool {
    matches!(decision, Decision::Placed(_) | Decision::Gated { .. })
}

/// An `add` of the policy for each container of `pod` with the default one (an `add` on a
/// member that exists replaces its value, RFC 6902 4.1).
pub(crate) fn operations(pod: &PodView) -> Vec<Operation> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    spec.default_termination_message_policy
        .iter()
        .filter_map(|(kind, index)| {
            let list = match kind {
                SlotKind::InitContainer => "initContainers",
                SlotKind::Container => "containers",
                SlotKind::EphemeralContainer | SlotKind::ImageVolume => return None,
            };
            Some(Operation::add(
                format!("/spec/{list}/{index}/terminationMessagePolicy"),
                PatchValue::Text(FALLBACK_TO_LOGS_ON_ERROR.to_owned()),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::super::tests::{facts, pod, policy, run};
    use super::super::{Outcome, Policy, SKIP_KEY};

    fn on() -> Policy {
        Policy {
            fallback_to_logs_on_error: true,
            ..policy()
        }
    }

    fn policies(patched: &Value, list: &str) -> Vec<Value> {
        patched["spec"][list]
            .as_array()
            .map(|cs| {
                cs.iter()
                    .map(|c| c["terminationMessagePolicy"].clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Each init container and container with the default policy (none, or the API server's
    /// `File`) gets it; one already `FallbackToLogsOnError` is kept as it is; deciding again
    /// adds nothing (`run` checks); off, nothing is added.
    #[test]
    fn containers_with_the_default_policy_get_fallback_to_logs_on_error() {
        let f = facts(&[
            ("m:1", Ok(&["linux/amd64", "linux/arm64"])),
            ("i:1", Ok(&["linux/amd64", "linux/arm64"])),
        ]);
        let fallback = json!("FallbackToLogsOnError");
        let extra = json!({"spec": {"initContainers": [
            {"name": "init", "image": "i:1"},
            {"name": "set", "image": "i:1", "terminationMessagePolicy": fallback},
        ]}});
        let mut pod_json = pod(&["m:1", "m:1", "m:1"], extra);
        pod_json["spec"]["containers"][1]["terminationMessagePolicy"] = json!("File");
        pod_json["spec"]["containers"][2]["terminationMessagePolicy"] = fallback.clone();
        let done = run(&pod_json, &f, &on());
        assert_eq!(
            policies(&done.patched, "initContainers"),
            [fallback.clone(), fallback.clone()]
        );
        assert_eq!(
            policies(&done.patched, "containers"),
            [fallback.clone(), fallback.clone(), fallback]
        );
        let set: Vec<&str> = done
            .ops
            .iter()
            .map(|op| op["path"].as_str().unwrap())
            .filter(|path| path.ends_with("/terminationMessagePolicy"))
            .collect();
        assert_eq!(
            set,
            [
                "/spec/initContainers/0/terminationMessagePolicy",
                "/spec/containers/0/terminationMessagePolicy",
                "/spec/containers/1/terminationMessagePolicy",
            ]
        );
        let off = run(&pod_json, &f, &policy());
        assert_eq!(
            policies(&off.patched, "containers"),
            [Value::Null, json!("File"), json!("FallbackToLogsOnError")]
        );
    }

    /// Only a Pod tolerable patches: one left as it came (its images could not be looked up,
    /// or it opted out), a denied one and a report-only answer get nothing.
    #[test]
    fn only_pods_tolerable_patches() {
        let failed = facts(&[("m:1", Err("registry down"))]);
        let done = run(&pod(&["m:1"], json!({})), &failed, &on());
        assert_eq!(done.decision.outcome(), Outcome::LookupFailed);
        assert!(done.ops.is_empty(), "{:#?}", done.ops);

        let f = facts(&[("m:1", Ok(&["linux/amd64", "linux/arm64"]))]);
        let skipped = pod(
            &["m:1"],
            json!({"metadata": {"labels": {SKIP_KEY: "true"}}}),
        );
        let done = run(&skipped, &f, &on());
        assert_eq!(done.decision.outcome(), Outcome::Skipped);
        assert!(done.ops.is_empty(), "{:#?}", done.ops);

        let apart = facts(&[("a:1", Ok(&["linux/amd64"])), ("b:1", Ok(&["linux/s390x"]))]);
        let denied = run(&pod(&["a:1", "b:1"], json!({})), &apart, &on());
        assert!(denied.ops.is_empty(), "{:#?}", denied.ops);

        let report_only = Policy {
            enforce: false,
            ..on()
        };
        let done = run(&pod(&["m:1"], json!({})), &f, &report_only);
        let set = done.ops.iter().any(|op| {
            op["path"]
                .as_str()
                .unwrap()
                .ends_with("/terminationMessagePolicy")
        });
        assert!(!set, "{:#?}", done.ops);
    }
}
