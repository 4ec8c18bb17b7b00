//! Hand-written servers for behaviour a real registry cannot be made to show on demand: one that
//! accepts and never answers, and one that serves a manifest that is not JSON (the other servers
//! written for the tests are listed in `mod.rs`).

use std::net::TcpListener;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};

/// Accepts connections and never answers. Returns `127.0.0.1:PORT`.
pub fn hung_server() -> String {
    hung_server_counting().0
}

/// [`hung_server`], with the number of connections it has accepted so far, so a test can wait
/// until a lookup has reached it (the request is then in flight) instead of sleeping.
pub fn hung_server_counting() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream); // keep it open, say nothing
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    (host, accepted)
}

/// A port with nothing listening. Returns `127.0.0.1:PORT`.
pub fn closed_port() -> String {
    format!("127.0.0.1:{}", super::free_port())
}

/// A plain-http "registry" whose every manifest is `body` (with a correct digest header), and
/// whose `/v2/` says no auth is needed. Returns `127.0.0.1:PORT`.
pub fn manifest_server(body: &'static [u8], content_type: &'static str) -> String {
    let port = super::serve_http(move |req| {
        let mut response = Response::new(Full::new(Bytes::from_static(b"{}")));
        if req.uri().path().contains("/manifests/") {
            *response.body_mut() = Full::new(Bytes::from_static(body));
            let headers = response.headers_mut();
            headers.insert("content-type", content_type.parse().unwrap());
            headers.insert(
                "docker-content-digest",
                super::fixtures::sha256(body).parse().unwrap(),
            );
        } else if req.uri().path() != "/v2/" {
            *response.status_mut() = StatusCode::NOT_FOUND;
        }
        response
    });
    format!("127.0.0.1:{port}")
}
