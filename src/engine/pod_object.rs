//! A Pod object as tolerable reads it, wherever it comes from — an AdmissionReview's object, a
//! DaemonSet's template, a manifest `review` reads, a workload's template `audit` reads, a gated
//! Pod the gate controller releases: exactly what the core reads ([`PodView`]) and what the
//! engine needs to look its images up (the namespace, pull secrets). Every other field —
//! `managedFields` (free-form JSON, most of a real Pod's bytes), env, probes, resources,
//! `status` — is skipped unread: each string of it would be an allocation on every admission.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, ImageVolumeSource, LocalObjectReference, PodOS, PodSchedulingGate, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde::Deserialize;

use crate::cluster::PullSecretRefs;
use crate::mutate::{ImageSlot, PodSpecView, PodView, SlotKind};

/// A Pod object as tolerable reads it: what the decision reads, and what the shell needs to
/// look its images up.
#[derive(Clone, Debug)]
pub(crate) struct PodObject {
    pub(crate) view: PodView,
    /// `metadata.namespace` (the request's namespace comes first).
    pub(crate) namespace: Option<String>,
    pub(crate) pull_secrets: PullSecretRefs,
}

impl PodObject {
    /// Reads a Pod's JSON. The API server always sends metadata; without it the patch's paths
    /// under /metadata would not apply (found by fuzzing), so such an object is refused.
    pub(crate) fn parse(json: &str) -> Result<Self, String> {
        let pod: PodIn = serde_json::from_str(json)
            .map_err(|e| format!("the object is not a valid Pod: {e}"))?;
        Self::read(pod)
    }

    /// Reads a Pod already parsed as JSON (a workload's Pod in `review` and `audit`), as
    /// [`PodObject::parse`] reads its text — without writing it out again to parse it.
    pub(crate) fn from_value(pod: &serde_json::Value) -> Result<Self, String> {
        let pod =
            PodIn::deserialize(pod).map_err(|e| format!("the object is not a valid Pod: {e}"))?;
        Self::read(pod)
    }

    /// A Pod's JSON read for its metadata alone: the spec (and all else) skipped unread, so
    /// `view.spec` is `None` and there are no pull secrets.
    pub(crate) fn metadata_only(json: &str) -> Result<Self, String> {
        let pod: MetadataIn = serde_json::from_str(json)
            .map_err(|e| format!("the object is not a valid Pod: {e}"))?;
        Self::read(PodIn {
            metadata: pod.metadata,
            spec: None,
        })
    }

    /// A DaemonSet's JSON: its Pod template, read as a Pod in the DaemonSet's namespace.
    pub(crate) fn daemon_set_template(json: &str) -> Result<Self, String> {
        let daemon_set: DaemonSetIn = serde_json::from_str(json)
            .map_err(|e| format!("the object is not a valid DaemonSet: {e}"))?;
        let template = daemon_set
            .spec
            .and_then(|spec| spec.template)
            .ok_or("the DaemonSet has no Pod template")?;
        let mut pod = Self::read(template)?;
        pod.namespace = daemon_set.metadata.and_then(|m| m.namespace);
        Ok(pod)
    }

    fn read(pod: PodIn) -> Result<Self, String> {
        let meta = pod
            .metadata
            .ok_or("the object is not a valid Pod: it has no metadata")?;
        let (spec, pull_secrets) = match pod.spec {
            Some(spec) => {
                let (spec, pull) = spec.into_parts();
                (Some(spec), pull)
            }
            None => (None, PullSecretRefs::default()),
        };
        Ok(Self {
            view: PodView {
                labels: meta.labels.unwrap_or_default(),
                annotations: meta.annotations,
                owner_references: meta.owner_references.unwrap_or_default(),
                spec,
            },
            namespace: meta.namespace,
            pull_secrets,
        })
    }
}

/// What is read of a DaemonSet: its namespace and its Pod template.
#[derive(Deserialize)]
struct DaemonSetIn {
    metadata: Option<MetaIn>,
    spec: Option<DaemonSetSpecIn>,
}

#[derive(Deserialize)]
struct DaemonSetSpecIn {
    template: Option<PodIn>,
}

#[derive(Deserialize)]
struct PodIn {
    metadata: Option<MetaIn>,
    spec: Option<SpecIn>,
}

/// A Pod read for its metadata alone; every other field is skipped by the parser.
#[derive(Deserialize)]
struct MetadataIn {
    metadata: Option<MetaIn>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaIn {
    namespace: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
}

/// The PodSpec fields read: every one a `k8s-openapi` type or built into one.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecIn {
    containers: Option<Vec<ContainerIn>>,
    init_containers: Option<Vec<ContainerIn>>,
    ephemeral_containers: Option<Vec<ContainerIn>>,
    volumes: Option<Vec<VolumeIn>>,
    node_selector: Option<BTreeMap<String, String>>,
    tolerations: Option<Vec<Toleration>>,
    affinity: Option<Affinity>,
    os: Option<PodOS>,
    node_name: Option<String>,
    scheduling_gates: Option<Vec<PodSchedulingGate>>,
    image_pull_secrets: Option<Vec<LocalObjectReference>>,
    service_account_name: Option<String>,
}

#[derive(Deserialize)]
struct ContainerIn {
    name: String,
    image: Option<String>,
}

#[derive(Deserialize)]
struct VolumeIn {
    name: String,
    image: Option<ImageVolumeSource>,
}

impl SpecIn {
    fn into_parts(self) -> (PodSpecView, PullSecretRefs) {
        let mut images = Vec::new();
        for (kind, list) in [
            (SlotKind::InitContainer, self.init_containers),
            (SlotKind::Container, self.containers),
            (SlotKind::EphemeralContainer, self.ephemeral_containers),
        ] {
            images.extend(
                list.into_iter()
                    .flatten()
                    .enumerate()
                    .map(|(index, c)| ImageSlot {
                        kind,
                        name: c.name,
                        image: c.image,
                        index,
                    }),
            );
        }
        let volumes = self.volumes.into_iter().flatten().enumerate();
        images.extend(volumes.filter_map(|(index, v)| {
            Some(ImageSlot {
                kind: SlotKind::ImageVolume,
                name: v.name,
                image: v.image?.reference,
                index,
            })
        }));
        let spec = PodSpecView {
            images,
            node_selector: self.node_selector,
            tolerations: self.tolerations,
            affinity: self.affinity,
            os: self.os,
            node_name: self.node_name,
            scheduling_gates: self
                .scheduling_gates
                .map(|gates| gates.into_iter().map(|g| g.name).collect()),
        };
        let pull = PullSecretRefs {
            secrets: self
                .image_pull_secrets
                .into_iter()
                .flatten()
                .map(|r| r.name)
                .collect(),
            service_account: self.service_account_name,
        };
        (spec, pull)
    }
}
