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

use super::json_scan::{Scanner, Step};
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
    /// `view.spec` is `None` and there are no pull secrets. The read stops at the end of
    /// `metadata`: what follows it (spec, status: half a real Pod's bytes) is not even scanned —
    /// the caller has already checked it is JSON. A second `metadata` after the first is
    /// therefore not seen.
    pub(crate) fn metadata_only(json: &str) -> Result<Self, String> {
        let metadata = match metadata_scanned(json) {
            Some(metadata) => metadata,
            None => {
                metadata_first(json).map_err(|e| format!("the object is not a valid Pod: {e}"))?
            }
        };
        Self::read(PodIn {
            metadata,
            spec: None,
        })
    }

    /// Whether the scanner's read of a Pod's metadata, when it gives one, is serde_json's (for
    /// the fuzz harness and the tests).
    pub(crate) fn metadata_reads_agree(json: &str) -> bool {
        match metadata_scanned(json) {
            Some(scanned) => metadata_first(json).is_ok_and(|read| read == scanned),
            None => true,
        }
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

/// A Pod object's `metadata`, read up to its end and no further (see [`PodObject::metadata_only`]); `None` when the object has none.
fn metadata_first(object: &str) -> Result<Option<MetaIn>, serde_json::Error> {
    use serde::de::{Deserializer as _, Error as _, IgnoredAny, MapAccess, Visitor};

    #[derive(Deserialize)]
    #[serde(field_identifier, rename_all = "lowercase")]
    enum Field {
        Metadata,
        #[serde(other)]
        Other,
    }

    /// Fills its slot with the metadata, then stops the parser (an error it never reports).
    struct First<'s>(&'s mut Option<Option<MetaIn>>);

    impl<'de> Visitor<'de> for First<'_> {
        type Value = ();

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a Pod object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(field) = map.next_key::<Field>()? {
                match field {
                    Field::Metadata => {
                        *self.0 = Some(map.next_value()?);
                        return Err(A::Error::custom("stopped after metadata"));
                    }
                    Field::Other => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(())
        }
    }

    let mut found = None;
    let mut parser = serde_json::Deserializer::from_str(object);
    match parser.deserialize_map(First(&mut found)) {
        // Only the stop leaves the slot filled.
        Err(_) if found.is_some() => Ok(found.flatten()),
        Err(e) => Err(e),
        Ok(()) => parser.end().map(|()| None),
    }
}

/// [`metadata_first`]'s answer when it is `Ok`, found by the [`json_scan`] scanner: the members
/// of `metadata` tolerable reads are read by serde_json, every other one (`managedFields`: most
/// of a real Pod's metadata) is only skipped, faster than serde_json skips it. `None` when the
/// scanner cannot say (a key written with escapes, a field twice, a value of the wrong type,
/// text it does not take): `metadata_first` reads the object then, and says what is wrong.
fn metadata_scanned(object: &str) -> Option<Option<MetaIn>> {
    let mut scanner = Scanner::new(object);
    let mut found = None;
    scanner.object(|s, key| {
        if key.contains('\\') {
            return None;
        }
        if key != "metadata" {
            return s.value().map(|_| Step::Next);
        }
        found = Some(match s.peek()? {
            b'{' => Some(metadata_members(s)?),
            _ => (s.value().map(|v| s.text(v))? == "null").then_some(None)?,
        });
        Some(Step::Stop)
    })?;
    if found.is_none() {
        // Read to its end without a `metadata`: nothing may follow the object.
        scanner.end()?;
    }
    Some(found.flatten())
}

/// The members of a `metadata` object, as `MetaIn`'s derived reader reads them (see
/// [`metadata_scanned`]).
fn metadata_members(scanner: &mut Scanner) -> Option<MetaIn> {
    fn read<T: serde::de::DeserializeOwned>(slot: &mut Option<T>, text: &str) -> Option<()> {
        *slot = serde_json::from_str::<Option<T>>(text).ok()?;
        Some(())
    }
    let mut meta = MetaIn {
        namespace: None,
        labels: None,
        annotations: None,
        owner_references: None,
    };
    let mut seen = [false; 4];
    scanner.object(|s, key| {
        if key.contains('\\') {
            return None;
        }
        let field = ["namespace", "labels", "annotations", "ownerReferences"]
            .iter()
            .position(|name| *name == key);
        let value = s.value()?;
        let Some(field) = field else {
            return Some(Step::Next);
        };
        // Twice is an error for the derived reader: it is told there.
        if std::mem::replace(&mut seen[field], true) {
            return None;
        }
        let text = s.text(value);
        match field {
            0 => read(&mut meta.namespace, text)?,
            1 => read(&mut meta.labels, text)?,
            2 => read(&mut meta.annotations, text)?,
            _ => read(&mut meta.owner_references, text)?,
        }
        Some(Step::Next)
    })?;
    Some(meta)
}

#[derive(Debug, Deserialize, PartialEq)]
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
    #[serde(rename = "terminationMessagePolicy")]
    termination_message_policy: Option<String>,
}

#[derive(Deserialize)]
struct VolumeIn {
    name: String,
    image: Option<ImageVolumeSource>,
}

impl SpecIn {
    fn into_parts(self) -> (PodSpecView, PullSecretRefs) {
        let mut images = Vec::new();
        let mut no_policy = Vec::new();
        for (kind, list) in [
            (SlotKind::InitContainer, self.init_containers),
            (SlotKind::Container, self.containers),
            (SlotKind::EphemeralContainer, self.ephemeral_containers),
        ] {
            for (index, c) in list.into_iter().flatten().enumerate() {
                // Ephemeral containers are added through their own subresource, never created.
                if crate::mutate::logs_on_error::is_default(c.termination_message_policy.as_deref())
                    && kind != SlotKind::EphemeralContainer
                {
                    no_policy.push((kind, index));
                }
                images.push(ImageSlot {
                    kind,
                    name: c.name,
                    image: c.image,
                    index,
                });
            }
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
            default_termination_message_policy: no_policy,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What follows the first `metadata` is not read (not even a second one), and a Pod
    /// without metadata, or with metadata of the wrong shape, is told.
    #[test]
    fn the_metadata_read_stops_at_the_end_of_metadata() {
        let first = |object: &str| metadata_first(object).map(|m| m.map(|m| m.labels));
        let labels = Some(Some(BTreeMap::from([("a".to_owned(), "b".to_owned())])));
        let after = r#"{"kind":"Pod","metadata":{"labels":{"a":"b"}},"metadata":5,"spec":7}"#;
        assert_eq!(first(after).unwrap(), labels);
        assert_eq!(first(r#"{"kind":"Pod","spec":{}}"#).unwrap(), None);
        assert!(first(r#"{"metadata":{"labels":5}}"#).is_err());
        assert!(first("[1]").is_err());
    }

    /// The recorded v1.36 Pod's metadata (`managedFields` and all) is read by the scanner, not
    /// left to serde_json, and read alike.
    #[test]
    fn the_recorded_pods_metadata_is_read_by_the_scanner() {
        let body = include_str!(
            "../../tests/data/admissionreview/v1.36/pod-create-replicaset-shaped.json"
        );
        let review: serde_json::Value = serde_json::from_str(body).unwrap();
        let object = review["request"]["object"].to_string();
        let scanned = metadata_scanned(&object).expect("the scanner reads it");
        assert_eq!(scanned, metadata_first(&object).unwrap());
        assert!(scanned.is_some_and(|m| m.owner_references.is_some() && m.labels.is_some()));
    }
}
