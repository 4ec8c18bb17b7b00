//! Issue 34, the gap left in request-body fairness: the serving reserve can be earned by any
//! client. Clients on other loopback addresses (127.0.0.2, 127.0.0.3: two Pods) each earn
//! "serving" with one valid admission per connection, then declare a 3 MiB body, send 1 MiB of
//! it and stall (others send 10 bytes, filling what is left), re-opening whenever the server
//! closes a connection — filling the open budget and the reserve. The server (in process, real HTTPS on loopback) evicts their stalled bodies
//! for newcomers from lighter peers: the API server's keep-alive connection (127.0.0.1) and a
//! client sending a large body at line rate are read and answered. Bodies never hold more than
//! the process budget (the gauge, sampled throughout).

use crate::common;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::webhook::{self, TestServer};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tolerable::server::{ServerLimits, MAX_BODY_BYTES};

/// The process's body budget (`server::body::PROCESS_BODY_BUDGET`): 16 full-size bodies.
const PROCESS_BODY_BUDGET: f64 = (16 * MAX_BODY_BYTES) as f64;
/// What each stalled body sends of the 3 MiB it declares.
const SENT: usize = 1 << 20;
/// Connections per attacking address: 60 MiB of stalled bodies wanted, 48 MiB to be had.
const PER_PEER: usize = 30;
/// And connections per address that send 10 bytes (holding 16 KiB each): they fill what the
/// large ones leave, to the last 16 KiB.
const SMALL_PER_PEER: usize = 40;

/// An HTTP/1.1 connection over TLS to `addr` from the loopback address `from`.
async fn connect_from(from: Ipv4Addr, addr: SocketAddr) -> std::io::Result<TlsStream<TcpStream>> {
    assert!(from.is_loopback());
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    let tcp = socket.connect(addr).await?;
    tcp.set_nodelay(true)?;
    let mut config = (*common::certs::client_config()).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// Posts `body` to /mutate on `tls` and reads the response; its status, `None` if the
/// connection ended first.
async fn admit_raw(tls: &mut TlsStream<TcpStream>, body: &[u8]) -> Option<u16> {
    let head = format!(
        "POST /mutate?timeout=10s HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.ok()?;
    tls.write_all(body).await.ok()?;
    tls.flush().await.ok()?;
    let mut received = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = tls.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        received.extend_from_slice(&chunk[..n]);
        let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&received[..end]).to_ascii_lowercase();
        let status = head.get(9..12)?.parse().ok()?;
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))?
            .trim()
            .parse()
            .ok()?;
        while received.len() < end + 4 + length {
            let n = tls.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            received.extend_from_slice(&chunk[..n]);
        }
        return Some(status);
    }
}

/// An admission answered at once: its image's registry refuses connections (allowed with a
/// warning).
fn quick_review() -> Vec<u8> {
    webhook::recorded("pod-create-simple.v1.json", "127.0.0.1:1")
        .to_string()
        .into_bytes()
}

/// The attack: [`PER_PEER`] connections from each of `peers` (and [`SMALL_PER_PEER`] sending
/// 10 bytes), each earning "serving" with one admission, then declaring 3 MiB, sending [`SENT`]
/// bytes and stalling until the server closes it (its 408, or a 503 when evicted), then again
/// on a new connection, until `stop`.
struct Flood {
    stop: Arc<AtomicBool>,
    /// Connections that earned "serving" and sent their stalled body.
    stalled: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Flood {
    fn start(addr: SocketAddr, peers: &[Ipv4Addr]) -> Self {
        let (stop, stalled) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let tasks = peers
            .iter()
            .flat_map(|&peer| {
                let large = std::iter::repeat_n((peer, SENT), PER_PEER);
                large.chain(std::iter::repeat_n((peer, 10), SMALL_PER_PEER))
            })
            .map(|(peer, sent)| {
                let (stop, stalled) = (stop.clone(), stalled.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        if stall_once((peer, sent), addr, &stop).await {
                            stalled.fetch_add(1, Ordering::Relaxed);
                        }
                        // As the attacker of the issue: re-opened at once, but without
                        // spinning on a server that refuses it.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                })
            })
            .collect();
        Self {
            stop,
            stalled,
            tasks,
        }
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
    }
}

/// One attacking connection; whether it earned "serving" and sent its stalled body.
async fn stall_once((peer, sent): (Ipv4Addr, usize), addr: SocketAddr, stop: &AtomicBool) -> bool {
    let Ok(mut tls) = connect_from(peer, addr).await else {
        return false;
    };
    if admit_raw(&mut tls, &quick_review()).await != Some(200) {
        return false;
    }
    let head = format!(
        "POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {MAX_BODY_BYTES}\r\n\r\n"
    );
    let send = async {
        tls.write_all(head.as_bytes()).await?;
        tls.write_all(&vec![b' '; sent]).await?;
        tls.flush().await
    };
    if send.await.is_err() {
        return false;
    }
    // Until the server closes it (or the test ends).
    let mut buf = [0u8; 1024];
    loop {
        tokio::select! {
            read = tls.read(&mut buf) => if !matches!(read, Ok(1..)) { return true },
            () = tokio::time::sleep(Duration::from_millis(100)) => {
                if stop.load(Ordering::Relaxed) { return true; }
            }
        }
    }
}

/// Samples the body gauge every 20 ms until stopped; the highest value seen.
fn sample_body_bytes(server: &Arc<TestServer>) -> (Arc<AtomicBool>, tokio::task::JoinHandle<f64>) {
    let (stop, server) = (Arc::new(AtomicBool::new(false)), server.clone());
    let done = stop.clone();
    let task = tokio::spawn(async move {
        let mut peak: f64 = 0.0;
        while !done.load(Ordering::Relaxed) {
            let text = webhook::metrics_text(&server).await;
            peak = peak.max(gauge(&text));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        peak
    });
    (stop, task)
}

fn gauge(text: &str) -> f64 {
    webhook::metric_value(text, "tolerable_request_body_bytes").expect("the body gauge")
}

/// Waits until the flood's stalled bodies hold the whole budget (but for a few bodies' room).
async fn filled(server: &TestServer, flood: &Flood) {
    while flood.stalled.load(Ordering::Relaxed) < 2 * (PER_PEER + SMALL_PER_PEER) as u64 - 40 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    loop {
        let held = gauge(&webhook::metrics_text(server).await);
        if held >= PROCESS_BODY_BUDGET - 3.0 * SENT as f64 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn flooded_server() -> (Arc<TestServer>, Flood) {
    let server = Arc::new(TestServer::start_with_limits(ServerLimits::default()).await);
    let flood = Flood::start(
        server.addr,
        &[Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3)],
    );
    (server, flood)
}

/// The attack of the brief, against the API server's keep-alive connection posting the
/// recorded AdmissionReview every 100 ms: 200 on every admission, some stalled bodies evicted
/// for it, and never more body bytes held than the process budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_that_earned_serving_are_evicted_for_the_api_servers_admissions() {
    let (server, flood) = flooded_server().await;
    let mut api_server =
        webhook::keep_alive_connection(server.addr, common::certs::client_config()).await;
    let review = webhook::recorded(
        "admissionreview/v1.36/pod-create-replicaset-shaped.json",
        "127.0.0.1:1",
    )
    .to_string();
    let (sampling, peak) = sample_body_bytes(&server);
    filled(&server, &flood).await;
    let mut statuses = Vec::new();
    for _ in 0..30 {
        use http_body_util::BodyExt as _;
        if api_server.ready().await.is_err() {
            // Closed by the server (a 503 says `connection: close`): as the API server does,
            // open another; this one counts as refused.
            statuses.push(0);
            api_server =
                webhook::keep_alive_connection(server.addr, common::certs::client_config()).await;
            continue;
        }
        let request = http::Request::post("/mutate?timeout=10s")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(Bytes::from(review.clone())))
            .unwrap();
        let response = api_server.send_request(request).await.unwrap();
        statuses.push(response.status().as_u16());
        let _ = response.into_body().collect().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = webhook::metrics_text(&server).await;
    sampling.store(true, Ordering::Relaxed);
    let peak = peak.await.unwrap();
    flood.stop().await;
    eprintln!("API server's admissions {statuses:?}; peak body bytes {peak}");
    assert_eq!(statuses, [200; 30], "the API server's open connection");
    assert!(
        webhook::metric_value(
            &text,
            "tolerable_body_evictions_total{peer_class=\"serving\"}"
        )
        .is_some_and(|evicted| evicted >= 1.0),
        "the flood's stalled bodies were evicted: {text}"
    );
    assert!(peak <= PROCESS_BODY_BUDGET, "{peak} body bytes held");
    assert!(
        peak >= PROCESS_BODY_BUDGET - 3.0 * SENT as f64,
        "the flood filled it: {peak}"
    );
}

/// A client on a new connection (not "serving") sends a body of nearly 3 MiB at line rate
/// while the flood holds the budget: stalled bodies are evicted for it, it is read to its end
/// and answered, and the body bytes held never exceed the process budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_at_line_rate_is_read_while_stalled_bodies_hold_the_budget() {
    let (server, flood) = flooded_server().await;
    let (sampling, peak) = sample_body_bytes(&server);
    filled(&server, &flood).await;
    let mut review = webhook::recorded("pod-create-simple.v1.json", "127.0.0.1:1");
    let size = review.to_string().len();
    review["request"]["object"]["metadata"]["annotations"]["padding"] =
        serde_json::Value::String("a".repeat(MAX_BODY_BYTES - size - 4096));
    let body = review.to_string().into_bytes();
    assert!(body.len() > MAX_BODY_BYTES - 8192 && body.len() <= MAX_BODY_BYTES);
    let mut tls = connect_from(Ipv4Addr::LOCALHOST, server.addr)
        .await
        .unwrap();
    let status = admit_raw(&mut tls, &body).await;
    let text = webhook::metrics_text(&server).await;
    sampling.store(true, Ordering::Relaxed);
    let peak = peak.await.unwrap();
    flood.stop().await;
    assert_eq!(status, Some(200), "the large body's admission");
    assert!(
        webhook::metric_value(
            &text,
            "tolerable_body_evictions_total{peer_class=\"serving\"}"
        )
        .is_some_and(|evicted| evicted >= 1.0),
        "stalled bodies were evicted for it: {text}"
    );
    assert!(peak <= PROCESS_BODY_BUDGET, "{peak} body bytes held");
}
