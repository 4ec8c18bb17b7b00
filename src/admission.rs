//! The async shell around the decision core: one AdmissionReview end to end. It parses the wire
//! format ([`wire`]), gathers the facts (the Pod's pull secrets, its images' platforms) within
//! one budget ([`crate::budget`]), asks the core for the answer ([`mutate::answer`]) and encodes
//! it. The webhook handler and `tolerable review` call [`Admission::answer_review`] (or, for a Pod
//! manifest, [`read_pod`] and [`Admission::answer`]); the fuzz harness the same pure steps
//! ([`read_request`], [`mutate::answer`], [`respond`]) without the lookups.

pub(crate) mod wire;
mod workload_pod;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cluster::events::{Recorder, Regarding, Warning};
use crate::cluster::namespaces::NamespacePolicies;
use crate::cluster::nodes::NodeWatch;
use crate::cluster::{Cluster, PodCredentials, PullSecretRefs};
use crate::metrics::Metrics;
use crate::mutate::{self, Answer, ImageFacts, LookupFailure, PodCreate, PodView, Policy};
use crate::registry::{Checked, Resolver};

use self::wire::{AdmissionRequest, AdmissionReviewOut, PodObject, ReviewError};

pub(crate) use self::workload_pod::{WorkloadAnswer, WORKLOADS_AT_ONCE};

/// Images of one admission looked up at the same time (the registry client bounds requests
/// per registry and in all on top).
const LOOKUPS_PER_ADMISSION: usize = 16;

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

/// Per image, why its registry could not be reached ([`crate::registry::LookupError::cause`]):
/// for an operator's terminal, never the webhook's answers.
pub type LookupCauses = std::collections::BTreeMap<String, String>;

/// The core's answer for one Pod, and what the shell itself has to say (pull secrets that
/// could not be read).
#[derive(Debug)]
pub(crate) struct PodAnswer {
    pub(crate) answer: Answer,
    pub(crate) shell_warnings: Vec<String>,
    /// What the answer is based on (for reports; the webhook drops it).
    pub(crate) facts: ImageFacts,
    /// Why lookups failed (for reports; the webhook drops it).
    pub(crate) lookup_causes: LookupCauses,
}

#[derive(Clone)]
pub struct Admission {
    resolver: Arc<Resolver>,
    policy: Policy,
    metrics: Option<Arc<Metrics>>,
    cluster: Option<Arc<Cluster>>,
    nodes: Option<NodeWatch>,
    namespaces: Option<NamespacePolicies>,
    /// `[events] on_admission`: Warning Events on the owners of Pods whose images share no
    /// node architecture or could not be looked up.
    events: Option<Recorder>,
    /// What the crash watch learned does not run where (`[crashes] watch`).
    learned: Option<crate::crashes::Learned>,
}

impl Admission {
    pub fn new(resolver: Arc<Resolver>, policy: Policy, metrics: Option<Arc<Metrics>>) -> Self {
        Self {
            resolver,
            policy,
            metrics,
            cluster: None,
            nodes: None,
            namespaces: None,
            events: None,
            learned: None,
        }
    }

    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Whether pull secrets are read from a cluster.
    pub(crate) fn reads_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    /// Decides with the cluster's node pools (once the watch has synced).
    pub(crate) fn with_nodes(mut self, nodes: NodeWatch) -> Self {
        self.nodes = Some(nodes);
        self
    }

    /// Decides with each Namespace's own policy (labels and annotations read by the namespace
    /// watch, or given to `review`).
    pub fn with_namespaces(mut self, namespaces: NamespacePolicies) -> Self {
        self.namespaces = Some(namespaces);
        self
    }

    pub(crate) fn metrics(&self) -> Option<&Arc<Metrics>> {
        self.metrics.as_ref()
    }

    pub(crate) fn namespaces(&self) -> Option<&NamespacePolicies> {
        self.namespaces.as_ref()
    }

    /// Warns each answered Pod's controller owner through `events` when its images share no
    /// node architecture or could not be looked up (`[events] on_admission`).
    pub(crate) fn with_events(mut self, events: Recorder) -> Self {
        self.events = Some(events);
        self
    }

    /// Leaves out of each decision the architectures the crash watch learned an image's digest
    /// does not run on.
    pub(crate) fn with_learned(mut self, learned: crate::crashes::Learned) -> Self {
        self.learned = Some(learned);
        self
    }

    /// Reads each Pod's image pull secrets (and its ServiceAccount's) from `cluster`.
    pub fn with_cluster(mut self, cluster: Arc<Cluster>) -> Self {
        self.cluster = Some(cluster);
        self
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
        } = match read_request(request, &self.policy, self.namespaces.as_ref()) {
            RequestRead::Decide(pod, pull_secrets) => {
                let answered = self.answer(&pod, &pull_secrets, budget).await;
                if request.dry_run != Some(true) {
                    self.warn_owner(&pod, &answered.answer);
                }
                answered
            }
            RequestRead::Answered(answer) => answer.into(),
        };
        let out = respond(AdmissionReviewOut::allow(&review), &answer, &shell_warnings);
        if let Some(metrics) = &self.metrics {
            metrics.decided(&answer);
        }
        Ok(AnsweredReview {
            out,
            answer,
            lookup_causes,
        })
    }

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

    /// For `audit --verify`: each of the Pod's images, its index's platforms checked against
    /// their image configs, with the Pod's pull secrets as a lookup uses them — once per image
    /// in `done`, whichever Pod names it first (a blob GET per platform counts against a
    /// registry's pull limits).
    pub(crate) async fn verify(
        &self,
        pod: &PodCreate,
        pull_secrets: &PullSecretRefs,
        budget: Duration,
        done: &VerifiedImages,
    ) -> Vec<(String, Verification)> {
        let pull = self
            .pull_credentials(&pod.namespace, pull_secrets, budget)
            .await;
        let checks = pod.images_to_look_up().iter().map(|image| async {
            let once = done.once(image);
            let checked = once
                .get_or_init(|| async {
                    let checked = self.resolver.verify(image, &pull.credentials, budget).await;
                    checked.map_err(|e| e.to_string())
                })
                .await;
            (image.clone(), checked.clone())
        });
        futures_util::future::join_all(checks).await
    }

    /// Gathers the facts for one Pod being created, within `budget`, and asks the core.
    pub(crate) async fn answer(
        &self,
        pod: &PodCreate,
        pull_secrets: &PullSecretRefs,
        budget: Duration,
    ) -> PodAnswer {
        let ((facts, lookup_causes), shell_warnings) = self.gather(pod, pull_secrets, budget).await;
        let pools = self.nodes.as_ref().and_then(NodeWatch::pools);
        PodAnswer {
            answer: mutate::answer(pod, &facts, pools.as_deref(), &self.policy),
            shell_warnings,
            facts,
            lookup_causes,
        }
    }

    /// The facts the decision needs: the platforms of the images to look up (none for a Pod
    /// that is skipped or over the limits), with the Pod's pull secrets, all within `budget`.
    /// What is known of the Pod's images now, gathered as an admission gathers it (its pull
    /// secrets, then the lookups, within `budget`), and the node pools the decision reads: the
    /// gate controller decides on these.
    pub(crate) async fn facts(
        &self,
        pod: &PodCreate,
        pull_secrets: &PullSecretRefs,
        budget: Duration,
    ) -> (ImageFacts, Option<Arc<mutate::NodePools>>) {
        let ((facts, _), _) = self.gather(pod, pull_secrets, budget).await;
        (facts, self.nodes.as_ref().and_then(NodeWatch::pools))
    }

    async fn gather(
        &self,
        request: &PodCreate,
        pull_secrets: &PullSecretRefs,
        budget: Duration,
    ) -> ((ImageFacts, LookupCauses), Vec<String>) {
        let images = request.images_to_look_up();
        if images.is_empty() {
            return Default::default();
        }
        let started = Instant::now();
        let pull = self
            .pull_credentials(&request.namespace, pull_secrets, budget)
            .await;
        let budget = budget.saturating_sub(started.elapsed());
        let (mut facts, causes) = self
            .lookup(images, (&pull, &request.namespace), budget)
            .await;
        let mut warnings = pull.warnings;
        if let Some(learned) = &self.learned {
            warnings.extend(leave_out_learned(learned, &mut facts));
        }
        ((facts, causes), warnings)
    }

    /// The Pod's pull-secret credentials, within a share of `budget`.
    async fn pull_credentials(
        &self,
        namespace: &str,
        refs: &PullSecretRefs,
        budget: Duration,
    ) -> PodCredentials {
        let Some(cluster) = &self.cluster else {
            return PodCredentials::default();
        };
        // Boxed: the Kubernetes client's future is large, and would otherwise be part of (and
        // moved with) every admission's future, with or without a cluster.
        let read = Box::pin(cluster.pull_credentials(namespace, refs));
        let share = crate::budget::for_pull_secrets(budget);
        match tokio::time::timeout(share, read).await {
            Ok(found) => {
                if let (true, Some(metrics)) = (found.forbidden, &self.metrics) {
                    metrics.pull_secrets_forbidden(namespace);
                }
                found
            }
            Err(_) => PodCredentials {
                warnings: vec![format!(
                    "could not read the Pod's image pull secrets within {share:?}; looked up without them",
                )],
                ..PodCredentials::default()
            },
        }
    }

    /// Looks up the `images` concurrently, a bounded number at a time, all by `budget`: their
    /// facts, and why those whose registry could not be reached failed.
    async fn lookup<'a>(
        &'a self,
        images: &'a [String],
        (pull, namespace): (&'a PodCredentials, &'a str),
        budget: Duration,
    ) -> (ImageFacts, LookupCauses) {
        // Every lookup ends by the same deadline, however long it waited for its turn. The
        // registry lookup ends itself a little before it (and is then counted by the circuit
        // breaker); the outer timeout only guards a lookup this one is waiting on.
        let deadline = tokio::time::Instant::now() + budget;
        let margin = crate::budget::lookup_margin(budget);
        let turns = tokio::sync::Semaphore::new(LOOKUPS_PER_ADMISSION);
        let turns = &turns;
        let lookup = |image: &'a str| async move {
            let _turn = turns
                .acquire()
                .await
                .expect("the semaphore is never closed");
            let started = Instant::now();
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let resolve = self.resolver.resolve_within(
                image,
                &pull.credentials,
                left.saturating_sub(margin),
                Some(namespace),
            );
            let (result, cause) = match tokio::time::timeout_at(deadline, resolve).await {
                Ok(Ok(found)) => (Ok(found.fact.clone()), None),
                Ok(Err(e)) => (Err(LookupFailure::from(&e)), e.cause().map(str::to_owned)),
                Err(_) => {
                    let reason = format!(
                        "lookup did not finish within the admission deadline ({})",
                        crate::registry::short_duration(budget)
                    );
                    (Err(LookupFailure::Unavailable(reason)), None)
                }
            };
            if let Some(metrics) = &self.metrics {
                metrics.observe_lookup(started.elapsed(), result.is_ok());
            }
            (
                (image.to_owned(), result),
                cause.map(|c| (image.to_owned(), c)),
            )
        };
        let looked_up = futures_util::future::join_all(images.iter().map(|image| lookup(image)));
        // Causes are rare (unreachable registries): no buffer of their own on the way.
        let mut causes = LookupCauses::new();
        let facts = looked_up.await.into_iter().map(|(fact, cause)| {
            causes.extend(cause);
            fact
        });
        (facts.collect(), causes)
    }
}

/// Each fact without the architectures `learned` says its digest does not run on; a warning
/// for each image changed.
fn leave_out_learned(learned: &crate::crashes::Learned, facts: &mut ImageFacts) -> Vec<String> {
    let now = Instant::now();
    let mut warnings = Vec::new();
    for (image, fact) in facts.iter_mut() {
        let Ok(found) = fact else { continue };
        let Some(digest) = found.digest.as_deref() else {
            continue;
        };
        let archs = learned.does_not_run_on(digest, now);
        if let Some((kept, warning)) = mutate::crash::leave_out(image, found, &archs) {
            *found = Arc::new(kept);
            warnings.push(warning);
        }
    }
    warnings
}

/// What `--verify` found for one image: each claimed platform checked, or why it could not be.
pub(crate) type Verification = Result<Vec<Checked>, String>;

/// Images already verified in one run (`audit --verify`), each at most once.
#[derive(Default)]
pub(crate) struct VerifiedImages(
    std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::OnceCell<Verification>>>>,
);

impl VerifiedImages {
    fn once(&self, image: &str) -> Arc<tokio::sync::OnceCell<Verification>> {
        let mut done = self.0.lock().unwrap_or_else(|e| e.into_inner());
        done.entry(image.to_owned()).or_default().clone()
    }
}

/// What an admission request asks of the core.
// Built and taken apart once per admission, never stored in bulk: boxing the large variant
// would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum RequestRead {
    /// A Pod being created, to decide on, and where its pull secrets are named.
    Decide(PodCreate, PullSecretRefs),
    /// Not a Pod CREATE, or an object tolerable cannot read: answered already.
    Answered(Answer),
}

/// What `request` asks of the core (in a Namespace whose policy `namespaces` knows, when given).
pub(crate) fn read_request(
    request: &AdmissionRequest,
    policy: &Policy,
    namespaces: Option<&NamespacePolicies>,
) -> RequestRead {
    if request.is_daemon_set_write() {
        return match request.daemon_set_template() {
            Ok(object) => {
                match read_pod(request.namespace.as_deref(), object, policy, namespaces) {
                    RequestRead::Decide(pod, pull_secrets) => {
                        RequestRead::Decide(pod.into_template(), pull_secrets)
                    }
                    answered => answered,
                }
            }
            Err(reason) => RequestRead::Answered(Answer::invalid_object(&reason)),
        };
    }
    if !request.is_pod_create() {
        return RequestRead::Answered(Answer::not_pod_create());
    }
    if let Some(skipped) = skipped_namespace(request, policy, namespaces) {
        return skipped;
    }
    match request.pod() {
        Ok(object) => read_pod(request.namespace.as_deref(), object, policy, namespaces),
        Err(reason) => RequestRead::Answered(Answer::invalid_object(&reason)),
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
) -> Option<RequestRead> {
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
        .map(|pod| RequestRead::Decide(pod, PullSecretRefs::default()))
}

/// A Pod object being created in `namespace` (else the Pod's own, else `default`), with that
/// Namespace's own policy when `namespaces` knows it.
pub(crate) fn read_pod(
    namespace: Option<&str>,
    object: PodObject,
    policy: &Policy,
    namespaces: Option<&NamespacePolicies>,
) -> RequestRead {
    let namespace = namespace
        .or(object.namespace.as_deref())
        .unwrap_or("default");
    match pod_in_namespace(namespace, object.view, policy, namespaces) {
        Ok(pod) => RequestRead::Decide(pod, object.pull_secrets),
        Err(reason) => RequestRead::Answered(Answer::invalid_object(&reason)),
    }
}

/// `pod` in `namespace`, with that Namespace's own policy when `namespaces` knows it: what the
/// core decides on, at admission and when the gate controller releases a gated Pod.
pub(crate) fn pod_in_namespace(
    namespace: &str,
    pod: PodView,
    policy: &Policy,
    namespaces: Option<&NamespacePolicies>,
) -> Result<PodCreate, String> {
    let namespace_policy = namespaces.and_then(|n| n.get(namespace));
    PodCreate::in_namespace(namespace, namespace_policy, pod, policy)
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
        None => out.with_patch(&answer.patch),
    }
}

impl From<Answer> for PodAnswer {
    fn from(answer: Answer) -> Self {
        Self {
            answer,
            shell_warnings: Vec::new(),
            facts: ImageFacts::new(),
            lookup_causes: LookupCauses::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

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
            RequestRead::Decide(pod, _) => {
                let read_spec = pod.pod.spec.is_some();
                (
                    mutate::answer(&pod, &ImageFacts::new(), None, policy),
                    read_spec,
                )
            }
            RequestRead::Answered(answer) => (answer, true),
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

    #[tokio::test]
    async fn each_image_is_verified_once_whichever_pods_name_it() {
        let done = VerifiedImages::default();
        let runs = AtomicUsize::new(0);
        for image in ["app:1", "app:1", "db:2", "app:1"] {
            let once = done.once(image);
            let checked = once
                .get_or_init(|| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Err(format!("{image}: not found"))
                })
                .await;
            assert_eq!(checked, &Err(format!("{image}: not found")));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}
