//! The cluster's node pools as the node watch sees them, and Kubernetes' rules for taints and
//! tolerations: the one place a taint is compared to a taint or to a toleration (`taints`, the
//! node tainter, uses the same functions).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Taint, Toleration};

use super::ARCH_LABEL;

/// The cluster's node pools as the node watch sees them: for each architecture present, the
/// taints its nodes carry under the toleration templates' keys (`kubernetes.io/arch` by
/// default), and each node's architecture (for Pods already bound to a node).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodePools {
    pub architectures: BTreeMap<String, Vec<Taint>>,
    /// Node name → architecture.
    pub nodes: BTreeMap<String, String>,
    /// The `match_node_labels` keys the node watch keeps, each with the values some node
    /// carries (a key absent: not watched).
    pub labels: BTreeMap<String, BTreeSet<String>>,
}

impl NodePools {
    /// Pools from nodes: a node's architecture is its `kubernetes.io/arch` label, else what its
    /// kubelet reports; only taints whose key is one of `taint_keys` count. (The node watch
    /// builds from its projections with [`NodePools::add_node`]; the shell's tests compare the
    /// two, so this is public rather than test-only.)
    pub fn from_nodes<'a>(
        nodes: impl IntoIterator<Item = &'a Node>,
        taint_keys: &BTreeSet<String>,
    ) -> Self {
        let mut pools = Self::default();
        for node in nodes {
            let Some(arch) = node_architecture(node) else {
                continue;
            };
            let taints = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_deref())
                .unwrap_or(&[]);
            pools.add_node(node.metadata.name.as_deref(), &arch, taints, taint_keys);
        }
        pools
    }

    /// Adds one node of `architecture` carrying `taints` (only those under `taint_keys` count):
    /// what [`NodePools::from_nodes`] does for each node, for a shell that keeps less than
    /// whole Nodes.
    pub fn add_node(
        &mut self,
        name: Option<&str>,
        architecture: &str,
        taints: &[Taint],
        taint_keys: &BTreeSet<String>,
    ) {
        if let Some(name) = name {
            self.nodes.insert(name.to_owned(), architecture.to_owned());
        }
        let pool = match self.architectures.get_mut(architecture) {
            Some(pool) => pool,
            None => self
                .architectures
                .entry(architecture.to_owned())
                .or_default(),
        };
        for taint in taints {
            if taint_keys.contains(&taint.key) && !pool.iter().any(|t| same_taint(t, taint)) {
                pool.push(Taint {
                    time_added: None,
                    ..taint.clone()
                });
            }
        }
    }

    /// Says which label keys the node values are kept of (`match_node_labels`).
    pub fn watch_labels<'a>(&mut self, keys: impl IntoIterator<Item = &'a String>) {
        for key in keys {
            self.labels.entry(key.clone()).or_default();
        }
    }

    /// Adds one node's labels under the watched keys.
    pub fn add_node_labels(&mut self, labels: &[(String, String)]) {
        for (key, value) in labels {
            if let Some(values) = self.labels.get_mut(key) {
                values.insert(value.clone());
            }
        }
    }

    /// Whether some node is labelled `key=value`; `None` when `key` is not watched.
    pub fn carries_label(&self, key: &str, value: &str) -> Option<bool> {
        self.labels.get(key).map(|values| values.contains(value))
    }

    pub fn taints(&self, arch: &str) -> &[Taint] {
        self.architectures.get(arch).map_or(&[], Vec::as_slice)
    }
}

/// Whether two taints are the same taint (key, value and effect; an absent value is empty).
pub fn same_taint(a: &Taint, b: &Taint) -> bool {
    a.key == b.key
        && a.value.as_deref().unwrap_or("") == b.value.as_deref().unwrap_or("")
        && a.effect == b.effect
}

/// A node's architecture: its `kubernetes.io/arch` label, else what its kubelet reports.
pub fn node_architecture(node: &Node) -> Option<String> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(ARCH_LABEL))
        .cloned()
        .or_else(|| {
            node.status
                .as_ref()?
                .node_info
                .as_ref()
                .map(|i| i.architecture.clone())
        })
        .filter(|a| !a.is_empty())
}

/// Kubernetes' rule: whether `toleration` tolerates `taint`.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    tolerates_parts(
        toleration,
        &taint.key,
        taint.value.as_deref(),
        &taint.effect,
    )
}

/// [`tolerates`] for a taint given by its parts.
pub(super) fn tolerates_parts(
    toleration: &Toleration,
    taint_key: &str,
    taint_value: Option<&str>,
    taint_effect: &str,
) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or("");
    if !effect.is_empty() && effect != taint_effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    let exists = toleration.operator.as_deref() == Some("Exists");
    if key.is_empty() {
        return exists;
    }
    key == taint_key
        && (exists || toleration.value.as_deref().unwrap_or("") == taint_value.unwrap_or(""))
}

/// The toleration for exactly `taint`.
pub(super) fn toleration_for(taint: &Taint, seconds: Option<i64>) -> Toleration {
    let value = taint.value.clone().filter(|v| !v.is_empty());
    Toleration {
        key: Some(taint.key.clone()),
        operator: Some(if value.is_some() { "Equal" } else { "Exists" }.to_owned()),
        value,
        effect: Some(taint.effect.clone()),
        toleration_seconds: seconds.filter(|_| taint.effect == "NoExecute"),
    }
}
