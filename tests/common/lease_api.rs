//! A thin fake of the API server's Leases (`coordination.k8s.io/v1`) for the leader election:
//! `GET`, `POST` and `PUT` of `/apis/coordination.k8s.io/v1/namespaces/NS/leases[/NAME]`, over
//! HTTPS on 127.0.0.1, refusing what a real kube-apiserver refuses, each refusal a `Status`
//! shaped as the recorded ones in `tests/data/kube-api/` (404 `mwc-missing-get-404`, 409
//! `node-amd-1-merge-patch-stale-rv-409`, 422 `secret-broken-create-rejected`, 403
//! `mwc-tolerable-get-403`) with the Lease's name, group and kind:
//! - a missing Lease: 404 NotFound (GET and PUT: Leases are not created by an update);
//! - a second create of the same name: 409 AlreadyExists;
//! - an update carrying a resourceVersion that is not the current one: 409 Conflict (an update
//!   without one is unconditional, as the real server allows for Leases);
//! - a body that is not a Lease, names another object or namespace than the URL: 400;
//!   `leaseDurationSeconds` ≤ 0 or `leaseTransitions` < 0: 422 Invalid;
//! - a token the test refused ([`LeaseApiServer::refuse`]): 403 Forbidden; any other token
//!   but the known ones: 401. Anything else: 404, or 405 for other methods on a Lease.
//! - a token the test cut off ([`LeaseApiServer::hang`]): its requests are read and never
//!   answered, as behind a network partition or an overloaded API server.
//!
//! Every write is applied under one lock, so of two racing updates with the same
//! resourceVersion exactly one wins, as etcd's compare-and-swap makes it on the real server.

use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt as _;
use hyper::{Method, Response, StatusCode};
use serde_json::{json, Value};

use super::kube_api::{self, api_tls, bearer_token, full, status};

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// The tokens this fake knows (any other is a 401).
pub const TOKENS: [&str; 3] = ["replica-a", "replica-b", "replica-c"];

/// One successful write, as the server stored it.
#[derive(Clone, Debug)]
pub struct Write {
    pub method: &'static str,
    pub token: String,
    pub lease: Value,
}

#[derive(Default)]
struct State {
    leases: BTreeMap<(String, String), Value>,
    resource_version: u64,
    writes: Vec<Write>,
}

/// See [`LeaseApiServer::handler`].
pub type LeaseHandler = Arc<
    dyn Fn(
            hyper::Request<hyper::body::Incoming>,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response<Body>> + Send>>
        + Send
        + Sync,
>;

pub struct LeaseApiServer {
    pub port: u16,
    state: Arc<Mutex<State>>,
    refused: Arc<Mutex<HashSet<String>>>,
    hung: Arc<Mutex<HashSet<String>>>,
    requests: Arc<AtomicUsize>,
}

fn recording(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/kube-api")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// A recorded `Status` of `code`, saying `message` (and `reason`) about Lease `name`.
fn refusal_body(code: StatusCode, reason: &str, message: String, name: &str) -> Value {
    let template = match code {
        StatusCode::NOT_FOUND => "mwc-missing-get-404.body.json",
        StatusCode::CONFLICT => "node-amd-1-merge-patch-stale-rv-409.body.json",
        StatusCode::FORBIDDEN => "mwc-tolerable-get-403.body.json",
        _ => "secret-broken-create-rejected.body.json",
    };
    let mut body = recording(template);
    body["message"] = json!(message);
    body["reason"] = json!(reason);
    body["code"] = json!(code.as_u16());
    body["details"] = json!({"name": name, "group": "coordination.k8s.io", "kind": "leases"});
    body
}

fn refusal(code: StatusCode, reason: &str, message: String, name: &str) -> Response<Body> {
    full(status(
        code,
        refusal_body(code, reason, message, name).to_string(),
    ))
}

/// The API server's 400 Status, with `message`.
fn bad_request(message: &str) -> Response<Body> {
    full(kube_api::bad_request(message))
}

fn ok(code: StatusCode, lease: &Value) -> Response<Body> {
    full(status(code, lease.to_string()))
}

/// What the real server's validation says of a Lease spec (`ValidateLeaseSpec`), if anything.
fn invalid(lease: &Value) -> Option<(String, String)> {
    let spec = &lease["spec"];
    if let Some(d) = spec["leaseDurationSeconds"].as_i64().filter(|d| *d <= 0) {
        return Some((
            "spec.leaseDurationSeconds".into(),
            format!("Invalid value: {d}: must be greater than 0"),
        ));
    }
    if let Some(t) = spec["leaseTransitions"].as_i64().filter(|t| *t < 0) {
        return Some((
            "spec.leaseTransitions".into(),
            format!("Invalid value: {t}: must be greater than or equal to 0"),
        ));
    }
    None
}

/// 422 Invalid, as the real server says it: the kind (not the resource) in the details, and
/// the field at fault as the cause.
fn unprocessable(name: &str, field: &str, why: &str) -> Response<Body> {
    let code = StatusCode::UNPROCESSABLE_ENTITY;
    let message = format!("Lease.coordination.k8s.io \"{name}\" is invalid: {field}: {why}");
    let mut body = refusal_body(code, "Invalid", message, name);
    body["details"]["kind"] = json!("Lease");
    body["details"]["causes"] =
        json!([{"reason": "FieldValueInvalid", "message": why, "field": field}]);
    full(status(code, body.to_string()))
}

/// The parts of a Lease URL: namespace and, for one Lease, its name.
fn lease_path(path: &str) -> Option<(String, Option<String>)> {
    let rest = path.strip_prefix("/apis/coordination.k8s.io/v1/namespaces/")?;
    let parts: Vec<&str> = rest.split('/').collect();
    match parts[..] {
        [ns, "leases"] => Some((ns.to_owned(), None)),
        [ns, "leases", name] if !name.is_empty() => Some((ns.to_owned(), Some(name.to_owned()))),
        _ => None,
    }
}

/// A request's body as a Lease for `namespace`, or why the real server would refuse it (400).
fn parse_body(bytes: &[u8], namespace: &str) -> Result<Value, String> {
    let lease: Value = serde_json::from_slice(bytes)
        .map_err(|e| format!("the body of the request was in an unknown format: {e}"))?;
    if lease["kind"] != "Lease" || lease["apiVersion"] != "coordination.k8s.io/v1" {
        return Err(format!(
            "the API version in the data ({}) does not match the expected API version (coordination.k8s.io/v1)",
            lease["apiVersion"]
        ));
    }
    match lease["metadata"]["namespace"].as_str() {
        None | Some("") => {}
        Some(ns) if ns == namespace => {}
        Some(_) => return Err(
            "the namespace of the provided object does not match the namespace sent on the request"
                .into(),
        ),
    }
    Ok(lease)
}

impl State {
    fn store(&mut self, namespace: &str, name: &str, mut lease: Value, created: &str) -> Value {
        self.resource_version += 1;
        let meta = &mut lease["metadata"];
        meta["name"] = json!(name);
        meta["namespace"] = json!(namespace);
        meta["resourceVersion"] = json!(self.resource_version.to_string());
        meta["uid"] = json!(format!("5f1e6c9a-0d1b-4a7e-9c55-{:012x}", name.len()));
        meta["creationTimestamp"] = json!(created);
        self.leases
            .insert((namespace.to_owned(), name.to_owned()), lease.clone());
        lease
    }

    fn create(&mut self, namespace: &str, lease: Value, token: &str) -> Response<Body> {
        let Some(name) = lease["metadata"]["name"].as_str().map(str::to_owned) else {
            return unprocessable(
                "",
                "metadata.name",
                "Required value: name or generateName is required",
            );
        };
        if self
            .leases
            .contains_key(&(namespace.to_owned(), name.clone()))
        {
            return refusal(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("leases.coordination.k8s.io \"{name}\" already exists"),
                &name,
            );
        }
        if let Some((field, why)) = invalid(&lease) {
            return unprocessable(&name, &field, &why);
        }
        let stored = self.store(namespace, &name, lease, "2026-11-24T21:00:00Z");
        self.writes.push(Write {
            method: "POST",
            token: token.to_owned(),
            lease: stored.clone(),
        });
        ok(StatusCode::CREATED, &stored)
    }

    fn update(&mut self, namespace: &str, name: &str, lease: Value, token: &str) -> Response<Body> {
        let body_name = lease["metadata"]["name"].as_str().unwrap_or("");
        if body_name != name {
            return bad_request(&format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            ));
        }
        let key = (namespace.to_owned(), name.to_owned());
        let Some(current) = self.leases.get(&key) else {
            return refusal(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("leases.coordination.k8s.io \"{name}\" not found"),
                name,
            );
        };
        let sent = lease["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if !sent.is_empty() && current["metadata"]["resourceVersion"] != sent {
            return refusal(
                StatusCode::CONFLICT,
                "Conflict",
                format!("Operation cannot be fulfilled on leases.coordination.k8s.io \"{name}\": the object has been modified; please apply your changes to the latest version and try again"),
                name,
            );
        }
        if let Some((field, why)) = invalid(&lease) {
            return unprocessable(name, &field, &why);
        }
        let created = current["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let stored = self.store(namespace, name, lease, &created);
        self.writes.push(Write {
            method: "PUT",
            token: token.to_owned(),
            lease: stored.clone(),
        });
        ok(StatusCode::OK, &stored)
    }
}

async fn answer(
    state: Arc<Mutex<State>>,
    refused: Arc<Mutex<HashSet<String>>>,
    hung: Arc<Mutex<HashSet<String>>>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Response<Body> {
    let token = bearer_token(&req).unwrap_or_default();
    if hung.lock().unwrap().contains(&token) {
        std::future::pending::<()>().await;
    }
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    if !TOKENS.contains(&token.as_str()) {
        return full(status(StatusCode::UNAUTHORIZED, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "Unauthorized", "reason": "Unauthorized", "code": 401}).to_string()));
    }
    let Some((namespace, name)) = lease_path(&path) else {
        return full(status(StatusCode::NOT_FOUND, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "the server could not find the requested resource", "reason": "NotFound", "code": 404}).to_string()));
    };
    if refused.lock().unwrap().contains(&token) {
        let verb = match method {
            Method::POST => "create",
            Method::PUT => "update",
            _ => "get",
        };
        let quoted = name
            .as_deref()
            .map(|n| format!(" \"{n}\""))
            .unwrap_or_default();
        return refusal(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!("leases.coordination.k8s.io{quoted} is forbidden: User \"system:serviceaccount:tolerable:{token}\" cannot {verb} resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"{namespace}\""),
            name.as_deref().unwrap_or(""),
        );
    }
    let body = match req.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => return bad_request(&e.to_string()),
    };
    let mut state = state.lock().unwrap();
    match (method, name) {
        (Method::GET, Some(name)) => match state.leases.get(&(namespace, name.clone())) {
            Some(lease) => ok(StatusCode::OK, lease),
            None => refusal(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("leases.coordination.k8s.io \"{name}\" not found"),
                &name,
            ),
        },
        (Method::POST, None) => match parse_body(&body, &namespace) {
            Ok(lease) => state.create(&namespace, lease, &token),
            Err(why) => bad_request(&why),
        },
        (Method::PUT, Some(name)) => match parse_body(&body, &namespace) {
            Ok(lease) => state.update(&namespace, &name, lease, &token),
            Err(why) => bad_request(&why),
        },
        (method, _) => full(status(
            StatusCode::METHOD_NOT_ALLOWED,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": format!("{method} is not supported by this fake"), "reason": "MethodNotAllowed", "code": 405})
            .to_string(),
        )),
    }
}

impl LeaseApiServer {
    pub fn start() -> Self {
        super::init();
        let state = Arc::new(Mutex::new(State::default()));
        let refused = Arc::new(Mutex::new(HashSet::new()));
        let hung = Arc::new(Mutex::new(HashSet::new()));
        let requests = Arc::new(AtomicUsize::new(0));
        let (s, r, h, n) = (
            state.clone(),
            refused.clone(),
            hung.clone(),
            requests.clone(),
        );
        let port = super::serve(Some(api_tls()), move |req| {
            n.fetch_add(1, Ordering::SeqCst);
            answer(s.clone(), r.clone(), h.clone(), req)
        });
        Self {
            port,
            state,
            refused,
            hung,
            requests,
        }
    }

    /// This server's answer to one request, for a fake that also serves Leases (the gates fake,
    /// for replicas that gate and elect through one API).
    pub fn handler(&self) -> LeaseHandler {
        let (state, refused, hung) = (self.state.clone(), self.refused.clone(), self.hung.clone());
        Arc::new(move |req| Box::pin(answer(state.clone(), refused.clone(), hung.clone(), req)))
    }

    /// A real `kube` client for this server, authenticating as `token` (one of [`TOKENS`]).
    pub fn client(&self, token: &str) -> kube::Client {
        super::kube_api::client(self.port, token)
    }

    /// From now on, every request with `token` is refused (403), as RBAC without the Lease
    /// Role would; `false` lets it through again.
    pub fn refuse(&self, token: &str, refused: bool) {
        let mut set = self.refused.lock().unwrap();
        if refused {
            set.insert(token.to_owned());
        } else {
            set.remove(token);
        }
    }

    /// From now on, requests with `token` are never answered.
    pub fn hang(&self, token: &str) {
        self.hung.lock().unwrap().insert(token.to_owned());
    }

    /// The Lease as stored now.
    pub fn lease(&self, namespace: &str, name: &str) -> Option<Value> {
        let state = self.state.lock().unwrap();
        state
            .leases
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Every successful write so far, in order.
    pub fn writes(&self) -> Vec<Write> {
        self.state.lock().unwrap().writes.clone()
    }

    /// Requests answered so far (refused ones included).
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}
