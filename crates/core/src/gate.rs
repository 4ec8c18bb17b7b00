//! Scheduling gates (`on_lookup_failure = "gate"`): a Pod whose images cannot all be looked up
//! at admission is held — tolerable's gate added, its label set, the annotation naming what it
//! waits for — and nothing else is decided then. The gate controller later decides once, with
//! every image known, through the same [`super::decide`], and releases the Pod with one JSON
//! Patch the API server accepts on a gated Pod: a `test` of the gates list as read, then the
//! decision (tolerations added, steering ANDed into each existing required term — a gated Pod's
//! terms may only be tightened — or the term created, the nodeSelector set, the preferences),
//! then the removal of tolerable's gate only (by index: other controllers' gates stay) and of
//! its label. Pure: the controller (`crate::gates`) gathers the facts and sends the patches.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSchedulingGate;

use super::patch::{self, pointer_token, Operation, PatchValue};
use super::{
    decide, explain, pod, Decision, ImageFacts, NodePools, Placement, PodCreate, PodView, Policy,
};

/// The scheduling gate tolerable adds and removes (and no other).
pub const GATE: &str = "tolerable.io/architecture";
/// The label of a Pod tolerable gated: `true` while the controller works on it (its watch
/// selects these), [`UNRUNNABLE`] once its images are known to share no architecture.
pub const GATED_LABEL: &str = "tolerable.io/gated";
/// [`GATED_LABEL`]'s value while the Pod waits for its images.
pub const GATED: &str = "true";
/// [`GATED_LABEL`]'s value of a Pod whose images share no architecture: it stays gated, out of
/// the watched set.
pub const UNRUNNABLE: &str = "unrunnable";
/// The annotation the kubelet puts on a mirror Pod (a static Pod's API copy).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Why a Pod cannot be gated (it is then allowed unchanged with a warning), if it cannot: one
/// bound to a node (the API server refuses gates with `nodeName`) or otherwise not placed by the
/// scheduler freely (a DaemonSet's, pinned to a node: the decision never steers those), a mirror
/// Pod (the kubelet runs it whatever the API says), one in tolerable's own namespace (a webhook
/// whose own Pods wait behind its gate could never release them). `skip_namespaces` are skipped
/// before any lookup.
pub fn cannot_gate(namespace: &str, pod: &PodView, policy: &Policy) -> Option<String> {
    if pod
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
    {
        return Some(explain::not_gated("a mirror Pod"));
    }
    if policy.own_namespace.as_deref() == Some(namespace) {
        return Some(explain::not_gated(&format!(
            "in tolerable's own namespace {namespace}"
        )));
    }
    pod::fixed_placement(pod).map(|fixed| explain::not_gated(&fixed.why))
}

/// The gates as the Pod lists them.
fn gates(pod: &PodView) -> &[String] {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_deref())
        .unwrap_or_default()
}

/// Whether the Pod carries tolerable's gate.
pub fn is_gated(pod: &PodView) -> bool {
    gates(pod).iter().any(|g| g == GATE)
}

fn gate_values(names: &[String]) -> Vec<PodSchedulingGate> {
    names
        .iter()
        .map(|name| PodSchedulingGate { name: name.clone() })
        .collect()
}

fn label_path() -> String {
    format!("/metadata/labels/{}", pointer_token(GATED_LABEL))
}

/// The admission's patch for a gated Pod: the gate appended (or the list created), the label,
/// the annotation; what the Pod already has of them (a reinvocation) is not added again.
pub fn gate_operations(pod: &PodView, summary: &str) -> Vec<Operation> {
    let mut ops = Vec::new();
    if !is_gated(pod) {
        let gate = PodSchedulingGate { name: GATE.into() };
        match pod.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref()) {
            Some(_) => ops.push(Operation::add(
                "/spec/schedulingGates/-",
                PatchValue::Gate(gate),
            )),
            None => ops.push(Operation::add(
                "/spec/schedulingGates",
                PatchValue::Gates(vec![gate]),
            )),
        }
    }
    ops.extend(set_label(pod, GATED));
    let annotation = pod::annotation_update(pod, summary.to_owned());
    ops.extend(patch::operations(
        pod,
        &Placement {
            annotation,
            ..Placement::default()
        },
    ));
    ops
}

/// [`GATED_LABEL`] set to `value` (the labels map created when the Pod has none).
fn set_label(pod: &PodView, value: &str) -> Option<Operation> {
    if pod.labels.get(GATED_LABEL).map(String::as_str) == Some(value) {
        return None;
    }
    Some(if pod.labels.is_empty() {
        // An absent map and an empty one alike: `add` replaces an existing member.
        Operation::add(
            "/metadata/labels",
            PatchValue::Labels(BTreeMap::from([(GATED_LABEL.to_owned(), value.to_owned())])),
        )
    } else {
        Operation::add(label_path(), PatchValue::Text(value.to_owned()))
    })
}

/// What the controller does with a Pod it found labelled gated, given what is known of its
/// images now.
#[derive(Clone, Debug, PartialEq)]
pub enum Release {
    /// The Pod carries no gate of tolerable's (already released, or never gated): nothing to
    /// send, the label removed if it is left.
    NotGated(Vec<Operation>),
    /// Some image is still unknown (`image: reason` each): look again later.
    Waiting(Vec<String>),
    /// Released with the decision: the one patch, and the decision's summary.
    Decided {
        patch: Vec<Operation>,
        summary: String,
    },
    /// The images share no architecture: the Pod stays gated; the patch relabels it
    /// [`UNRUNNABLE`] and writes the message (each image's platforms) into the annotation.
    Unrunnable {
        patch: Vec<Operation>,
        message: String,
    },
}

/// The release of a gated Pod as it is now (`request`, read from the Pod the API server
/// returned) with `facts`: the same decision the admission would have made with these facts,
/// carried out by a patch the API server accepts on a gated Pod.
pub fn release(
    request: &PodCreate,
    facts: &ImageFacts,
    pools: Option<&NodePools>,
    policy: &Policy,
) -> Release {
    let pod = &request.pod;
    if !is_gated(pod) {
        return Release::NotGated(remove_label(pod).into_iter().collect());
    }
    // Decided as the admission decides, with the Pod's gate the decision's business no more.
    let deciding = Policy {
        enforce: true,
        on_lookup_failure: super::OnLookupFailure::Gate,
        ..policy.clone()
    };
    match decide(request, facts, pools, &deciding) {
        Decision::Placed(placement) => Release::Decided {
            patch: release_operations(pod, &placement),
            summary: placement.summary,
        },
        Decision::Gated { waiting, .. } => Release::Waiting(waiting),
        Decision::Unchanged {
            why: super::Untouched::NoCommonArchitecture,
            summary,
            ..
        }
        | Decision::Denied {
            why: super::Untouched::NoCommonArchitecture,
            summary,
            ..
        } => {
            let message = explain::unrunnable(&summary);
            let mut patch = vec![test_gates(pod)];
            patch.extend(set_label(pod, UNRUNNABLE));
            patch.extend(annotation_operations(pod, &message));
            Release::Unrunnable { patch, message }
        }
        // Skipped since (opted out), over the limits, not gateable any more: released
        // unchanged, saying why.
        other => Release::Decided {
            patch: unchanged_operations(pod, other.summary()),
            summary: other.summary().to_owned(),
        },
    }
}

/// The `test` every release patch starts with: the gates list exactly as read, so a patch made
/// from a stale read (another controller removed its gate since) fails as a whole.
fn test_gates(pod: &PodView) -> Operation {
    Operation::test(
        "/spec/schedulingGates",
        PatchValue::Gates(gate_values(gates(pod))),
    )
}

/// tolerable's gate removed (by its index in the list as read) and its label.
fn ungate(pod: &PodView) -> Vec<Operation> {
    let mut ops = Vec::new();
    if let Some(index) = gates(pod).iter().position(|g| g == GATE) {
        ops.push(Operation::remove(Cow::Owned(format!(
            "/spec/schedulingGates/{index}"
        ))));
    }
    ops.extend(remove_label(pod));
    ops
}

fn remove_label(pod: &PodView) -> Option<Operation> {
    pod.labels
        .contains_key(GATED_LABEL)
        .then(|| Operation::remove(label_path()))
}

fn annotation_operations(pod: &PodView, text: &str) -> Vec<Operation> {
    let annotation = pod::annotation_update(
        pod,
        explain::cut(text.to_owned(), explain::MAX_SUMMARY_BYTES),
    );
    patch::operations(
        pod,
        &Placement {
            annotation,
            ..Placement::default()
        },
    )
}

/// The release with the decision: test, the placement's operations, then the gate and label
/// removed. The placement's constraints go in with (never after) the removal: once the last
/// gate is gone, only tolerations may still be added.
fn release_operations(pod: &PodView, placement: &Placement) -> Vec<Operation> {
    let mut ops = vec![test_gates(pod)];
    ops.extend(patch::operations(pod, placement));
    ops.extend(ungate(pod));
    ops
}

/// A release that changes nothing of where the Pod runs: test, the annotation saying why, the
/// gate and label removed.
fn unchanged_operations(pod: &PodView, why: &str) -> Vec<Operation> {
    let mut ops = vec![test_gates(pod)];
    ops.extend(annotation_operations(pod, why));
    ops.extend(ungate(pod));
    ops
}

/// The release of a Pod whose lookups did not answer within `gate_timeout` (or that an operator
/// releases by hand): unchanged, the annotation saying so. Empty for a Pod without tolerable's
/// gate (idempotent).
pub fn release_unchanged(pod: &PodView, why: &str) -> Vec<Operation> {
    if !is_gated(pod) {
        return remove_label(pod).into_iter().collect();
    }
    unchanged_operations(pod, &explain::released_unchanged(why))
}

#[cfg(test)]
mod tests;
