//! The AdmissionReview shell: one AdmissionReview end to end, and nothing else. It parses the
//! wire format ([`wire`]), turns the request into what the engine decides on
//! ([`read_request`]: a Pod CREATE, a DaemonSet's template, or an answer already — not a Pod, a
//! skipped namespace, an object that cannot be read), lets the [`Engine`] gather the facts and
//! decide, and encodes the answer ([`respond`]). The webhook handler and `tolerable review` (for
//! an AdmissionReview file) call [`Admission::answer_review`]; the fuzz harness the same pure
//! steps ([`read_request`], [`mutate::answer`], [`respond`]) without the lookups.

pub(crate) mod wire;

use std::time::Duration;

use crate::cluster::events::{Recorder, Regarding, Warning};
use crate::cluster::namespaces::NamespacePolicies;
use crate::cluster::PullSecretRefs;
use crate::engine::{read_pod, Engine, LookupCauses, PodAnswer, PodRead};
use crate::mutate::{self, Answer, PodCreate, Policy};

use self::wire::{AdmissionRequest, AdmissionReviewOut, ReviewError};

/// The answer to one AdmissionReview: the core's answer and the encoded response.
#[derive(Debug)]
pub struct AnsweredReview {
    /// The response (it carries the request's uid, the patch and every warning: the core's
    /// and the shell's).
    pub out: AdmissionReviewOut,
    pub answer: Answer,
    /// Why lookups failed to reach their registry, per image: for a terminal (`review`); the
    /// webhook never sends them.
    pub lookup_causes: LookupCauses,
}

impl AnsweredReview {
    /// The label of metrics and logs the answer falls under.
    pub(crate) fn outcome(&self) -> mutate::Outcome {
        self.answer.outcome()
    }

    /// The one line that says what was decided (the annotation's text).
    pub(crate) fn summary(&self) -> &str {
        self.answer.decision.summary()
    }
}

/// The webhook's side of the engine: AdmissionReviews in, AdmissionReviews out.
#[derive(Clone)]
pub struct Admission {
    engine: Engine,
    /// `[events] on_admission`: Warning Events on the owners of Pods whose images share no
    /// node architecture or could not be looked up.
    events: Option<Recorder>,
}

impl Admission {
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            events: None,
        }
    }

    /// Warns each answered Pod's controller owner through `events` when its images share no
    /// node architecture or could not be looked up (`[events] on_admission`).
    pub(crate) fn with_events(mut self, events: Recorder) -> Self {
        self.events = Some(events);
        self
    }

    /// The engine it decides with (the gate controller shares it).
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Answers one AdmissionReview body within `budget` (the time left for image lookups).
    /// `Err` only when the body is not an AdmissionReview at all.
    pub async fn answer_review(
        &self,
        body: &[u8],
        budget: Duration,
    ) -> Result<AnsweredReview, ReviewError> {
        let review = wire::parse(body)?;
        let request = review.request.as_ref().expect("parse checks the request");
        tracing::Span::current().record("uid", request.uid.as_str());
        let PodAnswer {
            answer,
            shell_warnings,
            lookup_causes,
            ..
        } = match read_request(request, self.engine.policy(), self.engine.namespaces()) {
            PodRead::Decide(pod, pull_secrets) => {
                let answered = self.engine.decide(&pod, &pull_secrets, budget).await;
                if request.dry_run != Some(true) {
                    self.warn_owner(&pod, &answered.answer);
                }
                answered
            }
            PodRead::Answered(answer) => answer.into(),
        };
        let out = respond(AdmissionReviewOut::allow(&review), &answer, &shell_warnings);
        if let Some(metrics) = self.engine.metrics() {
            metrics.decided(&answer);
        }
        Ok(AnsweredReview {
            out,
            answer,
            lookup_causes,
        })
    }
}

impl Admission {
    /// Hands the owner's Warning Event, if the answer calls for one, to the recorder (which
    /// never waits: the admission is not held by the API server).
    fn warn_owner(&self, pod: &PodCreate, answer: &Answer) {
        let Some(events) = &self.events else { return };
        let Some(warning) = mutate::owner_warning::owner_warning(pod, answer) else {
            return;
        };
        events.warn(Warning {
            regarding: Regarding {
                api_version: warning.owner.api_version,
                kind: warning.owner.kind,
                namespace: pod.namespace.clone(),
                name: warning.owner.name,
                uid: warning.owner.uid,
            },
            reason: warning.reason.into(),
            action: warning.action.into(),
            note: warning.note,
        });
    }
}

/// What `request` asks of the core (in a Namespace whose policy `namespaces` knows, when given).
pub(crate) fn read_request(
    request: &AdmissionRequest,
    policy: &Policy,
    namespaces: Option<&NamespacePolicies>,
) -> PodRead {
    if request.is_daemon_set_write() {
        return match request.daemon_set_template() {
            Ok(object) => {
                match read_pod(request.namespace.as_deref(), object, policy, namespaces) {
                    PodRead::Decide(pod, pull_secrets) => {
                        PodRead::Decide(pod.into_template(), pull_secrets)
                    }
                    answered => answered,
                }
            }
            Err(reason) => PodRead::Answered(Answer::invalid_object(&reason)),
        };
    }
    if !request.is_pod_create() {
        return PodRead::Answered(Answer::not_pod_create());
    }
    if let Some(skipped) = skipped_namespace(request, policy, namespaces) {
        return skipped;
    }
    match request.pod() {
        Ok(object) => read_pod(request.namespace.as_deref(), object, policy, namespaces),
        Err(reason) => PodRead::Answered(Answer::invalid_object(&reason)),
    }
}

/// A Pod CREATE in a Namespace tolerable leaves alone (`skip_namespaces`, or the Namespace's own
/// opt-out), answered from the Pod's metadata alone: its spec is never read, its images never
/// listed. `None` for any other Namespace, and for an object whose metadata cannot be read
/// (the whole read says why).
fn skipped_namespace(
    request: &AdmissionRequest,
    policy: &Policy,
    namespaces: Option<&NamespacePolicies>,
) -> Option<PodRead> {
    let namespace = request.namespace.as_deref()?;
    let namespace_policy = namespaces.and_then(|n| n.get(namespace));
    let skipped = policy.skip_namespaces.contains(namespace)
        || namespace_policy
            .as_deref()
            .is_some_and(|n| n.knobs.skip == Some(true));
    if !skipped {
        return None;
    }
    let object = request.pod_metadata().ok()?;
    PodCreate::skipped(namespace, namespace_policy, object.view, policy)
        .map(|pod| PodRead::Decide(pod, PullSecretRefs::default()))
}

/// The response carrying `answer`: its warnings and then the shell's, and its patch or denial.
pub(crate) fn respond(
    allowed: AdmissionReviewOut,
    answer: &Answer,
    shell_warnings: &[String],
) -> AdmissionReviewOut {
    let out = allowed.with_warnings(answer.warnings().iter().chain(shell_warnings));
    match answer.denial() {
        Some(message) => out.deny(message),
        None if answer.patch.is_empty() => out,
        None => out.with_patch_text(|json| mutate::patch::write_json(&answer.patch, json)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutate::ImageFacts;

    fn review(namespace: &str, spec: serde_json::Value) -> String {
        serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": "CREATE", "namespace": namespace,
                "object": {"metadata": {"name": "p", "labels": {"app": "web"}}, "spec": spec},
            },
        })
        .to_string()
    }

    /// What the webhook answers `body` when every lookup finds nothing (none is made for a
    /// skipped Pod), and whether it read the Pod's spec to answer.
    fn answer_for(body: &str, policy: &Policy) -> (Answer, bool) {
        let review = wire::parse(body.as_bytes()).unwrap();
        match read_request(review.request.as_ref().unwrap(), policy, None) {
            PodRead::Decide(pod, _) => {
                let read_spec = pod.pod.spec.is_some();
                (
                    mutate::answer(&pod, &ImageFacts::new(), None, policy),
                    read_spec,
                )
            }
            PodRead::Answered(answer) => (answer, true),
        }
    }

    /// A Pod in a Namespace of `skip_namespaces` is answered from its metadata: the answer is
    /// the one the whole read gives, and a spec that is not even valid does not change it; in
    /// another Namespace that spec is read and warned about.
    #[test]
    fn a_pod_in_a_skipped_namespace_is_answered_from_its_metadata_alone() {
        let policy = Policy::default();
        assert!(policy.skip_namespaces.contains("kube-system"));
        let valid = serde_json::json!({"containers": [{"name": "c", "image": "app:1"}]});
        let (skipped, read_spec) = answer_for(&review("kube-system", valid.clone()), &policy);
        assert!(!read_spec, "the spec of a skipped Pod is not read");
        assert_eq!(
            skipped.decision.summary(),
            "namespace kube-system is in skip_namespaces"
        );
        assert!(skipped.patch.is_empty() && skipped.warnings().is_empty());

        let body = review("kube-system", valid);
        let parsed = wire::parse(body.as_bytes()).unwrap();
        let object = parsed.request.as_ref().unwrap().pod().unwrap();
        let whole = PodCreate::in_namespace("kube-system", None, object.view, &policy).unwrap();
        assert_eq!(
            skipped,
            mutate::answer(&whole, &ImageFacts::new(), None, &policy)
        );

        let invalid = serde_json::json!({"containers": 5});
        assert_eq!(
            answer_for(&review("kube-system", invalid.clone()), &policy),
            (skipped, false)
        );
        let (elsewhere, _) = answer_for(&review("apps", invalid), &policy);
        assert!(
            elsewhere.warnings()[0].contains("not a valid Pod"),
            "{elsewhere:?}"
        );
    }
}
