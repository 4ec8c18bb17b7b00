//! Table tests of pinning: each patch applied with `json-patch`, deciding again on the pinned
//! Pod (whose images are now by digest, looked up as such) changes nothing.

use std::sync::Arc;

use serde_json::{json, Value};

use super::super::platform::Platform;
use super::super::tests::{pod, policy, run};
use super::super::*;

const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

/// A fact for `image` (and for its pinned form, as a lookup by digest answers), digest `D1`.
fn facts_with_digest(images: &[&str], platforms: &[&str]) -> ImageFacts {
    let fact = Arc::new(ImageFact {
        platforms: platforms
            .iter()
            .map(|p| {
                let parts: Vec<&str> = p.split('/').collect();
                Platform::normalized(parts[0], parts[1], parts.get(2).copied())
            })
            .collect(),
        artifact: None,
        credentials: Provenance::Anonymous,
        stale: None,
        digest: Some(D1.to_owned()),
    });
    images
        .iter()
        .flat_map(|image| [image.to_string(), format!("{image}@{D1}")])
        .map(|image| (image, Ok(fact.clone())))
        .collect()
}

fn pinning() -> Policy {
    Policy {
        pin_digests: true,
        ..policy()
    }
}

#[test]
fn every_image_by_tag_is_pinned_to_the_digest_decided_on() {
    let p = pod(
        &["app:1"],
        json!({"spec": {
            "initContainers": [{"name": "init", "image": "tool:2"}],
            "volumes": [
                {"name": "cfg", "emptyDir": {}},
                {"name": "model", "image": {"reference": "weights:3"}},
            ],
        }}),
    );
    let f = facts_with_digest(&["app:1", "tool:2", "weights:3"], &["linux/amd64"]);
    let out = run(&p, &f, &pinning());
    let spec = &out.patched["spec"];
    assert_eq!(spec["containers"][0]["image"], format!("app:1@{D1}"));
    assert_eq!(spec["initContainers"][0]["image"], format!("tool:2@{D1}"));
    assert_eq!(
        spec["volumes"][1]["image"]["reference"],
        format!("weights:3@{D1}")
    );
    assert_eq!(spec["volumes"][0], json!({"name": "cfg", "emptyDir": {}}));
    let note = out.patched["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(
        note.contains(&format!("app:1@{D1} (linux/amd64)")),
        "{note}"
    );
    assert!(
        note.contains("images pinned to the digests decided on (pin_digests)"),
        "{note}"
    );
}

#[test]
fn images_by_digest_and_unpinned_policies_are_left_alone() {
    let by_digest = format!("app:1@{D1}");
    let f = facts_with_digest(&["app:1"], &["linux/amd64"]);
    let out = run(&pod(&[&by_digest], json!({})), &f, &pinning());
    assert_eq!(out.patched["spec"]["containers"][0]["image"], by_digest);
    assert!(!out
        .ops
        .iter()
        .any(|op| op["path"] == "/spec/containers/0/image"));

    // Off by default; the Pod's own label turns it on, the Namespace's can turn it off.
    let out = run(&pod(&["app:1"], json!({})), &f, &policy());
    assert_eq!(out.patched["spec"]["containers"][0]["image"], "app:1");
    let labelled = json!({"metadata": {"labels": {PIN_DIGEST_KEY: "true"}}});
    let out = run(&pod(&["app:1"], labelled), &f, &policy());
    assert_eq!(out.patched["spec"]["containers"][0]["image"], by_digest);
    let note = out.patched["metadata"]["annotations"][DECISION_ANNOTATION].to_string();
    assert!(note.contains("the Pod's tolerable.io/pin-digest"), "{note}");
}

#[test]
fn a_namespace_label_decides_below_the_pod() {
    let f = facts_with_digest(&["app:1"], &["linux/amd64"]);
    let namespace = Arc::new(NamespacePolicy::from_metadata(
        Some(&[(PIN_DIGEST_KEY.to_owned(), "false".to_owned())].into()),
        None,
    ));
    let pod_json = pod(&["app:1"], json!({}));
    let k8s_pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod_json).unwrap();
    let request = |ns: &Arc<NamespacePolicy>| {
        PodCreate::in_namespace(
            "apps",
            Some(ns.clone()),
            PodView::of_pod(&k8s_pod),
            &pinning(),
        )
        .unwrap()
    };
    let answer_off = answer(&request(&namespace), &f, None, &pinning());
    assert!(!answer_off
        .patch
        .iter()
        .any(|op| op.path == "/spec/containers/0/image"));
    let on = Arc::new(NamespacePolicy::from_metadata(
        Some(&[(PIN_DIGEST_KEY.to_owned(), "true".to_owned())].into()),
        None,
    ));
    let answer_on = answer(&request(&on), &f, None, &policy());
    let pinned: Vec<Value> = answer_on
        .patch
        .iter()
        .map(|op| serde_json::to_value(op).unwrap())
        .filter(|op| op["path"] == "/spec/containers/0/image")
        .collect();
    assert_eq!(
        pinned,
        [json!({"op": "add", "path": "/spec/containers/0/image", "value": format!("app:1@{D1}")})]
    );
}

#[test]
fn report_only_says_what_it_would_pin_and_changes_no_image() {
    let f = facts_with_digest(&["app:1"], &["linux/amd64"]);
    let p = Policy {
        enforce: false,
        ..pinning()
    };
    let out = run(&pod(&["app:1"], json!({})), &f, &p);
    assert_eq!(out.patched["spec"]["containers"][0]["image"], "app:1");
    let note = out.patched["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(
        note.starts_with("report only (enforce = false): would add "),
        "{note}"
    );
    assert!(note.contains(&format!("; pins app:1@{D1};")), "{note}");
}
