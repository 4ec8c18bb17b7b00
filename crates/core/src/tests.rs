//! Table tests of the decision core: every patch is applied with the `json-patch` crate (an
//! independent implementation), the result is read back as a `k8s-openapi` Pod, and deciding
//! again on the patched Pod must change nothing (reinvocation).

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

use super::platform::Platform;
use super::*;

pub(super) fn policy() -> Policy {
    // The defaults, with a second tainted pool.
    Policy {
        supported_architectures: BTreeSet::from(["arm64".to_owned(), "s390x".to_owned()]),
        ..Policy::default()
    }
}

/// A Pod with one container per image, plus whatever `extra` merges into it.
pub(super) fn pod(images: &[&str], extra: Value) -> Value {
    let containers: Vec<Value> = images
        .iter()
        .enumerate()
        .map(|(i, image)| json!({"name": format!("c{i}"), "image": image}))
        .collect();
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "apps"},
        "spec": {"containers": containers},
    });
    merge(&mut pod, extra);
    pod
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

/// As the resolver reports them: normalised and sorted.
fn platforms(list: &[&str]) -> Arc<ImageFact> {
    let mut platforms: Vec<Platform> = list
        .iter()
        .map(|p| {
            let parts: Vec<&str> = p.split('/').collect();
            Platform::normalized(parts[0], parts[1], parts.get(2).copied())
        })
        .collect();
    platforms.sort();
    Arc::new(ImageFact {
        platforms,
        artifact: None,
        credentials: Provenance::Anonymous,
        stale: None,
        digest: None,
    })
}

pub(super) fn facts(list: &[(&str, Result<&[&str], &str>)]) -> ImageFacts {
    list.iter()
        .map(|(image, r)| {
            (
                image.to_string(),
                r.map(platforms)
                    .map_err(|reason| LookupFailure::Unavailable(reason.to_owned())),
            )
        })
        .collect()
}

/// The Pod being created in `apps`, read from a full Pod's JSON.
pub(super) fn request(pod_json: &Value, policy: &Policy) -> PodCreate {
    let pod: Pod = serde_json::from_value(pod_json.clone()).expect("a Pod");
    PodCreate::new("apps", PodView::of_pod(&pod), policy).expect("the Pod names images")
}

/// `decide` for a full Pod created in `namespace`.
fn decide_pod(namespace: &str, pod: &Pod, facts: &ImageFacts, policy: &Policy) -> Decision {
    let request = PodCreate::new(namespace, PodView::of_pod(pod), policy).unwrap();
    decide(&request, facts, None, policy)
}

pub(super) struct Outcome {
    pub(super) decision: Decision,
    pub(super) patched: Value,
    pub(super) ops: Vec<Value>,
}

/// Decides, applies the patch, parses the result as a Pod, and checks that deciding again on the
/// patched Pod changes nothing.
pub(super) fn run(pod_json: &Value, facts: &ImageFacts, policy: &Policy) -> Outcome {
    let created = request(pod_json, policy);
    let Answer {
        decision, patch, ..
    } = answer(&created, facts, None, policy);
    let ops: Vec<Value> = patch
        .iter()
        .map(|op| serde_json::to_value(op).unwrap())
        .collect();
    let mut patched = pod_json.clone();
    let p: json_patch::Patch = serde_json::from_value(Value::Array(ops.clone())).unwrap();
    json_patch::patch(&mut patched, &p).unwrap_or_else(|e| panic!("{e}: {ops:#?}"));
    let _: Pod = serde_json::from_value(patched.clone()).expect("patched object is a Pod");
    let again_ops = answer(&request(&patched, policy), facts, None, policy).patch;
    assert!(
        again_ops.is_empty(),
        "reinvocation changed the Pod again: {again_ops:#?}"
    );
    Outcome {
        decision,
        patched,
        ops,
    }
}

pub(super) fn arch_toleration(arch: &str) -> Value {
    json!({"key": ARCH_LABEL, "operator": "Equal", "value": arch, "effect": "NoSchedule"})
}

pub(super) fn required_terms(patched: &Value) -> &Value {
    &patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"]
}

#[test]
fn multi_arch_image_gets_tolerations_and_affinity_on_a_bare_pod() {
    let p = pod(&["app:1"], json!({}));
    let out = run(
        &p,
        &facts(&[(
            "app:1",
            Ok(&["linux/amd64", "linux/arm64/v8", "linux/arm/v7"]),
        )]),
        &policy(),
    );
    assert_eq!(
        out.patched["spec"]["tolerations"],
        json!([arch_toleration("arm64")])
    );
    assert_eq!(
        required_terms(&out.patched),
        &json!([{"matchExpressions": [{"key": ARCH_LABEL, "operator": "In", "values": ["amd64", "arm", "arm64"]}]}])
    );
    let note = out.patched["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(
        note.starts_with("linux architectures amd64,arm,arm64; tolerates arm64"),
        "{note}"
    );
    assert!(
        note.contains("app:1 (linux/amd64,linux/arm/v7,linux/arm64)"),
        "{note}"
    );
    // Parents are added whole, never `/spec` itself.
    assert!(out
        .ops
        .iter()
        .all(|op| op["op"] == "add" && op["path"] != "/spec"));
    assert!(out.ops.iter().any(|op| op["path"] == "/spec/tolerations"));
    assert!(out.ops.iter().any(|op| op["path"] == "/spec/affinity"));
}

#[test]
fn existing_tolerations_are_appended_to_and_equivalents_respected() {
    let defaults = json!({"spec": {"tolerations": [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    ]}});
    let f = facts(&[("app:1", Ok(&["linux/arm64", "linux/s390x"]))]);
    let out = run(&pod(&["app:1"], defaults.clone()), &f, &policy());
    let tolerations = out.patched["spec"]["tolerations"].as_array().unwrap();
    assert_eq!(tolerations.len(), 4);
    assert_eq!(tolerations[2], arch_toleration("arm64"));
    assert_eq!(tolerations[3], arch_toleration("s390x"));
    assert!(out.ops.iter().any(|op| op["path"] == "/spec/tolerations/-"));

    // A toleration that already covers the taint (Exists on the key, any effect) is enough.
    let mut covered = defaults;
    covered["spec"]["tolerations"]
        .as_array_mut()
        .unwrap()
        .push(json!({"key": ARCH_LABEL, "operator": "Exists"}));
    let out = run(&pod(&["app:1"], covered), &f, &policy());
    assert_eq!(out.decision.placement().unwrap().tolerations, vec![]);
    assert_eq!(
        out.patched["spec"]["tolerations"].as_array().unwrap().len(),
        3
    );

    // The empty key with Exists tolerates everything.
    let everything = json!({"spec": {"tolerations": [{"operator": "Exists"}]}});
    let out = run(&pod(&["app:1"], everything), &f, &policy());
    assert!(out.decision.placement().unwrap().tolerations.is_empty());
}

#[test]
fn common_architectures_of_all_images_including_init_and_ephemeral() {
    let p = pod(
        &["a:1"],
        json!({"spec": {
            "initContainers": [{"name": "init", "image": "b:1"}],
            "ephemeralContainers": [{"name": "debug", "image": "c:1"}],
        }}),
    );
    let f = facts(&[
        ("a:1", Ok(&["linux/amd64", "linux/arm64", "linux/s390x"])),
        ("b:1", Ok(&["linux/arm64", "linux/s390x", "windows/amd64"])),
        ("c:1", Ok(&["linux/arm64", "linux/s390x", "linux/ppc64le"])),
    ]);
    let out = run(&p, &f, &policy());
    assert_eq!(
        out.patched["spec"]["tolerations"],
        json!([arch_toleration("arm64"), arch_toleration("s390x")])
    );
    assert_eq!(
        required_terms(&out.patched)[0]["matchExpressions"][0]["values"],
        json!(["arm64", "s390x"])
    );
}

#[test]
fn single_arch_default_image_is_pinned_without_tolerations() {
    let out = run(
        &pod(&["legacy:1"], json!({})),
        &facts(&[("legacy:1", Ok(&["linux/amd64"]))]),
        &policy(),
    );
    assert!(out.patched["spec"]["tolerations"].is_null());
    assert_eq!(
        required_terms(&out.patched)[0]["matchExpressions"][0]["values"],
        json!(["amd64"])
    );
    let note = out.patched["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(note.contains("tolerates no tainted pool"), "{note}");
}

#[test]
fn no_common_architecture_denies_naming_each_image_or_warns() {
    let p = pod(&["x86:1", "z:1"], json!({}));
    let f = facts(&[
        ("x86:1", Ok(&["linux/amd64"])),
        ("z:1", Ok(&["linux/s390x"])),
    ]);
    let pod: Pod = serde_json::from_value(p.clone()).unwrap();
    let d = decide_pod("apps", &pod, &f, &policy());
    let message = d.denial().unwrap();
    assert!(
        message.contains("x86:1 (linux/amd64)") && message.contains("z:1 (linux/s390x)"),
        "{message}"
    );
    assert_eq!(d.outcome(), super::Outcome::Denied);
    assert!(matches!(
        d,
        Decision::Denied {
            why: super::Untouched::NoCommonArchitecture,
            ..
        }
    ));
    assert!(answer(&request(&p, &policy()), &f, None, &policy())
        .patch
        .is_empty());

    let mut warn = policy();
    warn.on_no_common_architecture = OnNoCommonArchitecture::Warn;
    let out = run(&p, &f, &warn);
    assert!(out.decision.denial().is_none());
    assert_eq!(out.decision.outcome(), super::Outcome::NoCommonArchitecture);
    assert!(
        out.decision.warnings()[0].contains("no linux architecture is common"),
        "{:?}",
        out.decision.warnings()
    );
    assert!(out.ops.is_empty(), "{:?}", out.ops);
}

#[test]
fn lookup_failure_changes_nothing_but_explains_or_denies() {
    // `gone:1` is used by two containers, not next to each other: it is warned about once.
    let p = pod(&["gone:1", "ok:1", "gone:2", "gone:1"], json!({}));
    let f = facts(&[
        ("ok:1", Ok(&["linux/arm64"])),
        ("gone:1", Err("not found in the registry")),
        ("gone:2", Err("not found in the registry")),
    ]);
    let out = run(&p, &f, &policy());
    assert_eq!(out.decision.outcome(), super::Outcome::LookupFailed);
    assert!(out.patched["spec"]["tolerations"].is_null());
    assert!(out.patched["spec"]["affinity"].is_null());
    assert_eq!(
        out.decision.warnings().len(),
        2,
        "{:?}",
        out.decision.warnings()
    );
    assert!(
        out.decision.warnings()[0].contains("gone:1: not found")
            && out.decision.warnings()[1].contains("gone:2: not found"),
        "{:?}",
        out.decision.warnings()
    );
    // Nothing at all is patched for a Pod tolerable does not understand.
    assert!(out.ops.is_empty(), "{:?}", out.ops);
    assert!(out
        .decision
        .summary()
        .starts_with("unchanged: platforms unknown"));

    let mut deny = policy();
    deny.on_lookup_failure = OnLookupFailure::Deny;
    let pod: Pod = serde_json::from_value(p).unwrap();
    let d = decide_pod("apps", &pod, &f, &deny);
    assert!(d.denial().unwrap().contains("gone:1: not found"));
    assert!(matches!(
        d,
        Decision::Denied {
            why: super::Untouched::LookupFailed,
            ..
        }
    ));
}

#[test]
fn an_answer_from_the_last_known_result_says_so_once_per_image() {
    let p = pod(&["old:1", "ok:1", "old:2", "old:1"], json!({}));
    let mut f = facts(&[("ok:1", Ok(&["linux/arm64"]))]);
    let mut last_known = (*platforms(&["linux/arm64"])).clone();
    last_known.stale = Some(Staleness {
        cause: "HTTP 503".into(),
        age: std::time::Duration::from_secs(300),
    });
    let last_known = Arc::new(last_known);
    f.insert("old:1".into(), Ok(last_known.clone()));
    f.insert("old:2".into(), Ok(last_known));
    let out = run(&p, &f, &policy());
    assert_eq!(out.decision.outcome(), super::Outcome::Decided);
    let stale: Vec<&String> = out
        .decision
        .warnings()
        .iter()
        .filter(|w| {
            w.contains("registry unavailable (HTTP 503); used the platforms it reported 5m0s ago")
        })
        .collect();
    assert_eq!(stale.len(), 2, "{:?}", out.decision.warnings());
    assert!(
        stale[0].starts_with("old:1: ") && stale[1].starts_with("old:2: "),
        "{stale:?}"
    );
    // Each image is described once in the annotation.
    assert_eq!(out.decision.summary().matches("old:1").count(), 1);
}

#[test]
fn required_affinity_is_anded_into_every_existing_term() {
    let p = pod(
        &["app:1"],
        json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]},
            ]
        }}}}}),
    );
    let out = run(
        &p,
        &facts(&[("app:1", Ok(&["linux/amd64", "linux/arm64"]))]),
        &policy(),
    );
    let terms = required_terms(&out.patched).as_array().unwrap();
    assert_eq!(terms.len(), 2, "no new OR'd term");
    let arch = json!({"key": ARCH_LABEL, "operator": "In", "values": ["amd64", "arm64"]});
    assert_eq!(
        terms[0]["matchExpressions"],
        json!([{"key": "pool", "operator": "In", "values": ["a"]}, arch])
    );
    assert_eq!(terms[1]["matchExpressions"], json!([arch]));
    assert_eq!(terms[1]["matchFields"][0]["values"], json!(["node-1"]));
}

#[test]
fn affinity_parents_added_where_missing() {
    let f = facts(&[("app:1", Ok(&["linux/amd64", "linux/arm64"]))]);
    let cases = [
        json!({"spec": {"affinity": {"podAntiAffinity": {}}}}),
        json!({"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}}}),
        json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}}}),
        // Found by fuzzing: mutating admission runs before validation, so a selector without
        // its required `nodeSelectorTerms` reaches us.
        json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}}}),
    ];
    for extra in cases {
        let out = run(&pod(&["app:1"], extra.clone()), &f, &policy());
        let terms = required_terms(&out.patched);
        assert_eq!(terms.as_array().unwrap().len(), 1, "{extra}");
        assert_eq!(
            terms[0]["matchExpressions"][0]["values"],
            json!(["amd64", "arm64"]),
            "{extra}"
        );
    }
}

#[test]
fn a_pods_own_arch_constraint_is_respected_with_a_warning_when_it_contradicts() {
    let f = facts(&[("app:1", Ok(&["linux/amd64", "linux/arm64"]))]);
    let pinned = json!({"spec": {"nodeSelector": {ARCH_LABEL: "s390x", "disk": "ssd"}}});
    let out = run(&pod(&["app:1"], pinned), &f, &policy());
    assert!(out.patched["spec"]["affinity"].is_null());
    assert_eq!(out.patched["spec"]["nodeSelector"][ARCH_LABEL], "s390x");
    assert!(
        out.decision.warnings()[0].contains("allows kubernetes.io/arch s390x"),
        "{:?}",
        out.decision.warnings()
    );
    // Tolerations are still added: they only permit, never force.
    assert_eq!(
        out.patched["spec"]["tolerations"],
        json!([arch_toleration("arm64")])
    );

    let fine = json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": ARCH_LABEL, "operator": "In", "values": ["arm64"]}]}]
    }}}}});
    let out = run(&pod(&["app:1"], fine), &f, &policy());
    assert!(
        out.decision.warnings().is_empty(),
        "{:?}",
        out.decision.warnings()
    );
    assert_eq!(
        required_terms(&out.patched)[0]["matchExpressions"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn node_selector_steering_pins_only_a_single_architecture() {
    let mut p = policy();
    p.steering = Steering::NodeSelector;
    let out = run(
        &pod(&["z:1"], json!({"spec": {"nodeSelector": {"disk": "ssd"}}})),
        &facts(&[("z:1", Ok(&["linux/s390x"]))]),
        &p,
    );
    assert_eq!(
        out.patched["spec"]["nodeSelector"],
        json!({"disk": "ssd", ARCH_LABEL: "s390x"})
    );
    assert!(out
        .ops
        .iter()
        .any(|op| op["path"] == "/spec/nodeSelector/kubernetes.io~1arch"));
    assert_eq!(
        out.patched["spec"]["tolerations"],
        json!([arch_toleration("s390x")])
    );

    let out = run(
        &pod(&["z:1"], json!({})),
        &facts(&[("z:1", Ok(&["linux/s390x"]))]),
        &p,
    );
    assert_eq!(
        out.patched["spec"]["nodeSelector"],
        json!({ARCH_LABEL: "s390x"})
    );

    let out = run(
        &pod(&["m:1"], json!({})),
        &facts(&[("m:1", Ok(&["linux/amd64", "linux/s390x"]))]),
        &p,
    );
    assert!(out.patched["spec"]["nodeSelector"].is_null());
    assert!(out.patched["spec"]["affinity"].is_null());
}

#[test]
fn steering_off_adds_only_tolerations() {
    let mut p = policy();
    p.steering = Steering::Off;
    let out = run(
        &pod(&["m:1"], json!({})),
        &facts(&[("m:1", Ok(&["linux/amd64", "linux/arm64"]))]),
        &p,
    );
    assert_eq!(
        out.patched["spec"]["tolerations"],
        json!([arch_toleration("arm64")])
    );
    assert!(out.patched["spec"]["affinity"].is_null());
}

/// The fewest operations for the API server to apply (issue 39): a Pod without affinity gets
/// its required and preferred terms in one `add`.
#[test]
fn a_pod_without_affinity_gets_required_and_preferred_terms_in_one_operation() {
    let mut p = policy();
    p.preferred_architectures = vec![WeightedArchitecture {
        architecture: "arm64".into(),
        weight: PREFERRED_WEIGHT,
    }];
    let f = facts(&[("m:1", Ok(&["linux/amd64", "linux/arm64"]))]);
    let out = run(&pod(&["m:1"], json!({})), &f, &p);
    let affinity_ops: Vec<_> = out
        .ops
        .iter()
        .filter(|op| op["path"].as_str().unwrap().starts_with("/spec/affinity"))
        .collect();
    assert_eq!(affinity_ops.len(), 1, "{affinity_ops:#?}");
    assert_eq!(affinity_ops[0]["path"], "/spec/affinity");
    let node_affinity = &out.patched["spec"]["affinity"]["nodeAffinity"];
    assert_eq!(required_terms(&out.patched).as_array().unwrap().len(), 1);
    assert_eq!(
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"]
            ["matchExpressions"][0]["values"],
        json!(["arm64"])
    );
}

#[test]
fn preferred_architecture_and_the_pods_override() {
    let f = facts(&[("m:1", Ok(&["linux/amd64", "linux/arm64"]))]);
    let mut p = policy();
    p.preferred_architectures = vec![WeightedArchitecture {
        architecture: "arm64".into(),
        weight: PREFERRED_WEIGHT,
    }];
    let out = run(&pod(&["m:1"], json!({})), &f, &p);
    let preferred = &out.patched["spec"]["affinity"]["nodeAffinity"]
        ["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(
        preferred,
        &json!([{"weight": PREFERRED_WEIGHT, "preference": {"matchExpressions": [
            {"key": ARCH_LABEL, "operator": "In", "values": ["arm64"]}]}}])
    );
    assert_eq!(required_terms(&out.patched).as_array().unwrap().len(), 1);

    // The Pod says no preference.
    let out = run(
        &pod(
            &["m:1"],
            json!({"metadata": {"labels": {PREFERRED_KEY: "none"}}}),
        ),
        &f,
        &p,
    );
    assert!(out.patched["spec"]["affinity"]["nodeAffinity"]
        ["preferredDuringSchedulingIgnoredDuringExecution"]
        .is_null());

    // The Pod prefers amd64 (annotation), with steering off and no config preference.
    let mut off = policy();
    off.steering = Steering::Off;
    let out = run(
        &pod(
            &["m:1"],
            json!({"metadata": {"annotations": {PREFERRED_KEY: "amd64"}}}),
        ),
        &f,
        &off,
    );
    let preferred = &out.patched["spec"]["affinity"]["nodeAffinity"]
        ["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(
        preferred[0]["preference"]["matchExpressions"][0]["values"],
        json!(["amd64"])
    );

    // A preference the images cannot honour is ignored with a warning.
    let out = run(
        &pod(
            &["m:1"],
            json!({"metadata": {"labels": {PREFERRED_KEY: "s390x"}}}),
        ),
        &f,
        &p,
    );
    assert!(out
        .decision
        .placement()
        .unwrap()
        .preferred_architectures
        .is_empty());
    assert!(out
        .decision
        .warnings()
        .iter()
        .any(|w| w.contains("s390x ignored")));

    // Existing preferred terms are appended to.
    let existing = json!({"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}}}});
    let out = run(&pod(&["m:1"], existing), &f, &p);
    let preferred = &out.patched["spec"]["affinity"]["nodeAffinity"]
        ["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(preferred.as_array().unwrap().len(), 2);
}

#[test]
fn the_pods_os_filters_platforms() {
    let f = facts(&[(
        "win:1",
        Ok(&["linux/amd64", "linux/arm64", "windows/amd64"]),
    )]);
    let windows = json!({"spec": {"nodeSelector": {OS_LABEL: "windows"}}});
    let out = run(&pod(&["win:1"], windows), &f, &policy());
    assert!(out.patched["spec"]["tolerations"].is_null());
    assert_eq!(
        required_terms(&out.patched)[0]["matchExpressions"][0]["values"],
        json!(["amd64"])
    );

    let spec_os = json!({"spec": {"os": {"name": "windows"}}});
    let out = run(&pod(&["win:1"], spec_os), &f, &policy());
    assert_eq!(
        required_terms(&out.patched)[0]["matchExpressions"][0]["values"],
        json!(["amd64"])
    );

    // A Windows-only image in a Linux Pod: nothing in common.
    let only = facts(&[("win:1", Ok(&["windows/amd64"]))]);
    let pod_value = pod(&["win:1"], json!({}));
    let pod: Pod = serde_json::from_value(pod_value).unwrap();
    let d = decide_pod("apps", &pod, &only, &policy());
    assert!(d.denial().unwrap().contains("no linux architecture"));
}

#[test]
fn opt_outs() {
    let f = facts(&[("m:1", Ok(&["linux/amd64", "linux/arm64"]))]);
    for extra in [
        json!({"metadata": {"labels": {SKIP_KEY: "true"}}}),
        json!({"metadata": {"annotations": {SKIP_KEY: "true"}}}),
    ] {
        let pod: Pod = serde_json::from_value(pod(&["m:1"], extra)).unwrap();
        let d = decide_pod("apps", &pod, &f, &policy());
        assert_eq!(d.outcome(), super::Outcome::Skipped);
        assert!(!d.changes_pod());
    }
    let pod: Pod = serde_json::from_value(pod(&["m:1"], json!({}))).unwrap();
    let d = decide_pod("kube-system", &pod, &f, &policy());
    assert_eq!(d.outcome(), super::Outcome::Skipped);
    let view = PodView::of_pod(&pod);
    let settled = |ns| PodCreate::new(ns, view.clone(), &policy()).unwrap();
    assert_eq!(settled("kube-system").settings.skip, Some(Level::Config));
    assert!(settled("kube-system").images_to_look_up().is_empty());
    assert_eq!(settled("apps").settings.skip, None);
    assert_eq!(settled("apps").images_to_look_up(), ["m:1"]);
}

#[test]
fn exists_template_and_toleration_seconds() {
    let mut p = policy();
    p.toleration = TolerationTemplate {
        key: "example.com/arch".into(),
        operator: TolerationOperator::Exists,
        value: None,
        effect: "NoExecute".into(),
        toleration_seconds: Some(60),
    };
    let out = run(
        &pod(&["m:1"], json!({})),
        &facts(&[("m:1", Ok(&["linux/arm64"]))]),
        &p,
    );
    assert_eq!(
        out.patched["spec"]["tolerations"],
        json!([{"key": "example.com/arch", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}])
    );
}

#[test]
fn images_of_names_containers_without_images() {
    let p: Pod = serde_json::from_value(
        json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b"}]}}),
    )
    .unwrap();
    assert_eq!(
        images_of(&PodView::of_pod(&p)).unwrap_err(),
        "container \"b\" has no image"
    );
    let p: Pod = serde_json::from_value(json!({"metadata": {}})).unwrap();
    assert!(images_of(&PodView::of_pod(&p)).is_err());
    let p: Pod =
        serde_json::from_value(json!({"spec": {"containers": [{"name": "a", "image": " "}]}}))
            .unwrap();
    assert!(images_of(&PodView::of_pod(&p)).is_err());
}

/// Node pools from a NodeList recorded from a real API server: amd-1 (untainted), arm-1
/// (`kubernetes.io/arch=arm64:NoSchedule`), s390-1 (`…=s390x:NoSchedule`), bare-1 (no arch
/// label; its kubelet says amd64). Every node also carries `node.kubernetes.io/not-ready`.
fn recorded_pools() -> NodePools {
    let list: k8s_openapi::List<k8s_openapi::api::core::v1::Node> = serde_json::from_str(
        include_str!("../../../tests/data/kube-api/node-list.body.json"),
    )
    .unwrap();
    NodePools::from_nodes(&list.items, &Policy::default().taint_keys())
}

#[test]
fn node_pools_from_recorded_nodes() {
    let pools = recorded_pools();
    assert_eq!(
        pools.architectures.keys().collect::<Vec<_>>(),
        ["amd64", "arm64", "s390x"]
    );
    assert!(
        pools.taints("amd64").is_empty(),
        "not-ready is not an arch taint"
    );
    assert_eq!(pools.taints("arm64").len(), 1);
    assert_eq!(pools.taints("arm64")[0].value.as_deref(), Some("arm64"));
    assert_eq!(pools.taints("s390x")[0].effect, "NoSchedule");
}

pub(super) fn run_with_pools(
    pod_json: &Value,
    facts: &ImageFacts,
    policy: &Policy,
    pools: &NodePools,
) -> (Decision, Value) {
    let Answer {
        decision, patch, ..
    } = answer(&request(pod_json, policy), facts, Some(pools), policy);
    let ops: Vec<Value> = patch
        .iter()
        .map(|op| serde_json::to_value(op).unwrap())
        .collect();
    let mut patched = pod_json.clone();
    json_patch::patch(
        &mut patched,
        &serde_json::from_value::<json_patch::Patch>(Value::Array(ops)).unwrap(),
    )
    .unwrap();
    let again = answer(&request(&patched, policy), facts, Some(pools), policy);
    assert!(again.patch.is_empty(), "reinvocation changed the Pod again");
    (decision, patched)
}

#[test]
fn tolerations_copy_the_taints_that_exist() {
    let pools = recorded_pools();
    let (_, patched) = run_with_pools(
        &pod(&["m:1"], json!({})),
        &facts(&[("m:1", Ok(&["linux/amd64", "linux/arm64"]))]),
        &policy(),
        &pools,
    );
    assert_eq!(
        patched["spec"]["tolerations"],
        json!([arch_toleration("arm64")])
    );
    // amd64 and arm64 of a cluster that also has s390x: still steered.
    assert_eq!(
        required_terms(&patched)[0]["matchExpressions"][0]["values"],
        json!(["amd64", "arm64"])
    );

    // A taint with another value or effect is copied as it is, beside the template.
    let mut custom = pools.clone();
    custom.architectures.insert(
        "arm64".into(),
        vec![k8s_openapi::api::core::v1::Taint {
            key: ARCH_LABEL.into(),
            value: Some("arm".into()),
            effect: "NoExecute".into(),
            time_added: None,
        }],
    );
    let mut p = policy();
    p.toleration.effect = "NoExecute".into();
    p.toleration.toleration_seconds = Some(30);
    let (decision, patched) = run_with_pools(
        &pod(&["m:1"], json!({})),
        &facts(&[("m:1", Ok(&["linux/arm64"]))]),
        &p,
        &custom,
    );
    assert_eq!(
        patched["spec"]["tolerations"],
        json!([
            {"key": ARCH_LABEL, "operator": "Equal", "value": "arm64", "effect": "NoExecute", "tolerationSeconds": 30},
            {"key": ARCH_LABEL, "operator": "Equal", "value": "arm", "effect": "NoExecute", "tolerationSeconds": 30},
        ])
    );
    assert!(
        decision.summary().contains(
            "tolerates arm64 (templates: kubernetes.io/arch=arm64:NoExecute; taints seen on nodes: kubernetes.io/arch=arm:NoExecute)"
        ),
        "{}",
        decision.summary()
    );

    // A supported architecture with no nodes in the cluster (a pool scaled to zero): its
    // template all the same, so the autoscaler can grow the pool for this Pod.
    let mut no_s390x = pools.clone();
    no_s390x.architectures.remove("s390x");
    let (decision, patched) = run_with_pools(
        &pod(&["z:1"], json!({})),
        &facts(&[("z:1", Ok(&["linux/s390x"]))]),
        &policy(),
        &no_s390x,
    );
    assert_eq!(
        patched["spec"]["tolerations"],
        json!([arch_toleration("s390x")])
    );
    assert_eq!(decision.placement().unwrap().node_selector, None);
    assert_eq!(
        required_terms(&patched)[0]["matchExpressions"][0]["values"],
        json!(["s390x"])
    );
}

#[test]
fn images_that_run_everywhere_in_the_cluster_are_not_steered() {
    let pools = recorded_pools();
    let f = facts(&[(
        "all:1",
        Ok(&["linux/amd64", "linux/arm64", "linux/s390x", "linux/ppc64le"]),
    )]);
    let (decision, patched) = run_with_pools(&pod(&["all:1"], json!({})), &f, &policy(), &pools);
    assert_eq!(
        patched["spec"]["tolerations"],
        json!([arch_toleration("arm64"), arch_toleration("s390x")])
    );
    assert!(patched["spec"]["affinity"].is_null());
    assert!(
        decision
            .summary()
            .contains("no steering: the images run on every architecture"),
        "{}",
        decision.summary()
    );
}

// Clusters that move: the answer does not depend on which nodes happen to exist.

/// A taint as `(key, value, effect)`.
pub(super) type TaintParts<'a> = (&'a str, &'a str, &'a str);

/// Pools of nodes given as `(name, architecture, taints)`.
pub(super) fn node_pools(nodes: &[(&str, &str, &[TaintParts])]) -> NodePools {
    let list: Vec<k8s_openapi::api::core::v1::Node> = nodes
        .iter()
        .map(|(name, arch, taints)| {
            let taints: Vec<Value> = taints
                .iter()
                .map(|(k, v, e)| json!({"key": k, "value": v, "effect": e}))
                .collect();
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {ARCH_LABEL: arch}},
                "spec": {"taints": taints},
            }))
            .unwrap()
        })
        .collect();
    NodePools::from_nodes(&list, &policy().taint_keys())
}

fn arch_s390x_arm64_amd64() -> ImageFacts {
    facts(&[(
        "m:1",
        Ok(&["linux/amd64", "linux/arm64", "linux/s390x", "linux/ppc64le"]),
    )])
}

#[test]
fn templates_do_not_depend_on_the_nodes_that_exist() {
    let f = facts(&[("m:1", Ok(&["linux/amd64", "linux/arm64", "linux/s390x"]))]);
    let p = pod(&["m:1"], json!({}));
    let without_watch = run(&p, &f, &policy());
    let want = json!([arch_toleration("arm64"), arch_toleration("s390x")]);
    assert_eq!(without_watch.patched["spec"]["tolerations"], want);
    for (what, pools) in [
        ("no nodes at all", NodePools::default()),
        ("amd64 nodes only", node_pools(&[("amd-1", "amd64", &[])])),
        (
            "arm64 nodes only, tainted as the template says",
            node_pools(&[("arm-1", "arm64", &[(ARCH_LABEL, "arm64", "NoSchedule")])]),
        ),
        (
            "arm64 nodes untainted",
            node_pools(&[("arm-1", "arm64", &[]), ("amd-1", "amd64", &[])]),
        ),
        ("the recorded cluster", recorded_pools()),
    ] {
        let (decision, patched) = run_with_pools(&p, &f, &policy(), &pools);
        assert_eq!(patched["spec"]["tolerations"], want, "{what}");
        // `review` (no node watch) and `serve` agree when the nodes add no other taint.
        assert_eq!(
            decision.placement().unwrap().tolerations,
            without_watch.decision.placement().unwrap().tolerations,
            "{what}"
        );
        assert_eq!(patched, without_watch.patched, "{what}");
    }
}

#[test]
fn a_taint_seen_with_another_value_or_effect_is_tolerated_too() {
    let pools = node_pools(&[
        ("arm-1", "arm64", &[(ARCH_LABEL, "arm64", "NoSchedule")]),
        ("arm-2", "arm64", &[(ARCH_LABEL, "arm64", "NoExecute")]),
        ("s390-1", "s390x", &[(ARCH_LABEL, "ibm", "NoSchedule")]),
        // Not an architecture taint: never copied.
        ("arm-3", "arm64", &[("dedicated", "gpu", "NoSchedule")]),
    ]);
    let (decision, patched) = run_with_pools(
        &pod(&["m:1"], json!({})),
        &arch_s390x_arm64_amd64(),
        &policy(),
        &pools,
    );
    assert_eq!(
        patched["spec"]["tolerations"],
        json!([
            arch_toleration("arm64"),
            {"key": ARCH_LABEL, "operator": "Equal", "value": "arm64", "effect": "NoExecute"},
            arch_toleration("s390x"),
            {"key": ARCH_LABEL, "operator": "Equal", "value": "ibm", "effect": "NoSchedule"},
        ])
    );
    let note = &decision.summary();
    assert!(
        note.contains("(templates: kubernetes.io/arch=arm64:NoSchedule, kubernetes.io/arch=s390x:NoSchedule; taints seen on nodes: kubernetes.io/arch=arm64:NoExecute, kubernetes.io/arch=ibm:NoSchedule)"),
        "{note}"
    );
}

#[test]
fn an_architecture_that_is_not_supported_gets_no_toleration_whatever_nodes_exist() {
    // ppc64le nodes exist and are tainted, but ppc64le is not in supported_architectures.
    let pools = node_pools(&[
        ("amd-1", "amd64", &[]),
        ("ppc-1", "ppc64le", &[(ARCH_LABEL, "ppc64le", "NoSchedule")]),
    ]);
    let f = facts(&[("m:1", Ok(&["linux/amd64", "linux/ppc64le"]))]);
    let (decision, patched) = run_with_pools(&pod(&["m:1"], json!({})), &f, &policy(), &pools);
    assert!(
        decision.placement().unwrap().tolerations.is_empty(),
        "{:?}",
        decision.placement().unwrap().tolerations
    );
    assert!(patched["spec"]["tolerations"].is_null());
    assert!(decision.summary().contains("tolerates no tainted pool"));
}

#[test]
fn per_architecture_templates_replace_the_default_one() {
    let mut p = policy();
    // An EKS Auto Mode style taint and GKE's, both on arm64; s390x keeps the default.
    p.architecture_tolerations.insert(
        "arm64".into(),
        vec![
            TolerationTemplate {
                key: "arm64".into(),
                operator: TolerationOperator::Equal,
                value: Some("true".into()),
                effect: "NoSchedule".into(),
                toleration_seconds: None,
            },
            TolerationTemplate {
                key: ARCH_LABEL.into(),
                operator: TolerationOperator::Equal,
                value: None,
                effect: "NoSchedule".into(),
                toleration_seconds: None,
            },
        ],
    );
    let out = run(&pod(&["m:1"], json!({})), &arch_s390x_arm64_amd64(), &p);
    assert_eq!(
        out.patched["spec"]["tolerations"],
        json!([
            {"key": "arm64", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
            arch_toleration("arm64"),
            arch_toleration("s390x"),
        ])
    );
    // The node watch reads the templates' keys: an `arm64=false` taint on an arm64 node is
    // copied, one under an unrelated key is not; a taint a template already covers adds nothing.
    let list: Vec<k8s_openapi::api::core::v1::Node> = serde_json::from_value(json!([
        {"metadata": {"name": "a1", "labels": {ARCH_LABEL: "arm64"}},
         "spec": {"taints": [{"key": "arm64", "value": "true", "effect": "NoSchedule"},
                             {"key": "arm64", "value": "false", "effect": "NoSchedule"},
                             {"key": "team", "value": "x", "effect": "NoSchedule"}]}},
    ]))
    .unwrap();
    let pools = NodePools::from_nodes(&list, &p.taint_keys());
    assert_eq!(pools.taints("arm64").len(), 2, "{pools:?}");
    let (_, patched) = run_with_pools(
        &pod(&["m:1"], json!({})),
        &arch_s390x_arm64_amd64(),
        &p,
        &pools,
    );
    assert_eq!(
        patched["spec"]["tolerations"],
        json!([
            {"key": "arm64", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
            arch_toleration("arm64"),
            {"key": "arm64", "operator": "Equal", "value": "false", "effect": "NoSchedule"},
            arch_toleration("s390x"),
        ])
    );
}

#[test]
fn steering_counts_the_architectures_that_may_appear() {
    // An amd64-only image in an amd64-only moment: still pinned to amd64, since arm64 and s390x
    // pools may scale up from zero.
    let amd_only = node_pools(&[("amd-1", "amd64", &[])]);
    let (_, patched) = run_with_pools(
        &pod(&["a:1"], json!({})),
        &facts(&[("a:1", Ok(&["linux/amd64"]))]),
        &policy(),
        &amd_only,
    );
    assert_eq!(
        required_terms(&patched)[0]["matchExpressions"][0]["values"],
        json!(["amd64"])
    );
    // Images for every default and supported architecture need no steering, with or without
    // the node watch…
    let f = facts(&[("m:1", Ok(&["linux/amd64", "linux/arm64", "linux/s390x"]))]);
    let out = run(&pod(&["m:1"], json!({})), &f, &policy());
    assert!(out.patched["spec"]["affinity"].is_null());
    assert!(
        out.decision.summary().contains("may add"),
        "{}",
        out.decision.summary()
    );
    // …unless the watch sees nodes of yet another architecture.
    let with_ppc = node_pools(&[("ppc-1", "ppc64le", &[])]);
    let (_, patched) = run_with_pools(&pod(&["m:1"], json!({})), &f, &policy(), &with_ppc);
    assert_eq!(
        required_terms(&patched)[0]["matchExpressions"][0]["values"],
        json!(["amd64", "arm64", "s390x"])
    );
}

fn daemon_set_pod(image: &str, node: &str) -> Value {
    pod(
        &[image],
        json!({
            "metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                "name": "agent", "uid": "u", "controller": true, "blockOwnerDeletion": true}]},
            "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}},
        }),
    )
}

#[test]
fn daemon_set_and_bound_pods_get_tolerations_only() {
    let pools = recorded_pools();
    let mut p = policy();
    p.preferred_architectures = vec![WeightedArchitecture {
        architecture: "arm64".into(),
        weight: 80,
    }];
    let f = facts(&[("m:1", Ok(&["linux/amd64", "linux/arm64"]))]);
    let ds = daemon_set_pod("m:1", "arm-1");
    let (decision, patched) = run_with_pools(&ds, &f, &p, &pools);
    assert_eq!(
        patched["spec"]["tolerations"],
        json!([arch_toleration("arm64")])
    );
    // The DaemonSet's own term is untouched: nothing ANDed in, no preference.
    assert_eq!(
        patched["spec"]["affinity"],
        daemon_set_pod("m:1", "arm-1")["spec"]["affinity"]
    );
    assert!(decision.warnings().is_empty(), "{:?}", decision.warnings());
    assert!(
        decision
            .summary()
            .contains("no steering: owned by DaemonSet agent"),
        "{}",
        decision.summary()
    );

    // Headed for an s390x node its images cannot run on: said, and still not steered.
    let ds = daemon_set_pod("m:1", "s390-1");
    let (decision, patched) = run_with_pools(&ds, &f, &p, &pools);
    let warning = "the Pod is headed for node s390-1 (s390x) but its images support only amd64,arm64 on linux";
    assert_eq!(decision.warnings(), [warning]);
    assert!(
        decision.summary().contains(warning),
        "{}",
        decision.summary()
    );
    assert_eq!(patched["spec"]["affinity"], ds["spec"]["affinity"]);

    // Without the node watch the node's architecture is unknown: no warning.
    let out = run(&ds, &f, &p);
    assert!(out.decision.warnings().is_empty());

    // A Pod already bound to a node.
    let bound = pod(&["m:1"], json!({"spec": {"nodeName": "s390-1"}}));
    let (decision, patched) = run_with_pools(&bound, &f, &p, &pools);
    assert!(patched["spec"]["affinity"].is_null());
    assert_eq!(decision.warnings().len(), 1, "{:?}", decision.warnings());
    assert!(decision.summary().contains("bound to node s390-1"));
}

fn artifact() -> Arc<ImageFact> {
    Arc::new(ImageFact {
        platforms: Vec::new(),
        artifact: Some("application/vnd.cncf.helm.config.v1+json".into()),
        ..(*platforms(&["linux/amd64"])).clone()
    })
}

#[test]
fn image_volumes_count_unless_they_are_platform_less_artifacts() {
    let with_volume = |reference: &str| {
        pod(
            &["m:1"],
            json!({"spec": {"volumes": [
                {"name": "cfg", "configMap": {"name": "c"}},
                {"name": "data", "image": {"reference": reference, "pullPolicy": "IfNotPresent"}},
            ]}}),
        )
    };
    let mut f = facts(&[
        ("m:1", Ok(&["linux/amd64", "linux/arm64"])),
        ("tool:1", Ok(&["linux/amd64"])),
    ]);
    // A single-architecture image in a volume narrows the set.
    let out = run(&with_volume("tool:1"), &f, &policy());
    assert!(out.patched["spec"]["tolerations"].is_null());
    assert_eq!(
        required_terms(&out.patched)[0]["matchExpressions"][0]["values"],
        json!(["amd64"])
    );
    assert!(out.decision.summary().contains("tool:1 (linux/amd64)"));

    // A Helm chart (or model weights) names no platform: it runs anywhere.
    f.insert("chart:1".into(), Ok(artifact()));
    let out = run(&with_volume("chart:1"), &f, &policy());
    assert_eq!(
        out.patched["spec"]["tolerations"],
        json!([arch_toleration("arm64")])
    );
    assert!(
        out.decision
            .summary()
            .contains("chart:1 (artifact application/vnd.cncf.helm.config.v1+json: any platform)"),
        "{}",
        out.decision.summary()
    );

    // An image volume without a reference is named.
    let p: Pod = serde_json::from_value(with_volume("")).unwrap();
    assert!(images_of(&PodView::of_pod(&p))
        .unwrap_err()
        .contains("volume data"));

    // Only artifacts (a WASM app, say): they run wherever the Pod lands, so every supported
    // pool is tolerated and nothing steers.
    let only = run(&pod(&["chart:1"], json!({})), &f, &policy());
    assert_eq!(
        only.patched["spec"]["tolerations"],
        json!([arch_toleration("arm64"), arch_toleration("s390x")])
    );
    assert!(only.patched["spec"]["affinity"].is_null());
    assert!(
        only.decision.summary().contains("may add"),
        "{}",
        only.decision.summary()
    );
}

#[test]
fn weighted_preferences() {
    let mut p = policy();
    p.preferred_architectures = vec![
        WeightedArchitecture {
            architecture: "arm64".into(),
            weight: 80,
        },
        WeightedArchitecture {
            architecture: "amd64".into(),
            weight: 20,
        },
        // Not among the images' architectures: left out.
        WeightedArchitecture {
            architecture: "ppc64le".into(),
            weight: 5,
        },
    ];
    let f = facts(&[("m:1", Ok(&["linux/amd64", "linux/arm64"]))]);
    let out = run(&pod(&["m:1"], json!({})), &f, &p);
    let term = |arch: &str, weight: i32| {
        json!({"weight": weight, "preference": {"matchExpressions": [
            {"key": ARCH_LABEL, "operator": "In", "values": [arch]}]}})
    };
    assert_eq!(
        out.patched["spec"]["affinity"]["nodeAffinity"]
            ["preferredDuringSchedulingIgnoredDuringExecution"],
        json!([term("arm64", 80), term("amd64", 20)])
    );
    assert!(out
        .decision
        .summary()
        .contains("prefers arm64 (weight 80), amd64 (weight 20)"));
    // Appended to the Pod's own preferred terms.
    let existing = json!({"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}}}});
    let out = run(&pod(&["m:1"], existing), &f, &p);
    assert_eq!(
        out.patched["spec"]["affinity"]["nodeAffinity"]
            ["preferredDuringSchedulingIgnoredDuringExecution"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    // The Pod's label still overrides: one term of weight 50.
    let out = run(
        &pod(
            &["m:1"],
            json!({"metadata": {"labels": {PREFERRED_KEY: "amd64"}}}),
        ),
        &f,
        &p,
    );
    assert_eq!(
        out.patched["spec"]["affinity"]["nodeAffinity"]
            ["preferredDuringSchedulingIgnoredDuringExecution"],
        json!([term("amd64", PREFERRED_WEIGHT)])
    );
}

#[test]
fn distinct_images_keep_first_order_and_limits_apply() {
    let many: Vec<String> = (0..40_000).map(|i| format!("img{}:1", i % 7)).collect();
    let images: Vec<ContainerImage> = many
        .iter()
        .enumerate()
        .map(|(i, image)| ContainerImage {
            container: format!("c{i}"),
            image: image.clone(),
        })
        .collect();
    let distinct = distinct_images(&images);
    assert_eq!(
        distinct,
        (0..7).map(|i| format!("img{i}:1")).collect::<Vec<_>>()
    );
    // A few images (compared, not hashed) likewise.
    let few: Vec<ContainerImage> = ["b:1", "a:1", "b:1", "c:1", "a:1"]
        .iter()
        .map(|image| ContainerImage {
            container: "c".into(),
            image: (*image).into(),
        })
        .collect();
    assert_eq!(distinct_images(&few), ["b:1", "a:1", "c:1"]);
    let mut p = policy();
    let reason = over_limits(&images, &distinct, &p).unwrap();
    assert!(reason.contains("40000 containers"), "{reason}");
    p.max_containers_per_pod = 50_000;
    assert!(over_limits(&images, &distinct, &p).is_none());
    p.max_images_per_pod = 5;
    let reason = over_limits(&images, &distinct, &p).unwrap();
    assert!(reason.contains("7 distinct images"), "{reason}");

    // Decided without lookups: unchanged with a warning, or denied.
    let pod: Pod = serde_json::from_value(pod(&["a:1", "b:1"], json!({}))).unwrap();
    p.max_images_per_pod = 1;
    let request = PodCreate::new("apps", PodView::of_pod(&pod), &p).unwrap();
    assert!(
        request.images_to_look_up().is_empty(),
        "nothing is looked up"
    );
    let d = decide(&request, &ImageFacts::new(), None, &p);
    assert_eq!(d.outcome(), super::Outcome::LookupFailed);
    assert!(d.warnings()[0].contains("max_images_per_pod (1)"));
    p.on_lookup_failure = OnLookupFailure::Deny;
    let d = decide_pod("apps", &pod, &ImageFacts::new(), &p);
    assert!(d.denial().unwrap().contains("did not look the images up"));
}

/// `enforce = false`: the Pod gets the annotation saying what tolerable would have done, and
/// nothing else; a Pod that would be denied is let through; reinvocation changes nothing.
#[test]
fn report_only_writes_the_would_be_decision_into_the_annotation_alone() {
    let report_only = Policy {
        enforce: false,
        ..policy()
    };
    let policy = &report_only;
    let multi = pod(&["app:1"], json!({}));
    let f = facts(&[("app:1", Ok(&["linux/amd64", "linux/arm64"]))]);
    let out = run(&multi, &f, policy);
    assert_eq!(out.ops.len(), 1, "{:#?}", out.ops);
    assert_eq!(out.ops[0]["path"], "/metadata/annotations");
    let note = out.patched["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(
        note.starts_with("report only (enforce = false): would add toleration kubernetes.io/arch=arm64:NoSchedule; requires kubernetes.io/arch in (amd64,arm64); linux architectures amd64,arm64"),
        "{note}"
    );
    assert!(out.patched["spec"].get("tolerations").is_none());
    assert!(out.patched["spec"].get("affinity").is_none());
    let answered = answer(&request(&multi, policy), &f, None, policy);
    assert_eq!(answered.outcome(), super::Outcome::Decided);
    assert_eq!(answered.not_enforced(), Some(false));

    let mixed = pod(&["x86:1", "z:1"], json!({}));
    let f = facts(&[
        ("x86:1", Ok(&["linux/amd64"])),
        ("z:1", Ok(&["linux/s390x"])),
    ]);
    let answered = answer(&request(&mixed, policy), &f, None, policy);
    assert_eq!(
        answered.outcome(),
        super::Outcome::Denied,
        "what was decided"
    );
    assert_eq!(answered.denial(), None, "but not carried out");
    assert_eq!(answered.not_enforced(), Some(true));
    let out = run(&mixed, &f, policy);
    let note = out.patched["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(
        note.starts_with("report only (enforce = false): would deny: "),
        "{note}"
    );

    // An amd64-only Pod would be steered to amd64; a lookup failure reports nothing.
    let amd = pod(&["x86:1"], json!({}));
    let answered = answer(&request(&amd, policy), &f, None, policy);
    assert_eq!(answered.not_enforced(), Some(false));
    let failed = facts(&[("x86:1", Err("gone"))]);
    assert_eq!(
        answer(&request(&amd, policy), &failed, None, policy).not_enforced(),
        None
    );
    assert!(answer(&request(&amd, policy), &failed, None, policy)
        .patch
        .is_empty());
    // Enforced, the same Pod gets its tolerations.
    let enforced = super::Policy {
        enforce: true,
        ..report_only.clone()
    };
    let answered = answer(
        &request(&multi, &enforced),
        &facts(&[("app:1", Ok(&["linux/amd64", "linux/arm64"]))]),
        None,
        &enforced,
    );
    assert_eq!(answered.not_enforced(), None);
    assert!(answered.patch.len() > 1);
}

// match_node_labels.

fn matching_policy(steering: Steering) -> Policy {
    Policy {
        match_node_labels: vec!["team".into(), "topology.kubernetes.io/region".into()],
        steering,
        ..policy()
    }
}

fn labelled(extra: Value) -> Value {
    let mut p = pod(
        &["app:1"],
        json!({"metadata": {"labels": {"team": "ml", "app": "x"}}}),
    );
    merge(&mut p, extra);
    p
}

fn in_(key: &str, values: &[&str]) -> Value {
    json!({"key": key, "operator": "In", "values": values})
}

fn amd64_arm64() -> ImageFacts {
    facts(&[("app:1", Ok(&["linux/amd64", "linux/arm64"]))])
}

fn annotation(patched: &Value) -> &str {
    patched["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap()
}

#[test]
fn node_labels_go_into_the_one_new_term_beside_the_architecture() {
    let p = matching_policy(Steering::NodeAffinity);
    let out = run(&labelled(json!({})), &amd64_arm64(), &p);
    assert_eq!(
        required_terms(&out.patched),
        &json!([{"matchExpressions": [in_(ARCH_LABEL, &["amd64", "arm64"]), in_("team", &["ml"])]}])
    );
    assert!(out.decision.warnings().is_empty());
    let note = annotation(&out.patched);
    assert!(
        note.contains("; nodes labelled like the Pod: team=ml; images:"),
        "{note}"
    );
    // Both label keys listed and carried: both required, in the order written.
    let both =
        labelled(json!({"metadata": {"labels": {"topology.kubernetes.io/region": "eu-west-3"}}}));
    let out = run(&both, &amd64_arm64(), &p);
    assert_eq!(
        required_terms(&out.patched)[0]["matchExpressions"],
        json!([
            in_(ARCH_LABEL, &["amd64", "arm64"]),
            in_("team", &["ml"]),
            in_("topology.kubernetes.io/region", &["eu-west-3"])
        ])
    );
    // Without steering (images run everywhere, or steering off) the label is still required.
    let everywhere = facts(&[("app:1", Ok(&["linux/amd64", "linux/arm64", "linux/s390x"]))]);
    for (policy, f) in [
        (p.clone(), &everywhere),
        (matching_policy(Steering::Off), &amd64_arm64()),
    ] {
        let out = run(&labelled(json!({})), f, &policy);
        assert_eq!(
            required_terms(&out.patched),
            &json!([{"matchExpressions": [in_("team", &["ml"])]}])
        );
    }
}

#[test]
fn node_labels_are_anded_into_one_term_and_into_both_ored_terms() {
    let p = matching_policy(Steering::NodeAffinity);
    let required = |terms: Value| {
        json!({"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}})
    };
    let one = labelled(required(
        json!([{"matchExpressions": [in_("disk", &["ssd"])]}]),
    ));
    let out = run(&one, &amd64_arm64(), &p);
    assert_eq!(
        required_terms(&out.patched),
        &json!([{"matchExpressions": [
            in_("disk", &["ssd"]), in_(ARCH_LABEL, &["amd64", "arm64"]), in_("team", &["ml"])]}])
    );
    // Two ORed terms, one with only matchFields: both get the expression (a new term beside
    // them would let the Pod onto any node of the other terms).
    let two = labelled(required(json!([
        {"matchExpressions": [in_("disk", &["ssd"])]},
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]},
    ])));
    let out = run(&two, &amd64_arm64(), &p);
    let terms = required_terms(&out.patched).as_array().unwrap();
    assert_eq!(terms.len(), 2);
    for term in terms {
        let expressions = term["matchExpressions"].as_array().unwrap();
        assert!(expressions.contains(&in_("team", &["ml"])), "{term}");
        assert!(
            expressions.contains(&in_(ARCH_LABEL, &["amd64", "arm64"])),
            "{term}"
        );
    }
    assert_eq!(terms[1]["matchFields"][0]["key"], "metadata.name");
}

#[test]
fn a_pods_own_constraint_on_the_key_is_kept_with_a_warning_when_it_contradicts() {
    let p = matching_policy(Steering::NodeAffinity);
    let terms = |expression: Value| {
        json!({"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [expression]},
                {"matchExpressions": [in_("disk", &["ssd"])]}]}}}}})
    };
    // A contradicting term is kept as it is; the other term still gets the expression.
    let contradicting = labelled(terms(in_("team", &["web"])));
    let out = run(&contradicting, &amd64_arm64(), &p);
    let got = required_terms(&out.patched);
    assert_eq!(got[0]["matchExpressions"][0], in_("team", &["web"]));
    assert!(!got[0]["matchExpressions"]
        .as_array()
        .unwrap()
        .contains(&in_("team", &["ml"])));
    assert!(got[1]["matchExpressions"]
        .as_array()
        .unwrap()
        .contains(&in_("team", &["ml"])));
    let warnings = out.decision.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("team=ml") && warnings[0].contains("team In (web)"),
        "{warnings:?}"
    );
    assert!(annotation(&out.patched).contains("team=ml (kept the Pod's own team constraint)"));
    // A nodeSelector with another value: kept, never overwritten, nothing added to the affinity.
    let selector = labelled(json!({"spec": {"nodeSelector": {"team": "web"}}}));
    let out = run(&selector, &amd64_arm64(), &p);
    assert_eq!(out.patched["spec"]["nodeSelector"], json!({"team": "web"}));
    assert_eq!(
        required_terms(&out.patched),
        &json!([{"matchExpressions": [in_(ARCH_LABEL, &["amd64", "arm64"])]}])
    );
    assert!(out.decision.warnings()[0].contains("nodeSelector team=web"));
    // Constraints that admit the label's value: kept, no warning, nothing added to that term.
    for own in [
        in_("team", &["ml"]),
        in_("team", &["ml", "web"]),
        json!({"key": "team", "operator": "Exists"}),
        json!({"key": "team", "operator": "NotIn", "values": ["web"]}),
    ] {
        let out = run(&labelled(terms(own.clone())), &amd64_arm64(), &p);
        assert!(out.decision.warnings().is_empty(), "{own}");
        let first = required_terms(&out.patched)[0]["matchExpressions"].clone();
        assert_eq!(first, json!([own, in_(ARCH_LABEL, &["amd64", "arm64"])]));
    }
    // An equal nodeSelector entry: no change at all for the label.
    let equal = labelled(json!({"spec": {"nodeSelector": {"team": "ml"}}}));
    let out = run(&equal, &amd64_arm64(), &p);
    assert!(out.decision.warnings().is_empty());
    assert!(!out.ops.iter().any(|op| op.to_string().contains("\"team\"")));
}

#[test]
fn node_selector_steering_sets_the_label_in_the_node_selector() {
    let p = matching_policy(Steering::NodeSelector);
    let arm_only = facts(&[("app:1", Ok(&["linux/arm64"]))]);
    let out = run(&labelled(json!({})), &arm_only, &p);
    assert_eq!(
        out.patched["spec"]["nodeSelector"],
        json!({ARCH_LABEL: "arm64", "team": "ml"})
    );
    assert!(out.patched["spec"]["affinity"].is_null());
    // Beside an existing nodeSelector (escaped key), and when the architecture is not pinned.
    let regional = labelled(
        json!({"metadata": {"labels": {"topology.kubernetes.io/region": "eu"}},
        "spec": {"nodeSelector": {"disk": "ssd"}}}),
    );
    let out = run(&regional, &amd64_arm64(), &p);
    assert_eq!(
        out.patched["spec"]["nodeSelector"],
        json!({"disk": "ssd", "team": "ml", "topology.kubernetes.io/region": "eu"})
    );
    assert!(out
        .ops
        .iter()
        .any(|op| op["path"] == "/spec/nodeSelector/topology.kubernetes.io~1region"));
    // A required term that constrains the key keeps it; the nodeSelector is not added.
    let own_term = labelled(json!({"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [in_("team", &["web"])]}]}}}}}));
    let out = run(&own_term, &arm_only, &p);
    assert_eq!(
        out.patched["spec"]["nodeSelector"],
        json!({ARCH_LABEL: "arm64"})
    );
    assert_eq!(out.decision.warnings().len(), 1);
}

#[test]
fn node_labels_leave_daemon_set_bound_and_unlabelled_pods_alone() {
    let p = matching_policy(Steering::NodeAffinity);
    let mut ds = daemon_set_pod("app:1", "arm-1");
    merge(&mut ds, json!({"metadata": {"labels": {"team": "ml"}}}));
    let out = run(&ds, &amd64_arm64(), &p);
    assert_eq!(
        out.patched["spec"]["affinity"],
        daemon_set_pod("app:1", "arm-1")["spec"]["affinity"]
    );
    assert!(!annotation(&out.patched).contains("labelled like the Pod"));
    let bound = labelled(json!({"spec": {"nodeName": "arm-1"}}));
    let out = run(&bound, &amd64_arm64(), &p);
    assert!(out.patched["spec"]["affinity"].is_null());
    assert!(out.patched["spec"]["nodeSelector"].is_null());
    // Not labelled with a listed key (only `app`), or no key listed: the label is not required.
    let unlabelled = pod(&["app:1"], json!({"metadata": {"labels": {"app": "x"}}}));
    for (pod_json, policy) in [(&unlabelled, &p), (&labelled(json!({})), &policy())] {
        let out = run(pod_json, &amd64_arm64(), policy);
        assert_eq!(
            required_terms(&out.patched),
            &json!([{"matchExpressions": [in_(ARCH_LABEL, &["amd64", "arm64"])]}])
        );
        assert!(!annotation(&out.patched).contains("labelled like the Pod"));
    }
}

#[test]
fn node_labels_are_reported_under_enforce_false() {
    let p = Policy {
        enforce: false,
        ..matching_policy(Steering::NodeAffinity)
    };
    let out = run(&labelled(json!({})), &amd64_arm64(), &p);
    assert!(out.patched["spec"]["affinity"].is_null());
    let note = annotation(&out.patched);
    assert!(note.contains("requires team in (ml)"), "{note}");
}

/// The Pod being created in `apps`, whose Namespace says `namespace`.
fn request_in(pod_json: &Value, namespace: &NamespacePolicy, policy: &Policy) -> PodCreate {
    let pod: Pod = serde_json::from_value(pod_json.clone()).expect("a Pod");
    let namespace = Some(Arc::new(namespace.clone()));
    PodCreate::in_namespace("apps", namespace, PodView::of_pod(&pod), policy).unwrap()
}

/// A Namespace's policy read from its labels and annotations.
fn namespace(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> NamespacePolicy {
    let map = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    NamespacePolicy::from_metadata(Some(&map(labels)), Some(&map(annotations)))
}

/// Answers, applies the patch and checks reinvocation changes nothing, in a Namespace.
fn run_in(
    pod_json: &Value,
    ns: &NamespacePolicy,
    f: &ImageFacts,
    policy: &Policy,
) -> (Answer, Value) {
    let answered = answer(&request_in(pod_json, ns, policy), f, None, policy);
    let ops = Value::Array(
        answered
            .patch
            .iter()
            .map(|op| serde_json::to_value(op).unwrap())
            .collect(),
    );
    let mut patched = pod_json.clone();
    let ops: json_patch::Patch = serde_json::from_value(ops).unwrap();
    json_patch::patch(&mut patched, &ops).unwrap();
    let again = answer(&request_in(&patched, ns, policy), f, None, policy);
    assert!(again.patch.is_empty(), "reinvocation: {:#?}", again.patch);
    (answered, patched)
}

fn annotation_of(patched: &Value) -> &str {
    patched["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap_or_default()
}

#[test]
fn enforce_pod_over_namespace_over_config_and_the_annotation_names_the_level() {
    let multi = pod(&["app:1"], json!({}));
    let f = facts(&[("app:1", Ok(&["linux/amd64", "linux/arm64"]))]);
    let enforcing = policy();
    let reporting = Policy {
        enforce: false,
        ..policy()
    };
    let ns_false = namespace(&[(ENFORCE_KEY, "false")], &[]);
    let ns_true = namespace(&[(ENFORCE_KEY, "true")], &[]);
    let pod_true = pod(
        &["app:1"],
        json!({"metadata": {"labels": {ENFORCE_KEY: "true"}}}),
    );
    let pod_false = pod(
        &["app:1"],
        json!({"metadata": {"annotations": {ENFORCE_KEY: "false"}}}),
    );
    // (pod, namespace, config, enforced, what the annotation starts with or contains)
    let cases: [(&Value, &NamespacePolicy, &Policy, bool, &str); 6] = [
        (&multi, &NamespacePolicy::default(), &enforcing, true, "linux architectures"),
        (&multi, &NamespacePolicy::default(), &reporting, false, "report only (enforce = false): would add"),
        (&multi, &ns_false, &enforcing, false, "report only (namespace apps's tolerable.io/enforce): would add toleration kubernetes.io/arch=arm64:NoSchedule"),
        (&multi, &ns_true, &reporting, true, "; namespace apps's tolerable.io/enforce"),
        (&pod_true, &ns_false, &reporting, true, "; the Pod's tolerable.io/enforce"),
        (&pod_false, &ns_true, &enforcing, false, "report only (the Pod's tolerable.io/enforce): would add"),
    ];
    for (i, (pod_json, ns, policy, enforced, note)) in cases.into_iter().enumerate() {
        let (answered, patched) = run_in(pod_json, ns, &f, policy);
        assert_eq!(answered.not_enforced().is_none(), enforced, "case {i}");
        assert_eq!(
            patched["spec"].get("tolerations").is_some(),
            enforced,
            "case {i}: {patched:#}"
        );
        let annotation = annotation_of(&patched);
        assert!(
            annotation.starts_with(note) || (enforced && annotation.contains(note)),
            "case {i}: {annotation}"
        );
        if i == 0 {
            assert!(
                !annotation.contains(ENFORCE_KEY),
                "the config names no level: {annotation}"
            );
        }
    }
    // A Pod the decision denies, report only by its Namespace: not denied.
    let mixed = pod(&["x86:1", "z:1"], json!({}));
    let f = facts(&[
        ("x86:1", Ok(&["linux/amd64"])),
        ("z:1", Ok(&["linux/s390x"])),
    ]);
    let (answered, patched) = run_in(&mixed, &ns_false, &f, &enforcing);
    assert_eq!(answered.denial(), None);
    assert!(annotation_of(&patched)
        .starts_with("report only (namespace apps's tolerable.io/enforce): would deny: "));
    // Enforced by the Namespace over the config: denied.
    let answered = answer(
        &request_in(&mixed, &ns_true, &reporting),
        &f,
        None,
        &reporting,
    );
    assert!(answered.denial().is_some());
}

#[test]
fn preference_pod_over_namespace_over_config() {
    let multi = |extra| pod(&["app:1"], extra);
    let f = facts(&[("app:1", Ok(&["linux/amd64", "linux/arm64"]))]);
    let config = Policy {
        preferred_architectures: vec![WeightedArchitecture {
            architecture: "amd64".into(),
            weight: 30,
        }],
        ..policy()
    };
    let batch = namespace(&[], &[(PREFERRED_KEY, "arm64=80, amd64=20")]);
    let none = namespace(&[], &[(PREFERRED_KEY, "none")]);
    let preferred = |patched: &Value| {
        patched["spec"]["affinity"]["nodeAffinity"]
            ["preferredDuringSchedulingIgnoredDuringExecution"]
            .as_array()
            .map(|terms| {
                terms
                    .iter()
                    .map(|t| {
                        (
                            t["preference"]["matchExpressions"][0]["values"][0]
                                .as_str()
                                .unwrap()
                                .to_owned(),
                            t["weight"].as_i64().unwrap(),
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    let own = multi(json!({"metadata": {"labels": {PREFERRED_KEY: "amd64"}}}));
    // (the Pod, its Namespace, the preferred terms, the annotation's note)
    type Case<'a> = (Value, &'a NamespacePolicy, Vec<(&'a str, i64)>, &'a str);
    let cases: [Case; 4] = [
        (multi(json!({})), &NamespacePolicy::default(), vec![("amd64", 30)], "prefers amd64 (weight 30) (preferred_architecture)"),
        (multi(json!({})), &batch, vec![("arm64", 80), ("amd64", 20)], "prefers arm64 (weight 80), amd64 (weight 20) (namespace apps's tolerable.io/preferred-architecture)"),
        (own, &batch, vec![("amd64", 50)], "prefers amd64 (the Pod's tolerable.io/preferred-architecture)"),
        (multi(json!({})), &none, vec![], ""),
    ];
    for (i, (pod_json, ns, expected, note)) in cases.into_iter().enumerate() {
        let (_, patched) = run_in(&pod_json, ns, &f, &config);
        let got = preferred(&patched);
        let expected: Vec<(String, i64)> = expected
            .into_iter()
            .map(|(a, w)| (a.to_owned(), w))
            .collect();
        assert_eq!(got, expected, "case {i}");
        let annotation = annotation_of(&patched);
        if note.is_empty() {
            assert!(!annotation.contains("prefers"), "case {i}: {annotation}");
        } else {
            assert!(annotation.contains(note), "case {i}: {annotation}");
        }
    }
}

#[test]
fn skip_pod_over_namespace_over_config_each_only_opts_out() {
    let f = facts(&[("app:1", Ok(&["linux/arm64"]))]);
    let config = Policy {
        skip_namespaces: BTreeSet::from(["apps".to_owned()]),
        ..policy()
    };
    let skipped = namespace(&[(SKIP_KEY, "true")], &[]);
    let not_skipped = namespace(&[(SKIP_KEY, "false")], &[]);
    let opted_out = pod(
        &["app:1"],
        json!({"metadata": {"annotations": {SKIP_KEY: "true"}}}),
    );
    let opted_in = pod(
        &["app:1"],
        json!({"metadata": {"labels": {SKIP_KEY: "false"}}}),
    );
    let plain = pod(&["app:1"], json!({}));
    let cases: [(&Value, &NamespacePolicy, &Policy, Option<&str>); 6] = [
        (
            &opted_out,
            &skipped,
            &config,
            Some("the Pod opted out with tolerable.io/skip=true"),
        ),
        (
            &plain,
            &skipped,
            &config,
            Some("namespace apps opted out with tolerable.io/skip=true"),
        ),
        (
            &opted_in,
            &skipped,
            &policy(),
            Some("namespace apps opted out"),
        ),
        (
            &plain,
            &not_skipped,
            &config,
            Some("namespace apps is in skip_namespaces"),
        ),
        (
            &plain,
            &NamespacePolicy::default(),
            &config,
            Some("namespace apps is in skip_namespaces"),
        ),
        (&plain, &not_skipped, &policy(), None),
    ];
    for (i, (pod_json, ns, policy, skipped)) in cases.into_iter().enumerate() {
        let request = request_in(pod_json, ns, policy);
        assert_eq!(
            request.images_to_look_up().is_empty(),
            skipped.is_some(),
            "case {i}"
        );
        let decision = answer(&request, &f, None, policy).decision;
        match skipped {
            Some(why) => {
                assert!(
                    matches!(
                        decision,
                        Decision::Unchanged {
                            why: Untouched::Skipped,
                            ..
                        }
                    ),
                    "case {i}"
                );
                assert!(
                    decision.summary().starts_with(why),
                    "case {i}: {}",
                    decision.summary()
                );
            }
            None => assert!(matches!(decision, Decision::Placed(_)), "case {i}"),
        }
    }
}

#[test]
fn a_malformed_namespace_value_is_a_warning_never_a_failure() {
    let f = facts(&[("app:1", Ok(&["linux/amd64", "linux/arm64"]))]);
    let ns = namespace(&[(ENFORCE_KEY, "maybe")], &[(PREFERRED_KEY, "arm64=200")]);
    let (answered, patched) = run_in(&pod(&["app:1"], json!({})), &ns, &f, &policy());
    assert!(answered.not_enforced().is_none(), "the config decides");
    assert!(patched["spec"]["tolerations"].is_array());
    let warnings = answered.warnings();
    assert!(warnings.iter().any(|w| w == "namespace apps: tolerable.io/enforce ignored: \"maybe\" is not \"true\" or \"false\""), "{warnings:?}");
    assert!(
        warnings.iter().any(|w| w.starts_with(
            "namespace apps: tolerable.io/preferred-architecture ignored: \"arm64=200\""
        )),
        "{warnings:?}"
    );
    let bad_pod = pod(
        &["app:1"],
        json!({"metadata": {"labels": {ENFORCE_KEY: "yes"}}}),
    );
    let (answered, _) = run_in(&bad_pod, &NamespacePolicy::default(), &f, &policy());
    assert!(answered
        .warnings()
        .iter()
        .any(|w| w.contains("the Pod's tolerable.io/enforce ignored")));
}

/// Pools whose nodes carry `team=ml` (and no other team), watching `team` only.
fn pools_with_team_ml() -> NodePools {
    let mut pools = NodePools::default();
    let keys = BTreeSet::from([ARCH_LABEL.to_owned()]);
    pools.add_node(Some("a"), "amd64", &[], &keys);
    pools.add_node(Some("b"), "arm64", &[], &keys);
    pools.watch_labels(&["team".to_owned()]);
    pools.add_node_labels(&[("team".into(), "ml".into()), ("zone".into(), "a".into())]);
    pools
}

#[test]
fn with_the_node_watch_a_label_no_node_carries_is_warned_of_never_denied() {
    let p = matching_policy(Steering::NodeAffinity);
    let pools = pools_with_team_ml();
    let decide_with = |pod_json: &Value, pools: Option<&NodePools>| {
        answer(&request(pod_json, &p), &amd64_arm64(), pools, &p)
    };
    let warned = |answered: &Answer| {
        answered
            .warnings()
            .iter()
            .filter(|w| w.starts_with("no node is labelled"))
            .cloned()
            .collect::<Vec<_>>()
    };
    // team=ml: some node carries it.
    let ml = labelled(json!({}));
    assert!(warned(&decide_with(&ml, Some(&pools))).is_empty());
    // team=gpu: none does; still placed, the label still required.
    let gpu = labelled(json!({"metadata": {"labels": {"team": "gpu"}}}));
    let answered = decide_with(&gpu, Some(&pools));
    assert_eq!(
        warned(&answered),
        ["no node is labelled team=gpu (match_node_labels): the Pod stays Pending until one is"]
    );
    assert!(answered.denial().is_none());
    assert!(matches!(answered.decision, Decision::Placed(_)));
    // A key the watch does not keep (region), and no node watch at all: nothing said.
    let region = labelled(
        json!({"metadata": {"labels": {"team": "ml", "topology.kubernetes.io/region": "mars-1"}}}),
    );
    assert!(warned(&decide_with(&region, Some(&pools))).is_empty());
    assert!(warned(&decide_with(&gpu, None)).is_empty());
    // Reinvocation on the patched Pod: the same warning, nothing more to patch.
    let out = run(&gpu, &amd64_arm64(), &p);
    let again = answer(&request(&out.patched, &p), &amd64_arm64(), Some(&pools), &p);
    assert!(again.patch.is_empty());
    assert_eq!(warned(&again).len(), 1);
}
