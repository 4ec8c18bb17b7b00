//! The Kubernetes API of the gate controller (`crate::gates`): the watch of Pods labelled
//! `tolerable.io/gated=true` — each kept as a compact record (name, namespace, uid, creation),
//! never the whole Pod — a Pod read whole when it is worked on, the release patch (JSON Patch),
//! and Warning Events.

use std::time::SystemTime;

use futures_util::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, watcher, Event as WatchEvent};
use kube::runtime::WatchStreamExt as _;
use serde::Deserialize;

use crate::mutate::gate::{GATED, GATED_LABEL};
use crate::mutate::patch::Operation;

/// Watch pages: the gated Pods are few, but a list is bounded whatever their number.
const LIST_PAGE: u32 = 500;

/// What the controller keeps of one gated Pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GatedRecord {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) created: SystemTime,
}

/// A Pod as the gated watch reads it off the wire: its metadata's identity only (serde skips
/// the spec, the status and every other field unread).
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "wire::Pod")]
pub(crate) struct GatedPod {
    meta: ObjectMeta,
}

mod wire {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub(super) struct Pod {
        metadata: Meta,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
        creation_timestamp: Option<Time>,
    }

    impl From<Pod> for super::GatedPod {
        fn from(pod: Pod) -> Self {
            let m = pod.metadata;
            Self {
                meta: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: m.name,
                    namespace: m.namespace,
                    uid: m.uid,
                    resource_version: m.resource_version,
                    creation_timestamp: m.creation_timestamp,
                    ..Default::default()
                },
            }
        }
    }
}

impl GatedPod {
    fn record(&self) -> GatedRecord {
        let m = &self.meta;
        GatedRecord {
            namespace: m.namespace.clone().unwrap_or_default(),
            name: m.name.clone().unwrap_or_default(),
            uid: m.uid.clone().unwrap_or_default(),
            created: m
                .creation_timestamp
                .as_ref()
                .map_or_else(SystemTime::now, |t| SystemTime::from(t.0)),
        }
    }
}

crate::cluster::watch::core_v1_projection!(
    GatedPod,
    "Pod",
    "pods",
    k8s_openapi::NamespaceResourceScope,
    meta
);

/// One event of the gated watch: kube-runtime's watcher event, each Pod as its record (taken
/// into the watch primitive's store by `crate::gates`).
pub(crate) type Seen = Result<GatedEvent, watcher::Error>;

/// A watch event of a gated Pod's record (named here: outside `cluster`, the library names no
/// `kube` item).
pub(crate) type GatedEvent = WatchEvent<GatedRecord>;

/// Pods labelled `tolerable.io/gated=true` in every namespace, listed in pages then watched,
/// re-listing and backing off on errors as kube-runtime's watcher does.
pub(crate) fn watch_gated(client: kube::Client) -> impl Stream<Item = Seen> {
    let api: Api<GatedPod> = Api::all(client);
    let config = watcher::Config::default()
        .labels(&format!("{GATED_LABEL}={GATED}"))
        .page_size(LIST_PAGE);
    watcher(api, config).default_backoff().map(|event| {
        event.map(|event| match event {
            WatchEvent::Init => WatchEvent::Init,
            WatchEvent::InitApply(pod) => WatchEvent::InitApply(pod.record()),
            WatchEvent::InitDone => WatchEvent::InitDone,
            WatchEvent::Apply(pod) => WatchEvent::Apply(pod.record()),
            WatchEvent::Delete(pod) => WatchEvent::Delete(pod.record()),
        })
    })
}

/// A Pod labelled `tolerable.io/gated` (either value), as `tolerable gates list` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ListedGate {
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// The label's value: `true` (waiting) or `unrunnable`.
    pub(crate) state: String,
    pub(crate) created: Option<SystemTime>,
    /// The decision annotation: what it waits for, or why it stays.
    pub(crate) decision: String,
}

/// What a list page's Pod is read as: its metadata's few fields (never the spec or status).
#[derive(Deserialize)]
struct ListedPod {
    metadata: ListedMeta,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListedMeta {
    name: String,
    #[serde(default)]
    namespace: String,
    creation_timestamp: Option<Time>,
    #[serde(default)]
    labels: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
}

/// Every Pod labelled `tolerable.io/gated` in `namespace` (all: `None`), in pages.
pub(crate) async fn list_gated(
    client: &kube::Client,
    namespace: Option<&str>,
) -> anyhow::Result<Vec<ListedGate>> {
    let lister = super::list::Lister {
        client,
        namespace,
        page: LIST_PAGE,
        progress: &|_| {},
    };
    lister
        .list::<Pod, ListedPod, ListedGate>(Some(GATED_LABEL), |pod| {
            let mut m = pod.metadata;
            Some(ListedGate {
                state: m.labels.remove(GATED_LABEL).unwrap_or_default(),
                decision: m
                    .annotations
                    .remove(crate::mutate::DECISION_ANNOTATION)
                    .unwrap_or_default(),
                created: m.creation_timestamp.map(|t| SystemTime::from(t.0)),
                namespace: m.namespace,
                name: m.name,
            })
        })
        .await
}

/// Why a patch was not applied.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PatchError {
    /// 422 or 409: the `test` failed (the Pod changed since it was read) or the API server
    /// refused the change: read it again.
    #[error("the Pod changed since it was read ({0})")]
    Stale(String),
    #[error("the Pod is gone")]
    Gone,
    #[error(transparent)]
    Api(kube::Error),
}

/// The Pods API of the controller.
#[derive(Clone)]
pub(crate) struct PodsApi {
    client: kube::Client,
}

impl PodsApi {
    pub(crate) fn new(client: kube::Client) -> Self {
        Self { client }
    }

    fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// The Pod as JSON (`None`: it is gone).
    pub(crate) async fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<serde_json::Value>, kube::Error> {
        let Some(pod) = self.pods(namespace).get_opt(name).await? else {
            return Ok(None);
        };
        Ok(Some(
            serde_json::to_value(pod).map_err(kube::Error::SerdeError)?,
        ))
    }

    /// One JSON Patch.
    pub(crate) async fn patch(
        &self,
        namespace: &str,
        name: &str,
        ops: &[Operation],
    ) -> Result<(), PatchError> {
        let value =
            serde_json::to_value(ops).map_err(|e| PatchError::Api(kube::Error::SerdeError(e)))?;
        let patch: json_patch::Patch = serde_json::from_value(value)
            .map_err(|e| PatchError::Api(kube::Error::SerdeError(e)))?;
        let sent = self
            .pods(namespace)
            .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 422 || e.code == 409 => {
                Err(PatchError::Stale(e.message))
            }
            Err(kube::Error::Api(e)) if e.code == 404 => Err(PatchError::Gone),
            Err(e) => Err(PatchError::Api(e)),
        }
    }

    /// A Warning Event on the Pod (core/v1), as `kubectl describe pod` shows them, written
    /// now (`cluster::events`, the one writer of Events).
    pub(crate) async fn warn(
        &self,
        pod: &GatedRecord,
        reason: &str,
        message: &str,
    ) -> Result<(), kube::Error> {
        let warning = super::events::Warning {
            regarding: super::events::Regarding {
                api_version: "v1".into(),
                kind: "Pod".into(),
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
            },
            reason: reason.into(),
            action: "Released".into(),
            note: message.into(),
        };
        super::events::create(&self.client, &warning).await
    }
}
