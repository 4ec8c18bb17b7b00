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
                self.answer(&pod, &pull_secrets, budget).await
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
        let lookups = self
            .lookup(images, (&pull, &request.namespace), budget)
            .await;
        (lookups, pull.warnings)
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
    if !request.is_pod_create() {
        return RequestRead::Answered(Answer::not_pod_create());
    }
    match request.pod() {
        Ok(object) => read_pod(request.namespace.as_deref(), object, policy, namespaces),
        Err(reason) => RequestRead::Answered(Answer::invalid_object(&reason)),
    }
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
