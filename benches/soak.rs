//! Soak (`make soak`, not in CI): the release `tolerable serve` under a steady open-loop load for
//! SOAK_MINUTES (default 10) at SOAK_RATE admissions/s (default 2000) over HTTPS keep-alive,
//! while the real registry behind it is killed and restarted every quarter of the run and the
//! serving certificate is rotated three times the way the kubelet updates a Secret volume
//! (`..data` symlink swap). Tags are re-checked every 5 s (`cache_tag_ttl`), so registry outages
//! reach the lookups and are absorbed by stale-if-error and the circuit breaker.
//!
//! Pass: zero failed or timed-out admissions (anything but HTTP 200 `allowed` within the
//! API server's 10 s), every rotation served on new connections, and flat RSS. Prints a table;
//! the result is recorded in BENCHMARKS.md.

#[path = "../tests/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::registry::Registry;
use common::webhook::SecretVolume;
use http_body_util::{BodyExt as _, Full};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};

const CONNECTIONS: usize = 32;
/// Each connection is replaced after this many requests, so rotated certificates are met.
const REQUESTS_PER_CONNECTION: u64 = 2_000;
const API_SERVER_TIMEOUT: Duration = Duration::from_secs(10);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// A new keep-alive connection, and the certificate the server presented on it.
async fn connect(addr: SocketAddr) -> Result<(Sender, Vec<u8>), String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    tcp.set_nodelay(true).unwrap();
    let stream = tokio_rustls::TlsConnector::from(common::certs::client_config())
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    let presented = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .unwrap_or_default();
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    Ok((sender, presented))
}

#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    ok: AtomicU64,
    patched: AtomicU64,
    stale: AtomicU64,
    unchanged: AtomicU64,
    failed: AtomicU64,
    timed_out: AtomicU64,
    reconnects: AtomicU64,
}

/// One admission; `Err` describes a failure.
async fn admit(sender: &mut Sender, body: Bytes, tally: &Tally) -> Result<(), String> {
    let request = hyper::Request::post("/mutate?timeout=10s")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap();
    let exchange = async {
        sender.ready().await.map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, body))
    };
    let (status, body) = match tokio::time::timeout(API_SERVER_TIMEOUT, exchange).await {
        Ok(answer) => answer?,
        Err(_) => {
            tally.timed_out.fetch_add(1, Ordering::Relaxed);
            return Err("timed out".into());
        }
    };
    let review: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| format!("HTTP {status}: {e}"))?;
    let response = &review["response"];
    if status != 200 || response["allowed"] != true {
        return Err(format!("HTTP {status}: {response}"));
    }
    tally.ok.fetch_add(1, Ordering::Relaxed);
    if response.get("patch").is_some() {
        tally.patched.fetch_add(1, Ordering::Relaxed);
    } else {
        tally.unchanged.fetch_add(1, Ordering::Relaxed);
    }
    let warned_stale = response["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|w| {
            w.as_str()
                .unwrap_or_default()
                .contains("registry unavailable")
        });
    if warned_stale {
        tally.stale.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

fn review_body(image: &str) -> Bytes {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/pod-create-simple.v1.json"
    ))
    .unwrap();
    let mut review: serde_json::Value = serde_json::from_str(&text).unwrap();
    review["request"]["object"]["spec"]["containers"][0]["image"] = serde_json::json!(image);
    Bytes::from(review.to_string())
}

/// Registry restarts at 1/4, 2/4 and 3/4 of the run (down 5 s each), certificate rotations at
/// 1/6, 3/6 and 5/6. Returns how many rotations a new connection was then served.
async fn inject_faults(
    start: Instant,
    duration: Duration,
    registry: Arc<Registry>,
    mut volume: SecretVolume,
    addr: SocketAddr,
) -> (usize, SecretVolume) {
    let mut events: Vec<(Duration, &str)> = Vec::new();
    for q in 1..=3 {
        events.push((duration * q / 4, "registry down"));
        events.push((duration * q / 4 + Duration::from_secs(5), "registry up"));
    }
    for s in [1, 3, 5] {
        events.push((duration * s / 6, "rotate"));
    }
    events.sort();
    let mut rotations_seen = 0;
    let ca = common::certs::ca();
    for (at, event) in events {
        tokio::time::sleep_until((start + at).into()).await;
        eprintln!("{:>6.1}s {event}", start.elapsed().as_secs_f64());
        match event {
            "registry down" => tokio::task::block_in_place(|| registry.stop()),
            "registry up" => tokio::task::block_in_place(|| registry.restart()),
            _ => {
                let leaf = ca.leaf(&["localhost", "127.0.0.1"]);
                tokio::task::block_in_place(|| volume.rotate(&leaf.cert_pem, &leaf.key_pem));
                let expected = CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes())
                    .unwrap()
                    .as_ref()
                    .to_vec();
                // The server reloads within seconds; a new connection must present it.
                let until = Instant::now() + Duration::from_secs(5);
                while Instant::now() < until {
                    if let Ok((_, presented)) = connect(addr).await {
                        if presented == expected {
                            rotations_seen += 1;
                            break;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    (rotations_seen, volume)
}

struct Server(Child);

impl Server {
    /// The release binary serving on `addr` with the certificate in `volume`, looking images
    /// up in the plain-http registry at `registry_host`, tags re-checked every 5 s.
    fn start(addr: SocketAddr, volume: &SecretVolume, registry_host: &str) -> Self {
        Self(
            // The certificate is the volume's (rotated under load), not the one `prepare` writes.
            common::process::serve_command(
                env!("CARGO_BIN_EXE_tolerable"),
                volume.dir.path(),
                addr,
            )
            .arg("serve")
            .env("TOLERABLE_TLS__CERT_PATH", volume.cert_path())
            .env("TOLERABLE_TLS__KEY_PATH", volume.key_path())
            .env("TOLERABLE_REGISTRY__INSECURE", registry_host)
            .env("TOLERABLE_POLICY__SUPPORTED_ARCHITECTURES", "arm64,s390x")
            .env("TOLERABLE_CACHE__TAG_TTL", "5s")
            .env("TOLERABLE_LOG__LEVEL", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the load generator's tasks share.
struct Load {
    addr: SocketAddr,
    /// One review per fixture image; admission `i` sends `bodies[i % len]`.
    bodies: Vec<Bytes>,
    tally: Tally,
    /// Why admissions failed (of failed admissions themselves, only the first 20).
    failures: Mutex<Vec<String>>,
}

impl Load {
    /// Images: every fixture in the registry that runs on Linux, so each admission names one
    /// of a few tags.
    fn new(addr: SocketAddr, registry_host: &str) -> Self {
        let bodies = common::fixtures::EXPECTED
            .iter()
            .filter(|(_, platforms)| {
                platforms.is_some_and(|p| p.iter().any(|p| p.starts_with("linux/")))
            })
            .map(|(name, _)| review_body(&format!("{registry_host}/fixtures/{name}:v1")))
            .collect();
        Self {
            addr,
            bodies,
            tally: Tally::default(),
            failures: Mutex::new(Vec::new()),
        }
    }

    /// Waits (up to 10 s) for the server to accept connections, then admits every image once
    /// (not counted), so the run starts with the cache warm.
    async fn warm_up(&self) {
        let started = Instant::now();
        while connect(self.addr).await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "server never started"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (mut sender, _) = connect(self.addr).await.unwrap();
        for body in self.bodies.iter() {
            admit(&mut sender, body.clone(), &Tally::default())
                .await
                .unwrap();
        }
    }

    fn fail(&self, why: String) {
        self.tally.failed.fetch_add(1, Ordering::Relaxed);
        self.failures.lock().unwrap().push(why);
    }
}

/// Queue of admission numbers from the dispatcher to the workers.
type Queue = Arc<tokio::sync::Mutex<tokio::sync::mpsc::Receiver<usize>>>;

/// One of CONNECTIONS workers: takes admissions off the queue until it closes, on a
/// keep-alive connection replaced every REQUESTS_PER_CONNECTION requests or after a failure.
async fn work(load: Arc<Load>, queue: Queue) {
    let tally = &load.tally;
    let mut current: Option<(Sender, u64)> = None;
    loop {
        let Some(i) = queue.lock().await.recv().await else {
            break;
        };
        if current
            .as_ref()
            .is_none_or(|(_, n)| *n >= REQUESTS_PER_CONNECTION)
        {
            tally.reconnects.fetch_add(1, Ordering::Relaxed);
            current = match connect(load.addr).await {
                Ok((sender, _)) => Some((sender, 0)),
                Err(e) => {
                    load.fail(format!("connect: {e}"));
                    None
                }
            };
        }
        let Some((sender, used)) = current.as_mut() else {
            continue;
        };
        *used += 1;
        tally.sent.fetch_add(1, Ordering::Relaxed);
        let body = load.bodies[i % load.bodies.len()].clone();
        if let Err(e) = admit(sender, body, tally).await {
            tally.failed.fetch_add(1, Ordering::Relaxed);
            let mut f = load.failures.lock().unwrap();
            if f.len() < 20 {
                f.push(e);
            }
            current = None;
        }
    }
}

/// Open loop: `rate` admissions a second for `duration` from `start`, whether or not the
/// workers keep up (a full queue is a failure). Returns the server's RSS every 10 s.
async fn dispatch(
    load: &Load,
    queue: tokio::sync::mpsc::Sender<usize>,
    start: Instant,
    duration: Duration,
    rate: u32,
    pid: u32,
) -> Vec<(Duration, u64)> {
    let mut rss_samples = Vec::new();
    let interval = Duration::from_secs(1) / rate;
    let mut next_sample = start + Duration::from_secs(10);
    let mut i = 0usize;
    loop {
        let due = start + interval * u32::try_from(i).unwrap();
        if due - start >= duration {
            break;
        }
        tokio::time::sleep_until(due.into()).await;
        if queue.try_send(i).is_err() {
            load.fail("load generator queue full".into());
        }
        i += 1;
        if Instant::now() >= next_sample {
            rss_samples.push((start.elapsed(), common::rss_kib(pid)));
            next_sample += Duration::from_secs(10);
        }
    }
    rss_samples
}

/// What a run measured besides the tally.
struct Run {
    rss_start: u64,
    rss_samples: Vec<(Duration, u64)>,
    rotations_seen: usize,
}

/// Warms up, then runs the load and the faults side by side for `duration`.
async fn soak(
    load: Arc<Load>,
    registry: Arc<Registry>,
    volume: SecretVolume,
    duration: Duration,
    rate: u32,
    pid: u32,
) -> Run {
    load.warm_up().await;
    let rss_start = common::rss_kib(pid);
    let (tx, rx) = tokio::sync::mpsc::channel::<usize>(rate as usize * 10);
    let queue: Queue = Arc::new(tokio::sync::Mutex::new(rx));
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|_| tokio::spawn(work(load.clone(), queue.clone())))
        .collect();
    let start = Instant::now();
    let faults = tokio::spawn(inject_faults(start, duration, registry, volume, load.addr));
    let rss_samples = dispatch(&load, tx, start, duration, rate, pid).await;
    for w in workers {
        w.await.unwrap();
    }
    let (rotations_seen, volume) = faults.await.unwrap();
    drop(volume); // only now: the server reads it until the end
    Run {
        rss_start,
        rss_samples,
        rotations_seen,
    }
}

fn main() {
    common::init();
    let minutes: f64 = env_or("SOAK_MINUTES", 10.0);
    let rate: u32 = env_or("SOAK_RATE", 2000);
    let duration = Duration::from_secs_f64(minutes * 60.0);
    let registry = Arc::new(Registry::start_restartable());
    let first = common::certs::ca().leaf(&["localhost", "127.0.0.1"]);
    let volume = SecretVolume::new(&first.cert_pem, &first.key_pem);
    let addr: SocketAddr = format!("127.0.0.1:{}", common::free_port())
        .parse()
        .unwrap();
    let server = Server::start(addr, &volume, &registry.host);
    let pid = server.0.id();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let load = Arc::new(Load::new(addr, &registry.host));
    let run = runtime.block_on(soak(
        load.clone(),
        registry.clone(),
        volume,
        duration,
        rate,
        pid,
    ));
    let rss_end = common::rss_kib(pid);
    let passed = report(minutes, rate, &load, &run, rss_end);
    drop(server);
    if !passed {
        std::process::exit(1);
    }
}

/// Prints the table (and the first failures, on stderr); returns the verdict.
fn report(minutes: f64, rate: u32, load: &Load, run: &Run, rss_end: u64) -> bool {
    let (tally, rotations_seen) = (&load.tally, run.rotations_seen);
    let t = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let peak = |samples: &[(Duration, u64)]| samples.iter().map(|(_, r)| *r).max();
    let rss_max = peak(&run.rss_samples).unwrap_or(rss_end);
    // Flat: the second half of the run does not grow past the first half's peak.
    let half = run.rss_samples.len() / 2;
    let first_half_max = peak(&run.rss_samples[..half]).unwrap_or(0);
    let second_half_max = peak(&run.rss_samples[half..]).unwrap_or(0);
    let mib = |k: u64| k as f64 / 1024.0;
    println!("| soak: {minutes} min at {rate} admissions/s | result |");
    println!("| --- | --- |");
    println!(
        "| admissions sent / answered allowed | {} / {} |",
        t(&tally.sent),
        t(&tally.ok)
    );
    println!(
        "| failed / timed out (> 10 s) | {} / {} |",
        t(&tally.failed),
        t(&tally.timed_out)
    );
    println!(
        "| patched / unchanged / answered from the last known result | {} / {} / {} |",
        t(&tally.patched),
        t(&tally.unchanged),
        t(&tally.stale)
    );
    println!("| registry restarts | 3 (down 5 s each) |");
    println!("| certificate rotations served on new connections | {rotations_seen} / 3 |");
    println!("| connections opened | {} |", t(&tally.reconnects));
    println!(
        "| RSS start / max / end | {:.1} / {:.1} / {:.1} MiB |",
        mib(run.rss_start),
        mib(rss_max),
        mib(rss_end)
    );
    println!(
        "| RSS peak, first half / second half | {:.1} / {:.1} MiB |",
        mib(first_half_max),
        mib(second_half_max)
    );
    for f in load.failures.lock().unwrap().iter().take(10) {
        eprintln!("failure: {f}");
    }
    let passed = t(&tally.failed) == 0
        && t(&tally.timed_out) == 0
        && rotations_seen == 3
        && second_half_max <= first_half_max + 2048;
    println!("| verdict | {} |", if passed { "PASS" } else { "FAIL" });
    passed
}
