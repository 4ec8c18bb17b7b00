//! JSON Patch (RFC 6902): the one representation tolerable writes patches in (the Pod's patch
//! here, the node tainter's in `taints`), with the one JSON Pointer escaper.
//!
//! A placement becomes a patch against the Pod it was made for with `add` operations only, each
//! adding a missing parent first, so the patch is right whether `/spec/tolerations` or
//! `/spec/affinity` exist or not — and `/spec` itself is never replaced. Values are the
//! `k8s-openapi` types, serialized straight to the wire (no intermediate JSON tree: this is on
//! the hot path of every admission).

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PodSchedulingGate, PreferredSchedulingTerm, Taint, Toleration,
};
use serde::Serialize;

use super::{
    Placement, PodSpecView, PodView, WeightedArchitecture, ARCH_LABEL, DECISION_ANNOTATION,
};

/// One JSON Patch operation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Operation {
    pub op: Op,
    /// Mostly a fixed path: borrowed, not allocated per admission.
    pub path: Cow<'static, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<PatchValue>,
}

/// The operations tolerable writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Add,
    Remove,
    /// Makes the whole patch fail unless the value at the path is the one given.
    Test,
}

impl Operation {
    pub fn add(path: impl Into<Cow<'static, str>>, value: PatchValue) -> Self {
        Self {
            op: Op::Add,
            path: path.into(),
            value: Some(value),
        }
    }

    pub fn remove(path: impl Into<Cow<'static, str>>) -> Self {
        Self {
            op: Op::Remove,
            path: path.into(),
            value: None,
        }
    }

    pub fn test(path: impl Into<Cow<'static, str>>, value: PatchValue) -> Self {
        Self {
            op: Op::Test,
            path: path.into(),
            value: Some(value),
        }
    }
}

/// What an operation adds.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum PatchValue {
    Tolerations(Vec<Toleration>),
    Toleration(Toleration),
    Text(String),
    Map(BTreeMap<&'static str, String>),
    /// A map of keys known only at run time (`match_node_labels`).
    Labels(BTreeMap<String, String>),
    Affinity(Affinity),
    NodeAffinity(NodeAffinity),
    Required(NodeSelector),
    Requirement(NodeSelectorRequirement),
    Requirements(Vec<NodeSelectorRequirement>),
    Preferred(Vec<PreferredSchedulingTerm>),
    PreferredTerm(PreferredSchedulingTerm),
    Taints(Vec<Taint>),
    Taint(Taint),
    Gates(Vec<PodSchedulingGate>),
    Gate(PodSchedulingGate),
}

/// Escapes one JSON Pointer reference token (RFC 6901: `~` → `~0`, then `/` → `~1`).
pub fn pointer_token(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

fn add(path: impl Into<Cow<'static, str>>, value: PatchValue) -> Operation {
    Operation::add(path, value)
}

fn arch_requirement(architectures: &[String]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: ARCH_LABEL.to_owned(),
        operator: "In".to_owned(),
        values: Some(architectures.to_vec()),
    }
}

fn label_requirement(key: &str, value: &str) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_owned(),
        operator: "In".to_owned(),
        values: Some(vec![value.to_owned()]),
    }
}

fn term(requirement: NodeSelectorRequirement) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: Some(vec![requirement]),
        match_fields: None,
    }
}

/// The JSON Patch operations that apply `decision` to `pod`. Empty when nothing changes.
pub fn operations(pod: &PodView, decision: &Placement) -> Vec<Operation> {
    let mut ops = Vec::new();
    let spec = pod.spec.as_ref();
    if !decision.tolerations.is_empty() {
        add_tolerations(&mut ops, spec, &decision.tolerations);
    }
    let selector: Vec<(&str, &str)> = decision
        .node_selector
        .iter()
        .map(|arch| (ARCH_LABEL, arch.as_str()))
        .chain(
            decision
                .node_selector_labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str())),
        )
        .collect();
    if !selector.is_empty() {
        add_node_selector(&mut ops, spec, &selector);
    }
    let affinity = spec.and_then(|s| s.affinity.as_ref());
    let requirements: Vec<NodeSelectorRequirement> = decision
        .required_architectures
        .iter()
        .map(|architectures| arch_requirement(architectures))
        .chain(
            decision
                .required_labels
                .iter()
                .map(|(key, value)| label_requirement(key, value)),
        )
        .collect();
    let preferred = preferred_terms(&decision.preferred_architectures);
    add_node_affinity(&mut ops, affinity, &requirements, preferred);
    for pin in &decision.pins {
        // `add` on an existing member replaces its value (RFC 6902 4.1).
        ops.push(add(pin.path.clone(), PatchValue::Text(pin.image.clone())));
    }
    if let Some(value) = &decision.annotation {
        add_annotation(&mut ops, pod, value);
    }
    ops
}

/// Where the decision annotation is in a Pod: fixed, so not escaped per admission (a test checks
/// it is [`DECISION_ANNOTATION`] escaped).
const DECISION_ANNOTATION_PATH: &str = "/metadata/annotations/tolerable.io~1decision";

/// The decision annotation, in the Pod's annotations or as a new map.
fn add_annotation(ops: &mut Vec<Operation>, pod: &PodView, value: &str) {
    if pod.annotations.is_some() {
        ops.push(add(
            DECISION_ANNOTATION_PATH,
            PatchValue::Text(value.to_owned()),
        ));
    } else {
        ops.push(add(
            "/metadata/annotations",
            PatchValue::Map(BTreeMap::from([(DECISION_ANNOTATION, value.to_owned())])),
        ));
    }
}

/// The tolerations, appended to the Pod's own list or as a new one.
fn add_tolerations(
    ops: &mut Vec<Operation>,
    spec: Option<&PodSpecView>,
    tolerations: &[Toleration],
) {
    if spec.and_then(|s| s.tolerations.as_ref()).is_some() {
        ops.extend(
            tolerations
                .iter()
                .map(|t| add("/spec/tolerations/-", PatchValue::Toleration(t.clone()))),
        );
    } else {
        ops.push(add(
            "/spec/tolerations",
            PatchValue::Tolerations(tolerations.to_vec()),
        ));
    }
}

/// `kubernetes.io/arch` pinned and `match_node_labels` set in the nodeSelector (`entries`:
/// keys the Pod's nodeSelector lacks).
fn add_node_selector(
    ops: &mut Vec<Operation>,
    spec: Option<&PodSpecView>,
    entries: &[(&str, &str)],
) {
    if spec.and_then(|s| s.node_selector.as_ref()).is_some() {
        ops.extend(entries.iter().map(|(key, value)| {
            add(
                format!("/spec/nodeSelector/{}", pointer_token(key)),
                PatchValue::Text((*value).to_owned()),
            )
        }));
    } else {
        ops.push(add(
            "/spec/nodeSelector",
            PatchValue::Labels(
                entries
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
        ));
    }
}

/// The required `requirements` and the `preferred` terms in the Pod's node affinity. Where the
/// Pod has no affinity (or no nodeAffinity), both go in one `add` of the whole object: the
/// fewest operations for the API server to apply (issue 39).
fn add_node_affinity(
    ops: &mut Vec<Operation>,
    affinity: Option<&Affinity>,
    requirements: &[NodeSelectorRequirement],
    preferred: Vec<PreferredSchedulingTerm>,
) {
    if requirements.is_empty() && preferred.is_empty() {
        return;
    }
    let node_affinity = affinity.and_then(|a| a.node_affinity.as_ref());
    let Some(node_affinity) = node_affinity else {
        let new = NodeAffinity {
            required_during_scheduling_ignored_during_execution: (!requirements.is_empty())
                .then(|| required(requirements)),
            preferred_during_scheduling_ignored_during_execution: (!preferred.is_empty())
                .then_some(preferred),
        };
        ops.push(match affinity {
            None => add(
                "/spec/affinity",
                PatchValue::Affinity(Affinity {
                    node_affinity: Some(new),
                    ..Affinity::default()
                }),
            ),
            Some(_) => add("/spec/affinity/nodeAffinity", PatchValue::NodeAffinity(new)),
        });
        return;
    };
    if !requirements.is_empty() {
        add_required(ops, node_affinity, requirements);
    }
    if !preferred.is_empty() {
        add_preferred(ops, node_affinity, preferred);
    }
}

/// One term requiring all of `requirements`.
fn required(requirements: &[NodeSelectorRequirement]) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(requirements.to_vec()),
            match_fields: None,
        }],
    }
}

/// `requirements` (`kubernetes.io/arch In (…)`, `match_node_labels`' `key In [value]`) ANDed
/// into every required term of the Pod's own nodeAffinity — each into the terms that do not
/// constrain its key yet — or the term created.
fn add_required(
    ops: &mut Vec<Operation>,
    node_affinity: &NodeAffinity,
    requirements: &[NodeSelectorRequirement],
) {
    let base = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution";
    match node_affinity
        .required_during_scheduling_ignored_during_execution
        .as_ref()
    {
        None => ops.push(add(base, PatchValue::Required(required(requirements)))),
        // No term at all can match nothing; give it one. The whole selector is
        // replaced: `nodeSelectorTerms` may be absent (the API server validates only
        // after admission), and the selector has no other field to lose.
        Some(r) if r.node_selector_terms.is_empty() => {
            ops.push(add(base, PatchValue::Required(required(requirements))));
        }
        // AND into every term: terms are OR'd, so a new term would widen, not narrow.
        Some(r) => {
            for (i, existing) in r.node_selector_terms.iter().enumerate() {
                and_into_term(
                    ops,
                    &format!("{base}/nodeSelectorTerms/{i}"),
                    existing,
                    requirements,
                );
            }
        }
    }
}

/// The requirements whose key `term` does not constrain yet, ANDed into it: a constraint the
/// Pod (or an earlier invocation) already has on a key is kept as it is.
fn and_into_term(
    ops: &mut Vec<Operation>,
    term_path: &str,
    term: &NodeSelectorTerm,
    requirements: &[NodeSelectorRequirement],
) {
    let has_key = |key: &str| {
        term.match_expressions
            .iter()
            .flatten()
            .any(|e| e.key == key)
    };
    let missing: Vec<NodeSelectorRequirement> = requirements
        .iter()
        .filter(|r| !has_key(&r.key))
        .cloned()
        .collect();
    if missing.is_empty() {
        return;
    }
    let path = format!("{term_path}/matchExpressions");
    if term.match_expressions.is_some() {
        ops.extend(
            missing
                .into_iter()
                .map(|r| add(format!("{path}/-"), PatchValue::Requirement(r))),
        );
    } else {
        ops.push(add(path, PatchValue::Requirements(missing)));
    }
}

/// The preferred terms, one per architecture, weighted.
fn preferred_terms(preferences: &[WeightedArchitecture]) -> Vec<PreferredSchedulingTerm> {
    preferences
        .iter()
        .map(|p| PreferredSchedulingTerm {
            weight: p.weight,
            preference: term(arch_requirement(std::slice::from_ref(&p.architecture))),
        })
        .collect()
}

/// The preferred terms appended to the Pod's own nodeAffinity's, or as its list.
fn add_preferred(
    ops: &mut Vec<Operation>,
    node_affinity: &NodeAffinity,
    preferred: Vec<PreferredSchedulingTerm>,
) {
    let preferred_path =
        "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution";
    if node_affinity
        .preferred_during_scheduling_ignored_during_execution
        .is_some()
    {
        ops.extend(preferred.into_iter().map(|term| {
            add(
                format!("{preferred_path}/-"),
                PatchValue::PreferredTerm(term),
            )
        }));
    } else {
        ops.push(add(preferred_path, PatchValue::Preferred(preferred)));
    }
}

/// The operations' JSON text, byte for byte what `serde_json` writes for them, appended to
/// `out`. Written by hand because the decision annotation is most of a patch's bytes and
/// serde_json looks up every byte of a string in its escape table (~10 instructions a byte);
/// here a text that needs no escape is checked in one pass the compiler vectorizes and copied
/// whole (about 5k instructions less per deciding admission, by callgrind). Every other value
/// is serde_json's own.
pub fn write_json(operations: &[Operation], out: &mut Vec<u8>) {
    out.push(b'[');
    for (i, operation) in operations.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(match operation.op {
            Op::Add => br#"{"op":"add","path":"#,
            Op::Remove => br#"{"op":"remove","path":"#,
            Op::Test => br#"{"op":"test","path":"#,
        });
        write_string(out, &operation.path);
        if let Some(value) = &operation.value {
            out.extend_from_slice(br#","value":"#);
            write_value(out, value);
        }
        out.push(b'}');
    }
    out.push(b']');
}

/// One value, as serde_json writes it: the texts and string maps through [`write_string`].
fn write_value(out: &mut Vec<u8>, value: &PatchValue) {
    let write_map = |out: &mut Vec<u8>, entries: &mut dyn Iterator<Item = (&str, &str)>| {
        out.push(b'{');
        for (i, (key, value)) in entries.enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_string(out, key);
            out.push(b':');
            write_string(out, value);
        }
        out.push(b'}');
    };
    match value {
        PatchValue::Text(text) => write_string(out, text),
        PatchValue::Map(map) => write_map(out, &mut map.iter().map(|(k, v)| (*k, v.as_str()))),
        PatchValue::Labels(map) => {
            write_map(out, &mut map.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        }
        other => serde_json::to_writer(&mut *out, other).expect("a patch value serializes"),
    }
}

/// `text` as a JSON string appended to `out`, as serde_json writes it (it escapes `"`, `\` and
/// the control characters below U+0020, nothing else): copied whole when there is nothing to
/// escape. The check has no early exit so that it vectorizes.
pub fn write_string(out: &mut Vec<u8>, text: &str) {
    let escapes = text.bytes().fold(false, |any, b| {
        any | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if escapes {
        serde_json::to_writer(&mut *out, text).expect("a string serializes");
    } else {
        out.reserve(text.len() + 2);
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    }
}

#[cfg(test)]
mod write_tests {
    use super::*;

    /// The hand-written JSON is serde_json's, byte for byte: each operation kind, each value
    /// kind the writer handles itself (texts, both maps) and one it leaves to serde_json, with
    /// texts that need every escape, none, or are not ASCII.
    #[test]
    fn written_json_is_serde_jsons() {
        let texts = [
            "",
            "plain text; images: a:1 (linux/amd64,linux/arm64)",
            "quote \" backslash \\ slash / tab \t newline \n nul \u{0} unit \u{1f} del \u{7f}",
            "ünïcödé 架构 🚀 \u{2028}",
        ];
        let mut operations = vec![Operation::remove("/spec/schedulingGates/0")];
        for text in texts {
            operations.push(Operation::add(
                format!("/metadata/annotations/{}", pointer_token(text)),
                PatchValue::Text(text.to_owned()),
            ));
            operations.push(Operation::test("/a", PatchValue::Text(text.to_owned())));
            operations.push(Operation::add(
                "/metadata/annotations",
                PatchValue::Map(BTreeMap::from([
                    ("b", text.to_owned()),
                    ("a\"", "x".into()),
                ])),
            ));
            operations.push(Operation::add(
                "/spec/nodeSelector",
                PatchValue::Labels(BTreeMap::from([(text.to_owned(), text.to_owned())])),
            ));
            operations.push(Operation::add(
                "/spec/schedulingGates/-",
                PatchValue::Gate(PodSchedulingGate {
                    name: text.to_owned(),
                }),
            ));
        }
        operations.push(Operation::add("/m", PatchValue::Map(BTreeMap::new())));
        assert_eq!(
            DECISION_ANNOTATION_PATH,
            format!(
                "/metadata/annotations/{}",
                pointer_token(DECISION_ANNOTATION)
            )
        );
        for n in [0, 1, operations.len()] {
            let mut written = b"prefix".to_vec();
            write_json(&operations[..n], &mut written);
            let mut want = b"prefix".to_vec();
            serde_json::to_writer(&mut want, &operations[..n]).unwrap();
            assert_eq!(String::from_utf8(written), String::from_utf8(want));
        }
    }
}
