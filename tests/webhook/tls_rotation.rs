//! Certificate rotation the way cert-manager + the kubelet do it (a `..data` symlink swap in a
//! Secret volume), under load, losing no request; a broken rotation keeps the old certificate.

use crate::common;

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

/// `tolerable_certificate_reloads_total{result}`.
async fn reloads(server: &TestServer, result: &str) -> u64 {
    let metrics = webhook::metrics_text(server).await;
    let prefix = format!("tolerable_certificate_reloads_total{{result=\"{result}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Waits until `tolerable_certificate_reloads_total{result}` reads at least `n` (a hang, not a
/// slow machine, if not within 30 s: reloads are tried every second).
async fn reloads_reach(server: &TestServer, result: &str, n: u64) {
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = reloads(server, result).await;
        if seen >= n {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "{seen} reloads with result {result:?}, never {n}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

/// Once the reload of the files now on the volume is counted (the `ok` count reaches `n`), the
/// very next handshake is served `expected`: the event, not a polling deadline.
async fn served_once_reloaded(server: &TestServer, n: u64, expected: &[u8]) {
    reloads_reach(server, "ok", n).await;
    assert_eq!(
        served_certificate(server.addr).await,
        expected,
        "reload {n} counted, the old certificate still served"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlink_swap_rotation_under_load_loses_no_request() {
    let mut server = TestServer::start(webhook::policy(), common::settings()).await;
    let body = recorded("pod-create-simple.v1.json", &registry::plain().host).to_string();
    let load = Load::start(&server.url("/mutate?timeout=10s"), &body);

    let first = der(&std::fs::read_to_string(server.volume.cert_path()).unwrap());
    assert_eq!(served_certificate(server.addr).await, first);
    for rotation in 1..=3 {
        // Requests answered before the rotation: waited for, not slept for.
        load.answered_more(15).await;
        let leaf = common::certs::ca().leaf(&["localhost", "127.0.0.1"]);
        let started = Instant::now();
        server.volume.rotate(&leaf.cert_pem, &leaf.key_pem);
        // The bound the code guarantees: once the reload is counted, the very next handshake
        // is served the new certificate (no polling for it). How soon the reload comes is the
        // reload interval's (1 s), not a test's.
        reloads_reach(&server, "ok", rotation).await;
        assert_eq!(
            served_certificate(server.addr).await,
            der(&leaf.cert_pem),
            "reload {rotation} counted, the old certificate still served"
        );
        eprintln!("rotation {rotation} served after {:?}", started.elapsed());
    }
    load.answered_more(15).await;
    let (ok, failed) = load.stop().await;
    assert_eq!(failed, 0, "requests lost during rotation");
    assert!(ok > 50, "too little load: {ok}");

    let metrics = webhook::metrics_text(&server).await;
    assert!(
        metrics.contains("tolerable_certificate_reloads_total{result=\"ok\"} 3"),
        "{metrics}"
    );
    server.shutdown().await;
}

/// Admission requests sent by six tasks until stopped: keep-alive clients, and clients that
/// open a new connection (and handshake) for every request, so rotations happen between and
/// during handshakes.
struct Load {
    counts: Arc<LoadCounts>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

#[derive(Default)]
struct LoadCounts {
    stop: AtomicBool,
    ok: AtomicUsize,
    failed: AtomicUsize,
}

impl Load {
    fn start(url: &str, body: &str) -> Self {
        let counts = Arc::new(LoadCounts::default());
        let tasks = (0..6)
            .map(|worker| {
                let keep_alive = worker % 2 == 0;
                let (url, body, counts) = (url.to_owned(), body.to_owned(), counts.clone());
                tokio::spawn(async move {
                    let mut client = webhook::client();
                    while !counts.stop.load(Ordering::Relaxed) {
                        if !keep_alive {
                            client = webhook::client_builder()
                                .pool_max_idle_per_host(0)
                                .build()
                                .unwrap();
                        }
                        let counter = if answered(&client, &url, &body).await {
                            &counts.ok
                        } else {
                            &counts.failed
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        Self { counts, tasks }
    }

    /// Waits until `n` more requests have been answered (a hang, not a slow machine, if not
    /// within 30 s).
    async fn answered_more(&self, n: usize) {
        let target = self.counts.ok.load(Ordering::Relaxed) + n;
        let give_up = Instant::now() + Duration::from_secs(30);
        while self.counts.ok.load(Ordering::Relaxed) < target {
            assert!(Instant::now() < give_up, "the load stalled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops the load once every task's request in flight is done: (answered, failed).
    async fn stop(self) -> (usize, usize) {
        self.counts.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        (
            self.counts.ok.load(Ordering::Relaxed),
            self.counts.failed.load(Ordering::Relaxed),
        )
    }
}

/// Whether one admission request got its AdmissionReview back (failures are printed).
async fn answered(client: &reqwest::Client, url: &str, body: &str) -> bool {
    let result = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await;
    match result {
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
    }
}

#[tokio::test]
async fn a_broken_rotation_keeps_the_old_certificate() {
    let mut server = TestServer::start(webhook::policy(), common::settings()).await;
    let current = served_certificate(server.addr).await;
    // A certificate with somebody else's key (a half-finished or botched rotation). Both for
    // the names and the address the served one is for, as a rotation keeps them.
    let a = common::certs::ca().leaf(&["localhost", "127.0.0.1"]);
    let b = common::certs::ca().leaf(&["localhost", "127.0.0.1"]);
    server.volume.rotate(&a.cert_pem, &b.key_pem);
    // Every failed reload counts, not only the first of a run of identical ones: waited for
    // (two refusals of the same files), then the old certificate is still the one served.
    reloads_reach(&server, "error", 2).await;
    assert_eq!(served_certificate(server.addr).await, current);
    assert_eq!(reloads(&server, "ok").await, 0);
    // Fixed a moment later: served.
    server.volume.rotate(&a.cert_pem, &a.key_pem);
    served_once_reloaded(&server, 1, &der(&a.cert_pem)).await;
    server.shutdown().await;
}

/// A valid certificate from the right CA, but for another Service: the API server (which calls
/// `tolerable.tolerable-system.svc`) would refuse it, so it is not hot-swapped in.
#[tokio::test]
async fn a_certificate_for_other_names_is_refused_and_every_refusal_counted() {
    let mut server = TestServer::start(webhook::policy(), common::settings()).await;
    let current = served_certificate(server.addr).await;
    let elsewhere = common::certs::ca().leaf(&["elsewhere.example", "127.0.0.1"]);
    server
        .volume
        .rotate(&elsewhere.cert_pem, &elsewhere.key_pem);
    // Two refusals of the same files waited for (every one counts), then still the old one.
    reloads_reach(&server, "error", 2).await;
    assert_eq!(served_certificate(server.addr).await, current);
    assert_eq!(reloads(&server, "ok").await, 0);

    // A certificate with more names than before is fine (the starting one's address included:
    // IP addresses are checked too).
    let wider =
        common::certs::ca().leaf(&["localhost", "127.0.0.1", "tolerable.tolerable-system.svc"]);
    server.volume.rotate(&wider.cert_pem, &wider.key_pem);
    served_once_reloaded(&server, 1, &der(&wider.cert_pem)).await;
    server.shutdown().await;
}

#[test]
fn name_check_warn_serves_the_certificate_and_says_which_names_it_drops() {
    use tolerable::server::tls::{CertStore, NameCheck, Reloaded, TlsError};
    common::init();
    let first = common::certs::ca().leaf(&["localhost", "tolerable.tolerable-system.svc"]);
    let mut volume = webhook::SecretVolume::new(&first.cert_pem, &first.key_pem);
    let open = |check| {
        CertStore::from_files(&volume.cert_path(), &volume.key_path())
            .unwrap()
            .with_name_check(check)
    };
    let (refusing, warning) = (open(NameCheck::Refuse), open(NameCheck::Warn));
    assert_eq!(
        warning.names(),
        ["localhost", "tolerable.tolerable-system.svc"]
    );
    let narrower = common::certs::ca().leaf(&["localhost"]);
    volume.rotate(&narrower.cert_pem, &narrower.key_pem);
    match refusing.reload() {
        Err(TlsError::NamesDropped { missing, .. }) => {
            assert_eq!(missing, ["tolerable.tolerable-system.svc"])
        }
        other => panic!("{other:?}"),
    }
    // Refused again on the next try: it is not remembered as loaded.
    assert!(refusing.reload().is_err());
    assert_eq!(
        warning.reload().unwrap(),
        Reloaded::SwappedWithoutNames(vec!["tolerable.tolerable-system.svc".into()])
    );
    assert_eq!(warning.reload().unwrap(), Reloaded::Unchanged);
}

/// A reloaded certificate must keep the starting one's IP addresses as well as its DNS names
/// (a webhook called by `url` at an address), and a certificate or key file over the size limit
/// is refused without being read, keeping the current pair.
#[test]
fn reloads_check_ip_addresses_and_refuse_oversized_files() {
    use tolerable::server::tls::{CertStore, Reloaded, TlsError, MAX_PEM_BYTES};
    common::init();
    let first = common::certs::ca().leaf(&["localhost", "127.0.0.1", "::1"]);
    let mut volume = webhook::SecretVolume::new(&first.cert_pem, &first.key_pem);
    let store = CertStore::from_files(&volume.cert_path(), &volume.key_path()).unwrap();
    assert_eq!(store.names(), ["localhost", "127.0.0.1", "::1"]);

    let no_v4 = common::certs::ca().leaf(&["localhost", "::1", "127.0.0.2"]);
    volume.rotate(&no_v4.cert_pem, &no_v4.key_pem);
    match store.reload() {
        Err(TlsError::NamesDropped { missing, .. }) => assert_eq!(missing, ["127.0.0.1"]),
        other => panic!("{other:?}"),
    }

    // A valid pair padded past the limit (PEM allows text around the blocks): not read.
    let padding = "#".repeat(MAX_PEM_BYTES as usize);
    let same = common::certs::ca().leaf(&["localhost", "127.0.0.1", "::1"]);
    volume.rotate(&format!("{}{padding}\n", same.cert_pem), &same.key_pem);
    let refused = store.reload().unwrap_err();
    assert!(
        matches!(
            refused,
            TlsError::TooLarge {
                key: "tls.cert_path",
                ..
            }
        ),
        "{refused:?}"
    );
    let said = refused.to_string();
    assert!(
        said.contains("tls.cert_path") && said.contains("not read"),
        "{said}"
    );
    volume.rotate(&same.cert_pem, &format!("{}{padding}\n", same.key_pem));
    assert!(matches!(
        store.reload(),
        Err(TlsError::TooLarge {
            key: "tls.key_path",
            ..
        })
    ));
    // Neither was taken: the same pair within the limit is new to the store.
    let just_under = "#".repeat(MAX_PEM_BYTES as usize - same.cert_pem.len() - 1);
    volume.rotate(&format!("{}{just_under}", same.cert_pem), &same.key_pem);
    assert_eq!(store.reload().unwrap(), Reloaded::Swapped);
    assert_eq!(store.reload().unwrap(), Reloaded::Unchanged);
}
