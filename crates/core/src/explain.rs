//! Every text the core writes — the summary (which is also the decision annotation, the deny
//! message's detail and the log line's `why`), warnings, deny messages — from the decision's
//! data. The rules live in `mutate.rs`; how they are put into words lives here, so wording can
//! change in one place and the rules read as rules.

use std::fmt::{Display, Write as _};

use k8s_openapi::api::core::v1::Toleration;

use super::decision::Placement;
use super::facts::{ImageFact, Provenance, Staleness};
use super::knobs::{Knob, Problem};
use super::platform::Platform;
use super::{
    Level, Steering, WeightedArchitecture, ARCH_LABEL, PREFERRED_KEY, PREFERRED_WEIGHT, SKIP_KEY,
};

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

/// Items separated by commas.
pub fn comma_list<T: Display>(items: impl IntoIterator<Item = T>) -> String {
    let mut out = String::new();
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{item}");
    }
    out
}

/// `key=value:effect` as `kubectl taint` writes it (`key:effect` without a value, no `:effect`
/// for every effect): how the decision annotation names a toleration.
pub fn toleration_text(t: &Toleration) -> String {
    let mut text = t.key.clone().unwrap_or_else(|| "*".into());
    if let Some(value) = t.value.as_deref().filter(|v| !v.is_empty()) {
        let _ = write!(text, "={value}");
    }
    if let Some(effect) = t.effect.as_deref().filter(|e| !e.is_empty()) {
        let _ = write!(text, ":{effect}");
    }
    text
}

// Before any lookup.

pub fn invalid_object(reason: &str) -> String {
    format!("tolerable left the Pod unchanged: {reason}")
}

pub fn skipped_namespace(namespace: &str) -> String {
    format!("namespace {namespace} is in skip_namespaces")
}

pub fn opted_out() -> String {
    format!("the Pod opted out with {SKIP_KEY}=true")
}

pub fn too_many_containers(count: usize, max: usize) -> String {
    format!("the Pod has {count} containers and image volumes, more than max_containers_per_pod ({max})")
}

pub fn too_many_images(count: usize, max: usize) -> String {
    format!("the Pod names {count} distinct images, more than max_images_per_pod ({max})")
}

pub fn not_looked_up_denial(reason: &str) -> String {
    format!("tolerable did not look the images up: {reason}")
}

/// The warning of every Pod left without tolerations.
pub fn no_tolerations(reason: &str) -> String {
    format!("tolerable added no tolerations: {reason}")
}

// After the lookups.

/// `image: reason` for each image whose platforms are unknown.
pub fn failed_image(image: &str, reason: &dyn Display) -> String {
    format!("{image}: {reason}")
}

pub fn not_looked_up(image: &str) -> String {
    format!("{image}: not looked up")
}

pub fn unknown_platforms_denial(detail: &str) -> String {
    format!("tolerable could not determine the platforms of: {detail}")
}

pub fn unknown_platforms_warning(failed: &str) -> String {
    no_tolerations(&format!("platforms unknown for {failed}"))
}

pub fn unknown_platforms_reason(detail: &str) -> String {
    format!("platforms unknown ({detail})")
}

/// No node architecture runs every image: the images' platforms, and the node architectures
/// considered (those the cluster has or may add).
pub fn no_common_architecture(os: &str, described: &str, candidates: &[String]) -> String {
    let mut text = format!("no {os} architecture is common to all images: {described}");
    if !candidates.is_empty() {
        let _ = write!(text, "; no node of {} runs them all", candidates.join(","));
    }
    text
}

/// The summary's note when images by tag are pinned to the digests decided on (the images it
/// lists then name their digests).
pub fn pinned(level: Level, namespace: &str) -> String {
    let by = said_by(Knob::PinDigests, level, namespace);
    format!("images pinned to the digests decided on ({by})")
}

/// Where a node architecture pulls other than its own platform: `amd64 pulls linux/386 for
/// app:1`.
pub fn pulls(arch: &str, platform: &Platform, image: &str) -> String {
    format!("{arch} pulls {platform} for {image}")
}

/// An image that runs on `arch`'s nodes only if their CPUs meet the variant it needs.
pub fn variant_unknown(image: &str, arch: &str, platform: &Platform) -> String {
    format!(
        "{image} has only {platform} for {arch}: it runs only on {arch} nodes whose CPU meets that \
         variant, and nothing says they do (set [policy] node_variants)"
    )
}

/// The note of a Warning Event on a Pod's controller owner: which Pod, what was decided and why.
pub fn owner_warning(kind: &str, name: &str, summary: &str) -> String {
    format!("a Pod of {kind} {name}: {summary}")
}

pub fn denied_summary(reason: &str) -> String {
    format!("denied: {reason}")
}

pub fn unchanged_summary(reason: &str) -> String {
    format!("unchanged: {reason}")
}

/// A decision made on a last known answer says so: the registry may have changed since.
pub fn stale_answer(image: &str, stale: &Staleness) -> String {
    format!("{image}: {stale}")
}

/// One image for the summary: `app:1 (linux/amd64,linux/arm64; credentials from secret …)`.
/// Names where a credential came from (never what it is), so a private image's answer can be
/// traced to the pull secret that opened it.
pub fn describe_image(out: &mut String, image: &str, fact: &ImageFact) {
    if !out.is_empty() {
        out.push_str(", ");
    }
    // Pushed piece by piece rather than formatted: this runs for every image of every decided
    // admission.
    out.push_str(image);
    out.push_str(" (");
    match &fact.artifact {
        Some(config_type) => {
            out.push_str("artifact ");
            out.push_str(config_type);
            out.push_str(": any platform");
        }
        None => {
            for (i, platform) in fact.platforms.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                platform.push_to(out);
            }
        }
    }
    if let Provenance::Credential(source) = &fact.credentials {
        let _ = write!(out, "; credentials from {source}");
    }
    out.push(')');
}

/// What a placement adds to the Pod, one item each: `toleration kubernetes.io/arch=arm64:NoSchedule`,
/// `nodeSelector kubernetes.io/arch=arm64`, `requires kubernetes.io/arch in (amd64,arm64)`,
/// `prefers arm64`; empty when the Pod already has all of it.
pub fn additions(placement: &Placement) -> Vec<String> {
    let mut out: Vec<String> = placement
        .tolerations
        .iter()
        .map(|t| format!("toleration {}", toleration_text(t)))
        .collect();
    if let Some(arch) = &placement.node_selector {
        out.push(format!("nodeSelector {ARCH_LABEL}={arch}"));
    }
    if let Some(architectures) = &placement.required_architectures {
        out.push(format!(
            "requires {ARCH_LABEL} in ({})",
            architectures.join(",")
        ));
    }
    for (key, value) in &placement.node_selector_labels {
        out.push(format!("nodeSelector {key}={value}"));
    }
    for (key, value) in &placement.required_labels {
        out.push(format!("requires {key} in ({value})"));
    }
    if !placement.preferred_architectures.is_empty() {
        out.push(preference(&placement.preferred_architectures)["; ".len()..].to_owned());
    }
    for pin in &placement.pins {
        out.push(format!("pins {}", pin.image));
    }
    out
}

/// The annotation under `enforce = false` for a placed Pod.
/// `decided_by`: the level that asked for report only ([`enforce_level`]), empty for the
/// config.
pub fn would_add(additions: &[String], summary: &str, decided_by: &str) -> String {
    let additions = if additions.is_empty() {
        "nothing".to_owned()
    } else {
        additions.join("; ")
    };
    format!(
        "{}: would add {additions}; {summary}",
        report_only(decided_by)
    )
}

/// The annotation under report only for a Pod the decision denies.
pub fn would_deny(message: &str, decided_by: &str) -> String {
    format!("{}: would deny: {message}", report_only(decided_by))
}

fn report_only(decided_by: &str) -> String {
    if decided_by.is_empty() {
        "report only (enforce = false)".into()
    } else {
        format!("report only ({decided_by})")
    }
}

// Per-namespace policy.

/// The one place a knob's level is written into an explanation: `the Pod's KEY`, `namespace
/// NS's KEY`, or the config's key.
pub fn said_by(knob: Knob, level: Level, namespace: &str) -> String {
    match level {
        Level::Pod => format!("the Pod's {}", knob.key()),
        Level::Namespace => format!("namespace {namespace}'s {}", knob.key()),
        Level::Config => knob.config_key().to_owned(),
    }
}

/// Why a Pod is left alone without a lookup, naming the strongest level that opted it out.
pub fn skipped(level: Level, namespace: &str) -> String {
    match level {
        Level::Pod => opted_out(),
        Level::Namespace => namespace_opted_out(namespace),
        Level::Config => skipped_namespace(namespace),
    }
}

/// A value of the Pod's own that was ignored (a knob that did not parse).
pub fn pod_problem(problem: &Problem) -> String {
    format!("the Pod's {} ignored: {}", problem.key, problem.reason)
}

/// The Pod's Namespace is labelled `tolerable.io/skip=true`.
pub fn namespace_opted_out(namespace: &str) -> String {
    format!("namespace {namespace} opted out with {SKIP_KEY}=true")
}

/// A key on the Pod's Namespace that was ignored (`problem` says which and why).
pub fn namespace_problem(namespace: &str, problem: &str) -> String {
    format!("namespace {namespace}: {problem}")
}

// Steering and preferences.

pub fn steering(steering: Steering, common: &[String]) -> String {
    match steering {
        Steering::Off => String::new(),
        Steering::NodeSelector => format!("nodeSelector {ARCH_LABEL}={}", common[0]),
        Steering::NodeAffinity => format!("requires {ARCH_LABEL} in ({})", common.join(",")),
    }
}

pub const KEPT_OWN_CONSTRAINT: &str = "kept the Pod's own kubernetes.io/arch constraint";

pub const RUNS_EVERYWHERE: &str =
    "no steering: the images run on every architecture the cluster has or may add";

pub fn constraint_allows_more(unsupported: &[&String], common: &[String], os: &str) -> String {
    format!(
        "the Pod allows kubernetes.io/arch {} but its images support only {} on {os}",
        comma_list(unsupported),
        common.join(",")
    )
}

// match_node_labels.

/// `note` and `more`, separated as the summary separates its parts.
pub fn join_notes(note: &mut String, more: &str) {
    if more.is_empty() {
        return;
    }
    if !note.is_empty() {
        note.push_str("; ");
    }
    note.push_str(more);
}

/// One matched label for the summary: `team=ml`, and whether the Pod's own constraint on the
/// key was kept although it contradicts the label.
pub fn node_label_required(key: &str, value: &str, kept_contradiction: bool) -> String {
    if kept_contradiction {
        format!("{key}={value} (kept the Pod's own {key} constraint)")
    } else {
        format!("{key}={value}")
    }
}

/// `nodes labelled like the Pod: team=ml, …`; empty when no label matched.
pub fn node_labels(matched: &[String]) -> String {
    if matched.is_empty() {
        return String::new();
    }
    format!("nodes labelled like the Pod: {}", matched.join(", "))
}

/// With the node watch: no node carries the label the Pod must match.
pub fn no_node_labelled(key: &str, value: &str) -> String {
    format!(
        "no node is labelled {key}={value} (match_node_labels): the Pod stays Pending until one is"
    )
}

pub fn node_label_contradicted(key: &str, value: &str, own: &str) -> String {
    format!(
        "the Pod is labelled {key}={value} (match_node_labels) but its own constraint {own} \
         excludes nodes labelled so; kept it as it is"
    )
}

/// A node selector requirement as the summary writes one: `team NotIn (ml,web)`, `gpu Exists`.
pub fn requirement_text(e: &k8s_openapi::api::core::v1::NodeSelectorRequirement) -> String {
    match e.values.as_deref() {
        Some(values) if !values.is_empty() => {
            format!("{} {} ({})", e.key, e.operator, values.join(","))
        }
        _ => format!("{} {}", e.key, e.operator),
    }
}

pub fn no_steering(why: &str) -> String {
    format!("no steering: {why}")
}

pub fn headed_for(node: &str, arch: &str, common: &[String], os: &str) -> String {
    format!(
        "the Pod is headed for node {node} ({arch}) but its images support only {} on {os}",
        common.join(",")
    )
}

pub fn bound_to(node: &str) -> String {
    format!("bound to node {node}")
}

pub fn owned_by_daemon_set(name: &str) -> String {
    format!("owned by DaemonSet {name}")
}

pub fn pinned_to(node: &str) -> String {
    format!("pinned to node {node} by metadata.name")
}

pub fn preference_ignored(arch: &str, common: &[String], os: &str) -> String {
    format!(
        "{PREFERRED_KEY}={arch} ignored: the images support only {} on {os}",
        common.join(",")
    )
}

/// `; prefers arm64 (weight 80), amd64 (weight 20)`; the weight only when it says something.
pub fn preference(preferred: &[WeightedArchitecture]) -> String {
    let mut note = String::from("; prefers ");
    for (i, p) in preferred.iter().enumerate() {
        if i > 0 {
            note.push_str(", ");
        }
        note.push_str(&p.architecture);
        if preferred.len() > 1 || p.weight != PREFERRED_WEIGHT {
            let _ = write!(note, " (weight {})", p.weight);
        }
    }
    note
}

/// The summary of a placed Pod:
/// `linux architectures amd64,arm64; tolerates arm64 (templates: …); requires …; images: …`.
pub fn placed_summary(
    os: &str,
    common: &[String],
    tolerated: &[&String],
    templates: &[&Toleration],
    from_node_taints: &[&Toleration],
    notes: (&str, &str),
    described: &str,
) -> String {
    let (steering_note, preference_note) = notes;
    let mut summary = String::with_capacity(160 + described.len());
    let _ = write!(summary, "{os} architectures {}; ", common.join(","));
    summary.push_str("tolerates ");
    if tolerated.is_empty() {
        summary.push_str("no tainted pool");
    } else {
        summary.push_str(&comma_list(tolerated));
        for (list, label) in [
            (templates, " (templates: "),
            (from_node_taints, "; taints seen on nodes: "),
        ] {
            for (i, toleration) in list.iter().enumerate() {
                summary.push_str(if i == 0 { label } else { ", " });
                summary.push_str(&toleration_text(toleration));
            }
        }
        summary.push(')');
    }
    if !steering_note.is_empty() {
        summary.push_str("; ");
        summary.push_str(steering_note);
    }
    summary.push_str(preference_note);
    summary.push_str("; images: ");
    summary.push_str(described);
    cut(summary, MAX_SUMMARY_BYTES)
}

// Scheduling gates (`on_lookup_failure = "gate"`).

/// The summary (= annotation) of a Pod gated at admission: each image waited for and why.
pub fn gated(waiting: &[String]) -> String {
    format!(
        "gated (tolerable.io/architecture): waiting for the platforms of {}",
        waiting.join("; ")
    )
}

/// Why a Pod whose lookups failed under `on_lookup_failure = "gate"` was not gated.
pub fn not_gated(why: &str) -> String {
    format!("not gated: {why}")
}

/// The annotation of a gated Pod whose images share no architecture.
pub fn unrunnable(summary: &str) -> String {
    format!("stays gated, no node can run it: {summary}")
}

/// The annotation of a gated Pod released unchanged.
pub fn released_unchanged(why: &str) -> String {
    format!("released unchanged: {why}")
}

/// The annotation under `enforce = false` for a Pod the decision would gate.
pub fn would_gate(summary: &str, decided_by: &str) -> String {
    format!("{}: would be {summary}", report_only(decided_by))
}
