//! Node agents on tainted pools: a DaemonSet's controller creates a Pod on a node only when the
//! template tolerates the node's `NoSchedule` and `NoExecute` taints. The webhook cannot mend
//! that (it sees Pods, and the controller never creates this one), so tainting an arm64 pool
//! silently removes log shippers, node exporters and security agents from it. Pure: `audit`
//! hands in the DaemonSet's template, its images' common architectures, the nodes its Pods run
//! on and the nodes carrying an architecture taint.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Taint, Toleration};

use super::listed_and_more;
pub(crate) use crate::taints::{keeps_pods_off, untolerated, REMEDY};

/// How many nodes a reason names before it says "and N more".
const NODES_NAMED: usize = 3;

/// A node with taints under the policy's architecture taint keys that keep Pods off
/// (`NoSchedule`, `NoExecute`), and its architecture.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TaintedNode {
    pub(crate) name: String,
    pub(crate) architecture: String,
    pub(crate) taints: Vec<Taint>,
}

impl TaintedNode {
    /// The node when it carries such a taint; `None` otherwise (nothing to check there).
    pub(crate) fn of(
        name: String,
        architecture: String,
        taints: Vec<Taint>,
        taint_keys: &BTreeSet<String>,
    ) -> Option<Self> {
        let taints: Vec<Taint> = taints
            .into_iter()
            .filter(|t| taint_keys.contains(&t.key) && keeps_pods_off(&t.effect))
            .collect();
        (!taints.is_empty()).then_some(Self {
            name,
            architecture,
            taints,
        })
    }
}

/// What the check reads of a DaemonSet's Pod template.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AgentTemplate<'a> {
    pub(crate) tolerations: &'a [Toleration],
    /// Its `nodeSelector`'s `kubernetes.io/arch`: nodes of other architectures are left out on
    /// purpose.
    pub(crate) architecture: Option<&'a str>,
}

/// The nodes of one (architecture, taints not tolerated): those without a Pod, and those whose
/// Pod predates the taint.
type Gap<'a> = (Vec<&'a str>, Vec<&'a str>);

/// One reason per (architecture, taints not tolerated) for the tainted nodes of an
/// architecture the images run on: where the DaemonSet has no Pod, and where its Pods only
/// predate the taint (they are not recreated there once deleted or rolled).
pub(crate) fn missing(
    template: AgentTemplate<'_>,
    common: &[String],
    runs_on: &BTreeSet<&str>,
    nodes: &[TaintedNode],
) -> Vec<String> {
    let mut gaps: BTreeMap<(&str, Vec<String>), Gap<'_>> = BTreeMap::new();
    for node in nodes {
        let arch = node.architecture.as_str();
        if !common.iter().any(|c| c == arch) || template.architecture.is_some_and(|a| a != arch) {
            continue;
        }
        let taints = untolerated(template.tolerations, &node.taints);
        if taints.is_empty() {
            continue;
        }
        let (absent, predating) = gaps.entry((arch, taints)).or_default();
        if runs_on.contains(node.name.as_str()) {
            predating.push(&node.name);
        } else {
            absent.push(&node.name);
        }
    }
    let mut reasons = Vec::new();
    for ((arch, taints), (absent, predating)) in gaps {
        let taints = taints.join(", ");
        if !absent.is_empty() {
            reasons.push(format!(
                "no Pod on {} tainted {arch} node{} its images run on ({}): its template does \
                 not tolerate {taints}; {REMEDY}",
                absent.len(),
                plural(absent.len()),
                names(&absent)
            ));
        }
        if !predating.is_empty() {
            reasons.push(format!(
                "its Pods on {} predate the taint {taints} its template does not tolerate: once \
                 deleted or rolled they are not recreated there; {REMEDY}",
                names(&predating)
            ));
        }
    }
    reasons
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn names(nodes: &[&str]) -> String {
    let named: Vec<String> = nodes
        .iter()
        .take(NODES_NAMED)
        .map(|n| (*n).to_owned())
        .collect();
    listed_and_more(&named, nodes.len())
}

#[cfg(test)]
mod tests;
