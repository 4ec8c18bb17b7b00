//! `match_node_labels`: a Pod labelled `team=ml` runs only on nodes labelled `team=ml`.
//! `key In [value]` is ANDed into every required nodeSelectorTerm that does not constrain the
//! key yet (terms are ORed: a new term beside the Pod's own would hold for neither), or set in
//! the nodeSelector under `steering = node_selector`. A constraint the Pod already has on the
//! key is kept as it is — never overwritten — with a warning when it contradicts the label.
//! What is required depends only on the Pod and the policy, so deciding again on the patched
//! Pod adds nothing and writes the same summary.

use k8s_openapi::api::core::v1::NodeSelectorRequirement;

use super::pod::required_terms;
use super::{explain, NodePools, Placement, PodView, Policy, Steering};

/// Adds to `placement` the constraints the Pod's labels call for; the note for the summary
/// (empty when no listed key is among the Pod's labels). Not called for a Pod the scheduler
/// does not place freely (a DaemonSet's, a bound one). With the node watch's `pools`, a label
/// value no node carries is warned of (the Pod would stay Pending) — never denied: a node
/// group may be on its way.
pub(super) fn require(
    pod: &PodView,
    policy: &Policy,
    pools: Option<&NodePools>,
    placement: &mut Placement,
) -> String {
    let mut matched = Vec::new();
    for key in &policy.match_node_labels {
        let Some(value) = pod.labels.get(key) else {
            continue;
        };
        if pools.and_then(|p| p.carries_label(key, value)) == Some(false) {
            placement
                .warnings
                .push(explain::no_node_labelled(key, value));
        }
        let contradictions = contradictions(pod, key, value);
        match where_missing(pod, policy.steering, key) {
            Missing::Nowhere => {}
            Missing::NodeSelector => placement
                .node_selector_labels
                .push((key.clone(), value.clone())),
            Missing::RequiredTerms => placement.required_labels.push((key.clone(), value.clone())),
        }
        let kept = !contradictions.is_empty();
        placement.warnings.extend(
            contradictions
                .iter()
                .map(|own| explain::node_label_contradicted(key, value, own)),
        );
        matched.push(explain::node_label_required(key, value, kept));
    }
    explain::node_labels(&matched)
}

/// Where `key` still has to be required.
enum Missing {
    /// The nodeSelector or every required term already constrains it.
    Nowhere,
    NodeSelector,
    /// Some required term lacks it, or there is none.
    RequiredTerms,
}

fn where_missing(pod: &PodView, steering: Steering, key: &str) -> Missing {
    let spec = pod.spec.as_ref();
    if spec
        .and_then(|s| s.node_selector.as_ref())
        .is_some_and(|n| n.contains_key(key))
    {
        return Missing::Nowhere;
    }
    let terms = required_terms(pod).map_or(&[][..], Vec::as_slice);
    let constrains = |t: &&k8s_openapi::api::core::v1::NodeSelectorTerm| {
        t.match_expressions.iter().flatten().any(|e| e.key == key)
    };
    let constrained = terms.iter().filter(constrains).count();
    if !terms.is_empty() && constrained == terms.len() {
        Missing::Nowhere
    } else if steering == Steering::NodeSelector && constrained == 0 {
        Missing::NodeSelector
    } else {
        Missing::RequiredTerms
    }
}

/// The Pod's own constraints on `key` that no node labelled `key=value` satisfies, described.
fn contradictions(pod: &PodView, key: &str, value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let selector = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref())
        .and_then(|n| n.get(key));
    if let Some(own) = selector.filter(|own| *own != value) {
        out.push(format!("nodeSelector {key}={own}"));
    }
    let expressions = required_terms(pod)
        .into_iter()
        .flatten()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .filter(|e| e.key == key && !admits(e, value));
    for e in expressions {
        let text = explain::requirement_text(e);
        if !out.contains(&text) {
            out.push(text);
        }
    }
    out
}

/// Whether a node labelled `key=value` satisfies `e` (Kubernetes' operators; an unknown one
/// satisfies nothing, as the API server would refuse it).
fn admits(e: &NodeSelectorRequirement, value: &str) -> bool {
    let values = e.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    let compare = |ordering: std::cmp::Ordering| match (number(value), values.first()) {
        (Some(v), Some(bound)) => number(bound).is_some_and(|b| v.cmp(&b) == ordering),
        _ => false,
    };
    match e.operator.as_str() {
        "In" => values.iter().any(|v| v == value),
        "NotIn" => !values.iter().any(|v| v == value),
        "Exists" => true,
        "Gt" => compare(std::cmp::Ordering::Greater),
        "Lt" => compare(std::cmp::Ordering::Less),
        _ => false,
    }
}
