//! A large cluster, a handler on the one fake API server (`kube_fake`): `n` Nodes shaped exactly like the recorded EKS
//! Node in `tests/data/kube-api/scale/` (about 18 KB of JSON each: 15 labels, a kubelet status
//! with 50 images, managed fields), with names, addresses and IDs varied as
//! `make_nodes.py` does, served as a real kube-apiserver v1.36 serves them to kube-runtime's
//! watcher: `GET /api/v1/nodes?limit=…` paged with opaque continue tokens shaped like the
//! recorded ones (a malformed token is a 400, as the real server answers), and a watch that
//! streams whole Nodes again for every change the test makes (kubelet heartbeats, labels,
//! taints), each event as a real watch line — a watcher that falls a whole buffer behind has its
//! watch ended, never an event skipped; the recorded Namespaces, for the namespace watch the
//! shipped config runs; and one recorded pull secret (`team-a/regcred`), every other Secret and
//! ServiceAccount the recorded 404. Anything else is the one server's 501.
//!
//! Nodes are generated on the fly from the recording, so the fake holds no copy of the
//! cluster: a 15,000-Node list costs this process one page at a time.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::kube_fake::{self, full, recording, status, Answer, Body, FakeApi, Req, Running};

/// What the test changed on one Node since it was created.
#[derive(Clone, Default)]
struct Changes {
    heartbeats: u64,
    labels: BTreeMap<String, String>,
    taints: Option<Value>,
}

struct State {
    template: Value,
    count: usize,
    arm: usize,
    resource_version: AtomicU64,
    changes: Mutex<BTreeMap<usize, Changes>>,
    events: tokio::sync::broadcast::Sender<Bytes>,
    watches: AtomicUsize,
    lists: AtomicUsize,
}

pub struct ScaleApiServer {
    pub port: u16,
    api: Running,
    state: Arc<State>,
}

/// The name `make_nodes.py` gives Node `i`.
pub fn node_name(i: usize) -> String {
    format!(
        "ip-10-{}-{}-{}.ec2.internal",
        i / 65536 % 256,
        i / 256 % 256,
        i % 256
    )
}

impl State {
    fn is_arm(&self, i: usize) -> bool {
        i < self.arm
    }

    /// Node `i` as the API server would send it now.
    fn node(&self, i: usize, changes: &Changes, rv: u64) -> Value {
        let mut node = self.template.clone();
        let arch = if self.is_arm(i) { "arm64" } else { "amd64" };
        let name = node_name(i);
        let zone = ["us-east-1a", "us-east-1b", "us-east-1c"][i % 3];
        let itype = if self.is_arm(i) {
            "m7g.2xlarge"
        } else {
            "m7i.2xlarge"
        };
        let meta = &mut node["metadata"];
        meta["name"] = json!(name);
        meta["uid"] = json!(format!("f03f33c3-c7f4-4d5d-870c-{i:012x}"));
        meta["resourceVersion"] = json!(rv.to_string());
        let labels = &mut meta["labels"];
        for key in ["kubernetes.io/arch", "beta.kubernetes.io/arch"] {
            labels[key] = json!(arch);
        }
        labels["kubernetes.io/hostname"] = json!(name);
        for key in [
            "beta.kubernetes.io/instance-type",
            "node.kubernetes.io/instance-type",
        ] {
            labels[key] = json!(itype);
        }
        labels["eks.amazonaws.com/nodegroup"] = json!(format!("ng-{arch}-{}", i % 7));
        for key in [
            "topology.kubernetes.io/zone",
            "failure-domain.beta.kubernetes.io/zone",
            "topology.ebs.csi.aws.com/zone",
        ] {
            labels[key] = json!(zone);
        }
        for (key, value) in &changes.labels {
            labels[key] = json!(value);
        }
        meta["annotations"]["csi.volume.kubernetes.io/nodeid"] =
            json!(format!("{{\"ebs.csi.aws.com\": \"i-0{i:016x}\"}}"));
        node["spec"]["providerID"] = json!(format!("aws:///{zone}/i-0{i:016x}"));
        node["spec"]["taints"] = changes.taints.clone().unwrap_or_else(|| {
            if self.is_arm(i) {
                json!([{"key": "kubernetes.io/arch", "value": "arm64", "effect": "NoSchedule"}])
            } else {
                json!([])
            }
        });
        let status = &mut node["status"];
        status["addresses"] = json!([
            {"type": "InternalIP", "address": format!("10.0.{}.{}", i / 256 % 256, i % 256)},
            {"type": "Hostname", "address": name},
            {"type": "InternalDNS", "address": name},
        ]);
        let info = &mut status["nodeInfo"];
        info["architecture"] = json!(arch);
        info["machineID"] = json!(format!("{i:032x}"));
        info["systemUUID"] = json!(format!("ec2{i:029x}"));
        info["bootID"] = json!(format!("{i:08x}-aaaa-bbbb-cccc-{i:012x}"));
        let beat = format!(
            "2026-11-24T{:02}:{:02}:{:02}Z",
            10 + changes.heartbeats / 3600 % 12,
            changes.heartbeats / 60 % 60,
            changes.heartbeats % 60
        );
        for condition in status["conditions"].as_array_mut().into_iter().flatten() {
            condition["lastHeartbeatTime"] = json!(beat);
        }
        node
    }

    fn changes(&self, i: usize) -> Changes {
        self.changes
            .lock()
            .unwrap()
            .get(&i)
            .cloned()
            .unwrap_or_default()
    }

    /// One page of the list from `start`, as the real server pages (`limit`, a continue token
    /// naming the last Node sent and the list's resourceVersion, `remainingItemCount`).
    fn page(&self, start: usize, limit: usize, rv: u64) -> String {
        let end = (start + limit).min(self.count);
        let mut body = String::with_capacity((end - start) * 19_000 + 256);
        body.push_str(r#"{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":""#);
        body.push_str(&rv.to_string());
        body.push('"');
        if end < self.count {
            let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{}\u{0}", node_name(end - 1))});
            let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string());
            body.push_str(&format!(
                r#","continue":"{token}","remainingItemCount":{}"#,
                self.count - end
            ));
        }
        body.push_str(r#"},"items":["#);
        for i in start..end {
            if i > start {
                body.push(',');
            }
            let node = self.node(i, &self.changes(i), rv);
            body.push_str(&node.to_string());
        }
        body.push_str("]}");
        body
    }

    /// Where a continue token says the next page starts, or why the real server refuses it.
    fn resume(&self, token: &str) -> Result<(usize, u64), String> {
        let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|e| format!("continue key is not valid: {e}"))?;
        let key: Value = serde_json::from_slice(&decoded)
            .map_err(|e| format!("continue key is not valid: {e}"))?;
        let rv = key["rv"]
            .as_u64()
            .ok_or("continue key is not valid: no rv")?;
        let start = key["start"].as_str().ok_or("continue key is not valid")?;
        let last = start.trim_end_matches('\u{0}');
        let i = (0..self.count)
            .find(|&i| node_name(i) == last)
            .ok_or("continue key is not valid: no such start")?;
        Ok((i + 1, rv))
    }
}

/// The API server's 400 Status, with `message`.
fn bad_request(message: &str) -> Response<Body> {
    full(kube_fake::bad_request(message))
}

async fn nodes(state: Arc<State>, query: BTreeMap<String, String>) -> Response<Body> {
    if matches!(query.get("watch").map(String::as_str), Some("1" | "true")) {
        return watch(&state);
    }
    state.lists.fetch_add(1, Ordering::SeqCst);
    let limit = match query.get("limit").map(|l| l.parse::<usize>()) {
        None => state.count.max(1),
        Some(Ok(l)) if l > 0 => l,
        Some(_) => return bad_request("limit must be a positive integer"),
    };
    let (start, rv) = match query.get("continue") {
        Some(token) => match state.resume(token) {
            Ok(at) => at,
            Err(why) => return bad_request(&why),
        },
        None => (0, state.resource_version.load(Ordering::SeqCst)),
    };
    let page = state.page(start, limit, rv);
    let mut response = Response::new(Full::new(Bytes::from(page)).boxed_unsync());
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

/// The Namespaces, for tolerable's namespace watch (on by default): the recorded list
/// (`tests/data/kube-api/namespaces/`: a few with policy labels and annotations), in the
/// metadata-only form when asked so; a watch that stays open with no change.
fn namespaces(query: &BTreeMap<String, String>, metadata_only: bool) -> Response<Body> {
    let body = if matches!(query.get("watch").map(String::as_str), Some("1" | "true")) {
        StreamBody::new(futures_util::stream::pending::<
            Result<Frame<Bytes>, Infallible>,
        >())
        .boxed_unsync()
    } else {
        let name = match metadata_only {
            true => "namespace-list-metadata.body.json",
            false => "namespace-list.body.json",
        };
        Full::new(Bytes::from(recording(&format!("namespaces/{name}")))).boxed_unsync()
    };
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

/// The one pull secret served: `team-a/regcred`, as the recorded Secret (`tests/data/kube-api/`),
/// the secret the recorded ReplicaSet-shaped Pod names (`benches/real_path.rs`); every other
/// Secret and ServiceAccount is a 404, as for a ServiceAccount the controller has not made yet.
const REGCRED_PATH: &str = "/api/v1/namespaces/team-a/secrets/regcred";

/// `GET` of Secret or ServiceAccount `name`: the recorded one for [`REGCRED_PATH`], else the
/// recorded 404.
fn secret_or_account(path: &str) -> Option<Response<Body>> {
    if path == REGCRED_PATH {
        let body = recording("secret-regcred-get.body.json");
        return Some(full(status(StatusCode::OK, body)));
    }
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let (file, name) = match rest.split('/').collect::<Vec<_>>()[..] {
        [_, "secrets", name] => ("secret-missing-get-404.body.json", name),
        [_, "serviceaccounts", name] => ("sa-missing-get-404.body.json", name),
        _ => return None,
    };
    let body = recording(file).replace("missing", name);
    Some(full(status(StatusCode::NOT_FOUND, body)))
}

/// One request: only `admintoken` may read (the recorded 401 else).
fn route(state: &Arc<State>, req: &Req) -> Option<Answer> {
    if req.token() != Some("admintoken") {
        return kube_fake::ready(kube_fake::unauthorized());
    }
    if req.method != hyper::Method::GET {
        return None;
    }
    match req.path.as_str() {
        "/api/v1/nodes" => Some(Box::pin(nodes(state.clone(), req.query.clone()))),
        "/api/v1/namespaces" => {
            let metadata_only = req
                .header("accept")
                .contains("as=PartialObjectMetadataList");
            kube_fake::ready(namespaces(&req.query, metadata_only))
        }
        path => kube_fake::ready(secret_or_account(path)?),
    }
}

/// A watch: every change the test makes from now on, one line each, until the test ends.
fn watch(state: &State) -> Response<Body> {
    let events = state.events.subscribe();
    state.watches.fetch_add(1, Ordering::SeqCst);
    let lines = futures_util::stream::unfold(events, |mut events| async move {
        // A watcher that fell a whole buffer behind (`Lagged`): the real server closes its
        // watch ("Forcing watcher close due to unresponsiveness") rather than skip events, and
        // the client lists again; so does this fake, never sending a gap.
        let line = events.recv().await.ok()?;
        Some((Ok::<_, Infallible>(Frame::data(line)), events))
    });
    let mut response = Response::new(StreamBody::new(lines).boxed_unsync());
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

impl ScaleApiServer {
    /// `count` Nodes, the first `arm` of them arm64 and tainted `kubernetes.io/arch=arm64:NoSchedule`.
    pub fn start(count: usize, arm: usize) -> Self {
        Self::start_with_watch_buffer(count, arm, 4096)
    }

    /// As [`ScaleApiServer::start`], each watch holding at most `buffer` events its client has
    /// not read yet (the real server's per-watcher buffer) before it is ended.
    pub fn start_with_watch_buffer(count: usize, arm: usize, buffer: usize) -> Self {
        super::init();
        let recorded = kube_fake::recorded_json("scale/node-list-limit-2.body.json");
        let state = Arc::new(State {
            template: recorded["items"][0].clone(),
            count,
            arm,
            resource_version: AtomicU64::new(1000),
            changes: Mutex::new(BTreeMap::new()),
            events: tokio::sync::broadcast::channel(buffer).0,
            watches: AtomicUsize::new(0),
            lists: AtomicUsize::new(0),
        });
        let shared = state.clone();
        let api = FakeApi::new()
            .handler(Arc::new(move |req: &Req| route(&shared, req)))
            .start();
        Self {
            port: api.port,
            api,
            state,
        }
    }

    /// A real `kube` client for this server.
    pub fn client(&self) -> kube::Client {
        self.api.client("admintoken")
    }

    /// A kubeconfig file for `tolerable serve`.
    pub fn kubeconfig(&self) -> tempfile::NamedTempFile {
        super::kube_fake::kubeconfig(self.port, "admintoken")
    }

    /// Watches opened so far.
    pub fn watches(&self) -> usize {
        self.state.watches.load(Ordering::SeqCst)
    }

    /// List requests (pages) served so far.
    pub fn lists(&self) -> usize {
        self.state.lists.load(Ordering::SeqCst)
    }

    /// Changes Node `i` with `change` and sends it whole on every open watch, as the API server
    /// does for any change.
    fn modify(&self, i: usize, change: impl FnOnce(&mut Changes)) {
        let rv = self.state.resource_version.fetch_add(1, Ordering::SeqCst) + 1;
        let changes = {
            let mut all = self.state.changes.lock().unwrap();
            let changes = all.entry(i).or_default();
            change(changes);
            changes.clone()
        };
        let mut node = self.state.node(i, &changes, rv);
        node["kind"] = json!("Node");
        node["apiVersion"] = json!("v1");
        let line = format!("{}\n", json!({"type": "MODIFIED", "object": node}));
        let _ = self.state.events.send(Bytes::from(line));
    }

    /// A kubelet status heartbeat: only `lastHeartbeatTime` moves.
    pub fn heartbeat(&self, i: usize) {
        self.modify(i, |c| c.heartbeats += 1);
    }

    pub fn set_label(&self, i: usize, key: &str, value: &str) {
        self.modify(i, |c| {
            c.labels.insert(key.to_owned(), value.to_owned());
        });
    }

    /// Replaces Node `i`'s taints (a JSON array as the API sends it).
    pub fn set_taints(&self, i: usize, taints: Value) {
        self.modify(i, |c| c.taints = Some(taints));
    }
}
