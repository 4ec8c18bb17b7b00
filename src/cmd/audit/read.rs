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
    let selected_pods = list(scoped::<Pod>(client, namespace), selector).await?;
    // The selector chooses workloads by their own labels; the ReplicaSets and Jobs between a
    // workload and its Pods, and the Pods, are read whole, so a Deployment's Pods are found
    // whatever labels its template gives them.
    let (between, pods) = match selector {
        None => (Vec::new(), selected_pods.clone()),
        Some(_) => {
            let mut between = list(scoped::<ReplicaSet>(client, namespace), None).await?;
            between.extend(list(scoped::<Job>(client, namespace), None).await?);
            (between, list(scoped::<Pod>(client, namespace), None).await?)
        }
    };
    let nodes = list(Api::<Node>::all(client.clone()), None).await?;
    let node_architectures = nodes
        .iter()
        .filter_map(|n| {
            let name = n.pointer("/metadata/name")?.as_str()?;
            let arch = n.pointer("/metadata/labels")?.get(ARCH_LABEL)?.as_str()?;
            Some((name.to_owned(), arch.to_owned()))
        })
        .collect();
    let listed = Listed {
        workloads: objects,
        between,
        pods,
        selected_pods,
    };
    Ok(assemble(listed, node_architectures))
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

/// What was listed.
struct Listed {
    /// Objects of the workload kinds the selector chose.
    workloads: Vec<Value>,
    /// With a selector: every ReplicaSet and Job, to follow a Pod up to its workload.
    between: Vec<Value>,
    /// Every Pod (of the namespace).
    pods: Vec<Value>,
    /// The Pods the selector chose: those without a controller are workloads of their own.
    selected_pods: Vec<Value>,
}

/// Workloads are the listed objects no other object controls (a Deployment, not its
/// ReplicaSets; a CronJob, not its Jobs); a Pod belongs to the workload at the top of its
/// owners, or is its own (when the selector chose it).
fn assemble(listed: Listed, node_architectures: BTreeMap<String, String>) -> ClusterState {
    let Listed {
        workloads: objects,
        between,
        pods,
        selected_pods,
    } = listed;
    let owners: HashMap<String, (WorkloadKey, Option<String>)> = objects
        .iter()
        .chain(&between)
        .filter_map(|o| Some((uid(o)?, (key(o), controller(o)))))
        .collect();
    let selected: std::collections::HashSet<String> =
        selected_pods.iter().filter_map(uid).collect();
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
            // Its workload, when that was listed (the selector may have left it out).
            Some(workload) if replicas.contains_key(&workload) => workload,
            Some(_) => continue,
            None if uid(&pod).is_some_and(|u| selected.contains(&u)) => {
                let own = key(&pod);
                replicas.insert(own.clone(), 1);
                let _ = found.add(pod.clone(), "cluster");
                own
            }
            None => continue,
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
    let node = pod
        .pointer("/spec/nodeName")?
        .as_str()
        .filter(|n| !n.is_empty())?;
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(kind: &str, name: &str, uid: &str, owner: Option<&str>) -> Value {
        let mut meta = json!({"name": name, "namespace": "ns", "uid": uid});
        if let Some(owner) = owner {
            meta["ownerReferences"] = json!([{"uid": owner, "controller": true}]);
        }
        let template = json!({"spec": {"containers": [{"name": "c", "image": "app:1"}]}});
        let spec = match kind {
            "CronJob" => json!({"jobTemplate": {"spec": {"template": template}}}),
            _ => json!({"replicas": 3, "template": template}),
        };
        json!({"kind": kind, "metadata": meta, "spec": spec})
    }

    fn pod(name: &str, owner: Option<&str>, node: &str, phase: &str) -> Value {
        let mut pod = object("Pod", name, &format!("pod-{name}"), owner);
        pod["spec"] = json!({"containers": [{"name": "c", "image": "app:1"}]});
        if !node.is_empty() {
            pod["spec"]["nodeName"] = json!(node);
        }
        pod["status"] = json!({"phase": phase});
        pod
    }

    fn nodes() -> BTreeMap<String, String> {
        [("amd", "amd64"), ("arm", "arm64")]
            .map(|(n, a)| (n.to_owned(), a.to_owned()))
            .into()
    }

    /// What is listed without a selector: every workload and Pod.
    fn unselected(workloads: Vec<Value>, pods: Vec<Value>) -> Listed {
        Listed {
            workloads,
            between: Vec::new(),
            selected_pods: pods.clone(),
            pods,
        }
    }

    fn names(state: &ClusterState) -> Vec<(String, String, u32)> {
        state
            .workloads
            .iter()
            .map(|(w, n)| (w.kind.clone(), w.name.clone(), *n))
            .collect()
    }

    #[test]
    fn pods_roll_up_to_the_workload_at_the_top_of_their_owners() {
        let workloads = vec![
            object("Deployment", "web", "D", None),
            object("ReplicaSet", "web-1", "R", Some("D")),
            object("CronJob", "nightly", "C", None),
            object("Job", "nightly-1", "J", Some("C")),
            object("DaemonSet", "agent", "S", None),
            // A ReplicaSet whose owner is not listed (a custom controller's) is a workload.
            object("ReplicaSet", "orphan", "O", Some("gone")),
        ];
        let pods = vec![
            pod("web-a", Some("R"), "amd", "Running"),
            pod("web-b", Some("R"), "arm", "Running"),
            pod("nightly-a", Some("J"), "amd", "Succeeded"),
            pod("agent-a", Some("S"), "amd", "Running"),
            pod("agent-b", Some("S"), "arm", "Running"),
            pod("debug", None, "arm", "Running"),
            pod("pending", None, "", "Pending"),
        ];
        let listed = unselected(workloads, pods);
        let state = assemble(listed, nodes());
        assert_eq!(
            names(&state),
            [
                ("Deployment".into(), "web".into(), 3),
                ("CronJob".into(), "nightly".into(), 1),
                ("DaemonSet".into(), "agent".into(), 2),
                ("ReplicaSet".into(), "orphan".into(), 3),
                ("Pod".into(), "debug".into(), 1),
                ("Pod".into(), "pending".into(), 1),
            ]
        );
        let web = &state.workloads[0].0;
        let placed: Vec<_> = state
            .running_for(web)
            .into_iter()
            .map(|r| (r.placed.pod, r.placed.architecture))
            .collect();
        assert_eq!(
            placed,
            [
                ("web-a".into(), Some("amd64".into())),
                ("web-b".into(), Some("arm64".into()))
            ]
        );
        // A finished Pod runs nowhere; a Pending one on no node.
        assert!(state.running_for(&state.workloads[1].0).is_empty());
        assert_eq!(state.running_pods(), 5);
    }

    #[test]
    fn a_selector_chooses_workloads_and_their_pods_follow_whatever_their_labels() {
        // `-l app=web` chose the Deployment; its ReplicaSet and Pods carry other labels.
        let listed = Listed {
            workloads: vec![object("Deployment", "web", "D", None)],
            between: vec![
                object("ReplicaSet", "web-1", "R", Some("D")),
                object("ReplicaSet", "db-1", "R2", Some("DB")),
            ],
            pods: vec![
                pod("web-a", Some("R"), "amd", "Running"),
                pod("db-a", Some("R2"), "amd", "Running"),
                pod("debug", None, "arm", "Running"),
            ],
            selected_pods: Vec::new(),
        };
        let state = assemble(listed, nodes());
        assert_eq!(names(&state), [("Deployment".into(), "web".into(), 3)]);
        assert_eq!(
            state.running_pods(),
            1,
            "db's Pod and the unselected bare Pod left out"
        );
    }

    #[test]
    fn an_ownership_cycle_does_not_hang() {
        let workloads = vec![
            object("ReplicaSet", "x", "X", Some("Y")),
            object("ReplicaSet", "y", "Y", Some("X")),
        ];
        let pods = vec![pod("p", Some("X"), "amd", "Running")];
        let listed = unselected(workloads, pods);
        let state = assemble(listed, nodes());
        // Neither ReplicaSet is on top; the Pod stands as its own workload.
        assert_eq!(names(&state), [("Pod".into(), "p".into(), 1)]);
    }
}
