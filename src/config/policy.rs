//! `[policy]`, `[tolerations]`, `[architecture_tolerations]`, `[nodes]`, `[events]` and
//! `[crashes]`: the
//! decision's [`Policy`] (architectures, tolerations, steering, what to do when in doubt), what
//! `serve` does with the cluster's Nodes and the Warning Events it writes. The defaults are [`Policy::default`]'s, read from it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Deserialize;

use super::values::{number_or_text, List, Word};
use super::{parse_duration, ConfigError};
use crate::mutate::arch::{self, KUBERNETES_ARCHITECTURES};
use crate::mutate::{
    OnLookupFailure, OnNoCommonArchitecture, Policy, Steering, TolerationOperator,
    TolerationTemplate, WeightedArchitecture, PREFERRED_WEIGHT,
};

/// `[policy]` as written.
#[derive(Debug, Deserialize)]
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
#[derive(Debug, Deserialize)]
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
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct EventsSection {
    /// A Warning Event on a Pod's controller owner when its images share no node architecture
    /// or could not be looked up (`cluster::events`, rate limited per owner).
    pub(super) on_admission: bool,
}

/// `[crashes]` as written: the crash-signal watch of `serve`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct CrashesSection {
    /// Watch the kubelets' BackOff Events for wrong-architecture crashes (`crate::crashes`).
    pub(super) watch: bool,
}

/// A taint's effect a toleration matches; empty: every effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Deserialize)]
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
#[derive(Clone, Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a toleration table, a list of them, or \"key=value:effect, …\""
)]
pub(super) enum RawTemplates {
    Text(String),
    One(RawTemplate),
    Many(Vec<RawTemplate>),
}

#[derive(Clone, Debug, Deserialize)]
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
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "an architecture, or a list of { architecture, weight }"
)]
enum RawPreference {
    Text(String),
    Weighted(Vec<RawWeighted>),
}

#[derive(Debug, Deserialize)]
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
