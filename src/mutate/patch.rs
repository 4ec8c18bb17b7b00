//! Decision → JSON Patch (RFC 6902) against the Pod it was made for. Only `add` operations, each
//! adding a missing parent first, so the patch is right whether `/spec/tolerations` or
//! `/spec/affinity` exist or not — and `/spec` itself is never replaced.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

use super::{Decision, ARCH_LABEL, DECISION_ANNOTATION, PREFERRED_WEIGHT};

/// Escapes one JSON Pointer token (`~` → `~0`, `/` → `~1`).
fn token(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

fn add(path: impl Into<String>, value: Value) -> Value {
    json!({"op": "add", "path": path.into(), "value": value})
}

fn arch_requirement(architectures: &[String]) -> Value {
    json!({"key": ARCH_LABEL, "operator": "In", "values": architectures})
}

/// The JSON Patch operations that apply `decision` to `pod`. Empty when nothing changes.
pub fn operations(pod: &Pod, decision: &Decision) -> Vec<Value> {
    let mut ops = Vec::new();
    if decision.deny.is_some() {
        return ops;
    }
    let spec = pod.spec.as_ref();

    if !decision.tolerations.is_empty() {
        let values: Vec<Value> = decision
            .tolerations
            .iter()
            .map(|t| serde_json::to_value(t).expect("a toleration serializes"))
            .collect();
        if spec.and_then(|s| s.tolerations.as_ref()).is_some() {
            ops.extend(values.into_iter().map(|v| add("/spec/tolerations/-", v)));
        } else {
            ops.push(add("/spec/tolerations", Value::Array(values)));
        }
    }

    if let Some(arch) = &decision.node_selector {
        if spec.and_then(|s| s.node_selector.as_ref()).is_some() {
            ops.push(add(
                format!("/spec/nodeSelector/{}", token(ARCH_LABEL)),
                json!(arch),
            ));
        } else {
            ops.push(add("/spec/nodeSelector", json!({ ARCH_LABEL: arch })));
        }
    }

    let affinity = spec.and_then(|s| s.affinity.as_ref());
    let node_affinity = affinity.and_then(|a| a.node_affinity.as_ref());
    let mut node_affinity_added = false;
    if let Some(architectures) = &decision.required_architectures {
        let requirement = arch_requirement(architectures);
        let required = json!({"nodeSelectorTerms": [{"matchExpressions": [requirement.clone()]}]});
        let base = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution";
        if affinity.is_none() {
            ops.push(add(
                "/spec/affinity",
                json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}),
            ));
            node_affinity_added = true;
        } else if node_affinity.is_none() {
            ops.push(add(
                "/spec/affinity/nodeAffinity",
                json!({"requiredDuringSchedulingIgnoredDuringExecution": required}),
            ));
            node_affinity_added = true;
        } else {
            match node_affinity.and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .as_ref()
            }) {
                None => ops.push(add(base, required)),
                // No term at all can match nothing; give it one.
                Some(r) if r.node_selector_terms.is_empty() => ops.push(add(
                    format!("{base}/nodeSelectorTerms/-"),
                    json!({"matchExpressions": [requirement]}),
                )),
                // AND into every term: terms are OR'd, so a new term would widen, not narrow.
                Some(r) => {
                    for (i, term) in r.node_selector_terms.iter().enumerate() {
                        let path = format!("{base}/nodeSelectorTerms/{i}/matchExpressions");
                        if term.match_expressions.is_some() {
                            ops.push(add(format!("{path}/-"), requirement.clone()));
                        } else {
                            ops.push(add(path, json!([requirement.clone()])));
                        }
                    }
                }
            }
        }
    }

    if let Some(arch) = &decision.preferred_architecture {
        let term = json!({
            "weight": PREFERRED_WEIGHT,
            "preference": {"matchExpressions": [arch_requirement(std::slice::from_ref(arch))]},
        });
        let preferred_path =
            "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution";
        if affinity.is_none() && !node_affinity_added {
            ops.push(add(
                "/spec/affinity",
                json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}),
            ));
        } else if node_affinity.is_none() && !node_affinity_added {
            ops.push(add(
                "/spec/affinity/nodeAffinity",
                json!({"preferredDuringSchedulingIgnoredDuringExecution": [term]}),
            ));
        } else if node_affinity
            .and_then(|n| {
                n.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .is_some()
        {
            ops.push(add(format!("{preferred_path}/-"), term));
        } else {
            ops.push(add(preferred_path, json!([term])));
        }
    }

    if let Some(value) = &decision.annotation {
        if pod.metadata.annotations.is_some() {
            ops.push(add(
                format!("/metadata/annotations/{}", token(DECISION_ANNOTATION)),
                json!(value),
            ));
        } else {
            ops.push(add(
                "/metadata/annotations",
                json!({ DECISION_ANNOTATION: value }),
            ));
        }
    }
    ops
}
