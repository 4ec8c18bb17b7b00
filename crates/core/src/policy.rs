//! What the operator configured, as the core takes it: which architectures are tolerated and
//! how, whether and how Pods are steered, what happens when images share none or cannot be
//! looked up. `config` builds a [`Policy`] from `tolerable.toml` and validates it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Toleration;

use super::platform::NodeRuntime;
use super::pools::{tolerates_parts, NodePools};
use super::ARCH_LABEL;

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
    /// Hold the Pod behind tolerable's scheduling gate until its images are known
    /// ([`super::gate`]); a Pod that cannot be gated is allowed unchanged with a warning.
    Gate,
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
    /// The namespace tolerable itself runs in (`POD_NAMESPACE`, from the downward API), when
    /// known: its Pods are never gated (a webhook whose own Pods wait behind its gate could
    /// never start the controller that releases them).
    pub own_namespace: Option<String>,
    /// Pod label keys that must match node labels: for each the Pod carries, `key In [value]`
    /// is required of its nodes (ANDed into every required term, or in the nodeSelector under
    /// `steering = node_selector`). In the order written.
    pub match_node_labels: Vec<String>,
    /// Most containers (init, regular, ephemeral) and image volumes a Pod may have for
    /// tolerable to look its images up.
    pub max_containers_per_pod: usize,
    /// Most distinct images looked up for one Pod.
    pub max_images_per_pod: usize,
    /// `false`: report only. The Pod gets the decision annotation saying what tolerable would
    /// have added or why it would have denied it, and nothing else (a first roll-out).
    pub enforce: bool,
    /// `[policy] amd64_runs_386`: the amd64 nodes' kernels run 32-bit x86 code, so they run a
    /// `linux/386` image (containerd's matcher on amd64 accepts 386).
    pub amd64_runs_386: bool,
    /// `[policy] arm64_runs_arm32`: the arm64 nodes' CPUs run AArch32 code at EL0 (Graviton2,
    /// Neoverse N1, Ampere Altra do; Graviton3/4, AmpereOne, Neoverse V2 do not), so they run
    /// `linux/arm/v8`…`v5` images.
    pub arm64_runs_arm32: bool,
    /// `[policy] node_variants`: architecture → the variant every node of it meets
    /// (normalised: `v3` for x86-64-v3, `v8.2`, `v9`); an architecture absent: its baseline.
    pub node_variants: BTreeMap<String, String>,
    /// `[policy] pin_digests`: each image by tag is rewritten to `name:tag@digest` of what the
    /// decision was made on (the Pod's or its Namespace's `tolerable.io/pin-digest` overrides).
    pub pin_digests: bool,
    /// `[crashes] fallback_to_logs_on_error`: init containers and containers that set no
    /// `terminationMessagePolicy` get `FallbackToLogsOnError`, so a failed start's last log
    /// lines (a runtime's exec format error) reach the Pod's status.
    pub fallback_to_logs_on_error: bool,
}

impl Policy {
    /// The toleration templates for `arch`: its own, else the default one.
    pub fn templates_for(&self, arch: &str) -> &[TolerationTemplate] {
        self.architecture_tolerations
            .get(arch)
            .map_or(std::slice::from_ref(&self.toleration), Vec::as_slice)
    }

    /// What containerd's matcher on a node of `arch` accepts, as the operator says of them.
    pub fn runtime_for(&self, arch: &str) -> NodeRuntime<'_> {
        NodeRuntime {
            variant: self.node_variants.get(arch).map(String::as_str),
            amd64_runs_386: self.amd64_runs_386,
            arm64_runs_arm32: self.arm64_runs_arm32,
        }
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
    pub(super) fn possible_architectures<'a>(
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
            own_namespace: None,
            match_node_labels: Vec::new(),
            max_containers_per_pod: 1000,
            max_images_per_pod: 100,
            enforce: true,
            amd64_runs_386: true,
            arm64_runs_arm32: false,
            node_variants: BTreeMap::new(),
            pin_digests: false,
            fallback_to_logs_on_error: false,
        }
    }
}
