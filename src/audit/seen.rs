//! What `audit` keeps of the objects it lists: a compact projection of each (never the whole
//! object: a Pod as listed is tens of KB, a Node about 18 KB with its image list and managed
//! fields), and the ownership assembly (Pod → ReplicaSet → Deployment, Pod → Job → CronJob) that
//! turns them into workloads and the Pods each one runs. Pure: the shell deserialises list pages
//! straight into the `*Item` types (serde skips every other field without keeping it) and hands
//! each item to [`Listed`].

use std::collections::{BTreeSet, HashMap, HashSet};

use k8s_openapi::api::core::v1::Taint;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use super::Placed;
use crate::workload::{Found, Workload};

/// `(kind, namespace, name)`.
pub(crate) type WorkloadKey = (String, Option<String>, String);

/// The kinds `audit` lists as workloads, in the order reports have always listed them.
pub(crate) const WORKLOAD_KINDS: [&str; 7] = [
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "Job",
    "CronJob",
    "Pod",
];

/// How far up the owners a Pod is followed: an ownership cycle in a broken cluster must not
/// hang the audit.
const OWNER_DEPTH: usize = 8;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Meta {
    #[serde(default)]
    name: String,
    namespace: Option<String>,
    uid: Option<String>,
    #[serde(default)]
    owner_references: Vec<OwnerReference>,
    /// Read for Pods only (a bare Pod is a workload of its own); dropped for everything else.
    labels: Option<Box<RawValue>>,
    annotations: Option<Box<RawValue>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct OwnerReference {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    controller: Option<bool>,
    api_version: Option<String>,
    kind: Option<String>,
    name: Option<String>,
}

impl Meta {
    /// The uid of the controlling owner.
    fn controller(&self) -> Option<String> {
        self.owner_references
            .iter()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.clone())
    }

    /// `RayCluster/ray`: the controlling owner, when it is of a kind the kinds table places Pod
    /// templates in and `audit` does not list (its Pods are then workloads of their own,
    /// named by it).
    fn owner_of_its_kind(&self) -> Option<String> {
        let owner = self
            .owner_references
            .iter()
            .find(|o| o.controller == Some(true))?;
        let kind = owner.kind.as_deref()?;
        let known = !crate::kinds::Kinds::built_in()
            .rows(kind, owner.api_version.as_deref())
            .is_empty();
        (known && !WORKLOAD_KINDS.contains(&kind))
            .then(|| format!("{kind}/{}", owner.name.as_deref().unwrap_or_default()))
    }
}

/// A list item of a workload kind, as read from the page: its template kept as the text the API
/// server sent.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ObjectItem {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    spec: WorkloadSpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WorkloadSpec {
    replicas: Option<i64>,
    template: Option<Box<RawValue>>,
    job_template: Option<Box<RawValue>>,
}

/// A Pod list item: its spec as sent (dropped at once unless the Pod has no controller).
#[derive(Debug, Deserialize)]
pub(crate) struct PodItem {
    #[serde(default)]
    metadata: Meta,
    spec: Option<Box<RawValue>>,
    #[serde(default)]
    status: PodStatus,
}

#[derive(Debug, Default, Deserialize)]
struct PodStatus {
    phase: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodSpecSeen {
    node_name: Option<String>,
}

/// A Node list item: its name, architecture label and taints, nothing else kept while reading.
#[derive(Debug, Deserialize)]
pub(crate) struct NodeItem {
    metadata: NodeMeta,
    #[serde(default)]
    spec: NodeSpecSeen,
}

#[derive(Debug, Default, Deserialize)]
struct NodeSpecSeen {
    #[serde(default)]
    taints: Vec<Taint>,
}

#[derive(Debug, Deserialize)]
struct NodeMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    labels: NodeLabels,
}

#[derive(Debug, Default, Deserialize)]
struct NodeLabels {
    #[serde(rename = "kubernetes.io/arch")]
    arch: Option<String>,
}

/// A node's name, architecture and the taints that keep Pods off it (`NoSchedule`,
/// `NoExecute`: what decides where a DaemonSet's controller puts Pods).
pub(crate) type NodeSeen = (String, String, Vec<Taint>);

impl NodeItem {
    /// `None` for a node without the architecture label.
    pub(crate) fn project(self) -> Option<NodeSeen> {
        let arch = self.metadata.labels.arch?;
        let mut taints = self.spec.taints;
        taints.retain(|t| super::node_agents::keeps_pods_off(&t.effect));
        Some((self.metadata.name, arch, taints))
    }
}

/// One listed object of a workload kind, compact.
#[derive(Debug)]
pub(crate) struct ObjectSeen {
    key: WorkloadKey,
    uid: Option<String>,
    controller: Option<String>,
    replicas: u32,
    /// What [`crate::workload::Found::add`] reads (kind, name, namespace, the template), as
    /// JSON text; `None` when the object is known to be controlled by a listed one (a
    /// Deployment's ReplicaSet): it is then only a link between a Pod and its workload.
    object: Option<Box<str>>,
}

/// A Pod held by tolerable's scheduling gate: the `tolerable.io/gated` label's value (`true`:
/// waiting for its images, `unrunnable`) and the decision annotation (what it waits for).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct GatedSeen {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) state: String,
    pub(crate) decision: String,
}

#[derive(Deserialize)]
struct GateLabel {
    #[serde(rename = "tolerable.io/gated")]
    gated: Option<String>,
}

#[derive(Deserialize)]
struct DecisionAnnotation {
    #[serde(rename = "tolerable.io/decision")]
    decision: Option<String>,
}

impl Meta {
    /// The gate's label and the decision, when the Pod carries the label (only that key read).
    fn gated(&self) -> Option<GatedSeen> {
        let labels = self.labels.as_deref()?;
        let state = serde_json::from_str::<GateLabel>(labels.get())
            .ok()?
            .gated?;
        let decision = self
            .annotations
            .as_deref()
            .and_then(|a| serde_json::from_str::<DecisionAnnotation>(a.get()).ok())
            .and_then(|a| a.decision)
            .unwrap_or_default();
        Some(GatedSeen {
            namespace: self.namespace.clone().unwrap_or_default(),
            name: self.name.clone(),
            state,
            decision,
        })
    }
}

/// A Pod, compact: where it runs and who controls it.
#[derive(Debug)]
pub(crate) struct PodSeen {
    /// Held by tolerable's scheduling gate.
    gated: Option<GatedSeen>,
    key: WorkloadKey,
    uid: Option<String>,
    controller: Option<String>,
    node: Option<String>,
    finished: bool,
    /// A Pod without a controller is a workload of its own: then the Pod (metadata, spec).
    object: Option<Box<str>>,
    /// Its controller, when the kinds table knows its kind (`RayCluster/ray`).
    owner: Option<String>,
}

#[derive(Serialize)]
struct WorkloadText<'a> {
    kind: &'a str,
    metadata: MetaText<'a>,
    spec: SpecText<'a>,
}

#[derive(Serialize)]
struct MetaText<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    labels: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    annotations: Option<&'a RawValue>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SpecText<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    template: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job_template: Option<&'a RawValue>,
}

impl ObjectItem {
    /// Its projection; the template is kept unless `controlled_by_listed` says its controller was
    /// listed already.
    pub(crate) fn project(
        self,
        kind: &str,
        controlled_by_listed: impl Fn(&str) -> bool,
    ) -> ObjectSeen {
        let controller = self.metadata.controller();
        let keep = !controller.as_deref().is_some_and(controlled_by_listed);
        let object = keep.then(|| {
            let text = WorkloadText {
                kind,
                metadata: MetaText {
                    name: &self.metadata.name,
                    namespace: self.metadata.namespace.as_deref(),
                    labels: None,
                    annotations: None,
                },
                spec: SpecText {
                    template: self.spec.template.as_deref(),
                    job_template: self.spec.job_template.as_deref(),
                },
            };
            serde_json::to_string(&text)
                .expect("text and raw JSON serialise")
                .into()
        });
        ObjectSeen {
            key: (kind.to_owned(), self.metadata.namespace, self.metadata.name),
            uid: self.metadata.uid,
            controller,
            replicas: self
                .spec
                .replicas
                .map_or(1, |n| u32::try_from(n.max(0)).unwrap_or(u32::MAX)),
            object,
        }
    }
}

impl PodItem {
    /// Its projection; its spec is kept only when `own_workload` says the Pod may be a workload
    /// of its own (no controller, or one that leads to no listed workload; see
    /// [`Owners::pod_may_stand_alone`]).
    pub(crate) fn project(self, own_workload: impl Fn(Option<&str>) -> bool) -> PodSeen {
        let controller = self.metadata.controller();
        let node = self
            .spec
            .as_deref()
            .and_then(|spec| serde_json::from_str::<PodSpecSeen>(spec.get()).ok())
            .and_then(|spec| spec.node_name)
            .filter(|n| !n.is_empty());
        let object = match &self.spec {
            Some(spec) if own_workload(controller.as_deref()) => {
                Some(pod_text(&self.metadata, spec))
            }
            _ => None,
        };
        let owner = self.metadata.owner_of_its_kind();
        PodSeen {
            gated: self.metadata.gated(),
            key: (
                "Pod".to_owned(),
                self.metadata.namespace,
                self.metadata.name,
            ),
            uid: self.metadata.uid,
            controller,
            node,
            finished: matches!(self.status.phase.as_deref(), Some("Succeeded" | "Failed")),
            object,
            owner,
        }
    }
}

fn pod_text(meta: &Meta, spec: &RawValue) -> Box<str> {
    #[derive(Serialize)]
    struct PodText<'a> {
        #[serde(rename = "apiVersion")]
        api_version: &'a str,
        kind: &'a str,
        metadata: MetaText<'a>,
        spec: &'a RawValue,
    }
    let text = PodText {
        api_version: "v1",
        kind: "Pod",
        metadata: MetaText {
            name: &meta.name,
            namespace: meta.namespace.as_deref(),
            labels: meta.labels.as_deref(),
            annotations: meta.annotations.as_deref(),
        },
        spec,
    };
    serde_json::to_string(&text)
        .expect("text and raw JSON serialise")
        .into()
}

/// Everything listed, compact.
#[derive(Debug, Default)]
pub(crate) struct Listed {
    /// Objects of the workload kinds the selector chose.
    pub(crate) workloads: Vec<ObjectSeen>,
    /// With a selector: every ReplicaSet and Job, to follow a Pod up to its workload.
    pub(crate) between: Vec<ObjectSeen>,
    /// Every Pod (of the namespace).
    pub(crate) pods: Vec<PodSeen>,
    /// With a selector: the uids of the Pods it chose (those without a controller are
    /// workloads of their own); `None`: every Pod was chosen.
    pub(crate) selected_pods: Option<HashSet<String>>,
    /// Node name → architecture.
    pub(crate) nodes: HashMap<String, String>,
    /// The nodes with taints that keep Pods off.
    pub(crate) tainted: Vec<NodeSeen>,
}

impl Listed {
    /// The uids of the listed workload objects (a ReplicaSet listed after them whose
    /// controller is among them needs no template).
    pub(crate) fn workload_uids(&self) -> HashSet<String> {
        self.workloads
            .iter()
            .filter_map(|o| o.uid.clone())
            .collect()
    }

    /// Who owns whom among the objects listed so far.
    pub(crate) fn owners(&self) -> Owners<'_> {
        Owners(
            self.workloads
                .iter()
                .chain(&self.between)
                .filter_map(|o| Some((o.uid.as_deref()?, (&o.key, o.controller.as_deref()))))
                .collect(),
        )
    }
}

/// uid → (the object, its controller's uid), over the listed workload objects.
pub(crate) struct Owners<'a>(HashMap<&'a str, (&'a WorkloadKey, Option<&'a str>)>);

impl Owners<'_> {
    fn contains(&self, uid: &str) -> bool {
        self.0.contains_key(uid)
    }

    /// The object at the top of `uid`'s controllers.
    fn top(&self, uid: &str) -> Option<WorkloadKey> {
        let mut here = *self.0.get(uid)?;
        for _ in 0..OWNER_DEPTH {
            let (key, owner) = here;
            match owner.and_then(|next| self.0.get(next)) {
                Some(next) => here = *next,
                None => return Some(key.clone()),
            }
        }
        None
    }

    /// A Pod controlled by `controller` may be a workload of its own: it has no controller, or
    /// its controllers lead to no listed object (a cycle, an owner that is not listed).
    pub(crate) fn pod_may_stand_alone(&self, controller: Option<&str>) -> bool {
        controller.is_none_or(|c| self.top(c).is_none())
    }
}

/// A workload to audit: what [`crate::workload::Found::add`] reads, as JSON text, parsed only
/// when its turn comes.
#[derive(Debug)]
pub(crate) struct WorkloadSeen {
    pub(crate) key: WorkloadKey,
    /// How many Pods it asks for.
    pub(crate) replicas: u32,
    pub(crate) object: Box<str>,
    /// A Pod's controller of a kind `audit` does not list but the kinds table knows
    /// (`RayCluster/ray`): what its report names it by.
    pub(crate) owner: Option<String>,
}

impl WorkloadSeen {
    /// The workload and the Pod its template makes; `None` for a template without containers
    /// (not a workload `review` would report either).
    pub(crate) fn workload(&self) -> Option<Workload> {
        let value: Value = serde_json::from_str(&self.object).ok()?;
        let mut found = Found::default();
        found.add(value, "cluster").ok()?;
        found.workloads.pop()
    }
}

/// The workloads, and where their Pods run.
#[derive(Debug, Default)]
pub(crate) struct ClusterState {
    pub(crate) workloads: Vec<WorkloadSeen>,
    /// Nodes with an architecture label.
    pub(crate) nodes: usize,
    /// Every image the workloads' Pods name, once.
    pub(crate) images: BTreeSet<String>,
    running: HashMap<WorkloadKey, Vec<Placed>>,
    /// Pods held by tolerable's scheduling gate (of the listed workloads, or chosen).
    pub(crate) gated: Vec<GatedSeen>,
    /// The nodes with taints that keep Pods off (for the node agents' check).
    pub(crate) tainted: Vec<NodeSeen>,
}

impl ClusterState {
    pub(crate) fn running_pods(&self) -> usize {
        self.running.values().map(Vec::len).sum()
    }

    pub(crate) fn running_for(&self, key: &WorkloadKey) -> &[Placed] {
        self.running.get(key).map_or(&[], Vec::as_slice)
    }
}

/// The images a workload's Pod names, read from the typed Pod the decision reads (none when
/// the webhook would refuse the Pod).
fn images_of(workload: &crate::workload::Workload) -> Vec<String> {
    let Ok(object) = &workload.object else {
        return Vec::new();
    };
    crate::mutate::images_of(&object.view)
        .map(|images| images.into_iter().map(|slot| slot.image).collect())
        .unwrap_or_default()
}

fn kind_rank(key: &WorkloadKey) -> usize {
    WORKLOAD_KINDS
        .iter()
        .position(|k| *k == key.0)
        .unwrap_or(WORKLOAD_KINDS.len())
}

/// Workloads are the listed objects no other listed object controls (a Deployment, not its
/// ReplicaSets; a CronJob, not its Jobs); a Pod belongs to the workload at the top of its
/// owners, or is its own (when the selector chose it).
pub(crate) fn assemble(listed: Listed) -> ClusterState {
    let Listed {
        workloads: objects,
        between,
        pods,
        selected_pods,
        nodes,
        tainted,
    } = listed;
    let listed_owners = Listed {
        workloads: objects,
        between,
        ..Listed::default()
    };
    let owners = listed_owners.owners();
    let mut workloads = Vec::new();
    let mut replicas: HashMap<WorkloadKey, u32> = HashMap::new();
    for object in &listed_owners.workloads {
        let controlled = object
            .controller
            .as_deref()
            .is_some_and(|o| owners.contains(o));
        if let (false, Some(text)) = (controlled, &object.object) {
            replicas.insert(object.key.clone(), object.replicas);
            workloads.push((object.key.clone(), text.clone()));
        }
    }
    let mut running: HashMap<WorkloadKey, Vec<Placed>> = HashMap::new();
    let mut gated = Vec::new();
    let mut owned: HashMap<WorkloadKey, String> = HashMap::new();
    for mut pod in pods {
        let chosen = || match (&selected_pods, &pod.uid) {
            (None, _) => true,
            (Some(selected), Some(uid)) => selected.contains(uid),
            (Some(_), None) => false,
        };
        let workload = match pod.controller.as_deref().and_then(|c| owners.top(c)) {
            // Its workload, when that was listed (the selector may have left it out).
            Some(workload) if replicas.contains_key(&workload) => workload,
            Some(_) => continue,
            None if chosen() => {
                let Some(text) = pod.object.clone() else {
                    continue;
                };
                replicas.insert(pod.key.clone(), 1);
                workloads.push((pod.key.clone(), text));
                if let Some(owner) = pod.owner.take() {
                    owned.insert(pod.key.clone(), owner);
                }
                pod.key.clone()
            }
            None => continue,
        };
        gated.extend(pod.gated.take());
        if let (Some(node), false) = (pod.node, pod.finished) {
            running.entry(workload).or_default().push(Placed {
                pod: pod.key.2,
                architecture: nodes.get(&node).cloned(),
                node,
            });
        }
    }
    let mut state = finish(workloads, &replicas, running, nodes.len());
    state.gated = gated;
    for seen in &mut state.workloads {
        seen.owner = owned.remove(&seen.key);
    }
    state.tainted = tainted;
    state
}

/// The workloads in the order reports list their kinds, each with the Pods it asks for (a
/// DaemonSet one per node it runs on), and the images they name; a template without containers
/// is no workload.
fn finish(
    mut workloads: Vec<(WorkloadKey, Box<str>)>,
    replicas: &HashMap<WorkloadKey, u32>,
    running: HashMap<WorkloadKey, Vec<Placed>>,
    nodes: usize,
) -> ClusterState {
    workloads.sort_by_key(|(key, _)| kind_rank(key));
    let mut images = BTreeSet::new();
    let workloads = workloads
        .into_iter()
        .map(|(key, object)| {
            let n = if key.0 == "DaemonSet" {
                running.get(&key).map_or(0, Vec::len) as u32
            } else {
                replicas.get(&key).copied().unwrap_or(1)
            };
            WorkloadSeen {
                key,
                replicas: n,
                object,
                owner: None,
            }
        })
        .filter(|seen| match seen.workload() {
            Some(workload) => {
                images.extend(images_of(&workload));
                true
            }
            None => false,
        })
        .collect();
    ClusterState {
        workloads,
        nodes,
        images,
        running,
        gated: Vec::new(),
        tainted: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
