//! AdmissionReview v1 in and out: the wire format, which only the admission layer knows. Our
//! own thin types rather than kube-core's: its `AdmissionResponse.patch` serialises as an array
//! of numbers (kube-rs/kube#1781) where the API documents a base64 string, and we only need the
//! request fields the decision uses. The object stays raw until asked for, then is read as the
//! engine's [`PodObject`] (what the core reads and the engine needs, nothing else).

use std::borrow::Cow;
use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::engine::json_scan::{self, Scanned};
use crate::engine::PodObject;

/// The AdmissionReview version tolerable speaks (and echoes when asked in it).
pub(crate) const ADMISSION_V1: &str = "admission.k8s.io/v1";

/// At most this many warnings reach the client; more are dropped by the API server.
pub(crate) const MAX_WARNINGS: usize = 16;
/// Longer warnings are cut by the API server.
pub(crate) const MAX_WARNING_LEN: usize = 256;

/// `warning` as one ASCII line of at most [`MAX_WARNING_LEN`] bytes, ending with `…` (three
/// bytes, the one non-ASCII character) when it was cut.
pub(crate) fn cut_warning(warning: &str) -> String {
    const MORE: char = '…';
    let printable = |c: char| c.is_ascii() && !c.is_ascii_control();
    let ascii = |c: char| if printable(c) { c } else { ' ' };
    // The usual warning is one short line of printable ASCII already: copied, not rebuilt
    // character by character (a byte past ASCII is a char past ASCII, so not printable).
    if warning.len() <= MAX_WARNING_LEN && warning.bytes().all(|b| printable(b.into())) {
        return warning.to_owned();
    }
    if warning.chars().count() <= MAX_WARNING_LEN {
        return warning.chars().map(ascii).collect();
    }
    let mut out: String = warning
        .chars()
        .take(MAX_WARNING_LEN - MORE.len_utf8())
        .map(ascii)
        .collect();
    out.push(MORE);
    out
}

/// A parsed AdmissionReview; the object stays raw (borrowed from the body) until asked for.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AdmissionReviewIn<'a> {
    pub(crate) api_version: String,
    pub(crate) kind: String,
    #[serde(borrow)]
    pub(crate) request: Option<AdmissionRequest<'a>>,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AdmissionRequest<'a> {
    pub(crate) uid: String,
    pub(crate) kind: GroupVersionKind,
    pub(crate) sub_resource: Option<String>,
    pub(crate) namespace: Option<String>,
    pub(crate) operation: String,
    /// A dry run writes nothing: no Event either.
    #[serde(default)]
    pub(crate) dry_run: Option<bool>,
    /// The object's JSON text, as it is in the body (`null` reads as none).
    #[serde(default, borrow, deserialize_with = "raw_text")]
    object: Option<&'a str>,
    /// The object's members, when the scanner found them while checking the body.
    #[serde(skip)]
    scanned: Found<'a>,
}

/// The object as the scanner found it while checking the body (looked into as a Pod is read),
/// so the Pod is read without going through its text again. Not part of what the review says:
/// two reviews are equal whatever their scans found.
#[derive(Debug, Default)]
struct Found<'a>(Option<Scanned<'a>>);

impl PartialEq for Found<'_> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// A value's JSON text, borrowed from the body (serde_json checks it is JSON, building nothing).
fn raw_text<'de, D: serde::Deserializer<'de>>(value: D) -> Result<Option<&'de str>, D::Error> {
    Ok(Option::<&'de RawValue>::deserialize(value)?.map(RawValue::get))
}

#[derive(Debug, Deserialize, PartialEq, Eq)]
pub(crate) struct GroupVersionKind {
    #[serde(default)]
    pub(crate) group: String,
    #[serde(default)]
    pub(crate) version: String,
    #[serde(default)]
    pub(crate) kind: String,
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

/// Parses a request body: the envelope now, the object when [`AdmissionRequest::pod`] asks, so
/// a bad envelope (HTTP 400) is told from an object that is not a valid Pod (answered,
/// unchanged, with a warning).
///
/// The object is most of a body's bytes, and serde_json, which must see it is JSON (a body that
/// is not gets a 400), skips it token by token. So the whole body is checked by one pass of
/// [`json_scan`], which also notes where the review's, the request's and the object's members
/// are; the envelope's fields are read from those (serde_json reads each), and the Pod later
/// too. Whenever the scanner cannot vouch for a body, or the envelope is not one we answer,
/// serde_json reads the body as it is: every error, and its message, is serde_json's own.
pub(crate) fn parse(body: &[u8]) -> Result<AdmissionReviewIn<'_>, ReviewError> {
    let text = std::str::from_utf8(body).map_err(|_| ReviewError::NotJson("not UTF-8".into()))?;
    scanned(text).map_or_else(|| read_envelope(text), Ok)
}

/// [`parse`]'s fast way: `None` when the scanner cannot vouch for `text` or the envelope is not
/// one we answer (serde_json then reads it all, and says why).
fn scanned(text: &str) -> Option<AdmissionReviewIn<'_>> {
    let review = json_scan::review(text)?;
    let (mut api_version, mut kind, mut request) = (None, None, None);
    let fields = ["apiVersion", "kind", "request"];
    json_scan::read_fields(review.into_members()?, &fields, |field, value| {
        match field {
            0 => api_version = Some(value.read()??),
            1 => kind = Some(value.read()??),
            _ if value.is_null() => {}
            _ => request = Some(request_scanned(value)?),
        }
        Some(())
    })?;
    let review = AdmissionReviewIn {
        api_version: api_version?,
        kind: kind?,
        request,
    };
    answerable(review).ok()
}

/// A request read from its members as its derived reader reads it (see [`scanned`]), with the
/// object as the scanner found it.
fn request_scanned(request: Scanned<'_>) -> Option<AdmissionRequest<'_>> {
    const FIELDS: [&str; 7] = [
        "uid",
        "kind",
        "subResource",
        "namespace",
        "operation",
        "dryRun",
        "object",
    ];
    let (mut uid, mut kind, mut sub_resource, mut namespace) = (None, None, None, None);
    let (mut operation, mut dry_run, mut object) = (None, None, None);
    json_scan::read_fields(request.into_members()?, &FIELDS, |field, value| {
        match field {
            0 => uid = Some(value.read()??),
            1 => kind = Some(value.read()??),
            2 => sub_resource = value.read()?,
            3 => namespace = value.read()?,
            4 => operation = Some(value.read()??),
            5 => dry_run = value.read()?,
            _ => object = Some(value).filter(|object| !object.is_null()),
        }
        Some(())
    })?;
    Some(AdmissionRequest {
        uid: uid?,
        kind: kind?,
        sub_resource,
        namespace,
        operation: operation?,
        dry_run,
        object: object.as_ref().map(|object| object.text),
        scanned: Found(object),
    })
}

/// [`parse`] by serde_json alone: the text as it is, object and all (its tests compare).
pub(crate) fn parse_whole(body: &[u8]) -> Result<AdmissionReviewIn<'_>, ReviewError> {
    let text = std::str::from_utf8(body).map_err(|_| ReviewError::NotJson("not UTF-8".into()))?;
    read_envelope(text)
}

/// An AdmissionReview we answer, read by serde_json from `text`.
fn read_envelope(text: &str) -> Result<AdmissionReviewIn<'_>, ReviewError> {
    let review: AdmissionReviewIn = serde_json::from_str(text).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            ReviewError::NotJson(e.to_string())
        } else {
            ReviewError::NotAdmissionReview(e.to_string())
        }
    })?;
    answerable(review)
}

/// `review` when it is an AdmissionReview we answer.
fn answerable(review: AdmissionReviewIn<'_>) -> Result<AdmissionReviewIn<'_>, ReviewError> {
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
    pub(crate) fn is_pod_create(&self) -> bool {
        self.operation == "CREATE"
            && self.kind.group.is_empty()
            && self.kind.kind == "Pod"
            && self.sub_resource.as_deref().is_none_or(str::is_empty)
    }

    /// Whether this is an apps/v1 DaemonSet being created or updated: its Pod template is
    /// decided on, so the DaemonSet controller puts Pods only on nodes that run them.
    pub(crate) fn is_daemon_set_write(&self) -> bool {
        matches!(self.operation.as_str(), "CREATE" | "UPDATE")
            && self.kind.group == "apps"
            && self.kind.kind == "DaemonSet"
            && self.sub_resource.as_deref().is_none_or(str::is_empty)
    }

    /// The DaemonSet's Pod template, read as a Pod in the DaemonSet's namespace.
    pub(crate) fn daemon_set_template(&self) -> Result<PodObject, String> {
        let object = self.object.ok_or("the request has no object")?;
        PodObject::daemon_set_template(object)
    }

    /// The Pod in the request (see [`PodObject`]).
    pub(crate) fn pod(&self) -> Result<PodObject, String> {
        let object = self.object.ok_or("the request has no object")?;
        PodObject::parse(object, self.scanned.0.as_ref())
    }

    /// Whether the reads of the object from what the scanner found (its metadata alone, and
    /// the whole Pod) agree with serde_json's (for the fuzz harness).
    pub(crate) fn scanned_reads_agree(&self) -> bool {
        let scanned = self.scanned.0.as_ref();
        self.object
            .is_none_or(|object| PodObject::scanned_reads_agree(object, scanned))
    }

    /// The Pod in the request, its metadata only: the spec (and all else) skipped unread, so
    /// `view.spec` is `None` and there are no pull secrets. For a Pod left alone whatever its
    /// spec says. The first `metadata` is the one read (the body's one scan has checked all of
    /// it is JSON): a second `metadata` after it is not seen.
    pub(crate) fn pod_metadata(&self) -> Result<PodObject, String> {
        let object = self.object.ok_or("the request has no object")?;
        PodObject::metadata_only(object, self.scanned.0.as_ref())
    }
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReviewOut {
    /// Echoed (v1 or v1beta1); borrowed when it is the usual one.
    pub(crate) api_version: Cow<'static, str>,
    /// Always `AdmissionReview` ([`parse`] checks it).
    pub(crate) kind: &'static str,
    pub response: AdmissionResponse,
}

#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub(crate) uid: String,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<Status>,
    /// Base64 of the JSON Patch, as the API documents it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<Base64Json>,
    /// Set exactly when `patch` is: a patch without a type is silently dropped by the API server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) audit_annotations: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Status {
    pub(crate) code: u16,
    pub(crate) message: String,
}

impl AdmissionReviewOut {
    /// An allowed, unchanged answer to `review`.
    pub(crate) fn allow(review: &AdmissionReviewIn) -> Self {
        let uid = review.request.as_ref().map(|r| r.uid.as_str());
        Self::allow_uid(&review.api_version, uid.unwrap_or_default())
    }

    /// An allowed, unchanged answer to request `uid` in `api_version`.
    pub(crate) fn allow_uid(api_version: &str, uid: &str) -> Self {
        Self {
            api_version: match api_version {
                ADMISSION_V1 => Cow::Borrowed(ADMISSION_V1),
                other => Cow::Owned(other.to_owned()),
            },
            kind: "AdmissionReview",
            response: AdmissionResponse {
                uid: uid.to_owned(),
                allowed: true,
                status: None,
                patch: None,
                patch_type: None,
                warnings: Vec::new(),
                audit_annotations: BTreeMap::new(),
            },
        }
    }

    pub(crate) fn deny(mut self, message: &str) -> Self {
        self.response.allowed = false;
        self.response.status = Some(Status {
            code: 403,
            message: message.to_owned(),
        });
        self
    }

    /// Adds a JSON Patch; an empty one is not sent at all (the tests' way: the admission
    /// writes the core's operations with [`Self::with_patch_text`]).
    #[cfg(test)]
    pub(crate) fn with_patch<T: Serialize>(self, operations: &[T]) -> Self {
        if operations.is_empty() {
            return self;
        }
        self.with_patch_text(|json| {
            serde_json::to_writer(json, operations).expect("JSON values serialize");
        })
    }

    /// Adds the JSON Patch whose text `write` appends to the buffer it is given (the caller
    /// knows it is not empty). The text is needed only until it is base64-encoded, so it is
    /// written into one buffer per thread, kept between admissions: a fresh one was a ~1 KiB
    /// allocation per deciding admission, of the size that makes glibc's malloc sort its
    /// free lists first.
    pub(crate) fn with_patch_text(mut self, write: impl FnOnce(&mut Vec<u8>)) -> Self {
        /// A buffer grown past this by a huge patch is not kept.
        const KEPT: usize = 64 * 1024;
        thread_local! {
            static PATCH_TEXT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let patch = PATCH_TEXT.with_borrow_mut(|json| {
            json.clear();
            write(json);
            let patch = Base64Json::encode(json);
            if json.capacity() > KEPT {
                *json = Vec::new();
            }
            patch
        });
        self.response.patch = Some(patch);
        self.response.patch_type = Some("JSONPatch");
        self
    }

    /// Adds warnings the way the API server can show them: ASCII, one line, at most
    /// [`MAX_WARNING_LEN`] bytes, at most [`MAX_WARNINGS`] of them (a warning with a newline or
    /// tab would be silently dropped). A longer warning is cut and ends with `…`, so a reader
    /// knows there was more.
    pub(crate) fn with_warnings(
        mut self,
        warnings: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Self {
        for warning in warnings {
            if self.response.warnings.len() >= MAX_WARNINGS {
                break;
            }
            let clean = cut_warning(warning.as_ref());
            if !clean.trim().is_empty() {
                self.response.warnings.push(clean);
            }
        }
        self
    }

    /// The response's JSON text: what its `Serialize` writes (a test compares), written field by
    /// field so that the patch's base64 text, which needs no escape, is copied as it is rather
    /// than scanned by the JSON escaper or checked again as a raw JSON value (it is most of an
    /// answer's bytes).
    pub fn to_json(&self) -> Vec<u8> {
        use crate::mutate::patch::write_string;
        fn value(out: &mut Vec<u8>, value: &impl Serialize) {
            serde_json::to_writer(out, value).expect("an AdmissionReview serializes");
        }
        let response = &self.response;
        let patch = response.patch.as_ref().map_or(0, |p| p.0.len());
        let warnings: usize = response.warnings.iter().map(String::len).sum();
        let mut out = Vec::with_capacity(256 + patch + warnings + 4 * response.warnings.len());
        out.extend_from_slice(br#"{"apiVersion":"#);
        write_string(&mut out, &self.api_version);
        out.extend_from_slice(br#","kind":"#);
        write_string(&mut out, self.kind);
        out.extend_from_slice(br#","response":{"uid":"#);
        write_string(&mut out, &response.uid);
        out.extend_from_slice(match response.allowed {
            true => br#","allowed":true"#,
            false => br#","allowed":false"#,
        });
        if let Some(status) = &response.status {
            out.extend_from_slice(br#","status":"#);
            value(&mut out, status);
        }
        if let Some(patch) = &response.patch {
            out.extend_from_slice(br#","patch":""#);
            out.extend_from_slice(patch.0.as_bytes());
            out.push(b'"');
        }
        if let Some(patch_type) = response.patch_type {
            out.extend_from_slice(br#","patchType":"#);
            write_string(&mut out, patch_type);
        }
        for (i, warning) in response.warnings.iter().enumerate() {
            out.extend_from_slice(if i == 0 { br#","warnings":["# } else { b"," });
            write_string(&mut out, warning);
        }
        if !response.warnings.is_empty() {
            out.push(b']');
        }
        if !response.audit_annotations.is_empty() {
            out.extend_from_slice(br#","auditAnnotations":"#);
            value(&mut out, &response.audit_annotations);
        }
        out.extend_from_slice(b"}}");
        out
    }
}

/// Base64 of some bytes: the text of the JSON string it is sent as (base64's alphabet never
/// needs escaping: [`AdmissionReviewOut::to_json`] copies it as it is).
#[derive(Debug, PartialEq)]
pub struct Base64Json(String);

impl Base64Json {
    pub(crate) fn encode(bytes: &[u8]) -> Self {
        Self(base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    /// The base64 text.
    #[cfg(test)]
    fn as_str(&self) -> &str {
        &self.0
    }
}

impl Serialize for Base64Json {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutate::{ImageSlot, SlotKind};

    /// The metadata-only read of a skipped Pod sees what the whole read sees of its metadata
    /// (the recorded v1.36 Pod: managedFields, owner references) and no spec (where it stops:
    /// `engine::pod_object`'s test).
    #[test]
    fn the_metadata_only_read_stops_at_the_end_of_metadata() {
        let body = include_str!(
            "../../tests/data/admissionreview/v1.36/pod-create-replicaset-shaped.json"
        );
        let review = parse(body.as_bytes()).unwrap();
        let compact =
            serde_json::to_string(&serde_json::from_str::<serde_json::Value>(body).unwrap())
                .unwrap();
        assert_eq!(scanned(body), Some(parse_whole(body.as_bytes()).unwrap()));
        assert!(
            scanned(&compact).is_some(),
            "the envelope's fast read is taken"
        );
        let request = review.request.as_ref().unwrap();
        let (metadata, whole) = (request.pod_metadata().unwrap(), request.pod().unwrap());
        assert!(!whole.view.owner_references.is_empty() && whole.view.spec.is_some());
        assert_eq!(metadata.view.labels, whole.view.labels);
        assert_eq!(metadata.view.annotations, whole.view.annotations);
        assert_eq!(metadata.view.owner_references, whole.view.owner_references);
        assert_eq!(metadata.namespace, whole.namespace);
        assert!(metadata.view.spec.is_none());
    }

    /// The scanner's way and serde_json's alone read every body alike — the same review, or
    /// the same error with the same message — and the Pod reads of each object read from what
    /// the scanner found (its metadata alone, and whole) agree with serde_json's: on every
    /// AdmissionReview of the test data and the fuzz corpus (the malformed ones too), and on
    /// random one-byte mutations of each body and of each object.
    #[test]
    fn the_scanned_read_is_the_whole_read() {
        use crate::engine::json_scan::tests::{corpus, Mutations};
        let mut mutations = Mutations::new();
        let (mut scanned, mut total) = (0, 0);
        for text in corpus()
            .into_iter()
            .filter(|t| t.contains("AdmissionReview"))
        {
            let mut bodies = vec![text.clone()];
            bodies.extend((0..300).map(|_| mutations.mutate(&text)));
            for body in bodies {
                let read = parse(body.as_bytes());
                assert_eq!(read, parse_whole(body.as_bytes()), "{body}");
                let checked = json_scan::review(&body).is_some();
                total += 1;
                if let Ok(Some(request)) = read.as_ref().map(|r| r.request.as_ref()) {
                    // The scan's finds are kept only from a body it checked, with the request
                    // they were found in, and the reads from them agree with serde_json's.
                    assert!(checked || request.scanned.0.is_none(), "{body}");
                    scanned += usize::from(request.scanned.0.is_some());
                    assert!(request.scanned_reads_agree(), "{body}");
                }
                let Some(object) = read.ok().and_then(|r| r.request?.object) else {
                    continue;
                };
                let mut objects = vec![object.to_owned()];
                objects.extend((0..20).map(|_| mutations.mutate(object)));
                for object in objects {
                    let body = format!(r#"{{"request":{{"object":{object}}}}}"#);
                    let Some(found) = json_scan::tests::object_of(&body) else {
                        continue;
                    };
                    assert!(
                        PodObject::scanned_reads_agree(&object, Some(&found)),
                        "{object}"
                    );
                }
            }
        }
        assert!(scanned > total / 4, "{scanned} of {total} scanned");
    }

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

    /// `to_json`, written field by field, writes what the derived `Serialize` does: with and
    /// without each optional field, texts that need escapes, another apiVersion.
    #[test]
    fn the_written_response_is_the_serialized_one() {
        let allowed = |api_version| AdmissionReviewOut::allow_uid(api_version, "u\"1\\");
        let ops = [serde_json::json!({"op": "add", "path": "/a", "value": "b\"\n"})];
        let mut audited = allowed(ADMISSION_V1).with_patch(&ops);
        audited
            .response
            .audit_annotations
            .insert("k\"".into(), "v\t".into());
        for out in [
            allowed(ADMISSION_V1),
            allowed("admission.k8s.io/v1beta1").with_patch(&ops),
            allowed(ADMISSION_V1).with_warnings(["one", "two \"quoted\" \\"]),
            allowed(ADMISSION_V1)
                .with_patch(&ops)
                .with_warnings(["w"])
                .deny("no \"common\" architecture\n"),
            audited,
        ] {
            assert_eq!(
                String::from_utf8(out.to_json()).unwrap(),
                serde_json::to_string(&out).unwrap()
            );
        }
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
            .all(|w| w.len() == MAX_WARNING_LEN && w.ends_with('…')));
        let exact = "y".repeat(MAX_WARNING_LEN);
        assert_eq!(
            cut_warning(&exact),
            exact,
            "a warning that fits is kept whole"
        );
        assert_eq!(cut_warning("a\tb\u{e9}"), "a b ");
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
        let body = body.to_string();
        let review = parse(body.as_bytes()).unwrap();
        let pod = review.request.unwrap().pod().unwrap().view;
        let owner = &pod.owner_references[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("DaemonSet", Some(true))
        );
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("arm-1"));
        let volumes: Vec<&ImageSlot> = spec
            .images
            .iter()
            .filter(|slot| slot.kind == SlotKind::ImageVolume)
            .collect();
        assert_eq!(volumes.len(), 1, "only image volumes are kept");
        assert_eq!(volumes[0].image.as_deref(), Some("weights:1"));
    }
}
