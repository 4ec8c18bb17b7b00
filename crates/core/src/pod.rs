//! The Pod as the decision reads it: exactly the fields the decision and the patch use, nothing
//! that pretends to be a whole Pod. Both ways in build it with an exhaustive struct literal — from
//! the admission request (the admission layer's own wire struct, which skips every other field
//! unread) and from a full `k8s-openapi` Pod ([`PodView::of_pod`], for manifests and tests) —
//! so a field the core starts to read fails to compile until both fill it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Affinity, NodeSelectorRequirement, NodeSelectorTerm, PodOS, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::{explain, Steering, ARCH_LABEL, DECISION_ANNOTATION};

/// What the decision reads of a Pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodView {
    /// `metadata.labels`: the opt-out and the preferred architecture.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`: the opt-out, the preferred architecture, the decision
    /// annotation; `None` when the Pod has no annotations map (the patch then adds one).
    pub annotations: Option<BTreeMap<String, String>>,
    /// `metadata.ownerReferences`: a DaemonSet's Pod is not steered.
    pub owner_references: Vec<OwnerReference>,
    /// `None` when the object has no spec at all.
    pub spec: Option<PodSpecView>,
}

/// What the decision reads of a PodSpec.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodSpecView {
    /// Every container image and image volume, in the order the spec writes them.
    pub images: Vec<ImageSlot>,
    pub node_selector: Option<BTreeMap<String, String>>,
    pub tolerations: Option<Vec<Toleration>>,
    pub affinity: Option<Affinity>,
    pub os: Option<PodOS>,
    /// A Pod already bound to a node is not steered.
    pub node_name: Option<String>,
    /// `spec.schedulingGates`' names, in order (`None`: no list at all).
    pub scheduling_gates: Option<Vec<String>>,
    /// The init containers and containers (kind and index) whose `terminationMessagePolicy`
    /// is the API server's default (`File`, or none) (`[crashes] fallback_to_logs_on_error`).
    pub default_termination_message_policy: Vec<(SlotKind, usize)>,
}

/// Where an image is named in a Pod spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotKind {
    InitContainer,
    Container,
    EphemeralContainer,
    /// An image volume (Kubernetes 1.31+): the kubelet pulls it for the node's platform, so it
    /// counts like a container's image.
    ImageVolume,
}

/// One place in the spec that names an image (`None`: it names none, which is an error).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageSlot {
    pub kind: SlotKind,
    /// The container's or the volume's name.
    pub name: String,
    pub image: Option<String>,
    /// Its position in its list (`containers`, `volumes`, …): where a patch rewrites it.
    pub index: usize,
}

impl PodView {
    /// The view of a full Pod (a manifest, a workload's template, a test's Pod).
    #[cfg(test)]
    pub fn of_pod(pod: &k8s_openapi::api::core::v1::Pod) -> Self {
        let meta = &pod.metadata;
        Self {
            labels: meta.labels.clone().unwrap_or_default(),
            annotations: meta.annotations.clone(),
            owner_references: meta.owner_references.clone().unwrap_or_default(),
            spec: pod.spec.as_ref().map(|spec| {
                let slot = |kind, name: &str, image: &Option<String>, index| ImageSlot {
                    kind,
                    name: name.to_owned(),
                    image: image.clone(),
                    index,
                };
                let mut images = Vec::new();
                let mut no_policy = Vec::new();
                for (i, c) in spec.init_containers.iter().flatten().enumerate() {
                    images.push(slot(SlotKind::InitContainer, &c.name, &c.image, i));
                    if super::logs_on_error::is_default(c.termination_message_policy.as_deref()) {
                        no_policy.push((SlotKind::InitContainer, i));
                    }
                }
                for (i, c) in spec.containers.iter().enumerate() {
                    images.push(slot(SlotKind::Container, &c.name, &c.image, i));
                    if super::logs_on_error::is_default(c.termination_message_policy.as_deref()) {
                        no_policy.push((SlotKind::Container, i));
                    }
                }
                for (i, c) in spec.ephemeral_containers.iter().flatten().enumerate() {
                    images.push(slot(SlotKind::EphemeralContainer, &c.name, &c.image, i));
                }
                for (i, v) in spec.volumes.iter().flatten().enumerate() {
                    if let Some(source) = &v.image {
                        images.push(slot(SlotKind::ImageVolume, &v.name, &source.reference, i));
                    }
                }
                PodSpecView {
                    images,
                    node_selector: spec.node_selector.clone(),
                    tolerations: spec.tolerations.clone(),
                    affinity: spec.affinity.clone(),
                    os: spec.os.clone(),
                    node_name: spec.node_name.clone(),
                    scheduling_gates: spec
                        .scheduling_gates
                        .as_ref()
                        .map(|gates| gates.iter().map(|g| g.name.clone()).collect()),
                    default_termination_message_policy: no_policy,
                }
            }),
        }
    }

    /// A label's value, else an annotation's.
    pub fn label_or_annotation(&self, key: &str) -> Option<&str> {
        self.labels
            .get(key)
            .or_else(|| self.annotations.as_ref().and_then(|a| a.get(key)))
            .map(String::as_str)
    }
}

/// How the Pod itself already constrains `kubernetes.io/arch`.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ExistingConstraint {
    None,
    /// Exactly what tolerable adds for this set (an earlier invocation's work).
    Ours,
    /// The Pod's own; `allowed` when it can be read as a set of architectures.
    Theirs {
        allowed: Option<BTreeSet<String>>,
    },
}

pub(super) fn required_terms(pod: &PodView) -> Option<&Vec<NodeSelectorTerm>> {
    pod.spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .map(|r| &r.node_selector_terms)
}

pub(super) fn existing_arch_constraint(
    pod: &PodView,
    steering: Steering,
    common: &[String],
) -> ExistingConstraint {
    let selector = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref())
        .and_then(|n| n.get(ARCH_LABEL));
    if let Some(arch) = selector {
        if steering == Steering::NodeSelector && common.len() == 1 && *arch == common[0] {
            return ExistingConstraint::Ours;
        }
        return ExistingConstraint::Theirs {
            allowed: Some(BTreeSet::from([arch.clone()])),
        };
    }
    let Some(terms) = required_terms(pod) else {
        return ExistingConstraint::None;
    };
    let arch_expressions: Vec<Vec<_>> = terms
        .iter()
        .map(|t| {
            t.match_expressions
                .iter()
                .flatten()
                .filter(|e| e.key == ARCH_LABEL)
                .collect()
        })
        .collect();
    if arch_expressions.iter().all(Vec::is_empty) {
        return ExistingConstraint::None;
    }
    let ours =
        |e: &&NodeSelectorRequirement| e.operator == "In" && e.values.as_deref() == Some(common);
    if steering == Steering::NodeAffinity && arch_expressions.iter().all(|t| t.iter().any(ours)) {
        return ExistingConstraint::Ours;
    }
    // Readable as a set only when every term limits the arch with `In`: the union of terms.
    let mut allowed = BTreeSet::new();
    for term in &arch_expressions {
        let ins: Vec<_> = term.iter().filter(|e| e.operator == "In").collect();
        if ins.is_empty() {
            return ExistingConstraint::Theirs { allowed: None };
        }
        let mut term_allowed: BTreeSet<String> = ins[0].values.iter().flatten().cloned().collect();
        for e in &ins[1..] {
            let values: BTreeSet<String> = e.values.iter().flatten().cloned().collect();
            term_allowed = term_allowed.intersection(&values).cloned().collect();
        }
        allowed.extend(term_allowed);
    }
    ExistingConstraint::Theirs {
        allowed: Some(allowed),
    }
}

pub(super) fn has_preferred_arch_term(pod: &PodView) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .is_some_and(|terms| {
            terms.iter().any(|t| {
                t.preference
                    .match_expressions
                    .iter()
                    .flatten()
                    .any(|e| e.key == ARCH_LABEL)
            })
        })
}

/// The annotation value to write: `Some` only when it differs from what the Pod carries, so a
/// reinvocation changes nothing.
pub(super) fn annotation_update(pod: &PodView, value: String) -> Option<String> {
    let current = pod
        .annotations
        .as_ref()
        .and_then(|a| a.get(DECISION_ANNOTATION));
    (current != Some(&value)).then_some(value)
}

/// Where a Pod goes when the scheduler does not place it freely: steering it would only leave it
/// Pending (kubernetes/kubernetes#61886), so it gets tolerations only.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct FixedPlacement {
    /// Why, for the annotation.
    pub(super) why: String,
    /// The node it is headed for, when the Pod names one.
    pub(super) node: Option<String>,
}

pub(super) fn fixed_placement(pod: &PodView) -> Option<FixedPlacement> {
    // The DaemonSet controller pins each Pod with a `matchFields metadata.name In [node]` term.
    // Only a term that is the whole selector pins the Pod: beside another term it is one of
    // several places the Pod may go.
    let pinned_node: Option<String> = required_terms(pod).and_then(|terms| match &terms[..] {
        [only] => only.match_fields.iter().flatten().find_map(|f| {
            let values = f.values.as_deref().unwrap_or_default();
            (f.key == "metadata.name" && f.operator == "In" && values.len() == 1)
                .then(|| values[0].clone())
        }),
        _ => None,
    });
    if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
        return Some(FixedPlacement {
            why: explain::bound_to(&node),
            node: Some(node),
        });
    }
    let daemon_set = pod.owner_references.iter().find(|o| {
        o.kind == "DaemonSet" && o.controller == Some(true) && o.api_version.starts_with("apps/")
    });
    match (daemon_set, pinned_node) {
        (Some(owner), node) => Some(FixedPlacement {
            why: explain::owned_by_daemon_set(&owner.name),
            node,
        }),
        (None, Some(node)) => Some(FixedPlacement {
            why: explain::pinned_to(&node),
            node: Some(node),
        }),
        (None, None) => None,
    }
}

impl PodView {
    /// The OS the Pod will run on: its `kubernetes.io/os` node selector, else `spec.os`, else
    /// linux.
    pub fn os(&self) -> String {
        let spec = self.spec.as_ref();
        spec.and_then(|s| s.node_selector.as_ref())
            .and_then(|n| n.get(super::OS_LABEL))
            .cloned()
            .or_else(|| spec.and_then(|s| s.os.as_ref()).map(|os| os.name.clone()))
            .unwrap_or_else(|| "linux".to_owned())
    }

    /// The Pod's own tolerations.
    pub fn tolerations(&self) -> &[Toleration] {
        self.spec
            .as_ref()
            .and_then(|s| s.tolerations.as_deref())
            .unwrap_or_default()
    }
}
