//! Many Pods crash-looping for other reasons than the architecture, for the crash watch's
//! benchmark (`benches/crashes.rs`): handlers on the one fake API server (`kube_fake`) serving
//! what `tolerable serve` with
//! `[crashes] watch` reads. **Derived, not recorded**: every object is the recorded crash's
//! (`tests/data/kube-api/crashes/`) with its name and uid substituted — Pod `i` is
//! `shop/web-7d9c6b8f5-NNNNN` (uid `26be13ca-16c0-4b8b-9e31-<i, 12 digits>`), its BackOff Event
//! the recorded one (`shop/…abcde.187b3c2d4e5f6a7b`) renamed after it — and its last
//! termination replaced by one of three other failures, by `i % 3`: an OOM kill (`OOMKilled`,
//! exit 137, a 30 s run), exit 1 without a message, exit 1 with a configuration error's text
//! (`Error: open /etc/web/config.yaml: no such file or directory`). Served:
//!
//! - `GET /api/v1/events?fieldSelector=reason=BackOff…`: the N BackOff Events, paged as
//!   `kube_pages` pages (the recorded continue-token shape); the first watch sends each Event
//!   once more as MODIFIED (`count` 2: every kubelet's next BackOff), then the Events in turn
//!   at a given rate (the kubelets' later BackOffs) until its `timeoutSeconds`; later watches
//!   send nothing;
//! - `GET …/shop/pods/NAME`: Pod `NAME` (404 for another name, in the recorded 404's shape of
//!   the node fake);
//! - `GET …/log?…previous=true…`: the recorded 500 (no kubelet);
//! - Leases: the Lease fake's answers ([`super::lease_api`]), so the server leads;
//! - anything else: 501, unrecorded.
//!
//! It counts the Pod reads, log reads, lists and watches.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::Frame;
use hyper::Response;
use serde_json::{json, Value};

use super::kube_fake::{full, json, status, unrecorded_status, Body, FakeApi, Req, Running};
use super::kube_pages::{self, ListQuery};
use super::lease_api::Leases;
use super::recorded::exchanges;

const PODS: &str = "/api/v1/namespaces/shop/pods/";
/// The list's revision (above every item's).
const REVISION: i64 = 1_000_000;

struct State {
    /// The BackOff Events by etcd key, in key order, as JSON text.
    events: Vec<(String, String)>,
    /// Pod `i`'s JSON text.
    pods: Vec<String>,
    /// The recorded 500 of the previous log.
    log_500: (u16, Value),
    /// The kubelets' later BackOffs sent on the first watch, a second.
    backoffs_per_second: u64,
    watched: AtomicBool,
    pod_reads: AtomicUsize,
    log_reads: AtomicUsize,
    lists: AtomicUsize,
    watches: AtomicUsize,
    /// Requests no part of this fake serves (an Event written, a Pod patched or deleted…).
    unserved: AtomicUsize,
}

/// What the server asked: Pod reads, log reads, Event list pages, watches, and requests no
/// part of the fake serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub pod_reads: usize,
    pub log_reads: usize,
    pub lists: usize,
    pub watches: usize,
    pub unserved: usize,
}

pub struct CrashScaleApi {
    pub port: u16,
    state: Arc<State>,
    /// The server, serving [`Leases`] too.
    api: Running,
}

/// Pod `i`'s name.
pub fn pod_name(i: usize) -> String {
    format!("web-7d9c6b8f5-{i:05}")
}

fn recorded(note: &str) -> (u16, Value) {
    let e = exchanges("crashes")
        .into_iter()
        .find(|e| e.note.starts_with(note))
        .unwrap_or_else(|| panic!("no recorded exchange {note:?}"));
    (e.response.status, e.response.body)
}

/// Pod `i`: the recorded Pod renamed, its last termination one of the three other failures.
fn pod(template: &Value, i: usize) -> Value {
    let mut pod = template.clone();
    pod["metadata"]["name"] = json!(pod_name(i));
    pod["metadata"]["uid"] = json!(format!("26be13ca-16c0-4b8b-9e31-{i:012}"));
    let terminated = &mut pod["status"]["containerStatuses"][0]["lastState"]["terminated"];
    let (reason, exit_code, message, started) = match i % 3 {
        0 => ("OOMKilled", 137, None, "2026-11-27T09:59:34Z"),
        1 => ("Error", 1, None, "2026-11-27T10:00:04Z"),
        _ => (
            "Error",
            1,
            Some("Error: open /etc/web/config.yaml: no such file or directory\n"),
            "2026-11-27T10:00:04Z",
        ),
    };
    terminated["reason"] = json!(reason);
    terminated["exitCode"] = json!(exit_code);
    terminated["startedAt"] = json!(started);
    match message {
        Some(text) => terminated["message"] = json!(text),
        None => {
            terminated.as_object_mut().unwrap().remove("message");
        }
    }
    pod
}

/// Pod `i`'s BackOff Event: the recorded one renamed after it.
fn event(template: &Value, i: usize) -> Value {
    let mut event = template.clone();
    let name = pod_name(i);
    event["metadata"]["name"] = json!(format!("{name}.187b3c2d4e5f6a7b"));
    event["metadata"]["uid"] = json!(format!("697522db-9b01-4dde-933c-{i:012}"));
    event["metadata"]["resourceVersion"] = json!((1000 + i).to_string());
    event["involvedObject"]["name"] = json!(name);
    event["involvedObject"]["uid"] = json!(format!("26be13ca-16c0-4b8b-9e31-{i:012}"));
    event
}

impl CrashScaleApi {
    /// `count` crash-looping Pods and their BackOff Events, `backoffs_per_second` of them sent
    /// again a second once the first watch has sent them all.
    pub fn start(count: usize, backoffs_per_second: u64) -> Self {
        super::init();
        let (_, pod_template) = recorded("the Pod as the crash watch reads it");
        let (_, list) = recorded("list BackOff Warning Events");
        let event_template = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["metadata"]["namespace"] == "shop")
            .unwrap()
            .clone();
        let mut events: Vec<(String, String)> = (0..count)
            .map(|i| {
                let e = event(&event_template, i);
                (kube_pages::key_of(&e), e.to_string())
            })
            .collect();
        events.sort();
        let state = Arc::new(State {
            events,
            pods: (0..count)
                .map(|i| pod(&pod_template, i).to_string())
                .collect(),
            log_500: recorded("the previous log"),
            backoffs_per_second,
            watched: AtomicBool::new(false),
            pod_reads: AtomicUsize::new(0),
            log_reads: AtomicUsize::new(0),
            lists: AtomicUsize::new(0),
            watches: AtomicUsize::new(0),
            unserved: AtomicUsize::new(0),
        });
        let shared = state.clone();
        let api = FakeApi::new()
            .handler(Leases::default().handler())
            .handler(Arc::new(move |req: &Req| {
                Some(Box::pin(route(shared.clone(), req.clone())))
            }))
            .start();
        Self {
            port: api.port,
            state,
            api,
        }
    }

    /// A kubeconfig for `tolerable serve` (as the Lease fake's replica `replica-a`).
    pub fn kubeconfig(&self) -> tempfile::NamedTempFile {
        super::kube_fake::kubeconfig(self.api.port, "replica-a")
    }

    /// What the server asked so far.
    pub fn counts(&self) -> Counts {
        let s = &self.state;
        Counts {
            pod_reads: s.pod_reads.load(Ordering::SeqCst),
            log_reads: s.log_reads.load(Ordering::SeqCst),
            lists: s.lists.load(Ordering::SeqCst),
            watches: s.watches.load(Ordering::SeqCst),
            unserved: s.unserved.load(Ordering::SeqCst),
        }
    }
}

/// One request but the Leases' (asked first).
async fn route(state: Arc<State>, req: Req) -> Response<Body> {
    let (path, query_text) = (req.path.as_str(), req.raw_query.as_str());
    if req.method != hyper::Method::GET {
        state.unserved.fetch_add(1, Ordering::SeqCst);
        return json(501, &unrecorded_status(&req.what()));
    }
    if path == "/api/v1/events" {
        if req.is_watch() {
            return watch(&state, &req.query);
        }
        state.lists.fetch_add(1, Ordering::SeqCst);
        return list(&state, query_text);
    }
    let Some(rest) = path.strip_prefix(PODS) else {
        state.unserved.fetch_add(1, Ordering::SeqCst);
        return json(501, &unrecorded_status(&format!("GET {path}")));
    };
    if rest.ends_with("/log") {
        state.log_reads.fetch_add(1, Ordering::SeqCst);
        return json(state.log_500.0, &state.log_500.1);
    }
    state.pod_reads.fetch_add(1, Ordering::SeqCst);
    let i = rest
        .strip_prefix("web-7d9c6b8f5-")
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|i| *i < state.pods.len());
    match i {
        Some(i) => full(status(hyper::StatusCode::OK, state.pods[i].clone())),
        None => json(
            404,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("pods \"{rest}\" not found"), "reason": "NotFound",
                "details": {"name": rest, "kind": "pods"}, "code": 404}),
        ),
    }
}

fn list(state: &State, query_text: &str) -> Response<Body> {
    let asked = ListQuery::parse(query_text).unwrap();
    let after = asked
        .continue_token
        .as_deref()
        .map(|t| kube_pages::Continue::decode(t).unwrap().after);
    let page = kube_pages::page(&state.events, asked.limit, after.as_deref(), REVISION);
    let body = kube_pages::list_body("EventList", "v1", REVISION, &page);
    full(status(hyper::StatusCode::OK, body))
}

/// The first watch: every Event again as MODIFIED at once (`count` 2), then, until its
/// `timeoutSeconds`, the kubelets' later BackOffs: the Events in turn, `per_second` a second
/// (`count` 3, 4, …: a Pod at the kubelet's longest back-off, 5 minutes, backs off again every 5
/// minutes — 10,000 such Pods make 33 a second). Later watches send nothing new.
fn watch(state: &Arc<State>, q: &std::collections::BTreeMap<String, String>) -> Response<Body> {
    state.watches.fetch_add(1, Ordering::SeqCst);
    let first = !state.watched.swap(true, Ordering::SeqCst);
    let open_for = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .unwrap_or(290);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(open_for);
    let burst = if first { state.events.len() } else { 0 };
    let per_second = if first { state.backoffs_per_second } else { 0 };
    let state = state.clone();
    // (the next line's number, the state); each line is the Event `n % N`, sent again.
    let lines = futures_util::stream::unfold((0usize, state), move |(n, state)| async move {
        if n >= burst {
            let pause = match per_second {
                0 => Duration::from_secs(open_for),
                rate => Duration::from_secs_f64(1.0 / rate as f64),
            };
            tokio::time::sleep_until((tokio::time::Instant::now() + pause).min(deadline)).await;
            if tokio::time::Instant::now() >= deadline || per_second == 0 {
                return None;
            }
        }
        let total = state.events.len();
        let mut event: Value = serde_json::from_str(&state.events[n % total].1).unwrap();
        event["count"] = json!(2 + n / total);
        let rv = (REVISION + 1 + n as i64).to_string();
        event["metadata"]["resourceVersion"] = json!(rv);
        let line = json!({"type": "MODIFIED", "object": event});
        let frame: Result<Frame<Bytes>, Infallible> =
            Ok(Frame::data(Bytes::from(format!("{line}\n"))));
        Some((frame, (n + 1, state)))
    });
    let mut response = Response::new(StreamBody::new(lines).boxed_unsync());
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}
