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

fn seen(object: &Value) -> ObjectSeen {
    let kind = object["kind"].as_str().unwrap().to_owned();
    let item: ObjectItem = serde_json::from_value(object.clone()).unwrap();
    item.project(&kind, |_| false)
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

/// The Pods projected as the shell does: after the workload objects were listed.
fn project_pods(listed: &mut Listed, pods: &[Value]) {
    let owners = listed.owners();
    let projected = pods
        .iter()
        .map(|p| {
            let item: PodItem = serde_json::from_value(p.clone()).unwrap();
            item.project(|c| owners.pod_may_stand_alone(c))
        })
        .collect();
    listed.pods = projected;
}

fn nodes() -> HashMap<String, String> {
    [("amd", "amd64"), ("arm", "arm64")]
        .map(|(n, a)| (n.to_owned(), a.to_owned()))
        .into()
}

/// What is listed without a selector: every workload and Pod.
fn unselected(workloads: &[Value], pods: &[Value]) -> Listed {
    let mut listed = Listed {
        workloads: workloads.iter().map(seen).collect(),
        nodes: nodes(),
        ..Listed::default()
    };
    project_pods(&mut listed, pods);
    listed
}

fn names(state: &ClusterState) -> Vec<(String, String, u32)> {
    state
        .workloads
        .iter()
        .map(|w| (w.key.0.clone(), w.key.2.clone(), w.replicas))
        .collect()
}

#[test]
fn pods_roll_up_to_the_workload_at_the_top_of_their_owners() {
    let workloads = [
        object("Deployment", "web", "D", None),
        object("ReplicaSet", "web-1", "R", Some("D")),
        object("DaemonSet", "agent", "S", None),
        // A ReplicaSet whose owner is not listed (a custom controller's) is a workload.
        object("ReplicaSet", "orphan", "O", Some("gone")),
        object("CronJob", "nightly", "C", None),
        object("Job", "nightly-1", "J", Some("C")),
    ];
    let pods = [
        pod("web-a", Some("R"), "amd", "Running"),
        pod("web-b", Some("R"), "arm", "Running"),
        pod("nightly-a", Some("J"), "amd", "Succeeded"),
        pod("agent-a", Some("S"), "amd", "Running"),
        pod("agent-b", Some("S"), "arm", "Running"),
        pod("debug", None, "arm", "Running"),
        pod("pending", None, "", "Pending"),
    ];
    let state = assemble(unselected(&workloads, &pods));
    // In the order reports list the kinds, whatever order they were listed in.
    assert_eq!(
        names(&state),
        [
            ("Deployment".into(), "web".into(), 3),
            ("DaemonSet".into(), "agent".into(), 2),
            ("ReplicaSet".into(), "orphan".into(), 3),
            ("CronJob".into(), "nightly".into(), 1),
            ("Pod".into(), "debug".into(), 1),
            ("Pod".into(), "pending".into(), 1),
        ]
    );
    let placed: Vec<_> = state
        .running_for(&state.workloads[0].key)
        .iter()
        .map(|r| (r.pod.clone(), r.architecture.clone()))
        .collect();
    assert_eq!(
        placed,
        [
            ("web-a".into(), Some("amd64".into())),
            ("web-b".into(), Some("arm64".into()))
        ]
    );
    // A finished Pod runs nowhere; a Pending one on no node.
    assert!(state.running_for(&state.workloads[3].key).is_empty());
    assert_eq!(state.running_pods(), 5);
    assert_eq!(state.images, BTreeSet::from(["app:1".to_owned()]));
    // A bare Pod is a workload of its own: the Pod, with its spec.
    let debug = state.workloads[4].workload().unwrap();
    assert_eq!(debug.pod["kind"], "Pod");
    assert_eq!(debug.pod["spec"]["nodeName"], "arm");
}

#[test]
fn a_selector_chooses_workloads_and_their_pods_follow_whatever_their_labels() {
    // `-l app=web` chose the Deployment; its ReplicaSet and Pods carry other labels.
    let mut listed = Listed {
        workloads: vec![seen(&object("Deployment", "web", "D", None))],
        between: vec![
            seen(&object("ReplicaSet", "web-1", "R", Some("D"))),
            seen(&object("ReplicaSet", "db-1", "R2", Some("DB"))),
        ],
        selected_pods: Some(HashSet::new()),
        nodes: nodes(),
        ..Listed::default()
    };
    let pods = [
        pod("web-a", Some("R"), "amd", "Running"),
        pod("db-a", Some("R2"), "amd", "Running"),
        pod("debug", None, "arm", "Running"),
    ];
    project_pods(&mut listed, &pods);
    let state = assemble(listed);
    assert_eq!(names(&state), [("Deployment".into(), "web".into(), 3)]);
    assert_eq!(
        state.running_pods(),
        1,
        "db's Pod and the unselected bare Pod left out"
    );
}

#[test]
fn an_ownership_cycle_does_not_hang() {
    let workloads = [
        object("ReplicaSet", "x", "X", Some("Y")),
        object("ReplicaSet", "y", "Y", Some("X")),
    ];
    let pods = [pod("p", Some("X"), "amd", "Running")];
    let state = assemble(unselected(&workloads, &pods));
    // Neither ReplicaSet is on top; the Pod stands as its own workload.
    assert_eq!(names(&state), [("Pod".into(), "p".into(), 1)]);
}

#[test]
fn a_controlled_object_keeps_no_template_and_a_pod_no_spec() {
    let rs: ObjectItem =
        serde_json::from_value(object("ReplicaSet", "web-1", "R", Some("D"))).unwrap();
    let linked = rs.project("ReplicaSet", |uid| uid == "D");
    assert!(linked.object.is_none(), "{linked:?}");
    assert_eq!(linked.controller.as_deref(), Some("D"));
    let mut listed = unselected(
        &[
            object("Deployment", "web", "D", None),
            object("ReplicaSet", "web-1", "R", Some("D")),
        ],
        &[pod("web-a", Some("R"), "amd", "Running")],
    );
    let controlled = listed.pods.remove(0);
    assert!(controlled.object.is_none(), "{controlled:?}");
    assert_eq!(controlled.node.as_deref(), Some("amd"));
    let node: NodeItem = serde_json::from_value(json!({"metadata": {"name": "n1",
        "labels": {"kubernetes.io/arch": "arm64", "other": "x"}},
        "spec": {"taints": [
            {"key": "kubernetes.io/arch", "value": "arm64", "effect": "NoSchedule"},
            {"key": "spot", "value": "true", "effect": "PreferNoSchedule"}]},
        "status": {"images": [{"names": ["a"], "sizeBytes": 1}]}}))
    .unwrap();
    // Only the taints that keep a DaemonSet's Pods off are kept.
    let (name, arch, taints) = node.project().unwrap();
    assert_eq!((name.as_str(), arch.as_str()), ("n1", "arm64"));
    let kept: Vec<String> = taints.iter().map(crate::taints::taint_text).collect();
    assert_eq!(kept, ["kubernetes.io/arch=arm64:NoSchedule"]);
}

#[test]
fn gated_pods_are_reported_with_what_they_wait_for() {
    let deployment = object("Deployment", "web", "d1", None);
    let replica_set = object("ReplicaSet", "web-1", "rs1", Some("d1"));
    let mut waiting = pod("web-1-a", Some("rs1"), "", "Pending");
    waiting["metadata"]["labels"] = json!({"app": "web", "tolerable.io/gated": "true"});
    waiting["metadata"]["annotations"] = json!({"tolerable.io/decision": "gated (tolerable.io/architecture): waiting for the platforms of app:1: registry down"});
    let running = pod("web-1-b", Some("rs1"), "amd", "Running");
    let mut listed = unselected(&[deployment, replica_set], &[]);
    project_pods(&mut listed, &[waiting, running]);
    let state = assemble(listed);
    assert_eq!(
        state.gated,
        vec![GatedSeen {
            namespace: "ns".into(),
            name: "web-1-a".into(),
            state: "true".into(),
            decision: "gated (tolerable.io/architecture): waiting for the platforms of app:1: registry down".into(),
        }]
    );
    assert_eq!(state.running_pods(), 1, "a gated Pod runs nowhere yet");
}

#[test]
fn a_pod_of_a_kind_audit_does_not_list_is_its_own_workload_named_by_its_owner() {
    let mut head = pod("ray-head-x", Some("ray-uid"), "arm", "Running");
    head["metadata"]["ownerReferences"] = json!([{"apiVersion": "ray.io/v1", "kind": "RayCluster",
        "name": "ray", "uid": "ray-uid", "controller": true}]);
    // An owner of a kind the table does not know: a Pod of its own, no owner named.
    let mut other = pod("agent-x", Some("other-uid"), "amd", "Running");
    other["metadata"]["ownerReferences"] = json!([{"apiVersion": "example.com/v1", "kind": "Agent",
        "name": "agent", "uid": "other-uid", "controller": true}]);
    let state = assemble(unselected(&[], &[head, other]));
    let owners: Vec<(&str, Option<&str>)> = state
        .workloads
        .iter()
        .map(|w| (w.key.2.as_str(), w.owner.as_deref()))
        .collect();
    assert_eq!(
        owners,
        [("ray-head-x", Some("RayCluster/ray")), ("agent-x", None)]
    );
}
