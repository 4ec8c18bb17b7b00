//! One admission, end to end: parse the AdmissionReview, look the Pod's images up (the only I/O),
//! decide, answer. The webhook handler and `tolerable review` both call [`Admission::review`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use crate::cluster::nodes::NodeWatch;
use crate::cluster::{Cluster, PodCredentials};
use crate::metrics::Metrics;
use crate::mutate::review::{self, AdmissionReviewOut, ReviewError};
use crate::mutate::{self, patch, Decision, ImageFacts, LookupFailure, Policy};
use crate::registry::Resolver;

/// Images of one admission looked up at the same time (the registry client bounds requests
/// per registry and in all on top).
const LOOKUPS_PER_ADMISSION: usize = 16;

/// The answer to one AdmissionReview, with what led to it.
#[derive(Debug)]
pub struct Reviewed {
    /// The answer (it carries the request's uid).
    pub out: AdmissionReviewOut,
    /// The Pod as received, when the request carried one that could be read.
    pub pod: Option<Pod>,
    pub decision: Option<Decision>,
    pub operations: Vec<patch::Operation>,
    /// A bounded label: decided, skipped, denied, …
    pub outcome: &'static str,
}

pub struct Admission {
    resolver: Arc<Resolver>,
    policy: Policy,
    metrics: Option<Arc<Metrics>>,
    cluster: Option<Arc<Cluster>>,
    nodes: Option<NodeWatch>,
}

impl Admission {
    pub fn new(resolver: Arc<Resolver>, policy: Policy, metrics: Option<Arc<Metrics>>) -> Self {
        Self {
            resolver,
            policy,
            metrics,
            cluster: None,
            nodes: None,
        }
    }

    /// Decides with the cluster's node pools (once the watch has synced).
    pub fn with_nodes(mut self, nodes: NodeWatch) -> Self {
        self.nodes = Some(nodes);
        self
    }

    /// Reads each Pod's image pull secrets (and its ServiceAccount's) from `cluster`.
    pub fn with_cluster(mut self, cluster: Arc<Cluster>) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// Answers one AdmissionReview body within `budget` (the time left for image lookups).
    /// `Err` only when the body is not an AdmissionReview at all.
    pub async fn review(&self, body: &[u8], budget: Duration) -> Result<Reviewed, ReviewError> {
        let mut request_review = review::parse(body)?;
        let allowed = AdmissionReviewOut::allow(&request_review);
        let request = request_review
            .request
            .as_mut()
            .expect("parse checks the request");
        tracing::Span::current().record("uid", request.uid.as_str());
        let unchanged = |out: AdmissionReviewOut, pod: Option<Pod>, outcome| Reviewed {
            out,
            pod,
            decision: None,
            operations: Vec::new(),
            outcome,
        };
        if !request.is_pod_create() {
            return Ok(unchanged(allowed, None, "not_pod_create"));
        }
        let pod = match request.take_pod() {
            Ok(pod) => pod,
            Err(reason) => {
                let out =
                    allowed.with_warnings([format!("tolerable left the Pod unchanged: {reason}")]);
                return Ok(unchanged(out, None, "invalid_object"));
            }
        };
        let images = match mutate::images_of(&pod) {
            Ok(images) => images,
            Err(reason) => {
                let out =
                    allowed.with_warnings([format!("tolerable left the Pod unchanged: {reason}")]);
                return Ok(unchanged(out, Some(pod), "invalid_object"));
            }
        };
        let namespace = request
            .namespace
            .as_deref()
            .or(pod.metadata.namespace.as_deref())
            .unwrap_or("default")
            .to_owned();
        // Skips, and Pods over the limits, need no lookups.
        let started = Instant::now();
        let distinct = mutate::distinct_images(&images);
        let (facts, secret_warnings) = if mutate::skip_reason(&namespace, &pod, &self.policy)
            .is_some()
            || mutate::over_limits(&images, &distinct, &self.policy).is_some()
        {
            (ImageFacts::new(), Vec::new())
        } else {
            let pull = self.pull_credentials(&namespace, &pod, budget).await;
            let budget = budget.saturating_sub(started.elapsed());
            (self.lookup(&distinct, &pull, budget).await, pull.warnings)
        };
        let pools = self.nodes.as_ref().and_then(NodeWatch::pools);
        let decision = mutate::decide_with_pools(
            &namespace,
            &pod,
            &images,
            &facts,
            &self.policy,
            pools.as_ref(),
        );
        let operations = patch::operations(&pod, &decision);
        let mut out = allowed.with_warnings(decision.warnings.iter().chain(&secret_warnings));
        out = match &decision.deny {
            Some(message) => out.deny(message),
            None => out.with_patch(&operations),
        };
        Ok(Reviewed {
            out,
            pod: Some(pod),
            outcome: decision.outcome().label(),
            decision: Some(decision),
            operations,
        })
    }

    /// The Pod's pull-secret credentials, within a share of `budget` (the API server is usually
    /// answered from the cache; when it is slow, the registry lookups still get their time).
    async fn pull_credentials(
        &self,
        namespace: &str,
        pod: &Pod,
        budget: Duration,
    ) -> PodCredentials {
        let Some(cluster) = &self.cluster else {
            return PodCredentials::default();
        };
        // Boxed: the Kubernetes client's future is large, and would otherwise be part of (and
        // moved with) every admission's future, with or without a cluster.
        let read = Box::pin(cluster.pull_credentials(namespace, pod));
        match tokio::time::timeout(budget / 3, read).await {
            Ok(found) => found,
            Err(_) => PodCredentials {
                warnings: vec![format!(
                    "could not read the Pod's image pull secrets within {:?}; looked up without them",
                    budget / 3
                )],
                ..PodCredentials::default()
            },
        }
    }

    /// Looks up the `distinct` images concurrently, all by `budget`.
    async fn lookup<'a>(
        &'a self,
        distinct: &[&'a str],
        pull: &'a PodCredentials,
        budget: Duration,
    ) -> ImageFacts {
        // Every lookup ends by the same deadline, however long it waited for its turn. The
        // registry lookup ends itself a little before it (and is then counted by the circuit
        // breaker); the outer timeout only guards a lookup this one is waiting on.
        let deadline = tokio::time::Instant::now() + budget;
        let margin = budget / 20;
        let lookup = move |image: &'a str| async move {
            let started = Instant::now();
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let result = match tokio::time::timeout_at(
                deadline,
                self.resolver
                    .resolve_within(image, &pull.credentials, left.saturating_sub(margin)),
            )
            .await
            {
                Ok(Ok(found)) => Ok(found.fact.clone()),
                Ok(Err(e)) => Err(LookupFailure::new(e.reason())),
                Err(_) => Err(LookupFailure::new(format!(
                    "lookup did not finish within the admission deadline ({})",
                    crate::registry::short_duration(budget)
                ))),
            };
            if let Some(metrics) = &self.metrics {
                metrics.observe_lookup(started.elapsed(), result.is_ok());
            }
            (image.to_owned(), result)
        };
        // Most Pods name one image: no need to fan out.
        if let [image] = *distinct {
            return ImageFacts::from([lookup(image).await]);
        }
        // A bounded number at a time: the rest wait their turn inside the same budget.
        let turns = tokio::sync::Semaphore::new(LOOKUPS_PER_ADMISSION);
        let turns = &turns;
        futures_util::future::join_all(distinct.iter().map(|&image| async move {
            let _turn = turns
                .acquire()
                .await
                .expect("the semaphore is never closed");
            lookup(image).await
        }))
        .await
        .into_iter()
        .collect()
    }
}
