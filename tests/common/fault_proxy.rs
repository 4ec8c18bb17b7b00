//! A fault-injecting HTTP proxy in front of a real registry: it forwards every request to the
//! registry unchanged until told to misbehave the way registries do in production — slow, hung,
//! failing with 500, rate limiting with 429 and `Retry-After`, sending a manifest that is not JSON
//! or one far too large. The registry behind it is always the real one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Request, Response, StatusCode};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward unchanged.
    None,
    /// Forward after a delay.
    Slow(Duration),
    /// Accept the request and never answer.
    Hang,
    /// Answer every request with this status and a registry error body.
    Status(u16),
    /// 429 Too Many Requests with `Retry-After: <seconds>`.
    RateLimited { retry_after_secs: u64 },
    /// Manifests are answered 200 with a body that is not JSON (and a matching digest).
    MalformedManifest,
    /// Manifests are answered 200 with this many bytes, streamed without a Content-Length.
    OversizedManifest(usize),
    /// Forwarded, but a manifest HEAD's answer loses its `Docker-Content-Digest` (some
    /// registries and proxies send none).
    NoDigestOnHead,
}

pub struct FaultProxy {
    /// `127.0.0.1:PORT`, plain http.
    pub host: String,
    fault: Arc<Mutex<Fault>>,
    /// Added to every forwarded answer (a registry's rate-limit headers, say).
    headers: Arc<Mutex<Vec<(&'static str, String)>>>,
    requests: Arc<AtomicUsize>,
    /// Requests being answered now, and the most there ever were at once.
    in_flight: Arc<(AtomicUsize, AtomicUsize)>,
}

type Body = UnsyncBoxBody<Bytes, std::io::Error>;

impl FaultProxy {
    /// A proxy to the plain-http registry at `upstream` (`host:port`).
    pub fn start(upstream: &str) -> Self {
        let fault = Arc::new(Mutex::new(Fault::None));
        let headers: Arc<Mutex<Vec<(&'static str, String)>>> = Arc::default();
        let requests = Arc::new(AtomicUsize::new(0));
        let upstream = format!("http://{upstream}");
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let in_flight = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
        let (f, h, r, n) = (
            fault.clone(),
            headers.clone(),
            requests.clone(),
            in_flight.clone(),
        );
        let port = super::serve(None, move |req| {
            let (f, h, r, n, client, upstream) = (
                f.clone(),
                h.clone(),
                r.clone(),
                n.clone(),
                client.clone(),
                upstream.clone(),
            );
            async move {
                r.fetch_add(1, Ordering::SeqCst);
                let now = n.0.fetch_add(1, Ordering::SeqCst) + 1;
                n.1.fetch_max(now, Ordering::SeqCst);
                let fault = f.lock().unwrap().clone();
                let mut response = answer(fault, req, &client, &upstream).await;
                for (name, value) in h.lock().unwrap().iter() {
                    response.headers_mut().insert(*name, value.parse().unwrap());
                }
                n.0.fetch_sub(1, Ordering::SeqCst);
                response
            }
        });
        Self {
            host: format!("127.0.0.1:{port}"),
            fault,
            headers,
            requests,
            in_flight,
        }
    }

    /// The most requests the proxy was answering at the same time.
    pub fn max_in_flight(&self) -> usize {
        self.in_flight.1.load(Ordering::SeqCst)
    }

    pub fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap() = fault;
    }

    /// Every answer from now on carries this header too.
    pub fn add_header(&self, name: &'static str, value: &str) {
        self.headers.lock().unwrap().push((name, value.to_owned()));
    }

    /// Requests received so far (whatever was answered).
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(
        Full::new(body.into())
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response
}

async fn answer(
    fault: Fault,
    req: Request<hyper::body::Incoming>,
    client: &reqwest::Client,
    upstream: &str,
) -> Response<Body> {
    let is_manifest = req.uri().path().contains("/manifests/");
    let is_head = req.method() == hyper::Method::HEAD;
    match fault {
        Fault::None => {}
        Fault::Slow(delay) => tokio::time::sleep(delay).await,
        Fault::Hang => std::future::pending::<()>().await,
        Fault::Status(code) => {
            let status = StatusCode::from_u16(code).unwrap();
            return full(
                status,
                r#"{"errors":[{"code":"UNKNOWN","message":"injected failure"}]}"#,
            );
        }
        Fault::RateLimited { retry_after_secs } => {
            let mut response = full(
                StatusCode::TOO_MANY_REQUESTS,
                r#"{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}"#,
            );
            response
                .headers_mut()
                .insert("retry-after", retry_after_secs.to_string().parse().unwrap());
            return response;
        }
        Fault::MalformedManifest if is_manifest => {
            let body: &[u8] = b"{\"schemaVersion\": 2, \"mediaType\": ";
            let mut response = full(StatusCode::OK, body);
            let headers = response.headers_mut();
            headers.insert(
                "content-type",
                "application/vnd.oci.image.index.v1+json".parse().unwrap(),
            );
            headers.insert(
                "docker-content-digest",
                super::fixtures::sha256(body).parse().unwrap(),
            );
            return response;
        }
        Fault::OversizedManifest(size) if is_manifest => {
            // 64 KiB chunks of JSON-ish whitespace, no Content-Length: the reader must cap it.
            let chunks = size.div_ceil(64 << 10);
            let stream = futures_util::stream::iter(0..chunks)
                .map(|_| Ok::<_, std::io::Error>(Frame::data(Bytes::from(vec![b' '; 64 << 10]))));
            let mut response = Response::new(StreamBody::new(stream).boxed_unsync());
            response.headers_mut().insert(
                "content-type",
                "application/vnd.oci.image.index.v1+json".parse().unwrap(),
            );
            return response;
        }
        Fault::NoDigestOnHead if is_manifest && is_head => {
            let mut response = forward(req, client, upstream).await;
            response.headers_mut().remove("docker-content-digest");
            return response;
        }
        Fault::MalformedManifest | Fault::OversizedManifest(_) | Fault::NoDigestOnHead => {}
    }
    forward(req, client, upstream).await
}

async fn forward(
    req: Request<hyper::body::Incoming>,
    client: &reqwest::Client,
    upstream: &str,
) -> Response<Body> {
    let url = format!(
        "{upstream}{}",
        req.uri().path_and_query().map_or("/", |p| p.as_str())
    );
    let mut outgoing = client.request(req.method().clone(), url);
    for (name, value) in req.headers() {
        if name != hyper::header::HOST {
            outgoing = outgoing.header(name, value);
        }
    }
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let Ok(upstream_response) = outgoing.body(body).send().await else {
        return full(StatusCode::BAD_GATEWAY, "registry unreachable");
    };
    let status = upstream_response.status();
    let headers = upstream_response.headers().clone();
    let body = upstream_response.bytes().await.unwrap_or_default();
    let mut response = full(status, body);
    for (name, value) in &headers {
        if name != hyper::header::CONTENT_LENGTH && name != hyper::header::TRANSFER_ENCODING {
            response.headers_mut().insert(name, value.clone());
        }
    }
    response
}
