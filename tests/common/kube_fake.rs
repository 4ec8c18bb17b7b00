//! THE fake Kubernetes API server of the tests (there is no kube-apiserver binary here): one
//! HTTPS/1.1 loop on 127.0.0.1 with the test CA's certificate, one request reader (method, path,
//! the query parsed into pairs, the bearer token, the body), one set of refusal writers, and two
//! kinds of answers:
//! - **recorded exchanges** loaded from the folders a test asks for ([`FakeApi::recorded`]: a
//!   folder's `index.json`, or `exchanges.json`): a request is matched on its method, its path
//!   and its parsed query pairs — kube sends `path?&k=v`, so never the raw string — plus the
//!   recorded bearer token and request body where the recording has them, and answered with the
//!   recorded status, `Content-Type`, framing (`Content-Length`, or chunked with one chunk per
//!   line as the real server streams a watch) and body, byte for byte. A request recorded more
//!   than once (the same list before and after the server's state changed) gets the recordings
//!   in their recorded order, the last one from then on;
//! - **handlers** ([`FakeApi::handler`]) for what a test needs the server to *do*: keep Nodes,
//!   Pods or Leases it is written to, stream a watch as the test releases events, refuse a token
//!   once revoked. Each is asked first, in the order given, and passes (`None`) on what is not
//!   its own.
//!
//! Anything neither answers is refused with 501 `NotImplemented` ([`unrecorded`]) rather than
//! invented, so a test that depends on it fails and says which recording is missing.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use hyper::{HeaderMap, Method, Response, StatusCode};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;

use super::certs;

/// Every answer's body: whole, or streamed (a watch).
pub type Body = UnsyncBoxBody<Bytes, Infallible>;
/// A handler's answer, once it has taken a request.
pub type Answer = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;
/// A stateful behaviour plugged into the server: `None` for a request that is not its own.
pub type Handler = Arc<dyn Fn(&Req) -> Option<Answer> + Send + Sync>;

/// One request as the API server reads it, body included.
#[derive(Clone, Debug)]
pub struct Req {
    pub method: Method,
    pub path: String,
    /// The query as sent (`&watch=true&…`), for messages.
    pub raw_query: String,
    /// Whether the target had a `?` (kube's lists have one, its GETs by name none).
    pub has_query: bool,
    /// The query's pairs, percent-decoded; the empty pair kube starts with dropped.
    pub query: BTreeMap<String, String>,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Req {
    /// The bearer token, as the API server's token authenticator reads it.
    pub fn token(&self) -> Option<&str> {
        let header = self.headers.get("authorization")?.to_str().ok()?;
        header.strip_prefix("Bearer ")
    }

    /// A header's value, or "".
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }

    /// A query parameter.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query.get(key).map(String::as_str)
    }

    /// Whether the request is a watch (`watch=true` or `watch=1`).
    pub fn is_watch(&self) -> bool {
        matches!(self.param("watch"), Some("true" | "1"))
    }

    /// `METHOD /path`, for messages.
    pub fn what(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// Wraps a whole answer as an [`Answer`].
pub fn ready(response: Response<Body>) -> Option<Answer> {
    Some(Box::pin(std::future::ready(response)))
}

/// A request's query parameters, percent-decoded (`+` is a space), as the API server reads them.
pub fn query(query: &str) -> BTreeMap<String, String> {
    query_pairs(query).into_iter().collect()
}

/// [`query`], every pair in order (a key may repeat).
pub fn query_pairs(query: &str) -> Vec<(String, String)> {
    let decode = |s: &str| {
        let s = s.replace('+', " ");
        let (bytes, mut out, mut i) = (s.as_bytes(), Vec::new(), 0);
        while i < bytes.len() {
            let hex = (bytes[i] == b'%' && i + 2 < bytes.len())
                .then(|| u8::from_str_radix(&s[i + 1..i + 3], 16).ok())
                .flatten();
            match hex {
                Some(b) => (out.push(b), i += 3),
                None => (out.push(bytes[i]), i += 1),
            };
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// What identifies a request for a recording: its path and its sorted query pairs (kube writes
/// `path?&k=v`; the pairs, not the string, are what the API server reads).
pub fn request_key(path: &str, query: &str) -> String {
    let mut pairs = query_pairs(query);
    pairs.sort();
    format!("{path} {pairs:?}")
}

/// A whole answer as a [`Body`].
pub fn full(response: Response<Full<Bytes>>) -> Response<Body> {
    response.map(|b| b.boxed_unsync())
}

/// A JSON answer, as the API server sends every one (`Content-Length` framing).
pub fn status(code: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

/// [`status`] of a JSON value, as a [`Body`].
pub fn json(code: u16, body: &Value) -> Response<Body> {
    full(status(
        StatusCode::from_u16(code).unwrap(),
        body.to_string(),
    ))
}

/// The API server's `Status` refusal: `code`, `reason`, `message`, and `details` when given.
pub fn status_value(code: u16, reason: &str, message: &str, details: Option<Value>) -> Value {
    let mut status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason});
    if let Some(details) = details {
        status["details"] = details;
    }
    status["code"] = code.into();
    status
}

/// The API server's 400 Status, with `message`.
pub fn bad_request(message: &str) -> Response<Full<Bytes>> {
    let body = status_value(400, "BadRequest", message, None);
    status(StatusCode::BAD_REQUEST, body.to_string())
}

/// The answer to a request no recording covers (501, `NotImplemented`).
pub fn unrecorded(what: &str) -> Response<Full<Bytes>> {
    status(
        StatusCode::NOT_IMPLEMENTED,
        unrecorded_status(what).to_string(),
    )
}

/// The body of [`unrecorded`].
pub fn unrecorded_status(what: &str) -> Value {
    let message =
        format!("no recording covers {what}; the fake refuses it rather than invent an answer");
    status_value(501, "NotImplemented", &message, None)
}

/// The recorded 401, for a token the server does not know.
pub fn unauthorized() -> Response<Body> {
    full(status(
        StatusCode::UNAUTHORIZED,
        recording("secret-regcred-get-401.body.json"),
    ))
}

/// A recorded file under `tests/data/kube-api/` (`folder/name`), as text.
pub fn recording(name: &str) -> String {
    let path = data().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A recorded JSON file under `tests/data/kube-api/`.
pub fn recorded_json(name: &str) -> Value {
    serde_json::from_str(&recording(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// `tests/data/kube-api/`.
pub fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/kube-api")
}

/// One recorded exchange, as a folder's `index.json` or `exchanges.json` describes it.
#[derive(Clone, Debug)]
pub struct Exchange {
    pub name: String,
    pub method: String,
    /// As sent: `/api/v1/nodes?&limit=2`.
    pub path_and_query: String,
    pub token: Option<String>,
    pub request_content_type: Option<String>,
    pub request_body: Option<Value>,
    pub status: u16,
    pub content_type: Option<String>,
    pub chunked: bool,
    /// `Warning` headers, one per warning, as recorded (raw UTF-8 included).
    pub warnings: Vec<String>,
    pub body: Bytes,
}

impl Exchange {
    fn path(&self) -> &str {
        self.path_and_query.split('?').next().unwrap()
    }

    fn query(&self) -> Vec<(String, String)> {
        let mut pairs = query_pairs(self.path_and_query.split_once('?').map_or("", |q| q.1));
        pairs.sort();
        pairs
    }

    fn matches(&self, req: &Req) -> bool {
        let mut asked = query_pairs(&req.raw_query);
        asked.sort();
        let body = || serde_json::from_slice::<Value>(&req.body).ok();
        self.method == req.method.as_str()
            && self.path() == req.path
            && self.query() == asked
            && self.token.as_deref().is_none_or(|t| req.token() == Some(t))
            && self
                .request_body
                .as_ref()
                .is_none_or(|b| body().as_ref() == Some(b))
    }

    /// The recorded answer: status, `Content-Type`, framing and body as recorded.
    pub fn answer(&self) -> Response<Body> {
        let mut response = if self.chunked {
            let lines: Vec<Bytes> = self
                .body
                .split_inclusive(|b| *b == b'\n')
                .map(Bytes::copy_from_slice)
                .collect();
            let frames = futures_util::stream::iter(lines.into_iter().map(|l| Ok(Frame::data(l))));
            Response::new(StreamBody::new(frames).boxed_unsync())
        } else {
            Response::new(Full::new(self.body.clone()).boxed_unsync())
        };
        *response.status_mut() = StatusCode::from_u16(self.status).unwrap();
        if let Some(content_type) = &self.content_type {
            let value = content_type.parse().unwrap();
            response.headers_mut().insert("content-type", value);
        }
        for warning in &self.warnings {
            let value = hyper::header::HeaderValue::from_bytes(warning.as_bytes()).unwrap();
            response.headers_mut().append("warning", value);
        }
        response
    }
}

/// The exchanges recorded in `tests/data/kube-api/FOLDER` ("" for the top level), in order.
pub fn exchanges(folder: &str) -> Vec<Exchange> {
    let dir = data().join(folder);
    if dir.join("index.json").exists() {
        indexed(&dir)
    } else {
        listed(&dir)
    }
}

/// `index.json`: the recorder's facts about each exchange, bodies in files beside it.
fn indexed(dir: &Path) -> Vec<Exchange> {
    let index: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("index.json")).expect("index.json"))
            .unwrap();
    let read = |file: &Value| -> Option<Vec<u8>> {
        let path = dir.join(file.as_str()?);
        Some(std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    };
    let text = |v: &Value| v.as_str().map(str::to_owned);
    index
        .iter()
        .map(|e| {
            let headers = &e["request_headers"];
            Exchange {
                name: text(&e["name"]).unwrap(),
                method: text(&e["method"]).unwrap(),
                path_and_query: text(&e["path_and_query"]).unwrap(),
                token: headers["Authorization"]
                    .as_str()
                    .and_then(|a| a.strip_prefix("Bearer "))
                    .map(str::to_owned),
                request_content_type: text(&headers["Content-Type"]),
                request_body: read(&e["request_body_file"])
                    .map(|b| serde_json::from_slice(&b).expect("a JSON request body")),
                status: e["status"].as_u64().unwrap() as u16,
                content_type: text(&e["content_type"]),
                chunked: e["transfer_encoding"] == "chunked",
                warnings: e["warning_headers"]
                    .as_array()
                    .map(|w| w.iter().filter_map(text).collect())
                    .unwrap_or_default(),
                body: read(&e["body_file"]).unwrap_or_default().into(),
            }
        })
        .collect()
}

/// `exchanges.json`: request and answer in one file, the body as JSON (no headers were kept:
/// every answer of the real server is `application/json`, the README's "Response headers"; a
/// watch's events, recorded as an array, are sent as a watch sends them, one line a chunk; the
/// rest whole, with a `Content-Length`, since the framing was not kept).
fn listed(dir: &Path) -> Vec<Exchange> {
    let path = dir.join("exchanges.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let list: Vec<Value> = serde_json::from_str(&text).unwrap();
    list.iter()
        .map(|e| {
            let (request, response) = (&e["request"], &e["response"]);
            let path = request["path"].as_str().unwrap();
            let asked = query(path.split_once('?').map_or("", |q| q.1));
            let watch = matches!(asked.get("watch").map(String::as_str), Some("1" | "true"));
            let (chunked, body) = match &response["body"] {
                Value::Null => (false, Bytes::new()),
                Value::Array(events) if watch => {
                    let lines: String = events.iter().map(|e| format!("{e}\n")).collect();
                    (true, Bytes::from(lines))
                }
                body => (false, Bytes::from(body.to_string())),
            };
            Exchange {
                name: e["note"].as_str().unwrap_or_default().to_owned(),
                method: request["method"].as_str().unwrap().to_owned(),
                path_and_query: path.to_owned(),
                token: None,
                request_content_type: request["content_type"].as_str().map(str::to_owned),
                request_body: Some(request["body"].clone()).filter(|b| !b.is_null()),
                status: response["status"].as_u64().unwrap() as u16,
                content_type: Some("application/json".into()),
                chunked,
                warnings: Vec::new(),
                body,
            }
        })
        .collect()
}

/// Recorded exchanges served in their recorded order when the same request comes again.
#[derive(Default)]
struct Replay {
    exchanges: Vec<Exchange>,
    /// How many times each first matching exchange's request has been answered.
    served: Mutex<HashMap<usize, usize>>,
}

impl Replay {
    fn answer(&self, req: &Req) -> Option<Response<Body>> {
        let matching: Vec<usize> = (0..self.exchanges.len())
            .filter(|i| self.exchanges[*i].matches(req))
            .collect();
        let first = *matching.first()?;
        let mut served = self.served.lock().unwrap();
        let n = served.entry(first).or_default();
        let which = matching[(*n).min(matching.len() - 1)];
        *n += 1;
        Some(self.exchanges[which].answer())
    }
}

/// What the server is to answer, before it starts.
#[derive(Default)]
pub struct FakeApi {
    replay: Replay,
    handlers: Vec<Handler>,
}

/// A started server: its port and every request's `path?query`, in order.
pub struct Running {
    pub port: u16,
    requests: Arc<Mutex<Vec<(String, String)>>>,
}

impl FakeApi {
    pub fn new() -> Self {
        Self::default()
    }

    /// Also answers as the exchanges recorded in `folder` ("" for the top level).
    pub fn recorded(mut self, folder: &str) -> Self {
        self.replay.exchanges.extend(exchanges(folder));
        self
    }

    /// Also answers with `handler`, asked before the recordings and after earlier handlers.
    pub fn handler(mut self, handler: Handler) -> Self {
        self.handlers.push(handler);
        self
    }

    /// Serves on a free 127.0.0.1 port from a thread and runtime of its own.
    pub fn start(self) -> Running {
        super::init();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let me = Arc::new(self);
        let port = super::serve(Some(api_tls()), move |req| {
            let (me, seen) = (me.clone(), seen.clone());
            async move {
                let req = read(req).await;
                let asked = (req.path.clone(), req.raw_query.clone());
                seen.lock().unwrap().push(asked);
                me.answer(req).await
            }
        });
        Running { port, requests }
    }

    async fn answer(&self, req: Req) -> Response<Body> {
        if let Some(answer) = self.handlers.iter().find_map(|h| h(&req)) {
            return answer.await;
        }
        self.replay
            .answer(&req)
            .unwrap_or_else(|| full(unrecorded(&req.what())))
    }
}

/// Reads a whole request (the API server reads a body before it answers).
async fn read(req: hyper::Request<hyper::body::Incoming>) -> Req {
    let (parts, body) = req.into_parts();
    let raw_query = parts.uri.query().unwrap_or_default().to_owned();
    Req {
        has_query: parts.uri.query().is_some(),
        method: parts.method,
        path: parts.uri.path().to_owned(),
        query: query(&raw_query),
        raw_query,
        headers: parts.headers,
        body: body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default(),
    }
}

impl Running {
    /// Paths requested so far, in order.
    pub fn requests(&self) -> Vec<String> {
        let requests = self.requests.lock().unwrap();
        requests.iter().map(|(path, _)| path.clone()).collect()
    }

    /// `path?query` of each request so far, in order.
    pub fn requests_with_query(&self) -> Vec<String> {
        let requests = self.requests.lock().unwrap();
        requests.iter().map(|(p, q)| format!("{p}?{q}")).collect()
    }

    /// A real `kube` client for this server, authenticating with `token`.
    pub fn client(&self, token: &str) -> kube::Client {
        client(self.port, token)
    }
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
