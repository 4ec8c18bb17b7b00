//! What the node watch keeps of a Node: its name and the few fields a decision or the node
//! tainter reads — about 200 bytes, where the API server sends ~18 KB per Node (kubelet status
//! with 50 images, managed fields) on every list page and every watch event.
//!
//! [`WatchedNode`] is what the watcher deserializes: serde skips every field it does not name,
//! so a heartbeat's image list is scanned but never allocated. The watch keeps only its
//! [`NodeFacts`].

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, NodeSystemInfo, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use crate::mutate::{ARCH_LABEL, OS_LABEL};
use crate::taints::MANAGED_ANNOTATION;

/// A Node as the watch reads it off the wire. Its metadata carries only the name and the
/// resourceVersion (what kube-runtime's watcher resumes from).
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "wire::Node")]
pub(crate) struct WatchedNode {
    meta: ObjectMeta,
    pub(crate) facts: NodeFacts,
}

impl WatchedNode {
    pub(crate) fn name(&self) -> &str {
        self.meta.name.as_deref().unwrap_or("")
    }
}

crate::cluster::watch::core_v1_projection!(
    WatchedNode,
    "Node",
    "nodes",
    k8s_openapi::ClusterResourceScope,
    meta
);

/// Everything tolerable reads of one Node besides its name. Two `NodeFacts` are equal exactly
/// when nothing a decision or the tainter reads differs: a kubelet heartbeat, a new image or a
/// condition leaves them equal, so it rebuilds nothing.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct NodeFacts {
    arch_label: Option<String>,
    os_label: Option<String>,
    kubelet_arch: Option<String>,
    kubelet_os: Option<String>,
    /// Only the taints under the toleration templates' keys (see [`NodeFacts::keep_taints`]),
    /// without `timeAdded`.
    pub(crate) taints: Vec<Taint>,
    /// The tainter's record of the taints it put there.
    managed_taints: Option<String>,
    /// Its labels under the `match_node_labels` keys (see [`NodeFacts::keep_labels`]), sorted.
    pub(crate) labels: Vec<(String, String)>,
}

impl NodeFacts {
    /// Keeps only the taints under `taint_keys`: no other taint describes a pool, and the
    /// tainter re-reads a Node whole before it patches it.
    pub(crate) fn keep_taints(&mut self, taint_keys: &BTreeSet<String>) {
        self.taints.retain(|t| taint_keys.contains(&t.key));
    }

    /// Keeps only the labels under `label_keys` (`match_node_labels`): whether some node
    /// carries a Pod's value is all a decision reads of them.
    pub(crate) fn keep_labels(&mut self, label_keys: &BTreeSet<String>) {
        self.labels.retain(|(key, _)| label_keys.contains(key));
        self.labels.shrink_to_fit();
    }

    /// The Node's architecture, as the core's `node_architecture` reads a whole Node: its
    /// `kubernetes.io/arch` label, else what its kubelet reports; never empty.
    pub(crate) fn architecture(&self) -> Option<&str> {
        self.arch_label
            .as_deref()
            .or(self.kubelet_arch.as_deref())
            .filter(|a| !a.is_empty())
    }

    /// A Node holding exactly these facts, for the code that plans on whole Nodes (the
    /// tainter, the fenced-off warning): it reads the same fields, so it plans the same.
    pub(crate) fn to_node(&self, name: &str) -> Node {
        let labels: BTreeMap<String, String> =
            [(ARCH_LABEL, &self.arch_label), (OS_LABEL, &self.os_label)]
                .into_iter()
                .filter_map(|(k, v)| Some((k.to_owned(), v.clone()?)))
                .chain(self.labels.iter().cloned())
                .collect();
        let annotations = self
            .managed_taints
            .as_ref()
            .map(|m| BTreeMap::from([(MANAGED_ANNOTATION.to_owned(), m.clone())]));
        let node_info =
            (self.kubelet_arch.is_some() || self.kubelet_os.is_some()).then(|| NodeSystemInfo {
                architecture: self.kubelet_arch.clone().unwrap_or_default(),
                operating_system: self.kubelet_os.clone().unwrap_or_default(),
                ..NodeSystemInfo::default()
            });
        Node {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: (!labels.is_empty()).then_some(labels),
                annotations,
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: (!self.taints.is_empty()).then(|| self.taints.clone()),
                ..NodeSpec::default()
            }),
            status: node_info.map(|info| NodeStatus {
                node_info: Some(info),
                ..NodeStatus::default()
            }),
        }
    }
}

/// The wire shape, naming only the fields kept.
mod wire {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::Taint;
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub(super) struct Node {
        #[serde(default)]
        metadata: Meta,
        #[serde(default)]
        spec: Option<Spec>,
        #[serde(default)]
        status: Option<Status>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        name: Option<String>,
        resource_version: Option<String>,
        #[serde(default)]
        labels: Option<BTreeMap<String, String>>,
        #[serde(default)]
        annotations: Option<BTreeMap<String, String>>,
    }

    #[derive(Deserialize)]
    struct Spec {
        #[serde(default)]
        taints: Option<Vec<Taint>>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Status {
        node_info: Option<Info>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Info {
        #[serde(default)]
        architecture: String,
        #[serde(default)]
        operating_system: String,
    }

    impl From<Node> for super::WatchedNode {
        fn from(node: Node) -> Self {
            let Meta {
                name,
                resource_version,
                labels,
                annotations,
            } = node.metadata;
            let mut labels = labels.unwrap_or_default();
            let info = node.status.and_then(|s| s.node_info);
            let non_empty = |s: String| (!s.is_empty()).then_some(s);
            let taints = node
                .spec
                .and_then(|s| s.taints)
                .unwrap_or_default()
                .into_iter()
                .map(|t| Taint {
                    time_added: None,
                    ..t
                })
                .collect();
            Self {
                meta: super::ObjectMeta {
                    name,
                    resource_version,
                    ..super::ObjectMeta::default()
                },
                facts: super::NodeFacts {
                    arch_label: labels.remove(super::ARCH_LABEL),
                    os_label: labels.remove(super::OS_LABEL),
                    kubelet_arch: info
                        .as_ref()
                        .and_then(|i| non_empty(i.architecture.clone())),
                    kubelet_os: info.and_then(|i| non_empty(i.operating_system)),
                    taints,
                    managed_taints: annotations
                        .and_then(|mut a| a.remove(super::MANAGED_ANNOTATION)),
                    // All of them until the watch keeps those it is asked to.
                    labels: labels.into_iter().collect(),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The projection against every recorded Node shape: the pools, the taint plans and the
    //! fenced-off warnings are the same from it as from the whole Node, so every rule the core
    //! applies on pools (templates, taints seen on nodes, a bound Pod's node, steering) answers
    //! the same.
    use super::*;
    use crate::mutate::NodePools;
    use crate::taints::{fenced_off_nodes, plan_taint, plan_untaint, TaintPolicy};
    use serde_json::{json, Value};

    /// Every Node the recordings hold: the small cluster's list and watch, the EKS-shaped list
    /// and its watch (heartbeat, label, taint change), plus the edge shapes the core reads
    /// differently (empty label, kubelet only, timeAdded, a managed-taints annotation, a taint
    /// under another key).
    fn recorded_nodes() -> Vec<Value> {
        let read = |name: &str| {
            std::fs::read_to_string(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/data/kube-api")
                    .join(name),
            )
            .unwrap()
        };
        let mut nodes = Vec::new();
        for list in ["node-list.body.json", "scale/node-list-limit-2.body.json"] {
            let list: Value = serde_json::from_str(&read(list)).unwrap();
            nodes.extend(list["items"].as_array().unwrap().iter().cloned());
        }
        for watch in [
            "node-watch-from-list-rv.body.jsonl",
            "scale/node-watch.body.json",
        ] {
            for line in read(watch).lines().filter(|l| !l.trim().is_empty()) {
                let event: Value = serde_json::from_str(line).unwrap();
                if event["type"] != "BOOKMARK" {
                    nodes.push(event["object"].clone());
                }
            }
        }
        let base = nodes[0].clone();
        let variant = |f: &dyn Fn(&mut Value)| {
            let mut n = base.clone();
            f(&mut n);
            n
        };
        nodes.push(variant(&|n| {
            n["metadata"]["labels"][ARCH_LABEL] = json!("")
        }));
        nodes.push(variant(&|n| {
            n["metadata"]["labels"]
                .as_object_mut()
                .unwrap()
                .remove(ARCH_LABEL);
            n["status"]["nodeInfo"] =
                json!({"architecture": "ppc64le", "operatingSystem": "linux"});
        }));
        nodes.push(variant(&|n| {
            n["metadata"]["name"] = json!("fenced");
            n["metadata"]["labels"][ARCH_LABEL] = json!("riscv64");
            n["metadata"]["annotations"] = json!({MANAGED_ANNOTATION: "kubernetes.io/arch=riscv64:NoSchedule"});
            n["spec"]["taints"] = json!([
                {"key": ARCH_LABEL, "value": "riscv64", "effect": "NoSchedule", "timeAdded": "2026-11-24T10:00:00Z"},
                {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
                {"key": "team", "value": "ml", "effect": "NoSchedule"},
            ]);
        }));
        nodes.push(variant(&|n| {
            n["metadata"]["annotations"] = json!({MANAGED_ANNOTATION: "kubernetes.io/arch=amd64:NoSchedule,other=x:NoExecute"});
            n["spec"]["taints"] = json!([{"key": ARCH_LABEL, "value": "amd64", "effect": "NoSchedule"}]);
        }));
        nodes
    }

    fn policies() -> Vec<TaintPolicy> {
        let set = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>();
        let base = TaintPolicy {
            default_architectures: set(&["amd64"]),
            supported_architectures: set(&["arm64", "s390x"]),
            key: ARCH_LABEL.into(),
            effect: "NoSchedule".into(),
            architecture_taints: BTreeMap::new(),
            force: false,
            taint_keys: set(&[ARCH_LABEL]),
        };
        let forced = TaintPolicy {
            force: true,
            taint_keys: set(&[ARCH_LABEL, "team"]),
            default_architectures: set(&["arm64"]),
            ..base.clone()
        };
        vec![base, forced]
    }

    fn both(node: &Value, keys: &BTreeSet<String>) -> (Node, String, NodeFacts) {
        let whole: Node = serde_json::from_value(node.clone()).unwrap();
        let watched: WatchedNode = serde_json::from_value(node.clone()).unwrap();
        let name = watched.name().to_owned();
        let mut facts = watched.facts;
        facts.keep_taints(keys);
        (whole, name, facts)
    }

    #[test]
    fn the_projection_plans_and_pools_as_the_whole_node_does() {
        let nodes = recorded_nodes();
        assert!(nodes.len() >= 14, "{} recorded shapes", nodes.len());
        for policy in policies() {
            let keys = &policy.taint_keys;
            let mut wholes = Vec::new();
            let mut projected = NodePools::default();
            let mut minimal = Vec::new();
            for node in &nodes {
                let (whole, name, facts) = both(node, keys);
                assert_eq!(
                    crate::mutate::node_architecture(&whole).as_deref(),
                    facts.architecture(),
                    "{name}"
                );
                if let Some(arch) = facts.architecture() {
                    projected.add_node(Some(&name), arch, &facts.taints, keys);
                }
                let small = facts.to_node(&name);
                assert_eq!(
                    plan_taint(&whole, &policy),
                    plan_taint(&small, &policy),
                    "{name}"
                );
                assert_eq!(plan_untaint(&whole), plan_untaint(&small), "{name}");
                wholes.push(whole);
                minimal.push(small);
            }
            assert_eq!(NodePools::from_nodes(&wholes, keys), projected);
            assert_eq!(
                fenced_off_nodes(&wholes, &policy),
                fenced_off_nodes(&minimal, &policy)
            );
        }
    }

    #[test]
    fn a_node_is_kept_in_a_few_hundred_bytes() {
        let list: Value = serde_json::from_str(
            &std::fs::read_to_string(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/data/kube-api/scale/node-list-limit-2.body.json"),
            )
            .unwrap(),
        )
        .unwrap();
        let node = &list["items"][0];
        assert!(node.to_string().len() > 15_000, "the recorded EKS shape");
        let watched: WatchedNode = serde_json::from_value(node.clone()).unwrap();
        let facts = watched.facts;
        let heap = [
            &facts.arch_label,
            &facts.os_label,
            &facts.kubelet_arch,
            &facts.kubelet_os,
            &facts.managed_taints,
        ]
        .iter()
        .filter_map(|s| s.as_ref().map(String::capacity))
        .sum::<usize>()
            + facts
                .taints
                .iter()
                .map(|t| {
                    std::mem::size_of::<Taint>()
                        + t.key.capacity()
                        + t.effect.capacity()
                        + t.value.as_ref().map_or(0, String::capacity)
                })
                .sum::<usize>();
        let kept = std::mem::size_of::<NodeFacts>()
            + heap
            + watched.meta.name.as_ref().unwrap().capacity();
        assert!(
            kept <= 1024,
            "{kept} bytes kept of a {}-byte Node",
            node.to_string().len()
        );
    }
}
