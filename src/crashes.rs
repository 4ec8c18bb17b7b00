//! The crash-signal watch of `serve` (`[crashes] watch`, issue 38): every replica watches the
//! kubelets' BackOff Warning Events (`cluster::crashes`, a configuration of the watch
//! primitive: one projection per Event, the Pod and container it names); while `leader` says
//! so (the gate releasers' Lease), each new BackOff is looked at once per Pod and container
//! per [`PER_POD_WINDOW`]: the Pod read, each backing-off container's last termination
//! classified by the core ([`crash::exec_format_error`]: the runtime's text in the termination
//! message, else the previous log's last lines), then confirmed ([`crash::confirm`]) from the
//! node's architecture (the node watch) and what the image's index claims (the resolver, by
//! the digest the kubelet pulled). The verdict goes to a Warning Event on the Pod and on its
//! controller owner, and to `tolerable_exec_format_crashes_total`.
//!
//! Confirmation (b) reads the image config behind the index's entry for the node's platform,
//! only now, on the crash (the resolver's `verify`, as `audit --verify`). Confirmation (c), only
//! when (a) and (b) do not confirm: one list of the crashing Pod's owner's Pods (its labels but
//! the per-Pod ones, one page of 100, the same projection as the Pod read) and the
//! architectures of the nodes where one runs the same digest in a ready container.
//!
//! A confirmed wrong architecture is learned ([`Learned`], `learned.rs`: digest →
//! architectures, with a TTL, bounded in all and per namespace) — in this replica's memory, and
//! with the shared cache in the shared store (`shared.rs`) that every replica pulls, `review`
//! and `audit` read and `tolerable crashes list | forget` change: admissions of that digest
//! leave the architecture out, with a warning.
//!
//! Not yet (issue 38): nothing is healed or labelled; the decision annotation does not say what
//! was left out (the warning does).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use self::queue::FairQueue;
use crate::cluster::crashes::{
    watch_back_offs, BackOff, BackOffSeen, ContainerEnd, CrashReader, CrashedPod,
};
use crate::cluster::events::{PerObject, Recorder, Regarding, Warning};
use crate::cluster::nodes::NodeWatch;
use crate::cluster::watch::{Keyed, Took};
use crate::metrics::Metrics;
use crate::mutate::crash::{self, CrashFacts, Termination, Verdict};
use crate::mutate::platform::NodeRuntime;
use crate::mutate::platform::Platform;
use crate::mutate::Policy;
use crate::registry::{CredentialStore, Resolver};

mod learned;
mod queue;
pub mod shared;

pub(crate) use learned::Learned;
pub use learned::{MAX_LEARNED, MAX_PER_NAMESPACE, REFRESH_EVERY};

/// A Pod's container is looked at once in this window, however many BackOffs it has.
pub(crate) const PER_POD_WINDOW: Duration = Duration::from_secs(10 * 60);
/// Pods and containers remembered for that.
const MAX_REMEMBERED: usize = 4096;
/// Crashes looked at per second at most, however many Pods crash-loop: each look reads a Pod
/// (and perhaps its log) from the API server.
const LOOKS_PER_SECOND: u64 = 20;
/// One image's lookup, at most.
const LOOKUP: Duration = Duration::from_secs(10);

/// What looking at a crash needs.
struct Looker {
    reader: CrashReader,
    recorder: Recorder,
    nodes: Option<NodeWatch>,
    resolver: Arc<Resolver>,
    amd64_runs_386: bool,
    arm64_runs_arm32: bool,
    metrics: Arc<Metrics>,
    learned: Learned,
}

/// Starts the watch (every replica) and the looker (while `leader`).
pub(crate) fn start(
    client: kube::Client,
    (recorder, nodes, learned): (Recorder, Option<NodeWatch>, Learned),
    resolver: Arc<Resolver>,
    policy: &Policy,
    metrics: Arc<Metrics>,
    leader: watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let queue = Arc::new(FairQueue::default());
    let stream = watch_back_offs(client.clone());
    let watch = tokio::spawn(follow(stream, queue.clone(), leader));
    let looker = Looker {
        reader: CrashReader::new(client),
        recorder,
        nodes,
        resolver,
        amd64_runs_386: policy.amd64_runs_386,
        arm64_runs_arm32: policy.arm64_runs_arm32,
        metrics,
        learned,
    };
    vec![watch, tokio::spawn(look_at_each(looker, queue))]
}

/// Takes the BackOff Events into a keyed store; each new one, while leader and not seen for
/// its Pod and container within the window, is queued — when its namespace has room in the
/// fair queue; else it is not remembered as seen, and its next BackOff tries again.
async fn follow(
    stream: impl futures_util::Stream<Item = BackOffSeen>,
    queue: Arc<FairQueue<BackOff>>,
    leader: watch::Receiver<bool>,
) {
    let mut stream = std::pin::pin!(stream);
    let mut store: Keyed<BackOff> = Keyed::new();
    let mut seen = PerObject::new(PER_POD_WINDOW, MAX_REMEMBERED);
    while let Some(event) = stream.next().await {
        let Ok(event) = event else { continue };
        let keys = match store.take(event, |e| e.keyed()) {
            Took::Changed(key) => vec![key],
            Took::Listed { changed, .. } => changed,
            Took::Listing | Took::Unchanged => Vec::new(),
        };
        if !*leader.borrow() {
            continue;
        }
        for key in keys {
            let Some(back_off) = store.current().get(&key).cloned() else {
                continue;
            };
            let pod_key = format!(
                "{}/{}",
                back_off.pod_uid,
                back_off.container.as_deref().unwrap_or("")
            );
            if queue.has_room(&back_off.namespace) && seen.allow(&pod_key, Instant::now()) {
                queue.push(&back_off.namespace, (*back_off).clone());
            }
        }
    }
}

/// Looks at the queued crashes in turns by namespace, at most [`LOOKS_PER_SECOND`].
async fn look_at_each(looker: Looker, queue: Arc<FairQueue<BackOff>>) {
    let mut pace = tokio::time::interval(Duration::from_secs(1) / LOOKS_PER_SECOND as u32);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let back_off = queue.pop().await;
        pace.tick().await;
        looker.look_at(&back_off).await;
    }
}

impl Looker {
    async fn look_at(&self, back_off: &BackOff) {
        let pod = match self.reader.pod(&back_off.namespace, &back_off.pod).await {
            Ok(Some(pod)) => pod,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(namespace = %back_off.namespace, pod = %back_off.pod, error = %e, "crash watch: could not read the Pod");
                return;
            }
        };
        // A Pod of the same name made since: not the one that backed off.
        if !back_off.pod_uid.is_empty() && pod.uid != back_off.pod_uid {
            return;
        }
        let named = |c: &&ContainerEnd| back_off.container.as_ref().is_none_or(|n| *n == c.name);
        for container in pod.containers.iter().filter(named) {
            self.look_at_container(&pod, container).await;
        }
    }

    async fn look_at_container(&self, pod: &CrashedPod, container: &ContainerEnd) {
        let Some((reason, exit_code, message, ran)) = &container.terminated else {
            return;
        };
        let terminated = Termination {
            reason,
            exit_code: *exit_code,
            message: message.as_deref(),
            ran_seconds: *ran,
        };
        let mut found = crash::exec_format_error(&terminated, None);
        if found.is_none() && reason == "Error" && [1, 255].contains(exit_code) {
            let log = self
                .reader
                .previous_log(&pod.namespace, &pod.name, &container.name)
                .await
                .ok();
            found = crash::exec_format_error(&terminated, log.as_deref());
        }
        if found.is_none() {
            return;
        }
        let node = pod.node.clone().unwrap_or_default();
        let arch = self
            .nodes
            .as_ref()
            .and_then(|n| n.architecture_of(&node))
            .unwrap_or_default();
        let image = pulled(container);
        let claimed = self.claimed(&image).await;
        let verdict = if arch.is_empty() {
            Verdict::Unconfirmed
        } else {
            self.confirm(pod, &image, &arch, claimed.as_deref()).await
        };
        let note = crash::describe(
            &container.name,
            &image,
            (&node, &arch),
            claimed.as_deref(),
            &verdict,
        );
        if let (Verdict::WrongArchitecture { arch, .. }, Some(digest)) =
            (&verdict, digest_of(&image))
        {
            self.learned
                .learn_everywhere(&pod.namespace, digest, arch)
                .await;
        }
        self.report(pod, &arch, &verdict, note);
    }

    async fn confirm(
        &self,
        pod: &CrashedPod,
        image: &str,
        arch: &str,
        claimed: Option<&[Platform]>,
    ) -> Verdict {
        let claims_it = claimed.is_some_and(|c| c.iter().any(|p| is_linux(p, arch)));
        // (b) read only now, on the crash: the image config behind the index's entry.
        let config = match claims_it {
            true => self.config_of(image, arch).await,
            false => None,
        };
        let facts = CrashFacts {
            node_os: "linux",
            node_arch: arch,
            claimed,
            config_of_node_entry: config.as_ref().map(|(os, a)| (os.as_str(), a.as_str())),
            runs_on: &[],
        };
        let runtime = NodeRuntime {
            variant: None,
            amd64_runs_386: self.amd64_runs_386,
            arm64_runs_arm32: self.arm64_runs_arm32,
        };
        let verdict = crash::confirm(&facts, &runtime);
        if verdict != Verdict::Unconfirmed {
            return verdict;
        }
        // (c) only when (a) and (b) did not confirm: one list of the owner's Pods.
        let runs_on = self.runs_elsewhere(pod, image, arch).await;
        let facts = CrashFacts {
            runs_on: &runs_on,
            ..facts
        };
        crash::confirm(&facts, &runtime)
    }

    /// (c) The architectures of the nodes (other than `arch`) where the crashing Pod's owner's
    /// other Pods run the same image (by digest) in a ready container: one list of them per
    /// crash, one page, projected (`cluster::crashes`).
    async fn runs_elsewhere(&self, pod: &CrashedPod, image: &str, arch: &str) -> Vec<String> {
        let (Some(digest), Some(selector), Some(nodes)) = (
            digest_of(image),
            pod.siblings_selector(),
            self.nodes.as_ref(),
        ) else {
            return Vec::new();
        };
        let siblings = match self.reader.pods_selected(&pod.namespace, &selector).await {
            Ok(siblings) => siblings,
            Err(e) => {
                tracing::warn!(namespace = %pod.namespace, selector = %selector, error = %e, "crash watch: could not list the Pod's owner's Pods");
                return Vec::new();
            }
        };
        let runs_it = |p: &CrashedPod| {
            p.containers
                .iter()
                .any(|c| c.ready && digest_of(&pulled(c)) == Some(digest))
        };
        siblings
            .iter()
            .filter(|p| p.uid != pod.uid && runs_it(p))
            .filter_map(|p| nodes.architecture_of(p.node.as_deref()?))
            .filter(|a| a != arch)
            .collect()
    }

    /// The OS and architecture the image config of the index's entry for linux/`arch` says.
    async fn config_of(&self, image: &str, arch: &str) -> Option<(String, String)> {
        let checked = self
            .resolver
            .verify(image, &CredentialStore::default(), LOOKUP)
            .await
            .ok()?;
        let entry = checked.iter().find(|c| is_linux(&c.claimed, arch))?;
        Some((
            entry.actual.os.to_string(),
            entry.actual.architecture.to_string(),
        ))
    }

    /// What the image's index claims (anonymous access, from the resolver's caches when
    /// known), or `None`.
    async fn claimed(&self, image: &str) -> Option<Vec<Platform>> {
        let found = tokio::time::timeout(LOOKUP, self.resolver.resolve(image)).await;
        Some(found.ok()?.ok()?.fact.platforms.clone())
    }

    fn report(&self, pod: &CrashedPod, arch: &str, verdict: &Verdict, note: String) {
        self.metrics.events.crashed(arch, verdict.label());
        tracing::warn!(namespace = %pod.namespace, pod = %pod.name, verdict = verdict.label(), "{note}");
        let on = |regarding: Regarding, note: String| Warning {
            regarding,
            reason: verdict.reason().into(),
            action: "Detected".into(),
            note,
        };
        self.recorder.warn(on(
            Regarding {
                api_version: "v1".into(),
                kind: "Pod".into(),
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
            },
            note.clone(),
        ));
        if let Some((api_version, kind, name, uid)) = pod.owner.clone() {
            let regarding = Regarding {
                api_version,
                kind,
                namespace: pod.namespace.clone(),
                name,
                uid,
            };
            self.recorder
                .warn(on(regarding, format!("Pod {}: {note}", pod.name)));
        }
    }
}

/// `sha256:…` of an image by digest.
fn digest_of(image: &str) -> Option<&str> {
    image.split_once('@').map(|(_, digest)| digest)
}

fn is_linux(platform: &Platform, arch: &str) -> bool {
    &*platform.os == "linux" && &*platform.architecture == arch
}

/// The image as pulled: by the digest in `imageID` when the status has it, else as named.
fn pulled(container: &ContainerEnd) -> String {
    let by_digest = container.image_id.as_deref().and_then(|id| {
        let id = id.split_once("://").map_or(id, |(_, rest)| rest);
        id.contains("@sha256:").then(|| id.to_owned())
    });
    by_digest.unwrap_or_else(|| container.image.clone())
}
