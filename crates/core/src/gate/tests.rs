//! Table tests of the gate: the same decisions reached at admission (images known) and at
//! release (gated first, images learned later) give the same Pod; every patch is applied with
//! the `json-patch` crate, and checked against the rules the API server keeps for gated Pods.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

use super::super::tests::{arch_toleration, facts, pod, policy, request};
use super::*;
use crate::DECISION_ANNOTATION;
use crate::{
    answer, Answer, LookupFailure, OnLookupFailure, Outcome, Steering, WeightedArchitecture,
};

fn gate_policy() -> Policy {
    Policy {
        on_lookup_failure: OnLookupFailure::Gate,
        ..policy()
    }
}

fn apply(target: &Value, ops: &[Operation]) -> Result<Value, String> {
    let ops = serde_json::to_value(ops).unwrap();
    let patch: json_patch::Patch = serde_json::from_value(ops).unwrap();
    let mut out = target.clone();
    json_patch::patch(&mut out, &patch).map_err(|e| e.to_string())?;
    let _: Pod = serde_json::from_value(out.clone()).expect("still a Pod");
    Ok(out)
}

fn admit(pod: &Value, facts: &ImageFacts, policy: &Policy) -> (Answer, Value) {
    let answer = answer(&request(pod, policy), facts, None, policy);
    let patched = apply(pod, &answer.patch).expect("the admission's patch applies");
    (answer, patched)
}

fn terms(pod: &Value) -> Option<&Vec<Value>> {
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"]
        .as_array()
}

/// What the API server allows on a gated Pod, as the recorded exchanges show: required terms
/// only tightened (as many terms, each keeping its expressions), no gate added.
fn assert_allowed_on_gated(before: &Value, after: &Value) {
    if let (Some(old), Some(new)) = (terms(before), terms(after)) {
        if !old.is_empty() {
            assert_eq!(old.len(), new.len(), "a new ORed term: {after:#}");
            for (o, n) in old.iter().zip(new) {
                let o = o["matchExpressions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let n = n["matchExpressions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                assert_eq!(&n[..o.len()], &o[..], "an existing expression changed");
            }
        }
    }
    let gates = |p: &Value| p["spec"]["schedulingGates"].as_array().cloned();
    let (old, new) = (
        gates(before).unwrap_or_default(),
        gates(after).unwrap_or_default(),
    );
    assert!(
        new.iter().all(|g| old.contains(g)),
        "a gate added: {after:#}"
    );
}

/// The Pod without what only gating leaves behind (an emptied gates list).
fn without_gate_traces(mut pod: Value) -> Value {
    let spec = pod["spec"].as_object_mut().unwrap();
    if spec.get("schedulingGates") == Some(&json!([])) {
        spec.remove("schedulingGates");
    }
    if pod["metadata"]["labels"] == json!({}) {
        pod["metadata"].as_object_mut().unwrap().remove("labels");
    }
    pod
}

/// Gated at admission (the lookups failed), then released with the facts: the Pod's gate and
/// label gone, the rest as the admission with the facts would have made it.
fn gate_then_release(p: &Value, known: &ImageFacts, policy: &Policy) -> (Value, Value) {
    let down: ImageFacts = known
        .keys()
        .map(|image| {
            (
                image.clone(),
                Err(LookupFailure::Unavailable("registry down".into())),
            )
        })
        .collect();
    let (gated_answer, gated) = admit(p, &down, policy);
    assert_eq!(gated_answer.outcome(), Outcome::Gated);
    assert!(gated_answer.warnings().is_empty());
    assert_eq!(gated["metadata"]["labels"][GATED_LABEL], GATED);
    let gates = gated["spec"]["schedulingGates"].as_array().unwrap();
    assert_eq!(gates.last().unwrap(), &json!({"name": GATE}), "appended");
    let note = gated["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(note.contains("waiting for the platforms of"), "{note}");
    assert!(note.contains("registry down"), "the lookup's cause: {note}");
    // Nothing else is decided at admission.
    assert_eq!(gated["spec"]["tolerations"], p["spec"]["tolerations"]);
    assert_eq!(gated["spec"]["affinity"], p["spec"]["affinity"]);
    let again = answer(&request(&gated, policy), &down, None, policy);
    assert!(again.patch.is_empty(), "reinvocation: {:#?}", again.patch);
    let Release::Decided { patch, .. } = release(&request(&gated, policy), known, None, policy)
    else {
        panic!("not released");
    };
    assert_eq!(patch[0].op, patch::Op::Test, "the test comes first");
    assert_eq!(patch[0].path, "/spec/schedulingGates");
    let released = apply(&gated, &patch).expect("the release applies");
    assert_allowed_on_gated(&gated, &released);
    assert_eq!(
        release(&request(&released, policy), known, None, policy),
        Release::NotGated(Vec::new()),
        "a released Pod gets no patch"
    );
    let twice = apply(&released, &patch).unwrap_err();
    assert!(
        twice.contains("operation '/0'"),
        "the same release twice fails its test: {twice}"
    );
    (gated, released)
}

/// The gate policy; with node_selector steering; with a preferred architecture.
fn policies() -> (Policy, Policy, Policy) {
    let gating = gate_policy();
    let selector = Policy {
        steering: Steering::NodeSelector,
        ..gate_policy()
    };
    let preferring = Policy {
        preferred_architectures: vec![WeightedArchitecture {
            architecture: "arm64".into(),
            weight: 80,
        }],
        ..gate_policy()
    };
    (gating, selector, preferring)
}

/// The table: a Pod, its images' facts, the policy.
fn cases() -> Vec<(&'static str, Value, ImageFacts, Policy)> {
    let zones = json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}]},
    ]}}}}});
    let tolerations =
        json!({"spec": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}});
    let labelled = json!({"metadata": {"labels": {"app": "web"}, "annotations": {"a": "b"}}});
    let other_gate = json!({"spec": {"schedulingGates": [{"name": "example.com/other-gate"}]}});
    let (gating, selector, preferring) = policies();
    let multi = facts(&[("app:1", Ok(&["linux/amd64", "linux/arm64"]))]);
    let arm = facts(&[("app:1", Ok(&["linux/arm64"]))]);
    let two = facts(&[
        ("app:1", Ok(&["linux/amd64", "linux/arm64"])),
        ("side:2", Ok(&["linux/arm64", "linux/s390x"])),
    ]);
    vec![
        (
            "bare, multi-arch",
            pod(&["app:1"], json!({})),
            multi.clone(),
            gating.clone(),
        ),
        (
            "bare, arm64 only",
            pod(&["app:1"], json!({})),
            arm.clone(),
            gating.clone(),
        ),
        (
            "two ORed terms",
            pod(&["app:1"], zones.clone()),
            arm.clone(),
            gating.clone(),
        ),
        (
            "own tolerations",
            pod(&["app:1"], tolerations),
            multi.clone(),
            gating.clone(),
        ),
        (
            "labels",
            pod(&["app:1"], labelled),
            multi.clone(),
            gating.clone(),
        ),
        (
            "other gate",
            pod(&["app:1"], other_gate),
            arm.clone(),
            gating.clone(),
        ),
        (
            "two images",
            pod(&["app:1", "side:2"], zones),
            two.clone(),
            gating.clone(),
        ),
        (
            "node_selector",
            pod(&["app:1"], json!({})),
            arm.clone(),
            selector.clone(),
        ),
        (
            "preferences",
            pod(&["app:1"], json!({})),
            multi.clone(),
            preferring.clone(),
        ),
    ]
}

#[test]
fn the_same_decisions_at_admission_and_at_release() {
    for (name, p, known, policy) in cases() {
        let (known, policy) = (&known, &policy);
        let (_, direct) = admit(&p, known, policy);
        let (_, released) = gate_then_release(&p, known, policy);
        assert_eq!(
            without_gate_traces(released.clone()),
            direct,
            "{name}: released ≠ admitted"
        );
        assert!(
            direct["spec"]["tolerations"] != p["spec"]["tolerations"]
                || direct["spec"]["affinity"] != p["spec"]["affinity"],
            "{name}: the decision changes the Pod (or the case proves nothing)"
        );
        let others = p["spec"]["schedulingGates"].clone();
        assert_eq!(
            released["spec"]["schedulingGates"],
            if others.is_null() { json!([]) } else { others },
            "{name}: only tolerable's gate removed"
        );
    }
}

#[test]
fn another_controllers_gate_survives_and_a_stale_read_fails_the_test() {
    let p = pod(
        &["app:1"],
        json!({"spec": {"schedulingGates": [{"name": "example.com/first"}]}}),
    );
    let policy = gate_policy();
    let known = facts(&[("app:1", Ok(&["linux/arm64"]))]);
    let (gated, released) = gate_then_release(&p, &known, &policy);
    assert_eq!(
        released["spec"]["schedulingGates"],
        json!([{"name": "example.com/first"}])
    );
    assert_eq!(
        released["spec"]["tolerations"],
        json!([arch_toleration("arm64")])
    );
    // The other controller removes its gate between our read and our patch: the patch made
    // from the stale read fails as a whole (its index would now name another element).
    let Release::Decided { patch, .. } = release(&request(&gated, &policy), &known, None, &policy)
    else {
        panic!("not released");
    };
    let mut moved = gated.clone();
    moved["spec"]["schedulingGates"] = json!([{"name": GATE}]);
    let err = apply(&moved, &patch).unwrap_err();
    assert!(
        err.contains("operation '/0'"),
        "the test (op 0) fails: {err}"
    );
}

#[test]
fn still_unknown_images_keep_the_pod_waiting() {
    let policy = gate_policy();
    let down = facts(&[("app:1", Err("registry down"))]);
    let (_, gated) = admit(&pod(&["app:1"], json!({})), &down, &policy);
    match release(&request(&gated, &policy), &down, None, &policy) {
        Release::Waiting(waiting) => assert_eq!(waiting, vec!["app:1: registry down".to_owned()]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn images_without_a_common_architecture_stay_gated_and_unrunnable() {
    let policy = gate_policy();
    let p = pod(&["amd:1", "arm:1"], json!({}));
    let down = facts(&[
        ("amd:1", Err("registry down")),
        ("arm:1", Err("registry down")),
    ]);
    let (_, gated) = admit(&p, &down, &policy);
    let known = facts(&[
        ("amd:1", Ok(&["linux/amd64"])),
        ("arm:1", Ok(&["linux/arm64"])),
    ]);
    let Release::Unrunnable { patch, message } =
        release(&request(&gated, &policy), &known, None, &policy)
    else {
        panic!("not unrunnable");
    };
    assert!(message.contains("amd:1 (linux/amd64)"), "{message}");
    assert!(message.contains("arm:1 (linux/arm64)"), "{message}");
    let after = apply(&gated, &patch).unwrap();
    assert_eq!(
        after["spec"]["schedulingGates"],
        json!([{"name": GATE}]),
        "stays gated"
    );
    assert_eq!(after["metadata"]["labels"][GATED_LABEL], UNRUNNABLE);
    assert_eq!(
        after["metadata"]["annotations"][DECISION_ANNOTATION],
        json!(message)
    );
    assert_eq!(after["spec"]["tolerations"], Value::Null);
}

#[test]
fn a_timed_out_pod_is_released_unchanged() {
    let policy = gate_policy();
    let p = pod(
        &["app:1"],
        json!({"spec": {"schedulingGates": [{"name": GATE}, {"name": "example.com/later"}]}, "metadata": {"labels": {GATED_LABEL: GATED, "app": "x"}}}),
    );
    let why = "its images' lookups did not answer within gate_timeout (2m)";
    let ops = release_unchanged(&request(&p, &policy).pod, why);
    let after = apply(&p, &ops).unwrap();
    assert_eq!(
        after["spec"]["schedulingGates"],
        json!([{"name": "example.com/later"}])
    );
    assert_eq!(after["metadata"]["labels"], json!({"app": "x"}));
    let note = after["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap();
    assert_eq!(note, format!("released unchanged: {why}"));
    assert_eq!(after["spec"]["tolerations"], Value::Null);
    assert_eq!(after["spec"]["affinity"], Value::Null);
    assert_eq!(ops[0].op, patch::Op::Test);
    assert!(
        release_unchanged(&request(&after, &policy).pod, why).is_empty(),
        "idempotent"
    );
}

#[test]
fn pods_that_cannot_be_gated_are_allowed_with_a_warning() {
    let policy = Policy {
        own_namespace: Some("apps".into()),
        ..gate_policy()
    };
    let down = facts(&[("app:1", Err("registry down"))]);
    let daemon = json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u", "controller": true}]}});
    let cases = [
        ("own namespace", json!({}), "own namespace apps"),
        ("bound", json!({"spec": {"nodeName": "n1"}}), "not gated"),
        (
            "mirror",
            json!({"metadata": {"annotations": {MIRROR_ANNOTATION: "x"}}}),
            "mirror",
        ),
        ("daemon set", daemon, "DaemonSet"),
    ];
    for (i, (name, extra, why)) in cases.into_iter().enumerate() {
        let policy = match i {
            0 => policy.clone(),
            _ => gate_policy(),
        };
        let (out, patched) = admit(&pod(&["app:1"], extra.clone()), &down, &policy);
        assert_eq!(out.outcome(), Outcome::LookupFailed, "{name}");
        assert_eq!(patched, pod(&["app:1"], extra), "{name}: unchanged");
        let warnings = out.warnings().join("\n");
        assert!(
            warnings.contains(why) && warnings.contains("not gated"),
            "{name}: {warnings}"
        );
    }
    // skip_namespaces: skipped before any lookup, as always.
    let skipped = Policy {
        skip_namespaces: ["apps".to_owned()].into(),
        ..gate_policy()
    };
    let (out, _) = admit(&pod(&["app:1"], json!({})), &down, &skipped);
    assert_eq!(out.outcome(), Outcome::Skipped);
}

#[test]
fn report_only_says_it_would_gate() {
    let policy = Policy {
        enforce: false,
        ..gate_policy()
    };
    let down = facts(&[("app:1", Err("registry down"))]);
    let (out, patched) = admit(&pod(&["app:1"], json!({})), &down, &policy);
    assert_eq!(out.outcome(), Outcome::Gated);
    assert_eq!(
        out.not_enforced(),
        Some(false),
        "counted as a change it would make"
    );
    assert_eq!(patched["spec"]["schedulingGates"], Value::Null);
    assert_eq!(patched["metadata"]["labels"], Value::Null);
    let note = patched["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(
        note.starts_with("report only (enforce = false): would be gated"),
        "{note}"
    );
}

/// In a Namespace with its own preference (`tolerable.io/preferred-architecture`), the release
/// carries that preference as the admission in that Namespace does: the controller reads the
/// Pod's Namespace policy as the admission reads it.
#[test]
fn a_release_in_a_namespace_with_a_preference_carries_it() {
    let policy = gate_policy();
    let annotations = [(
        "tolerable.io/preferred-architecture".to_string(),
        "arm64=80, amd64=20".to_string(),
    )]
    .into();
    let batch = Arc::new(crate::NamespacePolicy::from_metadata(
        None,
        Some(&annotations),
    ));
    let in_batch = |p: &Value| {
        let pod: Pod = serde_json::from_value(p.clone()).unwrap();
        PodCreate::in_namespace("batch", Some(batch.clone()), PodView::of_pod(&pod), &policy)
            .unwrap()
    };
    let p = pod(&["app:1"], json!({}));
    let known = facts(&[("app:1", Ok(&["linux/amd64", "linux/arm64"]))]);
    let direct = apply(&p, &answer(&in_batch(&p), &known, None, &policy).patch).unwrap();
    let preferred = &direct["spec"]["affinity"]["nodeAffinity"]
        ["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(preferred[0]["weight"], 80, "{direct:#}");

    let down = facts(&[("app:1", Err("registry down"))]);
    let gated = apply(&p, &answer(&in_batch(&p), &down, None, &policy).patch).unwrap();
    let Release::Decided { patch, .. } = release(&in_batch(&gated), &known, None, &policy) else {
        panic!("not released");
    };
    let released = without_gate_traces(apply(&gated, &patch).unwrap());
    assert_eq!(
        released["spec"]["affinity"], direct["spec"]["affinity"],
        "{released:#}"
    );
    // Read without its Namespace's policy (as before), the release would lack the preference.
    let Release::Decided { patch, .. } = release(&request(&gated, &policy), &known, None, &policy)
    else {
        panic!("not released");
    };
    let elsewhere = apply(&gated, &patch).unwrap();
    assert_ne!(elsewhere["spec"]["affinity"], direct["spec"]["affinity"]);
}
