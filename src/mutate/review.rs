//! AdmissionReview v1 in and out. Our own thin types rather than kube-core's: its
//! `AdmissionResponse.patch` serialises as an array of numbers (kube-rs/kube#1781) where the API
//! documents a base64 string, and we only need the request fields the decision uses. The Pod is
//! a real `k8s-openapi` Pod, parsed only when the request is a Pod CREATE.

use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_openapi::api::core::v1::{
    Affinity, Container, EphemeralContainer, LocalObjectReference, Pod, PodOS, PodSpec, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// At most this many warnings reach the client; more are dropped by the API server.
pub const MAX_WARNINGS: usize = 16;
/// Longer warnings are cut by the API server.
pub const MAX_WARNING_LEN: usize = 256;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReviewIn<'a> {
    pub api_version: String,
    pub kind: String,
    #[serde(borrow)]
    pub request: Option<AdmissionRequest<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest<'a> {
    pub uid: String,
    pub kind: GroupVersionKind,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    pub operation: String,
    #[serde(default, borrow)]
    pub object: Option<&'a RawValue>,
    #[serde(default)]
    pub dry_run: Option<bool>,
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

/// Parses a request body. Only the envelope is checked here; the object is parsed later, and
/// only if it is a Pod being created.
pub fn parse(body: &[u8]) -> Result<AdmissionReviewIn<'_>, ReviewError> {
    let text = std::str::from_utf8(body).map_err(|_| ReviewError::NotJson("not UTF-8".into()))?;
    let review: AdmissionReviewIn = serde_json::from_str(text).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            ReviewError::NotJson(e.to_string())
        } else {
            ReviewError::NotAdmissionReview(e.to_string())
        }
    })?;
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

impl AdmissionRequest<'_> {
    /// Whether tolerable mutates this request: a Pod (not a subresource) being created.
    pub fn is_pod_create(&self) -> bool {
        self.operation == "CREATE"
            && self.kind.group.is_empty()
            && self.kind.kind == "Pod"
            && self.sub_resource.as_deref().is_none_or(str::is_empty)
    }

    /// The Pod in the request, with what the decision reads: the metadata's name, namespace,
    /// labels and annotations, and of the spec its containers' names and images, nodeSelector,
    /// affinity, tolerations and os, and the pull secrets and service account (for registry
    /// credentials). The rest — `managedFields` (free-form JSON, most of a real
    /// Pod's bytes), env, volumes, probes, resources, `status` — is skipped unread: each string
    /// of it would be an allocation on every admission, for nothing.
    pub fn pod(&self) -> Result<Pod, String> {
        let raw = self.object.ok_or("the request has no object")?;
        let view: PodView = serde_json::from_str(raw.get())
            .map_err(|e| format!("the object is not a valid Pod: {e}"))?;
        // The API server always sends metadata; without it the patch's paths under /metadata
        // would not apply (found by fuzzing), so such an object is left alone.
        let MetaView {
            name,
            generate_name,
            namespace,
            labels,
            annotations,
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
                ..ObjectMeta::default()
            },
            spec: view.spec.map(SpecView::into_spec),
            status: None,
        })
    }
}

#[derive(Deserialize)]
struct PodView {
    metadata: Option<MetaView>,
    spec: Option<SpecView>,
}

/// The part of a PodSpec tolerable reads; every field a real `k8s-openapi` type or built into
/// one. Read by the decision and the patch (containers … os) and by the pull-secret lookup
/// (`cluster.rs`: imagePullSecrets, serviceAccountName): a spec field read anywhere else must be
/// added here, or it reads as absent.
#[derive(Deserialize)]
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
}

#[derive(Deserialize)]
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
            ..PodSpec::default()
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct MetaView {
    name: Option<String>,
    generate_name: Option<String>,
    namespace: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReviewOut {
    pub api_version: String,
    pub kind: String,
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
    pub patch: Option<String>,
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
    pub fn allow(review: &AdmissionReviewIn<'_>) -> Self {
        let uid = review
            .request
            .as_ref()
            .map(|r| r.uid.clone())
            .unwrap_or_default();
        Self {
            api_version: review.api_version.clone(),
            kind: review.kind.clone(),
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
        let json = serde_json::to_vec(operations).expect("JSON values serialize");
        self.response.patch = Some(base64::engine::general_purpose::STANDARD.encode(json));
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
        serde_json::to_vec(self).expect("an AdmissionReview serializes")
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
        let request = review.request.unwrap();
        assert!(request.is_pod_create());
        assert!(request.pod().is_ok());
    }
}
