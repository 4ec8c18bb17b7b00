//! A thin fake of the Kubernetes API server (there is no kube-apiserver binary here): HTTPS on
//! 127.0.0.1 serving the GET responses recorded from a real kube-apiserver v1.24 in
//! `tests/data/kube-api/` (namespace `team-a`: secrets `regcred`, `legacy`, `broken-shape`;
//! service accounts `default`, `builder`, `multi`). The only change made to a recording: the
//! registry hosts inside the recorded pull secrets point at this run's test registries.
//! Nodes: `GET /api/v1/nodes` lists amd-1, arm-1 (tainted arm64), s390-1 (tainted s390x) and
//! bare-1; the first watch streams the recorded events (arm-2 added, modified, deleted, …), later
//! watches stay quiet for a few seconds and end, as an idle watch does; `GET
//! /api/v1/nodes/NAME` and JSON Patches on Nodes act on the same Nodes (a failed `test` is the
//! recorded 422, a missing Node the recorded 404).
//! Tokens: `admintoken` may read everything, `teamatoken` only in namespace team-a (as a
//! RoleBinding there grants), `nobodytoken` nothing (403), any other gets 401.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use futures_util::StreamExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Response, StatusCode};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::certs;

/// Registry hosts in the recordings → this run's.
pub struct RegistryHosts {
    /// Where `127.0.0.1:25001` (the recording's Basic-auth registry) is now.
    pub basic: String,
    /// Where `127.0.0.1:25444` (the recording's token registry) is now.
    pub token: String,
}

pub struct FakeApiServer {
    pub port: u16,
    requests: Arc<Mutex<Vec<String>>>,
    state: Arc<State>,
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

pub fn full(body: Response<Full<Bytes>>) -> Response<Body> {
    body.map(|b| b.boxed_unsync())
}

/// A watch response: `lines` one chunk each, a little apart (or each when `gate` gives a
/// permit), then the end of the stream.
fn watch_stream(
    lines: Vec<String>,
    then_wait: Duration,
    gate: Option<Arc<tokio::sync::Semaphore>>,
) -> Response<Body> {
    let frames = futures_util::stream::iter(lines)
        .then(move |line| {
            let gate = gate.clone();
            async move {
                match gate {
                    Some(gate) => gate.acquire().await.unwrap().forget(),
                    None => tokio::time::sleep(Duration::from_millis(20)).await,
                }
                Ok::<_, Infallible>(Frame::data(Bytes::from(format!("{line}\n"))))
            }
        })
        .chain(futures_util::stream::once(async move {
            tokio::time::sleep(then_wait).await;
            Ok(Frame::data(Bytes::new()))
        }));
    let mut response = Response::new(StreamBody::new(frames).boxed_unsync());
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

/// The cluster's mutable part: Nodes (seeded from the recorded NodeList) and whether the
/// webhook is registered.
struct State {
    nodes: Mutex<std::collections::BTreeMap<String, serde_json::Value>>,
    resource_version: AtomicUsize,
    watches: AtomicUsize,
    webhook_registered: std::sync::atomic::AtomicBool,
    list_delay: Duration,
    /// When set, the first watch sends each recorded event only when the test adds a permit.
    gate: Option<Arc<tokio::sync::Semaphore>>,
}

impl State {
    fn new(list_delay: Duration, gate: Option<Arc<tokio::sync::Semaphore>>) -> Self {
        let list: serde_json::Value =
            serde_json::from_str(&recording("node-list.body.json")).unwrap();
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
        Self {
            nodes: Mutex::new(nodes),
            resource_version: AtomicUsize::new(
                list["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .parse()
                    .unwrap(),
            ),
            watches: AtomicUsize::new(0),
            webhook_registered: std::sync::atomic::AtomicBool::new(true),
            list_delay,
            gate,
        }
    }

    fn list(&self) -> String {
        let items: Vec<serde_json::Value> = self.nodes.lock().unwrap().values().cloned().collect();
        serde_json::json!({
            "kind": "NodeList", "apiVersion": "v1",
            "metadata": {"resourceVersion": self.resource_version.load(Ordering::SeqCst).to_string()},
            "items": items,
        })
        .to_string()
    }

    /// `GET /api/v1/nodes/NAME`: the Node as held now, or the recorded 404.
    fn get(&self, name: &str) -> Response<Full<Bytes>> {
        match self.nodes.lock().unwrap().get(name) {
            Some(node) => {
                let mut node = node.clone();
                node["kind"] = serde_json::json!("Node");
                node["apiVersion"] = serde_json::json!("v1");
                status(StatusCode::OK, node.to_string())
            }
            None => status(
                StatusCode::NOT_FOUND,
                recording("node-get-missing-404.body.json").replace("missing", name),
            ),
        }
    }

    /// A JSON Patch on a Node, as the API server applies it: all or nothing, a failed `test` is a
    /// 422 (the recorded answer), success bumps the resourceVersion.
    fn patch(&self, name: &str, body: &[u8]) -> Response<Full<Bytes>> {
        let mut nodes = self.nodes.lock().unwrap();
        let Some(node) = nodes.get_mut(name) else {
            return status(
                StatusCode::NOT_FOUND,
                recording("secret-missing-get-404.body.json"),
            );
        };
        let Ok(patch) = serde_json::from_slice::<json_patch::Patch>(body) else {
            return status(
                StatusCode::BAD_REQUEST,
                r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":400}"#.into(),
            );
        };
        let mut patched = node.clone();
        if json_patch::patch(&mut patched, &patch).is_err() {
            return status(
                StatusCode::UNPROCESSABLE_ENTITY,
                recording("node-amd-1-json-patch-test-failed.body.json"),
            );
        }
        let rv = self.resource_version.fetch_add(1, Ordering::SeqCst) + 1;
        patched["metadata"]["resourceVersion"] = serde_json::json!(rv.to_string());
        *node = patched.clone();
        let mut with_kind = patched;
        with_kind["kind"] = serde_json::json!("Node");
        with_kind["apiVersion"] = serde_json::json!("v1");
        status(StatusCode::OK, with_kind.to_string())
    }
}

async fn nodes(state: &State, query: &str) -> Response<Body> {
    let watch = query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    if !watch {
        tokio::time::sleep(state.list_delay).await;
        return full(status(StatusCode::OK, state.list()));
    }
    if state.watches.fetch_add(1, Ordering::SeqCst) == 0 {
        let events = recording("node-watch-from-list-rv.body.jsonl");
        let (then_wait, gate) = match &state.gate {
            // Held open until the test is done, so no re-list replays the events.
            Some(gate) => (Duration::from_secs(60), Some(gate.clone())),
            None => (Duration::from_secs(1), None),
        };
        watch_stream(events.lines().map(str::to_owned).collect(), then_wait, gate)
    } else {
        watch_stream(Vec::new(), Duration::from_secs(3), None)
    }
}

fn recording(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/kube-api")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
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

/// A request's query parameters, percent-decoded, as the API server reads them.
pub fn query(query: &str) -> std::collections::BTreeMap<String, String> {
    url_pairs(query).collect()
}

fn url_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|p| !p.is_empty()).map(|p| {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        let decode = |s: &str| {
            let s = s.replace('+', " ");
            let mut out = Vec::new();
            let bytes = s.as_bytes();
            let mut i = 0;
            while i < bytes.len() {
                if bytes[i] == b'%' && i + 2 < bytes.len() {
                    if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                }
                out.push(bytes[i]);
                i += 1;
            }
            String::from_utf8_lossy(&out).into_owned()
        };
        (decode(k), decode(v))
    })
}

/// The API server's 400 Status, with `message`.
pub fn bad_request(message: &str) -> Response<Full<Bytes>> {
    status(
        StatusCode::BAD_REQUEST,
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": "BadRequest", "code": 400})
        .to_string(),
    )
}

/// The answer to a request no recording covers: a fake refuses it (501, `NotImplemented`)
/// rather than invent what a real server would say, so a test that depends on it fails and
/// says which recording is missing.
pub fn unrecorded(what: &str) -> Response<Full<Bytes>> {
    status(
        StatusCode::NOT_IMPLEMENTED,
        unrecorded_status(what).to_string(),
    )
}

/// The body of [`unrecorded`].
pub fn unrecorded_status(what: &str) -> serde_json::Value {
    serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": format!("no recording covers {what}; the fake refuses it rather than invent an answer"),
           "reason": "NotImplemented", "code": 501})
}

/// A JSON response, as the API server sends every answer.
pub fn status(code: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

fn answer(path: &str, token: Option<&str>, hosts: &RegistryHosts) -> Response<Full<Bytes>> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let ["api", "v1", "namespaces", namespace, kind @ ("secrets" | "serviceaccounts"), name] =
        parts[..]
    else {
        return status(StatusCode::NOT_FOUND, r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","code":404}"#.into());
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

/// A kubeconfig for an API server on 127.0.0.1:`port` with `token`, as `kubectl config view
/// --raw` writes one.
pub fn kubeconfig(port: u16, token: &str) -> tempfile::NamedTempFile {
    let ca = base64::engine::general_purpose::STANDARD.encode(&certs::ca().ca_pem);
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority-data: {ca}\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: admin\ncurrent-context: fake\n"
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), text).unwrap();
    file
}

/// The bearer token a client sent, as the API server's token authenticator reads it.
pub fn bearer_token<B>(req: &hyper::Request<B>) -> Option<String> {
    let header = req.headers().get("authorization")?.to_str().ok()?;
    Some(header.strip_prefix("Bearer ")?.to_owned())
}

/// TLS as an API server serves it: a certificate for 127.0.0.1 from the test CA, HTTP/1.1.
pub fn api_tls() -> tokio_rustls::TlsAcceptor {
    let leaf = certs::ca().leaf(&["127.0.0.1", "localhost"]);
    let chain = vec![CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(tls))
}

impl FakeApiServer {
    pub fn start(hosts: RegistryHosts) -> Self {
        Self::start_with(hosts, Duration::ZERO)
    }

    /// As [`FakeApiServer::start`]; the node list is answered only after `list_delay`.
    pub fn start_with(hosts: RegistryHosts, list_delay: Duration) -> Self {
        Self::start_state(hosts, State::new(list_delay, None))
    }

    /// A cluster whose tainted pools are scaled to zero: the list has only the amd64 nodes
    /// (amd-1, bare-1); the first watch then sends the recorded events (arm-2 added, modified,
    /// bare-1 modified, arm-2 deleted, a bookmark) one per [`FakeApiServer::release_events`].
    pub fn start_scaled_to_zero(hosts: RegistryHosts) -> Self {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let state = State::new(Duration::ZERO, Some(gate));
        state
            .nodes
            .lock()
            .unwrap()
            .retain(|name, _| name == "amd-1" || name == "bare-1");
        Self::start_state(hosts, state)
    }

    /// Lets the gated watch send `n` more recorded events.
    pub fn release_events(&self, n: usize) {
        if let Some(gate) = &self.state.gate {
            gate.add_permits(n);
        }
    }

    fn start_state(hosts: RegistryHosts, state: State) -> Self {
        super::init();
        let acceptor = api_tls();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let hosts = Arc::new(hosts);
        let state = Arc::new(state);
        let shared = state.clone();
        let port = super::serve(
            Some(acceptor),
            move |req: hyper::Request<hyper::body::Incoming>| {
                seen.lock().unwrap().push(req.uri().path().to_owned());
                let token = bearer_token(&req);
                let path = req.uri().path().to_owned();
                let query = req.uri().query().unwrap_or("").to_owned();
                let method = req.method().clone();
                let (hosts, state) = (hosts.clone(), shared.clone());
                async move {
                    let body = req
                        .into_body()
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    let admin = token.as_deref() == Some("admintoken");
                    let mwc =
                        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/";
                    match (&method, path.as_str()) {
                        (&hyper::Method::GET, "/api/v1/nodes") if admin => {
                            nodes(&state, &query).await
                        }
                        (&hyper::Method::GET, p) if admin && p.starts_with("/api/v1/nodes/") => {
                            full(state.get(&p["/api/v1/nodes/".len()..]))
                        }
                        (&hyper::Method::PATCH, p) if admin && p.starts_with("/api/v1/nodes/") => {
                            full(state.patch(&p["/api/v1/nodes/".len()..], &body))
                        }
                        (&hyper::Method::GET, p) if admin && p.starts_with(mwc) => {
                            let name = &p[mwc.len()..];
                            if name == "tolerable"
                                && state.webhook_registered.load(Ordering::SeqCst)
                            {
                                full(status(
                                    StatusCode::OK,
                                    recording("mwc-tolerable-get.body.json"),
                                ))
                            } else {
                                full(status(
                                    StatusCode::NOT_FOUND,
                                    recording("mwc-missing-get-404.body.json")
                                        .replace("missing", name),
                                ))
                            }
                        }
                        (&hyper::Method::GET, _) => full(answer(&path, token.as_deref(), &hosts)),
                        _ => full(status(StatusCode::METHOD_NOT_ALLOWED, "{}".into())),
                    }
                }
            },
        );
        Self {
            port,
            requests,
            state,
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
        self.state.nodes.lock().unwrap()[name].clone()
    }

    /// A real `kube` client for this server, authenticating with `token`.
    pub fn client(&self, token: &str) -> kube::Client {
        client(self.port, token)
    }

    /// Paths requested so far.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

/// A real `kube` client for a fake on `port`, authenticating with `token`.
pub fn client(port: u16, token: &str) -> kube::Client {
    let mut config = kube::Config::new(format!("https://127.0.0.1:{port}").parse().unwrap());
    config.root_cert = Some(vec![CertificateDer::from_pem_slice(
        certs::ca().ca_pem.as_bytes(),
    )
    .unwrap()
    .to_vec()]);
    config.auth_info.token = Some(token.to_owned().into());
    config.default_namespace = "team-a".into();
    kube::Client::try_from(config).unwrap()
}
