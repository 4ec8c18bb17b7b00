//! `[policy]`, `[tolerations]`, `[architecture_tolerations]`, `[nodes]`, `[events]` and
//! `[crashes]`: the
//! decision's [`Policy`] (architectures, tolerations, steering, what to do when in doubt), what
//! `serve` does with the cluster's Nodes and the Warning Events it writes. The defaults are [`Policy::default`]'s, read from it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::reference::{KeyDoc, SectionDoc};
use super::values::{number_or_text, List, Word};
use super::{parse_duration, ConfigError};
use crate::mutate::arch::{self, KUBERNETES_ARCHITECTURES};
use crate::mutate::{
    OnLookupFailure, OnNoCommonArchitecture, Policy, Steering, TolerationOperator,
    TolerationTemplate, WeightedArchitecture, PREFERRED_WEIGHT,
};

/// `[policy]` as written.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct PolicySection {
    supported_architectures: List,
    default_architectures: List,
    skip_namespaces: List,
    match_node_labels: List,
    steering: Word<Steering>,
    preferred_architecture: Option<RawPreference>,
    on_no_common_architecture: Word<OnNoCommonArchitecture>,
    on_lookup_failure: Word<OnLookupFailure>,
    /// How long a gated Pod waits for its images' lookups before it is released unchanged.
    gate_timeout: String,
    enforce: bool,
    /// Read per-namespace policy from Namespace labels and annotations (a watch in `serve`, a
    /// list in `review --kubeconfig` and `audit`).
    pub(super) namespace_policy: bool,
    max_containers_per_pod: usize,
    max_images_per_pod: usize,
    amd64_runs_386: bool,
    arm64_runs_arm32: bool,
    /// `arch/variant` each: the variant every node of that architecture meets.
    node_variants: List,
    pin_digests: bool,
}

impl Default for PolicySection {
    /// [`Policy::default`], the one copy of the defaults, as it would be written.
    fn default() -> Self {
        let policy = Policy::default();
        let list = |set: BTreeSet<String>| List(set.into_iter().collect());
        Self {
            supported_architectures: list(policy.supported_architectures),
            default_architectures: list(policy.default_architectures),
            skip_namespaces: list(policy.skip_namespaces),
            match_node_labels: List(policy.match_node_labels),
            steering: Word::Known(policy.steering),
            preferred_architecture: (!policy.preferred_architectures.is_empty()).then(|| {
                RawPreference::Weighted(
                    policy
                        .preferred_architectures
                        .into_iter()
                        .map(|w| RawWeighted {
                            architecture: w.architecture,
                            weight: i64::from(w.weight),
                        })
                        .collect(),
                )
            }),
            on_no_common_architecture: Word::Known(policy.on_no_common_architecture),
            on_lookup_failure: Word::Known(policy.on_lookup_failure),
            gate_timeout: DEFAULT_GATE_TIMEOUT.into(),
            enforce: policy.enforce,
            namespace_policy: true,
            max_containers_per_pod: policy.max_containers_per_pod,
            max_images_per_pod: policy.max_images_per_pod,
            amd64_runs_386: policy.amd64_runs_386,
            arm64_runs_arm32: policy.arm64_runs_arm32,
            node_variants: List(
                policy
                    .node_variants
                    .iter()
                    .map(|(arch, variant)| format!("{arch}/{variant}"))
                    .collect(),
            ),
            pin_digests: policy.pin_digests,
        }
    }
}

/// `[policy] gate_timeout`'s default: long enough for a registry's brief outage or a slow first
/// pull of a new image's index, short enough that a Deployment's rollout is not stalled for
/// long when the registry stays down.
const DEFAULT_GATE_TIMEOUT: &str = "2m";

/// The longest `[policy] gate_timeout`: a Pod is never held longer than a day by an outage.
const MAX_GATE_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// `[nodes]` as written: what `serve` does with the cluster's Nodes.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct NodesSection {
    /// Watch Nodes (their architectures and taints).
    pub(super) watch: bool,
    /// Keep new nodes tainted as they join.
    pub(super) manage_taints: bool,
}

impl Default for NodesSection {
    fn default() -> Self {
        Self {
            watch: true,
            manage_taints: false,
        }
    }
}

/// `[events]` as written: the Warning Events `serve` writes where users look.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct EventsSection {
    /// A Warning Event on a Pod's controller owner when its images share no node architecture
    /// or could not be looked up (`cluster::events`, rate limited per owner).
    pub(super) on_admission: bool,
}

/// `[crashes]` as written: the crash-signal watch of `serve`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct CrashesSection {
    /// Watch the kubelets' BackOff Events for wrong-architecture crashes (`crate::crashes`).
    pub(super) watch: bool,
    /// Delete the Pods of wrong-architecture crashes for their controllers to recreate
    /// elsewhere (`crate::crashes`, with `watch`).
    pub(super) heal: bool,
    /// At admission, `terminationMessagePolicy: FallbackToLogsOnError` on containers that set
    /// none (`mutate::logs_on_error`).
    pub(super) fallback_to_logs_on_error: bool,
}

impl CrashesSection {
    /// `heal`, which acts on what `watch` finds.
    pub(super) fn heal(&self) -> Result<bool, ConfigError> {
        if self.heal && !self.watch {
            return Err(ConfigError::key(
                "crashes.heal",
                "heals what the crash watch finds: set `crashes.watch = true` too".to_owned(),
            ));
        }
        Ok(self.heal)
    }
}

/// A taint's effect a toleration matches; empty: every effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
    #[serde(rename = "")]
    Any,
}

super::values::words_by_serde!(TaintEffect);

impl TaintEffect {
    fn as_str(self) -> &'static str {
        match self {
            Self::NoSchedule => "NoSchedule",
            Self::PreferNoSchedule => "PreferNoSchedule",
            Self::NoExecute => "NoExecute",
            Self::Any => "",
        }
    }
}

/// `[tolerations]`: the toleration added for each tolerated architecture.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct TolerationsSection {
    key: String,
    operator: Word<TolerationOperator>,
    effect: Word<TaintEffect>,
    toleration_seconds: Option<i64>,
}

impl Default for TolerationsSection {
    /// [`Policy::default`]'s toleration, the one copy of the defaults.
    fn default() -> Self {
        let toleration = Policy::default().toleration;
        Self {
            key: toleration.key,
            operator: Word::Known(toleration.operator),
            effect: Word::parse(&toleration.effect),
            toleration_seconds: toleration.toleration_seconds,
        }
    }
}

/// `[architecture_tolerations.<arch>]`: one toleration (a table), several (an array of
/// tables), or, in an environment variable, `key[=value][:effect], …` (no value: the
/// architecture; value `*`: operator Exists).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(
    untagged,
    expecting = "a toleration table, a list of them, or \"key=value:effect, …\""
)]
pub(super) enum RawTemplates {
    Text(String),
    One(RawTemplate),
    Many(Vec<RawTemplate>),
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTemplate {
    key: String,
    #[serde(default)]
    operator: Option<Word<TolerationOperator>>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    effect: Option<Word<TaintEffect>>,
    #[serde(default, deserialize_with = "number_or_text")]
    toleration_seconds: Option<i64>,
}

impl RawTemplates {
    fn into_list(self, key: &str) -> Result<Vec<RawTemplate>, ConfigError> {
        match self {
            Self::One(one) => Ok(vec![one]),
            Self::Many(many) => Ok(many),
            Self::Text(text) => text
                .split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .map(|item| RawTemplate::from_text(key, item))
                .collect(),
        }
    }
}

impl RawTemplate {
    /// One `key[=value][:effect]` item of `key`'s text form.
    fn from_text(key: &str, item: &str) -> Result<Self, ConfigError> {
        let (key_value, effect) = match item.rsplit_once(':') {
            Some((kv, effect)) => (kv, Some(Word::parse(effect))),
            None => (item, None),
        };
        let (taint_key, value) = match key_value.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (key_value, None),
        };
        if taint_key.is_empty() {
            return Err(ConfigError::key(
                key,
                format!("{item:?} is not key[=value][:effect]"),
            ));
        }
        let operator = if value == Some("*") {
            TolerationOperator::Exists
        } else {
            TolerationOperator::Equal
        };
        Ok(Self {
            key: taint_key.to_owned(),
            operator: Some(Word::Known(operator)),
            value: value.filter(|v| *v != "*").map(str::to_owned),
            effect,
            toleration_seconds: None,
        })
    }
}

/// `[policy] preferred_architecture`: one architecture (weight 50), a list of
/// `{ architecture, weight }` tables, or, in an environment variable, `arm64=80, amd64=20`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(
    untagged,
    expecting = "an architecture, or a list of { architecture, weight }"
)]
enum RawPreference {
    Text(String),
    Weighted(Vec<RawWeighted>),
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWeighted {
    architecture: String,
    weight: i64,
}

/// An architecture name as nodes label them (`amd64`, `arm64`, `s390x`, `ppc64le`, `386`, …):
/// another spelling would match no node (or, as a default architecture, leave every node of the
/// real one to be tainted).
fn validate_arch(key: &str, arch: &str) -> Result<String, ConfigError> {
    if KUBERNETES_ARCHITECTURES.contains(&arch) {
        return Ok(arch.to_owned());
    }
    let reason = match arch::goarch_for(&arch.to_ascii_lowercase()) {
        Some(goarch) => format!(
            "{arch:?} is not a Kubernetes architecture name; nodes label it kubernetes.io/arch={goarch} (use {goarch:?})"
        ),
        None => format!(
            "{arch:?} is not a Kubernetes architecture name (one of {})",
            KUBERNETES_ARCHITECTURES.join(", ")
        ),
    };
    Err(ConfigError::key(key, reason))
}

fn validate_arch_list(key: &str, list: &List) -> Result<BTreeSet<String>, ConfigError> {
    list.0.iter().map(|a| validate_arch(key, a)).collect()
}

impl PolicySection {
    /// `gate_timeout`: more than zero (a Pod released at once was never worth gating), at
    /// most a day.
    pub(super) fn gate_timeout(&self) -> Result<Duration, ConfigError> {
        let key = "policy.gate_timeout";
        let timeout = parse_duration(key, &self.gate_timeout)?;
        if timeout.is_zero() || timeout > MAX_GATE_TIMEOUT {
            return Err(ConfigError::key(
                key,
                format!(
                    "{:?} must be more than 0 and at most 24h",
                    self.gate_timeout
                ),
            ));
        }
        Ok(timeout)
    }

    /// The policy: architectures, tolerations, steering, and what to do when in doubt.
    pub(super) fn validate(
        &self,
        tolerations: &TolerationsSection,
        architecture_tolerations: &BTreeMap<String, RawTemplates>,
    ) -> Result<Policy, ConfigError> {
        let supported_architectures = validate_arch_list(
            "policy.supported_architectures",
            &self.supported_architectures,
        )?;
        let default_architectures =
            validate_arch_list("policy.default_architectures", &self.default_architectures)?;
        if default_architectures.is_empty() {
            return Err(ConfigError::key(
                "policy.default_architectures",
                "name at least one architecture (tainting every node would leave no untainted pool)",
            ));
        }
        let toleration = validate_default_toleration(tolerations)?;
        let architecture_tolerations =
            validate_architecture_tolerations(architecture_tolerations, &supported_architectures)?;
        Ok(Policy {
            supported_architectures,
            default_architectures,
            toleration,
            architecture_tolerations,
            steering: self.steering.clone().get("policy.steering")?,
            preferred_architectures: validate_preference(self.preferred_architecture.as_ref())?,
            on_no_common_architecture: self
                .on_no_common_architecture
                .clone()
                .get("policy.on_no_common_architecture")?,
            on_lookup_failure: self
                .on_lookup_failure
                .clone()
                .get("policy.on_lookup_failure")?,
            skip_namespaces: self.skip_namespaces.0.iter().cloned().collect(),
            own_namespace: None,
            match_node_labels: validate_label_keys(
                "policy.match_node_labels",
                &self.match_node_labels,
            )?,
            max_containers_per_pod: at_least_one(
                "policy.max_containers_per_pod",
                self.max_containers_per_pod,
            )?,
            max_images_per_pod: at_least_one("policy.max_images_per_pod", self.max_images_per_pod)?,
            enforce: self.enforce,
            amd64_runs_386: self.amd64_runs_386,
            arm64_runs_arm32: self.arm64_runs_arm32,
            node_variants: validate_node_variants(&self.node_variants)?,
            pin_digests: self.pin_digests,
            // `[crashes] fallback_to_logs_on_error`, set by `Config::validate`.
            fallback_to_logs_on_error: false,
        })
    }
}

/// `[policy] node_variants`: `arch/variant` each (`amd64/v3`, `arm64/v8.2`), the architecture
/// a Kubernetes name named once, the variant as containerd normalises it (`arm64/v8` is the
/// baseline, said by naming nothing).
fn validate_node_variants(list: &List) -> Result<BTreeMap<String, String>, ConfigError> {
    let key = "policy.node_variants";
    let mut out = BTreeMap::new();
    for item in &list.0 {
        let Some((arch, variant)) = item.trim().split_once('/') else {
            return Err(ConfigError::key(
                key,
                format!("{item:?} is not architecture/variant (amd64/v3, arm64/v8.2)"),
            ));
        };
        let arch = validate_arch(key, arch)?;
        let variant = variant.to_ascii_lowercase();
        let valid = !variant.is_empty()
            && variant.len() <= 16
            && variant
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.');
        if !valid {
            return Err(ConfigError::key(
                key,
                format!("{item:?}: the variant is not a variant name (v3, v8.2, v9)"),
            ));
        }
        let (_, variant) = arch::normalize(&arch, &variant);
        if out.insert(arch.clone(), variant).is_some() {
            return Err(ConfigError::key(key, format!("{arch} is named twice")));
        }
    }
    Ok(out)
}

/// Label keys as Kubernetes validates them: an optional DNS subdomain prefix (at most 253
/// characters) and `/`, then a name of at most 63 alphanumerics, `-`, `_`, `.`, beginning and
/// ending alphanumeric. A key no label can have would silently match nothing. Each once, in the
/// order written.
fn validate_label_keys(key: &str, list: &List) -> Result<Vec<String>, ConfigError> {
    let mut out: Vec<String> = Vec::new();
    for label in &list.0 {
        let label = label.trim();
        if let Some(reason) = label_key_problem(label) {
            return Err(ConfigError::key(
                key,
                format!("{label:?} is not a label key: {reason}"),
            ));
        }
        if out.iter().any(|k| k == label) {
            return Err(ConfigError::key(key, format!("{label:?} is named twice")));
        }
        out.push(label.to_owned());
    }
    Ok(out)
}

/// Why `label` is not a valid label key, if it is not.
fn label_key_problem(label: &str) -> Option<&'static str> {
    let (prefix, name) = match label.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, label),
    };
    let edges_alphanumeric = |s: &str| {
        s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
    };
    if name.is_empty() || name.len() > 63 {
        return Some("the name (after any prefix/) must be 1 to 63 characters");
    }
    let name_chars = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !name_chars || !edges_alphanumeric(name) {
        return Some(
            "the name must be alphanumerics, '-', '_' or '.', beginning and ending alphanumeric",
        );
    }
    if let Some(prefix) = prefix {
        let labels_ok = prefix.split('.').all(|part| {
            part.len() <= 63
                && edges_alphanumeric(part)
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        });
        if prefix.is_empty() || prefix.len() > 253 || !labels_ok {
            return Some("the prefix must be a lower-case DNS subdomain");
        }
    }
    None
}

fn at_least_one(key: &str, n: usize) -> Result<usize, ConfigError> {
    if n == 0 {
        return Err(ConfigError::key(key, "must be at least 1"));
    }
    Ok(n)
}

/// `[tolerations]`: a template whose value is the architecture.
fn validate_default_toleration(
    raw: &TolerationsSection,
) -> Result<TolerationTemplate, ConfigError> {
    validate_template(
        "tolerations",
        RawTemplate {
            key: raw.key.clone(),
            operator: Some(raw.operator.clone()),
            value: None,
            effect: Some(raw.effect.clone()),
            toleration_seconds: raw.toleration_seconds,
        },
    )
}

/// `[architecture_tolerations.<arch>]`: only for supported architectures, at least one each.
fn validate_architecture_tolerations(
    raw: &BTreeMap<String, RawTemplates>,
    supported_architectures: &BTreeSet<String>,
) -> Result<BTreeMap<String, Vec<TolerationTemplate>>, ConfigError> {
    let mut out = BTreeMap::new();
    for (arch, templates) in raw {
        let key = format!("architecture_tolerations.{arch}");
        let arch = validate_arch(&key, arch)?;
        if !supported_architectures.contains(&arch) {
            return Err(ConfigError::key(
                &key,
                format!(
                    "{arch} is not in policy.supported_architectures, so it is never tolerated"
                ),
            ));
        }
        let templates = templates
            .clone()
            .into_list(&key)?
            .into_iter()
            .map(|t| validate_template(&key, t))
            .collect::<Result<Vec<_>, _>>()?;
        if templates.is_empty() {
            return Err(ConfigError::key(&key, "name at least one toleration"));
        }
        out.insert(arch, templates);
    }
    Ok(out)
}

/// One toleration template under `section` (`tolerations` or `architecture_tolerations.<arch>`).
fn validate_template(section: &str, raw: RawTemplate) -> Result<TolerationTemplate, ConfigError> {
    let field = |name: &str| format!("{section}.{name}");
    let key = raw.key.trim().to_owned();
    let label_key_ok = !key.is_empty()
        && key.len() <= 316
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'));
    if !label_key_ok {
        return Err(ConfigError::key(
            &field("key"),
            format!("{key:?} is not a taint key"),
        ));
    }
    let operator = match raw.operator {
        Some(operator) => operator.get(&field("operator"))?,
        None => TolerationOperator::Equal,
    };
    let value = validate_template_value(&field("value"), operator, raw.value)?;
    let effect = match raw.effect {
        Some(effect) => effect.get(&field("effect"))?,
        None => TaintEffect::NoSchedule,
    };
    if raw.toleration_seconds.is_some() && effect != TaintEffect::NoExecute {
        return Err(ConfigError::key(
            &field("toleration_seconds"),
            "Kubernetes allows tolerationSeconds only with effect NoExecute",
        ));
    }
    Ok(TolerationTemplate {
        key,
        operator,
        value,
        effect: effect.as_str().to_owned(),
        toleration_seconds: raw.toleration_seconds,
    })
}

/// A template's value: a label value, and none with operator Exists.
fn validate_template_value(
    key: &str,
    operator: TolerationOperator,
    value: Option<String>,
) -> Result<Option<String>, ConfigError> {
    let value = value.map(|v| v.trim().to_owned());
    if operator == TolerationOperator::Exists && value.is_some() {
        return Err(ConfigError::key(
            key,
            "must not be set with operator Exists (it tolerates every value)",
        ));
    }
    if let Some(v) = &value {
        let ok = v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !ok {
            return Err(ConfigError::key(key, format!("{v:?} is not a taint value")));
        }
    }
    Ok(value)
}

fn validate_preference(
    raw: Option<&RawPreference>,
) -> Result<Vec<WeightedArchitecture>, ConfigError> {
    let key = "policy.preferred_architecture";
    let items: Vec<(String, i64)> = match raw {
        None => Vec::new(),
        Some(RawPreference::Weighted(list)) => list
            .iter()
            .map(|w| (w.architecture.clone(), w.weight))
            .collect(),
        Some(RawPreference::Text(text)) => text
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(|item| match item.split_once('=') {
                None => Ok((item.to_owned(), i64::from(PREFERRED_WEIGHT))),
                Some((arch, weight)) => weight
                    .trim()
                    .parse()
                    .map(|w| (arch.trim().to_owned(), w))
                    .map_err(|_| {
                        ConfigError::key(key, format!("{item:?}: the weight is not a number"))
                    }),
            })
            .collect::<Result<_, _>>()?,
    };
    let mut out: Vec<WeightedArchitecture> = Vec::new();
    for (arch, weight) in items {
        let architecture = validate_arch(key, arch.trim())?;
        if !(1..=100).contains(&weight) {
            return Err(ConfigError::key(
                key,
                format!("{architecture}: weight {weight} is not between 1 and 100"),
            ));
        }
        if out.iter().any(|w| w.architecture == architecture) {
            return Err(ConfigError::key(
                key,
                format!("{architecture} is named twice"),
            ));
        }
        out.push(WeightedArchitecture {
            architecture,
            weight: weight as i32,
        });
    }
    Ok(out)
}

pub(super) const POLICY_DOC: SectionDoc = SectionDoc {
    name: "policy",
    banner: Some("What the webhook decides"),
    about: &[],
    intro: "",
    keys: &[
        KeyDoc {
            key: "supported_architectures",
            meaning: "architectures of the tainted pools to tolerate",
            about: &[
                "Architectures of the cluster's tainted node pools: a Pod whose images all run on one of these",
                "gets that architecture's tolerations ([tolerations], or [architecture_tolerations.<arch>]),",
                "whether or not its nodes exist right now — a pool that scales from zero (Karpenter,",
                "cluster-autoscaler min size 0) grows only for a Pending Pod that tolerates its taint.",
                "Names are Kubernetes' (GOARCH) names: amd64, arm64, arm, s390x, ppc64le, 386, riscv64, …",
                "(x86_64 or aarch64 are refused, with the right name suggested).",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "default_architectures",
            meaning: "architectures of the untainted pools: never tainted, and counted as possible when deciding whether to steer; at least one",
            about: &[
                "Architectures of the untainted pools (every image runs there). Node tainting",
                "(`tolerable nodes plan|taint|untaint`, and [nodes] manage_taints): nodes of these",
                "architectures stay untainted; a node of a supported architecture gets its first template's",
                "taint ([tolerations].key=<arch>:[tolerations].effect, e.g. kubernetes.io/arch=arm64:NoSchedule);",
                "a node of an architecture in neither list is not tainted (`nodes taint --force` overrides),",
                "since no Pod would ever tolerate it. tolerable records the taints it adds in the node",
                "annotation tolerable.io/managed-taints, so `untaint` removes only those.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "skip_namespaces",
            meaning: "namespaces whose Pods are left alone (the chart also leaves them out of the webhook's `namespaceSelector`, so the API server never calls tolerable for them; with kustomize add them there too: [what is never sent](how-it-works.md#what-is-never-sent))",
            about: &[
                "Namespaces whose Pods are left alone. The chart also leaves them out of the",
                "webhook's namespaceSelector (no call at all); with kustomize, add them there too.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "match_node_labels",
            meaning: "Pod label keys its nodes must match: for each the Pod carries, `key In [value]` is ANDed into every required nodeSelectorTerm (or set in the nodeSelector under `steering = \"node_selector\"`); a constraint the Pod has on the key is kept (a warning when it contradicts); never for DaemonSet or bound Pods. Valid label keys ([how it works](how-it-works.md))",
            about: &[
                "Pod label keys its nodes must match: a Pod labelled team=ml runs only on nodes labelled",
                "team=ml. For each key the Pod carries, `key In [value]` is ANDed into every required",
                "nodeSelectorTerm (or the term created), or set in the nodeSelector under",
                "steering = \"node_selector\". A constraint the Pod already has on the key is kept as it is",
                "(with a warning when it contradicts the label); DaemonSet and bound Pods get nothing.",
                "Example: [\"team\", \"topology.kubernetes.io/region\"]",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "steering",
            meaning: "`off`, `node_selector` (pin the one common architecture) or `node_affinity` (require the common architectures)",
            about: &[
                "How Pods are kept off nodes their images cannot run on:",
                "  node_affinity  AND `kubernetes.io/arch In (architectures of all images)` into every required",
                "                 nodeSelectorTerm (or add the term)",
                "  node_selector  pin `kubernetes.io/arch` when the images share exactly one architecture",
                "  off            tolerations only",
                "A Pod that already constrains kubernetes.io/arch is left as it is (with a warning when its",
                "constraint allows an architecture its images do not support).",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "preferred_architecture",
            meaning: "architecture to prefer when several are possible (weight 50), or a list of `{ architecture, weight }` (weights 1–100; in a variable `arm64=80, amd64=20`)",
            about: &[
                "Prefer this architecture when the images run on several (a preferred node-affinity term,",
                "weight 50), or several with weights 1-100 as the scheduler takes them — the cheaper pool",
                "first, with fallback:",
                "  preferred_architecture = [{ architecture = \"arm64\", weight = 80 },",
                "                            { architecture = \"amd64\", weight = 20 }]",
                "(in the environment: TOLERABLE_POLICY__PREFERRED_ARCHITECTURE=\"arm64=80, amd64=20\").",
                "A Pod overrides it with the label or annotation tolerable.io/preferred-architecture=<arch>,",
                "or =none. Pods owned by a DaemonSet or already bound to a node are never steered.",
            ],
            example: Some("\"arm64\""),
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "on_no_common_architecture",
            meaning: "`deny` or `warn` (allowed unchanged)",
            about: &[
                "When the images share no architecture: deny the Pod naming each image and its platforms, or",
                "warn and let it through unchanged.",
            ],
            example: None,
            inline: Some("deny | warn"),
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "on_lookup_failure",
            meaning: "`allow` (unchanged, with a warning), `deny`, or `gate`: hold the Pod behind the scheduling gate `tolerable.io/architecture` (label `tolerable.io/gated=true`) until `serve`'s gate controller has looked its images up, then release it with the same decision (see [scheduling gates](operations.md#scheduling-gates)). Never gated, allowed unchanged with a warning instead: bound Pods (`nodeName`), DaemonSet Pods and Pods pinned to one node, mirror Pods, Pods over the per-Pod limits, Pods in `skip_namespaces` and in tolerable's own namespace (`POD_NAMESPACE`)",
            about: &[
                "When an image's platforms cannot be learned (registry down, unknown image, no access): allow the",
                "Pod unchanged with a warning (it stays on the untainted pools), deny it, or gate it: hold it",
                "with the scheduling gate tolerable.io/architecture (and the label tolerable.io/gated=true) until",
                "serve's gate controller has learned its images, then release it with the same decision.",
            ],
            example: None,
            inline: Some("allow | deny | gate"),
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "gate_timeout",
            meaning: "how long after its creation a gated Pod waits for its lookups before it is released unchanged with a Warning Event (more than 0, at most `24h`)",
            about: &[
                "With on_lookup_failure = \"gate\": how long after its creation a gated Pod waits for its images'",
                "lookups; then it is released unchanged, with a Warning Event (a Pod is never held forever by a",
                "registry outage). More than 0, at most 24h.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "enforce",
            meaning: "`false`: report only — the decision annotation says what tolerable would have added or denied; nothing else changes. A Namespace's label (or a Pod's own label or annotation) `tolerable.io/enforce` says otherwise for its Pods ([namespace policy](namespace-policy.md))",
            about: &[
                "false: report only, for a first roll-out. Pods get only the decision annotation",
                "(tolerable.io/decision) saying what tolerable would have added, or why it would have denied",
                "them; no tolerations, no steering, no denial. Read the annotations and `tolerable review`, then",
                "switch it on.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "namespace_policy",
            meaning: "read per-namespace policy from Namespaces: the label `tolerable.io/enforce` (`\"false\"` report only there, `\"true\"` enforce even under `enforce = false`), the label `tolerable.io/skip` (`\"true\"`) and the annotation `tolerable.io/preferred-architecture` (`\"arm64=80, amd64=20\"`, one architecture, or `none`); a Pod's own label/annotation wins, then the Namespace, then this file ([namespace policy](namespace-policy.md)). `serve` watches Namespaces (metadata only; RBAC `list`/`watch` namespaces), `review --cluster`/`--kubeconfig`/`--context` and `audit` list them once; `false`: Namespaces are not read",
            about: &[
                "Per-namespace policy, set by the platform team on Namespace objects (Pods' own",
                "labels/annotations win, then the Namespace, then this file):",
                "  label      tolerable.io/enforce: \"false\"   report only in that namespace (\"true\": enforce",
                "                                              even when enforce = false here)",
                "  label      tolerable.io/skip: \"true\"       leave the namespace alone (the shipped webhook",
                "                                              configuration does not even call tolerable)",
                "  annotation tolerable.io/preferred-architecture: \"arm64=80, amd64=20\"   its preference",
                "serve watches Namespaces (metadata only; RBAC: list/watch namespaces); without that access it",
                "logs one warning and keeps to this file. false: Namespaces are not read at all.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "max_containers_per_pod",
            meaning: "a Pod with more containers is not looked up: treated as a lookup failure",
            about: &[
                "Limits per Pod, far above real Pods: a Pod with more containers (init, regular, ephemeral and",
                "image volumes) or more distinct images is not looked up at all — it is treated as a lookup",
                "failure (allowed unchanged with a warning, or denied with on_lookup_failure = \"deny\"), so one",
                "Pod cannot make tolerable open thousands of registry connections.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "max_images_per_pod",
            meaning: "a Pod with more distinct images is not looked up: treated as a lookup failure",
            about: &[],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "amd64_runs_386",
            meaning: "amd64 nodes run `linux/386` images, as containerd's platform matcher on amd64 accepts them: a 386-only image is placed on amd64 (`false`: kernels built without 32-bit support; a 386-only image then runs nowhere) ([how it works](how-it-works.md#what-a-node-runs))",
            about: &[
                "What the nodes' container runtime runs besides their own architecture, as containerd's",
                "platform matcher on them decides: a Pod is placed on the node architectures that run every",
                "image. amd64 nodes run linux/386 images (false: kernels without 32-bit support); arm64 nodes",
                "run linux/arm/v8…v5 only where their CPUs run AArch32 code (Graviton2, Neoverse N1, Ampere",
                "Altra do; Graviton3/4, AmpereOne, Neoverse V2-based CPUs do not). node_variants: the CPU",
                "variant every node of an architecture meets, \"arch/variant\" (amd64/v3 for x86-64-v3,",
                "arm64/v8.2, arm64/v9); an image built only for a higher variant than said is not placed",
                "there, and where nothing is said it is placed with a warning.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "arm64_runs_arm32",
            meaning: "arm64 nodes run `linux/arm/v8`…`v5` images: only where their CPUs run AArch32 code at EL0 — yes on Graviton2, Neoverse N1 and Ampere Altra, no on Graviton3/4, AmpereOne and Neoverse V2-based CPUs (containerd accepts them either way; the container then fails at start)",
            about: &[],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "node_variants",
            meaning: "`\"arch/variant\"` each: the CPU variant every node of that architecture meets (`amd64/v3` for x86-64-v3, `arm64/v8.2`, `arm64/v9`), as containerd orders them (amd64 v4…v1; arm64 v9.x…v9.0, v8.(x+5)…v8.0; arm v8…v5). An image built only for a higher variant is not placed there; for an architecture not named, such an image is placed with a warning (containerd may or may not detect the CPU's level)",
            about: &[],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "pin_digests",
            meaning: "rewrite each image given by tag (containers of every kind, image volumes) to `name:tag@sha256:…` of the manifest or index the decision was made on, so the kubelet pulls what was inspected; images already by digest are left alone. A Namespace's label, or a Pod's own label or annotation, `tolerable.io/pin-digest` (`\"true\"` / `\"false\"`) says otherwise for its Pods ([pinning](how-it-works.md#pinning-the-decided-digest))",
            about: &[
                "Pin what was decided: rewrite each container's image (and image volume's reference) given by",
                "tag to name:tag@sha256:… of the manifest or index the decision was made on, so the kubelet",
                "pulls what was inspected on every start, restart and reschedule, even after the tag moves.",
                "Images already by digest are left alone. A Namespace's label, or a Pod's own label or",
                "annotation, tolerable.io/pin-digest: \"true\" / \"false\" says otherwise for its Pods.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
    ],
};

pub(super) const TOLERATIONS_DOC: SectionDoc = SectionDoc {
    name: "tolerations",
    banner: None,
    about: &[
        "The toleration added for each tolerated architecture; its value is the architecture",
        "(no value with operator Exists). Matches taints such as kubernetes.io/arch=arm64:NoSchedule,",
        "which GKE puts on Arm node pools. In the environment: TOLERABLE_TOLERATIONS__EFFECT, …",
    ],
    intro: "The toleration added for each tolerated architecture; its value is the architecture.",
    keys: &[
        KeyDoc {
            key: "key",
            meaning: "the taint key tolerated",
            about: &[],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "operator",
            meaning: "`Equal` (value: the architecture) or `Exists`",
            about: &[],
            example: None,
            inline: Some("Equal | Exists"),
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "effect",
            meaning: "`NoSchedule`, `PreferNoSchedule`, `NoExecute` or `\"\"` (every effect)",
            about: &[],
            example: None,
            inline: Some("NoSchedule | PreferNoSchedule | NoExecute | \"\" (all effects)"),
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "toleration_seconds",
            meaning: "only with effect `NoExecute`",
            about: &[],
            example: Some("300"),
            inline: Some("only with effect NoExecute"),
            default_note: None,
            deployed: false,
        },
    ],
};

pub(super) const ARCHITECTURE_TOLERATIONS_DOC: SectionDoc = SectionDoc {
    name: "architecture_tolerations",
    banner: None,
    about: &[
        "Per-architecture templates that replace [tolerations] for one supported architecture, for",
        "provider- or team-specific taints: one table, or a list of them (key, operator, value, effect,",
        "toleration_seconds; value defaults to the architecture, effect to NoSchedule). E.g. an EKS",
        "Auto Mode style `arm64=true:NoSchedule` beside GKE's taint:",
        "  [[architecture_tolerations.arm64]]",
        "  key = \"arm64\"",
        "  value = \"true\"",
        "  [[architecture_tolerations.arm64]]",
        "  key = \"kubernetes.io/arch\"",
        "In the environment, key[=value][:effect] items (no value: the architecture; value *: Exists):",
        "  TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64=\"arm64=true:NoSchedule, kubernetes.io/arch:NoSchedule\"",
    ],
    intro: "",
    keys: &[
        KeyDoc {
            key: "<arch>",
            meaning: "one table or a list of tables (`key`, `operator`, `value`, `effect`, `toleration_seconds`; value defaults to the architecture, effect to `NoSchedule`) replacing `[tolerations]` for one supported architecture; in a variable `key[=value][:effect], …` (no value: the architecture; value `*`: `Exists`)",
            about: &[],
            example: None,
            inline: None,
            default_note: Some("none"),
            deployed: false,
        },
    ],
};

pub(super) const NODES_DOC: SectionDoc = SectionDoc {
    name: "nodes",
    banner: None,
    about: &[],
    intro: "",
    keys: &[
        KeyDoc {
            key: "watch",
            meaning: "watch Nodes: also tolerate taints the templates do not, skip needless steering, warn about fenced-off pools; `/readyz` waits for the first sync (needs `list`, `watch` on nodes)",
            about: &[
                "Watch Nodes to learn which architectures the cluster has and which taints (under the",
                "templates' keys) each architecture's nodes carry. Templates are added whatever the watch sees;",
                "a taint on a supported architecture's nodes that no template tolerates (another value or",
                "effect) is tolerated too. A Pod whose images run on every architecture that is present,",
                "supported or default is not steered. /readyz waits for the first sync; `serve` warns about",
                "nodes tainted for an architecture that is neither supported nor default.",
                "Needs RBAC: list and watch on nodes (shipped in kustomize/base).",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
        KeyDoc {
            key: "manage_taints",
            meaning: "`serve` keeps new nodes tainted as they join (needs `patch` on nodes); also `serve --manage-node-taints`",
            about: &[
                "`serve` keeps new nodes tainted as they join (needs patch on nodes:",
                "kustomize/components/manage-node-taints). Also `serve --manage-node-taints`.",
            ],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
    ],
};

pub(super) const EVENTS_DOC: SectionDoc = SectionDoc {
    name: "events",
    banner: None,
    about: &[],
    intro: "",
    keys: &[KeyDoc {
        key: "on_admission",
        meaning: "a Warning Event (events.k8s.io/v1) on the controller owner of each Pod whose images share no node architecture (denied or warned) or could not be looked up (warned, denied or gated), naming the images and why; at most one per owner every 10 minutes, written off the admission's path (a full queue, or its namespace's full share of it, drops it); a Pod without a controller owner gets none (needs `create` on `events.events.k8s.io`: `kustomize/components/events`, the chart's `config.events.on_admission`)",
        about: &[
            "A Warning Event on the controller owner of each Pod (its ownerReferences entry with",
            "controller: true — a ReplicaSet, StatefulSet, Job, DaemonSet…) whose images share no node",
            "architecture (denied or warned) or could not be looked up (warned, denied or gated), naming the",
            "images and why; at most one per owner every 10 minutes, written off the admission's path",
            "(a full queue drops them, counted in tolerable_events_total). A Pod without a controller owner",
            "gets none (it is not created yet when it is admitted). Needs RBAC: create on events.k8s.io",
            "events (kustomize/components/events).",
        ],
        example: None,
        inline: None,
        default_note: None,
        deployed: false,
    }],
};

pub(super) const CRASHES_DOC: SectionDoc = SectionDoc {
    name: "crashes",
    banner: None,
    about: &[],
    intro: "",
    keys: &[KeyDoc {
        key: "watch",
        meaning: "the crash-signal watch: the kubelets' BackOff Warning Events watched (never all Pods), each backing-off Pod read once per container every 10 minutes; a container whose last run ended with a runtime's exec format error is reported — wrong architecture when the node's architecture is not among the image's platforms, the index's entry for it is an image of another, or the same image runs ready on nodes of another (one list of the owner's Pods by label), else \"not shown to be the architecture\" — in a Warning Event on the Pod and its controller owner, in the Pod's annotation `tolerable.io/crash` and in `tolerable_exec_format_crashes_total`; a wrong architecture is learned (in the shared cache too when `shared_cache.url` is set: every replica, `review` and `audit` see it; `tolerable crashes list | forget`); one replica looks (the gate releasers' Lease) (needs `list`, `watch` on `events`, `get` on `pods`, `pods/log`, `list`, `patch` on `pods`, `create` on `events`: `kustomize/components/crash-watch`, the chart's `config.crashes.watch`)",
        about: &[
            "The crash-signal watch: watch the kubelets' BackOff Warning Events (never all Pods), read each",
            "backing-off Pod once per container every 10 minutes, and when a container's last run ended",
            "with a runtime's exec format error (runc, crun) tell whether it is the architecture — the",
            "node's architecture not among the image's platforms, or the index's entry for it an image of",
            "another architecture, or the same image running ready on nodes of another architecture (one",
            "list of the owner's Pods) — then learned: admissions of that digest leave the architecture",
            "out, every replica's with shared_cache.url (tolerable crashes list | forget); else \"not",
            "shown to be the architecture\" (an entrypoint without a shebang prints the same) —",
            "in a Warning Event on the Pod and its controller owner, in the Pod's annotation",
            "tolerable.io/crash and in tolerable_exec_format_crashes_total. One replica looks (the gate",
            "releasers' Lease). Needs RBAC: list and watch on events, get on pods and pods/log, list and",
            "patch on pods, create on events (kustomize/components/crash-watch).",
        ],
        example: None,
        inline: None,
        default_note: None,
        deployed: false,
    },
    KeyDoc {
        key: "heal",
        meaning: "with `watch`: delete the Pod of a wrong-architecture crash (with a uid precondition: never its replacement) when its controller recreates it elsewhere — a ReplicaSet, StatefulSet or ReplicationController, never a bare Pod, a DaemonSet's or a Job's (a deleted running Pod counts against its backoffLimit); no emptyDir on the node's disk, hostPath or claim (maybe a local volume) — and the decision for its images now leaves the node's architecture out; at most once per Pod, one Pod per controller per 10 minutes, 20 in all per 10 minutes; said in the crash's Events and counted in `tolerable_crash_heals_total` (needs `delete` on `pods`: `kustomize/components/crash-heal`, the chart's `config.crashes.heal`)",
        about: &[
            "With watch: delete the Pod of a wrong-architecture crash (with a uid precondition, never its",
            "replacement) when its controller recreates it elsewhere — a ReplicaSet, StatefulSet or",
            "ReplicationController, never a bare Pod, a DaemonSet's or a Job's Pod (a deleted running",
            "Pod counts against the Job's backoffLimit); no emptyDir on the node's",
            "disk, hostPath or claim (it may be a local volume) — and the decision for its images now",
            "leaves the node's architecture out. At most once per Pod, one Pod per controller per 10",
            "minutes, 20 in all per 10 minutes; said in the crash's Events, counted in",
            "tolerable_crash_heals_total. Needs RBAC: delete on pods (kustomize/components/crash-heal).",
        ],
        example: None,
        inline: None,
        default_note: None,
        deployed: false,
    },
    KeyDoc {
        key: "fallback_to_logs_on_error",
        meaning: "at admission, init containers and containers whose `terminationMessagePolicy` is the default get `FallbackToLogsOnError` in the patch of a Pod tolerable places or gates (a Pod left unchanged, skipped or denied gets nothing): a container that fails then has its log's last lines in its status, where the crash watch reads a runtime's exec format error without reading logs. The API server writes `File` into every container that sets no policy before a webhook sees it, so `File` counts as the default too (its termination-message file is still read first); `FallbackToLogsOnError` is kept. This shows up to 80 lines / 2 KiB of a failing container's log to whoever can read the Pod (`get` on `pods`), not only those who may read `pods/log`",
        about: &[
            "At admission, init containers and containers whose terminationMessagePolicy is the default",
            "get FallbackToLogsOnError in the patch of a Pod tolerable places or gates (a Pod left",
            "unchanged, skipped or denied gets nothing): a container that fails then has its log's last",
            "lines in its status, where the crash watch reads a runtime's exec format error without",
            "reading logs. The API server writes File into every container that sets no policy before a",
            "webhook sees it, so File counts as the default too (its termination-message file is still",
            "read first). This shows up to 80 lines / 2 KiB of a failing container's log to whoever can",
            "read the Pod (get on pods), not only to those who may read pods/log: keep it off where logs",
            "may hold secrets.",
        ],
        example: None,
        inline: None,
        default_note: None,
        deployed: false,
    }],
};
