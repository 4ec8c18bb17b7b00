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

use super::json_scan::{read_fields, FieldsOnce, Scanned, Scanner, Step};
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
    /// `scanned`: the object as the scanner found it while checking the body
    /// ([`review`](super::json_scan::review)): the Pod is then read from what it
    /// found, without its text being gone through again.
    pub(crate) fn parse(json: &str, scanned: Option<&Scanned>) -> Result<Self, String> {
        let pod = match scanned.and_then(pod_scanned) {
            Some(pod) => pod,
            None => serde_json::from_str(json)
                .map_err(|e| format!("the object is not a valid Pod: {e}"))?,
        };
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
    /// `view.spec` is `None` and there are no pull secrets. The first `metadata` is the one
    /// read (the caller has already checked the whole text is JSON): what follows it is not
    /// looked at, not even a second `metadata`.
    pub(crate) fn metadata_only(json: &str, scanned: Option<&Scanned>) -> Result<Self, String> {
        let metadata = match scanned.and_then(metadata_scanned) {
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

    /// Whether the reads of a Pod from its `scanned` members — its metadata alone, and the
    /// whole Pod — are serde_json's whenever they give one (for the fuzz harness and the tests).
    pub(crate) fn scanned_reads_agree(json: &str, scanned: Option<&Scanned>) -> bool {
        let Some(scanned) = scanned else {
            return true;
        };
        let metadata = match metadata_scanned(scanned) {
            Some(found) => metadata_first(json).is_ok_and(|read| read == found),
            None => true,
        };
        let whole = match pod_scanned(scanned) {
            Some(found) => serde_json::from_str::<PodIn>(json).is_ok_and(|read| read == found),
            None => true,
        };
        metadata && whole
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

#[derive(Debug, Deserialize, PartialEq)]
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

/// [`metadata_first`]'s answer when it is `Ok`, from the object's members the scanner found:
/// the members of `metadata` tolerable reads are read by serde_json, every other one
/// (`managedFields`: most of a real Pod's metadata) was only checked by the scanner. `None`
/// when they cannot say (a key written with escapes, a field twice, a value of the wrong type):
/// `metadata_first` reads the object then, and says what is wrong.
fn metadata_scanned(object: &Scanned) -> Option<Option<MetaIn>> {
    for (key, value) in object.members()? {
        if key.contains('\\') {
            return None;
        }
        if key != "metadata" {
            continue;
        }
        // The first `metadata` is the one read, as `metadata_first` stops there.
        return match value.members() {
            Some(members) => Some(Some(metadata_members(members)?)),
            None => value.is_null().then_some(None),
        };
    }
    Some(None)
}

/// The members of a `metadata` object, as `MetaIn`'s derived reader reads them (see
/// [`metadata_scanned`]).
fn metadata_members<'s, 'a: 's>(
    members: impl Iterator<Item = (&'a str, &'s Scanned<'a>)>,
) -> Option<MetaIn> {
    let mut meta = MetaIn {
        namespace: None,
        labels: None,
        annotations: None,
        owner_references: None,
    };
    let fields = ["namespace", "labels", "annotations", "ownerReferences"];
    read_fields(members, &fields, |field, value| {
        match field {
            0 => meta.namespace = value.read()?,
            1 => meta.labels = value.read()?,
            2 => meta.annotations = value.read()?,
            _ => meta.owner_references = value.read()?,
        }
        Some(())
    })?;
    Some(meta)
}

/// [`PodObject::parse`]'s fast way, from the object's members the scanner found: what
/// `PodIn`'s derived reader reads, with the members tolerable reads (labels, containers,
/// tolerations, affinity…) read by serde_json and every other one — `managedFields`, `status`:
/// most of a real Pod's bytes — only checked by the scanner. `None` whenever they cannot say
/// (as for [`metadata_scanned`]): serde_json then reads the object, and says what is wrong.
fn pod_scanned(object: &Scanned) -> Option<PodIn> {
    let mut pod = PodIn {
        metadata: None,
        spec: None,
    };
    read_fields(object.members()?, &["metadata", "spec"], |field, value| {
        match (field, value.members()) {
            // Not an object: `null`, or anything else, which serde_json decides on.
            (_, None) => value.is_null().then_some(())?,
            (0, Some(members)) => pod.metadata = Some(metadata_members(members)?),
            (_, Some(members)) => pod.spec = Some(spec_members(members)?),
        }
        Some(())
    })?;
    Some(pod)
}

/// The members of a `spec` object, as `SpecIn`'s derived reader reads them.
fn spec_members<'s, 'a: 's>(
    members: impl Iterator<Item = (&'a str, &'s Scanned<'a>)>,
) -> Option<SpecIn> {
    const FIELDS: [&str; 12] = [
        "containers",
        "initContainers",
        "ephemeralContainers",
        "volumes",
        "nodeSelector",
        "tolerations",
        "affinity",
        "os",
        "nodeName",
        "schedulingGates",
        "imagePullSecrets",
        "serviceAccountName",
    ];
    // Every field written out: a field added to `SpecIn` must be read here too.
    let mut spec = SpecIn {
        containers: None,
        init_containers: None,
        ephemeral_containers: None,
        volumes: None,
        node_selector: None,
        tolerations: None,
        affinity: None,
        os: None,
        node_name: None,
        scheduling_gates: None,
        image_pull_secrets: None,
        service_account_name: None,
    };
    read_fields(members, &FIELDS, |field, value| {
        match field {
            0 => spec.containers = list_of(value, container)?,
            1 => spec.init_containers = list_of(value, container)?,
            2 => spec.ephemeral_containers = list_of(value, container)?,
            3 => spec.volumes = list_of(value, volume)?,
            4 => spec.node_selector = value.read()?,
            5 => spec.tolerations = value.read()?,
            6 => spec.affinity = value.read()?,
            7 => spec.os = value.read()?,
            8 => spec.node_name = value.read()?,
            9 => spec.scheduling_gates = value.read()?,
            10 => spec.image_pull_secrets = value.read()?,
            _ => spec.service_account_name = value.read()?,
        }
        Some(())
    })?;
    Some(spec)
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct MetaIn {
    namespace: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
}

/// A list of objects (or `null`), as `Option<Vec<T>>` is read, each element read by `item`:
/// walked by the scanner, which skips the members nobody reads (a container's env, probes and
/// resources; a volume's source) faster than serde_json does, building nothing for them (only
/// a Pod being decided on is read so far).
fn list_of<T>(
    value: &Scanned,
    mut item: impl FnMut(&mut Scanner) -> Option<T>,
) -> Option<Option<Vec<T>>> {
    if value.is_null() {
        return Some(None);
    }
    let mut scanner = Scanner::new(value.text);
    let mut list = Vec::new();
    scanner.array(|s| {
        list.push(item(s)?);
        Some(())
    })?;
    scanner.end()?;
    Some(Some(list))
}

/// The object that starts here, as a derived reader reads a struct whose fields are `names`:
/// `read` gets each named member's index and text, once each; the others are skipped (a field
/// twice, or a key written with escapes, is left to that reader).
fn fields_of(
    scanner: &mut Scanner,
    names: &[&str],
    mut read: impl FnMut(usize, &str) -> Option<()>,
) -> Option<()> {
    let mut once = FieldsOnce::default();
    scanner.object(|s, key| {
        let Some(field) = once.field(names, key)? else {
            return s.value().map(|_| Step::Next);
        };
        let value = s.value()?;
        read(field, s.text(value))?;
        Some(Step::Next)
    })
}

/// The container object that starts here, as `ContainerIn`'s derived reader reads it (its
/// name is required).
fn container(scanner: &mut Scanner) -> Option<ContainerIn> {
    let (mut name, mut image, mut policy) = (None, None, None);
    let fields = ["name", "image", "terminationMessagePolicy"];
    fields_of(scanner, &fields, |field, text| {
        match field {
            0 => name = Some(serde_json::from_str::<String>(text).ok()?),
            1 => image = serde_json::from_str::<Option<String>>(text).ok()?,
            _ => policy = serde_json::from_str::<Option<String>>(text).ok()?,
        }
        Some(())
    })?;
    Some(ContainerIn {
        name: name?,
        image,
        termination_message_policy: policy,
    })
}

/// The volume object that starts here, as `VolumeIn`'s derived reader reads it (its name is
/// required; its source is skipped unless it is an image).
fn volume(scanner: &mut Scanner) -> Option<VolumeIn> {
    let (mut name, mut image) = (None, None);
    fields_of(scanner, &["name", "image"], |field, text| {
        match field {
            0 => name = Some(serde_json::from_str::<String>(text).ok()?),
            _ => image = serde_json::from_str::<Option<ImageVolumeSource>>(text).ok()?,
        }
        Some(())
    })?;
    Some(VolumeIn { name: name?, image })
}

/// The PodSpec fields read: every one a `k8s-openapi` type or built into one.
#[derive(Debug, Deserialize, PartialEq)]
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

#[derive(Debug, Deserialize, PartialEq)]
struct ContainerIn {
    name: String,
    image: Option<String>,
    #[serde(rename = "terminationMessagePolicy")]
    termination_message_policy: Option<String>,
}

#[derive(Debug, Deserialize, PartialEq)]
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

    /// `object` as the object of an AdmissionReview's request.
    fn in_review(object: &str) -> String {
        format!(r#"{{"request":{{"object":{object}}}}}"#)
    }

    /// The object's members the scanner finds in `body`.
    fn found(body: &str) -> Scanned<'_> {
        crate::engine::json_scan::tests::object_of(body).unwrap()
    }

    /// The recorded v1.36 Pod — its metadata (`managedFields` and all) alone, and whole — is
    /// read by the scanner, not left to serde_json, and read alike.
    #[test]
    fn the_recorded_pod_is_read_by_the_scanner() {
        let body = include_str!(
            "../../tests/data/admissionreview/v1.36/pod-create-replicaset-shaped.json"
        );
        let review: serde_json::Value = serde_json::from_str(body).unwrap();
        let object = review["request"]["object"].to_string();
        let body = in_review(&object);
        let found = found(&body);
        let scanned = metadata_scanned(&found).expect("the scanner reads it");
        assert_eq!(scanned, metadata_first(&object).unwrap());
        assert!(scanned.is_some_and(|m| m.owner_references.is_some() && m.labels.is_some()));

        let whole = pod_scanned(&found).expect("the scanner reads it whole");
        assert_eq!(whole, serde_json::from_str::<PodIn>(&object).unwrap());
        let spec = whole.spec.expect("a spec");
        let containers = spec.containers.expect("containers");
        assert!(containers.iter().all(|c| c.image.is_some()));
        assert!(spec.init_containers.is_some() && spec.volumes.is_some());
        assert!(spec.tolerations.is_some() && spec.service_account_name.is_some());
    }

    /// What the derived reader refuses (a field twice, a container or volume without a name, a
    /// list that is not one, an element that is not an object) the scanner leaves to it; what it
    /// takes (`null` for a list, unknown members, a volume's source other than an image) the
    /// scanner reads alike.
    #[test]
    fn the_scanner_leaves_what_the_derived_reader_refuses_to_it() {
        for refused in [
            r#"{"metadata":{},"spec":{"containers":[{"image":"a"}]}}"#,
            r#"{"metadata":{},"spec":{"containers":[{"name":"c"}],"containers":[]}}"#,
            r#"{"metadata":{},"metadata":{}}"#,
            r#"{"metadata":{},"spec":{"containers":{}}}"#,
            r#"{"metadata":{},"spec":{"volumes":[{"name":5}]}}"#,
            r#"{"metadata":{},"spec":{"containers":[{"name":"c","name":"d"}]}}"#,
            r#"{"metadata":{},"spec":{"initContainers":[{"name":null}]}}"#,
            r#"{"metadata":{},"spec":{"containers":[5]}}"#,
            r#"{"metadata":{},"spec":{"volumes":[{"image":{"reference":"r"}}]}}"#,
            r#"{"metadata":{},"spec":{"volumes":[{"name":"v","name":"w"}]}}"#,
            r#"{"metadata":{},"spec":{"volumes":[{"name":"v","image":{"reference":5}}]}}"#,
            r#"{"metadata":{},"spec":{"volumes":[null]}}"#,
        ] {
            assert!(serde_json::from_str::<PodIn>(refused).is_err(), "{refused}");
            let body = in_review(refused);
            assert_eq!(pod_scanned(&found(&body)), None, "{refused}");
        }
        for taken in [
            r#"{"metadata":null,"spec":null}"#,
            r#"{"kind":"Pod","metadata":{"x":[1,{"y":null}]},"spec":{"containers":null,"dnsPolicy":"x"}}"#,
            r#"{"spec":{"volumes":[{"name":"v","image":{"reference":"r"}}],"nodeName":null}}"#,
            r#"{"spec":{"volumes":[{"projected":{"sources":[{"configMap":{"items":[{"key":"k"}]}}]},"name":"p","image":null},{"name":"i","image":{"reference":"r","pullPolicy":"Always"}}]}}"#,
            r#"{"spec":{"containers":[{"env":[{"name":"a"}],"name":"c","image":null},{"name":"d","image":"i","terminationMessagePolicy":"File"}],"initContainers":[]}}"#,
        ] {
            let read = serde_json::from_str::<PodIn>(taken).unwrap();
            let body = in_review(taken);
            assert_eq!(pod_scanned(&found(&body)), Some(read), "{taken}");
        }
    }
}
