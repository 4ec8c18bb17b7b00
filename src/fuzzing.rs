//! Entry points for the cargo-fuzz targets in `fuzz/` and for the test that replays their seed
//! corpora on every `make test` (so the harnesses cannot rot). Each takes arbitrary bytes and
//! panics only when an invariant is broken; errors are expected and ignored.

use std::sync::Arc;

use crate::admission;
use crate::admission::wire::{self, AdmissionReviewOut};
use crate::engine::PodRead;
use crate::mutate::{self, ImageFact, ImageFacts, PodCreate, Policy, Provenance};
use crate::registry::{manifest, ImageReference, Platform};

/// An image reference: parsing never panics, and what parses prints back to an equal reference.
pub fn reference(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(parsed) = ImageReference::parse(text) {
        let printed = parsed.to_string();
        let again = ImageReference::parse(&printed)
            .unwrap_or_else(|e| panic!("{text:?} parsed, but its printed form did not: {e}"));
        assert_eq!(
            again.to_string(),
            printed,
            "printing is not stable for {text:?}"
        );
        assert_eq!(again.registry(), parsed.registry());
        assert_eq!(again.repository(), parsed.repository());
    }
}

/// A manifest, index or image config body: parsing never panics, with or without a
/// Content-Type, and a parsed index's platforms are well formed.
pub fn manifest(data: &[u8]) {
    for content_type in [None, Some(manifest::OCI_INDEX), Some("application/json")] {
        let _ = manifest::parse_manifest(data, content_type);
    }
    if let Ok(platform) = manifest::parse_image_config(data) {
        assert!(
            !platform.architecture.is_empty(),
            "empty architecture accepted"
        );
    }
}

/// A token service's answer: never panics, and a token that is accepted is a non-empty `Bearer`
/// header value, marked sensitive (so it is never logged), with a lifetime above zero.
pub fn token_response(data: &[u8]) {
    let Ok((header, life)) = crate::registry::client::parse_token_response(data) else {
        return;
    };
    let shown = header
        .to_str()
        .expect("an accepted token is a visible-ASCII header value");
    let token = shown
        .strip_prefix("Bearer ")
        .expect("an accepted token is sent as a Bearer credential");
    assert!(!token.is_empty(), "an empty token was accepted");
    assert!(
        header.is_sensitive(),
        "the token header is not marked sensitive"
    );
    assert!(!life.is_zero(), "an accepted token has no lifetime");
}

/// An AdmissionReview body, answered as the webhook answers it (the same parse, the same pure
/// answer function) with every image resolved to linux/amd64 and linux/arm64: parsing never
/// panics, the scanner's fast read (`engine::json_scan`) reads exactly what serde_json reads
/// alone, the answer serializes, and the JSON Patch applies cleanly to the object it was made
/// for (tolerable never corrupts a Pod).
pub fn admission_review(data: &[u8]) {
    let read = wire::parse(data);
    assert_eq!(
        read,
        wire::parse_whole(data),
        "the scanned read and serde_json's differ"
    );
    let Ok(review) = read else {
        return;
    };
    let request = review.request.as_ref().expect("parse checks the request");
    assert!(
        request.scanned_reads_agree(),
        "the scanned Pod reads and serde_json's differ"
    );
    let answer = match admission::read_request(request, &policy(), None) {
        PodRead::Decide(pod, _) => mutate::answer(&pod, &facts_for(&pod), None, &policy()),
        PodRead::Answered(answer) => answer,
    };
    let out = admission::respond(AdmissionReviewOut::allow(&review), &answer, &[]);
    serde_json::to_vec(&out).expect("answers serialize");
    let parsed = serde_json::from_slice::<serde_json::Value>(data);
    let mut review = match parsed {
        Ok(review) => review,
        // Deeper than serde_json's recursion limit: the wire types read it, a whole tree does not.
        Err(_) if answer.patch.is_empty() => return,
        Err(e) => panic!("it parsed as an AdmissionReview, so it is JSON: {e}"),
    };
    let object = review["request"]["object"].take();
    if !answer.patch.is_empty() {
        apply(object.clone(), &answer.patch, "the Pod it was made for");
    }
    gate_then_release(request, object);
}

/// Under `on_lookup_failure = "gate"` with every lookup failed: the gate patch applies to the
/// Pod, and the release made from the gated Pod (its images then known) applies to it.
fn gate_then_release(request: &wire::AdmissionRequest, object: serde_json::Value) {
    let gating = Policy {
        on_lookup_failure: mutate::OnLookupFailure::Gate,
        ..policy()
    };
    let PodRead::Decide(pod, _) = admission::read_request(request, &gating, None) else {
        return;
    };
    let failed: ImageFacts = pod
        .images_to_look_up()
        .iter()
        .map(|image| {
            let down = mutate::LookupFailure::Unavailable("registry down".into());
            (image.clone(), Err(down))
        })
        .collect();
    let answer = mutate::answer(&pod, &failed, None, &gating);
    if answer.outcome() != mutate::Outcome::Gated {
        return;
    }
    let gated = apply(object, &answer.patch, "the Pod it gates");
    let Ok(read) = crate::engine::PodObject::from_value(&gated) else {
        panic!("the gated Pod is no Pod tolerable reads");
    };
    let Ok(again) = PodCreate::new(pod.namespace.clone(), read.view, &gating) else {
        return;
    };
    let patch = match mutate::gate::release(&again, &facts_for(&again), None, &gating) {
        mutate::gate::Release::Decided { patch, .. }
        | mutate::gate::Release::Unrunnable { patch, .. } => patch,
        mutate::gate::Release::NotGated(_) | mutate::gate::Release::Waiting(_) => {
            panic!("a gated Pod whose images are known is released")
        }
    };
    apply(gated, &patch, "the gated Pod");
}

/// `ops` applied to `object`: panics (an invariant broken) when they do not apply.
fn apply(
    mut object: serde_json::Value,
    ops: &[mutate::patch::Operation],
    what: &str,
) -> serde_json::Value {
    let ops: json_patch::Patch =
        serde_json::from_value(serde_json::to_value(ops).expect("operations serialize"))
            .expect("our operations are a JSON Patch");
    if let Err(e) = json_patch::patch(&mut object, &ops) {
        panic!("the patch does not apply to {what}: {e}");
    }
    object
}

/// Every image of `pod` runs on linux/amd64 and linux/arm64.
fn facts_for(pod: &PodCreate) -> ImageFacts {
    let found = Arc::new(ImageFact {
        platforms: vec![
            Platform::normalized("linux", "amd64", None),
            Platform::normalized("linux", "arm64", None),
        ],
        artifact: None,
        credentials: Provenance::Anonymous,
        stale: None,
        digest: None,
    });
    pod.images_to_look_up()
        .iter()
        .map(|image| (image.clone(), Ok(found.clone())))
        .collect()
}

fn policy() -> Policy {
    Policy {
        preferred_architectures: vec![
            crate::mutate::WeightedArchitecture {
                architecture: "arm64".into(),
                weight: 80,
            },
            crate::mutate::WeightedArchitecture {
                architecture: "amd64".into(),
                weight: 20,
            },
        ],
        // Pods labelled with either get `key In [value]` ANDed into their terms.
        match_node_labels: vec!["team".into(), "topology.kubernetes.io/region".into()],
        ..Policy::default()
    }
}
