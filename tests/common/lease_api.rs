//! Leases (`coordination.k8s.io/v1`) for the leader election, a handler on the one fake API
//! server (`kube_fake`; [`LeaseApiServer::handler`] plugs it into another fake's), answering as a real kube-apiserver v1.36.3 answered the exchanges
//! recorded in `tests/data/kube-api/leases/exchanges.json` (replayed one by one by
//! `the_fake_lease_api_answers_every_recorded_exchange_as_recorded` in `tests/cluster/leader_election.rs`):
//! - `GET` of a Lease: 200, or 404 NotFound when there is none;
//! - `POST`: 201, or 409 AlreadyExists when the name is taken;
//! - `PUT`: a name that is not the URL's is 400; a resourceVersion that is not a number is 500
//!   (`strconv.ParseUint`); a Lease that does not exist is created (201) when no resourceVersion
//!   is sent; an update without a resourceVersion is 422 (checked before the spec), a stale one
//!   409 Conflict; otherwise 200;
//! - `PATCH` with `application/merge-patch+json`: applied with no precondition (200);
//! - `DELETE`: a `Status` of `Success` naming the deleted Lease's uid.
//!
//! What no recording covers is refused with [`kube_fake::unrecorded`] (501) instead of invented:
//! an invalid spec, a create carrying a resourceVersion, an update of a missing Lease with one,
//! other patch types, a list, a body that is not a Lease of the URL's namespace.
//! Tokens: [`TOKENS`] and `admintoken` (system:masters); any other gets the recorded 401; a
//! token the test refused ([`Leases::refuse`]) gets 403 in the shape of the recorded 403s; a
//! token the test cut off ([`Leases::hang`]) is read and never answered, as behind a network
//! partition. [`Leases::handler`] serves them on any fake (the gates fake, `kube_api`'s).
//! The real server writes `managedFields` (manager `unknown`); this fake writes none.
//!
//! Every write is applied under one lock, so of two racing updates with the same
//! resourceVersion exactly one wins, as etcd's compare-and-swap makes it on the real server.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hyper::{Method, Response, StatusCode};
use serde_json::{json, Value};

use super::kube_fake::{self, full, status, status_value, Body, FakeApi, Handler, Req, Running};

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
    uids: u64,
    writes: Vec<Write>,
}

/// The Leases of one fake API server: what is stored, and how each token is treated.
#[derive(Clone, Default)]
pub struct Leases {
    state: Arc<Mutex<State>>,
    refused: Arc<Mutex<HashSet<String>>>,
    hung: Arc<Mutex<HashSet<String>>>,
    requests: Arc<AtomicUsize>,
}

/// A fake API server serving only [`Leases`] (their methods through `Deref`).
pub struct LeaseApiServer {
    pub port: u16,
    api: Running,
    leases: Leases,
}

impl std::ops::Deref for LeaseApiServer {
    type Target = Leases;

    fn deref(&self) -> &Leases {
        &self.leases
    }
}

/// A `Status` refusal about Lease `name`, shaped as the recorded ones (`details` names the
/// resource `leases`, not the kind).
fn refusal(code: StatusCode, reason: &str, message: String, name: &str) -> Response<Body> {
    let details = json!({"name": name, "group": "coordination.k8s.io", "kind": "leases"});
    let body = status_value(code.as_u16(), reason, &message, Some(details));
    full(status(code, body.to_string()))
}

fn not_found(name: &str) -> Response<Body> {
    let message = format!("leases.coordination.k8s.io \"{name}\" not found");
    refusal(StatusCode::NOT_FOUND, "NotFound", message, name)
}

/// The recorded 422 for an update that carries no resourceVersion.
fn resource_version_required(name: &str) -> Response<Body> {
    let why = "Invalid value: 0: must be specified for an update";
    let code = StatusCode::UNPROCESSABLE_ENTITY;
    let message = format!(
        "leases.coordination.k8s.io \"{name}\" is invalid: metadata.resourceVersion: {why}"
    );
    let details = json!({"name": name, "group": "coordination.k8s.io", "kind": "leases",
        "causes": [{"reason": "FieldValueInvalid", "message": why,
                    "field": "metadata.resourceVersion"}]});
    let body = status_value(422, "Invalid", &message, Some(details));
    full(status(code, body.to_string()))
}

/// The recorded 500 for a resourceVersion that is not an unsigned number.
fn malformed_resource_version(sent: &str) -> Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("strconv.ParseUint: parsing \"{sent}\": invalid syntax"), "code": 500});
    full(status(StatusCode::INTERNAL_SERVER_ERROR, body.to_string()))
}

fn unrecorded(what: String) -> Response<Body> {
    full(kube_fake::unrecorded(&what))
}

fn ok(code: StatusCode, lease: &Value) -> Response<Body> {
    full(status(code, lease.to_string()))
}

/// Whether the real server's validation (`ValidateLeaseSpec`) would refuse this spec; no
/// recording shows how, so such a write is refused as unrecorded.
fn invalid(lease: &Value) -> bool {
    let spec = &lease["spec"];
    spec["leaseDurationSeconds"]
        .as_i64()
        .is_some_and(|d| d <= 0)
        || spec["leaseTransitions"].as_i64().is_some_and(|t| t < 0)
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

/// A request's body as a Lease for `namespace`; anything else is unrecorded.
fn parse_body(bytes: &[u8], namespace: &str) -> Option<Value> {
    let lease: Value = serde_json::from_slice(bytes).ok()?;
    let right_kind = lease["kind"] == "Lease" && lease["apiVersion"] == "coordination.k8s.io/v1";
    let ns = lease["metadata"]["namespace"].as_str().unwrap_or(namespace);
    (right_kind && ns == namespace).then_some(lease)
}

/// RFC 7386 JSON merge patch of `patch` onto `target`.
fn merge(target: &mut Value, patch: &Value) {
    let Some(fields) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (key, value) in fields {
        if value.is_null() {
            target.as_object_mut().unwrap().remove(key);
        } else {
            merge(&mut target[key.as_str()], value);
        }
    }
}

fn now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    k8s_openapi::jiff::Timestamp::from_second(now as i64)
        .unwrap()
        .to_string()
}

impl State {
    /// Stores `lease` as `namespace/name` under a new resourceVersion; `uid` and
    /// `creationTimestamp` are kept from `current`, or new for a create.
    fn store(&mut self, namespace: &str, name: &str, mut lease: Value, current: Option<&Value>) {
        self.resource_version += 1;
        let (uid, created) = match current {
            Some(c) => (
                c["metadata"]["uid"].clone(),
                c["metadata"]["creationTimestamp"].clone(),
            ),
            None => {
                self.uids += 1;
                let uid = format!("5f1e6c9a-0d1b-4a7e-9c55-{:012x}", self.uids);
                (json!(uid), json!(now()))
            }
        };
        let meta = &mut lease["metadata"];
        meta["name"] = json!(name);
        meta["namespace"] = json!(namespace);
        meta["resourceVersion"] = json!(self.resource_version.to_string());
        meta["uid"] = uid;
        meta["creationTimestamp"] = created;
        self.leases
            .insert((namespace.to_owned(), name.to_owned()), lease);
    }

    /// Stores and logs one write, and answers it with the Lease as stored.
    fn write(
        &mut self,
        (method, token): (&'static str, &str),
        (namespace, name): (&str, &str),
        lease: Value,
        code: StatusCode,
    ) -> Response<Body> {
        let key = (namespace.to_owned(), name.to_owned());
        let current = self.leases.get(&key).cloned();
        self.store(namespace, name, lease, current.as_ref());
        let stored = self.leases[&key].clone();
        let token = token.to_owned();
        self.writes.push(Write {
            method,
            token,
            lease: stored.clone(),
        });
        ok(code, &stored)
    }

    fn create(&mut self, namespace: &str, lease: Value, token: &str) -> Response<Body> {
        let Some(name) = lease["metadata"]["name"].as_str().map(str::to_owned) else {
            return unrecorded("a Lease created without a name".into());
        };
        if self
            .leases
            .contains_key(&(namespace.to_owned(), name.clone()))
        {
            let message = format!("leases.coordination.k8s.io \"{name}\" already exists");
            return refusal(StatusCode::CONFLICT, "AlreadyExists", message, &name);
        }
        if invalid(&lease) || !lease["metadata"]["resourceVersion"].is_null() {
            return unrecorded(format!("a create of Lease {name} with this body"));
        }
        self.write(
            ("POST", token),
            (namespace, &name),
            lease,
            StatusCode::CREATED,
        )
    }

    fn update(&mut self, namespace: &str, name: &str, lease: Value, token: &str) -> Response<Body> {
        let body_name = lease["metadata"]["name"].as_str().unwrap_or("");
        if body_name != name {
            return full(kube_fake::bad_request(&format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let sent = lease["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if !sent.is_empty() && sent.parse::<u64>().is_err() {
            return malformed_resource_version(sent);
        }
        let key = (namespace.to_owned(), name.to_owned());
        let Some(current) = self.leases.get(&key) else {
            if !sent.is_empty() || invalid(&lease) {
                return unrecorded(format!("an update of missing Lease {name} with this body"));
            }
            let who = ("PUT", token);
            return self.write(who, (namespace, name), lease, StatusCode::CREATED);
        };
        if sent.is_empty() {
            return resource_version_required(name);
        }
        if current["metadata"]["resourceVersion"] != sent {
            let message = format!("Operation cannot be fulfilled on leases.coordination.k8s.io \"{name}\": the object has been modified; please apply your changes to the latest version and try again");
            return refusal(StatusCode::CONFLICT, "Conflict", message, name);
        }
        if invalid(&lease) {
            return unrecorded(format!("an update of Lease {name} with an invalid spec"));
        }
        self.write(("PUT", token), (namespace, name), lease, StatusCode::OK)
    }

    fn merge_patch(
        &mut self,
        namespace: &str,
        name: &str,
        patch: &[u8],
        token: &str,
    ) -> Response<Body> {
        let key = (namespace.to_owned(), name.to_owned());
        let patch: Option<Value> = serde_json::from_slice(patch).ok();
        let (Some(current), Some(patch)) = (self.leases.get(&key), patch) else {
            return unrecorded(format!("this merge patch of Lease {name}"));
        };
        // The recorded patch touched the spec only; preconditions and renames are unrecorded.
        if !patch["metadata"].is_null() {
            return unrecorded(format!("a merge patch of Lease {name}'s metadata"));
        }
        let mut patched = current.clone();
        merge(&mut patched, &patch);
        if invalid(&patched) {
            return unrecorded(format!("a merge patch making Lease {name} invalid"));
        }
        self.write(("PATCH", token), (namespace, name), patched, StatusCode::OK)
    }

    fn delete(&mut self, namespace: &str, name: &str) -> Response<Body> {
        let Some(gone) = self.leases.remove(&(namespace.to_owned(), name.to_owned())) else {
            return unrecorded(format!("a delete of missing Lease {name}"));
        };
        let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": name, "group": "coordination.k8s.io", "kind": "leases",
                        "uid": gone["metadata"]["uid"]}});
        full(status(StatusCode::OK, body.to_string()))
    }
}

/// A 403 for `token`, as RBAC without the Lease Role answers (the recorded 403s' shape).
fn forbidden(method: &Method, token: &str, namespace: &str, name: Option<&str>) -> Response<Body> {
    let verb = match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "get",
    };
    let quoted = name.map(|n| format!(" \"{n}\"")).unwrap_or_default();
    refusal(
        StatusCode::FORBIDDEN,
        "Forbidden",
        format!("leases.coordination.k8s.io{quoted} is forbidden: User \"system:serviceaccount:tolerable:{token}\" cannot {verb} resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"{namespace}\""),
        name.unwrap_or(""),
    )
}

/// Who may ask: the caller's token, namespace and Lease name, or the answer to a caller that
/// may not.
fn authorize(
    req: &Req,
    refused: &Mutex<HashSet<String>>,
) -> Result<(String, String, Option<String>), Box<Response<Body>>> {
    let token = req.token().unwrap_or_default().to_owned();
    // `admintoken` is in system:masters, as in the recordings: it may use Leases too.
    if !TOKENS.contains(&token.as_str()) && token != "admintoken" {
        return Err(Box::new(kube_fake::unauthorized()));
    }
    let Some((namespace, name)) = lease_path(&req.path) else {
        return Err(Box::new(unrecorded(req.what())));
    };
    if refused.lock().unwrap().contains(&token) {
        return Err(Box::new(forbidden(
            &req.method,
            &token,
            &namespace,
            name.as_deref(),
        )));
    }
    Ok((token, namespace, name))
}

async fn answer(
    state: Arc<Mutex<State>>,
    refused: Arc<Mutex<HashSet<String>>>,
    hung: Arc<Mutex<HashSet<String>>>,
    req: Req,
) -> Response<Body> {
    if hung
        .lock()
        .unwrap()
        .contains(req.token().unwrap_or_default())
    {
        std::future::pending::<()>().await;
    }
    let (token, namespace, name) = match authorize(&req, &refused) {
        Ok(caller) => caller,
        Err(answer) => return *answer,
    };
    let method = req.method.clone();
    let merge_patch = req.header("content-type") == "application/merge-patch+json";
    let what = format!("{method} {}?{}", req.path, req.raw_query);
    let body = req.body;
    let mut state = state.lock().unwrap();
    let (ns, token) = (namespace.as_str(), token.as_str());
    match (method, name.as_deref()) {
        (Method::GET, Some(name)) => {
            match state.leases.get(&(namespace.clone(), name.to_owned())) {
                Some(lease) => ok(StatusCode::OK, lease),
                None => not_found(name),
            }
        }
        (Method::POST, None) => match parse_body(&body, ns) {
            Some(lease) => state.create(ns, lease, token),
            None => unrecorded(format!("{what} with this body")),
        },
        (Method::PUT, Some(name)) => match parse_body(&body, ns) {
            Some(lease) => state.update(ns, name, lease, token),
            None => unrecorded(format!("{what} with this body")),
        },
        (Method::PATCH, Some(name)) if merge_patch => state.merge_patch(ns, name, &body, token),
        (Method::DELETE, Some(name)) => state.delete(ns, name),
        _ => unrecorded(what),
    }
}

impl Leases {
    /// The Leases' answers, for the one server a test starts (requests for another path are
    /// not theirs); each request counted.
    pub fn handler(&self) -> Handler {
        let me = self.clone();
        Arc::new(move |req| {
            me.requests.fetch_add(1, Ordering::SeqCst);
            lease_path(&req.path)?;
            let (state, refused, hung) = (me.state.clone(), me.refused.clone(), me.hung.clone());
            Some(Box::pin(answer(state, refused, hung, req.clone())))
        })
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

impl LeaseApiServer {
    pub fn start() -> Self {
        let leases = Leases::default();
        let api = FakeApi::new().handler(leases.handler()).start();
        Self {
            port: api.port,
            api,
            leases,
        }
    }

    /// A real `kube` client for this server, authenticating as `token` (one of [`TOKENS`]).
    pub fn client(&self, token: &str) -> kube::Client {
        self.api.client(token)
    }
}
