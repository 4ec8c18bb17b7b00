//! `tolerable audit`'s cluster, a handler on the one fake API server (`kube_fake`), serving the
//! 23 exchanges recorded from a real kube-apiserver v1.26 in `tests/data/kube-api/workloads/`
//! (a mixed cluster: amd64, arm64 and s390x nodes; Deployments, a StatefulSet, a DaemonSet with a
//! crash-looping Pod on s390x, Jobs, a CronJob, a bare Pod). The recorded image host
//! `registry.test:5000` is replaced by this run's test registry; nothing else is changed.
//!
//! - A request that was recorded (path and parsed query pairs, [`kube_fake::request_key`]) gets the
//!   recorded status and body: the lists, the four real pages of `?&limit=3` with their real
//!   continue tokens, the GETs by name, the 404, the 400 for a malformed token.
//! - A list request no recording answers (another namespace, another `limit`, a selector) is
//!   derived from the recorded cluster-wide list by the rules the recorded pages show
//!   ([`super::kube_pages`]: etcd key order, real-format continue tokens, `remainingItemCount`,
//!   the first page's revision on every page); a list that fits in one page is the recorded
//!   body itself when one was recorded for the same path and selector. A ServiceAccount GET is
//!   answered from the recorded list.
//! - Refused as the real one refuses: a continue token it did not write (400, the recorded
//!   body for the recorded malformed token), a continue token with a `resourceVersion` (400),
//!   a token whose revision was compacted (410 Expired, the recorded body; see
//!   [`WorkloadsApi::expire_continue_tokens`]), `nobodytoken` (the recorded 403), any other
//!   token (the recorded 401), an unknown path (404).
//! - Namespaces (`GET /api/v1/namespaces`, which audit lists for their policy): the Namespaces
//!   recorded with the same names (`team-a`, `team-b`, `batch`) in
//!   `tests/data/kube-api/namespaces/` — metadata only when asked with the metadata Accept
//!   header, else whole — and that recording's 403 for `nobodytoken`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::kube_fake::{self, bad_request, request_key, status as respond, Req, Running};
use super::kube_pages::{self, Continue, ListQuery, Refused};

/// The recorded lists' revision (every recorded list says `"resourceVersion":"301"`).
const RECORDED_REVISION: i64 = 301;

pub struct WorkloadsApi {
    pub port: u16,
    api: Running,
    state: Arc<State>,
}

struct State {
    registry_host: String,
    /// [`request_key`] → (status, body), the `admintoken` exchanges but the 410.
    recorded: HashMap<String, (u16, String)>,
    /// etcd's current revision, moved on by a compaction.
    revision: AtomicI64,
    /// Tokens of a revision below this one are expired.
    compacted: AtomicI64,
    /// How many of the next continue requests find their token compacted first.
    expire_next: AtomicUsize,
}

fn recording(name: &str, registry_host: &str) -> String {
    kube_fake::recording(&format!("workloads/{name}")).replace("registry.test:5000", registry_host)
}

/// The recorded `admintoken` exchanges (`index.json`), but the 410: its request is page 2's,
/// answered so only after a compaction.
fn recorded_exchanges(registry_host: &str) -> HashMap<String, (u16, String)> {
    kube_fake::exchanges("workloads")
        .into_iter()
        .filter(|e| e.token.as_deref() == Some("admintoken") && e.status != 410)
        .map(|e| {
            let body = String::from_utf8(e.body.to_vec()).unwrap();
            let body = body.replace("registry.test:5000", registry_host);
            let (path, query) = e
                .path_and_query
                .split_once('?')
                .unwrap_or((&e.path_and_query, ""));
            (request_key(path, query), (e.status, body))
        })
        .collect()
}

fn not_found(what: &str) -> Response<Full<Bytes>> {
    respond(
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": format!("{what} not found"), "reason": "NotFound", "code": 404})
        .to_string(),
    )
}

/// The recorded cluster-wide list of `plural`.
fn list_file(plural: &str) -> Option<&'static str> {
    Some(match plural {
        "deployments" => "deployment-list.body.json",
        "statefulsets" => "statefulset-list.body.json",
        "daemonsets" => "daemonset-list.body.json",
        "replicasets" => "replicaset-list.body.json",
        "jobs" => "job-list.body.json",
        "cronjobs" => "cronjob-list.body.json",
        "pods" => "pod-list.body.json",
        "nodes" => "node-list.body.json",
        "serviceaccounts" => "sa-list.body.json",
        _ => return None,
    })
}

/// A recorded list: its kind and apiVersion, and its items (key, text as recorded) in etcd
/// key order.
pub struct RecordedList {
    pub kind: String,
    pub api_version: String,
    pub items: Vec<(String, String)>,
}

impl RecordedList {
    pub fn read(file: &str, registry_host: &str) -> Self {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct List {
            kind: String,
            api_version: String,
            items: Vec<Box<RawValue>>,
        }
        let list: List = serde_json::from_str(&recording(file, registry_host)).unwrap();
        let mut items: Vec<(String, String)> = list
            .items
            .into_iter()
            .map(|raw| {
                let value: Value = serde_json::from_str(raw.get()).unwrap();
                (kube_pages::key_of(&value), raw.get().to_owned())
            })
            .collect();
        items.sort_by(|a, b| a.0.cmp(&b.0));
        Self {
            kind: list.kind,
            api_version: list.api_version,
            items,
        }
    }
}

fn matches(item: &str, namespace: Option<&str>, selector: &[(String, String)]) -> bool {
    let item: Value = serde_json::from_str(item).unwrap();
    let meta = &item["metadata"];
    namespace.is_none_or(|ns| meta["namespace"] == ns)
        && selector
            .iter()
            .all(|(k, v)| meta["labels"][k] == v.as_str())
}

/// A ServiceAccount by name, from the recorded list (a GET by name carries kind and apiVersion).
fn service_account(namespace: &str, name: &str, host: &str) -> Response<Full<Bytes>> {
    let list: Value = serde_json::from_str(&recording("sa-list.body.json", host)).unwrap();
    let found = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|sa| sa["metadata"]["namespace"] == namespace && sa["metadata"]["name"] == name);
    match found {
        Some(sa) => {
            let mut sa = sa.clone();
            sa["kind"] = json!("ServiceAccount");
            sa["apiVersion"] = json!("v1");
            respond(StatusCode::OK, sa.to_string())
        }
        None => not_found(&format!("serviceaccounts \"{name}\"")),
    }
}

impl State {
    fn recorded(&self, path: &str, query: &str) -> Option<Response<Full<Bytes>>> {
        let (status, body) = self.recorded.get(&request_key(path, query))?;
        Some(respond(
            StatusCode::from_u16(*status).unwrap(),
            body.clone(),
        ))
    }

    /// The revision a continue token may go on at, or why not.
    fn go_on(&self, token: &str) -> Result<i64, Box<Response<Full<Bytes>>>> {
        let token = Continue::decode(token)
            .map_err(|Refused::BadRequest(why)| Box::new(bad_request(&why)))?;
        let compact = self
            .expire_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if compact {
            // etcd compacted at its current revision; the next write moves it on.
            let now = self.revision.fetch_add(1, Ordering::SeqCst);
            self.compacted.store(now + 1, Ordering::SeqCst);
        }
        if token.revision < self.compacted.load(Ordering::SeqCst) {
            let body = recording("pod-list-continue-expired-410.body.json", "");
            return Err(Box::new(respond(StatusCode::GONE, body)));
        }
        Ok(token.revision)
    }

    fn list(
        &self,
        path: &str,
        plural: &str,
        namespace: Option<&str>,
        query: &str,
    ) -> Response<Full<Bytes>> {
        let Some(file) = list_file(plural) else {
            return not_found(path);
        };
        let asked = match ListQuery::parse(query) {
            Ok(asked) => asked,
            Err(Refused::BadRequest(why)) => return bad_request(&why),
        };
        if let Some((400, _)) = self.recorded.get(&request_key(path, query)) {
            // The recorded refusal, in the API server's own words.
            return self.recorded(path, query).unwrap();
        }
        let revision = match asked.continue_token.as_deref().map(|t| self.go_on(t)) {
            Some(Err(refused)) => return *refused,
            Some(Ok(revision)) => revision,
            None => self.revision.load(Ordering::SeqCst),
        };
        let now = self.revision.load(Ordering::SeqCst);
        if now == RECORDED_REVISION {
            if let Some(recorded) = self.recorded(path, query) {
                return recorded;
            }
        }
        let mut list = RecordedList::read(file, &self.registry_host);
        list.items
            .retain(|(_, item)| matches(item, namespace, &asked.selector));
        let after = asked
            .continue_token
            .as_deref()
            .map(|t| Continue::decode(t).unwrap().after);
        let page = kube_pages::page(&list.items, asked.limit, after.as_deref(), revision);
        if page.more.is_none() && after.is_none() && now == RECORDED_REVISION {
            // All of it in one page: what the same request without `limit` got.
            let selector = query
                .split('&')
                .find(|p| p.starts_with("labelSelector="))
                .map_or(String::new(), |p| format!("&{p}"));
            if let Some(recorded) = self.recorded(path, &selector) {
                return recorded;
            }
        }
        let body = kube_pages::list_body(&list.kind, &list.api_version, revision, &page);
        respond(StatusCode::OK, body)
    }

    fn answer(
        &self,
        path: &str,
        query: Option<&str>,
        token: Option<&str>,
    ) -> Response<Full<Bytes>> {
        let host = &self.registry_host;
        match token {
            Some("admintoken") => {}
            Some("nobodytoken") => {
                return respond(
                    StatusCode::FORBIDDEN,
                    recording("deployment-list-403.body.json", host),
                )
            }
            _ => return respond(StatusCode::UNAUTHORIZED, kube_fake::recording(UNAUTHORIZED)),
        }
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let (namespace, rest) = match parts[..] {
            ["api", "v1", "namespaces", ns, ref rest @ ..] => (Some(ns), rest),
            ["apis", _, _, "namespaces", ns, ref rest @ ..] => (Some(ns), rest),
            ["api", "v1", ref rest @ ..] | ["apis", _, _, ref rest @ ..] => (None, rest),
            _ => return self.recorded(path, "").unwrap_or_else(|| not_found(path)),
        };
        match (namespace, rest, query) {
            (namespace, [plural], Some(query)) => self.list(path, plural, namespace, query),
            (Some(ns), ["serviceaccounts", name], None) => service_account(ns, name, host),
            (Some(_), ["secrets", name], None) => not_found(&format!("secrets \"{name}\"")),
            (_, [plural, name], None) => self
                .recorded(path, "")
                .unwrap_or_else(|| not_found(&format!("{plural} \"{name}\""))),
            _ => not_found(path),
        }
    }
}

/// The recorded 401 (the top-level recording's: the workloads were not recorded with a token
/// the server did not know).
const UNAUTHORIZED: &str = "secret-regcred-get-401.body.json";

/// The recorded Namespace list (metadata only when asked so), or its 403.
fn namespaces(req: &Req) -> Response<Full<Bytes>> {
    let read = |name: &str| kube_fake::recording(&format!("namespaces/{name}"));
    let metadata = req
        .header("accept")
        .contains("as=PartialObjectMetadataList");
    match req.token() {
        Some("admintoken") if metadata => {
            respond(StatusCode::OK, read("namespace-list-metadata.body.json"))
        }
        Some("admintoken") => respond(StatusCode::OK, read("namespace-list.body.json")),
        Some("nobodytoken") => respond(StatusCode::FORBIDDEN, read("namespace-list-403.body.json")),
        _ => respond(StatusCode::UNAUTHORIZED, kube_fake::recording(UNAUTHORIZED)),
    }
}

impl WorkloadsApi {
    pub fn start(registry_host: &str) -> Self {
        let state = Arc::new(State {
            registry_host: registry_host.to_owned(),
            recorded: recorded_exchanges(registry_host),
            revision: AtomicI64::new(RECORDED_REVISION),
            compacted: AtomicI64::new(0),
            expire_next: AtomicUsize::new(0),
        });
        let serving = state.clone();
        let api = kube_fake::FakeApi::new()
            .handler(Arc::new(move |req: &Req| {
                let answer = match req.path.as_str() {
                    "/api/v1/namespaces" => namespaces(req),
                    path => {
                        let query = req.has_query.then_some(req.raw_query.as_str());
                        serving.answer(path, query, req.token())
                    }
                };
                kube_fake::ready(kube_fake::full(answer))
            }))
            .start();
        Self {
            port: api.port,
            api,
            state,
        }
    }

    /// A kubeconfig for this server with `token`.
    pub fn kubeconfig(&self, token: &str) -> tempfile::NamedTempFile {
        kube_fake::kubeconfig(self.port, token)
    }

    /// Paths (with queries) requested so far.
    pub fn requests(&self) -> Vec<String> {
        self.api.requests_with_query()
    }

    /// Each of the next `n` requests with a continue token comes after an etcd compaction
    /// (as the recorder did for the 410): its token is expired and it gets the recorded 410
    /// Expired; a list started afresh is at the new revision, and its tokens hold.
    pub fn expire_continue_tokens(&self, n: usize) {
        self.state.expire_next.store(n, Ordering::SeqCst);
    }
}
