//! The engine: one Pod's facts gathered and the core asked, whoever asks — the webhook's
//! admission shell, `review`, `audit` or the gate controller. It reads the Pod object
//! ([`PodObject`]), resolves its Namespace's policy and its knobs (`mutate::PodCreate`), reads
//! its pull secrets, looks its images up within one budget ([`crate::budget`]) and calls the one
//! pure function ([`mutate::answer`]). Built once per process by [`Engine::build`] from the
//! validated config, the [`Purpose`] it decides for and the cluster [`Sources`] the caller has.

mod crash_placement;
pub(crate) mod json_scan;
mod pod_object;
mod workload_pod;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cluster::namespaces::NamespacePolicies;
use crate::cluster::nodes::NodeWatch;
use crate::cluster::{Cluster, PodCredentials, PullSecretRefs};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::mutate::{self, Answer, ImageFacts, LookupFailure, PodCreate, PodView, Policy};
use crate::registry::{Checked, Resolver};

pub(crate) use self::pod_object::PodObject;
pub(crate) use self::workload_pod::{WorkloadAnswer, WORKLOADS_AT_ONCE};

/// Images of one Pod looked up at the same time (the registry client bounds requests per
/// registry and in all on top).
const LOOKUPS_PER_POD: usize = 16;

/// What the engine decides for: the policy it applies is the config's, except for `audit`,
/// which asks what every workload would get — skipped namespaces and enforce off included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// The webhook (`serve`) and its gate controller.
    Admit,
    /// `review`: what the webhook would answer.
    Review,
    /// `audit`: the config's policy with `enforce` on and no namespace skipped.
    Audit,
}

impl Purpose {
    fn policy(self, config: &Policy) -> Policy {
        match self {
            Purpose::Admit | Purpose::Review => config.clone(),
            Purpose::Audit => Policy {
                skip_namespaces: Default::default(),
                enforce: true,
                ..config.clone()
            },
        }
    }
}

/// What the engine reads besides the registries, each as the caller has it.
#[derive(Default)]
pub struct Sources {
    /// Where lookups, pull-secret refusals and decisions are counted (`serve`).
    pub metrics: Option<Arc<Metrics>>,
    /// Where each Pod's image pull secrets (and its ServiceAccount's) are read.
    pub pull_secrets: Option<Arc<Cluster>>,
    /// The node watch: decisions read the cluster's node pools once it has synced.
    pub nodes: Option<NodeWatch>,
    /// Each Namespace's own policy (labels and annotations, from the watch or a list).
    pub namespaces: Option<NamespacePolicies>,
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
    /// What the crash watch learned of its images' digests, a line each ("learned: D does not
    /// run on A"), which the decision left out (for `review` and `audit`; the webhook drops it:
    /// its warning says so).
    pub(crate) learned: Vec<String>,
}

/// The engine: gathers a Pod's facts (its pull secrets, its images' platforms within one
/// budget, the node pools, its Namespace's policy) and asks the core. Built once per process by
/// [`Engine::build`]; the webhook's admission shell, `review`, `audit` and the gate controller
/// all decide through it.
#[derive(Clone)]
pub struct Engine {
    resolver: Arc<Resolver>,
    policy: Policy,
    metrics: Option<Arc<Metrics>>,
    cluster: Option<Arc<Cluster>>,
    nodes: Option<NodeWatch>,
    namespaces: Option<NamespacePolicies>,
    /// What the crash watch learned does not run where (`[crashes] watch`).
    learned: Option<crate::crashes::Learned>,
}

impl Engine {
    /// The one way an engine is made: the resolver of `config` (reporting to the sources'
    /// metrics, when given), the policy `purpose` decides by, and what the caller reads of the
    /// cluster.
    pub fn build(config: &Config, purpose: Purpose, sources: Sources) -> anyhow::Result<Self> {
        let resolver = Arc::new(resolver(config, sources.metrics.as_ref())?);
        Ok(Self {
            resolver,
            policy: purpose.policy(&config.policy),
            metrics: sources.metrics,
            cluster: sources.pull_secrets,
            nodes: sources.nodes,
            namespaces: sources.namespaces,
            learned: learned(config, purpose)?,
        })
    }

    /// What the crash watch learned, which decisions leave out (`serve` with `[crashes] watch`;
    /// `review` and `audit` with the shared cache).
    pub(crate) fn learned(&self) -> Option<&crate::crashes::Learned> {
        self.learned.as_ref()
    }

    /// The image resolver (its caches, for the scrape-time gauges).
    pub(crate) fn resolver(&self) -> &Arc<Resolver> {
        &self.resolver
    }

    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Whether pull secrets are read from a cluster.
    pub(crate) fn reads_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    pub(crate) fn metrics(&self) -> Option<&Arc<Metrics>> {
        self.metrics.as_ref()
    }

    pub(crate) fn namespaces(&self) -> Option<&NamespacePolicies> {
        self.namespaces.as_ref()
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
    pub(crate) async fn decide(
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
            learned: self
                .learned
                .as_ref()
                .map_or_else(Vec::new, |l| learned_notes(l, &facts)),
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
            learned.ready().await;
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
        // Not boxed: the Kubernetes client's large future is boxed inside, on a cache miss only.
        let read = cluster.pull_credentials(namespace, refs);
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
        let turns = tokio::sync::Semaphore::new(LOOKUPS_PER_POD);
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

/// What a Pod object asks of the core.
// Built and taken apart once per admission, never stored in bulk: boxing the large variant
// would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum PodRead {
    /// A Pod being created, to decide on, and where its pull secrets are named.
    Decide(PodCreate, PullSecretRefs),
    /// Not a Pod CREATE, or an object tolerable cannot read: answered already.
    Answered(Answer),
}

/// What the crash watch learned, for `purpose`: `serve` with `[crashes] watch` keeps it (in
/// memory, and in the shared cache when there is one, refreshed by `crate::crashes`); `review`
/// and `audit` read the shared cache's once, on their first decision (without a shared cache
/// it lives only in each replica's memory: nothing to read).
fn learned(config: &Config, purpose: Purpose) -> anyhow::Result<Option<crate::crashes::Learned>> {
    use crate::crashes::Learned;
    let shared = config.resolver.shared_cache.clone();
    let learned = match (purpose, shared) {
        (Purpose::Admit, _) if !config.crash_watch => return Ok(None),
        (Purpose::Admit, None) => Learned::default(),
        (Purpose::Admit, Some(shared)) => Learned::refreshed(shared).map_err(anyhow::Error::msg)?,
        (Purpose::Review | Purpose::Audit, None) => return Ok(None),
        (Purpose::Review | Purpose::Audit, Some(shared)) => {
            Learned::read_once(shared).map_err(anyhow::Error::msg)?
        }
    };
    Ok(Some(learned))
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

/// "learned: D does not run on A (IMAGE crashed …)" for each image whose digest the crash
/// watch learned something of: what `review` and `audit` report beside the decision.
fn learned_notes(learned: &crate::crashes::Learned, facts: &ImageFacts) -> Vec<String> {
    let now = Instant::now();
    facts
        .iter()
        .filter_map(|(image, fact)| {
            let digest = fact.as_ref().ok()?.digest.as_deref()?;
            let archs = learned.does_not_run_on(digest, now);
            (!archs.is_empty()).then(|| {
                format!(
                    "learned: {digest} does not run on {} ({image} crashed there with exec format error although its index claims it)",
                    archs.join(", ")
                )
            })
        })
        .collect()
}

/// A Pod object being created in `namespace` (else the Pod's own, else `default`), with that
/// Namespace's own policy when `namespaces` knows it.
pub(crate) fn read_pod(
    namespace: Option<&str>,
    object: PodObject,
    policy: &Policy,
    namespaces: Option<&NamespacePolicies>,
) -> PodRead {
    let namespace = namespace
        .or(object.namespace.as_deref())
        .unwrap_or("default");
    match pod_in_namespace(namespace, object.view, policy, namespaces) {
        Ok(pod) => PodRead::Decide(pod, object.pull_secrets),
        Err(reason) => PodRead::Answered(Answer::invalid_object(&reason)),
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

impl From<Answer> for PodAnswer {
    fn from(answer: Answer) -> Self {
        Self {
            answer,
            shell_warnings: Vec::new(),
            facts: ImageFacts::new(),
            lookup_causes: LookupCauses::new(),
            learned: Vec::new(),
        }
    }
}

/// The image resolver of `config` — its registries, credentials and credential plugins — as
/// `serve`, `review` and `inspect` use it, reporting to `metrics` when given; the operator's own
/// registries keep their metric labels whatever Pods name.
pub fn resolver(config: &Config, metrics: Option<&Arc<Metrics>>) -> anyhow::Result<Resolver> {
    let (credentials, helpers) = config.credentials()?;
    let helper_names: Vec<String> = helpers.names().map(str::to_owned).collect();
    let resolver = Resolver::new(config.resolver.clone(), credentials.clone())?
        .with_credential_plugins(config.credential_providers.clone(), helpers);
    let Some(metrics) = metrics else {
        return Ok(resolver);
    };
    let transport = &config.resolver.transport;
    metrics.name_registries(
        config
            .resolver
            .mirrors
            .values()
            .map(String::as_str)
            .chain(transport.insecure_registries.iter().map(String::as_str))
            .chain(credentials.registries()),
    );
    if let Some(shared) = &config.resolver.shared_cache {
        tracing::info!(cache_url = %shared.url(), "shared cache behind the in-memory one (shared_cache.url)");
    }
    metrics.name_credential_plugins(
        config
            .credential_providers
            .iter()
            .map(|p| p.name.as_str())
            .chain(helper_names.iter().map(String::as_str)),
    );
    Ok(resolver.with_observer(metrics.clone()))
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

    #[test]
    fn audit_decides_with_enforce_on_and_no_namespace_skipped() {
        let config = Policy::default();
        assert!(!config.skip_namespaces.is_empty());
        let audit = Purpose::Audit.policy(&config);
        assert!(audit.enforce && audit.skip_namespaces.is_empty());
        assert_eq!(Purpose::Review.policy(&config), config);
        assert_eq!(Purpose::Admit.policy(&config), config);
    }
}
