//! Certificate rotation the way cert-manager + the kubelet do it (a `..data` symlink swap in a
//! Secret volume), under load, losing no request; a broken rotation keeps the old certificate.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::registry;
use common::webhook::{self, recorded, TestServer};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};

/// The certificate a fresh TLS connection is served.
async fn served_certificate(addr: std::net::SocketAddr) -> Vec<u8> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(common::certs::ca().ca_pem.as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

async fn wait_until_served(server: &TestServer, expected: &[u8]) -> Duration {
    let started = Instant::now();
    while served_certificate(server.addr).await != expected {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "rotation never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlink_swap_rotation_under_load_loses_no_request() {
    let mut server = TestServer::start(webhook::policy(), common::settings()).await;
    let body = recorded("pod-create-simple.v1.json", &registry::plain().host).to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));

    // Load: keep-alive clients, and clients that open a new connection (and handshake) for
    // every request, so rotations happen between and during handshakes.
    let mut load = Vec::new();
    for worker in 0..6 {
        let (url, body, stop, ok, failed) = (
            server.url("/mutate?timeout=10s"),
            body.clone(),
            stop.clone(),
            ok.clone(),
            failed.clone(),
        );
        load.push(tokio::spawn(async move {
            let keep_alive = worker % 2 == 0;
            let mut client = webhook::client();
            while !stop.load(Ordering::Relaxed) {
                if !keep_alive {
                    client = webhook::client_builder()
                        .pool_max_idle_per_host(0)
                        .build()
                        .unwrap();
                }
                let result = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await;
                let answered = match result {
                    Ok(r) if r.status() == 200 => match r.bytes().await {
                        Ok(b) => b.starts_with(b"{\"apiVersion\""),
                        Err(e) => {
                            eprintln!("failed reading: {e}");
                            false
                        }
                    },
                    other => {
                        eprintln!("failed request: {other:?}");
                        false
                    }
                };
                if answered {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }

    let first = der(&std::fs::read_to_string(server.volume.cert_path()).unwrap());
    assert_eq!(served_certificate(server.addr).await, first);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let leaf = common::certs::ca().leaf(&["localhost", "127.0.0.1"]);
        server.volume.rotate(&leaf.cert_pem, &leaf.key_pem);
        let took = wait_until_served(&server, &der(&leaf.cert_pem)).await;
        assert!(took < Duration::from_secs(3), "rotation took {took:?}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "requests lost during rotation"
    );
    assert!(
        ok.load(Ordering::Relaxed) > 50,
        "too little load: {}",
        ok.load(Ordering::Relaxed)
    );

    let metrics = webhook::metrics_text(&server).await;
    assert!(
        metrics.contains("tolerable_certificate_reloads_total{result=\"ok\"} 3"),
        "{metrics}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_broken_rotation_keeps_the_old_certificate() {
    let mut server = TestServer::start(webhook::policy(), common::settings()).await;
    let current = served_certificate(server.addr).await;
    // A certificate with somebody else's key (a half-finished or botched rotation).
    let a = common::certs::ca().leaf(&["localhost"]);
    let b = common::certs::ca().leaf(&["localhost"]);
    server.volume.rotate(&a.cert_pem, &b.key_pem);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(served_certificate(server.addr).await, current);
    let metrics = webhook::metrics_text(&server).await;
    assert!(
        metrics.contains("tolerable_certificate_reloads_total{result=\"error\"} 1"),
        "{metrics}"
    );
    // Fixed a moment later: served.
    server.volume.rotate(&a.cert_pem, &a.key_pem);
    wait_until_served(&server, &der(&a.cert_pem)).await;
    server.shutdown().await;
}
