//! Node taints by architecture, the other half of the scheme: every node whose architecture is not
//! a default one gets `<key>=<arch>:<effect>` (`kubernetes.io/arch=arm64:NoSchedule`). Pure
//! planning: a Node in, the taints to add and remove and the JSON Patch out.
//!
//! The taints tolerable adds are recorded in the node annotation [`MANAGED_ANNOTATION`], so
//! `untaint` removes exactly those and never a taint somebody else put there.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::{Node, Taint, Toleration};

use crate::mutate::patch::{pointer_token, Operation, PatchValue};
use crate::mutate::{node_architecture, same_taint, tolerates, Policy, TolerationOperator};

/// Node annotation listing the taints tolerable manages on it (`key=value:effect`, comma-separated).
pub const MANAGED_ANNOTATION: &str = "tolerable.io/managed-taints";

/// One taint, as `kubectl taint` writes it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TaintSpec {
    pub(crate) key: String,
    pub(crate) value: String,
    pub(crate) effect: String,
}

impl fmt::Display for TaintSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}:{}", self.key, self.value, self.effect)
    }
}

impl TaintSpec {
    fn parse(text: &str) -> Option<Self> {
        let (key_value, effect) = text.trim().rsplit_once(':')?;
        let (key, value) = key_value.split_once('=').unwrap_or((key_value, ""));
        (!key.is_empty() && !effect.is_empty()).then(|| Self {
            key: key.to_owned(),
            value: value.to_owned(),
            effect: effect.to_owned(),
        })
    }

    /// Whether `taint` is this taint (the core's rule: key, value and effect).
    fn matches(&self, taint: &Taint) -> bool {
        same_taint(&self.to_taint(), taint)
    }

    fn to_taint(&self) -> Taint {
        Taint {
            key: self.key.clone(),
            value: (!self.value.is_empty()).then(|| self.value.clone()),
            effect: self.effect.clone(),
            time_added: None,
        }
    }
}

/// Which nodes get which taint.
#[derive(Clone, Debug)]
pub struct TaintPolicy {
    /// Architectures whose nodes stay untainted (the pools every image runs on).
    pub default_architectures: BTreeSet<String>,
    /// Architectures Pods get tolerations for. A node of an architecture that is in neither
    /// list is not tainted (unless `force`): no Pod would ever tolerate it.
    pub supported_architectures: BTreeSet<String>,
    /// The taint of an architecture without its own template: `key=<arch>:effect`.
    pub key: String,
    pub effect: String,
    /// The taint of an architecture with `[architecture_tolerations.<arch>]`: its first
    /// template's key, value (else the architecture) and effect.
    pub architecture_taints: BTreeMap<String, TaintSpec>,
    /// Taint architectures that are neither default nor supported (`nodes taint --force`).
    pub force: bool,
    /// Every key of the toleration templates: a taint under one of these is an architecture
    /// taint (what the node watch reads, and what `serve` warns about).
    pub taint_keys: BTreeSet<String>,
}

impl TaintPolicy {
    /// The taints that match the decision policy's toleration templates.
    pub(crate) fn from_policy(policy: &Policy) -> Self {
        // A taint needs an effect; an empty toleration effect (all effects) taints NoSchedule.
        let effect_of = |effect: &str| {
            if effect.is_empty() {
                "NoSchedule".to_owned()
            } else {
                effect.to_owned()
            }
        };
        let architecture_taints = policy
            .architecture_tolerations
            .iter()
            .filter_map(|(arch, templates)| {
                let first = templates.first()?;
                let value = match first.operator {
                    TolerationOperator::Equal => {
                        first.value.clone().unwrap_or_else(|| arch.clone())
                    }
                    TolerationOperator::Exists => arch.clone(),
                };
                Some((
                    arch.clone(),
                    TaintSpec {
                        key: first.key.clone(),
                        value,
                        effect: effect_of(&first.effect),
                    },
                ))
            })
            .collect();
        Self {
            default_architectures: policy.default_architectures.clone(),
            supported_architectures: policy.supported_architectures.clone(),
            key: policy.toleration.key.clone(),
            effect: effect_of(&policy.toleration.effect),
            architecture_taints,
            force: false,
            taint_keys: policy.taint_keys(),
        }
    }

    /// The taint `arch`'s nodes should carry; `None` for a default architecture.
    fn taint_for(&self, arch: &str) -> Option<TaintSpec> {
        if self.default_architectures.contains(arch) {
            return None;
        }
        Some(
            self.architecture_taints
                .get(arch)
                .cloned()
                .unwrap_or_else(|| TaintSpec {
                    key: self.key.clone(),
                    value: arch.to_owned(),
                    effect: self.effect.clone(),
                }),
        )
    }

    /// Whether `arch` is neither default nor supported: tainting it fences its pool off.
    pub(crate) fn is_unplanned(&self, arch: &str) -> bool {
        !self.default_architectures.contains(arch) && !self.supported_architectures.contains(arch)
    }
}

/// Nodes of an architecture that is neither default nor supported and that already carry one
/// of the policy's taint keys: a pool no Pod will ever get a toleration for. `serve` warns.
pub(crate) fn fenced_off_nodes<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    policy: &TaintPolicy,
) -> Vec<(String, String, TaintSpec)> {
    let mut out = Vec::new();
    for node in nodes {
        let Some(arch) = node_architecture(node) else {
            continue;
        };
        if !policy.is_unplanned(&arch) {
            continue;
        }
        for taint in taints(node) {
            if policy.taint_keys.contains(&taint.key) {
                out.push((
                    name(node),
                    arch.clone(),
                    TaintSpec {
                        key: taint.key.clone(),
                        value: taint.value.clone().unwrap_or_default(),
                        effect: taint.effect.clone(),
                    },
                ));
            }
        }
    }
    out
}

/// What to do on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePlan {
    pub node: String,
    /// `None` when the node says neither by label nor by kubelet.
    pub architecture: Option<String>,
    pub(crate) add: Vec<TaintSpec>,
    pub(crate) remove: Vec<TaintSpec>,
    /// The managed-taints annotation after the change.
    managed_after: Vec<TaintSpec>,
    managed_before: Vec<TaintSpec>,
    /// Why nothing changes, for the plan's output.
    pub(crate) note: String,
    /// Set when the node would need a taint for an architecture that is neither default nor
    /// supported, and the policy does not force it: why it is not tainted.
    pub(crate) refused: Option<String>,
}

impl NodePlan {
    pub fn changes(&self) -> bool {
        !self.add.is_empty() || !self.remove.is_empty() || self.managed_after != self.managed_before
    }
}

fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or(&[])
}

fn managed(node: &Node) -> Vec<TaintSpec> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MANAGED_ANNOTATION))
        .map(|v| v.split(',').filter_map(TaintSpec::parse).collect())
        .unwrap_or_default()
}

fn name(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

/// The plan that makes `node` carry exactly the taint its architecture calls for, touching only
/// taints tolerable manages.
pub(crate) fn plan_taint(node: &Node, policy: &TaintPolicy) -> NodePlan {
    let arch = node_architecture(node);
    let existing = taints(node);
    let managed_before = managed(node);
    let desired = arch.as_deref().and_then(|a| policy.taint_for(a));
    let refused = arch
        .as_deref()
        .filter(|a| !policy.force && policy.is_unplanned(a))
        .map(|a| {
            format!(
                "{a} is neither in default_architectures nor in supported_architectures: no Pod \
                 would get a toleration for its taint (add it to one of them, or pass --force)"
            )
        });
    let present = |spec: &TaintSpec| existing.iter().any(|t| spec.matches(t));
    let mut plan = NodePlan {
        node: name(node),
        architecture: arch.clone(),
        add: Vec::new(),
        remove: Vec::new(),
        managed_after: Vec::new(),
        managed_before: managed_before.clone(),
        note: String::new(),
        refused: None,
    };
    for spec in managed_before.iter().filter(|s| present(s)) {
        if Some(spec) == desired.as_ref() {
            plan.managed_after.push(spec.clone());
        } else {
            plan.remove.push(spec.clone());
        }
    }
    if let (Some(spec), Some(why)) = (&desired, refused) {
        if !present(spec) {
            plan.note = format!("not tainted with {spec}: {why}");
            plan.refused = Some(why);
        }
    } else if let Some(spec) = desired {
        if !present(&spec) {
            plan.managed_after.push(spec.clone());
            plan.add.push(spec);
        } else if !plan.managed_after.contains(&spec) {
            plan.note = format!("{spec} already there (not managed by tolerable)");
        } else {
            plan.note = format!("{spec} already there");
        }
    } else if arch.is_none() {
        plan.note = "architecture unknown (no kubernetes.io/arch label, no kubelet report)".into();
    } else {
        plan.note = "default architecture".into();
    }
    plan
}

/// The plan that removes every taint tolerable manages on `node`, and nothing else.
pub(crate) fn plan_untaint(node: &Node) -> NodePlan {
    let existing = taints(node);
    let managed_before = managed(node);
    let remove: Vec<TaintSpec> = managed_before
        .iter()
        .filter(|s| existing.iter().any(|t| s.matches(t)))
        .cloned()
        .collect();
    NodePlan {
        node: name(node),
        architecture: node_architecture(node),
        note: if remove.is_empty() {
            "no taint managed by tolerable".into()
        } else {
            String::new()
        },
        add: Vec::new(),
        remove,
        managed_after: Vec::new(),
        managed_before,
        refused: None,
    }
}

/// A JSON Patch applying `plan` to `node`, guarded by its resourceVersion: `spec.taints` is an
/// atomic list (a merge or apply patch would replace other owners' taints), so only the taints in
/// the plan are added or removed, and a concurrent change makes the API server refuse the patch.
pub(crate) fn patch_for(node: &Node, plan: &NodePlan) -> Vec<Operation> {
    let version = node.metadata.resource_version.clone().unwrap_or_default();
    let mut ops = vec![Operation::test(
        "/metadata/resourceVersion",
        PatchValue::Text(version),
    )];
    let existing = taints(node);
    let mut removals: Vec<usize> = existing
        .iter()
        .enumerate()
        .filter(|(_, t)| plan.remove.iter().any(|s| s.matches(t)))
        .map(|(i, _)| i)
        .collect();
    removals.sort_unstable_by(|a, b| b.cmp(a));
    ops.extend(
        removals
            .iter()
            .map(|i| Operation::remove(format!("/spec/taints/{i}"))),
    );
    let has_list = node.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some();
    if !plan.add.is_empty() {
        if has_list {
            ops.extend(
                plan.add
                    .iter()
                    .map(|s| Operation::add("/spec/taints/-", PatchValue::Taint(s.to_taint()))),
            );
        } else {
            let list = plan.add.iter().map(TaintSpec::to_taint).collect();
            ops.push(Operation::add("/spec/taints", PatchValue::Taints(list)));
        }
    }
    let annotations = node.metadata.annotations.as_ref();
    let annotation_path = format!(
        "/metadata/annotations/{}",
        pointer_token(MANAGED_ANNOTATION)
    );
    let value = plan
        .managed_after
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    if !plan.managed_after.is_empty() {
        ops.push(match annotations {
            Some(_) => Operation::add(annotation_path, PatchValue::Text(value)),
            None => Operation::add(
                "/metadata/annotations",
                PatchValue::Map(BTreeMap::from([(MANAGED_ANNOTATION, value)])),
            ),
        });
    } else if !plan.managed_before.is_empty()
        && annotations.is_some_and(|a| a.contains_key(MANAGED_ANNOTATION))
    {
        ops.push(Operation::remove(annotation_path));
    }
    ops
}

/// A DaemonSet as `nodes plan` checks it: `namespace/name`, its template's tolerations and the
/// nodes its Pods run on.
#[derive(Clone, Debug, Default)]
pub(crate) struct AgentPods {
    pub(crate) name: String,
    pub(crate) tolerations: Vec<Toleration>,
    pub(crate) nodes: BTreeSet<String>,
}

/// The DaemonSets whose Pods run on nodes the plans would taint with a taint their template
/// does not tolerate, one line each: the running Pod stays under `NoSchedule` (`NoExecute`
/// evicts it), but the DaemonSet's controller does not recreate it there once it is deleted or
/// the DaemonSet rolls, nor give a node that joins the pool one.
pub(crate) fn agents_losing_nodes(plans: &[NodePlan], agents: &[AgentPods]) -> Vec<String> {
    let mut lines = Vec::new();
    for agent in agents {
        // taints not tolerated → the nodes they would be added to
        let mut losing: BTreeMap<Vec<String>, Vec<&str>> = BTreeMap::new();
        for plan in plans.iter().filter(|p| agent.nodes.contains(&p.node)) {
            let added: Vec<Taint> = plan.add.iter().map(TaintSpec::to_taint).collect();
            let untolerated = untolerated(&agent.tolerations, &added);
            if !untolerated.is_empty() {
                losing.entry(untolerated).or_default().push(&plan.node);
            }
        }
        for (taints, nodes) in losing {
            lines.push(format!(
                "DaemonSet {}: its Pods on {} would not come back once tainted: its template does \
                 not tolerate {}; {} before tainting",
                agent.name,
                nodes.join(", "),
                taints.join(", "),
                REMEDY
            ));
        }
    }
    lines
}

/// `ops` as the `json-patch` crate's type (what the Kubernetes client sends).
pub(crate) fn to_json_patch(ops: &[Operation]) -> json_patch::Patch {
    let value = serde_json::to_value(ops).expect("operations serialize");
    serde_json::from_value(value).expect("our operations are a JSON Patch")
}

// What a DaemonSet's template does not tolerate (here, not in `audit`: `nodes plan` and
// `audit` both read it, and `cluster` imports this module).

/// What the reasons say to do (the template, since the controller reads only that).
pub(crate) const REMEDY: &str = "add a toleration for it to the DaemonSet's Pod template";

/// `PreferNoSchedule` only asks the scheduler; the DaemonSet controller ignores it.
pub(crate) fn keeps_pods_off(effect: &str) -> bool {
    matches!(effect, "NoSchedule" | "NoExecute")
}

/// `key=value:effect`, as `kubectl taint` writes it.
pub(crate) fn taint_text(taint: &Taint) -> String {
    format!(
        "{}={}:{}",
        taint.key,
        taint.value.as_deref().unwrap_or(""),
        taint.effect
    )
}

/// The taints of `node` that `template` does not tolerate.
pub(crate) fn untolerated(tolerations: &[Toleration], taints: &[Taint]) -> Vec<String> {
    taints
        .iter()
        .filter(|taint| keeps_pods_off(&taint.effect))
        .filter(|taint| !tolerations.iter().any(|t| tolerates(t, taint)))
        .map(taint_text)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutate::ARCH_LABEL;
    use serde_json::json;

    fn nodes() -> Vec<Node> {
        let list: k8s_openapi::List<Node> =
            serde_json::from_str(include_str!("../tests/data/kube-api/node-list.body.json"))
                .unwrap();
        list.items
    }

    fn policy() -> TaintPolicy {
        TaintPolicy {
            default_architectures: BTreeSet::from(["amd64".to_owned()]),
            supported_architectures: BTreeSet::from(["arm64".to_owned(), "s390x".to_owned()]),
            key: ARCH_LABEL.into(),
            effect: "NoSchedule".into(),
            architecture_taints: BTreeMap::new(),
            force: false,
            taint_keys: BTreeSet::from([ARCH_LABEL.to_owned()]),
        }
    }

    fn node(name: &str) -> Node {
        nodes()
            .into_iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
            .unwrap()
    }

    fn apply(node: &Node, ops: Vec<Operation>) -> Node {
        let mut value = serde_json::to_value(node).unwrap();
        json_patch::patch(&mut value, &to_json_patch(&ops)).unwrap();
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn plan_on_the_recorded_mixed_cluster() {
        // amd-1: default; arm-1: already tainted by hand; s390-1: tainted by hand too;
        // bare-1: no arch label, its kubelet says amd64.
        let plans: Vec<NodePlan> = nodes().iter().map(|n| plan_taint(n, &policy())).collect();
        let summary: Vec<(&str, Option<&str>, bool)> = plans
            .iter()
            .map(|p| (p.node.as_str(), p.architecture.as_deref(), p.changes()))
            .collect();
        assert_eq!(
            summary,
            [
                ("amd-1", Some("amd64"), false),
                ("arm-1", Some("arm64"), false),
                ("bare-1", Some("amd64"), false),
                ("s390-1", Some("s390x"), false),
            ]
        );
        assert!(
            plans[1].note.contains("not managed by tolerable"),
            "{}",
            plans[1].note
        );

        // With only arm64 default, amd64 nodes (including the unlabelled one) get tainted.
        let mut p = policy();
        p.default_architectures = BTreeSet::from(["arm64".to_owned()]);
        p.supported_architectures = BTreeSet::from(["amd64".to_owned(), "s390x".to_owned()]);
        let plan = plan_taint(&node("bare-1"), &p);
        assert_eq!(
            plan.add,
            [TaintSpec {
                key: ARCH_LABEL.into(),
                value: "amd64".into(),
                effect: "NoSchedule".into()
            }]
        );
    }

    #[test]
    fn taint_then_taint_again_then_untaint_leaves_hand_made_taints() {
        let mut p = policy();
        p.default_architectures = BTreeSet::from(["arm64".to_owned()]);
        p.supported_architectures = BTreeSet::from(["amd64".to_owned(), "s390x".to_owned()]);
        let original = node("amd-1"); // carries node.kubernetes.io/not-ready
        let plan = plan_taint(&original, &p);
        assert!(plan.changes());
        let tainted = apply(&original, patch_for(&original, &plan));
        let keys: Vec<String> = taints(&tainted)
            .iter()
            .map(|t| format!("{}={}", t.key, t.value.clone().unwrap_or_default()))
            .collect();
        assert_eq!(
            keys,
            ["node.kubernetes.io/not-ready=", "kubernetes.io/arch=amd64"]
        );
        assert_eq!(
            tainted.metadata.annotations.as_ref().unwrap()[MANAGED_ANNOTATION],
            "kubernetes.io/arch=amd64:NoSchedule"
        );
        // Idempotent.
        assert!(!plan_taint(&tainted, &p).changes());
        // Untaint removes only the managed taint and the annotation.
        let plan = plan_untaint(&tainted);
        let untainted = apply(&tainted, patch_for(&tainted, &plan));
        let keys: Vec<&str> = taints(&untainted).iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["node.kubernetes.io/not-ready"]);
        assert!(!untainted
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(MANAGED_ANNOTATION));
        // A hand-made arch taint is never removed by untaint.
        assert!(!plan_untaint(&node("arm-1")).changes());
    }

    #[test]
    fn a_managed_taint_that_is_no_longer_wanted_is_removed() {
        let mut p = policy();
        p.default_architectures = BTreeSet::from(["arm64".to_owned()]);
        p.supported_architectures = BTreeSet::from(["amd64".to_owned(), "s390x".to_owned()]);
        let original = node("amd-1");
        let tainted = apply(&original, patch_for(&original, &plan_taint(&original, &p)));
        // amd64 becomes a default architecture again.
        let plan = plan_taint(&tainted, &policy());
        assert_eq!(plan.remove.len(), 1);
        let cleaned = apply(&tainted, patch_for(&tainted, &plan));
        assert_eq!(taints(&cleaned).len(), 1);
    }

    #[test]
    fn the_patch_is_guarded_by_the_resource_version() {
        let mut p = policy();
        p.default_architectures = BTreeSet::new();
        p.supported_architectures = BTreeSet::from(["amd64".to_owned()]);
        let n = node("amd-1");
        let ops = patch_for(&n, &plan_taint(&n, &p));
        assert_eq!(
            serde_json::to_value(&ops[0]).unwrap(),
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": n.metadata.resource_version.clone().unwrap()})
        );
        let mut stale = n.clone();
        stale.metadata.resource_version = Some("1".into());
        let mut value = serde_json::to_value(&n).unwrap();
        let patch = to_json_patch(&patch_for(&stale, &plan_taint(&stale, &p)));
        assert!(
            json_patch::patch(&mut value, &patch).is_err(),
            "a stale patch must not apply"
        );
    }

    #[test]
    fn taint_specs_round_trip() {
        for text in [
            "kubernetes.io/arch=arm64:NoSchedule",
            "k:NoExecute",
            "a=b=c:PreferNoSchedule",
        ] {
            assert_eq!(
                TaintSpec::parse(text)
                    .unwrap()
                    .to_string()
                    .replace("k=:", "k:"),
                text
            );
        }
        assert!(TaintSpec::parse("no-effect").is_none());
        assert!(TaintSpec::parse(":NoSchedule").is_none());
    }

    #[test]
    fn an_architecture_nobody_tolerates_is_not_tainted_unless_forced() {
        let s390: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s390-9", "labels": {ARCH_LABEL: "s390x"}},
            "spec": {},
        }))
        .unwrap();
        let mut p = policy();
        p.supported_architectures = BTreeSet::from(["arm64".to_owned()]);
        let plan = plan_taint(&s390, &p);
        assert!(!plan.changes(), "{plan:?}");
        let why = plan.refused.as_deref().unwrap();
        assert!(why.contains("s390x is neither"), "{why}");
        assert!(plan.note.contains("kubernetes.io/arch=s390x:NoSchedule"));
        p.force = true;
        let plan = plan_taint(&s390, &p);
        assert_eq!(plan.add.len(), 1);
        assert!(plan.refused.is_none());
        // serve's warning: such nodes that are already tainted.
        let fenced = fenced_off_nodes(&nodes(), &{
            let mut p = policy();
            p.supported_architectures = BTreeSet::from(["arm64".to_owned()]);
            p
        });
        assert_eq!(
            fenced
                .iter()
                .map(|(n, a, t)| format!("{n} {a} {t}"))
                .collect::<Vec<_>>(),
            ["s390-1 s390x kubernetes.io/arch=s390x:NoSchedule"]
        );
    }

    #[test]
    fn a_per_architecture_template_names_the_taint() {
        let mut decision = crate::mutate::Policy::default();
        decision.architecture_tolerations.insert(
            "arm64".into(),
            vec![crate::mutate::TolerationTemplate {
                key: "arm64".into(),
                operator: TolerationOperator::Equal,
                value: Some("true".into()),
                effect: String::new(),
                toleration_seconds: None,
            }],
        );
        let p = TaintPolicy::from_policy(&decision);
        let arm = serde_json::from_value::<Node>(serde_json::json!({
            "metadata": {"name": "a", "labels": {ARCH_LABEL: "arm64"}}, "spec": {}
        }))
        .unwrap();
        assert_eq!(
            plan_taint(&arm, &p).add[0].to_string(),
            "arm64=true:NoSchedule"
        );
    }

    #[test]
    fn daemonsets_on_nodes_about_to_be_tainted_are_named_unless_they_tolerate_it() {
        // arm64 is the default pool here: amd-1 and bare-1 (amd64) would be tainted.
        let p = TaintPolicy {
            default_architectures: BTreeSet::from(["arm64".to_owned()]),
            supported_architectures: BTreeSet::from(["amd64".to_owned()]),
            ..policy()
        };
        let plans: Vec<NodePlan> = nodes().iter().map(|n| plan_taint(n, &p)).collect();
        let on = |nodes: &[&str]| nodes.iter().map(|n| (*n).to_owned()).collect();
        let exporter = AgentPods {
            name: "monitoring/node-exporter".into(),
            tolerations: Vec::new(),
            nodes: on(&["amd-1", "arm-1", "bare-1"]),
        };
        let tolerating = AgentPods {
            name: "logging/fluent-bit".into(),
            tolerations: serde_json::from_value(json!([
                {"key": ARCH_LABEL, "operator": "Exists", "effect": "NoSchedule"}
            ]))
            .unwrap(),
            nodes: on(&["amd-1", "arm-1"]),
        };
        let elsewhere = AgentPods {
            name: "kube-system/arm-only".into(),
            nodes: on(&["arm-1"]),
            ..AgentPods::default()
        };
        assert_eq!(
            agents_losing_nodes(&plans, &[exporter, tolerating, elsewhere]),
            ["DaemonSet monitoring/node-exporter: its Pods on amd-1, bare-1 would not come back \
              once tainted: its template does not tolerate kubernetes.io/arch=amd64:NoSchedule; \
              add a toleration for it to the DaemonSet's Pod template before tainting"]
        );
    }
}
