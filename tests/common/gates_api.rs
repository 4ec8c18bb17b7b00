//! The scheduling gates' cluster, a handler on the one fake API server (`kube_fake`): Pods (created by the test, or POSTed; GET;
//! list and watch with a `labelSelector`; JSON Patch) and Events (POST), answering in the
//! shapes a real kube-apiserver v1.36 answered (`tests/data/kube-api/gates/`, README inside)
//! and refusing what it refused:
//!
//! - a gate added after creation (422, "only deletion is allowed");
//! - `nodeName` together with gates (422);
//! - on a gated Pod with required terms: a term added or removed, an existing expression
//!   changed (422, "no additions/deletions to non-empty NodeSelectorTerms list");
//! - on a Pod without gates: any change of the spec but toleration additions (422);
//! - a failing `test` op (422, as recorded).
//!
//! Metadata (labels, annotations) may change any time, as on the real server. The watch sends
//! what changed since the `resourceVersion` it is opened at, each Pod as the selector sees it
//! (a Pod that stops matching is DELETED for that watch, as the real server does).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::Frame;
use hyper::{Method, Response};
use serde_json::{json, Value};

use super::events_api::Events;
use super::kube_fake::{json as answer, status_value, unrecorded_status};
use super::kube_fake::{Body, FakeApi, Handler, Req, Running};
use super::lease_api::{Leases, TOKENS};
use super::selector::Selector;

type Key = (String, String);

/// A recorded exchange's file in `tests/data/kube-api/gates/`.
pub fn recording(name: &str) -> String {
    super::kube_fake::recording(&format!("gates/{name}"))
}

pub fn recorded_json(name: &str) -> Value {
    super::kube_fake::recorded_json(&format!("gates/{name}"))
}

/// One change of a Pod: its resourceVersion, before and after (`None`: absent).
#[derive(Clone)]
struct Change {
    rv: u64,
    before: Option<Value>,
    after: Option<Value>,
}

#[derive(Default)]
struct State {
    pods: Mutex<BTreeMap<Key, Value>>,
    /// Events created (`events_api`, as recorded in `tests/data/kube-api/crashes/`).
    events: Events,
    log: Mutex<Vec<Change>>,
    /// Every JSON Patch request, with the status answered.
    patches: Mutex<Vec<(Key, Value, u16)>>,
    /// Another client's JSON Patch, applied just before the next PATCH of that Pod arrives.
    before_next_patch: Mutex<BTreeMap<Key, Value>>,
    rv: AtomicU64,
    uids: AtomicU64,
    changed: tokio::sync::Notify,
}

pub struct GatesApiServer {
    pub port: u16,
    api: Running,
    state: Arc<State>,
    /// The Leases the replicas elect their releaser on.
    pub leases: Leases,
}

/// A recorded 422 for Pod `name`, its names put in.
fn refused(file: &str, recorded_pod: &str, name: &str, gate: Option<&str>) -> (u16, Value) {
    let mut text = recording(file).replace(recorded_pod, name);
    if let Some(gate) = gate {
        text = text.replace("'late'", &format!("'{gate}'"));
    }
    (422, serde_json::from_str(&text).unwrap())
}

fn gates(pod: &Value) -> Vec<Value> {
    pod["spec"]["schedulingGates"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn terms(pod: &Value) -> Vec<Value> {
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// `new` keeps `old`'s items in order, adding only after them.
fn extends(old: &[Value], new: &[Value]) -> bool {
    new.len() >= old.len() && new[..old.len()] == *old
}

/// The API server's update validation of a Pod, as the recordings show it; the refusal if any.
fn validate_update(old: &Value, new: &Value) -> Option<(u16, Value)> {
    let name = old["metadata"]["name"].as_str().unwrap_or_default();
    let (old_gates, new_gates) = (gates(old), gates(new));
    if let Some(added) = new_gates.iter().find(|g| !old_gates.contains(g)) {
        let gate = added["name"].as_str().unwrap_or_default();
        return Some(refused(
            "pod-patch-add-gate-422.body.json",
            "gated-2",
            name,
            Some(gate),
        ));
    }
    if !new_gates.is_empty() && !new["spec"]["nodeName"].is_null() {
        return Some(refused(
            "pod-create-gated-with-nodename-422.body.json",
            "gated-bound",
            name,
            None,
        ));
    }
    if old_gates.is_empty() {
        // Not gated: only tolerations may be added (and images changed).
        let strip = |pod: &Value| {
            let mut spec = pod["spec"].clone();
            spec.as_object_mut().unwrap().remove("tolerations");
            for c in spec["containers"].as_array_mut().into_iter().flatten() {
                c.as_object_mut().unwrap().remove("image");
            }
            spec
        };
        let tolerations = |pod: &Value| {
            pod["spec"]["tolerations"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        };
        if strip(old) != strip(new) || !extends(&tolerations(old), &tolerations(new)) {
            return Some(refused(
                "pod-patch-affinity-ungated-422.body.json",
                "gated-3",
                name,
                None,
            ));
        }
        return None;
    }
    let (old_terms, new_terms) = (terms(old), terms(new));
    if !old_terms.is_empty() && old_terms.len() != new_terms.len() {
        return Some(refused(
            "pod-patch-new-term-422.body.json",
            "gated-2",
            name,
            None,
        ));
    }
    unrecorded_gated_change(old, new).map(|what| (501, unrecorded_status(&what)))
}

/// What a change of gated Pod `old` into `new` does that no recording shows accepted, if
/// anything. Recorded as accepted on a gated Pod: gates removed, tolerations added, expressions
/// appended inside each existing required term, a nodeSelector set where there was none,
/// metadata changed (the release removes a label).
fn unrecorded_gated_change(old: &Value, new: &Value) -> Option<String> {
    let name = old["metadata"]["name"].as_str().unwrap_or_default();
    let (old_gates, new_gates) = (gates(old), gates(new));
    let kept: Vec<&Value> = old_gates.iter().filter(|g| new_gates.contains(g)).collect();
    if !kept.iter().copied().eq(new_gates.iter()) {
        return Some(format!(
            "reordering the schedulingGates of gated Pod {name}"
        ));
    }
    let tolerations = |pod: &Value| {
        pod["spec"]["tolerations"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    if !extends(&tolerations(old), &tolerations(new)) {
        return Some(format!(
            "removing or changing a toleration of gated Pod {name}"
        ));
    }
    let selector = &old["spec"]["nodeSelector"];
    let unset = selector.is_null() || selector == &json!({});
    if !unset && *selector != new["spec"]["nodeSelector"] {
        return Some(format!("changing the nodeSelector of gated Pod {name}"));
    }
    if !tightened(old, new) {
        return Some(format!("this affinity change on gated Pod {name}"));
    }
    let rest = |pod: &Value| {
        let mut spec = pod["spec"].clone();
        let fields = spec.as_object_mut().unwrap();
        for key in ["schedulingGates", "tolerations", "nodeSelector", "affinity"] {
            fields.remove(key);
        }
        spec
    };
    (rest(old) != rest(new)).then(|| format!("this spec change on gated Pod {name}"))
}

/// `new`'s affinity is `old`'s with expressions appended inside each existing required term
/// (the recorded tightening), nothing else changed.
fn tightened(old: &Value, new: &Value) -> bool {
    let (old_terms, new_terms) = (terms(old), terms(new));
    let required = "/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution";
    let without_terms = |pod: &Value| {
        let mut affinity = pod["spec"]["affinity"].clone();
        if let Some(Value::Object(r)) = affinity.pointer_mut(required) {
            r.remove("nodeSelectorTerms");
        }
        affinity
    };
    !old_terms.is_empty()
        && old_terms.len() == new_terms.len()
        && without_terms(old) == without_terms(new)
        && old_terms.iter().zip(&new_terms).all(|(o, n)| {
            let list = |t: &Value, k: &str| t[k].as_array().cloned().unwrap_or_default();
            extends(&list(o, "matchExpressions"), &list(n, "matchExpressions"))
                && extends(&list(o, "matchFields"), &list(n, "matchFields"))
        })
        || old["spec"]["affinity"] == new["spec"]["affinity"]
}

impl State {
    fn record(&self, before: Option<Value>, after: Option<Value>) -> u64 {
        let rv = self.rv.fetch_add(1, Ordering::SeqCst) + 1;
        // Waiters are woken by the caller, once all it keeps of the change is kept.
        self.log.lock().unwrap().push(Change { rv, before, after });
        rv
    }

    /// A Pod created as the real server creates it: its fields defaulted as in the recorded
    /// answer, a uid, a resourceVersion, a creationTimestamp, the SchedulingGated status.
    fn create(&self, namespace: &str, mut pod: Value) -> Result<Value, (u16, Value)> {
        let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
        if !gates(&pod).is_empty() && !pod["spec"]["nodeName"].is_null() {
            return Err(refused(
                "pod-create-gated-with-nodename-422.body.json",
                "gated-bound",
                &name,
                None,
            ));
        }
        let recorded = recorded_json("pod-create-gated.body.json");
        for (key, value) in recorded["spec"].as_object().unwrap() {
            if !["affinity", "schedulingGates", "containers"].contains(&key.as_str())
                && pod["spec"].get(key).is_none()
            {
                pod["spec"][key] = value.clone();
            }
        }
        let defaults = &recorded["spec"]["containers"][0];
        for container in pod["spec"]["containers"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            for (key, value) in defaults.as_object().unwrap() {
                if container.get(key).is_none() {
                    container[key] = value.clone();
                }
            }
        }
        let uid = self.uids.fetch_add(1, Ordering::SeqCst);
        let meta = &mut pod["metadata"];
        meta["generation"] = json!(1);
        meta["namespace"] = json!(namespace);
        meta["uid"] = json!(format!("090d8508-2c34-40c1-a7f4-{uid:012x}"));
        if meta["creationTimestamp"].is_null() {
            meta["creationTimestamp"] = json!(jiff_now());
        }
        pod["status"] = if gates(&pod).is_empty() {
            json!({"phase": "Pending", "qosClass": "BestEffort"})
        } else {
            recorded["status"].clone()
        };
        let mut pods = self.pods.lock().unwrap();
        let key = (namespace.to_owned(), name.clone());
        if pods.contains_key(&key) {
            return Err((
                409,
                status_value(
                    409,
                    "AlreadyExists",
                    &format!("pods \"{name}\" already exists"),
                    None,
                ),
            ));
        }
        let rv = self.record(None, Some(pod.clone()));
        pod["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.log.lock().unwrap().last_mut().unwrap().after = Some(pod.clone());
        pods.insert(key, pod.clone());
        drop(pods);
        self.changed.notify_waiters();
        Ok(pod)
    }

    /// `GET` of one Pod: as stored, or 404 in the shape of the recorded ones
    /// (`sa-missing-get-404`: the resource and the name in the details).
    fn get(&self, namespace: &str, name: &str) -> Response<Body> {
        let pods = self.pods.lock().unwrap();
        match pods.get(&(namespace.to_owned(), name.to_owned())) {
            Some(pod) => answer(200, pod),
            None => {
                let mut body =
                    status_value(404, "NotFound", &format!("pods \"{name}\" not found"), None);
                body["details"] = json!({"name": name, "kind": "pods"});
                answer(404, &body)
            }
        }
    }

    fn patch(&self, key: &Key, ops: &Value) -> (u16, Value) {
        let first = self.before_next_patch.lock().unwrap().remove(key);
        if let Some(theirs) = first {
            assert_eq!(
                self.apply_patch(key, &theirs).0,
                200,
                "the other client's patch"
            );
        }
        let answer = self.apply_patch(key, ops);
        self.patches
            .lock()
            .unwrap()
            .push((key.clone(), ops.clone(), answer.0));
        self.changed.notify_waiters();
        answer
    }

    fn apply_patch(&self, key: &Key, ops: &Value) -> (u16, Value) {
        let mut pods = self.pods.lock().unwrap();
        let Some(old) = pods.get(key).cloned() else {
            let message = format!("pods \"{}\" not found", key.1);
            return (404, status_value(404, "NotFound", &message, None));
        };
        let Ok(patch) = serde_json::from_value::<json_patch::Patch>(ops.clone()) else {
            return (
                400,
                status_value(400, "BadRequest", "not a JSON Patch", None),
            );
        };
        let mut new = old.clone();
        if json_patch::patch(&mut new, &patch).is_err() {
            return (422, recorded_json("pod-patch-gates-test-failed.body.json"));
        }
        if let Some(refusal) = validate_update(&old, &new) {
            return refusal;
        }
        // The last gate gone, the list goes too; the status stays as it was until a scheduler
        // (none runs in the recording) writes it, as recorded.
        if new["spec"]["schedulingGates"] == json!([]) {
            new["spec"]
                .as_object_mut()
                .unwrap()
                .remove("schedulingGates");
        }
        if new["spec"] != old["spec"] {
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(0);
            new["metadata"]["generation"] = json!(generation + 1);
        }
        let rv = self.record(Some(old), None);
        new["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.log.lock().unwrap().last_mut().unwrap().after = Some(new.clone());
        pods.insert(key.clone(), new.clone());
        (200, new)
    }
}

fn jiff_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let t = k8s_openapi::jiff::Timestamp::from_second(now as i64).unwrap();
    t.to_string()
}

/// Whether `pod` is selected by `selector` (every form the API server reads, as
/// `super::selector` parses it; a malformed one was refused with 400 before).
fn matches(selector: Option<&str>, pod: &Value) -> bool {
    selector.is_none_or(|s| Selector::parse(s).is_ok_and(|s| s.matches(&pod["metadata"]["labels"])))
}

fn list(state: &State, namespace: Option<&str>, selector: Option<&str>) -> Response<Body> {
    let pods = state.pods.lock().unwrap();
    let items: Vec<Value> = pods
        .iter()
        .filter(|((ns, _), _)| namespace.is_none_or(|n| n == ns))
        .map(|(_, pod)| pod)
        .filter(|p| matches(selector, p))
        .map(|pod| {
            // A list's items carry no kind or apiVersion (the list does), as recorded.
            let mut item = pod.clone();
            let fields = item.as_object_mut().unwrap();
            fields.remove("kind");
            fields.remove("apiVersion");
            item
        })
        .collect();
    let rv = state.rv.load(Ordering::SeqCst);
    answer(
        200,
        &json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
    )
}

/// The watch line for one change as a watch with `selector` sees it.
fn watch_line(change: &Change, selector: Option<&str>) -> Option<Bytes> {
    let was = change.before.as_ref().filter(|p| matches(selector, p));
    let is = change.after.as_ref().filter(|p| matches(selector, p));
    let (kind, object) = match (was, is) {
        (None, Some(pod)) => ("ADDED", pod.clone()),
        (Some(_), Some(pod)) => ("MODIFIED", pod.clone()),
        (Some(_), None) => {
            let mut gone = change.after.clone().or(change.before.clone()).unwrap();
            gone["metadata"]["resourceVersion"] = json!(change.rv.to_string());
            ("DELETED", gone)
        }
        (None, None) => return None,
    };
    let mut object = object;
    object["kind"] = json!("Pod");
    object["apiVersion"] = json!("v1");
    Some(Bytes::from(format!(
        "{}\n",
        json!({"type": kind, "object": object})
    )))
}

fn watch(state: Arc<State>, selector: Option<String>, from: u64) -> Response<Body> {
    let lines = futures_util::stream::unfold((state, from), move |(state, mut seen)| {
        let selector = selector.clone();
        async move {
            loop {
                let waiting = state.clone();
                let notified = waiting.changed.notified();
                let next: Vec<Change> = state
                    .log
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|c| c.rv > seen)
                    .cloned()
                    .collect();
                if let Some(change) = next.first() {
                    seen = change.rv;
                    if let Some(line) = watch_line(change, selector.as_deref()) {
                        return Some((Ok::<_, Infallible>(Frame::data(line)), (state, seen)));
                    }
                    continue;
                }
                notified.await;
            }
        }
    });
    let mut response = Response::new(StreamBody::new(lines).boxed_unsync());
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

/// The test's own token, or one of the Lease fake's replicas.
fn authorized(req: &Req) -> bool {
    let token = req.token().unwrap_or_default();
    token == "admintoken" || TOKENS.contains(&token)
}

async fn route_pods(state: Arc<State>, req: Req) -> Response<Body> {
    if !authorized(&req) {
        return answer(
            401,
            &status_value(401, "Unauthorized", "Unauthorized", None),
        );
    }
    let (method, path, q) = (&req.method, req.path.as_str(), &req.query);
    let content_type = req.header("content-type");
    let body = &req.body;
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let selector = q.get("labelSelector").map(String::as_str);
    if let Some(Err(why)) = selector.map(Selector::parse) {
        return answer(400, &status_value(400, "BadRequest", &why, None));
    }
    match (method, &parts[..]) {
        (&Method::GET, ["api", "v1", "pods"])
            if q.get("watch").is_some_and(|w| w == "true" || w == "1") =>
        {
            let from = q
                .get("resourceVersion")
                .and_then(|rv| rv.parse().ok())
                .unwrap_or(0);
            watch(state, selector.map(str::to_owned), from)
        }
        (&Method::GET, ["api", "v1", "pods"]) => list(&state, None, selector),
        (&Method::GET, ["api", "v1", "namespaces", ns, "pods"]) => list(&state, Some(ns), selector),
        (&Method::GET, ["api", "v1", "namespaces", ns, "pods", name]) => state.get(ns, name),
        (&Method::POST, ["api", "v1", "namespaces", ns, "pods"]) => {
            let pod: Value = serde_json::from_slice(body).unwrap_or_default();
            match state.create(ns, pod) {
                Ok(pod) => answer(201, &pod),
                Err((code, body)) => answer(code, &body),
            }
        }
        (&Method::PATCH, ["api", "v1", "namespaces", _, "pods", _])
            if content_type != "application/json-patch+json" =>
        {
            answer(
                501,
                &unrecorded_status(&format!("a {content_type} patch of a Pod")),
            )
        }
        (&Method::PATCH, ["api", "v1", "namespaces", ns, "pods", name]) => {
            let ops: Value = serde_json::from_slice(body).unwrap_or_default();
            let (code, body) = state.patch(&(ns.to_string(), name.to_string()), &ops);
            answer(code, &body)
        }
        (&Method::POST, ["api", "v1", "namespaces", _, "events"]) => {
            let (code, body) = state
                .events
                .answer("POST", path, body)
                .expect("an Events path");
            if code == 201 {
                state.changed.notify_waiters();
            }
            answer(code, &body)
        }
        _ => answer(501, &unrecorded_status(&format!("{method} {path}"))),
    }
}

impl GatesApiServer {
    /// The Pods and Events, and Leases (`lease_api`): one API for replicas that gate and elect
    /// (each through [`GatesApiServer::client_as`] `admintoken` or one of the Lease fake's
    /// tokens).
    pub fn start() -> Self {
        let state = Arc::new(State {
            rv: AtomicU64::new(200),
            ..State::default()
        });
        let shared = state.clone();
        let pods: Handler =
            Arc::new(move |req: &Req| Some(Box::pin(route_pods(shared.clone(), req.clone()))));
        let leases = Leases::default();
        let api = FakeApi::new()
            .handler(leases.handler())
            .handler(pods)
            .start();
        Self {
            port: api.port,
            api,
            state,
            leases,
        }
    }

    /// A real `kube` client for this server.
    pub fn client(&self) -> kube::Client {
        self.client_as("admintoken")
    }

    /// A client authenticating as `token` (`admintoken`, or one of the Lease fake's replicas).
    pub fn client_as(&self, token: &str) -> kube::Client {
        self.api.client(token)
    }

    /// Creates a Pod as the API server would (after admission).
    pub fn create(&self, namespace: &str, pod: Value) -> Result<Value, (u16, Value)> {
        self.state.create(namespace, pod)
    }

    /// Applies a JSON Patch as a client's PATCH would (the status and the answer).
    pub fn patch(&self, namespace: &str, name: &str, ops: &Value) -> (u16, Value) {
        self.state
            .patch(&(namespace.to_owned(), name.to_owned()), ops)
    }

    /// Another client's patch `ops` lands just before the next PATCH of the Pod (a race the
    /// controller's `test` must catch).
    pub fn before_next_patch(&self, namespace: &str, name: &str, ops: Value) {
        self.state
            .before_next_patch
            .lock()
            .unwrap()
            .insert((namespace.to_owned(), name.to_owned()), ops);
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        self.state
            .pods
            .lock()
            .unwrap()
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// The Pods labelled as `selector` says, as a list would answer.
    pub fn list(&self, selector: &str) -> Vec<Value> {
        let pods = self.state.pods.lock().unwrap();
        pods.values()
            .filter(|p| matches(Some(selector), p))
            .cloned()
            .collect()
    }

    pub fn events(&self) -> Vec<Value> {
        self.state.events.created()
    }

    /// Every JSON Patch received: the Pod, the operations, the status answered.
    pub fn patches(&self) -> Vec<(String, String, Value, u16)> {
        let patches = self.state.patches.lock().unwrap();
        patches
            .iter()
            .map(|((ns, n), ops, code)| (ns.clone(), n.clone(), ops.clone(), *code))
            .collect()
    }

    /// Waits until `done` holds of the server's state (checked on every change), at most
    /// `limit` — the bound a test gives the event it waits for, never a sleep it orders by.
    pub async fn wait_for(
        &self,
        limit: std::time::Duration,
        mut done: impl FnMut(&Self) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.state.changed.notified();
            if done(self) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return done(self);
            }
        }
    }
}
