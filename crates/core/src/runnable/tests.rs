//! Table tests of placement by what nodes run: each patch applied with `json-patch`, and
//! deciding again on the patched Pod changes nothing (the helpers of `mutate::tests`).

use serde_json::{json, Value};

use super::super::tests::{
    facts, node_pools, pod, policy, required_terms, run, run_with_pools, TaintParts,
};
use super::super::*;

fn note(patched: &Value) -> &str {
    patched["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap_or_default()
}

fn arch_term(values: &[&str]) -> Value {
    json!([{"matchExpressions": [{"key": ARCH_LABEL, "operator": "In", "values": values}]}])
}

const ARM64_TAINT: &[TaintParts] = &[(ARCH_LABEL, "arm64", "NoSchedule")];

/// The cluster of the issue: amd64 nodes untainted, arm64 nodes tainted.
fn amd64_and_arm64_nodes() -> NodePools {
    node_pools(&[("amd-1", "amd64", &[]), ("arm-1", "arm64", ARM64_TAINT)])
}

#[test]
fn a_386_only_image_runs_on_amd64_nodes_and_never_names_386() {
    let f = facts(&[("old:1", Ok(&["linux/386"]))]);
    let out = run(&pod(&["old:1"], json!({})), &f, &policy());
    assert_eq!(required_terms(&out.patched), &arch_term(&["amd64"]));
    assert!(out.patched["spec"]["tolerations"].is_null());
    let note = note(&out.patched);
    assert!(note.starts_with("linux architectures amd64;"), "{note}");
    assert!(note.contains("amd64 pulls linux/386 for old:1"), "{note}");
    assert!(!out.ops.iter().any(|op| op.to_string().contains("\"386\"")));

    // With the node watch, the same.
    let (_, patched) = run_with_pools(
        &pod(&["old:1"], json!({})),
        &f,
        &policy(),
        &amd64_and_arm64_nodes(),
    );
    assert_eq!(required_terms(&patched), &arch_term(&["amd64"]));
}

#[test]
fn a_386_and_arm64_index_keeps_amd64() {
    let f = facts(&[("mixed:1", Ok(&["linux/386", "linux/arm64"]))]);
    let out = run(&pod(&["mixed:1"], json!({})), &f, &policy());
    assert_eq!(
        required_terms(&out.patched),
        &arch_term(&["amd64", "arm64"])
    );
    assert_eq!(
        out.patched["spec"]["tolerations"],
        json!([{"key": ARCH_LABEL, "operator": "Equal", "value": "arm64", "effect": "NoSchedule"}])
    );
    let note = note(&out.patched);
    assert!(note.contains("amd64 pulls linux/386 for mixed:1"), "{note}");
    assert!(!note.contains("arm64 pulls"), "arm64 pulls its own: {note}");
}

#[test]
fn amd64_runs_386_off_leaves_a_386_image_nowhere() {
    let p = Policy {
        amd64_runs_386: false,
        ..policy()
    };
    let f = facts(&[("old:1", Ok(&["linux/386"]))]);
    let decision = decide(&request_of(&["old:1"], &p), &f, None, &p);
    assert_eq!(decision.outcome(), Outcome::Denied);
    let message = decision.denial().unwrap();
    assert!(message.contains("old:1 (linux/386)"), "{message}");
    assert!(
        message.contains("no node of amd64,arm64,s390x runs them all"),
        "{message}"
    );
}

fn request_of(images: &[&str], p: &Policy) -> PodCreate {
    super::super::tests::request(&pod(images, json!({})), p)
}

#[test]
fn arm32_only_follows_the_setting() {
    let f = facts(&[("pi:1", Ok(&["linux/arm/v7"]))]);
    // Without the node watch an arm node may exist: the image's own architecture.
    let out = run(&pod(&["pi:1"], json!({})), &f, &policy());
    assert_eq!(required_terms(&out.patched), &arch_term(&["arm"]));

    let runs_arm32 = Policy {
        arm64_runs_arm32: true,
        ..policy()
    };
    let out = run(&pod(&["pi:1"], json!({})), &f, &runs_arm32);
    assert_eq!(required_terms(&out.patched), &arch_term(&["arm", "arm64"]));
    assert!(note(&out.patched).contains("arm64 pulls linux/arm/v7 for pi:1"));

    // With the node watch and no arm node: arm64 where its CPUs run AArch32 …
    let nodes = amd64_and_arm64_nodes();
    let (_, patched) = run_with_pools(&pod(&["pi:1"], json!({})), &f, &runs_arm32, &nodes);
    assert_eq!(required_terms(&patched), &arch_term(&["arm64"]));
    // … else never `in (arm)`: denied, or left unchanged with a warning.
    let request = request_of(&["pi:1"], &policy());
    let denied = answer(&request, &f, Some(&nodes), &policy());
    assert_eq!(denied.outcome(), Outcome::Denied);
    assert!(denied.patch.is_empty());
    let warn = Policy {
        on_no_common_architecture: OnNoCommonArchitecture::Warn,
        ..policy()
    };
    let warned = answer(&request_of(&["pi:1"], &warn), &f, Some(&nodes), &warn);
    assert_eq!(warned.outcome(), Outcome::NoCommonArchitecture);
    assert!(warned.patch.is_empty());
    let warning = &warned.warnings()[0];
    assert!(warning.contains("pi:1 (linux/arm/v7)"), "{warning}");
    assert!(warning.contains("amd64,arm64,s390x"), "{warning}");
}

#[test]
fn with_the_node_watch_only_architectures_the_cluster_has_or_may_add_are_required() {
    // ppc64le: no node, no configured pool.
    let f = facts(&[("m:1", Ok(&["linux/amd64", "linux/arm64", "linux/ppc64le"]))]);
    let nodes = amd64_and_arm64_nodes();
    let (_, patched) = run_with_pools(&pod(&["m:1"], json!({})), &f, &policy(), &nodes);
    assert_eq!(required_terms(&patched), &arch_term(&["amd64", "arm64"]));
    let only = facts(&[("p:1", Ok(&["linux/ppc64le"]))]);
    let decision = answer(
        &request_of(&["p:1"], &policy()),
        &only,
        Some(&nodes),
        &policy(),
    );
    assert_eq!(decision.outcome(), Outcome::Denied);
}

#[test]
fn variants_need_nodes_said_to_meet_them() {
    let f = facts(&[("fast:1", Ok(&["linux/amd64/v3", "linux/arm64"]))]);
    // Nothing said: amd64 kept (containerd may detect the level) with a warning.
    let out = run(&pod(&["fast:1"], json!({})), &f, &policy());
    assert_eq!(
        required_terms(&out.patched),
        &arch_term(&["amd64", "arm64"])
    );
    let warnings = out.decision.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("linux/amd64/v3"), "{warnings:?}");
    assert!(warnings[0].contains("node_variants"), "{warnings:?}");

    let said = |variant: &str| Policy {
        node_variants: [("amd64".to_owned(), variant.to_owned())].into(),
        ..policy()
    };
    let out = run(&pod(&["fast:1"], json!({})), &f, &said("v2"));
    assert_eq!(required_terms(&out.patched), &arch_term(&["arm64"]));
    assert!(out.decision.warnings().is_empty());
    let out = run(&pod(&["fast:1"], json!({})), &f, &said("v4"));
    assert_eq!(
        required_terms(&out.patched),
        &arch_term(&["amd64", "arm64"])
    );
    assert!(out.decision.warnings().is_empty());
    assert!(note(&out.patched).contains("amd64 pulls linux/amd64/v3 for fast:1"));

    // arm64 v9 nodes run a v8.2 build; v8 ones are not known to.
    let neoverse = facts(&[("n:1", Ok(&["linux/arm64/v8.2"]))]);
    let v9 = Policy {
        node_variants: [("arm64".to_owned(), "v9".to_owned())].into(),
        ..policy()
    };
    let out = run(&pod(&["n:1"], json!({})), &neoverse, &v9);
    assert_eq!(required_terms(&out.patched), &arch_term(&["arm64"]));
    assert!(out.decision.warnings().is_empty());
    let v8 = Policy {
        node_variants: [("arm64".to_owned(), String::new())].into(),
        ..policy()
    };
    let decision = decide(&request_of(&["n:1"], &v8), &neoverse, None, &v8);
    assert_eq!(decision.outcome(), Outcome::Denied);
}

#[test]
fn every_image_must_run_on_the_node_architecture() {
    // amd64 runs the first (386) and the second (amd64); arm64 only the second.
    let f = facts(&[
        ("a:1", Ok(&["linux/386"])),
        ("b:1", Ok(&["linux/amd64", "linux/arm64"])),
    ]);
    let out = run(&pod(&["a:1", "b:1"], json!({})), &f, &policy());
    assert_eq!(required_terms(&out.patched), &arch_term(&["amd64"]));
    assert!(out.patched["spec"]["tolerations"].is_null());
}

/// A DaemonSet whose Pod template names `image`.
fn daemon_set(image: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": "apps"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "agent", "image": image}]},
            },
        },
    })
}

/// Decides on the DaemonSet's template, applies the patch to the DaemonSet, and checks that
/// deciding again on the patched template changes nothing.
fn run_template(
    ds: &Value,
    f: &ImageFacts,
    p: &Policy,
    pools: Option<&NodePools>,
) -> (Answer, Value) {
    let template_request = |ds: &Value| {
        let mut template = ds["spec"]["template"].clone();
        template["apiVersion"] = json!("v1");
        template["kind"] = json!("Pod");
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(template).unwrap();
        PodCreate::new("apps", PodView::of_pod(&pod), p)
            .unwrap()
            .into_template()
    };
    let first = answer(&template_request(ds), f, pools, p);
    let ops = serde_json::to_value(&first.patch).unwrap();
    let mut patched = ds.clone();
    let ops: json_patch::Patch = serde_json::from_value(ops).unwrap();
    json_patch::patch(&mut patched, &ops).unwrap();
    let _: k8s_openapi::api::apps::v1::DaemonSet =
        serde_json::from_value(patched.clone()).expect("a DaemonSet");
    let again = answer(&template_request(&patched), f, pools, p);
    assert!(again.patch.is_empty(), "{:?}", again.patch);
    (first, patched)
}

#[test]
fn a_daemon_sets_template_gets_the_tolerations_and_the_term() {
    let nodes = node_pools(&[
        ("amd-1", "amd64", &[]),
        ("arm-1", "arm64", ARM64_TAINT),
        ("z-1", "s390x", &[(ARCH_LABEL, "s390x", "NoSchedule")]),
    ]);
    // A node agent for amd64 and arm64: tolerates the arm64 taint, kept off s390x.
    let f = facts(&[("agent:1", Ok(&["linux/amd64", "linux/arm64"]))]);
    let (_, patched) = run_template(&daemon_set("agent:1"), &f, &policy(), Some(&nodes));
    let template = &patched["spec"]["template"];
    assert_eq!(
        template["spec"]["tolerations"],
        json!([{"key": ARCH_LABEL, "operator": "Equal", "value": "arm64", "effect": "NoSchedule"}])
    );
    assert_eq!(required_terms(template), &arch_term(&["amd64", "arm64"]));
    assert!(note(template).starts_with("linux architectures amd64,arm64;"));
    // Nothing written outside the template.
    assert_eq!(patched["metadata"], daemon_set("agent:1")["metadata"]);
}

#[test]
fn a_template_is_never_gated_nor_pinned() {
    let p = Policy {
        on_lookup_failure: OnLookupFailure::Gate,
        pin_digests: true,
        ..policy()
    };
    let failed = facts(&[("agent:1", Err("registry down"))]);
    let (answer, patched) = run_template(&daemon_set("agent:1"), &failed, &p, None);
    assert_eq!(answer.outcome(), Outcome::LookupFailed);
    assert_eq!(patched, daemon_set("agent:1"));

    let mut f = facts(&[("agent:1", Ok(&["linux/amd64"]))]);
    if let Some(Ok(fact)) = f.get_mut("agent:1") {
        std::sync::Arc::make_mut(fact).digest = Some("sha256:aa".into());
    }
    let (_, patched) = run_template(&daemon_set("agent:1"), &f, &p, None);
    assert_eq!(
        patched["spec"]["template"]["spec"]["containers"][0]["image"],
        "agent:1"
    );
}
