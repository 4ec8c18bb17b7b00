//! The one place tolerable writes Events: Warning Events on the objects users look at, in the
//! shapes a real API server accepted (`tests/data/kube-api/crashes/`): on a Pod a core/v1
//! Event (`generateName` `<pod>.`, `source` and `reportingComponent` `tolerable`, as the gate
//! controller and `kubectl describe pod` read them), on any other object an events.k8s.io/v1
//! Event (`generateName` `<name>-` — events.k8s.io refuses one ending in a dot —, `eventTime`,
//! `reportingController` [`REPORTING_CONTROLLER`], `reportingInstance` and `action`, all of
//! which it requires).
//!
//! The [`Recorder`] keeps Events off the admission's path: [`Recorder::warn`] only takes a
//! lock, checks the per-object limit and puts the Event in a bounded queue (a full queue drops
//! it, counted), of which one namespace may hold at most [`QUEUED_PER_NAMESPACE`]: a tenant
//! whose Pods fail by the thousand has its own Events dropped, not everyone else's. One task
//! drains the queue, one Event at a time, each within [`SEND_TIMEOUT`].
//! At most one Event per object per [`PER_OBJECT_WINDOW`], remembered for at most
//! [`MAX_REMEMBERED`] objects (the oldest forgotten first).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, PostParams};
use tokio::sync::mpsc;

use crate::metrics::{EventResult, Metrics};

/// `reportingController` of the events.k8s.io Events (it must be a qualified name).
pub(crate) const REPORTING_CONTROLLER: &str = "tolerable.io/tolerable";
/// `source.component` and `reportingComponent` of the core/v1 Events.
const COMPONENT: &str = "tolerable";
/// Events waiting to be written; past this, new ones are dropped (and counted).
pub(crate) const QUEUE: usize = 256;
/// Of [`QUEUE`], what the Events on one namespace's objects may hold at once.
pub(crate) const QUEUED_PER_NAMESPACE: usize = QUEUE / 8;
/// At most one Event per object in this window.
pub(crate) const PER_OBJECT_WINDOW: Duration = Duration::from_secs(10 * 60);
/// Objects whose last Event is remembered for the limit.
pub(crate) const MAX_REMEMBERED: usize = 4096;
/// One Event's create, at most (an API server that does not answer holds the queue no longer).
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// An Event's message (`note`): events.k8s.io refuses one over 1 KiB.
const MAX_NOTE_BYTES: usize = 1024;
/// Room left at the end of a cut note for the marker saying how much was cut.
const CUT_MARKER_BYTES: usize = 32;

/// The object an Event is about, as its `regarding` / `involvedObject` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Regarding {
    pub(crate) api_version: String,
    pub(crate) kind: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
}

impl Regarding {
    fn reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some(self.api_version.clone()),
            kind: Some(self.kind.clone()),
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            uid: Some(self.uid.clone()).filter(|u| !u.is_empty()),
            ..ObjectReference::default()
        }
    }

    /// The key the per-object limit counts by: the uid (a recreated object is another), else
    /// the name.
    fn key(&self) -> String {
        if self.uid.is_empty() {
            format!("{}/{}/{}", self.kind, self.namespace, self.name)
        } else {
            self.uid.clone()
        }
    }

    fn is_pod(&self) -> bool {
        self.kind == "Pod" && self.api_version == "v1"
    }
}

/// One Warning Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Warning {
    pub(crate) regarding: Regarding,
    /// `reason`, UpperCamelCase (`NoCommonArchitecture`).
    pub(crate) reason: String,
    /// events.k8s.io's `action`: what tolerable did (`Denied`, `Admitted`, `Detected`).
    pub(crate) action: String,
    /// The message (`note`).
    pub(crate) note: String,
}

/// The Event as written: core/v1 on a Pod, events.k8s.io/v1 on anything else.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Written {
    Core(Box<CoreEvent>),
    Events(Box<Event>),
}

/// Who writes this replica's Events (`reportingInstance`): its Pod's name, as the API server
/// requires one on events.k8s.io.
pub(crate) fn reporting_instance() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| COMPONENT.to_owned())
}

impl Warning {
    /// The Event object, at `now`, from `instance`.
    pub(crate) fn event(&self, now: k8s_openapi::jiff::Timestamp, instance: &str) -> Written {
        let note =
            crate::mutate::explain::cut(self.note.clone(), MAX_NOTE_BYTES - CUT_MARKER_BYTES);
        let r = &self.regarding;
        if r.is_pod() {
            return Written::Core(Box::new(CoreEvent {
                metadata: ObjectMeta {
                    generate_name: Some(format!("{}.", r.name)),
                    namespace: Some(r.namespace.clone()),
                    ..ObjectMeta::default()
                },
                involved_object: r.reference(),
                reason: Some(self.reason.clone()),
                message: Some(note),
                type_: Some("Warning".into()),
                source: Some(EventSource {
                    component: Some(COMPONENT.into()),
                    host: None,
                }),
                reporting_component: Some(COMPONENT.into()),
                reporting_instance: Some(instance.to_owned()),
                first_timestamp: Some(Time(now)),
                last_timestamp: Some(Time(now)),
                count: Some(1),
                ..CoreEvent::default()
            }));
        }
        Written::Events(Box::new(Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}-", r.name)),
                namespace: Some(r.namespace.clone()),
                ..ObjectMeta::default()
            },
            regarding: Some(r.reference()),
            reason: Some(self.reason.clone()),
            type_: Some("Warning".into()),
            action: Some(self.action.clone()),
            note: Some(note),
            reporting_controller: Some(REPORTING_CONTROLLER.into()),
            reporting_instance: Some(instance.to_owned()),
            event_time: Some(MicroTime(now)),
            ..Event::default()
        }))
    }
}

/// Creates one Event now (the gate controller's own, awaited; the recorder's, from its queue).
pub(crate) async fn create(client: &kube::Client, warning: &Warning) -> Result<(), kube::Error> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let namespace = &warning.regarding.namespace;
    match warning.event(now, &reporting_instance()) {
        Written::Core(event) => {
            let api: Api<CoreEvent> = Api::namespaced(client.clone(), namespace);
            api.create(&PostParams::default(), &event).await?;
        }
        Written::Events(event) => {
            let api: Api<Event> = Api::namespaced(client.clone(), namespace);
            api.create(&PostParams::default(), &event).await?;
        }
    }
    Ok(())
}

/// At most one Event per object per window, for a bounded number of objects: each remembered
/// object's last Event, oldest first.
#[derive(Debug)]
pub(crate) struct PerObject {
    window: Duration,
    capacity: usize,
    last: HashMap<String, Instant>,
    order: VecDeque<(String, Instant)>,
}

impl PerObject {
    pub(crate) fn new(window: Duration, capacity: usize) -> Self {
        Self {
            window,
            capacity: capacity.max(1),
            last: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Whether an Event on `key` may be sent at `now` (remembered if so).
    pub(crate) fn allow(&mut self, key: &str, now: Instant) -> bool {
        if !self.would_allow(key, now) {
            return false;
        }
        if self.last.len() >= self.capacity {
            self.forget_oldest();
        }
        self.last.insert(key.to_owned(), now);
        self.order.push_back((key.to_owned(), now));
        true
    }

    /// Whether `key` may be allowed at `now`, without remembering it: for a caller that must
    /// pass other limits too before it counts.
    pub(crate) fn would_allow(&mut self, key: &str, now: Instant) -> bool {
        // Every entry has the same window, so the expired ones are at the front.
        while let Some((_, at)) = self.order.front() {
            if now.saturating_duration_since(*at) < self.window {
                break;
            }
            self.forget_oldest();
        }
        !self.last.contains_key(key)
    }

    fn forget_oldest(&mut self) {
        if let Some((key, _)) = self.order.pop_front() {
            self.last.remove(&key);
        }
    }

    /// Objects remembered now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.last.len()
    }
}

/// Hands Warning Events to the task that writes them (see the module's doc). Cheap to clone.
#[derive(Clone)]
pub(crate) struct Recorder {
    queue: mpsc::Sender<Warning>,
    /// Events queued now, by their object's namespace (none kept at 0).
    queued: Queued,
    limit: Arc<Mutex<PerObject>>,
    metrics: Option<Arc<Metrics>>,
}

/// Events in the queue by namespace, shared by the recorders and the task draining the queue.
type Queued = Arc<Mutex<HashMap<String, usize>>>;

/// Counts one Event of `namespace` into the queue if the namespace has room (`true`), or out
/// of it (`into: false`).
fn count_queued(queued: &Queued, namespace: &str, into: bool) -> bool {
    let mut queued = queued
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let held = queued.get(namespace).copied().unwrap_or(0);
    match (into, held) {
        (true, held) if held >= QUEUED_PER_NAMESPACE => false,
        (true, held) => {
            queued.insert(namespace.to_owned(), held + 1);
            true
        }
        (false, 0 | 1) => queued.remove(namespace).is_some(),
        (false, held) => {
            queued.insert(namespace.to_owned(), held - 1);
            true
        }
    }
}

impl Recorder {
    /// The recorder and the task that drains its queue into `client`'s API server.
    pub(crate) fn start(
        client: kube::Client,
        metrics: Option<Arc<Metrics>>,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (queue, received) = mpsc::channel(QUEUE);
        let queued = Queued::default();
        let task = tokio::spawn(drain(client, (received, queued.clone()), metrics.clone()));
        (Self::with_queue(queue, queued, metrics), task)
    }

    fn with_queue(
        queue: mpsc::Sender<Warning>,
        queued: Queued,
        metrics: Option<Arc<Metrics>>,
    ) -> Self {
        Self {
            queue,
            queued,
            limit: Arc::new(Mutex::new(PerObject::new(
                PER_OBJECT_WINDOW,
                MAX_REMEMBERED,
            ))),
            metrics,
        }
    }

    /// Queues `warning` unless its object had one within the window, or the queue or its
    /// namespace's share of it is full; never waits.
    pub(crate) fn warn(&self, warning: Warning) -> EventResult {
        let key = warning.regarding.key();
        let allowed = self
            .limit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .allow(&key, Instant::now());
        let namespace = warning.regarding.namespace.clone();
        let result = if !allowed {
            EventResult::Limited
        } else if !count_queued(&self.queued, &namespace, true) {
            EventResult::Dropped
        } else if self.queue.try_send(warning).is_err() {
            count_queued(&self.queued, &namespace, false);
            EventResult::Dropped
        } else {
            return EventResult::Sent;
        };
        self.count(result);
        result
    }

    fn count(&self, result: EventResult) {
        if let Some(metrics) = &self.metrics {
            metrics.events.count(result);
        }
    }
}

/// Writes the queued Events one at a time, until every [`Recorder`] is gone.
async fn drain(
    client: kube::Client,
    (mut received, queued): (mpsc::Receiver<Warning>, Queued),
    metrics: Option<Arc<Metrics>>,
) {
    while let Some(warning) = received.recv().await {
        count_queued(&queued, &warning.regarding.namespace, false);
        let result = match tokio::time::timeout(SEND_TIMEOUT, create(&client, &warning)).await {
            Ok(Ok(())) => EventResult::Sent,
            Ok(Err(kube::Error::Api(e))) if (400..500).contains(&e.code) => {
                tracing::warn!(code = e.code, reason = %e.reason, message = %e.message, kind = %warning.regarding.kind, namespace = %warning.regarding.namespace, name = %warning.regarding.name, "the API server refused a Warning Event");
                EventResult::Refused
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, kind = %warning.regarding.kind, namespace = %warning.regarding.namespace, name = %warning.regarding.name, "could not write a Warning Event");
                EventResult::Failed
            }
            Err(_) => {
                tracing::warn!(timeout = ?SEND_TIMEOUT, kind = %warning.regarding.kind, namespace = %warning.regarding.namespace, name = %warning.regarding.name, "a Warning Event was not answered in time");
                EventResult::Failed
            }
        };
        if let Some(metrics) = &metrics {
            metrics.events.count(result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Regarding {
        Regarding {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: "shop".into(),
            name: "web".into(),
            uid: "19bbc498-fe08-4332-965e-936745ed09e2".into(),
        }
    }

    fn warning(regarding: Regarding, note: &str) -> Warning {
        Warning {
            regarding,
            reason: "WrongArchitecture".into(),
            action: "Detected".into(),
            note: note.into(),
        }
    }

    fn at() -> k8s_openapi::jiff::Timestamp {
        "2026-11-27T10:00:06Z".parse().unwrap()
    }

    /// The recorded request the API server accepted ("a controller's Warning Event on the
    /// owner Deployment (events.k8s.io/v1)"), field for field.
    #[test]
    fn an_owner_gets_the_events_k8s_io_event_the_api_server_accepted() {
        let written = warning(
            owner(),
            "Pod web-7d9c6b8f5-abcde: exec format error on arm64",
        )
        .event(at(), "tolerable-5f7c9d-x2x4z");
        let Written::Events(event) = written else {
            panic!("{written:?}")
        };
        let mut json = serde_json::to_value(&*event).unwrap();
        json["apiVersion"] = "events.k8s.io/v1".into();
        json["kind"] = "Event".into();
        assert_eq!(
            json,
            serde_json::json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"generateName": "web-", "namespace": "shop"},
                "regarding": {"kind": "Deployment", "namespace": "shop", "name": "web",
                    "uid": "19bbc498-fe08-4332-965e-936745ed09e2", "apiVersion": "apps/v1"},
                "reason": "WrongArchitecture", "type": "Warning", "action": "Detected",
                "note": "Pod web-7d9c6b8f5-abcde: exec format error on arm64",
                "reportingController": "tolerable.io/tolerable",
                "reportingInstance": "tolerable-5f7c9d-x2x4z",
                "eventTime": "2026-11-27T10:00:06.000000Z"})
        );
    }

    #[test]
    fn a_pod_gets_a_core_v1_event_named_after_it() {
        let pod = Regarding {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: "web-7d9c6b8f5-abcde".into(),
            uid: "26be13ca-16c0-4b8b-9e31-07601681d14b".into(),
            ..owner()
        };
        let Written::Core(event) = warning(pod, "x").event(at(), "i") else {
            panic!()
        };
        let json = serde_json::to_value(&*event).unwrap();
        assert_eq!(json["metadata"]["generateName"], "web-7d9c6b8f5-abcde.");
        assert_eq!(json["involvedObject"]["kind"], "Pod");
        assert_eq!(json["source"]["component"], "tolerable");
        assert_eq!(json["type"], "Warning");
        assert_eq!(json["count"], 1);
    }

    #[test]
    fn a_long_note_is_cut() {
        let Written::Events(event) = warning(owner(), &"x".repeat(5000)).event(at(), "i") else {
            panic!()
        };
        assert!(event.note.unwrap().len() <= MAX_NOTE_BYTES);
    }

    /// One namespace's flood of Events fills its share of the queue and is dropped there; an
    /// Event of another namespace is still queued, and the share comes back as Events are taken.
    #[test]
    fn a_namespace_holds_at_most_its_share_of_the_queue() {
        let (queue, mut received) = mpsc::channel(QUEUE);
        let queued = Queued::default();
        let recorder = Recorder::with_queue(queue, queued.clone(), None);
        let in_namespace = |namespace: &str, name: String| Regarding {
            namespace: namespace.into(),
            name,
            uid: String::new(),
            ..owner()
        };
        let results: Vec<EventResult> = (0..QUEUED_PER_NAMESPACE + 10)
            .map(|i| recorder.warn(warning(in_namespace("flood", format!("rs-{i}")), "x")))
            .collect();
        let sent = results.iter().filter(|r| **r == EventResult::Sent).count();
        assert_eq!(sent, QUEUED_PER_NAMESPACE);
        assert_eq!(results.len() - sent, 10);
        assert!(results[QUEUED_PER_NAMESPACE..]
            .iter()
            .all(|r| *r == EventResult::Dropped));
        let quiet = recorder.warn(warning(in_namespace("quiet", "web".into()), "x"));
        assert_eq!(quiet, EventResult::Sent);

        let taken = received.try_recv().unwrap();
        count_queued(&queued, &taken.regarding.namespace, false);
        let again = recorder.warn(warning(in_namespace("flood", "rs-new".into()), "x"));
        assert_eq!(again, EventResult::Sent);
    }

    #[test]
    fn one_event_per_object_per_window() {
        let mut limit = PerObject::new(Duration::from_secs(600), 8);
        let t0 = Instant::now();
        assert!(limit.allow("a", t0));
        assert!(!limit.allow("a", t0 + Duration::from_secs(599)));
        assert!(limit.allow("b", t0 + Duration::from_secs(1)));
        assert!(limit.allow("a", t0 + Duration::from_secs(600)));
        assert!(!limit.allow("b", t0 + Duration::from_secs(600)));
    }

    #[test]
    fn memory_is_bounded_forgetting_the_oldest_first() {
        let mut limit = PerObject::new(Duration::from_secs(600), 3);
        let t0 = Instant::now();
        for key in ["a", "b", "c", "d"] {
            assert!(limit.allow(key, t0));
        }
        assert_eq!(limit.len(), 3);
        // "a" was forgotten to make room for "d": allowed again; "d" still limited.
        assert!(limit.allow("a", t0));
        assert!(!limit.allow("d", t0));
        assert_eq!(limit.len(), 3);
    }
}
