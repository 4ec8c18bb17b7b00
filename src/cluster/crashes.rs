//! The Kubernetes API of the crash-signal watch (`crate::crashes`, issue 38): it never watches
//! Pods. It watches core/v1 Events whose `reason` is `BackOff` (selected server side, as the
//! recorded API server did: `fieldSelector=reason=BackOff`; `type` and the involved object's
//! kind are checked here), each kept as the Pod and container it names; then reads that one
//! Pod (its node, its controller owner, each container's image, `imageID` and last
//! termination: nothing else is deserialized) and, where the termination message lacks a
//! runtime's text, the previous log's last lines.

use std::sync::Arc;

use futures_util::Stream;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, Preconditions};
use kube::runtime::watcher::{self, watcher, Event as WatchEvent};
use kube::runtime::WatchStreamExt as _;
use serde::Deserialize;
use serde_json::json;

use crate::mutate::crash::CRASH_ANNOTATION;
use crate::mutate::heal::{Volume, VolumeKind};

/// Watch pages.
const LIST_PAGE: u32 = 500;
/// The log lines read at most (the kubelet's FallbackToLogsOnError copies ≤ 80 lines).
pub(crate) const LOG_TAIL_LINES: i64 = 20;
/// The log bytes read at most.
const LOG_LIMIT_BYTES: i64 = 2048;
/// The Pods of a crashing Pod's owner read at most (confirmation (c): one list per crash).
const OWNER_PODS_LIMIT: u32 = 100;
/// Labels that differ between the Pods of one owner (a revision, a template generation, a
/// Pod's own name or index): left out of the selector that finds its siblings.
const PER_POD_LABELS: &[&str] = &[
    "pod-template-hash",
    "controller-revision-hash",
    "pod-template-generation",
    "statefulset.kubernetes.io/pod-name",
    "apps.kubernetes.io/pod-index",
    "batch.kubernetes.io/job-completion-index",
];

/// What the watch keeps of one BackOff Event: the Pod and the container it is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BackOff {
    pub(crate) namespace: String,
    pub(crate) pod: String,
    pub(crate) pod_uid: String,
    /// From `involvedObject.fieldPath` (`spec.containers{web}`), when it names one.
    pub(crate) container: Option<String>,
    /// The Event's `count`: a kubelet's next BackOff for the same container updates the Event
    /// (the count goes up) rather than writing a new one; kept so that the update is a change
    /// the watch reports (a container not looked at yet — its queue was full — gets its turn).
    pub(crate) count: i32,
}

/// A core/v1 Event as the watch reads it off the wire: its identity, and the BackOff it says
/// (`None`: not a Warning BackOff about a Pod).
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "wire::Event")]
pub(crate) struct BackOffEvent {
    meta: ObjectMeta,
    back_off: Option<BackOff>,
}

mod wire {
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct Event {
        metadata: Meta,
        #[serde(default)]
        involved_object: Involved,
        reason: Option<String>,
        #[serde(rename = "type")]
        type_: Option<String>,
        count: Option<i32>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Involved {
        kind: Option<String>,
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
        field_path: Option<String>,
    }

    impl From<Event> for super::BackOffEvent {
        fn from(e: Event) -> Self {
            let o = e.involved_object;
            let about_a_pod = e.reason.as_deref() == Some("BackOff")
                && e.type_.as_deref() == Some("Warning")
                && o.kind.as_deref() == Some("Pod");
            let back_off = match (
                about_a_pod,
                o.name,
                o.namespace.or(e.metadata.namespace.clone()),
            ) {
                (true, Some(pod), Some(namespace)) => Some(super::BackOff {
                    namespace,
                    pod,
                    pod_uid: o.uid.unwrap_or_default(),
                    container: o.field_path.as_deref().and_then(super::container_of),
                    count: e.count.unwrap_or_default(),
                }),
                _ => None,
            };
            let m = e.metadata;
            Self {
                meta: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: m.name,
                    namespace: m.namespace,
                    uid: m.uid,
                    resource_version: m.resource_version,
                    ..Default::default()
                },
                back_off,
            }
        }
    }
}

/// `spec.containers{web}` → `web`.
fn container_of(field_path: &str) -> Option<String> {
    let inner = field_path
        .strip_prefix("spec.containers{")
        .or_else(|| field_path.strip_prefix("spec.initContainers{"))?;
    inner.strip_suffix('}').map(str::to_owned)
}

impl BackOffEvent {
    /// Its key (the Event's uid, else namespace/name) and what is kept of it.
    pub(crate) fn keyed(self) -> (Arc<str>, Option<BackOff>) {
        let m = &self.meta;
        let key = match &m.uid {
            Some(uid) if !uid.is_empty() => uid.clone(),
            _ => format!(
                "{}/{}",
                m.namespace.as_deref().unwrap_or_default(),
                m.name.as_deref().unwrap_or_default()
            ),
        };
        (key.into(), self.back_off)
    }
}

crate::cluster::watch::core_v1_projection!(
    BackOffEvent,
    "Event",
    "events",
    k8s_openapi::NamespaceResourceScope,
    meta
);

/// One event of the BackOff watch (named here: outside `cluster`, the library names no `kube`
/// item).
pub(crate) type BackOffSeen = Result<WatchEvent<BackOffEvent>, watcher::Error>;

/// BackOff Events in every namespace, listed in pages then watched, re-listing and backing off
/// on errors as kube-runtime's watcher does.
pub(crate) fn watch_back_offs(client: kube::Client) -> impl Stream<Item = BackOffSeen> {
    let api: Api<BackOffEvent> = Api::all(client);
    let config = watcher::Config::default()
        .fields("reason=BackOff")
        .page_size(LIST_PAGE);
    watcher(api, config).default_backoff()
}

/// A Pod as the crash watch reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CrashedPod {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) node: Option<String>,
    /// Its `ownerReferences` entry with `controller: true`: (apiVersion, kind, name, uid).
    pub(crate) owner: Option<(String, String, String, String)>,
    /// Whether it has an annotations map (the mark is added into it, or as a new one).
    pub(crate) has_annotations: bool,
    /// Its `resourceVersion` as read: a new annotations map is added only if nothing changed
    /// the Pod since (it would replace annotations written in between).
    pub(crate) resource_version: Option<String>,
    /// Its labels (the selector of its owner's other Pods).
    pub(crate) labels: std::collections::BTreeMap<String, String>,
    pub(crate) containers: Vec<ContainerEnd>,
    /// `spec.volumes`, each as what deleting the Pod would lose (`[crashes] heal`).
    pub(crate) volumes: Vec<Volume>,
}

impl CrashedPod {
    /// The label selector of its owner's Pods: its labels but those that differ from Pod to
    /// Pod or revision to revision ([`PER_POD_LABELS`]), so other revisions' Pods are found too
    /// (their imageID is compared anyway). `None` without a controller owner or labels left.
    pub(crate) fn siblings_selector(&self) -> Option<String> {
        self.owner.as_ref()?;
        let terms: Vec<String> = self
            .labels
            .iter()
            .filter(|(key, _)| !PER_POD_LABELS.contains(&key.as_str()))
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        (!terms.is_empty()).then(|| terms.join(","))
    }
}

/// A container's status as the crash watch reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ContainerEnd {
    pub(crate) name: String,
    pub(crate) image: String,
    /// `imageID`: what was pulled, by digest.
    pub(crate) image_id: Option<String>,
    pub(crate) ready: bool,
    /// `lastState.terminated`: reason, exit code, message, its run in seconds.
    pub(crate) terminated: Option<(String, i32, Option<String>, Option<i64>)>,
}

mod pod_wire {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub(super) struct Pod {
        pub(super) metadata: Meta,
        #[serde(default)]
        pub(super) spec: Spec,
        #[serde(default)]
        pub(super) status: Status,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct Meta {
        pub(super) name: Option<String>,
        pub(super) namespace: Option<String>,
        pub(super) uid: Option<String>,
        #[serde(default)]
        pub(super) owner_references: Vec<OwnerReference>,
        pub(super) annotations: Option<serde::de::IgnoredAny>,
        pub(super) resource_version: Option<String>,
        #[serde(default)]
        pub(super) labels: std::collections::BTreeMap<String, String>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct Spec {
        pub(super) node_name: Option<String>,
        #[serde(default)]
        pub(super) volumes: Vec<Volume>,
    }

    /// A volume: its name and which source it has (only an emptyDir's medium is read).
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct Volume {
        pub(super) name: String,
        pub(super) empty_dir: Option<EmptyDir>,
        pub(super) host_path: Option<serde::de::IgnoredAny>,
        pub(super) persistent_volume_claim: Option<serde::de::IgnoredAny>,
        pub(super) ephemeral: Option<serde::de::IgnoredAny>,
    }

    #[derive(Deserialize)]
    pub(super) struct EmptyDir {
        pub(super) medium: Option<String>,
    }

    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct Status {
        #[serde(default)]
        pub(super) container_statuses: Vec<ContainerStatus>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct ContainerStatus {
        pub(super) name: String,
        #[serde(default)]
        pub(super) image: String,
        #[serde(rename = "imageID")]
        pub(super) image_id: Option<String>,
        #[serde(default)]
        pub(super) ready: bool,
        #[serde(default)]
        pub(super) last_state: LastState,
    }

    #[derive(Default, Deserialize)]
    pub(super) struct LastState {
        pub(super) terminated: Option<Terminated>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct Terminated {
        pub(super) reason: Option<String>,
        pub(super) exit_code: i32,
        pub(super) message: Option<String>,
        pub(super) started_at: Option<Time>,
        pub(super) finished_at: Option<Time>,
    }
}

impl From<pod_wire::Pod> for CrashedPod {
    fn from(pod: pod_wire::Pod) -> Self {
        let m = pod.metadata;
        let owner = m
            .owner_references
            .into_iter()
            .find(|o| o.controller == Some(true))
            .map(|o| (o.api_version, o.kind, o.name, o.uid));
        let containers = pod
            .status
            .container_statuses
            .into_iter()
            .map(|c| ContainerEnd {
                terminated: c.last_state.terminated.map(|t| {
                    let ran = run_seconds(t.started_at.as_ref(), t.finished_at.as_ref());
                    (t.reason.unwrap_or_default(), t.exit_code, t.message, ran)
                }),
                name: c.name,
                image: c.image,
                image_id: c.image_id.filter(|i| !i.is_empty()),
                ready: c.ready,
            })
            .collect();
        Self {
            namespace: m.namespace.unwrap_or_default(),
            name: m.name.unwrap_or_default(),
            uid: m.uid.unwrap_or_default(),
            node: pod.spec.node_name,
            owner,
            has_annotations: m.annotations.is_some(),
            resource_version: m.resource_version,
            labels: m.labels,
            containers,
            volumes: pod.spec.volumes.into_iter().map(volume).collect(),
        }
    }
}

fn volume(v: pod_wire::Volume) -> Volume {
    let kind = if let Some(empty_dir) = v.empty_dir {
        VolumeKind::EmptyDir(empty_dir.medium)
    } else if v.host_path.is_some() {
        VolumeKind::HostPath
    } else if v.persistent_volume_claim.is_some() {
        VolumeKind::PersistentVolumeClaim
    } else if v.ephemeral.is_some() {
        VolumeKind::Ephemeral
    } else {
        VolumeKind::Other
    };
    Volume { name: v.name, kind }
}

fn run_seconds(started: Option<&Time>, finished: Option<&Time>) -> Option<i64> {
    let (started, finished) = (started?, finished?);
    Some(finished.0.as_second() - started.0.as_second())
}

/// Reads the Pods and their logs the crash watch looks at.
#[derive(Clone)]
pub(crate) struct CrashReader {
    client: kube::Client,
}

impl CrashReader {
    pub(crate) fn new(client: kube::Client) -> Self {
        Self { client }
    }

    /// The Pod (`None`: gone).
    pub(crate) async fn pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<CrashedPod>, kube::Error> {
        let api: Api<PodRead> = Api::namespaced(self.client.clone(), namespace);
        match api.get(name).await {
            Ok(read) => Ok(Some(read.0)),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The Pods of `namespace` that `selector` selects (at most [`OWNER_PODS_LIMIT`], one page),
    /// each read into the same projection as the crashing Pod.
    pub(crate) async fn pods_selected(
        &self,
        namespace: &str,
        selector: &str,
    ) -> Result<Vec<CrashedPod>, kube::Error> {
        let api: Api<PodRead> = Api::namespaced(self.client.clone(), namespace);
        let params = ListParams::default()
            .labels(selector)
            .limit(OWNER_PODS_LIMIT);
        let listed = api.list(&params).await?;
        Ok(listed.items.into_iter().map(|read| read.0).collect())
    }

    /// The previous run's last lines of `container` (bounded), or why not.
    pub(crate) async fn previous_log(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Result<String, kube::Error> {
        let api: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(self.client.clone(), namespace);
        let params = LogParams {
            container: Some(container.to_owned()),
            previous: true,
            tail_lines: Some(LOG_TAIL_LINES),
            limit_bytes: Some(LOG_LIMIT_BYTES),
            ..LogParams::default()
        };
        api.logs(pod, &params).await
    }

    /// Marks `pod` with the crash annotation's `value`: one JSON Patch (as the gate controller
    /// patches Pods, `tests/data/kube-api/gates/`), guarded by a `test` of its uid so that a
    /// Pod of the same name made since is never marked.
    pub(crate) async fn mark(&self, pod: &CrashedPod, value: &str) -> Result<(), kube::Error> {
        let api: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace);
        let mut ops = vec![json!({"op": "test", "path": "/metadata/uid", "value": pod.uid})];
        if pod.has_annotations {
            let key = crate::mutate::patch::pointer_token(CRASH_ANNOTATION);
            ops.push(
                json!({"op": "add", "path": format!("/metadata/annotations/{key}"), "value": value}),
            );
        } else {
            // A whole new map: only onto the Pod as read, or annotations written since would
            // be replaced (a changed Pod answers 422 and stays unmarked).
            let Some(version) = &pod.resource_version else {
                return Ok(());
            };
            ops.push(json!({"op": "test", "path": "/metadata/resourceVersion", "value": version}));
            ops.push(json!({"op": "add", "path": "/metadata/annotations",
                "value": {CRASH_ANNOTATION: value}}));
        }
        let ops = serde_json::Value::Array(ops);
        let patch: json_patch::Patch =
            serde_json::from_value(ops).expect("a JSON Patch of known operations");
        api.patch(
            &pod.name,
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await?;
        Ok(())
    }

    /// Deletes the Pod `namespace/name` if it is still the one of `uid` (a `uid` precondition,
    /// as recorded: never its replacement of the same name).
    pub(crate) async fn delete(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<Deleted, kube::Error> {
        let api: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(self.client.clone(), namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => Ok(Deleted::Deleted),
            // The uid in the precondition no longer matches: the Pod was replaced.
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(Deleted::Gone),
            Err(e) => Err(e),
        }
    }
}

/// What a delete with a uid precondition did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deleted {
    /// Deleted (gracefully: the kubelet finishes it).
    Deleted,
    /// Gone already, or replaced by a Pod of the same name (409 on the precondition): nothing
    /// more to do.
    Gone,
}

/// The Pod read through `kube`'s typed `get`, deserialized into [`CrashedPod`] only.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "pod_wire::Pod")]
struct PodRead(CrashedPod, ObjectMeta);

impl From<pod_wire::Pod> for PodRead {
    fn from(pod: pod_wire::Pod) -> Self {
        Self(pod.into(), ObjectMeta::default())
    }
}

crate::cluster::watch::core_v1_projection!(
    PodRead,
    "Pod",
    "pods",
    k8s_openapi::NamespaceResourceScope,
    1
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_siblings_selector_leaves_out_per_pod_labels() {
        let labelled = |labels: &[(&str, &str)], owned: bool| CrashedPod {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            owner: owned.then(|| {
                (
                    "apps/v1".into(),
                    "ReplicaSet".into(),
                    "web-1".into(),
                    "u".into(),
                )
            }),
            ..CrashedPod::default()
        };
        let web = labelled(
            &[
                ("app", "web"),
                ("pod-template-hash", "7d9c6b8f5"),
                ("tier", "front"),
            ],
            true,
        );
        assert_eq!(
            web.siblings_selector().as_deref(),
            Some("app=web,tier=front")
        );
        assert_eq!(labelled(&[("app", "web")], false).siblings_selector(), None);
        assert_eq!(
            labelled(&[("pod-template-hash", "1")], true).siblings_selector(),
            None
        );
    }

    #[test]
    fn the_container_is_read_from_the_field_path() {
        assert_eq!(container_of("spec.containers{web}").as_deref(), Some("web"));
        assert_eq!(container_of("spec.initContainers{i}").as_deref(), Some("i"));
        assert_eq!(container_of("spec.containers"), None);
    }

    /// The recorded Pod ("the Pod as the crash watch reads it") read into what the watch keeps.
    #[test]
    fn the_recorded_pod_is_read_into_its_crash_facts() {
        let exchanges: serde_json::Value = serde_json::from_str(include_str!(
            "../../tests/data/kube-api/crashes/exchanges.json"
        ))
        .unwrap();
        let pod = exchanges
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["note"] == "the Pod as the crash watch reads it")
            .unwrap()["response"]["body"]
            .clone();
        let read: PodRead = serde_json::from_value(pod).unwrap();
        let pod = read.0;
        assert_eq!(pod.node.as_deref(), Some("n-arm-2"));
        assert_eq!(pod.owner.as_ref().map(|o| o.1.as_str()), Some("ReplicaSet"));
        assert_eq!(pod.siblings_selector().as_deref(), Some("app=web"));
        let web = &pod.containers[0];
        assert_eq!(
            web.terminated,
            Some((
                "Error".into(),
                255,
                Some("exec /usr/local/bin/web: exec format error\n".into()),
                Some(0)
            ))
        );
        assert!(web
            .image_id
            .as_deref()
            .unwrap()
            .contains("@sha256:5c4d2b0a"));
    }
}
