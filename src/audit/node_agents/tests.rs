use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use serde_json::json;

use super::*;

/// A real DaemonSet object, as `kubectl get ds -o json` shows one: a log shipper whose
/// template tolerates `tolerations`.
fn daemonset(tolerations: serde_json::Value) -> DaemonSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "fluent-bit", "namespace": "logging"},
        "spec": {
            "selector": {"matchLabels": {"app": "fluent-bit"}},
            "template": {
                "metadata": {"labels": {"app": "fluent-bit"}},
                "spec": {
                    "containers": [{"name": "fluent-bit", "image": "fluent/fluent-bit:3.1"}],
                    "tolerations": tolerations
                }
            }
        }
    }))
    .unwrap()
}

fn tolerations(ds: &DaemonSet) -> Vec<Toleration> {
    ds.spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .tolerations
        .clone()
        .unwrap_or_default()
}

/// A real Node object with `kubernetes.io/arch` and these taints.
fn node(name: &str, arch: &str, taints: serde_json::Value) -> TaintedNode {
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/arch": arch}},
        "spec": {"taints": taints}
    }))
    .unwrap();
    let taints = node.spec.unwrap().taints.unwrap_or_default();
    let keys = BTreeSet::from(["kubernetes.io/arch".to_owned()]);
    TaintedNode::of(name.into(), arch.into(), taints, &keys).unwrap_or_else(|| TaintedNode {
        name: name.into(),
        architecture: arch.into(),
        taints: Vec::new(),
    })
}

fn arm(name: &str) -> TaintedNode {
    node(
        name,
        "arm64",
        json!([{"key": "kubernetes.io/arch", "value": "arm64", "effect": "NoSchedule"}]),
    )
}

fn both() -> Vec<String> {
    vec!["amd64".into(), "arm64".into()]
}

#[test]
fn an_agent_without_the_toleration_is_missing_from_the_tainted_pool_its_images_run_on() {
    let ds = daemonset(json!([]));
    let tolerations = tolerations(&ds);
    let template = AgentTemplate {
        tolerations: &tolerations,
        architecture: None,
    };
    let nodes = [arm("arm-1"), arm("arm-2")];
    let reasons = missing(template, &both(), &BTreeSet::from(["amd-1"]), &nodes);
    assert_eq!(
        reasons,
        ["no Pod on 2 tainted arm64 nodes its images run on (arm-1 and arm-2): its template does \
          not tolerate kubernetes.io/arch=arm64:NoSchedule; add a toleration for it to the \
          DaemonSet's Pod template"]
    );
}

#[test]
fn pods_that_predate_the_taint_are_said_to_be_lost_on_the_next_roll() {
    let ds = daemonset(json!(null));
    let tolerations = tolerations(&ds);
    let template = AgentTemplate {
        tolerations: &tolerations,
        architecture: None,
    };
    let reasons = missing(
        template,
        &both(),
        &BTreeSet::from(["arm-1"]),
        &[arm("arm-1"), arm("arm-2")],
    );
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons[0].starts_with("no Pod on 1 tainted arm64 node its images run on (arm-2)"),
        "{reasons:?}"
    );
    assert!(
        reasons[1]
            .starts_with("its Pods on arm-1 predate the taint kubernetes.io/arch=arm64:NoSchedule"),
        "{reasons:?}"
    );
}

#[test]
fn a_tolerating_template_an_unsupported_architecture_or_a_pinned_one_is_no_gap() {
    let nodes = [
        arm("arm-1"),
        node(
            "z-1",
            "s390x",
            json!([{"key": "kubernetes.io/arch", "value": "s390x", "effect": "NoExecute"}]),
        ),
    ];
    // Tolerates every architecture taint (as the recorded team-b/agent does).
    let ds = daemonset(
        json!([{"key": "kubernetes.io/arch", "operator": "Exists", "effect": "NoSchedule"}]),
    );
    let tolerating = tolerations(&ds);
    let template = AgentTemplate {
        tolerations: &tolerating,
        architecture: None,
    };
    assert_eq!(
        missing(template, &both(), &BTreeSet::new(), &nodes[..1]),
        Vec::<String>::new()
    );
    // ... but not the NoExecute one, on s390x, when the images run there.
    let s390x = vec!["s390x".to_owned()];
    let reasons = missing(template, &s390x, &BTreeSet::new(), &nodes);
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(
        reasons[0]
            .contains("(z-1): its template does not tolerate kubernetes.io/arch=s390x:NoExecute"),
        "{reasons:?}"
    );

    // Images for amd64 only: the arm64 pool is no place for it.
    let none = AgentTemplate::default();
    assert!(missing(none, &["amd64".to_owned()], &BTreeSet::new(), &nodes).is_empty());
    // A nodeSelector on amd64 keeps it off arm64 on purpose.
    let pinned = AgentTemplate {
        tolerations: &[],
        architecture: Some("amd64"),
    };
    assert!(missing(pinned, &both(), &BTreeSet::new(), &nodes).is_empty());
}

#[test]
fn only_architecture_taints_that_keep_pods_off_count() {
    let keys = BTreeSet::from(["kubernetes.io/arch".to_owned()]);
    let taints: Vec<Taint> = serde_json::from_value(json!([
        {"key": "kubernetes.io/arch", "value": "arm64", "effect": "PreferNoSchedule"},
        {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    ]))
    .unwrap();
    assert_eq!(
        TaintedNode::of("arm-1".into(), "arm64".into(), taints, &keys),
        None
    );
    let many: Vec<TaintedNode> = (0..5).map(|i| arm(&format!("arm-{i}"))).collect();
    let reasons = missing(AgentTemplate::default(), &both(), &BTreeSet::new(), &many);
    assert!(
        reasons[0].contains(
            "no Pod on 5 tainted arm64 nodes its images run on (arm-0, arm-1, arm-2 and 2 more)"
        ),
        "{reasons:?}"
    );
}
