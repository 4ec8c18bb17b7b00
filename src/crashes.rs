//! The crash-signal watch of `serve` (`[crashes] watch`, issue 38): every replica watches the
//! kubelets' BackOff Warning Events (`cluster::crashes`, a configuration of the watch
//! primitive: one projection per Event, the Pod and container it names); while `leader` says
//! so (the gate releasers' Lease), each new BackOff is looked at once per Pod and container
//! per [`PER_POD_WINDOW`], [`LOOKS_PER_SECOND`] at most (a full queue leaves a BackOff for
//! its next one): the Pod read, each backing-off container's last termination
//! classified by the core ([`crash::exec_format_error`]: the runtime's text in the termination
//! message, else the previous log's last lines), then confirmed ([`crash::confirm`]) from the
//! node's architecture (the node watch) and what the image's index claims (the resolver, by
//! the digest the kubelet pulled). The verdict goes to a Warning Event on the Pod and on its
//! controller owner, the Pod's annotation, and `tolerable_exec_format_crashes_total`.
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
//! With `[crashes] heal`, the Pod of a wrong-architecture crash (confirmed, or on an
//! architecture its index lacks) is deleted — with a uid precondition, never its replacement —
//! when its controller recreates it elsewhere: a ReplicaSet, StatefulSet or
//! ReplicationController (never a bare, a DaemonSet's or a Job's Pod), no local data
//! ([`heal::may_heal`]), and the engine's decision for its images now leaves the node's
//! architecture out ([`Placement`]); at most once per Pod, one per controller per
//! [`HEAL_OWNER_WINDOW`], [`HEALS_PER_WINDOW`] in all. What was done is said in the same Events
//! (one per object per window: a second Event on the Pod would be dropped) and counted in
//! `tolerable_crash_heals_total`.
//!
//! Every verdict marks the Pod: the annotation `tolerable.io/crash` ([`crash::mark`]), by one
//! JSON Patch that tests the Pod's uid.
//!
//! Not yet (issue 38): the decision annotation does not say what was left out (the warning
//! does).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use self::queue::FairQueue;
use crate::cluster::crashes::{
    watch_back_offs, BackOff, BackOffSeen, ContainerEnd, CrashReader, CrashedPod, Deleted,
};
use crate::cluster::events::{PerObject, Recorder, Regarding, Warning};
use crate::cluster::nodes::NodeWatch;
use crate::cluster::watch::{Keyed, Took};
use crate::metrics::Metrics;
use crate::mutate::crash::{self, CrashFacts, Termination, Verdict};
use crate::mutate::heal::{self, Held};
use crate::mutate::platform::NodeRuntime;
use crate::mutate::platform::Platform;
use crate::mutate::Policy;
use crate::registry::{CredentialStore, Resolver};

mod learned;
mod queue;
pub mod shared;

pub(crate) use learned::Learned;
use learned::LEARNED_TTL;
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
/// The decision on where a crashed Pod's images would go now (`[crashes] heal`), at most.
pub(crate) const PLACEMENT_BUDGET: Duration = Duration::from_secs(10);

/// `[crashes] heal`: at most one Pod of a controller deleted in this window, so the Pods it
/// recreates get the time to start (and, were the decision wrong again, a controller's Pods
/// are not deleted one after another).
pub(crate) const HEAL_OWNER_WINDOW: Duration = Duration::from_secs(10 * 60);
/// And at most this many Pods deleted in all in that window.
pub(crate) const HEALS_PER_WINDOW: usize = 20;

/// Where a Pod with these labels and images (by digest) would be placed now in its namespace
/// (its labels: a Pod that opts out of tolerable is not moved by it, so never healed): the architectures
/// the engine's decision leaves them (the learned ones left out), or `None` when it cannot
/// decide. Built in `app.rs` from the engine (which knows [`Learned`]: this module cannot name
/// the engine).
pub(crate) type Placement = Arc<
    dyn Fn(
            String,
            std::collections::BTreeMap<String, String>,
            Vec<String>,
        ) -> futures_util::future::BoxFuture<'static, Option<Vec<String>>>
        + Send
        + Sync,
>;

/// `[crashes] heal`: where the Pods would go now, and the limits on deleting them.
struct Heal {
    placement: Placement,
    limits: std::sync::Mutex<HealLimits>,
}

/// At most once per Pod (by uid, remembered as long as what is learned), one Pod per
/// controller per [`HEAL_OWNER_WINDOW`], [`HEALS_PER_WINDOW`] in all in that window.
struct HealLimits {
    pods: PerObject,
    owners: PerObject,
    recent: std::collections::VecDeque<Instant>,
}

impl HealLimits {
    fn new() -> Self {
        Self {
            pods: PerObject::new(LEARNED_TTL, MAX_REMEMBERED),
            owners: PerObject::new(HEAL_OWNER_WINDOW, MAX_REMEMBERED),
            recent: std::collections::VecDeque::new(),
        }
    }

    /// Whether the Pod `pod_uid` of the controller `owner_uid` may be deleted at `now`
    /// (counted if so).
    fn allow(&mut self, pod_uid: &str, owner_uid: &str, now: Instant) -> Result<(), Held> {
        while let Some(at) = self.recent.front() {
            if now.saturating_duration_since(*at) < HEAL_OWNER_WINDOW {
                break;
            }
            self.recent.pop_front();
        }
        let window_minutes = HEAL_OWNER_WINDOW.as_secs() / 60;
        if self.recent.len() >= HEALS_PER_WINDOW {
            return Err(Held::TooManyHeals {
                at_most: HEALS_PER_WINDOW,
                window_minutes,
            });
        }
        // Each limit is checked before any is counted: a Pod held back by its controller's
        // window keeps its own one heal for later.
        if !self.pods.would_allow(pod_uid, now) {
            return Err(Held::HealedBefore);
        }
        if !self.owners.would_allow(owner_uid, now) {
            return Err(Held::OwnerHealedRecently { window_minutes });
        }
        self.pods.allow(pod_uid, now);
        self.owners.allow(owner_uid, now);
        self.recent.push_back(now);
        Ok(())
    }
}

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
    heal: Option<Heal>,
}

/// Starts the watch (every replica) and the looker (while `leader`); with `heal`
/// (`[crashes] heal`), Pods of wrong-architecture crashes are deleted for their controllers
/// to recreate where `heal` places them.
pub(crate) fn start(
    client: kube::Client,
    (recorder, nodes, learned): (Recorder, Option<NodeWatch>, Learned),
    resolver: Arc<Resolver>,
    policy: &Policy,
    metrics: Arc<Metrics>,
    leader: watch::Receiver<bool>,
    heal: Option<Placement>,
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
        heal: heal.map(|placement| Heal {
            placement,
            limits: std::sync::Mutex::new(HealLimits::new()),
        }),
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
        let said = (container.name.as_str(), image.as_str(), arch.as_str());
        let note = self.mark_and_heal(pod, said, &verdict, note).await;
        self.report(pod, &arch, &verdict, note);
    }

    /// Marks the Pod with the verdict (`container`, `image`, the node's `arch`) and, with
    /// `[crashes] heal` and a wrong architecture, heals it: `note` with what healing did.
    async fn mark_and_heal(
        &self,
        pod: &CrashedPod,
        (container, image, arch): (&str, &str, &str),
        verdict: &Verdict,
        note: String,
    ) -> String {
        let mark = crash::mark(verdict, container, image, arch);
        if let Err(e) = self.reader.mark(pod, &mark).await {
            tracing::warn!(namespace = %pod.namespace, pod = %pod.name, error = %e, "crash watch: could not annotate the Pod");
        }
        let flagged = matches!(
            verdict,
            Verdict::WrongArchitecture { .. } | Verdict::NotAmongPlatforms { .. }
        );
        match (&self.heal, flagged) {
            (Some(heal), true) => format!("{note}; {}", self.heal(heal, pod, arch).await),
            _ => note,
        }
    }

    /// Deletes the Pod of a wrong-architecture crash on an `arch` node when its controller
    /// recreates it elsewhere (see [`heal::may_heal`]), within the limits; what was done, in the
    /// Event's words, and counted.
    async fn heal(&self, heal: &Heal, pod: &CrashedPod, arch: &str) -> String {
        let done = self.try_heal(heal, pod, arch).await;
        let label = done.as_ref().map_or_else(Held::label, |_| "deleted");
        self.metrics.events.healed(label);
        match done {
            Ok(note) => note,
            Err(held) => heal::not_healed(&held.describe()),
        }
    }

    async fn try_heal(&self, heal: &Heal, pod: &CrashedPod, arch: &str) -> Result<String, Held> {
        let owner = pod
            .owner
            .as_ref()
            .map(|(api_version, kind, ..)| heal::Owner { api_version, kind });
        heal::may_heal(owner, &pod.volumes)?;
        let images = pod.containers.iter().map(pulled).collect();
        let placed = (heal.placement)(pod.namespace.clone(), pod.labels.clone(), images).await;
        heal::places_elsewhere(arch, placed.as_deref())?;
        let (_, kind, name, owner_uid) = pod.owner.as_ref().ok_or(Held::NoController)?;
        heal.limits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .allow(&pod.uid, owner_uid, Instant::now())?;
        match self
            .reader
            .delete(&pod.namespace, &pod.name, &pod.uid)
            .await
        {
            Ok(Deleted::Deleted) => Ok(heal::healed(kind, name, &placed.unwrap_or_default())),
            Ok(Deleted::Gone) => Err(Held::Gone),
            Err(e) => {
                tracing::warn!(namespace = %pod.namespace, pod = %pod.name, error = %e, "crash watch: could not delete the Pod to heal");
                Err(Held::Failed)
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Once per Pod, one Pod per controller per window, [`HEALS_PER_WINDOW`] in all in that
    /// window; a controller's next Pod after the window.
    #[test]
    fn heals_are_limited_per_pod_per_controller_and_in_all() {
        let mut limits = HealLimits::new();
        let start = Instant::now();
        assert_eq!(limits.allow("pod-1", "rs-1", start), Ok(()));
        assert_eq!(
            limits.allow("pod-1", "rs-2", start),
            Err(Held::HealedBefore)
        );
        assert!(matches!(
            limits.allow("pod-2", "rs-1", start),
            Err(Held::OwnerHealedRecently { window_minutes: 10 })
        ));
        let later = start + HEAL_OWNER_WINDOW;
        assert_eq!(limits.allow("pod-3", "rs-1", later), Ok(()));
        // The Pod healed before stays healed past the window.
        assert_eq!(
            limits.allow("pod-1", "rs-9", later),
            Err(Held::HealedBefore)
        );
        for n in 1..HEALS_PER_WINDOW {
            let owner = format!("owner-{n}");
            assert_eq!(
                limits.allow(&format!("p-{n}"), &owner, later),
                Ok(()),
                "{n}"
            );
        }
        assert!(matches!(
            limits.allow("one-more", "another", later),
            Err(Held::TooManyHeals { .. })
        ));
        let after = later + HEAL_OWNER_WINDOW;
        assert_eq!(limits.allow("one-more", "another", after), Ok(()));
        // pod-2, held back only by its controller's window, still has its one heal.
        assert_eq!(limits.allow("pod-2", "rs-1", after), Ok(()));
    }
}
