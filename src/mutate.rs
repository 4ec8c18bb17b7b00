//! The decision core: a Pod, what the registries said about its images, and the policy go in; a
//! decision comes out. Pure: no I/O, no clock, no logging — the webhook, `tolerable review` and
//! the table tests all call [`decide`].

pub mod facts;
pub mod patch;
pub mod platform;
pub mod review;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{Node, NodeSelectorTerm, Pod, Taint, Toleration};

pub use self::facts::{ImageFact, ImageFacts, LookupFailure, Provenance, Staleness};

/// The node label the kubelet sets to the node's architecture.
pub const ARCH_LABEL: &str = "kubernetes.io/arch";
/// The node label the kubelet sets to the node's operating system.
pub const OS_LABEL: &str = "kubernetes.io/os";
/// Label or annotation (`"true"`) that makes tolerable leave a Pod alone.
pub const SKIP_KEY: &str = "tolerable.io/skip";
/// Label or annotation naming the architecture a Pod prefers (`none` for no preference);
/// overrides `preferred_architecture`.
pub const PREFERRED_KEY: &str = "tolerable.io/preferred-architecture";
/// Annotation tolerable writes to explain what it decided and from which platforms.
pub const DECISION_ANNOTATION: &str = "tolerable.io/decision";
/// Longest decision summary (and so annotation, deny message and log line) written: the API
/// server limits a Pod's annotations to 256 KiB in all, and a Pod may name many images of many
/// platforms.
pub const MAX_SUMMARY_BYTES: usize = 4 << 10;

/// `text` cut at `max` bytes (on a character boundary) with a marker saying so.
pub fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let dropped = text.len() - end;
        text.truncate(end);
        let _ = write!(text, "…[{dropped} more bytes]");
    }
    text
}

/// Weight of the preferred-architecture term (1–100): a nudge other preferences can outweigh.
pub const PREFERRED_WEIGHT: i32 = 50;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Steering {
    Off,
    NodeSelector,
    NodeAffinity,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnNoCommonArchitecture {
    Deny,
    Warn,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnLookupFailure {
    Allow,
    Deny,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TolerationOperator {
    Equal,
    Exists,
}

/// The toleration added for an architecture's taint: `key`, `operator`, `effect`, and as the
/// value `value` or else the architecture (no value with `Exists`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TolerationTemplate {
    pub key: String,
    pub operator: TolerationOperator,
    /// `None`: the architecture's name (`kubernetes.io/arch=arm64`). Per-architecture templates
    /// may name another (`arm64=true`).
    pub value: Option<String>,
    /// Empty means every effect.
    pub effect: String,
    pub toleration_seconds: Option<i64>,
}

impl TolerationTemplate {
    /// The taint value this template stands for on `arch`'s nodes.
    fn value_for<'a>(&'a self, arch: &'a str) -> &'a str {
        self.value.as_deref().unwrap_or(arch)
    }

    pub fn for_architecture(&self, arch: &str) -> Toleration {
        Toleration {
            key: Some(self.key.clone()),
            operator: Some(
                match self.operator {
                    TolerationOperator::Equal => "Equal",
                    TolerationOperator::Exists => "Exists",
                }
                .to_owned(),
            ),
            value: match self.operator {
                TolerationOperator::Equal => Some(self.value_for(arch).to_owned()),
                TolerationOperator::Exists => None,
            },
            effect: (!self.effect.is_empty()).then(|| self.effect.clone()),
            toleration_seconds: self.toleration_seconds,
        }
    }

    /// Whether `existing` already tolerates the taint this template stands for (Kubernetes'
    /// matching rules), so adding ours would be redundant.
    pub fn is_tolerated_by(&self, existing: &Toleration, arch: &str) -> bool {
        // A toleration that expires sooner than ours does not cover ours.
        let seconds_cover = match (existing.toleration_seconds, self.toleration_seconds) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(theirs), Some(ours)) => theirs >= ours,
        };
        tolerates_parts(
            existing,
            &self.key,
            Some(self.value_for(arch)),
            &self.effect,
        ) && seconds_cover
    }
}

/// `key=value:effect` as `kubectl taint` writes it (`key:effect` without a value, no `:effect`
/// for every effect): how the decision annotation names a toleration.
struct TolerationText<'a>(&'a Toleration);

impl std::fmt::Display for TolerationText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.0;
        f.write_str(t.key.as_deref().unwrap_or("*"))?;
        if let Some(value) = t.value.as_deref().filter(|v| !v.is_empty()) {
            write!(f, "={value}")?;
        }
        if let Some(effect) = t.effect.as_deref().filter(|e| !e.is_empty()) {
            write!(f, ":{effect}")?;
        }
        Ok(())
    }
}

/// The cluster's node pools as the node watch sees them: for each architecture present, the
/// taints its nodes carry under the toleration templates' keys (`kubernetes.io/arch` by
/// default), and each node's architecture (for Pods already bound to a node).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodePools {
    pub architectures: BTreeMap<String, Vec<Taint>>,
    /// Node name → architecture.
    pub nodes: BTreeMap<String, String>,
}

impl NodePools {
    /// Pools from nodes: a node's architecture is its `kubernetes.io/arch` label, else what its
    /// kubelet reports; only taints whose key is one of `taint_keys` count.
    pub fn from_nodes<'a>(
        nodes: impl IntoIterator<Item = &'a Node>,
        taint_keys: &BTreeSet<String>,
    ) -> Self {
        let mut pools = Self::default();
        for node in nodes {
            let Some(arch) = node_architecture(node) else {
                continue;
            };
            if let Some(name) = &node.metadata.name {
                pools.nodes.insert(name.clone(), arch.clone());
            }
            let taints = pools.architectures.entry(arch).or_default();
            for taint in node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .into_iter()
                .flatten()
            {
                if taint_keys.contains(&taint.key) && !taints.iter().any(|t| same_taint(t, taint)) {
                    taints.push(Taint {
                        time_added: None,
                        ..taint.clone()
                    });
                }
            }
        }
        pools
    }

    pub fn taints(&self, arch: &str) -> &[Taint] {
        self.architectures.get(arch).map_or(&[], Vec::as_slice)
    }
}

/// Whether two taints are the same taint (key, value and effect; an absent value is empty).
pub fn same_taint(a: &Taint, b: &Taint) -> bool {
    a.key == b.key
        && a.value.as_deref().unwrap_or("") == b.value.as_deref().unwrap_or("")
        && a.effect == b.effect
}

/// A node's architecture: its `kubernetes.io/arch` label, else what its kubelet reports.
pub fn node_architecture(node: &Node) -> Option<String> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(ARCH_LABEL))
        .cloned()
        .or_else(|| {
            node.status
                .as_ref()?
                .node_info
                .as_ref()
                .map(|i| i.architecture.clone())
        })
        .filter(|a| !a.is_empty())
}

/// Kubernetes' rule: whether `toleration` tolerates `taint`.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    tolerates_parts(
        toleration,
        &taint.key,
        taint.value.as_deref(),
        &taint.effect,
    )
}

/// [`tolerates`] for a taint given by its parts.
fn tolerates_parts(
    toleration: &Toleration,
    taint_key: &str,
    taint_value: Option<&str>,
    taint_effect: &str,
) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or("");
    if !effect.is_empty() && effect != taint_effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    let exists = toleration.operator.as_deref() == Some("Exists");
    if key.is_empty() {
        return exists;
    }
    key == taint_key
        && (exists || toleration.value.as_deref().unwrap_or("") == taint_value.unwrap_or(""))
}

/// The toleration for exactly `taint`.
fn toleration_for(taint: &Taint, seconds: Option<i64>) -> Toleration {
    let value = taint.value.clone().filter(|v| !v.is_empty());
    Toleration {
        key: Some(taint.key.clone()),
        operator: Some(if value.is_some() { "Equal" } else { "Exists" }.to_owned()),
        value,
        effect: Some(taint.effect.clone()),
        toleration_seconds: seconds.filter(|_| taint.effect == "NoExecute"),
    }
}

/// A preferred architecture and its weight (1–100, as the scheduler takes them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightedArchitecture {
    pub architecture: String,
    pub weight: i32,
}

/// What the operator configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Architectures of the cluster's tainted pools: the only ones tolerated.
    pub supported_architectures: BTreeSet<String>,
    /// Architectures of the untainted pools. With the supported ones, the architectures that
    /// may appear in the cluster at any time (an autoscaler adds nodes from zero).
    pub default_architectures: BTreeSet<String>,
    /// `[tolerations]`: the template for every architecture without its own.
    pub toleration: TolerationTemplate,
    /// `[architecture_tolerations.<arch>]`: templates that replace `toleration` for one
    /// architecture (a provider's taint, several taints).
    pub architecture_tolerations: BTreeMap<String, Vec<TolerationTemplate>>,
    pub steering: Steering,
    /// Preferred terms, in the order written; empty for no preference.
    pub preferred_architectures: Vec<WeightedArchitecture>,
    pub on_no_common_architecture: OnNoCommonArchitecture,
    pub on_lookup_failure: OnLookupFailure,
    pub skip_namespaces: BTreeSet<String>,
    /// Most containers (init, regular, ephemeral) and image volumes a Pod may have for
    /// tolerable to look its images up.
    pub max_containers_per_pod: usize,
    /// Most distinct images looked up for one Pod.
    pub max_images_per_pod: usize,
}

impl Policy {
    /// The toleration templates for `arch`: its own, else the default one.
    pub fn templates_for(&self, arch: &str) -> &[TolerationTemplate] {
        self.architecture_tolerations
            .get(arch)
            .map_or(std::slice::from_ref(&self.toleration), Vec::as_slice)
    }

    /// Every key a template tolerates: the node watch keeps the taints under these keys.
    pub fn taint_keys(&self) -> BTreeSet<String> {
        std::iter::once(&self.toleration)
            .chain(self.architecture_tolerations.values().flatten())
            .map(|t| t.key.clone())
            .collect()
    }

    /// The architectures that can appear in the cluster: supported and default ones whatever
    /// nodes exist now, and those the node watch sees (repeats possible).
    fn possible_architectures<'a>(
        &'a self,
        pools: Option<&'a NodePools>,
    ) -> impl Iterator<Item = &'a String> {
        self.supported_architectures
            .iter()
            .chain(&self.default_architectures)
            .chain(pools.into_iter().flat_map(|p| p.architectures.keys()))
    }
}

impl Default for Policy {
    /// The documented defaults of `tolerable.toml`: tolerate the arm64 pools with
    /// `kubernetes.io/arch=arm64:NoSchedule`, amd64 pools untainted, steer with required node
    /// affinity, deny a Pod whose images share no architecture, allow one whose images could not
    /// be looked up, leave kube-system alone.
    fn default() -> Self {
        Self {
            supported_architectures: BTreeSet::from(["arm64".to_owned()]),
            default_architectures: BTreeSet::from(["amd64".to_owned()]),
            toleration: TolerationTemplate {
                key: ARCH_LABEL.into(),
                operator: TolerationOperator::Equal,
                value: None,
                effect: "NoSchedule".into(),
                toleration_seconds: None,
            },
            architecture_tolerations: BTreeMap::new(),
            steering: Steering::NodeAffinity,
            preferred_architectures: Vec::new(),
            on_no_common_architecture: OnNoCommonArchitecture::Deny,
            on_lookup_failure: OnLookupFailure::Allow,
            skip_namespaces: BTreeSet::from(["kube-system".to_owned()]),
            max_containers_per_pod: 1000,
            max_images_per_pod: 100,
        }
    }
}

/// One container's image, as the Pod spec writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerImage {
    pub container: String,
    pub image: String,
}

/// Every image of the Pod: init, regular and ephemeral containers. A container without an image
/// is an error naming it.
pub fn images_of(pod: &Pod) -> Result<Vec<ContainerImage>, String> {
    let Some(spec) = &pod.spec else {
        return Err("the Pod has no spec".into());
    };
    let mut out = Vec::new();
    let named =
        |kind: &str, name: &str, image: &Option<String>| match image.as_deref().map(str::trim) {
            Some(image) if !image.is_empty() => Ok(ContainerImage {
                container: name.to_owned(),
                image: image.to_owned(),
            }),
            _ => Err(format!("{kind} {name:?} has no image")),
        };
    for c in spec.init_containers.iter().flatten() {
        out.push(named("init container", &c.name, &c.image)?);
    }
    for c in &spec.containers {
        out.push(named("container", &c.name, &c.image)?);
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        out.push(named("ephemeral container", &c.name, &c.image)?);
    }
    if out.is_empty() {
        return Err("the Pod has no containers".into());
    }
    // Image volumes (Kubernetes 1.31+): the kubelet pulls them for the node's platform, so they
    // count like containers.
    for v in spec.volumes.iter().flatten() {
        if let Some(source) = &v.image {
            let name = format!("volume {}", v.name);
            out.push(named("image volume", &name, &source.reference)?);
        }
    }
    Ok(out)
}

/// Why a Pod is answered the way it is, for metrics and logs (a bounded set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Changes made (or already in place from an earlier invocation).
    Decided,
    /// Opted out, skipped namespace, not a Pod CREATE.
    Skipped,
    /// Some image's platforms are unknown; allowed unchanged.
    LookupFailed,
    /// No architecture common to all images; allowed with a warning.
    NoCommonArchitecture,
    Denied,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Self::Decided => "decided",
            Self::Skipped => "skipped",
            Self::LookupFailed => "lookup_failed",
            Self::NoCommonArchitecture => "no_common_architecture",
            Self::Denied => "denied",
        }
    }
}

/// What to do with the Pod. Changes are described, not yet encoded; [`patch`] turns them into a
/// JSON Patch against the same Pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// `Some(message)` rejects the Pod.
    pub deny: Option<String>,
    pub tolerations: Vec<Toleration>,
    /// Pin `kubernetes.io/arch` in the nodeSelector.
    pub node_selector: Option<String>,
    /// AND `kubernetes.io/arch In (…)` into every required nodeSelectorTerm.
    pub required_architectures: Option<Vec<String>>,
    /// Add a preferred term for each of these architectures.
    pub preferred_architectures: Vec<WeightedArchitecture>,
    /// New value of the decision annotation, when it differs from the Pod's.
    pub annotation: Option<String>,
    pub warnings: Vec<String>,
    /// One line: what was decided and why.
    pub summary: String,
    pub outcome: Option<Outcome>,
}

impl Decision {
    fn skipped(summary: impl Into<String>) -> Self {
        Self {
            summary: summary.into(),
            outcome: Some(Outcome::Skipped),
            ..Self::default()
        }
    }

    pub fn outcome(&self) -> Outcome {
        self.outcome.unwrap_or(Outcome::Decided)
    }

    /// Whether the decision changes the Pod.
    pub fn changes_pod(&self) -> bool {
        !self.tolerations.is_empty()
            || self.node_selector.is_some()
            || self.required_architectures.is_some()
            || !self.preferred_architectures.is_empty()
            || self.annotation.is_some()
    }
}

fn label_or_annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    let meta = &pod.metadata;
    meta.labels
        .as_ref()
        .and_then(|l| l.get(key))
        .or_else(|| meta.annotations.as_ref().and_then(|a| a.get(key)))
        .map(String::as_str)
}

/// The OS the Pod will run on: its `kubernetes.io/os` node selector, else `spec.os`, else linux.
pub fn pod_os(pod: &Pod) -> String {
    let spec = pod.spec.as_ref();
    spec.and_then(|s| s.node_selector.as_ref())
        .and_then(|n| n.get(OS_LABEL))
        .cloned()
        .or_else(|| spec.and_then(|s| s.os.as_ref()).map(|os| os.name.clone()))
        .unwrap_or_else(|| "linux".to_owned())
}

/// How the Pod itself already constrains `kubernetes.io/arch`.
#[derive(Debug, PartialEq, Eq)]
enum ExistingConstraint {
    None,
    /// Exactly what tolerable adds for this set (an earlier invocation's work).
    Ours,
    /// The Pod's own; `allowed` when it can be read as a set of architectures.
    Theirs {
        allowed: Option<BTreeSet<String>>,
    },
}

fn required_terms(pod: &Pod) -> Option<&Vec<NodeSelectorTerm>> {
    pod.spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .map(|r| &r.node_selector_terms)
}

fn existing_arch_constraint(
    pod: &Pod,
    steering: Steering,
    common: &[String],
) -> ExistingConstraint {
    let selector = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref())
        .and_then(|n| n.get(ARCH_LABEL));
    if let Some(arch) = selector {
        if steering == Steering::NodeSelector && common.len() == 1 && *arch == common[0] {
            return ExistingConstraint::Ours;
        }
        return ExistingConstraint::Theirs {
            allowed: Some(BTreeSet::from([arch.clone()])),
        };
    }
    let Some(terms) = required_terms(pod) else {
        return ExistingConstraint::None;
    };
    let arch_expressions: Vec<Vec<_>> = terms
        .iter()
        .map(|t| {
            t.match_expressions
                .iter()
                .flatten()
                .filter(|e| e.key == ARCH_LABEL)
                .collect()
        })
        .collect();
    if arch_expressions.iter().all(Vec::is_empty) {
        return ExistingConstraint::None;
    }
    let ours = |e: &&k8s_openapi::api::core::v1::NodeSelectorRequirement| {
        e.operator == "In" && e.values.as_deref() == Some(common)
    };
    if steering == Steering::NodeAffinity && arch_expressions.iter().all(|t| t.iter().any(ours)) {
        return ExistingConstraint::Ours;
    }
    // Readable as a set only when every term limits the arch with `In`: the union of terms.
    let mut allowed = BTreeSet::new();
    for term in &arch_expressions {
        let ins: Vec<_> = term.iter().filter(|e| e.operator == "In").collect();
        if ins.is_empty() {
            return ExistingConstraint::Theirs { allowed: None };
        }
        let mut term_allowed: BTreeSet<String> = ins[0].values.iter().flatten().cloned().collect();
        for e in &ins[1..] {
            let values: BTreeSet<String> = e.values.iter().flatten().cloned().collect();
            term_allowed = term_allowed.intersection(&values).cloned().collect();
        }
        allowed.extend(term_allowed);
    }
    ExistingConstraint::Theirs {
        allowed: Some(allowed),
    }
}

fn has_preferred_arch_term(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .is_some_and(|terms| {
            terms.iter().any(|t| {
                t.preference
                    .match_expressions
                    .iter()
                    .flatten()
                    .any(|e| e.key == ARCH_LABEL)
            })
        })
}

/// Items separated by commas, written straight into whatever formats it.
struct Joined<'a, T>(&'a [T]);

impl<T: std::fmt::Display> std::fmt::Display for Joined<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, item) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            item.fmt(f)?;
        }
        Ok(())
    }
}

/// The annotation value to write: `Some` only when it differs from what the Pod carries, so a
/// reinvocation changes nothing.
fn annotation_update(pod: &Pod, value: String) -> Option<String> {
    let current = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DECISION_ANNOTATION));
    (current != Some(&value)).then_some(value)
}

/// Where a Pod goes when the scheduler does not place it freely: steering it would only leave it
/// Pending (kubernetes/kubernetes#61886), so it gets tolerations only.
#[derive(Debug, PartialEq, Eq)]
struct FixedPlacement {
    /// Why, for the annotation.
    why: String,
    /// The node it is headed for, when the Pod names one.
    node: Option<String>,
}

fn fixed_placement(pod: &Pod) -> Option<FixedPlacement> {
    // The DaemonSet controller pins each Pod with a `matchFields metadata.name In [node]` term.
    // Only a term that is the whole selector pins the Pod: beside another term it is one of
    // several places the Pod may go.
    let pinned_node = required_terms(pod).and_then(|terms| match &terms[..] {
        [only] => only.match_fields.iter().flatten().find_map(|f| {
            let values = f.values.as_deref().unwrap_or_default();
            (f.key == "metadata.name" && f.operator == "In" && values.len() == 1)
                .then(|| values[0].clone())
        }),
        _ => None,
    });
    if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
        return Some(FixedPlacement {
            why: format!("bound to node {node}"),
            node: Some(node),
        });
    }
    let daemon_set = pod.metadata.owner_references.iter().flatten().find(|o| {
        o.kind == "DaemonSet" && o.controller == Some(true) && o.api_version.starts_with("apps/")
    });
    match (daemon_set, pinned_node) {
        (Some(owner), node) => Some(FixedPlacement {
            why: format!("owned by DaemonSet {}", owner.name),
            node,
        }),
        (None, Some(node)) => Some(FixedPlacement {
            why: format!("pinned to node {node} by metadata.name"),
            node: Some(node),
        }),
        (None, None) => None,
    }
}

/// Why tolerable leaves this Pod alone without looking at its images, if it does.
pub fn skip_reason(namespace: &str, pod: &Pod, policy: &Policy) -> Option<String> {
    if policy.skip_namespaces.contains(namespace) {
        return Some(format!("namespace {namespace} is in skip_namespaces"));
    }
    if label_or_annotation(pod, SKIP_KEY) == Some("true") {
        return Some(format!("the Pod opted out with {SKIP_KEY}=true"));
    }
    None
}

/// Decides what to do with a Pod being created in `namespace`.
pub fn decide(
    namespace: &str,
    pod: &Pod,
    images: &[ContainerImage],
    facts: &ImageFacts,
    policy: &Policy,
) -> Decision {
    decide_with_pools(namespace, pod, images, facts, policy, None)
}

/// [`decide`], knowing the cluster's node pools: a taint the nodes of a tolerated architecture
/// carry that no template tolerates is tolerated too, architectures seen on nodes count among
/// those that may appear (for steering), and a bound or DaemonSet Pod's node is known.
pub fn decide_with_pools(
    namespace: &str,
    pod: &Pod,
    images: &[ContainerImage],
    facts: &ImageFacts,
    policy: &Policy,
    pools: Option<&NodePools>,
) -> Decision {
    if let Some(reason) = skip_reason(namespace, pod, policy) {
        return Decision::skipped(reason);
    }
    let distinct = distinct_images(images);
    if let Some(reason) = over_limits(images, &distinct, policy) {
        // Not looked up at all: treated as a lookup failure (allowed unchanged, or denied).
        let deny = (policy.on_lookup_failure == OnLookupFailure::Deny)
            .then(|| format!("tolerable did not look the images up: {reason}"));
        let warning = format!("tolerable added no tolerations: {reason}");
        return deny_or_leave(deny, &reason, vec![warning], Outcome::LookupFailed);
    }
    let mut decision = decide_from_facts(pod, &distinct, facts, policy, pools);
    // A decision made on last known answers says so: the registry may have changed since.
    let stale = distinct.iter().filter_map(|image| match facts.get(*image) {
        Some(Ok(found)) => found.stale.as_ref().map(|why| format!("{image}: {why}")),
        _ => None,
    });
    decision.warnings.extend(stale);
    decision
}

/// Each image once, in the order the Pod first names it: an image several containers use is
/// described and warned about once. Linear: a hostile Pod may name tens of thousands.
pub fn distinct_images(images: &[ContainerImage]) -> Vec<&str> {
    let mut seen = std::collections::HashSet::with_capacity(images.len());
    images
        .iter()
        .map(|c| c.image.as_str())
        .filter(|image| seen.insert(*image))
        .collect()
}

/// Why the Pod names more than tolerable looks up for one admission, if it does: far above
/// real Pods, so one Pod cannot make tolerable open thousands of registry connections.
/// `distinct` is [`distinct_images`] of `images`.
pub fn over_limits(
    images: &[ContainerImage],
    distinct: &[&str],
    policy: &Policy,
) -> Option<String> {
    if images.len() > policy.max_containers_per_pod {
        return Some(format!(
            "the Pod has {} containers and image volumes, more than max_containers_per_pod ({})",
            images.len(),
            policy.max_containers_per_pod
        ));
    }
    (distinct.len() > policy.max_images_per_pod).then(|| {
        format!(
            "the Pod names {} distinct images, more than max_images_per_pod ({})",
            distinct.len(),
            policy.max_images_per_pod
        )
    })
}

fn decide_from_facts(
    pod: &Pod,
    distinct: &[&str],
    facts: &ImageFacts,
    policy: &Policy,
    pools: Option<&NodePools>,
) -> Decision {
    let known = match known_facts(distinct, facts) {
        Ok(known) => known,
        Err(failed) => return lookup_failed(&failed, policy),
    };
    let os = pod_os(pod);
    let (common, described) = common_architectures(&os, &known, policy, pools);
    if common.is_empty() {
        let message = cut(
            format!("no {os} architecture is common to all images: {described}"),
            MAX_SUMMARY_BYTES,
        );
        let deny = (policy.on_no_common_architecture == OnNoCommonArchitecture::Deny)
            .then(|| message.clone());
        let warning = format!("tolerable added no tolerations: {message}");
        return deny_or_leave(deny, &message, vec![warning], Outcome::NoCommonArchitecture);
    }
    let seen = Seen {
        pod,
        policy,
        pools,
        os: &os,
        common: &common,
    };
    let mut decision = Decision::default();
    let tolerated = seen.tolerations(&mut decision);
    let placement = fixed_placement(pod);
    let steering_note = seen.steer(placement.as_ref(), &mut decision);
    let preference_note = seen.prefer(placement.is_some(), &mut decision);

    let mut summary = String::with_capacity(160 + described.len());
    let _ = write!(summary, "{os} architectures {}; ", Joined(&common));
    write_tolerated(&mut summary, &tolerated);
    if !steering_note.is_empty() {
        summary.push_str("; ");
        summary.push_str(&steering_note);
    }
    summary.push_str(&preference_note);
    summary.push_str("; images: ");
    summary.push_str(&described);
    decision.summary = cut(summary, MAX_SUMMARY_BYTES);
    decision.annotation = annotation_update(pod, decision.summary.clone());
    decision.outcome = Some(Outcome::Decided);
    decision
}

/// The facts of each distinct image, or what could not be learned (`image: reason`).
fn known_facts<'a>(
    distinct: &[&'a str],
    facts: &'a ImageFacts,
) -> Result<Vec<(&'a str, &'a ImageFact)>, Vec<String>> {
    let mut failed = Vec::new();
    let mut known = Vec::new();
    for &image in distinct {
        match facts.get(image) {
            Some(Ok(found)) => known.push((image, &**found)),
            Some(Err(reason)) => failed.push(format!("{image}: {reason}")),
            None => failed.push(format!("{image}: not looked up")),
        }
    }
    if failed.is_empty() {
        Ok(known)
    } else {
        Err(failed)
    }
}

/// Some image's platforms are unknown: the Pod is left where it would land anyway (no patch at
/// all: a Pod tolerable does not understand is left exactly as it came), or denied.
fn lookup_failed(failed: &[String], policy: &Policy) -> Decision {
    let detail = cut(failed.join("; "), MAX_SUMMARY_BYTES);
    let deny = (policy.on_lookup_failure == OnLookupFailure::Deny)
        .then(|| format!("tolerable could not determine the platforms of: {detail}"));
    let warnings = failed
        .iter()
        .map(|f| format!("tolerable added no tolerations: platforms unknown for {f}"))
        .collect();
    deny_or_leave(
        deny,
        &format!("platforms unknown ({detail})"),
        warnings,
        Outcome::LookupFailed,
    )
}

/// The architectures every image supports on `os`, and the images described for the summary.
/// An artifact without a platform (a Helm chart or model weights in an image volume) runs
/// anywhere and does not narrow the set; when only artifacts remain, every architecture that
/// can appear is common (tolerated where supported, never steered).
fn common_architectures(
    os: &str,
    known: &[(&str, &ImageFact)],
    policy: &Policy,
    pools: Option<&NodePools>,
) -> (Vec<String>, String) {
    let mut common: Option<BTreeSet<&str>> = None;
    let mut described = String::new();
    for (image, found) in known {
        if !described.is_empty() {
            described.push_str(", ");
        }
        let _ = match &found.artifact {
            Some(config_type) => write!(described, "{image} (artifact {config_type}: any platform"),
            None => write!(described, "{image} ({}", Joined(&found.platforms)),
        };
        // Name where the credential came from (never what it is), so a private image's answer
        // can be traced to the pull secret that opened it.
        if let Provenance::Credential(source) = &found.credentials {
            let _ = write!(described, "; credentials from {source}");
        }
        described.push(')');
        if found.artifact.is_some() {
            continue;
        }
        let archs: BTreeSet<&str> = found
            .platforms
            .iter()
            .filter(|p| *p.os == *os)
            .map(|p| &*p.architecture)
            .collect();
        common = Some(match common {
            None => archs,
            Some(c) => c.intersection(&archs).copied().collect(),
        });
    }
    let common = match common {
        Some(common) => common.into_iter().map(str::to_owned).collect(),
        None => policy
            .possible_architectures(pools)
            .cloned()
            .collect::<BTreeSet<String>>()
            .into_iter()
            .collect(),
    };
    (common, described)
}

/// What the decision sees once the images' common architectures are known.
struct Seen<'a> {
    pod: &'a Pod,
    policy: &'a Policy,
    pools: Option<&'a NodePools>,
    os: &'a str,
    common: &'a [String],
}

/// The tolerations a Pod gets: the architectures tolerated, and each wanted toleration with
/// where it came from (whether the Pod already had it or not, so the summary is the same on
/// reinvocation).
struct Tolerated<'a> {
    architectures: Vec<&'a String>,
    wanted: Vec<(Toleration, TolerationSource)>,
}

impl<'a> Seen<'a> {
    /// Every tolerated architecture gets its templates whether or not its nodes exist now: a
    /// pool that scales from zero grows only for a Pending Pod that tolerates its taint. A taint
    /// the node watch sees on that architecture's nodes that no template tolerates is copied too.
    /// Adds to `decision` what the Pod does not already tolerate.
    fn tolerations(&self, decision: &mut Decision) -> Tolerated<'a> {
        let existing = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_ref())
            .map_or(&[][..], Vec::as_slice);
        let policy = self.policy;
        let architectures: Vec<&String> = self
            .common
            .iter()
            .filter(|arch| policy.supported_architectures.contains(*arch))
            .collect();
        let mut wanted: Vec<(Toleration, TolerationSource)> = Vec::new();
        for arch in &architectures {
            let templates = policy.templates_for(arch);
            for template in templates {
                let toleration = template.for_architecture(arch);
                if wanted.iter().any(|(t, _)| *t == toleration) {
                    continue;
                }
                if !existing.iter().any(|t| template.is_tolerated_by(t, arch)) {
                    decision.tolerations.push(toleration.clone());
                }
                wanted.push((toleration, TolerationSource::Template));
            }
            for taint in self.pools.map_or(&[][..], |p| p.taints(arch)) {
                let Some(toleration) = untemplated_taint(templates, arch, taint) else {
                    continue;
                };
                if wanted.iter().any(|(t, _)| *t == toleration) {
                    continue;
                }
                if !existing.iter().any(|t| tolerates(t, taint)) {
                    decision.tolerations.push(toleration.clone());
                }
                wanted.push((toleration, TolerationSource::NodeTaint));
            }
        }
        Tolerated {
            architectures,
            wanted,
        }
    }

    /// Steering, as the policy asks and the Pod allows; the note for the summary.
    fn steer(&self, placement: Option<&FixedPlacement>, decision: &mut Decision) -> String {
        let (policy, common, os) = (self.policy, self.common, self.os);
        // Images that run on every architecture the cluster has or may add need no steering.
        let runs_everywhere = policy
            .possible_architectures(self.pools)
            .all(|a| common.contains(a));
        let mut note = String::new();
        match existing_arch_constraint(self.pod, policy.steering, common) {
            ExistingConstraint::Ours => note = steering_description(policy.steering, common),
            ExistingConstraint::Theirs { allowed } => {
                note = "kept the Pod's own kubernetes.io/arch constraint".into();
                let unsupported: Vec<&String> = allowed
                    .iter()
                    .flatten()
                    .filter(|a| !common.contains(a))
                    .collect();
                if !unsupported.is_empty() {
                    decision.warnings.push(format!(
                        "the Pod allows kubernetes.io/arch {} but its images support only {} on {os}",
                        Joined(&unsupported),
                        Joined(common)
                    ));
                }
            }
            ExistingConstraint::None if placement.is_some() => {}
            ExistingConstraint::None if runs_everywhere => {
                note =
                    "no steering: the images run on every architecture the cluster has or may add"
                        .into();
            }
            ExistingConstraint::None => match policy.steering {
                Steering::Off => {}
                Steering::NodeSelector if common.len() == 1 => {
                    decision.node_selector = Some(common[0].clone());
                    note = steering_description(policy.steering, common);
                }
                Steering::NodeSelector => {}
                Steering::NodeAffinity => {
                    decision.required_architectures = Some(common.to_vec());
                    note = steering_description(policy.steering, common);
                }
            },
        }
        if let Some(placement) = placement {
            self.note_fixed_placement(placement, &mut note, decision);
        }
        note
    }

    /// A Pod the scheduler does not place freely is never steered; say where it is headed when
    /// its images cannot run there (if the node watch knows that node).
    fn note_fixed_placement(
        &self,
        placement: &FixedPlacement,
        note: &mut String,
        decision: &mut Decision,
    ) {
        if !note.is_empty() {
            note.push_str("; ");
        }
        let _ = write!(note, "no steering: {}", placement.why);
        let headed = placement.node.as_ref().and_then(|node| {
            let arch = self.pools?.nodes.get(node)?;
            Some((node, arch))
        });
        if let Some((node, arch)) = headed.filter(|(_, arch)| !self.common.contains(arch)) {
            let warning = format!(
                "the Pod is headed for node {node} ({arch}) but its images support only {} on {}",
                Joined(self.common),
                self.os
            );
            let _ = write!(note, " ({warning})");
            decision.warnings.push(warning);
        }
    }

    /// A preference among several possible architectures; the Pod's own label or annotation
    /// wins. The note for the summary.
    fn prefer(&self, placed: bool, decision: &mut Decision) -> String {
        let common = self.common;
        let preferred: Vec<WeightedArchitecture> =
            match label_or_annotation(self.pod, PREFERRED_KEY) {
                Some("none") => Vec::new(),
                Some(arch) => {
                    if !common.iter().any(|c| c == arch) {
                        decision.warnings.push(format!(
                            "{PREFERRED_KEY}={arch} ignored: the images support only {} on {}",
                            Joined(common),
                            self.os
                        ));
                    }
                    vec![WeightedArchitecture {
                        architecture: arch.to_owned(),
                        weight: PREFERRED_WEIGHT,
                    }]
                }
                None => self.policy.preferred_architectures.clone(),
            };
        let preferred: Vec<WeightedArchitecture> = preferred
            .into_iter()
            .filter(|p| common.len() > 1 && common.contains(&p.architecture) && !placed)
            .collect();
        let mut note = String::new();
        if preferred.is_empty() {
            return note;
        }
        note.push_str("; prefers ");
        for (i, p) in preferred.iter().enumerate() {
            if i > 0 {
                note.push_str(", ");
            }
            note.push_str(&p.architecture);
            if preferred.len() > 1 || p.weight != PREFERRED_WEIGHT {
                let _ = write!(note, " (weight {})", p.weight);
            }
        }
        if !has_preferred_arch_term(self.pod) {
            decision.preferred_architectures = preferred;
        }
        note
    }
}

/// The toleration for a taint `arch`'s nodes carry under one of its templates' keys that no
/// template tolerates (another value or effect); `None` when a template covers it or the key is
/// not an architecture key. tolerationSeconds as that architecture's own NoExecute template
/// under that key gives them.
fn untemplated_taint(
    templates: &[TolerationTemplate],
    arch: &str,
    taint: &Taint,
) -> Option<Toleration> {
    let covered = templates.iter().any(|template| {
        template.key == taint.key && tolerates(&template.for_architecture(arch), taint)
    });
    if covered || !templates.iter().any(|t| t.key == taint.key) {
        return None;
    }
    let seconds = templates
        .iter()
        .filter(|t| t.key == taint.key && t.effect == "NoExecute")
        .find_map(|t| t.toleration_seconds);
    Some(toleration_for(taint, seconds))
}

/// `tolerates arm64 (templates: …; taints seen on nodes: …)`, or `tolerates no tainted pool`.
fn write_tolerated(summary: &mut String, tolerated: &Tolerated) {
    summary.push_str("tolerates ");
    if tolerated.architectures.is_empty() {
        summary.push_str("no tainted pool");
        return;
    }
    let _ = write!(summary, "{}", Joined(&tolerated.architectures));
    for (source, label) in [
        (TolerationSource::Template, " (templates: "),
        (TolerationSource::NodeTaint, "; taints seen on nodes: "),
    ] {
        let mut first = true;
        for (toleration, _) in tolerated.wanted.iter().filter(|(_, s)| *s == source) {
            summary.push_str(if first { label } else { ", " });
            first = false;
            let _ = write!(summary, "{}", TolerationText(toleration));
        }
    }
    summary.push(')');
}

/// A Pod tolerable does not change: denied with `deny` when the policy says so, else left as it
/// came (no patch at all) with `warnings`, `left` saying why.
fn deny_or_leave(
    deny: Option<String>,
    reason: &str,
    warnings: Vec<String>,
    left: Outcome,
) -> Decision {
    match deny {
        Some(message) => Decision {
            deny: Some(message),
            summary: format!("denied: {reason}"),
            outcome: Some(Outcome::Denied),
            ..Decision::default()
        },
        None => Decision {
            warnings,
            summary: format!("unchanged: {reason}"),
            outcome: Some(left),
            ..Decision::default()
        },
    }
}

/// Where a toleration the decision wants came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TolerationSource {
    /// `[tolerations]` or `[architecture_tolerations.<arch>]`.
    Template,
    /// A taint the node watch saw on that architecture's nodes that no template tolerates.
    NodeTaint,
}

fn steering_description(steering: Steering, common: &[String]) -> String {
    match steering {
        Steering::Off => String::new(),
        Steering::NodeSelector => format!("nodeSelector {ARCH_LABEL}={}", common[0]),
        Steering::NodeAffinity => format!("requires {ARCH_LABEL} in ({})", Joined(common)),
    }
}

#[cfg(test)]
mod tests;
