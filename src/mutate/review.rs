//! AdmissionReview v1 in and out. Our own thin types rather than kube-core's: its
//! `AdmissionResponse.patch` serialises as an array of numbers (kube-rs/kube#1781) where the API
//! documents a base64 string, and we only need the request fields the decision uses. The object
//! is read in the same pass as the envelope, through a view of the Pod fields tolerable uses, and
//! handed out as a real `k8s-openapi` Pod for a Pod CREATE.

use std::borrow::Cow;
use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_openapi::api::core::v1::{
    Affinity, Container, EphemeralContainer, ImageVolumeSource, LocalObjectReference, Pod, PodOS,
    PodSpec, Toleration, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

const ADMISSION_V1: &str = "admission.k8s.io/v1";

/// At most this many warnings reach the client; more are dropped by the API server.
pub const MAX_WARNINGS: usize = 16;
/// Longer warnings are cut by the API server.
pub const MAX_WARNING_LEN: usize = 256;

#[derive(Debug)]
pub struct AdmissionReviewIn {
    pub api_version: String,
    pub kind: String,
    pub request: Option<AdmissionRequest>,
}

#[derive(Debug)]
pub struct AdmissionRequest {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub sub_resource: Option<String>,
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub operation: String,
    pub dry_run: Option<bool>,
    object: ObjectIn,
}

/// The request's object, as far as it was read.
#[derive(Debug)]
enum ObjectIn {
    Absent,
    /// Read as a Pod (only the fields tolerable uses), in the same pass as the envelope.
    Pod(Box<PodView>),
    /// Not readable as a Pod: why.
    NotPod(String),
    /// Handed out by [`AdmissionRequest::take_pod`].
    Taken,
}

/// The wire shape of an AdmissionReview, with the object read as `O`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope<O> {
    api_version: String,
    kind: String,
    request: Option<RequestEnvelope<O>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestEnvelope<O> {
    uid: String,
    kind: GroupVersionKind,
    sub_resource: Option<String>,
    name: Option<String>,
    namespace: Option<String>,
    operation: String,
    object: Option<O>,
    dry_run: Option<bool>,
}

impl<O> Envelope<O> {
    fn into_review(self, object: impl FnOnce(O) -> ObjectIn) -> AdmissionReviewIn {
        AdmissionReviewIn {
            api_version: self.api_version,
            kind: self.kind,
            request: self.request.map(|r| AdmissionRequest {
                uid: r.uid,
                kind: r.kind,
                sub_resource: r.sub_resource,
                name: r.name,
                namespace: r.namespace,
                operation: r.operation,
                dry_run: r.dry_run,
                object: r.object.map_or(ObjectIn::Absent, object),
            }),
        }
    }
}

#[derive(Debug, Deserialize, PartialEq, Eq)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

/// Why a body is not an AdmissionReview we can answer at all (HTTP 400).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReviewError {
    #[error("body is not JSON: {0}")]
    NotJson(String),
    #[error("body is not an AdmissionReview: {0}")]
    NotAdmissionReview(String),
    #[error("AdmissionReview has no request")]
    NoRequest,
}

impl ReviewError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::NotJson(_) => "not_json",
            Self::NotAdmissionReview(_) => "not_admission_review",
            Self::NoRequest => "no_request",
        }
    }
}

/// Parses a request body in one pass, reading the object as a Pod (only the fields tolerable
/// uses; an object of another kind reads as an empty one and is never used). Only when that fails
/// is the body read again, keeping the object raw, to tell a bad envelope (HTTP 400) from an
/// object that is not a valid Pod (answered, unchanged, with a warning).
pub fn parse(body: &[u8]) -> Result<AdmissionReviewIn, ReviewError> {
    let text = std::str::from_utf8(body).map_err(|_| ReviewError::NotJson("not UTF-8".into()))?;
    let review = match serde_json::from_str::<Envelope<PodView>>(text) {
        Ok(envelope) => envelope.into_review(|pod| ObjectIn::Pod(Box::new(pod))),
        Err(_) => serde_json::from_str::<Envelope<&RawValue>>(text)
            .map_err(|e| {
                if e.is_syntax() || e.is_eof() {
                    ReviewError::NotJson(e.to_string())
                } else {
                    ReviewError::NotAdmissionReview(e.to_string())
                }
            })?
            .into_review(|raw| match serde_json::from_str::<PodView>(raw.get()) {
                Ok(pod) => ObjectIn::Pod(Box::new(pod)),
                Err(e) => ObjectIn::NotPod(e.to_string()),
            }),
    };
    if review.kind != "AdmissionReview" {
        return Err(ReviewError::NotAdmissionReview(format!(
            "kind is {:?}, not AdmissionReview",
            review.kind
        )));
    }
    if !review.api_version.starts_with("admission.k8s.io/") {
        return Err(ReviewError::NotAdmissionReview(format!(
            "apiVersion is {:?}, not admission.k8s.io/v1",
            review.api_version
        )));
    }
    if review.request.is_none() {
        return Err(ReviewError::NoRequest);
    }
    Ok(review)
}

impl AdmissionRequest {
    /// Whether tolerable mutates this request: a Pod (not a subresource) being created.
    pub fn is_pod_create(&self) -> bool {
        self.operation == "CREATE"
            && self.kind.group.is_empty()
            && self.kind.kind == "Pod"
            && self.sub_resource.as_deref().is_none_or(str::is_empty)
    }

    /// The Pod in the request, with what the decision reads: the metadata's name, namespace,
    /// labels, annotations and owner references, and of the spec its containers' names and
    /// images, image volumes, nodeName, nodeSelector, affinity, tolerations and os, and the pull
    /// secrets and service account (for registry credentials). The rest — `managedFields` (free-form JSON, most of a real
    /// Pod's bytes), env, volumes, probes, resources, `status` — is skipped unread: each string
    /// of it would be an allocation on every admission, for nothing.
    /// Handed out once: a second call finds it taken.
    pub fn take_pod(&mut self) -> Result<Pod, String> {
        let view = match std::mem::replace(&mut self.object, ObjectIn::Taken) {
            ObjectIn::Pod(view) => *view,
            ObjectIn::Absent => return Err("the request has no object".into()),
            ObjectIn::NotPod(e) => return Err(format!("the object is not a valid Pod: {e}")),
            ObjectIn::Taken => return Err("the Pod was already taken from the request".into()),
        };
        // The API server always sends metadata; without it the patch's paths under /metadata
        // would not apply (found by fuzzing), so such an object is left alone.
        let MetaView {
            name,
            generate_name,
            namespace,
            labels,
            annotations,
            owner_references,
        } = view
            .metadata
            .ok_or("the object is not a valid Pod: it has no metadata")?;
        Ok(Pod {
            metadata: ObjectMeta {
                name,
                generate_name,
                namespace,
                labels,
                annotations,
                owner_references,
                ..ObjectMeta::default()
            },
            spec: view.spec.map(SpecView::into_spec),
            status: None,
        })
    }
}

#[derive(Debug, Deserialize)]
struct PodView {
    metadata: Option<MetaView>,
    spec: Option<SpecView>,
}

/// The part of a PodSpec tolerable reads; every field a real `k8s-openapi` type or built into
/// one. Read by the decision and the patch (containers … os) and by the pull-secret lookup
/// (`cluster.rs`: imagePullSecrets, serviceAccountName): a spec field read anywhere else must be
/// added here, or it reads as absent.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecView {
    containers: Option<Vec<ContainerView>>,
    init_containers: Option<Vec<ContainerView>>,
    ephemeral_containers: Option<Vec<ContainerView>>,
    node_selector: Option<BTreeMap<String, String>>,
    tolerations: Option<Vec<Toleration>>,
    affinity: Option<Affinity>,
    os: Option<PodOS>,
    image_pull_secrets: Option<Vec<LocalObjectReference>>,
    service_account_name: Option<String>,
    /// A Pod already bound to a node is not steered.
    node_name: Option<String>,
    /// Only image volumes are kept (their images count like containers').
    volumes: Option<Vec<VolumeView>>,
}

#[derive(Debug, Deserialize)]
struct VolumeView {
    name: String,
    image: Option<ImageVolumeSource>,
}

#[derive(Debug, Deserialize)]
struct ContainerView {
    name: String,
    image: Option<String>,
}

impl SpecView {
    fn into_spec(self) -> PodSpec {
        let container = |c: ContainerView| Container {
            name: c.name,
            image: c.image,
            ..Container::default()
        };
        PodSpec {
            containers: self
                .containers
                .unwrap_or_default()
                .into_iter()
                .map(container)
                .collect(),
            init_containers: self
                .init_containers
                .map(|cs| cs.into_iter().map(container).collect()),
            ephemeral_containers: self.ephemeral_containers.map(|cs| {
                cs.into_iter()
                    .map(|c| EphemeralContainer {
                        name: c.name,
                        image: c.image,
                        ..EphemeralContainer::default()
                    })
                    .collect()
            }),
            node_selector: self.node_selector,
            tolerations: self.tolerations,
            affinity: self.affinity,
            os: self.os,
            image_pull_secrets: self.image_pull_secrets,
            service_account_name: self.service_account_name,
            node_name: self.node_name,
            volumes: self.volumes.map(|volumes| {
                volumes
                    .into_iter()
                    .filter(|v| v.image.is_some())
                    .map(|v| Volume {
                        name: v.name,
                        image: v.image,
                        ..Volume::default()
                    })
                    .collect()
            }),
            ..PodSpec::default()
        }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct MetaView {
    name: Option<String>,
    generate_name: Option<String>,
    namespace: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    /// A DaemonSet's Pod is not steered.
    owner_references: Option<Vec<OwnerReference>>,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReviewOut {
    /// Echoed (v1 or v1beta1); borrowed when it is the usual one.
    pub api_version: Cow<'static, str>,
    /// Always `AdmissionReview` ([`parse`] checks it).
    pub kind: &'static str,
    pub response: AdmissionResponse,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// Base64 of the JSON Patch, as the API documents it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<Base64Json>,
    /// Set exactly when `patch` is: a patch without a type is silently dropped by the API server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub audit_annotations: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct Status {
    pub code: u16,
    pub message: String,
}

impl AdmissionReviewOut {
    /// An allowed, unchanged answer to `review`.
    pub fn allow(review: &AdmissionReviewIn) -> Self {
        let uid = review
            .request
            .as_ref()
            .map(|r| r.uid.clone())
            .unwrap_or_default();
        Self {
            api_version: match review.api_version.as_str() {
                ADMISSION_V1 => Cow::Borrowed(ADMISSION_V1),
                other => Cow::Owned(other.to_owned()),
            },
            kind: "AdmissionReview",
            response: AdmissionResponse {
                uid,
                allowed: true,
                status: None,
                patch: None,
                patch_type: None,
                warnings: Vec::new(),
                audit_annotations: BTreeMap::new(),
            },
        }
    }

    pub fn deny(mut self, message: &str) -> Self {
        self.response.allowed = false;
        self.response.status = Some(Status {
            code: 403,
            message: message.to_owned(),
        });
        self
    }

    /// Adds a JSON Patch; an empty one is not sent at all.
    pub fn with_patch<T: Serialize>(mut self, operations: &[T]) -> Self {
        if operations.is_empty() {
            return self;
        }
        let mut json = Vec::with_capacity(1024);
        serde_json::to_writer(&mut json, operations).expect("JSON values serialize");
        self.response.patch = Some(Base64Json::encode(&json));
        self.response.patch_type = Some("JSONPatch");
        self
    }

    /// Adds warnings the way the API server can show them: ASCII, one line, at most
    /// [`MAX_WARNING_LEN`] characters, at most [`MAX_WARNINGS`] of them (a warning with a newline
    /// or tab would be silently dropped).
    pub fn with_warnings(mut self, warnings: impl IntoIterator<Item = impl AsRef<str>>) -> Self {
        for warning in warnings {
            if self.response.warnings.len() >= MAX_WARNINGS {
                break;
            }
            let clean: String = warning
                .as_ref()
                .chars()
                .map(|c| {
                    if c.is_ascii() && !c.is_ascii_control() {
                        c
                    } else {
                        ' '
                    }
                })
                .take(MAX_WARNING_LEN)
                .collect();
            if !clean.trim().is_empty() {
                self.response.warnings.push(clean);
            }
        }
        self
    }

    pub fn to_json(&self) -> Vec<u8> {
        let patch = self.response.patch.as_ref().map_or(0, |p| p.0.get().len());
        let warnings: usize = self.response.warnings.iter().map(String::len).sum();
        let mut out = Vec::with_capacity(256 + patch + warnings + 4 * self.response.warnings.len());
        serde_json::to_writer(&mut out, self).expect("an AdmissionReview serializes");
        out
    }
}

/// Base64 of some bytes, kept as the JSON string it is sent as. Base64's alphabet never needs
/// escaping, so it is written as is rather than scanned byte by byte by the JSON escaper (a
/// patch is most of an answer's bytes).
#[derive(Debug)]
pub struct Base64Json(Box<RawValue>);

impl Base64Json {
    pub fn encode(bytes: &[u8]) -> Self {
        let mut quoted = String::with_capacity(bytes.len().div_ceil(3) * 4 + 2);
        quoted.push('"');
        base64::engine::general_purpose::STANDARD.encode_string(bytes, &mut quoted);
        quoted.push('"');
        Self(RawValue::from_string(quoted).expect("a quoted base64 text is a JSON string"))
    }

    /// The base64 text.
    pub fn as_str(&self) -> &str {
        let quoted = self.0.get();
        &quoted[1..quoted.len() - 1]
    }
}

impl PartialEq for Base64Json {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Serialize for Base64Json {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQUEST: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{
        "uid":"705ab4f5-6393-11e8-b7cc-42010a800002","kind":{"group":"","version":"v1","kind":"Pod"},
        "operation":"CREATE","namespace":"apps","object":{"metadata":{"name":"p"},"spec":{"containers":[]}}}}"#;

    /// The exact bytes on the wire: `patch` is base64 (kube-rs/kube#1781 would send numbers),
    /// `patchType` travels with it, the uid, apiVersion and kind are echoed.
    #[test]
    fn golden_wire_bytes() {
        let review = parse(REQUEST.as_bytes()).unwrap();
        let ops = vec![
            serde_json::json!({"op": "add", "path": "/spec/tolerations", "value": [
            {"key": "kubernetes.io/arch", "operator": "Equal", "value": "arm64", "effect": "NoSchedule"}]}),
        ];
        let out = AdmissionReviewOut::allow(&review)
            .with_patch(&ops)
            .with_warnings(["one\twarning\nwith ünïcode"]);
        assert_eq!(
            String::from_utf8(out.to_json()).unwrap(),
            concat!(
                r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"#,
                r#""uid":"705ab4f5-6393-11e8-b7cc-42010a800002","allowed":true,"#,
                r#""patch":"W3sib3AiOiJhZGQiLCJwYXRoIjoiL3NwZWMvdG9sZXJhdGlvbnMiLCJ2YWx1ZSI6W3siZWZmZWN0IjoiTm9TY2hlZHVsZSIsImtleSI6Imt1YmVybmV0ZXMuaW8vYXJjaCIsIm9wZXJhdG9yIjoiRXF1YWwiLCJ2YWx1ZSI6ImFybTY0In1dfV0=","#,
                r#""patchType":"JSONPatch","warnings":["one warning with  n code"]}}"#
            )
        );
        // The patch is the same string through any serializer, and decodes to the operations.
        let value = serde_json::to_value(&out).unwrap();
        let patch = out.response.patch.as_ref().unwrap().as_str();
        assert_eq!(value["response"]["patch"], patch);
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&decoded).unwrap(),
            serde_json::json!(ops)
        );
    }

    #[test]
    fn empty_patch_sends_neither_patch_nor_type_and_denial_has_a_status() {
        let review = parse(REQUEST.as_bytes()).unwrap();
        let out = AdmissionReviewOut::allow(&review)
            .with_patch::<serde_json::Value>(&[])
            .deny("no common architecture");
        assert_eq!(
            String::from_utf8(out.to_json()).unwrap(),
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002","allowed":false,"status":{"code":403,"message":"no common architecture"}}}"#
        );
    }

    #[test]
    fn warnings_are_capped_in_number_and_length() {
        let review = parse(REQUEST.as_bytes()).unwrap();
        let long = "x".repeat(1000);
        let out = AdmissionReviewOut::allow(&review).with_warnings(vec![long.as_str(); 40]);
        assert_eq!(out.response.warnings.len(), MAX_WARNINGS);
        assert!(out
            .response
            .warnings
            .iter()
            .all(|w| w.len() == MAX_WARNING_LEN));
    }

    #[test]
    fn envelopes_that_are_not_admission_reviews() {
        for (body, want) in [
            (&b"\xff"[..], "not UTF-8"),
            (b"{", "not JSON"),
            (b"{}", "not an AdmissionReview"),
            (
                br#"{"apiVersion":"v1","kind":"AdmissionReview","request":null}"#,
                "apiVersion",
            ),
            (
                br#"{"apiVersion":"admission.k8s.io/v1","kind":"Pod"}"#,
                "kind is \"Pod\"",
            ),
            (
                br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
                "no request",
            ),
        ] {
            let err = parse(body).unwrap_err().to_string();
            assert!(err.contains(want), "{body:?}: {err}");
        }
        let review = parse(REQUEST.as_bytes()).unwrap();
        let mut request = review.request.unwrap();
        assert!(request.is_pod_create());
        assert!(request.take_pod().is_ok());
    }

    /// The view reads every field the decision reads: a field missing here would read as
    /// absent in production while tests that deserialize whole Pods pass.
    #[test]
    fn the_pod_view_keeps_owner_node_name_and_image_volumes() {
        let body = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": "CREATE", "namespace": "apps",
                "object": {
                    "metadata": {"name": "p", "ownerReferences": [{"apiVersion": "apps/v1",
                        "kind": "DaemonSet", "name": "agent", "uid": "x", "controller": true}]},
                    "spec": {
                        "nodeName": "arm-1",
                        "containers": [{"name": "c", "image": "app:1"}],
                        "volumes": [
                            {"name": "cfg", "configMap": {"name": "c"}},
                            {"name": "data", "image": {"reference": "weights:1"}},
                        ],
                    },
                },
            },
        });
        let review = parse(body.to_string().as_bytes()).unwrap();
        let pod = review.request.unwrap().take_pod().unwrap();
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("DaemonSet", Some(true))
        );
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("arm-1"));
        let volumes = spec.volumes.unwrap();
        assert_eq!(volumes.len(), 1, "only image volumes are kept");
        assert_eq!(
            volumes[0].image.as_ref().unwrap().reference.as_deref(),
            Some("weights:1")
        );
    }
}
