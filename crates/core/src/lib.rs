//! The decision core: a Pod being created, what the registries said about its images, the
//! cluster's node pools and the policy go in; an answer comes out. Pure: no I/O, no clock, no
//! logging — the webhook, `tolerable review`, the fuzz harness, the benches and the table tests
//! all call [`answer`].

pub mod arch;
pub mod crash;
pub mod decision;
pub mod explain;
pub mod facts;
pub mod gate;
pub mod heal;
pub mod knobs;
pub mod logs_on_error;
pub mod namespace_policy;
pub mod node_labels;
pub mod owner_warning;
pub mod patch;
pub mod pin;
pub mod platform;
pub mod pod;
pub mod policy;
pub mod pools;
pub mod runnable;

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Taint, Toleration};

pub use self::decision::{Decision, Outcome, Placement, Untouched};
pub use self::facts::{ImageFact, ImageFacts, LookupFailure, Provenance, Staleness};
pub use self::knobs::{
    Knob, Knobs, Level, Settings, ENFORCE_KEY, PIN_DIGEST_KEY, PREFERRED_KEY, PREFERRED_WEIGHT,
    SKIP_KEY,
};
pub use self::namespace_policy::NamespacePolicy;
pub use self::pod::{ImageSlot, PodSpecView, PodView, SlotKind};
pub use self::policy::{
    OnLookupFailure, OnNoCommonArchitecture, Policy, Steering, TolerationOperator,
    TolerationTemplate, WeightedArchitecture,
};
pub use self::pools::{node_architecture, same_taint, tolerates, NodePools};

use self::explain::{cut, MAX_SUMMARY_BYTES};
use self::pod::{ExistingConstraint, FixedPlacement};
use self::runnable::common_architectures;

/// The node label the kubelet sets to the node's architecture.
pub const ARCH_LABEL: &str = "kubernetes.io/arch";
/// The node label the kubelet sets to the node's operating system.
pub const OS_LABEL: &str = "kubernetes.io/os";
/// Annotation tolerable writes to explain what it decided and from which platforms.
pub const DECISION_ANNOTATION: &str = "tolerable.io/decision";

/// One container's (or image volume's) image, as the Pod spec writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerImage {
    pub container: String,
    pub image: String,
}

/// Every image of the Pod: init, regular and ephemeral containers, then image volumes. A
/// container without an image is an error naming it.
pub fn images_of(pod: &PodView) -> Result<Vec<ContainerImage>, String> {
    let Some(spec) = &pod.spec else {
        return Err("the Pod has no spec".into());
    };
    let mut out = Vec::with_capacity(spec.images.len());
    for slot in &spec.images {
        let (kind, name) = match slot.kind {
            SlotKind::InitContainer => ("init container", slot.name.clone()),
            SlotKind::Container => ("container", slot.name.clone()),
            SlotKind::EphemeralContainer => ("ephemeral container", slot.name.clone()),
            SlotKind::ImageVolume => {
                if out.is_empty() {
                    break;
                }
                ("image volume", format!("volume {}", slot.name))
            }
        };
        match slot.image.as_deref().map(str::trim) {
            Some(image) if !image.is_empty() => out.push(ContainerImage {
                container: name,
                image: image.to_owned(),
            }),
            _ => return Err(format!("{kind} {name:?} has no image")),
        }
    }
    if out.is_empty() {
        return Err("the Pod has no containers".into());
    }
    Ok(out)
}

/// A Pod being created, read and sorted out before any lookup: its images, each image once,
/// and whether it is settled without lookups (skipped, or over the per-Pod limits). The shell
/// looks up [`PodCreate::images_to_look_up`]; [`answer`] decides.
#[derive(Clone, Debug)]
pub struct PodCreate {
    pub namespace: String,
    pub pod: PodView,
    /// What the Pod's Namespace says (labels and annotations read once, by the shell's
    /// namespace watch or `review`); `None`: nothing known of it.
    pub namespace_policy: Option<Arc<NamespacePolicy>>,
    /// Every knob's value and the level that set it (Pod > Namespace > config), resolved once.
    pub settings: Settings,
    /// The Pod's own knob values that did not parse, ignored (warned of).
    pod_problems: Vec<knobs::Problem>,
    /// Each image once, in the order the Pod first names it: an image several containers use
    /// is looked up, described and warned about once.
    distinct: Vec<String>,
    settled: Option<Settled>,
    /// A DaemonSet's Pod template (at `/spec/template`), not a Pod: never gated (a template
    /// has no scheduling gates to release) nor pinned (the DaemonSet would never follow its
    /// tag again), and the patch's paths are under `/spec/template`.
    template: bool,
}

/// Why a Pod needs no lookups.
#[derive(Clone, Debug)]
enum Settled {
    Skipped(String),
    OverLimits(String),
}

impl PodCreate {
    /// `Err`: the Pod names no image tolerable could look up (a container without an image, no
    /// containers): it is left unchanged.
    // The table tests' way in; the shell names the Namespace's policy (`in_namespace`).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn new(
        namespace: impl Into<String>,
        pod: PodView,
        policy: &Policy,
    ) -> Result<Self, String> {
        Self::in_namespace(namespace, None, pod, policy)
    }

    /// As [`PodCreate::new`], in a Namespace whose own policy is `namespace_policy`.
    pub fn in_namespace(
        namespace: impl Into<String>,
        namespace_policy: Option<Arc<NamespacePolicy>>,
        pod: PodView,
        policy: &Policy,
    ) -> Result<Self, String> {
        let namespace = namespace.into();
        let images = images_of(&pod)?;
        let distinct = distinct_images(&images);
        let (settings, pod_problems) =
            settings_of(&namespace, namespace_policy.as_deref(), &pod, policy);
        let settled = settings
            .skip
            .map(|level| Settled::Skipped(explain::skipped(level, &namespace)))
            .or_else(|| over_limits(&images, &distinct, policy).map(Settled::OverLimits));
        Ok(Self {
            namespace,
            pod,
            namespace_policy,
            settings,
            pod_problems,
            distinct,
            settled,
            template: false,
        })
    }

    /// A Pod tolerable leaves alone whatever its spec says (its own opt-out, its Namespace's,
    /// `skip_namespaces`), settled from its metadata alone; `None` when it is not skipped. The
    /// webhook reads only the metadata of a Pod whose Namespace is skipped: reading a spec it
    /// will not use was most of what such an admission cost (BENCHMARKS.md, the real path).
    pub fn skipped(
        namespace: impl Into<String>,
        namespace_policy: Option<Arc<NamespacePolicy>>,
        pod: PodView,
        policy: &Policy,
    ) -> Option<Self> {
        let namespace = namespace.into();
        let (settings, pod_problems) =
            settings_of(&namespace, namespace_policy.as_deref(), &pod, policy);
        let reason = explain::skipped(settings.skip?, &namespace);
        Some(Self {
            namespace,
            pod,
            namespace_policy,
            settings,
            pod_problems,
            distinct: Vec::new(),
            settled: Some(Settled::Skipped(reason)),
            template: false,
        })
    }

    /// This Pod as a DaemonSet's Pod template (see [`PodCreate::template`]).
    pub fn into_template(mut self) -> Self {
        self.template = true;
        self
    }

    /// The images whose platforms the decision needs: none when the Pod is skipped or over the
    /// limits.
    pub fn images_to_look_up(&self) -> &[String] {
        match self.settled {
            Some(_) => &[],
            None => &self.distinct,
        }
    }
}

/// Every knob's value for the Pod in `namespace` (the one precedence step), and the Pod's own
/// values that did not parse.
fn settings_of(
    namespace: &str,
    namespace_policy: Option<&NamespacePolicy>,
    pod: &PodView,
    policy: &Policy,
) -> (Settings, Vec<knobs::Problem>) {
    let (own, problems) = Knobs::of_pod(|key| pod.label_or_annotation(key));
    let config = knobs::ConfigKnobs {
        enforce: policy.enforce,
        skip: policy.skip_namespaces.contains(namespace),
        pin_digests: policy.pin_digests,
        preferred: policy.preferred_architectures.clone(),
    };
    let settings = knobs::resolve(&own, namespace_policy.map(|n| &n.knobs), config);
    (settings, problems)
}

/// Each image once, in the order the Pod first names it. Linear: a hostile Pod may name tens of
/// thousands.
fn distinct_images(images: &[ContainerImage]) -> Vec<String> {
    // A handful (nearly every Pod) is told apart by comparing each name with those kept:
    // cheaper than hashing every name (SipHash, ~1.5k instructions per admission by callgrind);
    // the hash set keeps a Pod that names thousands linear.
    const FEW: usize = 16;
    if images.len() <= FEW {
        let mut distinct: Vec<String> = Vec::with_capacity(images.len());
        for image in images.iter().map(|c| &c.image) {
            if !distinct.contains(image) {
                distinct.push(image.clone());
            }
        }
        return distinct;
    }
    let mut seen = std::collections::HashSet::with_capacity(images.len());
    images
        .iter()
        .map(|c| c.image.as_str())
        .filter(|image| seen.insert(*image))
        .map(str::to_owned)
        .collect()
}

/// Why the Pod names more than tolerable looks up for one admission, if it does: far above
/// real Pods, so one Pod cannot make tolerable open thousands of registry connections.
fn over_limits(images: &[ContainerImage], distinct: &[String], policy: &Policy) -> Option<String> {
    if images.len() > policy.max_containers_per_pod {
        return Some(explain::too_many_containers(
            images.len(),
            policy.max_containers_per_pod,
        ));
    }
    (distinct.len() > policy.max_images_per_pod)
        .then(|| explain::too_many_images(distinct.len(), policy.max_images_per_pod))
}

/// The core's answer: the decision and the JSON Patch that carries it out.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub decision: Decision,
    /// Empty unless the Pod is placed and lacks something.
    pub patch: Vec<patch::Operation>,
    /// `false` under `enforce = false`: the patch only writes the annotation saying what the
    /// decision would have done, and a denial is not carried out.
    pub enforced: bool,
}

impl Answer {
    /// Not a Pod CREATE: allowed unchanged, nothing said.
    pub fn not_pod_create() -> Self {
        Self::unchanged(Untouched::NotPodCreate, Vec::new())
    }

    /// An object tolerable cannot decide on: left exactly as it came, with a warning saying
    /// why (tolerable never blocks a Pod it does not understand).
    pub fn invalid_object(reason: &str) -> Self {
        Self::unchanged(
            Untouched::InvalidObject,
            vec![explain::invalid_object(reason)],
        )
    }

    fn unchanged(why: Untouched, warnings: Vec<String>) -> Self {
        Self {
            decision: Decision::Unchanged {
                why,
                summary: String::new(),
                warnings,
            },
            patch: Vec::new(),
            enforced: true,
        }
    }

    /// What was decided (also under `enforce = false`, where nothing of it is carried out but
    /// the annotation).
    pub fn outcome(&self) -> Outcome {
        self.decision.outcome()
    }

    pub fn warnings(&self) -> &[String] {
        self.decision.warnings()
    }

    /// The message the Pod is rejected with, when it is (never under `enforce = false`).
    pub fn denial(&self) -> Option<&str> {
        self.decision.denial().filter(|_| self.enforced)
    }

    /// Under `enforce = false`: whether the decision would have changed the Pod (`Some(false)`)
    /// or denied it (`Some(true)`).
    pub fn not_enforced(&self) -> Option<bool> {
        if self.enforced {
            return None;
        }
        match &self.decision {
            Decision::Denied { .. } => Some(true),
            Decision::Placed(placement) if !explain::additions(placement).is_empty() => Some(false),
            Decision::Gated { .. } => Some(false),
            _ => None,
        }
    }
}

/// The one decision function: the Pod being created, what is known of its images, the node
/// pools (when the node watch runs) and the policy → the answer.
pub fn answer(
    request: &PodCreate,
    facts: &ImageFacts,
    pools: Option<&NodePools>,
    policy: &Policy,
) -> Answer {
    let mut answer = answer_object(request, facts, pools, policy);
    if request.template {
        for operation in &mut answer.patch {
            operation.path = format!("/spec/template{}", operation.path).into();
        }
    }
    answer
}

/// [`answer`] for the object itself (paths from its root).
fn answer_object(
    request: &PodCreate,
    facts: &ImageFacts,
    pools: Option<&NodePools>,
    policy: &Policy,
) -> Answer {
    let mut decision = decide(request, facts, pools, policy);
    let namespace = request.namespace_policy.as_deref();
    let own = request.pod_problems.iter().map(explain::pod_problem);
    let problems = namespace
        .into_iter()
        .flat_map(NamespacePolicy::problems)
        .map(|problem| explain::namespace_problem(&request.namespace, &problem));
    decision.warnings_mut().extend(own.chain(problems));
    let enforce = &request.settings.enforce;
    let decided_by = match enforce.level {
        Level::Config => String::new(),
        level => explain::said_by(Knob::Enforce, level, &request.namespace),
    };
    if !enforce.value {
        return report_only(&request.pod, decision, &decided_by);
    }
    if let (Decision::Placed(placement), false) = (&mut decision, decided_by.is_empty()) {
        placement.summary = cut(
            format!("{}; {decided_by}", placement.summary),
            MAX_SUMMARY_BYTES,
        );
        placement.annotation = pod::annotation_update(&request.pod, placement.summary.clone());
    }
    let mut patch = match &decision {
        Decision::Placed(placement) => patch::operations(&request.pod, placement),
        Decision::Gated { summary, .. } => gate::gate_operations(&request.pod, summary),
        _ => Vec::new(),
    };
    if policy.fallback_to_logs_on_error && logs_on_error::applies(&decision) {
        patch.extend(logs_on_error::operations(&request.pod));
    }
    Answer {
        decision,
        patch,
        enforced: true,
    }
}

/// `enforce = false`: the decision is written into the annotation, as what tolerable would
/// have added or why it would have denied the Pod, and nothing else changes.
/// `decided_by` names the level that asked for report only when it is not the config.
fn report_only(pod: &PodView, decision: Decision, decided_by: &str) -> Answer {
    let would = match &decision {
        Decision::Placed(placement) => Some(explain::would_add(
            &explain::additions(placement),
            &placement.summary,
            decided_by,
        )),
        Decision::Denied { message, .. } => Some(explain::would_deny(message, decided_by)),
        Decision::Gated { summary, .. } => Some(explain::would_gate(summary, decided_by)),
        Decision::Unchanged { .. } => None,
    };
    let annotation = would.and_then(|text| {
        pod::annotation_update(pod, explain::cut(text, explain::MAX_SUMMARY_BYTES))
    });
    let patch = match annotation {
        Some(annotation) => patch::operations(
            pod,
            &Placement {
                annotation: Some(annotation),
                ..Placement::default()
            },
        ),
        None => Vec::new(),
    };
    Answer {
        decision,
        patch,
        enforced: false,
    }
}

/// The architectures every image of `request` supports on its OS (as the decision sees them):
/// `None` when the Pod needs no lookups or some image's platforms are unknown. For reports
/// (`tolerable review`, `audit`) that show what the decision is based on.
pub fn architectures_in_common(
    request: &PodCreate,
    facts: &ImageFacts,
    pools: Option<&NodePools>,
    policy: &Policy,
) -> Option<Vec<String>> {
    if request.settled.is_some() {
        return None;
    }
    let known = known_facts(&request.distinct, facts).ok()?;
    Some(common_architectures(&request.pod.os(), &known, policy, pools).architectures)
}

/// The decision alone (see [`answer`]).
pub fn decide(
    request: &PodCreate,
    facts: &ImageFacts,
    pools: Option<&NodePools>,
    policy: &Policy,
) -> Decision {
    match &request.settled {
        Some(Settled::Skipped(reason)) => Decision::Unchanged {
            why: Untouched::Skipped,
            summary: reason.clone(),
            warnings: Vec::new(),
        },
        Some(Settled::OverLimits(reason)) => {
            // Not looked up at all: treated as a lookup failure (allowed unchanged, or denied).
            let deny = (policy.on_lookup_failure == OnLookupFailure::Deny)
                .then(|| explain::not_looked_up_denial(reason));
            let warning = explain::no_tolerations(reason);
            deny_or_leave(deny, reason, vec![warning], Untouched::LookupFailed)
        }
        None => {
            if let Some(gated) = gate_instead(request, facts, policy) {
                return gated;
            }
            let mut decision = decide_from_facts(request, facts, policy, pools);
            let stale = request
                .distinct
                .iter()
                .filter_map(|image| match facts.get(image) {
                    Some(Ok(found)) => found
                        .stale
                        .as_ref()
                        .map(|why| explain::stale_answer(image, why)),
                    _ => None,
                });
            decision.warnings_mut().extend(stale);
            decision
        }
    }
}

/// Under `on_lookup_failure = "gate"`, a Pod with an image whose platforms are unknown is gated
/// (nothing else decided now: one decision, made once all are known), unless it cannot be
/// gated ([`gate::cannot_gate`]): then it is left unchanged with a warning saying why, as with
/// `allow`.
fn gate_instead(request: &PodCreate, facts: &ImageFacts, policy: &Policy) -> Option<Decision> {
    if policy.on_lookup_failure != OnLookupFailure::Gate || request.template {
        return None;
    }
    let waiting = known_facts(&request.distinct, facts).err()?;
    if let Some(why) = gate::cannot_gate(&request.namespace, &request.pod, policy) {
        let mut decision = lookup_failed(&waiting, policy);
        decision.warnings_mut().push(explain::no_tolerations(&why));
        return Some(decision);
    }
    let summary = cut(explain::gated(&waiting), MAX_SUMMARY_BYTES);
    Some(Decision::Gated {
        waiting,
        summary,
        warnings: Vec::new(),
    })
}

fn decide_from_facts(
    request: &PodCreate,
    facts: &ImageFacts,
    policy: &Policy,
    pools: Option<&NodePools>,
) -> Decision {
    let pod = &request.pod;
    let known = match known_facts(&request.distinct, facts) {
        Ok(known) => known,
        Err(failed) => return lookup_failed(&failed, policy),
    };
    let pinning = match request.template {
        true => pin::Pinning::default(),
        false => pin::Pinning::of(&request.settings.pin_digests, &known),
    };
    let shown: Vec<(&str, &ImageFact)> = known
        .iter()
        .map(|(image, fact)| (pinning.shown(image), *fact))
        .collect();
    let os = pod.os();
    let runnable = common_architectures(&os, &shown, policy, pools);
    let (common, described) = (&runnable.architectures, &runnable.described);
    if common.is_empty() {
        return no_common_architecture(&os, &runnable, policy);
    }
    let mut placement = Placement {
        warnings: runnable.warnings.to_vec(),
        pins: pin::rewrites(pod, &pinning.pinned),
        ..Placement::default()
    };
    let seen = Seen {
        pod,
        namespace: &request.namespace,
        preferred: &request.settings.preferred,
        policy,
        pools,
        os: &os,
        common,
    };
    let tolerated = seen.tolerations(&mut placement);
    let fixed = pod::fixed_placement(pod);
    let mut steering_note = seen.steer(fixed.as_ref(), &mut placement);
    if fixed.is_none() {
        let labels_note = node_labels::require(pod, policy, pools, &mut placement);
        explain::join_notes(&mut steering_note, &labels_note);
    }
    let preference_note = seen.prefer(fixed.is_some(), &mut placement);
    let from = |source| -> Vec<&Toleration> {
        tolerated
            .wanted
            .iter()
            .filter(|(_, s)| *s == source)
            .map(|(t, _)| t)
            .collect()
    };
    explain::join_notes(&mut steering_note, &runnable.pulls.join(", "));
    if let Some(level) = pinning.level {
        let note = explain::pinned(level, &request.namespace);
        explain::join_notes(&mut steering_note, &note);
    }
    placement.summary = explain::placed_summary(
        &os,
        common,
        &tolerated.architectures,
        &from(TolerationSource::Template),
        &from(TolerationSource::NodeTaint),
        (&steering_note, &preference_note),
        described,
    );
    placement.annotation = pod::annotation_update(pod, placement.summary.clone());
    Decision::Placed(placement)
}

/// No node architecture runs every image: denied, or left unchanged with a warning.
fn no_common_architecture(os: &str, runnable: &runnable::Common, policy: &Policy) -> Decision {
    let message = cut(
        explain::no_common_architecture(os, &runnable.described, &runnable.candidates),
        MAX_SUMMARY_BYTES,
    );
    let deny =
        (policy.on_no_common_architecture == OnNoCommonArchitecture::Deny).then(|| message.clone());
    let warning = explain::no_tolerations(&message);
    deny_or_leave(
        deny,
        &message,
        vec![warning],
        Untouched::NoCommonArchitecture,
    )
}

/// The facts of each distinct image, or what could not be learned (`image: reason`).
fn known_facts<'a>(
    distinct: &'a [String],
    facts: &'a ImageFacts,
) -> Result<Vec<(&'a str, &'a ImageFact)>, Vec<String>> {
    let mut failed = Vec::new();
    let mut known = Vec::new();
    for image in distinct {
        match facts.get(image) {
            Some(Ok(found)) => known.push((image.as_str(), &**found)),
            Some(Err(reason)) => failed.push(explain::failed_image(image, reason)),
            None => failed.push(explain::not_looked_up(image)),
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
        .then(|| explain::unknown_platforms_denial(&detail));
    let warnings = failed
        .iter()
        .map(|f| explain::unknown_platforms_warning(f))
        .collect();
    deny_or_leave(
        deny,
        &explain::unknown_platforms_reason(&detail),
        warnings,
        Untouched::LookupFailed,
    )
}

/// What the decision sees once the images' common architectures are known.
struct Seen<'a> {
    pod: &'a PodView,
    /// The Pod's Namespace.
    namespace: &'a str,
    /// The preference resolved for the Pod, and the level that set it.
    preferred: &'a knobs::Resolved<Vec<WeightedArchitecture>>,
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

/// Where a toleration the decision wants came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TolerationSource {
    /// `[tolerations]` or `[architecture_tolerations.<arch>]`.
    Template,
    /// A taint the node watch saw on that architecture's nodes that no template tolerates.
    NodeTaint,
}

impl<'a> Seen<'a> {
    /// Every tolerated architecture gets its templates whether or not its nodes exist now: a
    /// pool that scales from zero grows only for a Pending Pod that tolerates its taint. A taint
    /// the node watch sees on that architecture's nodes that no template tolerates is copied too.
    /// Adds to `placement` what the Pod does not already tolerate.
    fn tolerations(&self, placement: &mut Placement) -> Tolerated<'a> {
        let existing = self.pod.tolerations();
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
                    placement.tolerations.push(toleration.clone());
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
                    placement.tolerations.push(toleration.clone());
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
    fn steer(&self, fixed: Option<&FixedPlacement>, placement: &mut Placement) -> String {
        let (policy, common, os) = (self.policy, self.common, self.os);
        // Images that run on every architecture the cluster has or may add need no steering.
        let runs_everywhere = policy
            .possible_architectures(self.pools)
            .all(|a| common.contains(a));
        let mut note = String::new();
        match pod::existing_arch_constraint(self.pod, policy.steering, common) {
            ExistingConstraint::Ours => note = explain::steering(policy.steering, common),
            ExistingConstraint::Theirs { allowed } => {
                note = explain::KEPT_OWN_CONSTRAINT.into();
                let unsupported: Vec<&String> = allowed
                    .iter()
                    .flatten()
                    .filter(|a| !common.contains(a))
                    .collect();
                if !unsupported.is_empty() {
                    let warning = explain::constraint_allows_more(&unsupported, common, os);
                    placement.warnings.push(warning);
                }
            }
            ExistingConstraint::None if fixed.is_some() => {}
            ExistingConstraint::None if runs_everywhere => note = explain::RUNS_EVERYWHERE.into(),
            ExistingConstraint::None => match policy.steering {
                Steering::Off => {}
                Steering::NodeSelector if common.len() == 1 => {
                    placement.node_selector = Some(common[0].clone());
                    note = explain::steering(policy.steering, common);
                }
                Steering::NodeSelector => {}
                Steering::NodeAffinity => {
                    placement.required_architectures = Some(common.to_vec());
                    note = explain::steering(policy.steering, common);
                }
            },
        }
        if let Some(fixed) = fixed {
            self.note_fixed_placement(fixed, &mut note, placement);
        }
        note
    }

    /// A Pod the scheduler does not place freely is never steered; say where it is headed when
    /// its images cannot run there (if the node watch knows that node).
    fn note_fixed_placement(
        &self,
        fixed: &FixedPlacement,
        note: &mut String,
        placement: &mut Placement,
    ) {
        if !note.is_empty() {
            note.push_str("; ");
        }
        note.push_str(&explain::no_steering(&fixed.why));
        let headed = fixed.node.as_ref().and_then(|node| {
            let arch = self.pools?.nodes.get(node)?;
            Some((node, arch))
        });
        if let Some((node, arch)) = headed.filter(|(_, arch)| !self.common.contains(arch)) {
            let warning = explain::headed_for(node, arch, self.common, self.os);
            note.push_str(&format!(" ({warning})"));
            placement.warnings.push(warning);
        }
    }

    /// A preference among several possible architectures: the Pod's own label or annotation,
    /// else its Namespace's annotation, else the config's. The note for the summary (naming
    /// the level).
    fn prefer(&self, placed: bool, placement: &mut Placement) -> String {
        let common = self.common;
        let (preferred, level) = (&self.preferred.value, self.preferred.level);
        if level == Level::Pod {
            for unknown in preferred
                .iter()
                .filter(|p| !common.contains(&p.architecture))
            {
                let warning = explain::preference_ignored(&unknown.architecture, common, self.os);
                placement.warnings.push(warning);
            }
        }
        let preferred: Vec<WeightedArchitecture> = preferred
            .iter()
            .filter(|p| common.len() > 1 && common.contains(&p.architecture) && !placed)
            .cloned()
            .collect();
        if preferred.is_empty() {
            return String::new();
        }
        let said_by = explain::said_by(Knob::Preferred, level, self.namespace);
        let note = format!("{} ({said_by})", explain::preference(&preferred));
        if !pod::has_preferred_arch_term(self.pod) {
            placement.preferred_architectures = preferred;
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
    Some(pools::toleration_for(taint, seconds))
}

/// A Pod tolerable does not change: denied with `deny` when the policy says so, else left as it
/// came (no patch at all) with `warnings`, `why` saying why.
fn deny_or_leave(
    deny: Option<String>,
    reason: &str,
    warnings: Vec<String>,
    why: Untouched,
) -> Decision {
    match deny {
        Some(message) => Decision::Denied {
            why,
            message,
            summary: explain::denied_summary(reason),
            warnings: Vec::new(),
        },
        None => Decision::Unchanged {
            why,
            summary: explain::unchanged_summary(reason),
            warnings,
        },
    }
}

#[cfg(test)]
mod tests;
