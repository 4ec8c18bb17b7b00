//! What `audit` reads of the cluster (list only): the workloads of every kind with a Pod
//! template, their Pods (followed up their owners to the workload that made them) and the
//! Nodes' architectures.

use std::collections::{BTreeMap, HashMap};

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use serde_json::Value;

use crate::audit::Placed;
use crate::mutate::ARCH_LABEL;
use crate::workload::{Found, Workload};

/// A page of a list: enough to keep each response small on big clusters.
const PAGE: u32 = 500;

/// `(kind, namespace, name)`.
type WorkloadKey = (String, Option<String>, String);

/// A Pod on a node, and the workload it belongs to.
pub(super) struct Running {
    pub(super) placed: Placed,
    workload: WorkloadKey,
}

pub(super) struct ClusterState {
    /// Each workload and how many Pods it asks for.
    pub(super) workloads: Vec<(Workload, u32)>,
    pub(super) node_architectures: BTreeMap<String, String>,
    running: Vec<Running>,
}

impl ClusterState {
    pub(super) fn running_pods(&self) -> usize {
        self.running.len()
    }

    pub(super) fn running_for(&self, workload: &Workload) -> Vec<Running> {
        let key = key_of(workload);
        self.running
            .iter()
            .filter(|r| r.workload == key)
            .map(|r| Running {
                placed: r.placed.clone(),
                workload: r.workload.clone(),
            })
            .collect()
    }
}

fn key_of(workload: &Workload) -> WorkloadKey {
    (
        workload.kind.clone(),
        workload.namespace.clone(),
        workload.name.clone(),
    )
}

/// Lists everything `audit` needs, in `namespace` (else all), workloads and Pods matching
/// `selector`.
pub(super) async fn cluster(
    client: &kube::Client,
    namespace: Option<&str>,
    selector: Option<&str>,
) -> anyhow::Result<ClusterState> {
    let mut objects = Vec::new();
    objects.extend(list(scoped::<Deployment>(client, namespace), selector).await?);
    objects.extend(list(scoped::<StatefulSet>(client, namespace), selector).await?);
    objects.extend(list(scoped::<DaemonSet>(client, namespace), selector).await?);
    objects.extend(list(scoped::<ReplicaSet>(client, namespace), selector).await?);
    objects.extend(list(scoped::<Job>(client, namespace), selector).await?);
    objects.extend(list(scoped::<CronJob>(client, namespace), selector).await?);
    let pods = list(scoped::<Pod>(client, namespace), selector).await?;
    let nodes = list(Api::<Node>::all(client.clone()), None).await?;
    let node_architectures = nodes
        .iter()
        .filter_map(|n| {
            let name = n.pointer("/metadata/name")?.as_str()?;
            let arch = n.pointer("/metadata/labels")?.get(ARCH_LABEL)?.as_str()?;
            Some((name.to_owned(), arch.to_owned()))
        })
        .collect();
    Ok(assemble(objects, pods, node_architectures))
}

fn scoped<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

/// Every item of a (paged) list, as JSON with its `kind` (list items carry none).
async fn list<K>(api: Api<K>, selector: Option<&str>) -> anyhow::Result<Vec<Value>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let plural = K::plural(&K::DynamicType::default()).into_owned();
    let mut params = ListParams::default().limit(PAGE);
    if let Some(selector) = selector {
        params = params.labels(selector);
    }
    let mut items = Vec::new();
    loop {
        let page = api
            .list(&params)
            .await
            .with_context(|| format!("could not list {plural}"))?;
        for item in page.items {
            let mut value = serde_json::to_value(item)?;
            value["kind"] = Value::String(kind.clone());
            items.push(value);
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(items),
        }
    }
}

/// Workloads are the objects no other listed object controls (a Deployment, not its
/// ReplicaSets; a CronJob, not its Jobs); a Pod belongs to the workload at the top of its
/// owners, or is its own.
fn assemble(
    objects: Vec<Value>,
    pods: Vec<Value>,
    node_architectures: BTreeMap<String, String>,
) -> ClusterState {
    let owners: HashMap<String, (WorkloadKey, Option<String>)> = objects
        .iter()
        .filter_map(|o| Some((uid(o)?, (key(o), controller(o)))))
        .collect();
    let top = |mut uid: String| -> Option<WorkloadKey> {
        // Bounded: an ownership cycle in a broken cluster must not hang the audit.
        for _ in 0..8 {
            let (key, owner) = owners.get(&uid)?;
            match owner {
                Some(next) if owners.contains_key(next) => uid = next.clone(),
                _ => return Some(key.clone()),
            }
        }
        None
    };
    let mut found = Found::default();
    let mut replicas: HashMap<WorkloadKey, u32> = HashMap::new();
    for object in objects {
        let controlled = controller(&object).is_some_and(|o| owners.contains_key(&o));
        if !controlled {
            replicas.insert(key(&object), replicas_of(&object));
            let _ = found.add(object, "cluster");
        }
    }
    let mut running = Vec::new();
    for pod in pods {
        let workload = match controller(&pod).and_then(&top) {
            Some(workload) => workload,
            None => {
                replicas.insert(key(&pod), 1);
                let own = key(&pod);
                let _ = found.add(pod.clone(), "cluster");
                own
            }
        };
        if let Some(placed) = placed(&pod, &node_architectures) {
            running.push(Running { placed, workload });
        }
    }
    let workloads = found
        .workloads
        .into_iter()
        .map(|w| {
            let key = key_of(&w);
            // A DaemonSet asks for one Pod per node it runs on.
            let n = if w.kind == "DaemonSet" {
                running.iter().filter(|r| r.workload == key).count() as u32
            } else {
                replicas.get(&key).copied().unwrap_or(1)
            };
            (w, n)
        })
        .collect();
    ClusterState {
        workloads,
        node_architectures,
        running,
    }
}

fn uid(object: &Value) -> Option<String> {
    Some(object.pointer("/metadata/uid")?.as_str()?.to_owned())
}

fn key(object: &Value) -> WorkloadKey {
    let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str);
    (
        text("/kind").unwrap_or_default().to_owned(),
        text("/metadata/namespace").map(str::to_owned),
        text("/metadata/name").unwrap_or_default().to_owned(),
    )
}

/// The uid of the object's controlling owner.
fn controller(object: &Value) -> Option<String> {
    object
        .pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|o| o.get("controller").and_then(Value::as_bool) == Some(true))
        .and_then(|o| Some(o.get("uid")?.as_str()?.to_owned()))
}

fn replicas_of(object: &Value) -> u32 {
    object
        .pointer("/spec/replicas")
        .and_then(Value::as_u64)
        .map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// Where a Pod runs: on a node and not finished.
fn placed(pod: &Value, node_architectures: &BTreeMap<String, String>) -> Option<Placed> {
    let phase = pod.pointer("/status/phase").and_then(Value::as_str);
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    let node = pod.pointer("/spec/nodeName")?.as_str()?;
    Some(Placed {
        pod: pod.pointer("/metadata/name")?.as_str()?.to_owned(),
        node: node.to_owned(),
        architecture: node_architectures.get(node).cloned(),
    })
}

/// The images a Pod (or Pod template) names, for the progress line.
pub(super) fn images_of(pod: &Value) -> Vec<&str> {
    ["containers", "initContainers", "ephemeralContainers"]
        .iter()
        .filter_map(|list| pod.get("spec")?.get(*list)?.as_array())
        .flatten()
        .filter_map(|c| c.get("image")?.as_str())
        .collect()
}
