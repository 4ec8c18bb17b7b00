//! Namespaces, a handler on the one fake API server (`kube_fake`), serving the responses recorded from a real
//! kube-apiserver v1.36 in `tests/data/kube-api/namespaces/` (`team-a` labelled
//! `tolerable.io/enforce=false`, `batch` annotated `tolerable.io/preferred-architecture=arm64=80,
//! amd64=20`, `team-b` labelled `tolerable.io/skip=true`, and the API server's own four):
//! - `GET /api/v1/namespaces`: the metadata-only list when asked with kube's
//!   `as=PartialObjectMetadataList` Accept header, else the full list (as the real one answers);
//!   a `limit` that is not a positive number, or a `continue` token (the list is one page; the
//!   real one refuses a token it did not issue), is the API server's 400;
//! - `?watch=true`: metadata-only (`as=PartialObjectMetadata`) watches, the recorded kind, from
//!   the list's resourceVersion or any later one, as the real server accepts a re-watch from the
//!   last resourceVersion its client saw: each sends every change after its resourceVersion —
//!   the recorded events (team-a relabelled `true`, batch's annotation removed, `new-team`
//!   added) as the test releases them ([`NamespaceApi::release`]), then whatever the test adds
//!   ([`NamespaceApi::add_namespace`], shaped as the recorded ADDED event) — and stays open
//!   until [`NamespaceApi::end_watch`] (as `timeoutSeconds` ends one); a full-object watch or
//!   one from before the list (history the fake does not hold) is refused as unrecorded (501);
//! - token `nobodytoken`: the recorded 403 for list and watch (no `list namespaces`), and
//!   `admintoken` too once [`NamespaceApi::revoke`]d;
//!   `admintoken` may read; any other token is a 401.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::StreamExt as _;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::Frame;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::kube_fake::{self, full, status, Answer, Body, FakeApi, Req, Running};

/// The recorded list's resourceVersion: watches must start from it.
const LIST_RV: &str = "213";

pub struct NamespaceApi {
    pub port: u16,
    api: Running,
    state: Arc<State>,
}

struct State {
    /// Every change released so far: its resourceVersion and its watch line, in order.
    log: Mutex<Vec<(u64, String)>>,
    /// How many times the test ended the open watches.
    ends: AtomicUsize,
    changed: tokio::sync::Notify,
    /// The recorded watch events not yet released.
    recorded: Mutex<std::collections::VecDeque<String>>,
    /// Each request: (path?query, Accept header).
    requests: Mutex<Vec<(String, String)>>,
    lists: AtomicUsize,
    watches: AtomicUsize,
    refused: AtomicUsize,
    /// When set, a list is answered only once the test adds a permit.
    list_gate: Option<Arc<tokio::sync::Semaphore>>,
    /// `admintoken`'s RoleBinding deleted: refused as `nobodytoken` is.
    revoked: std::sync::atomic::AtomicBool,
    /// This state itself, for the watches it starts.
    me: std::sync::Weak<State>,
}

fn recording(name: &str) -> String {
    kube_fake::recording(&format!("namespaces/{name}"))
}

/// The API server's 400 Status, with `message`.
fn bad_request(message: &str) -> Response<Body> {
    full(kube_fake::bad_request(message))
}

impl State {
    fn clone_arc(&self) -> Arc<State> {
        self.me.upgrade().unwrap()
    }

    /// Logs a released change and wakes the watches.
    fn publish(&self, line: String) {
        self.log.lock().unwrap().push((line_rv(&line), line));
        self.changed.notify_waiters();
    }

    fn answer(&self, token: Option<&str>, query: &str, accept: &str) -> Response<Body> {
        let query = kube_fake::query(query);
        let param = |key: &str| query.get(key).map(String::as_str);
        match token {
            Some("admintoken") if !self.revoked.load(Ordering::SeqCst) => {}
            Some("nobodytoken" | "admintoken") => {
                self.refused.fetch_add(1, Ordering::SeqCst);
                return full(status(
                    StatusCode::FORBIDDEN,
                    recording("namespace-list-403.body.json"),
                ));
            }
            _ => return kube_fake::unauthorized(),
        }
        if let Some(limit) = param("limit") {
            if !limit.parse::<u32>().is_ok_and(|l| l > 0) {
                return bad_request(&format!("invalid limit {limit:?}"));
            }
        }
        if param("continue").is_some_and(|c| !c.is_empty()) {
            return bad_request("continue key is not valid: the list was served whole");
        }
        let watch = matches!(param("watch"), Some("true" | "1"));
        if !watch {
            self.lists.fetch_add(1, Ordering::SeqCst);
            let body = if accept.contains("as=PartialObjectMetadataList") {
                recording("namespace-list-metadata.body.json")
            } else {
                recording("namespace-list.body.json")
            };
            return full(status(StatusCode::OK, body));
        }
        if !accept.contains("as=PartialObjectMetadata") {
            return full(kube_fake::unrecorded("a full-object Namespace watch"));
        }
        let list_rv: u64 = LIST_RV.parse().unwrap();
        let from = match param("resourceVersion").map(str::parse::<u64>) {
            Some(Ok(rv)) if rv >= list_rv => rv,
            _ => {
                return full(kube_fake::unrecorded(
                    "a Namespace watch from before the list",
                ))
            }
        };
        self.watches.fetch_add(1, Ordering::SeqCst);
        let frames = changes_after(self.clone_arc(), from).boxed();
        let mut response = Response::new(StreamBody::new(frames).boxed_unsync());
        response
            .headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        response
    }
}

/// Every released change after resourceVersion `from`, one chunk each, then each change as
/// it is released (in the order released: a bookmark after the event of its resourceVersion);
/// the response ends at the next [`NamespaceApi::end_watch`].
fn changes_after(
    state: Arc<State>,
    from: u64,
) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> {
    let ends = state.ends.load(Ordering::SeqCst);
    let start = {
        let log = state.log.lock().unwrap();
        log.partition_point(|(rv, _)| *rv <= from)
    };
    futures_util::stream::unfold((state, start), move |(state, next)| async move {
        let line = loop {
            let waiting = state.clone();
            let notified = waiting.changed.notified();
            let line = state.log.lock().unwrap().get(next).map(|(_, l)| l.clone());
            if let Some(line) = line {
                break line;
            }
            if state.ends.load(Ordering::SeqCst) > ends {
                return None;
            }
            notified.await;
        };
        let frame = Frame::data(Bytes::from(format!("{line}\n")));
        Some((Ok(frame), (state, next + 1)))
    })
}

/// The resourceVersion a watch line carries (a bookmark's included).
fn line_rv(line: &str) -> u64 {
    let event: Value = serde_json::from_str(line).unwrap();
    let rv = event["object"]["metadata"]["resourceVersion"].as_str();
    rv.and_then(|rv| rv.parse().ok()).unwrap_or_default()
}

/// One request: a held list waits for its permit first; another path than the Namespaces'
/// is the one server's (unrecorded).
fn handle(state: Arc<State>, req: &Req) -> Option<Answer> {
    let accept = req.header("accept").to_owned();
    let path_and_query = format!("{}?{}", req.path, req.raw_query);
    state
        .requests
        .lock()
        .unwrap()
        .push((path_and_query, accept.clone()));
    if req.method != hyper::Method::GET || req.path != "/api/v1/namespaces" {
        return None;
    }
    let (query, token, is_list) = (
        req.raw_query.clone(),
        req.token().map(str::to_owned),
        !req.is_watch(),
    );
    Some(Box::pin(async move {
        if let (Some(gate), true) = (&state.list_gate, is_list) {
            gate.acquire().await.unwrap().forget();
        }
        state.answer(token.as_deref(), &query, &accept)
    }))
}

impl NamespaceApi {
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// As [`NamespaceApi::start`]; each list is answered only after [`NamespaceApi::answer_list`].
    pub fn start_held() -> Self {
        Self::start_with(Some(Arc::new(tokio::sync::Semaphore::new(0))))
    }

    /// Lets one held list be answered.
    pub fn answer_list(&self) {
        if let Some(gate) = &self.state.list_gate {
            gate.add_permits(1);
        }
    }

    fn start_with(list_gate: Option<Arc<tokio::sync::Semaphore>>) -> Self {
        super::init();
        let recorded = recording("namespace-watch-metadata.body.json")
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect();
        let state = Arc::new_cyclic(|me| State {
            me: me.clone(),
            log: Mutex::new(Vec::new()),
            ends: AtomicUsize::new(0),
            changed: tokio::sync::Notify::new(),
            recorded: Mutex::new(recorded),
            requests: Mutex::new(Vec::new()),
            lists: AtomicUsize::new(0),
            watches: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            list_gate,
            revoked: std::sync::atomic::AtomicBool::new(false),
        });
        let shared = state.clone();
        let api = FakeApi::new()
            .handler(Arc::new(move |req: &Req| handle(shared.clone(), req)))
            .start();
        Self {
            port: api.port,
            api,
            state,
        }
    }

    /// Sends the next `n` recorded watch events (BOOKMARK included) on the first watch.
    pub fn release(&self, n: usize) {
        let mut recorded = self.state.recorded.lock().unwrap();
        for _ in 0..n {
            let line = recorded.pop_front().expect("a recorded event left");
            self.state.publish(line);
        }
    }

    /// Sends an ADDED event for a Namespace `name` with `labels` and `annotations`, shaped
    /// exactly as the recorded ADDED event (`new-team`), at the next resourceVersion.
    pub fn add_namespace(&self, name: &str, labels: Value, annotations: Value, rv: u64) {
        let recorded = recording("namespace-watch-metadata.body.json");
        let added = recorded.lines().find(|l| l.contains("\"ADDED\"")).unwrap();
        let mut event: Value = serde_json::from_str(added).unwrap();
        let meta = &mut event["object"]["metadata"];
        meta["name"] = json!(name);
        meta["uid"] = json!(format!("00000000-0000-4000-8000-{rv:012}"));
        meta["resourceVersion"] = json!(rv.to_string());
        let mut all = json!({"kubernetes.io/metadata.name": name});
        all.as_object_mut()
            .unwrap()
            .extend(labels.as_object().unwrap().clone());
        meta["labels"] = all;
        if !annotations.as_object().unwrap().is_empty() {
            meta["annotations"] = annotations;
        }
        self.state.publish(event.to_string());
    }

    /// Ends the open watches' responses (as their `timeoutSeconds` would): the watcher watches
    /// again, from the last resourceVersion it saw.
    pub fn end_watch(&self) {
        self.state.ends.fetch_add(1, Ordering::SeqCst);
        self.state.changed.notify_waiters();
    }

    /// From now on `admintoken` may not list or watch namespaces either (its binding deleted).
    pub fn revoke(&self) {
        self.state.revoked.store(true, Ordering::SeqCst);
    }

    /// A real `kube` client for this server, authenticating with `token`.
    pub fn client(&self, token: &str) -> kube::Client {
        self.api.client(token)
    }

    /// Every request so far: the path and query, and the Accept header.
    pub fn requests(&self) -> Vec<(String, String)> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Lists and watches answered (not refused), and requests refused with the 403.
    pub fn counts(&self) -> (usize, usize, usize) {
        (
            self.state.lists.load(Ordering::SeqCst),
            self.state.watches.load(Ordering::SeqCst),
            self.state.refused.load(Ordering::SeqCst),
        )
    }
}
