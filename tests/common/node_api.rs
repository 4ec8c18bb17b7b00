//! The Nodes of the `kube_api` fake, as the real kube-apiserver v1.24 recorded in
//! `tests/data/kube-api/` (`node-*`, listed in `index.json`) serves them. Seeded with the
//! recorded NodeList (resourceVersion 218); every change — the recorded events another client
//! caused during the first watch (arm-2 added, modified, deleted; bare-1 relabelled) and the
//! fake's own JSON Patches — is applied to the Nodes and kept in a log that every watch reads:
//!
//! - list (`GET /api/v1/nodes`): `labelSelector` (every form recorded; a malformed one is the
//!   recorded 400), `limit` and `continue` (pages and tokens as recorded; a token older than
//!   the seed is the recorded 410), `resourceVersion` with `resourceVersionMatch=Exact` (the
//!   recorded 410 unless it is the current one);
//! - watch: from `resourceVersion` 0 every Node as ADDED (as recorded), from one the log holds
//!   every later change, from one older than the seed the recorded `ERROR` 410 line, from a
//!   future one nothing; `sendInitialEvents`/`resourceVersionMatch` the recorded 422; the
//!   stream ends after a few seconds, well before its `timeoutSeconds`, as a real server's
//!   may end any time;
//! - `GET /api/v1/nodes/NAME` and JSON Patches on it (a failed `test` is the recorded 422).
//!
//! Anything else (another query parameter, another patch type, `dryRun`) is refused as
//! unrecorded ([`super::kube_fake::unrecorded`]). What the fake does not hold: history before the
//! seed (the recorded watch from resourceVersion 1 replays the cluster's whole history; here it
//! is the 410 a real server gives once its watch cache has moved on, `node-watch-too-old-rv`).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::kube_fake::{full, recording, status, unrecorded, Body};
use super::kube_pages;
use super::selector::Selector;

/// One change of a Node: its resourceVersion, before and after (`None`: absent).
#[derive(Clone)]
struct Change {
    rv: u64,
    before: Option<Value>,
    after: Option<Value>,
}

pub struct Nodes {
    nodes: Mutex<BTreeMap<String, Value>>,
    rv: AtomicU64,
    seed: u64,
    log: Mutex<Vec<Change>>,
    changed: tokio::sync::Notify,
    watches: AtomicUsize,
    list_delay: Duration,
    /// When set, the first watch sends each recorded event only when the test adds a permit.
    pub gate: Option<Arc<tokio::sync::Semaphore>>,
}

/// The query parameters a Node list or watch may carry (as recorded); any other is unrecorded.
const KNOWN: [&str; 9] = [
    "labelSelector",
    "limit",
    "continue",
    "resourceVersion",
    "resourceVersionMatch",
    "watch",
    "timeoutSeconds",
    "allowWatchBookmarks",
    "sendInitialEvents",
];

fn json_response(code: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    status(code, body.to_string())
}

fn without_kind(mut node: Value) -> Value {
    if let Some(fields) = node.as_object_mut() {
        fields.remove("kind");
        fields.remove("apiVersion");
    }
    node
}

fn with_kind(mut node: Value) -> Value {
    node["kind"] = json!("Node");
    node["apiVersion"] = json!("v1");
    node
}

/// The watch line for one change as a watch with `selector` sees it, if it sees it.
fn watch_line(change: &Change, selector: &Selector) -> Option<String> {
    let labels = |n: &Value| n["metadata"]["labels"].clone();
    let was = change
        .before
        .as_ref()
        .filter(|n| selector.matches(&labels(n)));
    let is = change
        .after
        .as_ref()
        .filter(|n| selector.matches(&labels(n)));
    let (kind, object) = match (was, is) {
        (None, Some(node)) => ("ADDED", node.clone()),
        (Some(_), Some(node)) => ("MODIFIED", node.clone()),
        (Some(node), None) => {
            let mut gone = change.after.clone().unwrap_or_else(|| node.clone());
            gone["metadata"]["resourceVersion"] = json!(change.rv.to_string());
            ("DELETED", gone)
        }
        (None, None) => return None,
    };
    Some(format!(
        "{}\n",
        json!({"type": kind, "object": with_kind(object)})
    ))
}

impl Nodes {
    pub fn new(list_delay: Duration, gate: Option<Arc<tokio::sync::Semaphore>>) -> Self {
        let list: Value = serde_json::from_str(&recording("node-list.body.json")).unwrap();
        let nodes = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                (
                    n["metadata"]["name"].as_str().unwrap().to_owned(),
                    n.clone(),
                )
            })
            .collect();
        let seed = list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        Self {
            nodes: Mutex::new(nodes),
            rv: AtomicU64::new(seed),
            seed,
            log: Mutex::new(Vec::new()),
            changed: tokio::sync::Notify::new(),
            watches: AtomicUsize::new(0),
            list_delay,
            gate,
        }
    }

    /// Keeps only the Nodes `keep` says (before anything is served).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.nodes.lock().unwrap().retain(|name, _| keep(name));
    }

    pub fn node(&self, name: &str) -> Value {
        self.nodes.lock().unwrap()[name].clone()
    }

    /// Applies one change under the Nodes' lock, logs it and wakes the watches.
    fn apply(&self, name: &str, after: Option<Value>, rv: Option<u64>) -> u64 {
        let mut nodes = self.nodes.lock().unwrap();
        let rv = match rv {
            Some(rv) => {
                self.rv.fetch_max(rv, Ordering::SeqCst);
                rv
            }
            None => self.rv.fetch_add(1, Ordering::SeqCst) + 1,
        };
        let after = after.map(|mut node| {
            node["metadata"]["resourceVersion"] = json!(rv.to_string());
            without_kind(node)
        });
        let before = match &after {
            Some(node) => nodes.insert(name.to_owned(), node.clone()),
            None => nodes.remove(name),
        };
        self.log.lock().unwrap().push(Change { rv, before, after });
        drop(nodes);
        self.changed.notify_waiters();
        rv
    }

    /// One recorded watch event from another client, applied as the real server applied it.
    fn apply_recorded(&self, line: &str) -> Option<Change> {
        let event: Value = serde_json::from_str(line).unwrap();
        let object = event["object"].clone();
        let rv: u64 = object["metadata"]["resourceVersion"]
            .as_str()?
            .parse()
            .ok()?;
        let name = object["metadata"]["name"].as_str()?.to_owned();
        let after = (event["type"] != "DELETED").then_some(object);
        let deleted = after
            .is_none()
            .then(|| without_kind(event["object"].clone()));
        self.apply(&name, after, Some(rv));
        let mut change = self.log.lock().unwrap().last().cloned()?;
        change.before = change.before.or(deleted);
        Some(change)
    }

    /// `GET /api/v1/nodes/NAME`: the Node as held now, or the recorded 404.
    pub fn get(&self, name: &str) -> Response<Full<Bytes>> {
        match self.nodes.lock().unwrap().get(name) {
            Some(node) => json_response(StatusCode::OK, &with_kind(node.clone())),
            None => status(
                StatusCode::NOT_FOUND,
                recording("node-get-missing-404.body.json").replace("missing", name),
            ),
        }
    }

    /// A JSON Patch on a Node, as the API server applies it: all or nothing, a failed `test` is
    /// the recorded 422, success bumps the resourceVersion and is seen by every watch.
    pub fn patch(
        &self,
        name: &str,
        content_type: &str,
        query: &str,
        body: &[u8],
    ) -> Response<Full<Bytes>> {
        let pairs = super::kube_fake::query(query);
        if content_type != "application/json-patch+json" || !pairs.is_empty() {
            return unrecorded(&format!("a {content_type} patch of a Node with ?{query}"));
        }
        let Ok(patch) = serde_json::from_slice::<json_patch::Patch>(body) else {
            return unrecorded("a Node patch that is not a JSON Patch");
        };
        let Some(mut patched) = self.nodes.lock().unwrap().get(name).cloned() else {
            return self.get(name);
        };
        if json_patch::patch(&mut patched, &patch).is_err() {
            return status(
                StatusCode::UNPROCESSABLE_ENTITY,
                recording("node-amd-1-json-patch-test-failed.body.json"),
            );
        }
        self.apply(name, Some(patched), None);
        self.get(name)
    }

    /// `GET /api/v1/nodes?…`: a list or a watch.
    pub async fn list_or_watch(self: &Arc<Self>, query: &str) -> Response<Body> {
        let q = super::kube_fake::query(query);
        if let Some(unknown) = q.keys().find(|k| !KNOWN.contains(&k.as_str())) {
            return full(unrecorded(&format!("the Node list parameter {unknown}")));
        }
        let selector = match Selector::parse(q.get("labelSelector").map_or("", String::as_str)) {
            Ok(selector) => selector,
            Err(why) => return full(super::kube_fake::bad_request(&why)),
        };
        if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
            return self.watch(&q, selector);
        }
        tokio::time::sleep(self.list_delay).await;
        full(self.list(&q, &selector))
    }

    fn list(&self, q: &BTreeMap<String, String>, selector: &Selector) -> Response<Full<Bytes>> {
        let current = self.rv.load(Ordering::SeqCst);
        let asked_rv = q.get("resourceVersion").filter(|rv| !rv.is_empty());
        match q.get("resourceVersionMatch").map(String::as_str) {
            None => {}
            Some("Exact") if asked_rv.is_some_and(|rv| *rv != current.to_string()) => {
                let body = recording("node-list-rv-exact-expired-410.body.json");
                return status(StatusCode::GONE, body);
            }
            Some(other) => return unrecorded(&format!("resourceVersionMatch={other} on Nodes")),
        }
        if asked_rv.is_some_and(|rv| rv.parse::<u64>().map_or(true, |rv| rv > current)) {
            return unrecorded("a Node list at a future or malformed resourceVersion");
        }
        let limit = q
            .get("limit")
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|l| *l > 0);
        let (revision, after) = match q.get("continue") {
            None => (current as i64, None),
            Some(token) => match kube_pages::Continue::decode(token) {
                Ok(token) if token.revision < self.seed as i64 => {
                    let body = recording("node-list-continue-expired-410.body.json");
                    return status(StatusCode::GONE, body);
                }
                Ok(token) => (token.revision, Some(token.after)),
                Err(kube_pages::Refused::BadRequest(why)) => {
                    return super::kube_fake::bad_request(&why)
                }
            },
        };
        let nodes = self.nodes.lock().unwrap();
        let items: Vec<(String, String)> = nodes
            .iter()
            .filter(|(_, n)| selector.matches(&n["metadata"]["labels"]))
            .map(|(name, n)| (name.clone(), n.to_string()))
            .collect();
        let page = kube_pages::page(&items, limit, after.as_deref(), revision);
        let body = kube_pages::list_body("NodeList", "v1", revision, &page);
        status(StatusCode::OK, body)
    }
}

/// Where a watch starts, from its `resourceVersion`.
enum Start {
    /// `0`: every Node as ADDED, then what changes.
    Any,
    /// What changed after this resourceVersion.
    After(u64),
    /// Older than anything the fake holds: the recorded 410 line.
    TooOld(u64),
}

impl Nodes {
    fn watch(self: &Arc<Self>, q: &BTreeMap<String, String>, selector: Selector) -> Response<Body> {
        if q.contains_key("sendInitialEvents") || q.contains_key("resourceVersionMatch") {
            let body = recording("node-watch-streaming-list-unsupported.body.json");
            return full(status(StatusCode::UNPROCESSABLE_ENTITY, body));
        }
        let start = match q.get("resourceVersion").map(|rv| rv.parse::<u64>()) {
            None | Some(Ok(0)) => Start::Any,
            Some(Ok(rv)) if rv < self.seed => Start::TooOld(rv),
            Some(Ok(rv)) => Start::After(rv),
            Some(Err(_)) => return full(unrecorded("a watch at a malformed resourceVersion")),
        };
        let first = self.watches.fetch_add(1, Ordering::SeqCst) == 0;
        let bookmarks = q.get("allowWatchBookmarks").is_some_and(|b| b == "true");
        let lines = self.clone().watch_lines(start, selector, first, bookmarks);
        let mut response = Response::new(StreamBody::new(lines).boxed_unsync());
        let headers = response.headers_mut();
        headers.insert("content-type", "application/json".parse().unwrap());
        response
    }

    /// The lines of one watch: the start, the recorded events (first watch only), then every
    /// logged change after the start, until the stream's time is up.
    fn watch_lines(
        self: Arc<Self>,
        start: Start,
        selector: Selector,
        first: bool,
        bookmarks: bool,
    ) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send {
        let mut opening = Vec::new();
        let from = match start {
            Start::TooOld(rv) => {
                let current = self.rv.load(Ordering::SeqCst);
                let line = recording("node-watch-too-old-rv.body.jsonl")
                    .replace("218 (233)", &format!("{rv} ({current})"));
                opening.push(line);
                None
            }
            Start::Any => {
                let nodes = self.nodes.lock().unwrap();
                let rv = |n: &&Value| {
                    let rv = n["metadata"]["resourceVersion"].as_str().unwrap_or("0");
                    rv.parse::<u64>().unwrap_or(0)
                };
                // In the order of their last change, as the watch cache sends them (recorded).
                let mut current: Vec<&Value> = nodes.values().collect();
                current.sort_by_key(rv);
                for node in current
                    .into_iter()
                    .filter(|n| selector.matches(&n["metadata"]["labels"]))
                {
                    let event = json!({"type": "ADDED", "object": with_kind(node.clone())});
                    opening.push(format!("{event}\n"));
                }
                Some(self.rv.load(Ordering::SeqCst))
            }
            Start::After(rv) => Some(rv),
        };
        let recorded: Vec<String> = match (first, from) {
            (true, Some(_)) => recording("node-watch-from-list-rv.body.jsonl")
                .lines()
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        };
        let (gate, then_wait) = match (&self.gate, first) {
            // Held open until the test is done, so no re-list replays the events.
            (Some(gate), true) => (Some(gate.clone()), Duration::from_secs(60)),
            (_, true) => (None, Duration::from_secs(1)),
            _ => (None, Duration::from_secs(3)),
        };
        let deadline = tokio::time::Instant::now() + then_wait;
        let opening = futures_util::stream::iter(opening.into_iter().map(Bytes::from));
        let state = Watching {
            nodes: self,
            selector,
            seen: from,
            recorded,
            gate,
            bookmarks,
            deadline,
        };
        let rest = futures_util::stream::unfold(state, |mut w| async move {
            let line = w.next_line().await?;
            Some((Bytes::from(line), w))
        });
        use futures_util::StreamExt as _;
        opening.chain(rest).map(|b| Ok(Frame::data(b)))
    }
}

/// One watch's progress through the recorded events and the log.
struct Watching {
    nodes: Arc<Nodes>,
    selector: Selector,
    /// The last resourceVersion sent (`None`: the watch ended at its start).
    seen: Option<u64>,
    /// Recorded events still to apply and send (the first watch only), in order.
    recorded: Vec<String>,
    gate: Option<Arc<tokio::sync::Semaphore>>,
    bookmarks: bool,
    deadline: tokio::time::Instant,
}

impl Watching {
    async fn next_line(&mut self) -> Option<String> {
        self.seen?;
        if !self.recorded.is_empty() {
            let line = self.recorded.remove(0);
            match &self.gate {
                Some(gate) => gate.acquire().await.unwrap().forget(),
                None => tokio::time::sleep(Duration::from_millis(20)).await,
            }
            return Some(self.recorded_line(&line));
        }
        loop {
            let seen = self.seen?;
            let notified = self.nodes.changed.notified();
            let next = self
                .nodes
                .log
                .lock()
                .unwrap()
                .iter()
                .find(|c| c.rv > seen)
                .cloned();
            match next {
                Some(change) => {
                    self.seen = Some(change.rv);
                    if let Some(line) = watch_line(&change, &self.selector) {
                        return Some(line);
                    }
                }
                None => tokio::time::timeout_at(self.deadline, notified)
                    .await
                    .ok()?,
            }
        }
    }

    /// Applies a recorded event and gives the line this watch sees for it (a bookmark as
    /// recorded, when asked for).
    fn recorded_line(&mut self, line: &str) -> String {
        if line.contains("\"BOOKMARK\"") {
            return match self.bookmarks {
                true => format!("{line}\n"),
                false => String::new(),
            };
        }
        let Some(change) = self.nodes.apply_recorded(line) else {
            return String::new();
        };
        self.seen = Some(change.rv);
        watch_line(&change, &self.selector).unwrap_or_default()
    }
}
