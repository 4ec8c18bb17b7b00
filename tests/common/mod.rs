//! Test support: real registries (Debian's `docker-registry`, the CNCF distribution server) on
//! 127.0.0.1 in each auth mode, fixture images of every shape, certificates, and the servers
//! written for the tests, each described in its module: a token service (`token`), hostile
//! registries and a fault proxy for what a real registry cannot be made to do (`fake`,
//! `hostile`, `fault_proxy`: hang, send garbage, serve documents built to cost work, misbehave
//! on purpose), and the one fake of the Kubernetes API server (`kube_fake`: recorded exchanges
//! replayed as recorded, 501 for the rest) with the handlers a test plugs into it (`kube_api`:
//! recorded pull secrets, Nodes with emulated PATCH and watch; `workloads_api`: `audit`'s
//! recorded lists, paged as recorded; `scale_api`: many Nodes generated from one recorded Node,
//! for scale; `lease_api`: Leases for the leader election, with the real server's refusals;
//! `namespaces_api`: the recorded Namespace list and metadata watch, and the 403; `gates_api`:
//! Pods and Events as a v1.36 server treats gated Pods). The webhook under test: `webhook`
//! (in process) or `process` (its own process). `captured_log`: a test's own log.
//! `doc_samples`: the sample outputs of README.md and docs/install.md, which tests compare.
#![allow(dead_code)] // each test binary uses a different part of this module

pub mod captured_log;
pub mod certs;
pub mod cli;
pub mod crash_scale_api;
pub mod crashes_api;
pub mod deployed;
pub mod doc_samples;
pub mod events_api;
pub mod fake;
pub mod fault_proxy;
pub mod fixtures;
pub mod gates_api;
pub mod hostile;
pub mod kube_api;
pub mod kube_fake;
pub mod kube_pages;
pub mod lease_api;
pub mod namespaces_api;
pub mod node_api;
pub mod plugins;
pub mod process;
pub mod recorded;
pub mod redis;
pub mod registry;
pub mod scale_api;
pub mod selector;
pub mod token;
pub mod tools;
pub mod webhook;
pub mod workloads_api;

use std::sync::Once;
use std::time::Duration;

use tolerable::registry::cache::CacheSettings;
use tolerable::registry::client::TransportSettings;
use tolerable::registry::ResolverSettings;

/// Installs the process-wide rustls provider, as `main` does.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// `VmRSS` of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

/// Polls `condition` until it holds; panics naming `what` if it has not after 30 s (a hang
/// guard, not a timing check: the events waited on take milliseconds).
pub async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(
            std::time::Instant::now() < give_up,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A free port on 127.0.0.1 (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Resolver settings for tests: short timeouts, every test registry trusted.
/// The digest `image` (on a plain test registry) has now, as a lookup with [`settings`] finds it.
pub async fn digest_of(image: &str) -> String {
    tolerable::registry::Resolver::new(settings(), Default::default())
        .unwrap()
        .resolve(image)
        .await
        .unwrap()
        .digest
        .clone()
}

pub fn settings() -> ResolverSettings {
    init();
    ResolverSettings {
        transport: TransportSettings {
            connect_timeout: Duration::from_secs(1),
            read_timeout: Duration::from_secs(3),
            // The token service of the token registry is plain http on loopback.
            insecure_registries: vec![
                registry::plain().host.clone(),
                registry::token().token_host(),
            ],
            extra_roots_pem: vec![certs::ca().ca_pem.clone().into_bytes()],
            access: Default::default(),
        },
        mirrors: Default::default(),
        lookup_timeout: Duration::from_secs(3),
        cache: CacheSettings {
            tag_ttl: Duration::from_secs(60),
            digest_ttl: Duration::from_secs(600),
            failure_ttl: Duration::from_secs(2),
            stale_ttl: Duration::from_secs(600),
            max_entries: 1000,
        },
        breaker: tolerable::registry::BreakerSettings {
            failures: 5,
            cooldown: Duration::from_secs(30),
        },
        shared_cache: None,
    }
}

/// A plain-HTTP/1.1 server on a free 127.0.0.1 port, answering every request with `handler`
/// from a thread and runtime of its own (it outlives any one test's runtime). Returns the port.
pub fn serve_http<F>(handler: F) -> u16
where
    F: Fn(
            &hyper::Request<hyper::body::Incoming>,
        ) -> hyper::Response<http_body_util::Full<bytes::Bytes>>
        + Send
        + Sync
        + 'static,
{
    let handler = std::sync::Arc::new(handler);
    serve(None, move |req| {
        let response = handler(&req);
        async move { response }
    })
}

/// An HTTP/1.1 server on a free 127.0.0.1 port — over TLS when `tls` is given — answering
/// every request with `handler` from a thread and runtime of its own. Returns the port.
pub fn serve<F, Fut, B>(tls: Option<tokio_rustls::TlsAcceptor>, handler: F) -> u16
where
    F: Fn(hyper::Request<hyper::body::Incoming>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = hyper::Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve_on(std::net::Ipv4Addr::LOCALHOST, tls, handler)
}

/// [`serve`] on another loopback address (`127.0.0.2`, `127.0.0.3`: "other hosts" that are
/// still this machine).
pub fn serve_on<F, Fut, B>(
    ip: std::net::Ipv4Addr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handler: F,
) -> u16
where
    F: Fn(hyper::Request<hyper::body::Incoming>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = hyper::Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    assert!(ip.is_loopback(), "test servers stay on loopback");
    let listener = std::net::TcpListener::bind((ip, 0)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let handler = std::sync::Arc::new(handler);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (handler, tls) = (handler.clone(), tls.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let response = handler(req);
                        async move { Ok::<_, std::convert::Infallible>(response.await) }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    let _ = match tls {
                        None => {
                            http.serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                                .await
                        }
                        Some(acceptor) => {
                            let Ok(stream) = acceptor.accept(tcp).await else {
                                return;
                            };
                            http.serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                .await
                        }
                    };
                });
            }
        });
    });
    port
}

/// Runs `future` to completion on a private runtime in its own thread: shared registries are
/// set up once per test binary, from whichever test's runtime gets there first.
pub fn block_on_own_thread<T: Send + 'static>(
    future: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(future)
    })
    .join()
    .expect("setup thread panicked")
}
