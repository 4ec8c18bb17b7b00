//! Event creation as a real kube-apiserver v1.36 answered it (`tests/data/kube-api/crashes/`,
//! README inside), for the fakes that take Events (`kube_api`, `gates_api`):
//!
//! - core/v1 (`POST /api/v1/namespaces/NS/events`): a Warning about a Pod of the namespace,
//!   named from a `generateName` ending in a dot — the shape of "a controller's Warning Event on
//!   the Pod" — is created (201);
//! - events.k8s.io/v1 (`POST /apis/events.k8s.io/v1/namespaces/NS/events`): the shape of "a
//!   controller's Warning Event on the owner Deployment" (`regarding` with its uid, `action`,
//!   `note`, a qualified `reportingController`, `reportingInstance`, `eventTime`) is created
//!   (201, with the empty `deprecated*` fields the server added); a `generateName` ending in a
//!   dot or a missing `eventTime` is the recorded 422, with a cause for each (one cause is
//!   written without the brackets, as the API server writes a one-error list);
//! - any other shape is not recorded: 501.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde_json::{json, Value};

use super::kube_fake::unrecorded_status;

/// The recorded exchange `note` of `tests/data/kube-api/crashes/exchanges.json`.
fn recorded(note_starts: &str) -> super::recorded::Exchange {
    super::recorded::exchanges("crashes")
        .into_iter()
        .find(|e| e.note.starts_with(note_starts))
        .unwrap_or_else(|| panic!("no recorded exchange {note_starts:?}"))
}

/// The Events created, in order, as the server answered them.
#[derive(Default)]
pub struct Events {
    created: Mutex<Vec<Value>>,
    rv: AtomicU64,
    pub changed: tokio::sync::Notify,
}

fn text(v: &Value) -> bool {
    v.as_str().is_some_and(|s| !s.is_empty())
}

impl Events {
    /// The answer to `method path` when it is an Event creation (`None`: not an Events path).
    pub fn answer(&self, method: &str, path: &str, body: &[u8]) -> Option<(u16, Value)> {
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let event: Value = serde_json::from_slice(body).unwrap_or_default();
        let answer = match (method, &parts[..]) {
            ("POST", ["api", "v1", "namespaces", ns, "events"]) => self.create_core(ns, event),
            ("POST", ["apis", "events.k8s.io", "v1", "namespaces", ns, "events"]) => {
                self.create_events_v1(ns, event)
            }
            _ => return None,
        };
        Some(answer.unwrap_or_else(|what| (501, unrecorded_status(&what))))
    }

    /// Every Event created, as answered.
    pub fn created(&self) -> Vec<Value> {
        self.created.lock().unwrap().clone()
    }

    fn create_core(&self, namespace: &str, event: Value) -> Result<(u16, Value), String> {
        let involved = &event["involvedObject"];
        let prefix = event["metadata"]["generateName"]
            .as_str()
            .unwrap_or_default();
        let recorded_shape = event["apiVersion"] == "v1"
            && event["kind"] == "Event"
            && prefix.ends_with('.')
            && event["metadata"]["name"].is_null()
            && in_namespace(&event, namespace)
            && involved["kind"] == "Pod"
            && involved["namespace"] == namespace
            && [
                &involved["name"],
                &involved["uid"],
                &event["reason"],
                &event["message"],
                &event["source"]["component"],
            ]
            .into_iter()
            .all(text)
            && event["type"] == "Warning";
        if !recorded_shape {
            return Err(format!(
                "a core/v1 Event of this shape in {namespace}: {event}"
            ));
        }
        let mut event = event;
        if event.get("eventTime").is_none() {
            event["eventTime"] = Value::Null;
        }
        Ok((201, self.store(namespace, event)))
    }

    fn create_events_v1(&self, namespace: &str, event: Value) -> Result<(u16, Value), String> {
        if let Some(refusal) = refused(&event) {
            return Ok((422, refusal));
        }
        let regarding = &event["regarding"];
        let prefix = event["metadata"]["generateName"]
            .as_str()
            .unwrap_or_default();
        let recorded_shape = event["apiVersion"] == "events.k8s.io/v1"
            && event["kind"] == "Event"
            && !prefix.is_empty()
            && event["metadata"]["name"].is_null()
            && in_namespace(&event, namespace)
            && regarding["namespace"] == namespace
            && [
                &regarding["kind"],
                &regarding["name"],
                &regarding["uid"],
                &regarding["apiVersion"],
                &event["reason"],
                &event["action"],
                &event["note"],
                &event["reportingInstance"],
            ]
            .into_iter()
            .all(text)
            && event["reportingController"]
                .as_str()
                .is_some_and(|c| c.contains('/'))
            && event["type"] == "Warning"
            && event["note"].as_str().is_some_and(|n| n.len() <= 1024);
        if !recorded_shape {
            return Err(format!(
                "an events.k8s.io/v1 Event of this shape in {namespace}: {event}"
            ));
        }
        let mut event = event;
        event["deprecatedSource"] = json!({});
        event["deprecatedFirstTimestamp"] = Value::Null;
        event["deprecatedLastTimestamp"] = Value::Null;
        Ok((201, self.store(namespace, event)))
    }

    fn store(&self, namespace: &str, mut event: Value) -> Value {
        let mut created = self.created.lock().unwrap();
        let n = created.len();
        let prefix = event["metadata"]["generateName"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let meta = &mut event["metadata"];
        meta["name"] = json!(format!("{prefix}{n:05x}"));
        meta["namespace"] = json!(namespace);
        meta["uid"] = json!(format!("8a531402-b3d9-4b63-bbae-{n:012x}"));
        meta["resourceVersion"] = json!((600 + self.rv.fetch_add(1, Ordering::SeqCst)).to_string());
        meta["creationTimestamp"] = json!(k8s_openapi::jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string());
        created.push(event.clone());
        drop(created);
        self.changed.notify_waiters();
        event
    }
}

fn in_namespace(event: &Value, namespace: &str) -> bool {
    event["metadata"]["namespace"]
        .as_str()
        .is_none_or(|n| n == namespace)
}

/// The recorded 422 of events.k8s.io/v1, with the causes that apply to `event` (its
/// `generateName` ending in a dot, its `eventTime` missing), or `None`.
fn refused(event: &Value) -> Option<Value> {
    let prefix = event["metadata"]["generateName"]
        .as_str()
        .unwrap_or_default();
    let exchange = recorded("events.k8s.io/v1 with generateName ending in a dot");
    let mut body = exchange.response.body;
    let recorded_causes = body["details"]["causes"].as_array().unwrap().clone();
    let mut causes = Vec::new();
    if prefix.ends_with('.') {
        let mut cause = recorded_causes[0].clone();
        let message = cause["message"]
            .as_str()
            .unwrap()
            .replace("\"web.\"", &format!("{prefix:?}"));
        cause["message"] = json!(message);
        causes.push(cause);
    }
    if event["eventTime"].is_null() {
        causes.push(recorded_causes[1].clone());
    }
    if causes.is_empty() {
        return None;
    }
    let name = format!("{prefix}hfdwk");
    let errors: Vec<String> = causes
        .iter()
        .map(|c| {
            format!(
                "{}: {}",
                c["field"].as_str().unwrap(),
                c["message"].as_str().unwrap()
            )
        })
        .collect();
    let list = match &errors[..] {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    body["message"] = json!(format!("Event {name:?} is invalid: {list}"));
    body["details"]["name"] = json!(name);
    body["details"]["causes"] = Value::Array(causes);
    Some(body)
}
