//! The cluster of most tests, a handler on the one fake API server (`kube_fake`), serving the
//! GET responses recorded from a real kube-apiserver v1.24 in
//! `tests/data/kube-api/` (namespace `team-a`: secrets `regcred`, `legacy`, `broken-shape`;
//! service accounts `default`, `builder`, `multi`). The only change made to a recording: the
//! registry hosts inside the recorded pull secrets point at this run's test registries.
//! Nodes: `GET /api/v1/nodes` lists amd-1, arm-1 (tainted arm64), s390-1 (tainted s390x) and
//! bare-1; the first watch streams the recorded events (arm-2 added, modified, deleted, …), later
//! watches stay quiet for a few seconds and end, as an idle watch does; `GET
//! /api/v1/nodes/NAME` and JSON Patches on Nodes act on the same Nodes (a failed `test` is the
//! recorded 422, a missing Node the recorded 404).
//! Events (`POST`, core/v1 and events.k8s.io/v1) as `events_api` answers them (v1.36's
//! recordings in `tests/data/kube-api/crashes/`), for `admintoken` only.
//! Leases as `lease_api` answers them ([`FakeApiServer::leases`]), for a replica that elects.
//! Tokens: `admintoken` may read everything, `teamatoken` only in namespace team-a (as a
//! RoleBinding there grants), `nobodytoken` nothing (403), any other gets 401.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};

use super::crashes_api::Crashes;
use super::events_api::Events;
use super::kube_fake::Body;
use super::kube_fake::{full, recording, status, unrecorded, FakeApi, Req, Running};
use super::lease_api::Leases;
use super::node_api::Nodes;

/// Registry hosts in the recordings → this run's.
pub struct RegistryHosts {
    /// Where `127.0.0.1:25001` (the recording's Basic-auth registry) is now.
    pub basic: String,
    /// Where `127.0.0.1:25444` (the recording's token registry) is now.
    pub token: String,
}

pub struct FakeApiServer {
    pub port: u16,
    api: Running,
    state: Arc<State>,
    /// The Leases (`lease_api`), for a replica that elects its leader here.
    pub leases: Leases,
}

/// The cluster's mutable part: Nodes (`node_api`) and whether the webhook is registered.
struct State {
    nodes: Arc<Nodes>,
    webhook_registered: std::sync::atomic::AtomicBool,
    /// Events created (`events_api`: core/v1 and events.k8s.io/v1, as recorded).
    events: Events,
    /// The recorded crash's reads (`crashes_api`), when started with it.
    crashes: Option<Crashes>,
}

impl State {
    fn new(nodes: Nodes) -> Self {
        Self {
            nodes: Arc::new(nodes),
            webhook_registered: std::sync::atomic::AtomicBool::new(true),
            events: Events::default(),
            crashes: None,
        }
    }
}

/// A token's answer where only `admintoken` may read (Nodes, webhook configurations): none for
/// it, the recorded 403 for the known tokens without that right (`verb` on `what`), the
/// recorded 401 for any other.
fn cluster_scoped_refusal(
    token: Option<&str>,
    verb: &str,
    what: &str,
) -> Option<Response<Full<Bytes>>> {
    match token {
        Some("admintoken") => None,
        Some("nobodytoken" | "teamatoken") => {
            let body = recording("node-list-403.body.json").replace(
                "cannot list resource \\\"nodes\\\"",
                &format!("cannot {verb} resource \\\"{what}\\\""),
            );
            Some(status(StatusCode::FORBIDDEN, body))
        }
        _ => Some(status(
            StatusCode::UNAUTHORIZED,
            recording("secret-regcred-get-401.body.json"),
        )),
    }
}

/// The recorded Secret with its docker config pointed at this run's registries.
fn secret(name: &str, hosts: &RegistryHosts) -> String {
    let mut secret: serde_json::Value =
        serde_json::from_str(&recording(&format!("secret-{name}-get.body.json"))).unwrap();
    let engine = base64::engine::general_purpose::STANDARD;
    for value in secret["data"].as_object_mut().unwrap().values_mut() {
        let decoded = String::from_utf8(engine.decode(value.as_str().unwrap()).unwrap()).unwrap();
        let moved = decoded
            .replace("127.0.0.1:25001", &hosts.basic)
            .replace("127.0.0.1:25444", &hosts.token);
        *value = serde_json::Value::String(engine.encode(moved));
    }
    secret.to_string()
}

fn answer(path: &str, token: Option<&str>, hosts: &RegistryHosts) -> Response<Full<Bytes>> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let ["api", "v1", "namespaces", namespace, kind @ ("secrets" | "serviceaccounts"), name] =
        parts[..]
    else {
        return unrecorded(&format!("GET {path}"));
    };
    match token {
        Some("admintoken") => {}
        // RoleBindings in team-a only (kustomize/components/namespaced-pull-secrets).
        Some("teamatoken") if namespace == "team-a" => {}
        Some("nobodytoken" | "teamatoken") => {
            let body = if kind == "secrets" {
                recording("secret-regcred-get-403.body.json")
                    .replace("\\\"regcred\\\"", &format!("\\\"{name}\\\""))
            } else {
                recording("sa-builder-get-403.body.json")
                    .replace("\\\"builder\\\"", &format!("\\\"{name}\\\""))
            };
            return status(
                StatusCode::FORBIDDEN,
                body.replace("\"name\":\"regcred\"", &format!("\"name\":\"{name}\""))
                    .replace("\\\"team-a\\\"", &format!("\\\"{namespace}\\\"")),
            );
        }
        _ => {
            return status(
                StatusCode::UNAUTHORIZED,
                recording("secret-regcred-get-401.body.json"),
            )
        }
    }
    let known = namespace == "team-a";
    match kind {
        "secrets" if known && ["regcred", "legacy", "broken-shape"].contains(&name) => {
            status(StatusCode::OK, secret(name, hosts))
        }
        "serviceaccounts" if known && ["default", "builder", "multi"].contains(&name) => status(
            StatusCode::OK,
            recording(&format!("sa-{name}-get.body.json")),
        ),
        "secrets" => status(
            StatusCode::NOT_FOUND,
            recording("secret-missing-get-404.body.json").replace("missing", name),
        ),
        _ => status(
            StatusCode::NOT_FOUND,
            recording("sa-missing-get-404.body.json").replace("missing", name),
        ),
    }
}

/// One request: Nodes to `node_api`, the webhook configuration, the recorded Secrets and
/// ServiceAccounts; anything else is unrecorded.
async fn route(state: Arc<State>, hosts: Arc<RegistryHosts>, req: Req) -> Response<Body> {
    let token = req.token().map(str::to_owned);
    let (method, path) = (req.method.clone(), req.path.clone());
    let query = req.raw_query.clone();
    let content_type = req.header("content-type").to_owned();
    let body = req.body;
    let mwc = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/";
    let node = path.strip_prefix("/api/v1/nodes/");
    let verb = match (&method, node, query.contains("watch=")) {
        (&hyper::Method::PATCH, ..) => "patch",
        (_, Some(_), _) => "get",
        (_, None, true) => "watch",
        _ => "list",
    };
    if path == "/api/v1/nodes" || node.is_some() || path.starts_with(mwc) {
        let what = if path.starts_with(mwc) {
            "mutatingwebhookconfigurations"
        } else {
            "nodes"
        };
        if let Some(refused) = cluster_scoped_refusal(token.as_deref(), verb, what) {
            return full(refused);
        }
    }
    let asked = (
        &method,
        path.as_str(),
        query.as_str(),
        content_type.as_str(),
    );
    if let Some(answer) = crash_answer(&state, asked, &body, token.as_deref()) {
        return answer;
    }
    if let Some((code, answer)) = state.events.answer(method.as_str(), &path, &body) {
        if let Some(refused) = cluster_scoped_refusal(token.as_deref(), "create", "events") {
            return full(refused);
        }
        let code = StatusCode::from_u16(code).unwrap();
        return full(status(code, answer.to_string()));
    }
    match (&method, node) {
        (&hyper::Method::GET, _) if path == "/api/v1/nodes" => {
            state.nodes.list_or_watch(&query).await
        }
        (&hyper::Method::GET, Some(name)) => full(state.nodes.get(name)),
        (&hyper::Method::PATCH, Some(name)) => {
            full(state.nodes.patch(name, &content_type, &query, &body))
        }
        (&hyper::Method::GET, _) if path.starts_with(mwc) => {
            full(webhook_configuration(&state, &path[mwc.len()..]))
        }
        (&hyper::Method::GET, _) => full(answer(&path, token.as_deref(), &hosts)),
        _ => full(unrecorded(&format!("{method} {path}"))),
    }
}

/// The recorded crash's reads (GET) and the crashed Pod's deletes (`crashes_api`), when the
/// fake serves them and `token` may.
fn crash_answer(
    state: &State,
    (method, path, query, content_type): (&hyper::Method, &str, &str, &str),
    body: &[u8],
    token: Option<&str>,
) -> Option<Response<Body>> {
    let crashes = state.crashes.as_ref()?;
    let (answer, verb) = match *method {
        hyper::Method::GET => (crashes.answer(path, query)?, "get"),
        hyper::Method::DELETE => (crashes.delete(path, body)?, "delete"),
        hyper::Method::PATCH => (crashes.patch(path, content_type, body)?, "patch"),
        _ => return None,
    };
    match cluster_scoped_refusal(token, verb, "pods") {
        Some(refused) => Some(full(refused)),
        None => Some(answer),
    }
}

/// `GET …/mutatingwebhookconfigurations/NAME`: the recorded one, or the recorded 404.
fn webhook_configuration(state: &State, name: &str) -> Response<Full<Bytes>> {
    if name == "tolerable" && state.webhook_registered.load(Ordering::SeqCst) {
        status(StatusCode::OK, recording("mwc-tolerable-get.body.json"))
    } else {
        status(
            StatusCode::NOT_FOUND,
            recording("mwc-missing-get-404.body.json").replace("missing", name),
        )
    }
}

impl FakeApiServer {
    pub fn start(hosts: RegistryHosts) -> Self {
        Self::start_with(hosts, Duration::ZERO)
    }

    /// As [`FakeApiServer::start`]; the node list is answered only after `list_delay`.
    pub fn start_with(hosts: RegistryHosts, list_delay: Duration) -> Self {
        Self::start_state(hosts, State::new(Nodes::new(list_delay, None)))
    }

    /// A cluster whose tainted pools are scaled to zero: the list has only the amd64 nodes
    /// (amd-1, bare-1); the first watch then sends the recorded events (arm-2 added, modified,
    /// bare-1 modified, arm-2 deleted, a bookmark) one per [`FakeApiServer::release_events`].
    pub fn start_scaled_to_zero(hosts: RegistryHosts) -> Self {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let nodes = Nodes::new(Duration::ZERO, Some(gate));
        nodes.retain(|name| name == "amd-1" || name == "bare-1");
        Self::start_state(hosts, State::new(nodes))
    }

    /// [`FakeApiServer::start`], also serving the recorded crash's reads (`crashes_api`).
    pub fn start_with_crashes(hosts: RegistryHosts, crashes: Crashes) -> Self {
        let mut state = State::new(Nodes::new(Duration::ZERO, None));
        state.crashes = Some(crashes);
        Self::start_state(hosts, state)
    }

    /// Lets the gated watch send `n` more recorded events.
    pub fn release_events(&self, n: usize) {
        if let Some(gate) = &self.state.nodes.gate {
            gate.add_permits(n);
        }
    }

    fn start_state(hosts: RegistryHosts, state: State) -> Self {
        let hosts = Arc::new(hosts);
        let state = Arc::new(state);
        let shared = state.clone();
        let leases = Leases::default();
        let api = FakeApi::new()
            .handler(leases.handler())
            .handler(Arc::new(move |req: &Req| {
                Some(Box::pin(route(shared.clone(), hosts.clone(), req.clone())))
            }))
            .start();
        Self {
            port: api.port,
            api,
            state,
            leases,
        }
    }

    /// The Events created, as answered.
    pub fn events(&self) -> Vec<serde_json::Value> {
        self.state.events.created()
    }

    /// Waits until `done` holds of the Events created (checked on every creation), at most
    /// `limit` — the bound a test gives what it waits for, never a sleep it orders by.
    pub async fn wait_for_events(
        &self,
        limit: Duration,
        mut done: impl FnMut(&[serde_json::Value]) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.state.events.changed.notified();
            if done(&self.events()) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return done(&self.events());
            }
        }
    }

    /// Whether `GET …/mutatingwebhookconfigurations/tolerable` finds the webhook.
    pub fn set_webhook_registered(&self, registered: bool) {
        self.state
            .webhook_registered
            .store(registered, Ordering::SeqCst);
    }

    /// A Node as the fake holds it now.
    pub fn node(&self, name: &str) -> serde_json::Value {
        self.state.nodes.node(name)
    }

    /// A real `kube` client for this server, authenticating with `token`.
    pub fn client(&self, token: &str) -> kube::Client {
        self.api.client(token)
    }

    /// The bodies of the crashed Pod's DELETEs so far (`crashes_api`).
    pub fn crash_deletes(&self) -> Vec<serde_json::Value> {
        self.state
            .crashes
            .as_ref()
            .map(Crashes::deletes)
            .unwrap_or_default()
    }

    /// The crashed Pod's JSON Patches so far (`crashes_api`).
    pub fn crash_patches(&self) -> Vec<serde_json::Value> {
        self.state
            .crashes
            .as_ref()
            .map(Crashes::patches)
            .unwrap_or_default()
    }

    /// Paths requested so far.
    pub fn requests(&self) -> Vec<String> {
        self.api.requests()
    }
}
