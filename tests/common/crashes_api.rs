//! What the crash watch reads, as a real kube-apiserver v1.36.3 answered it
//! (`tests/data/kube-api/crashes/`, README inside): a Pod (`shop/web-7d9c6b8f5-abcde`) whose
//! container `web` ended with runc's `exec /usr/local/bin/web: exec format error` (exit 255),
//! and the kubelet's BackOff Events about it. Served by [`super::kube_api::FakeApiServer`]
//! when started with [`Crashes`]:
//!
//! - `GET /api/v1/events?fieldSelector=…`: a selector on the fields the server supports
//!   (`reason`, `type`, `involvedObject.*`, `source`, `reportingComponent`) lists the recorded
//!   BackOff Events that match it (with `limit` below their number: that many, and a
//!   `continue`, as recorded); another field is the recorded 400; a watch sends the recorded
//!   ADDED BackOff after its `resourceVersion`, then ends after a few seconds (as the recorded
//!   `timeoutSeconds=3` watch did);
//! - `GET …/shop/pods/web-7d9c6b8f5-abcde`: the recorded Pod;
//! - `GET …/log?container=web&previous=true&tailLines=20` (and a `limitBytes`): the recorded
//!   500 (no kubelet);
//! - `DELETE …/shop/pods/web-7d9c6b8f5-abcde` with a `uid` precondition: the Pod's recorded uid
//!   is the recorded 200 (the Pod, graceful), the recorded other uid (`00000000-…`) the
//!   recorded 409; each delete's body kept for the test. The recorded bodies also name
//!   `apiVersion: v1, kind: DeleteOptions`, which `kube` leaves out (the API server takes a
//!   DeleteOptions body without them the same): only the preconditions are compared, and a
//!   body with any other option is unrecorded (501);
//! - `PATCH …/shop/pods/web-7d9c6b8f5-abcde`, a JSON Patch that tests the Pod's uid and adds
//!   the annotation `tolerable.io/crash` (the crash watch's mark): applied to the Pod as served
//!   and answered 200 with the patched Pod; any other patch is unrecorded (501). **Not
//!   recorded**: no Pod metadata patch was recorded on this crash; the answer follows the
//!   recorded JSON Patches on Pods in `tests/data/kube-api/gates/` (`pod-patch-*`: 200 with
//!   the patched Pod; a failed `test` is a 422 there, which this fake does not produce).
//! - `GET /api/v1/namespaces/shop/pods?&labelSelector=app%3Dweb&limit=N` (the Pods of the
//!   crashing Pod's owner, confirmation (c)): **NOT RECORDED in this namespace** — composed.
//!   The request's shape is the recorded `workloads/pod-list-team-a-label-app-web` (kube's
//!   `?&labelSelector=…`, plus the `&limit=` the `workloads/pod-list-limit-3-*` recordings
//!   show); the answer is a PodList of the crashing Pod (as recorded here) and, with
//!   [`Crashes::running_elsewhere`], the two recorded `web` Pods of that workloads list
//!   (running and ready on amd-1 and amd-2) moved to `shop`: their namespace, labels and
//!   controller owner made the crashing Pod's, their image and `imageID` the test's. A real
//!   API server's answer to this list is still to be recorded.
//!
//! The changes made to the recording: the Pod's `nodeName` is `arm-1` (a Node of the node
//! fake labelled arm64; the recording's `n-arm-2` has no recorded Node), and a test may point
//! the container's image and `imageID` at a test registry's image, or leave the termination
//! message out; and, for the heal tests, the Pod's controller owner may be left out or be a
//! DaemonSet (`apps/v1`, named `web`), a `hostPath` volume may be added to its spec, and the
//! Pod may be the one that was replaced: its uid (in the Pod and in the Events naming it) the
//! recorded 409's precondition uid, `00000000-0000-0000-0000-000000000000`, which the recorded
//! record no longer holds.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::Frame;
use hyper::Response;
use serde_json::{json, Value};

use super::kube_fake::{query, unrecorded_status, Body};
use super::recorded::{exchanges, Exchange};

/// The node the recorded Pod is on here.
pub const NODE: &str = "arm-1";
const POD_PATH: &str = "/api/v1/namespaces/shop/pods/web-7d9c6b8f5-abcde";
/// The recorded Pod's uid, and the one the recorded 409 was asked with.
pub const POD_UID: &str = "26be13ca-16c0-4b8b-9e31-07601681d14b";
const REPLACED_UID: &str = "00000000-0000-0000-0000-000000000000";
/// The Pods of the namespace (listed by label: the crashing Pod's owner's).
const PODS_PATH: &str = "/api/v1/namespaces/shop/pods";
/// The fields a core/v1 Event selector may name (the README's list).
const SELECTABLE: &[&str] = &[
    "reason",
    "type",
    "involvedObject.kind",
    "involvedObject.name",
    "involvedObject.namespace",
    "involvedObject.uid",
    "involvedObject.fieldPath",
    "source",
    "reportingComponent",
];

/// The recorded crash, served.
pub struct Crashes {
    recorded: Vec<Exchange>,
    /// The container's image and imageID, when a test points them elsewhere.
    image: Option<(String, String)>,
    /// The termination message left out.
    no_message: bool,
    /// The recorded `web` Pods running the same image on amd64 nodes (confirmation (c)).
    elsewhere: bool,
    /// The Pod's changes for the heal tests.
    changed: PodChanges,
    /// The bodies of the DELETEs received.
    deletes: std::sync::Mutex<Vec<Value>>,
    /// The JSON Patches received.
    patches: std::sync::Mutex<Vec<Value>>,
}

/// How the Pod differs from the recorded one (the heal tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodChanges {
    #[default]
    None,
    /// No `ownerReferences`: a bare Pod.
    Bare,
    /// Its controller a DaemonSet.
    DaemonSet,
    /// A `hostPath` volume in its spec.
    HostPath,
    /// The Pod that was replaced (its uid the recorded 409's).
    Replaced,
}

impl Crashes {
    pub fn recorded() -> Self {
        Self {
            recorded: exchanges("crashes"),
            image: None,
            no_message: false,
            changed: PodChanges::None,
            deletes: std::sync::Mutex::new(Vec::new()),
            patches: std::sync::Mutex::new(Vec::new()),
            elsewhere: false,
        }
    }

    /// The JSON Patches received so far.
    pub fn patches(&self) -> Vec<Value> {
        self.patches.lock().unwrap().clone()
    }

    /// `PATCH` of the Pod: the crash watch's mark (see the module's doc), applied.
    pub fn patch(&self, path: &str, content_type: &str, body: &[u8]) -> Option<Response<Body>> {
        if path != POD_PATH {
            return None;
        }
        let ops: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        self.patches.lock().unwrap().push(ops.clone());
        let (code, mut pod) = self.pod();
        let uid = pod["metadata"]["uid"].clone();
        let marks = |op: &Value| {
            op["op"] == "add"
                && match op["path"].as_str() {
                    Some("/metadata/annotations") => {
                        op["value"]
                            .as_object()
                            .is_some_and(|m| m.len() == 1 && m["tolerable.io/crash"].is_string())
                            && pod["metadata"].get("annotations").is_none()
                    }
                    Some("/metadata/annotations/tolerable.io~1crash") => {
                        op["value"].is_string() && pod["metadata"]["annotations"].is_object()
                    }
                    _ => false,
                }
        };
        let tests_uid = json!({"op": "test", "path": "/metadata/uid", "value": uid});
        // A new annotations map comes after a test of the resourceVersion read.
        let tests_version = json!({"op": "test", "path": "/metadata/resourceVersion",
            "value": pod["metadata"]["resourceVersion"]});
        let shaped = content_type == "application/json-patch+json"
            && ops.as_array().is_some_and(|o| match o.len() {
                2 => o[0] == tests_uid && marks(&o[1]) && o[1]["path"] != "/metadata/annotations",
                3 => o[0] == tests_uid && o[1] == tests_version && marks(&o[2]),
                _ => false,
            });
        if !shaped {
            return Some(json_answer(
                501,
                &unrecorded_status(&format!("a patch {ops}")),
            ));
        }
        let patch: json_patch::Patch = serde_json::from_value(ops).unwrap();
        json_patch::patch(&mut pod, &patch).unwrap();
        Some(json_answer(code, &pod))
    }

    /// This crash, its Pod changed as `changed` says.
    pub fn changed(mut self, changed: PodChanges) -> Self {
        self.changed = changed;
        self
    }

    /// The bodies of the DELETEs received so far.
    pub fn deletes(&self) -> Vec<Value> {
        self.deletes.lock().unwrap().clone()
    }

    /// The recorded crash, its container's image `image` pulled as `image_id`.
    pub fn with_image(image: &str, image_id: &str) -> Self {
        Self {
            image: Some((image.to_owned(), image_id.to_owned())),
            ..Self::recorded()
        }
    }

    /// The recorded crash, its termination message empty (as without `FallbackToLogsOnError`).
    pub fn without_message(mut self) -> Self {
        self.no_message = true;
        self
    }

    /// With the same image running and ready in two other Pods of the owner, on amd64 nodes.
    pub fn running_elsewhere(mut self) -> Self {
        self.elsewhere = true;
        self
    }

    fn exchange(&self, note: &str) -> &Exchange {
        self.recorded
            .iter()
            .find(|e| e.note.starts_with(note))
            .unwrap_or_else(|| panic!("no recorded exchange {note:?}"))
    }

    /// A recorded answer; the Pod that was replaced has the other uid wherever it is named.
    fn body(&self, note: &str) -> (u16, Value) {
        let e = self.exchange(note);
        let mut body = e.response.body.clone();
        if self.changed == PodChanges::Replaced {
            let text = body.to_string().replace(POD_UID, REPLACED_UID);
            body = serde_json::from_str(&text).unwrap();
        }
        (e.response.status, body)
    }

    /// `DELETE` of the recorded Pod: the recorded answer to the same `uid` precondition.
    pub fn delete(&self, path: &str, body: &[u8]) -> Option<Response<Body>> {
        if path != POD_PATH {
            return None;
        }
        let asked: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        self.deletes.lock().unwrap().push(asked.clone());
        let others = asked.as_object().map_or(1, |o| {
            o.keys()
                .filter(|k| !["apiVersion", "kind", "preconditions"].contains(&k.as_str()))
                .count()
        });
        let recorded = self.recorded.iter().find(|e| {
            e.request.method == "DELETE"
                && e.request.body.as_ref().map(|b| &b["preconditions"])
                    == Some(&asked["preconditions"])
        });
        Some(match (recorded, others) {
            (Some(e), 0) => json_answer(e.response.status, &e.response.body),
            _ => json_answer(501, &unrecorded_status(&format!("a delete with {asked}"))),
        })
    }

    /// The answer to a GET this fake serves (`None`: not one of its paths).
    pub fn answer(&self, path: &str, query_text: &str) -> Option<Response<Body>> {
        let q = query(query_text);
        let answer = match path {
            "/api/v1/events" => return Some(self.events(&q)),
            POD_PATH => self.pod(),
            PODS_PATH => self.owner_pods(&q, query_text),
            _ if path == format!("{POD_PATH}/log") => {
                let asked = (q.get("container"), q.get("previous"), q.get("tailLines"));
                let recorded = (
                    Some(&"web".to_owned()),
                    Some(&"true".to_owned()),
                    Some(&"20".to_owned()),
                );
                // `limitBytes` (which the watch adds to bound what it reads) is not in the
                // recorded request; the recorded 500 comes before any kubelet is asked, so it
                // cannot depend on it.
                let others = q.keys().filter(|k| *k != "limitBytes").count();
                if asked == recorded && others == 3 {
                    self.body("the previous log")
                } else {
                    (
                        501,
                        unrecorded_status(&format!("a log read with {query_text}")),
                    )
                }
            }
            _ => return None,
        };
        Some(json_answer(answer.0, &answer.1))
    }

    fn pod(&self) -> (u16, Value) {
        let (code, mut pod) = self.body("the Pod as the crash watch reads it");
        pod["spec"]["nodeName"] = json!(NODE);
        if let Some((image, image_id)) = &self.image {
            pod["spec"]["containers"][0]["image"] = json!(image);
            pod["status"]["containerStatuses"][0]["image"] = json!(image);
            pod["status"]["containerStatuses"][0]["imageID"] = json!(image_id);
        }
        change_pod(&mut pod, self.changed);
        if self.no_message {
            let status = &mut pod["status"]["containerStatuses"][0];
            status["lastState"]["terminated"]
                .as_object_mut()
                .unwrap()
                .remove("message");
        }
        (code, pod)
    }

    /// The crashing Pod's owner's Pods (composed: see the module's comment), when asked as kube
    /// asks with a label selector of the Pod's labels but its `pod-template-hash`, and a limit.
    fn owner_pods(
        &self,
        q: &std::collections::BTreeMap<String, String>,
        query_text: &str,
    ) -> (u16, Value) {
        let others = q.keys().filter(|k| *k != "labelSelector" && *k != "limit");
        let limit = q.get("limit").and_then(|l| l.parse::<usize>().ok());
        let (Some(limit), Some("app=web"), 0) = (
            limit,
            q.get("labelSelector").map(String::as_str),
            others.count(),
        ) else {
            return (
                501,
                unrecorded_status(&format!("a Pod list with {query_text}")),
            );
        };
        let (_, crashing) = self.pod();
        let mut items = vec![crashing.clone()];
        if self.elsewhere {
            items.extend(recorded_web_pods().into_iter().map(|mut pod| {
                pod["metadata"]["namespace"] = json!("shop");
                pod["metadata"]["labels"] = crashing["metadata"]["labels"].clone();
                pod["metadata"]["ownerReferences"] =
                    crashing["metadata"]["ownerReferences"].clone();
                let image = &crashing["status"]["containerStatuses"][0];
                pod["spec"]["containers"][0]["image"] = image["image"].clone();
                pod["status"]["containerStatuses"][0]["image"] = image["image"].clone();
                pod["status"]["containerStatuses"][0]["imageID"] = image["imageID"].clone();
                pod
            }));
        }
        items.truncate(limit);
        let list = json!({"kind": "PodList", "apiVersion": "v1",
            "metadata": {"resourceVersion": "601"}, "items": items});
        (200, list)
    }

    fn events(&self, q: &std::collections::BTreeMap<String, String>) -> Response<Body> {
        let terms = match selector(q.get("fieldSelector").map_or("", String::as_str)) {
            Ok(terms) => terms,
            Err(field) => {
                let (code, mut body) = self.body("a field the server cannot select on");
                body["message"] = json!(format!("field label not supported: {field}"));
                return json_answer(code, &body);
            }
        };
        let watching = q.get("watch").is_some_and(|w| w == "1" || w == "true");
        if watching {
            let from = q
                .get("resourceVersion")
                .and_then(|rv| rv.parse().ok())
                .unwrap_or(0);
            return self.watch(&terms, from);
        }
        let (code, mut list) = self.body("list BackOff Warning Events");
        let items: Vec<Value> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| matches(e, &terms))
            .cloned()
            .collect();
        let limit = q.get("limit").and_then(|l| l.parse::<usize>().ok());
        if let Some(limit) = limit.filter(|l| *l < items.len()) {
            let (_, paged) = self.body("paged");
            list["metadata"]["continue"] = paged["metadata"]["continue"].clone();
            list["items"] = Value::Array(items[..limit].to_vec());
        } else {
            list["items"] = Value::Array(items);
        }
        json_answer(code, &list)
    }

    /// The recorded ADDED BackOff (when after `from` and matching), then the end of the watch.
    fn watch(&self, terms: &[(String, String)], from: u64) -> Response<Body> {
        let (_, lines) = self.body("watch from the list's resourceVersion");
        let rv = |e: &Value| {
            e["object"]["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|rv| rv.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let sent: Vec<Result<Frame<Bytes>, Infallible>> = lines
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| rv(e) > from && matches(&e["object"], terms))
            .map(|e| Ok(Frame::data(Bytes::from(format!("{e}\n")))))
            .collect();
        let ended = futures_util::stream::once(async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            Ok(Frame::data(Bytes::new()))
        });
        let stream = futures_util::StreamExt::chain(futures_util::stream::iter(sent), ended);
        let mut response = Response::new(StreamBody::new(stream).boxed_unsync());
        response
            .headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        response
    }
}

fn change_pod(pod: &mut Value, changed: PodChanges) {
    match changed {
        PodChanges::None | PodChanges::Replaced => {}
        PodChanges::Bare => {
            pod["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("ownerReferences");
        }
        PodChanges::DaemonSet => {
            let owner = &mut pod["metadata"]["ownerReferences"][0];
            owner["kind"] = json!("DaemonSet");
            owner["name"] = json!("web");
        }
        PodChanges::HostPath => {
            pod["spec"]["volumes"] =
                json!([{"name": "data", "hostPath": {"path": "/var/lib/web", "type": ""}}]);
        }
    }
}

/// The recorded `web` Pods of `workloads/pod-list-team-a-label-app-web` (running, ready).
fn recorded_web_pods() -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/kube-api/workloads/pod-list-team-a-label-app-web.body.json"
    );
    let list: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    list["items"].as_array().unwrap().clone()
}

/// `a=b,c=d` as terms; `Err(field)` for a field the server cannot select on.
fn selector(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .filter(|t| !t.is_empty())
        .map(|term| {
            let (field, value) = term.split_once('=').unwrap_or((term, ""));
            if SELECTABLE.contains(&field) {
                Ok((field.to_owned(), value.to_owned()))
            } else {
                Err(field.to_owned())
            }
        })
        .collect()
}

fn matches(event: &Value, terms: &[(String, String)]) -> bool {
    terms.iter().all(|(field, value)| {
        let pointer = match field.as_str() {
            "source" => "/source/component".to_owned(),
            other => format!("/{}", other.replace('.', "/")),
        };
        event.pointer(&pointer).and_then(Value::as_str) == Some(value)
    })
}

fn json_answer(code: u16, body: &Value) -> Response<Body> {
    let mut response =
        Response::new(http_body_util::Full::new(Bytes::from(body.to_string())).boxed_unsync());
    *response.status_mut() = hyper::StatusCode::from_u16(code).unwrap();
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}
