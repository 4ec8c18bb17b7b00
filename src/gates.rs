//! The gate controller of `serve` (`on_lookup_failure = "gate"`): releases the Pods the
//! admission gated. Every replica runs the cheap watch of Pods labelled
//! `tolerable.io/gated=true` (`cluster::gates`: a compact record per Pod), which feeds the
//! oldest-gated-Pod gauge; only while `leader` says so does it work on them.
//!
//! The work queue holds one entry per gated Pod (bounded by the watch: a Pod is in it once,
//! whatever its events), each with when it is next due; [`AT_ONCE`] Pods are worked on at a
//! time, taken fairly (issue 34): the due Pod of the namespace with the fewest being worked on
//! first, at most [`PER_NAMESPACE`] of one namespace and [`PER_REGISTRY`] naming one registry
//! (learned from its images once worked on) at once — Pods whose registry hangs hold only their
//! own turns, never another namespace's release. Working on a Pod: read it whole, gather its images' facts through the engine
//! `serve` built (its resolver, caches, shared cache, its pull secrets, within [`crate::budget::GATE_LOOKUP`]),
//! ask the core ([`crate::mutate::gate::release`]) and send its patch. Still unknown: due again
//! after a backoff (1 s doubling to 30 s), never past the Pod's `gate_timeout`, when it is
//! released unchanged with a Warning Event. A patch whose `test` fails (the Pod changed since
//! it was read) is made again from a fresh read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures_util::StreamExt as _;
use tokio::sync::{watch, Notify, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cluster::gates::{watch_gated, GatedEvent, GatedRecord, PatchError, PodsApi, Seen};
use crate::cluster::watch::{Keyed, Seen as Kind, Took, WatchStatus};
use crate::engine::{Engine, PodObject};
use crate::metrics::{GateRelease, Metrics};
use crate::mutate::gate::{self, Release};

/// Pods worked on at once (each holds at most the lookups of one admission).
pub(crate) const AT_ONCE: usize = 8;
/// Pods of one namespace worked on at once: the other half of [`AT_ONCE`] stays for the others.
pub(crate) const PER_NAMESPACE: usize = AT_ONCE / 2;
/// Pods naming one registry worked on at once: a hung registry holds two turns, not eight.
pub(crate) const PER_REGISTRY: usize = 2;
/// The first retry of a Pod whose images are still unknown; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Reads again after a stale patch (the `test` failed) before giving the Pod a backoff.
const STALE_RETRIES: u32 = 3;
/// The Event reasons.
pub(crate) const TIMEOUT_REASON: &str = "TolerableGateTimeout";
pub(crate) const UNRUNNABLE_REASON: &str = "TolerableGateUnrunnable";

type Key = (String, String);

/// One gated Pod in the queue.
struct Entry {
    record: GatedRecord,
    due: Instant,
    attempts: u32,
    working: bool,
    /// The registries its images name, learned when it was last worked on.
    registries: Vec<String>,
}

struct Queue {
    entries: HashMap<Key, Entry>,
    /// The watch's view of the Pods labelled gated (the one watch primitive's store: a re-list
    /// replaces it when it ends), which the entries follow.
    watched: Keyed<GatedRecord>,
}

impl Default for Queue {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            watched: Keyed::new(),
        }
    }
}

/// The gated Pods this replica's watch sees (for the oldest-age gauge).
#[derive(Clone)]
pub(crate) struct GatedPods {
    queue: Arc<Mutex<Queue>>,
    changed: Arc<Notify>,
    status: Arc<WatchStatus>,
}

impl Default for GatedPods {
    fn default() -> Self {
        Self {
            queue: Arc::default(),
            changed: Arc::default(),
            status: Arc::new(WatchStatus::new(false)),
        }
    }
}

impl GatedPods {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // Plain data: still consistent if a holder panicked.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How old the oldest Pod labelled gated=true is; `None`: there is none.
    pub(crate) fn oldest_age(&self) -> Option<Duration> {
        let oldest = self
            .lock()
            .entries
            .values()
            .map(|e| e.record.created)
            .min()?;
        Some(SystemTime::now().duration_since(oldest).unwrap_or_default())
    }

    /// One event of the watch: taken into the view, and the queue made to follow it (a Pod new
    /// to the view queued due now, one gone from it dropped, the others' state kept).
    fn seen(&self, event: Seen) {
        let kind = Kind::of(&event);
        let took = match event {
            Ok(event) => self.lock().take(event),
            Err(e) => {
                tracing::warn!(error = %e, "gated Pod watch failed; retrying");
                Took::Unchanged
            }
        };
        self.status.event(kind);
        if took.changed() {
            self.changed.notify_one();
        }
    }

    /// The next due Pod not being worked on, marked as worked on: of the namespaces with the
    /// fewest Pods worked on, the one due first, skipping those whose namespace or a registry
    /// is at its bound; else when one is due (`None`: none, or only Pods waiting for a turn of
    /// their namespace or registry, which [`Self::finished`] gives back).
    fn take_due(&self, now: Instant) -> Result<(GatedRecord, u32), Option<Instant>> {
        let mut queue = self.lock();
        let mut namespaces: HashMap<&str, usize> = HashMap::new();
        let mut registries: HashMap<&str, usize> = HashMap::new();
        for entry in queue.entries.values().filter(|e| e.working) {
            *namespaces.entry(&entry.record.namespace).or_default() += 1;
            for registry in &entry.registries {
                *registries.entry(registry).or_default() += 1;
            }
        }
        let count = |map: &HashMap<&str, usize>, key: &str| map.get(key).copied().unwrap_or(0);
        let eligible = queue.entries.iter().filter(|(_, e)| {
            !e.working
                && count(&namespaces, &e.record.namespace) < PER_NAMESPACE
                && e.registries
                    .iter()
                    .all(|r| count(&registries, r) < PER_REGISTRY)
        });
        let (mut best, mut next_due): (Option<(usize, Instant, &Key)>, Option<Instant>) =
            (None, None);
        for (key, entry) in eligible {
            if entry.due > now {
                next_due = Some(next_due.map_or(entry.due, |d| d.min(entry.due)));
                continue;
            }
            let rank = (count(&namespaces, &entry.record.namespace), entry.due, key);
            if best.is_none_or(|b| (rank.0, rank.1) < (b.0, b.1)) {
                best = Some(rank);
            }
        }
        let Some((_, _, key)) = best else {
            return Err(next_due);
        };
        let key = key.clone();
        drop((namespaces, registries));
        let entry = queue.entries.get_mut(&key).expect("just found");
        entry.working = true;
        Ok((entry.record.clone(), entry.attempts))
    }

    /// A Pod worked on: done (out of the queue until the watch sees it again) or due again;
    /// `registries`: those its images name, when it was read.
    fn finished(&self, record: &GatedRecord, next: Next, registries: Vec<String>) {
        let key = (record.namespace.clone(), record.name.clone());
        let mut queue = self.lock();
        // Only this Pod's entry: one created again under its name is another Pod's.
        let same = queue
            .entries
            .get(&key)
            .is_some_and(|e| e.record.uid == record.uid);
        match next {
            Next::Done if same => {
                queue.entries.remove(&key);
            }
            Next::After(wait) if same => {
                if let Some(entry) = queue.entries.get_mut(&key) {
                    entry.working = false;
                    entry.attempts += 1;
                    entry.due = Instant::now() + wait;
                    if !registries.is_empty() {
                        entry.registries = registries;
                    }
                }
            }
            Next::Done | Next::After(_) => {}
        }
        drop(queue);
        self.changed.notify_one();
    }
}

impl Queue {
    /// Takes a watch event into the view and makes the entries follow what it changed.
    fn take(&mut self, event: GatedEvent) -> Took {
        let took = self
            .watched
            .take(event, |record| (watch_key(&record), Some(record)));
        match &took {
            Took::Listed { .. } => {
                let watched = self.watched.current();
                self.entries.retain(|(namespace, name), _| {
                    watched.contains_key(&*key_text(namespace, name))
                });
                let listed: Vec<GatedRecord> = watched.values().map(|r| (**r).clone()).collect();
                for record in listed {
                    self.insert(record);
                }
            }
            Took::Changed(key) => match self.watched.current().get(key) {
                Some(record) => {
                    let record = GatedRecord::clone(record);
                    self.insert(record);
                }
                None => {
                    if let Some((namespace, name)) = key.split_once('/') {
                        self.entries
                            .remove(&(namespace.to_owned(), name.to_owned()));
                    }
                }
            },
            Took::Listing | Took::Unchanged => {}
        }
        took
    }

    /// A Pod seen labelled gated: queued due now when new, its state kept otherwise.
    fn insert(&mut self, record: GatedRecord) {
        let key = (record.namespace.clone(), record.name.clone());
        let entry = self.entries.entry(key).or_insert_with(|| Entry {
            record: record.clone(),
            due: Instant::now(),
            attempts: 0,
            working: false,
            registries: Vec::new(),
        });
        if entry.record.uid != record.uid {
            // Deleted and created again under the same name: a new Pod, due now (the old one's
            // work, if any, ends finding it gone).
            *entry = Entry {
                record,
                due: Instant::now(),
                attempts: 0,
                working: false,
                registries: Vec::new(),
            };
        }
    }
}

/// The watch's key of a gated Pod: `namespace/name`.
fn watch_key(record: &GatedRecord) -> Arc<str> {
    Arc::from(key_text(&record.namespace, &record.name))
}

fn key_text(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// What to do with a Pod after working on it.
#[derive(Debug)]
enum Next {
    Done,
    After(Duration),
}

/// What working on a Pod needs.
#[derive(Clone)]
struct Controller {
    pods: PodsApi,
    engine: Engine,
    metrics: Arc<Metrics>,
    timeout: Duration,
}

/// Starts the watch (every replica) and the releaser (acting only while `leader` is true).
pub(crate) fn start(
    client: kube::Client,
    engine: Engine,
    metrics: Arc<Metrics>,
    timeout: Duration,
    leader: watch::Receiver<bool>,
) -> (GatedPods, Vec<JoinHandle<()>>) {
    metrics.gates.set_timeout(timeout);
    let gated = GatedPods::default();
    let watching = gated.clone();
    let stream = watch_gated(client.clone());
    let watch = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(seen) = stream.next().await {
            watching.seen(seen);
        }
    });
    let controller = Controller {
        pods: PodsApi::new(client),
        engine,
        metrics,
        timeout,
    };
    let release = tokio::spawn(run(controller, gated.clone(), leader));
    (gated, vec![watch, release])
}

/// The releaser: while leader, takes the due Pods, [`AT_ONCE`] at a time.
async fn run(controller: Controller, gated: GatedPods, mut leader: watch::Receiver<bool>) {
    let turns = Arc::new(Semaphore::new(AT_ONCE));
    loop {
        if !*leader.borrow_and_update() {
            if leader.changed().await.is_err() {
                return;
            }
            continue;
        }
        let turn = turns.clone().acquire_owned().await.expect("never closed");
        match gated.take_due(Instant::now()) {
            Ok((record, attempts)) => {
                let (controller, gated) = (controller.clone(), gated.clone());
                tokio::spawn(async move {
                    let mut registries = Vec::new();
                    let next = controller.work(&record, attempts, &mut registries).await;
                    gated.finished(&record, next, registries);
                    drop(turn);
                });
            }
            Err(due) => {
                drop(turn);
                let until = due.unwrap_or_else(|| Instant::now() + MAX_BACKOFF);
                tokio::select! {
                    () = gated.changed.notified() => {}
                    () = tokio::time::sleep_until(until) => {}
                    _ = leader.changed() => {}
                }
            }
        }
    }
}

impl Controller {
    /// One look at a gated Pod; the registries its images name go into `registries`.
    async fn work(
        &self,
        record: &GatedRecord,
        attempts: u32,
        registries: &mut Vec<String>,
    ) -> Next {
        let mut stale = 0;
        loop {
            match self.try_release(record, attempts, registries).await {
                Err(PatchError::Stale(why)) if stale < STALE_RETRIES => {
                    tracing::debug!(namespace = %record.namespace, pod = %record.name, %why, "gated Pod changed since read; reading it again");
                    stale += 1;
                }
                Err(PatchError::Gone) => return Next::Done,
                Err(e) => {
                    tracing::warn!(namespace = %record.namespace, pod = %record.name, error = %e, "could not release the gated Pod; retrying");
                    return Next::After(backoff(attempts));
                }
                Ok(next) => return next,
            }
        }
    }

    /// Reads the Pod and sends what the core decides; the patch's failure for the caller.
    async fn try_release(
        &self,
        record: &GatedRecord,
        attempts: u32,
        registries: &mut Vec<String>,
    ) -> Result<Next, PatchError> {
        let Some(json) = self
            .pods
            .get(&record.namespace, &record.name)
            .await
            .map_err(PatchError::Api)?
        else {
            return Ok(Next::Done);
        };
        if json["metadata"]["uid"].as_str() != Some(record.uid.as_str()) {
            return Ok(Next::Done); // another Pod by that name: the watch reports it.
        }
        let object = PodObject::from_value(&json).map_err(PatchError::Stale)?;
        let held = SystemTime::now()
            .duration_since(record.created)
            .unwrap_or_default();
        if held >= self.timeout {
            return self.time_out(record, &object, held).await;
        }
        let policy = self.engine.policy();
        // In its Namespace's policy as now, as the admission reads it.
        let request = match crate::engine::pod_in_namespace(
            &record.namespace,
            object.view.clone(),
            policy,
            self.engine.namespaces(),
        ) {
            Ok(request) => request,
            Err(why) => return self.release_unchanged(record, &object, &why, None).await,
        };
        *registries = registries_of(request.images_to_look_up());
        let budget = crate::budget::GATE_LOOKUP.min(self.timeout - held);
        let (facts, pools) = self
            .engine
            .facts(&request, &object.pull_secrets, budget)
            .await;
        match gate::release(&request, &facts, pools.as_deref(), policy) {
            Release::NotGated(ops) => {
                if !ops.is_empty() {
                    self.pods
                        .patch(&record.namespace, &record.name, &ops)
                        .await?;
                }
                Ok(Next::Done)
            }
            Release::Waiting(waiting) => {
                let wait = backoff(attempts).min(self.timeout - held);
                tracing::debug!(namespace = %record.namespace, pod = %record.name, ?waiting, ?wait, "gated Pod's images still unknown");
                Ok(Next::After(wait))
            }
            Release::Decided { patch, summary } => {
                self.pods
                    .patch(&record.namespace, &record.name, &patch)
                    .await?;
                self.metrics.gates.released(GateRelease::Decided, held);
                tracing::info!(namespace = %record.namespace, pod = %record.name, %summary, "gated Pod released");
                Ok(Next::Done)
            }
            Release::Unrunnable { patch, message } => {
                self.pods
                    .patch(&record.namespace, &record.name, &patch)
                    .await?;
                self.metrics.gates.unrunnable();
                self.event(record, UNRUNNABLE_REASON, &message).await;
                tracing::warn!(namespace = %record.namespace, pod = %record.name, %message, "gated Pod can run nowhere; it stays gated");
                Ok(Next::Done)
            }
        }
    }

    /// Past `gate_timeout`: released unchanged, with a Warning Event.
    async fn time_out(
        &self,
        record: &GatedRecord,
        object: &PodObject,
        held: Duration,
    ) -> Result<Next, PatchError> {
        let why = format!(
            "its images' lookups did not answer within gate_timeout ({})",
            crate::registry::short_duration(self.timeout)
        );
        self.release_unchanged(record, object, &why, Some(held))
            .await
    }

    async fn release_unchanged(
        &self,
        record: &GatedRecord,
        object: &PodObject,
        why: &str,
        timed_out: Option<Duration>,
    ) -> Result<Next, PatchError> {
        let ops = gate::release_unchanged(&object.view, why);
        if ops.is_empty() {
            return Ok(Next::Done);
        }
        self.pods
            .patch(&record.namespace, &record.name, &ops)
            .await?;
        let held = SystemTime::now()
            .duration_since(record.created)
            .unwrap_or_default();
        let Some(held) = timed_out else {
            // Decided on (opted out since, or no longer a Pod tolerable can decide on).
            self.metrics.gates.released(GateRelease::Decided, held);
            return Ok(Next::Done);
        };
        self.metrics.gates.released(GateRelease::TimedOut, held);
        let message = format!("released unchanged: {why}");
        self.event(record, TIMEOUT_REASON, &message).await;
        tracing::warn!(namespace = %record.namespace, pod = %record.name, %why, "gated Pod released unchanged");
        Ok(Next::Done)
    }

    /// A Warning Event; a failure to write it is logged, never retried (the annotation says it
    /// too).
    async fn event(&self, record: &GatedRecord, reason: &str, message: &str) {
        if let Err(e) = self.pods.warn(record, reason, message).await {
            tracing::warn!(namespace = %record.namespace, pod = %record.name, error = %e, "could not write the Event");
        }
    }
}

/// The registries `images` name, each once.
fn registries_of(images: &[String]) -> Vec<String> {
    let mut hosts: Vec<String> = images
        .iter()
        .filter_map(|image| crate::registry::ImageReference::parse(image).ok())
        .map(|reference| reference.registry().to_owned())
        .collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

/// The wait before the `attempts`+1-th look: 1 s doubling, at most [`MAX_BACKOFF`].
fn backoff(attempts: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(1 << attempts.min(6))
        .min(MAX_BACKOFF)
}

/// What `tolerable gates release` did with one Pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HandRelease {
    Released,
    /// It carries no gate of tolerable's (its label, if left, removed).
    NotGated,
    NotFound,
}

/// Releases one Pod unchanged by hand (`tolerable gates release`: before uninstalling, or in an
/// emergency), with the core's release-unchanged patch, read again when its `test` fails.
pub(crate) async fn release_by_hand(
    pods: &PodsApi,
    namespace: &str,
    name: &str,
) -> anyhow::Result<HandRelease> {
    for _ in 0..=STALE_RETRIES {
        let Some(json) = pods.get(namespace, name).await? else {
            return Ok(HandRelease::NotFound);
        };
        let object = PodObject::from_value(&json).map_err(anyhow::Error::msg)?;
        let gated = gate::is_gated(&object.view);
        let ops =
            gate::release_unchanged(&object.view, "released by hand (tolerable gates release)");
        if !ops.is_empty() {
            match pods.patch(namespace, name, &ops).await {
                Err(PatchError::Stale(_)) => continue,
                Err(PatchError::Gone) => return Ok(HandRelease::NotFound),
                Err(e) => return Err(e.into()),
                Ok(()) => {}
            }
        }
        return Ok(if gated {
            HandRelease::Released
        } else {
            HandRelease::NotGated
        });
    }
    anyhow::bail!("{namespace}/{name} kept changing while it was released; try again")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::gates::GatedEvent as Event;

    fn record(name: &str, uid: &str, age_secs: u64) -> GatedRecord {
        GatedRecord {
            namespace: "ns".into(),
            name: name.into(),
            uid: uid.into(),
            created: SystemTime::now() - Duration::from_secs(age_secs),
        }
    }

    fn queued(gated: &GatedPods) -> Vec<String> {
        let mut names: Vec<String> = gated.lock().entries.keys().map(|k| k.1.clone()).collect();
        names.sort();
        names
    }

    #[test]
    fn one_entry_per_pod_and_a_new_list_replaces_them() {
        let gated = GatedPods::default();
        gated.seen(Ok(Event::Apply(record("a", "1", 60))));
        gated.seen(Ok(Event::Apply(record("a", "1", 60))));
        gated.seen(Ok(Event::Apply(record("b", "2", 5))));
        assert_eq!(queued(&gated), ["a", "b"], "one entry per Pod");
        let age = gated.oldest_age().unwrap();
        assert!(age >= Duration::from_secs(60), "{age:?}");
        // A re-list (after an expired watch) without a: a is gone, b kept.
        gated.seen(Ok(Event::Init));
        gated.seen(Ok(Event::InitApply(record("b", "2", 5))));
        assert_eq!(
            queued(&gated),
            ["a", "b"],
            "replaced only when the list ends"
        );
        gated.seen(Ok(Event::InitDone));
        assert_eq!(queued(&gated), ["b"]);
        gated.seen(Ok(Event::Delete(record("b", "2", 5))));
        assert!(queued(&gated).is_empty());
        assert_eq!(gated.oldest_age(), None);
    }

    #[test]
    fn a_due_pod_is_taken_once_and_backs_off() {
        let gated = GatedPods::default();
        gated.seen(Ok(Event::Apply(record("a", "1", 1))));
        let now = Instant::now();
        let (taken, attempts) = gated.take_due(now).unwrap();
        assert_eq!((taken.name.as_str(), attempts), ("a", 0));
        assert!(
            matches!(gated.take_due(now), Err(None)),
            "not taken twice while worked on"
        );
        gated.finished(&taken, Next::After(Duration::from_secs(4)), Vec::new());
        let Err(Some(due)) = gated.take_due(Instant::now()) else {
            panic!("due later");
        };
        assert!(due > now + Duration::from_secs(3));
        assert_eq!(gated.lock().entries.values().next().unwrap().attempts, 1);
        // Created again under its name while worked on: the new Pod stays queued.
        let (taken, _) = gated.take_due(due).unwrap();
        gated.seen(Ok(Event::Apply(record("a", "2", 0))));
        gated.finished(&taken, Next::Done, Vec::new());
        assert_eq!(queued(&gated), ["a"]);
        let (new, attempts) = gated.take_due(Instant::now()).expect("the new Pod is due");
        assert_eq!((new.uid.as_str(), attempts), ("2", 0));
        gated.finished(&new, Next::Done, Vec::new());
        assert!(queued(&gated).is_empty());
    }

    fn in_namespace(namespace: &str, name: &str) -> GatedRecord {
        GatedRecord {
            namespace: namespace.into(),
            ..record(name, name, 1)
        }
    }

    /// Issue 34: one namespace's Pods (whose registry hangs) fill at most half the turns, the
    /// namespace with the fewest worked on goes first, and Pods naming a registry already
    /// worked on twice wait for those, whatever namespace they are in.
    #[test]
    fn turns_are_fair_across_namespaces_and_bounded_per_registry() {
        let gated = GatedPods::default();
        for i in 0..20 {
            gated.seen(Ok(Event::Apply(in_namespace("flood", &format!("f{i}")))));
        }
        let now = Instant::now() + Duration::from_millis(1);
        let mut taken = Vec::new();
        while let Ok((record, _)) = gated.take_due(now) {
            taken.push(record);
        }
        assert_eq!(taken.len(), PER_NAMESPACE, "one namespace, half the turns");
        gated.seen(Ok(Event::Apply(in_namespace("victim", "v1"))));
        gated.seen(Ok(Event::Apply(in_namespace("other", "o1"))));
        let now = Instant::now() + Duration::from_millis(1);
        let (first, _) = gated.take_due(now).unwrap();
        let (second, _) = gated.take_due(now).unwrap();
        let mut names = [first.namespace.as_str(), second.namespace.as_str()];
        names.sort_unstable();
        assert_eq!(names, ["other", "victim"]);

        // Pods of three namespaces, known to name one hung registry: two are worked on at a
        // time, and a Pod that names another registry still gets its turn.
        let gated = GatedPods::default();
        for (namespace, name) in [
            ("a", "a1"),
            ("a", "a2"),
            ("b", "b1"),
            ("b", "b2"),
            ("c", "c1"),
        ] {
            gated.seen(Ok(Event::Apply(in_namespace(namespace, name))));
        }
        let now = Instant::now() + Duration::from_millis(1);
        let hung = vec!["hung.example".to_owned()];
        while let Ok((record, _)) = gated.take_due(now) {
            gated.finished(&record, Next::After(Duration::ZERO), hung.clone());
        }
        let now = Instant::now() + Duration::from_millis(1);
        let mut naming_hung = Vec::new();
        while let Ok((record, _)) = gated.take_due(now) {
            naming_hung.push(record);
        }
        assert_eq!(naming_hung.len(), PER_REGISTRY, "{naming_hung:?}");
        gated.seen(Ok(Event::Apply(in_namespace("d", "d1"))));
        let (other, _) = gated
            .take_due(Instant::now() + Duration::from_millis(1))
            .unwrap();
        assert_eq!(other.name, "d1");
        gated.finished(&naming_hung[0], Next::After(Duration::ZERO), hung);
        assert!(
            gated
                .take_due(Instant::now() + Duration::from_millis(1))
                .is_ok(),
            "a turn of the registry given back"
        );
    }

    #[test]
    fn backoff_doubles_to_its_cap() {
        let waits: Vec<u64> = (0..8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
    }
}
