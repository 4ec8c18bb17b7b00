//! What a Warning Event on a Pod's controller owner says of its admission (`[events]
//! on_admission`): only when the Pod's images share no node architecture or could not all be
//! looked up — the answers a workload's owner should hear of, since its Pods keep failing the
//! same way. The shell writes the Event (and limits it per owner); this says whether there is
//! one, on which owner, and its words.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::{explain, Answer, Decision, PodCreate, Untouched};

/// The Event's parts.
#[derive(Clone, Debug, PartialEq)]
pub struct OwnerWarning {
    /// The Pod's `ownerReferences` entry with `controller: true`.
    pub owner: OwnerReference,
    /// `NoCommonArchitecture` or `ImageLookupFailed`.
    pub reason: &'static str,
    /// What was done with the Pod: `Denied`, `Admitted` (unchanged, with a warning) or
    /// `Gated`.
    pub action: &'static str,
    /// Names each image and why (the decision's summary).
    pub note: String,
}

/// The warning for the Pod's owner, or `None`: the answer is not one an owner hears of, the
/// object is a Pod template (a DaemonSet's: it is the workload itself, not yet created), or the
/// Pod has no controller owner (a bare Pod: it does not exist yet while it is admitted).
pub fn owner_warning(request: &PodCreate, answer: &Answer) -> Option<OwnerWarning> {
    if request.template {
        return None;
    }
    let (reason, action) = match &answer.decision {
        Decision::Denied { why, .. } => (reason(*why)?, denied(answer.enforced)),
        Decision::Unchanged { why, .. } => (reason(*why)?, "Admitted"),
        Decision::Gated { .. } => ("ImageLookupFailed", "Gated"),
        Decision::Placed(_) => return None,
    };
    let owner = request
        .pod
        .owner_references
        .iter()
        .find(|o| o.controller == Some(true))?;
    Some(OwnerWarning {
        note: explain::owner_warning(&owner.kind, &owner.name, answer.decision.summary()),
        owner: owner.clone(),
        reason,
        action,
    })
}

fn reason(why: Untouched) -> Option<&'static str> {
    match why {
        Untouched::NoCommonArchitecture => Some("NoCommonArchitecture"),
        Untouched::LookupFailed => Some("ImageLookupFailed"),
        Untouched::NotPodCreate | Untouched::InvalidObject | Untouched::Skipped => None,
    }
}

/// A denial under `enforce = false` is not carried out: the Pod is admitted.
fn denied(enforced: bool) -> &'static str {
    if enforced {
        "Denied"
    } else {
        "Admitted"
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::tests::{facts, request};
    use super::super::{answer, OnLookupFailure, OnNoCommonArchitecture, Policy};
    use super::*;

    fn pod(owners: serde_json::Value) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"generateName": "web-7d9c6b8f5-", "ownerReferences": owners},
               "spec": {"containers": [{"name": "a", "image": "x86:1"},
                                       {"name": "b", "image": "z:1"}]}})
    }

    fn replica_set() -> serde_json::Value {
        json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9c6b8f5",
                "uid": "97e82c63-9fad-48bc-b270-54fd6362efb4", "controller": true}])
    }

    fn warning_for(
        pod: &serde_json::Value,
        found: &[(&str, Result<&[&str], &str>)],
        policy: &Policy,
    ) -> Option<OwnerWarning> {
        let created = request(pod, policy);
        owner_warning(&created, &answer(&created, &facts(found), None, policy))
    }

    const DISJOINT: &[(&str, Result<&[&str], &str>)] = &[
        ("x86:1", Ok(&["linux/amd64"])),
        ("z:1", Ok(&["linux/s390x"])),
    ];

    #[test]
    fn a_denied_pod_warns_its_controller_naming_each_image() {
        let w = warning_for(&pod(replica_set()), DISJOINT, &Policy::default()).unwrap();
        assert_eq!(w.owner.kind, "ReplicaSet");
        assert_eq!(w.owner.name, "web-7d9c6b8f5");
        assert_eq!((w.reason, w.action), ("NoCommonArchitecture", "Denied"));
        for text in [
            "ReplicaSet web-7d9c6b8f5",
            "x86:1 (linux/amd64)",
            "z:1 (linux/s390x)",
        ] {
            assert!(w.note.contains(text), "{text}: {}", w.note);
        }
    }

    #[test]
    fn warned_or_not_enforced_the_pod_is_admitted() {
        let warn = Policy {
            on_no_common_architecture: OnNoCommonArchitecture::Warn,
            ..Policy::default()
        };
        let w = warning_for(&pod(replica_set()), DISJOINT, &warn).unwrap();
        assert_eq!((w.reason, w.action), ("NoCommonArchitecture", "Admitted"));
        let dry = Policy {
            enforce: false,
            ..Policy::default()
        };
        let w = warning_for(&pod(replica_set()), DISJOINT, &dry).unwrap();
        assert_eq!(w.action, "Admitted");
    }

    #[test]
    fn failed_lookups_warn_allowed_denied_or_gated() {
        let failed: &[(&str, Result<&[&str], &str>)] = &[
            ("x86:1", Ok(&["linux/amd64"])),
            ("z:1", Err("registry unreachable")),
        ];
        for (on_failure, action) in [
            (OnLookupFailure::Allow, "Admitted"),
            (OnLookupFailure::Deny, "Denied"),
            (OnLookupFailure::Gate, "Gated"),
        ] {
            let policy = Policy {
                on_lookup_failure: on_failure,
                ..Policy::default()
            };
            let w = warning_for(&pod(replica_set()), failed, &policy).unwrap();
            assert_eq!((w.reason, w.action), ("ImageLookupFailed", action));
            assert!(w.note.contains("z:1"), "{}", w.note);
            assert!(w.note.contains("registry unreachable"), "{}", w.note);
        }
    }

    #[test]
    fn placed_pods_bare_pods_and_non_controller_owners_warn_no_one() {
        let shared: &[(&str, Result<&[&str], &str>)] = &[
            ("x86:1", Ok(&["linux/amd64"])),
            ("z:1", Ok(&["linux/amd64", "linux/s390x"])),
        ];
        assert_eq!(
            warning_for(&pod(replica_set()), shared, &Policy::default()),
            None
        );
        assert_eq!(
            warning_for(&pod(json!([])), DISJOINT, &Policy::default()),
            None
        );
        let not_controller = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "c",
                                     "uid": "u", "controller": false}]);
        assert_eq!(
            warning_for(&pod(not_controller), DISJOINT, &Policy::default()),
            None
        );
    }
}
