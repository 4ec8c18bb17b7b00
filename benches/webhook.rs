//! Webhook benchmark (`cargo bench --bench webhook`, or `make bench`): the release binary
//! `tolerable serve` as its own process, a real registry, and a load generator in this process
//! speaking HTTPS/1.1 keep-alive like the API server. Prints a Markdown table; method and
//! results in BENCHMARKS.md.
//!
//! Measures: server CPU per request (utime+stime of the server process from /proc over the run,
//! divided by requests) of /healthz, the warm admission and an UPDATE, the server saturated by a
//! closed loop of 32 connections (the rates it reached are printed beside them but not compared:
//! on 2 shared cores a rate measures the load generator as much as the server); the same at a
//! fixed rate, warn against info (the log line); p50/p99 at fixed rates (open loop, latency from the scheduled send
//! time so a stall is not hidden); server RSS idle and after caching 10,000 distinct images.
//! `BENCH_SERVER_BINARY` measures another build of `tolerable` alike (the image's static musl
//! binary: `make bench-shipped`).

#[path = "../tests/common/mod.rs"]
mod common;

use common::webhook::keep_alive_connection as connect;

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::registry::{self, Mode};
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use rustls::pki_types::ServerName;

const CONNECTIONS: usize = 32;

#[derive(Clone)]
struct Call {
    post: Option<Bytes>,
    path: &'static str,
}

async fn send(sender: &mut SendRequest<Full<Bytes>>, call: &Call) {
    sender.ready().await.unwrap();
    let builder = hyper::Request::builder().header("host", "localhost");
    let request = match &call.post {
        Some(body) => builder
            .method("POST")
            .uri(call.path)
            .header("content-type", "application/json")
            .body(Full::new(body.clone())),
        None => builder
            .method("GET")
            .uri(call.path)
            .body(Full::new(Bytes::new())),
    }
    .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(!body.is_empty());
}

use common::process::cpu_us;

/// Closed loop: every connection sends back to back for `duration`. Returns (requests/s, server
/// CPU µs per request).
async fn throughput(addr: SocketAddr, pid: u32, call: Call, duration: Duration) -> (f64, f64) {
    let tls = common::certs::client_config();
    let mut senders = Vec::new();
    for _ in 0..CONNECTIONS {
        senders.push(connect(addr, tls.clone()).await);
    }
    // Warm-up.
    for sender in &mut senders {
        send(sender, &call).await;
    }
    let done = Arc::new(AtomicU64::new(0));
    let cpu_before = cpu_us(pid);
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = senders
        .into_iter()
        .map(|mut sender| {
            let (call, done) = (call.clone(), done.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    send(&mut sender, &call).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_us(pid) - cpu_before;
    let n = done.load(Ordering::Relaxed) as f64;
    (n / elapsed, cpu as f64 / n)
}

/// Open loop at `rate`/s for `duration`: requests are dispatched on a fixed schedule whether or
/// not earlier ones finished; latency is measured from dispatch. Returns (p50, p99, max) in ms.
async fn fixed_rate(
    addr: SocketAddr,
    call: Call,
    rate: u32,
    duration: Duration,
) -> (f64, f64, f64) {
    fixed_rate_with_cpu(addr, None, call, rate, duration)
        .await
        .0
}

/// [`fixed_rate`], and the server's CPU µs per request over the scheduled part when `pid` is
/// given (0 otherwise).
async fn fixed_rate_with_cpu(
    addr: SocketAddr,
    pid: Option<u32>,
    call: Call,
    rate: u32,
    duration: Duration,
) -> ((f64, f64, f64), f64) {
    let tls = common::certs::client_config();
    let (tx, rx) = async_channel::<Instant>();
    let latencies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut sender = connect(addr, tls.clone()).await;
        send(&mut sender, &call).await;
        let (rx, call, latencies) = (rx.clone(), call.clone(), latencies.clone());
        workers.push(tokio::spawn(async move {
            while let Ok(due) = rx.recv().await {
                send(&mut sender, &call).await;
                latencies.lock().unwrap().push(due.elapsed());
            }
        }));
    }
    let interval = Duration::from_secs(1) / rate;
    let start = Instant::now() + Duration::from_millis(50);
    let total = (duration.as_secs_f64() * f64::from(rate)) as u32;
    let cpu_before = pid.map(cpu_us);
    for i in 0..total {
        let due = start + interval * i;
        tokio::time::sleep_until(due.into()).await;
        // Latency counts from dispatch: tokio's timer is 1 ms coarse, so `due` itself would
        // add up to 1 ms of the generator's own lateness. Queueing behind busy connections
        // (the coordinated-omission case) still counts, since dispatch is not delayed by them.
        tx.send(Instant::now()).await.unwrap();
    }
    drop(tx);
    for w in workers {
        w.await.unwrap();
    }
    let cpu = match (pid, cpu_before) {
        (Some(pid), Some(before)) => (cpu_us(pid) - before) as f64 / f64::from(total),
        _ => 0.0,
    };
    let mut l = latencies.lock().unwrap().clone();
    l.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (
        (
            ms(l[l.len() / 2]),
            ms(l[(l.len() * 99) / 100]),
            ms(*l.last().unwrap()),
        ),
        cpu,
    )
}

/// A tiny MPMC channel from tokio primitives (the bench has no async-channel crate).
fn async_channel<T: Send + 'static>() -> (Sender<T>, Receiver<T>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    (Sender(tx), Receiver(Arc::new(tokio::sync::Mutex::new(rx))))
}

struct Sender<T>(tokio::sync::mpsc::UnboundedSender<T>);
impl<T> Sender<T> {
    async fn send(&self, value: T) -> Result<(), ()> {
        self.0.send(value).map_err(|_| ())
    }
}

struct Receiver<T>(Arc<tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<T>>>);
impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}
impl<T> Receiver<T> {
    async fn recv(&self) -> Result<T, ()> {
        self.0.lock().await.recv().await.ok_or(())
    }
}

type Server = common::process::ServerProcess;

fn start_server(registry_host: &str) -> (Server, Duration) {
    start_server_at(registry_host, "warn")
}

/// A server logging at `log_level`. Below `warn` its stderr goes to a pipe a thread drains, as
/// a container runtime reads a container's stderr (and the bench's own output stays readable).
fn start_server_at(registry_host: &str, log_level: &str) -> (Server, Duration) {
    let (dir, addr) = common::process::prepare();
    let started = Instant::now();
    // Profiling aid: BENCH_SERVER_WRAPPER="valgrind --tool=callgrind" runs the server under it.
    let wrapper = std::env::var("BENCH_SERVER_WRAPPER").unwrap_or_default();
    let mut wrapper = wrapper.split_whitespace();
    let binary = common::process::server_binary();
    let mut command = match wrapper.next() {
        Some(program) => {
            let mut command = common::process::serve_command(program, dir.path(), addr);
            command.args(wrapper).arg(binary);
            command
        }
        None => common::process::serve_command(binary, dir.path(), addr),
    };
    let child = command
        .arg("serve")
        .env("TOLERABLE_REGISTRY__INSECURE", registry_host)
        .env("TOLERABLE_POLICY__SUPPORTED_ARCHITECTURES", "arm64,s390x")
        .env("TOLERABLE_LOG__LEVEL", log_level)
        // Runtime and allocator knobs under test, when set for the bench.
        // As deployed: the shipped Deployment's 1-CPU limit gives one worker thread.
        // BENCH_WORKER_THREADS=0 measures one per core instead.
        .env(
            "TOLERABLE_SERVER__WORKER_THREADS",
            std::env::var("BENCH_WORKER_THREADS").unwrap_or_else(|_| "1".into()),
        )
        .envs(passed_through())
        .stdout(Stdio::null())
        .stderr(if log_level == "warn" {
            Stdio::inherit()
        } else {
            Stdio::piped()
        })
        .spawn()
        .unwrap();
    let mut child = child;
    if let Some(mut stderr) = child.stderr.take() {
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    }
    // Ready = /readyz answers 200 over TLS.
    let client = probe::blocking_ready_client();
    loop {
        if client(addr) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "server never became ready"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let ready = started.elapsed();
    (Server { child, addr, dir }, ready)
}

/// Runtime and allocator knobs under test, and a shared cache (`BENCH_CACHE_URL`: warm
/// admissions must cost the same with one, since it is asked only on a miss), when set for the
/// bench.
fn passed_through() -> Vec<(&'static str, String)> {
    [
        ("GLIBC_TUNABLES", "GLIBC_TUNABLES"),
        ("MALLOC_ARENA_MAX", "MALLOC_ARENA_MAX"),
        ("BENCH_CACHE_URL", "TOLERABLE_SHARED_CACHE__URL"),
    ]
    .into_iter()
    .filter_map(|(from, to)| Some((to, std::env::var(from).ok()?)))
    .collect()
}

mod probe {
    use super::*;
    /// A minimal readiness probe: TLS handshake + GET /readyz on a fresh connection.
    pub fn blocking_ready_client() -> impl Fn(SocketAddr) -> bool {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        move |addr| {
            runtime.block_on(async {
                let Ok(tcp) = tokio::net::TcpStream::connect(addr).await else {
                    return false;
                };
                let Ok(stream) = tokio_rustls::TlsConnector::from(common::certs::client_config())
                    .connect(ServerName::try_from("localhost").unwrap(), tcp)
                    .await
                else {
                    return false;
                };
                let Ok((mut sender, conn)) =
                    hyper::client::conn::http1::handshake::<_, Full<Bytes>>(
                        hyper_util::rt::TokioIo::new(stream),
                    )
                    .await
                else {
                    return false;
                };
                tokio::spawn(conn);
                let request = hyper::Request::get("/readyz")
                    .header("host", "localhost")
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                matches!(sender.send_request(request).await, Ok(r) if r.status() == 200)
            })
        }
    }
}

/// The recorded AdmissionReview exactly as the API server sent it (pretty-printed, 3,362
/// bytes, its arm64-only image), only its registry host pointed at this run's registry.
fn recorded_review(registry_host: &str) -> Bytes {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/pod-create-simple.v1.json"
    ))
    .unwrap();
    Bytes::from(text.replace("127.0.0.1:25000", registry_host))
}

fn review_body(image: &str, uid: usize) -> Bytes {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/pod-create-simple.v1.json"
    ))
    .unwrap();
    let mut review: serde_json::Value = serde_json::from_str(&text).unwrap();
    review["request"]["uid"] = serde_json::json!(format!("bench-{uid}"));
    review["request"]["object"]["spec"]["containers"][0]["image"] = serde_json::json!(image);
    Bytes::from(review.to_string())
}

/// Server CPU per warm admission and per `/healthz`, one server at `warn` and one at `info`
/// (the shipped level: one line per admission), like with like: both request kinds sent at the
/// same fixed rate ([`COMPARE_RATE`], well below what one worker thread saturates at), so
/// neither is measured on a saturated server and the other on a partly idle one; the
/// AdmissionReview as recorded. Measured by turns so all see the same machine; min / median /
/// max of `rounds` turns.
fn log_levels(
    runtime: &tokio::runtime::Runtime,
    registry_host: &str,
    run: Duration,
    rounds: usize,
) {
    let admit = Call {
        post: Some(recorded_review(registry_host)),
        path: "/mutate?timeout=10s",
    };
    let health = Call {
        post: None,
        path: "/healthz",
    };
    let servers: Vec<Server> = ["warn", "info"]
        .iter()
        .map(|level| start_server_at(registry_host, level).0)
        .collect();
    // Per server: CPU per admission, per /healthz, one entry per round.
    let mut figures = vec![(Vec::new(), Vec::new()); servers.len()];
    for _ in 0..rounds {
        for (server, (admissions, healthz)) in servers.iter().zip(figures.iter_mut()) {
            let pid = Some(server.child.id());
            runtime.block_on(async {
                let at = |call: &Call| {
                    fixed_rate_with_cpu(server.addr, pid, call.clone(), COMPARE_RATE, run)
                };
                healthz.push(at(&health).await.1);
                admissions.push(at(&admit).await.1);
            });
        }
    }
    let spread = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[0], v[v.len() / 2], v[v.len() - 1])
    };
    let mut warn_admission = 0.0;
    for (level, (admissions, healthz)) in ["warn", "info"].iter().zip(figures.iter_mut()) {
        let ((a_min, admission, a_max), (h_min, health, h_max)) =
            (spread(admissions), spread(healthz));
        println!(
            "| at {level}, {COMPARE_RATE}/s each: server CPU per warm admission / per /healthz (min / median / max) | {a_min:.1} / {admission:.1} / {a_max:.1} µs / {h_min:.1} / {health:.1} / {h_max:.1} µs ({:.2}× by the medians) |",
            admission / health
        );
        if *level == "warn" {
            warn_admission = admission;
        } else {
            println!(
                "| the info line's cost (info − warn, medians, per admission) | {:.1} µs |",
                admission - warn_admission
            );
        }
    }
}

/// The rate both request kinds are compared at: one worker thread answers warm admissions at
/// ~25,000/s, so this keeps it about a tenth busy for either kind.
const COMPARE_RATE: u32 = 2_000;

fn main() {
    common::init();
    let registry = registry::plain();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("| measurement | result |");
    println!("| --- | --- |");
    in_process_admission(&runtime, &registry.host);
    if std::env::var_os("BENCH_IN_PROCESS_ONLY").is_some() {
        return;
    }
    // Profile mode measures warm admissions alone: a server under callgrind would spend
    // minutes in the log-level rounds first.
    let profiling = std::env::var_os("BENCH_PROFILE_SECONDS").is_some();
    // BENCH_LOG_LEVEL_ROUNDS=N: only this comparison, N rounds.
    let only_levels = std::env::var("BENCH_LOG_LEVEL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok());
    if !profiling {
        log_levels(
            &runtime,
            &registry.host,
            Duration::from_secs(4),
            only_levels.unwrap_or(5),
        );
    }
    if only_levels.is_some() {
        return;
    }
    let (server, ready) = start_server(&registry.host);
    let pid = server.child.id();
    let idle_rss = common::rss_kib(pid);
    // The AdmissionReview as recorded (its own image, pushed to this registry).
    let warm = recorded_review(&registry.host);
    let run = Duration::from_secs(if std::env::var_os("BENCH_QUICK").is_some() {
        3
    } else {
        8
    });

    // Profiling aid: warm admissions only, for a while, against this pid (`perf record -p`).
    if let Some(seconds) = std::env::var("BENCH_PROFILE_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        eprintln!("server pid {pid}: warm admissions for {seconds} s");
        let (rps, cpu) = runtime.block_on(throughput(
            server.addr,
            pid,
            admission(&warm),
            Duration::from_secs(seconds),
        ));
        println!("| warm admissions | {rps:.0} req/s, {cpu:.1} µs server CPU each |");
        return;
    }
    println!(
        "| start to ready (process spawn → /readyz 200) | {:.1} ms |",
        ready.as_secs_f64() * 1000.0
    );
    println!("| RSS idle | {:.1} MiB |", idle_rss as f64 / 1024.0);
    runtime.block_on(warm_throughput_and_latency(&server, &warm, run));
    cold_lookups_and_memory(&runtime, registry, &server);
    let binary = common::process::server_binary();
    let size = std::fs::metadata(&binary).unwrap().len();
    let which = if binary == env!("CARGO_BIN_EXE_tolerable") {
        "release, not stripped".to_owned()
    } else {
        binary
    };
    println!(
        "| binary size ({which}) | {:.1} MiB |",
        size as f64 / (1 << 20) as f64
    );
    drop(server);
}

/// A POST of `review` to /mutate.
fn admission(review: &Bytes) -> Call {
    Call {
        post: Some(review.clone()),
        path: "/mutate?timeout=10s",
    }
}

/// The decision path alone, in process: parse, warm lookup, decide, patch, encode.
fn in_process_admission(runtime: &tokio::runtime::Runtime, registry_host: &str) {
    let engine = common::webhook::engine(
        common::webhook::policy(),
        common::settings(),
        Default::default(),
    );
    let admission = tolerable::admission::Admission::new(engine);
    let body = review_body(&format!("{registry_host}/fixtures/multiarch-oci:v1"), 0);
    runtime.block_on(async {
        let budget = Duration::from_secs(8);
        let first = admission.answer_review(&body, budget).await.unwrap();
        assert!(first.out.response.patch.is_some());
        let mut per = Vec::new();
        let rounds = if std::env::var_os("BENCH_IN_PROCESS_ONLY").is_some() { 200 } else { 20 };
        for _ in 0..rounds {
            const N: u32 = 2_000;
            let started = Instant::now();
            for _ in 0..N {
                let reviewed = admission.answer_review(&body, budget).await.unwrap();
                std::hint::black_box(reviewed.out.to_json());
            }
            per.push(started.elapsed() / N);
        }
        per.sort();
        let median = per[per.len() / 2].as_secs_f64() * 1e6;
        println!("| in-process admission: parse, warm lookup, decide, patch, encode (median) | {median:.1} µs |");
    });
}

/// Closed-loop rates and server CPU of /healthz, the warm admission and the same Pod as an
/// UPDATE (allowed without a lookup), then open-loop latency at fixed rates.
async fn warm_throughput_and_latency(server: &Server, warm: &Bytes, run: Duration) {
    let pid = server.child.id();
    let (health_rps, health_cpu) = throughput(
        server.addr,
        pid,
        Call {
            post: None,
            path: "/healthz",
        },
        run,
    )
    .await;
    let (admit_rps, admit_cpu) = throughput(server.addr, pid, admission(warm), run).await;
    let mut update: serde_json::Value = serde_json::from_slice(warm).unwrap();
    update["request"]["operation"] = serde_json::json!("UPDATE");
    let update = Bytes::from(update.to_string());
    let (update_rps, update_cpu) = throughput(server.addr, pid, admission(&update), run).await;
    println!("| server CPU per /healthz, saturated by {CONNECTIONS} keep-alive connections | {health_cpu:.1} µs ({health_rps:.0} req/s reached) |");
    println!("| server CPU per warm admission, saturated the same way | {admit_cpu:.1} µs ({admit_rps:.0} req/s reached) |");
    println!("| server CPU per UPDATE of the same Pod (read body, parse envelope, allow) | {update_cpu:.1} µs ({update_rps:.0} req/s reached) |");
    for rate in [1000, 5000] {
        let (p50, p99, max) =
            fixed_rate(server.addr, admission(warm), rate, Duration::from_secs(5)).await;
        println!("| latency at {rate} admissions/s (p50 / p99 / max) | {p50:.2} / {p99:.2} / {max:.2} ms |");
    }
}

/// Distinct images admitted per cold-lookup step: the memory target.
const DISTINCT: usize = 10_000;
/// Cold admissions one at a time, after the steps.
const SERIAL: usize = 500;

/// What the cold-lookup steps measured.
struct ColdRun {
    /// Server RSS (KiB) after each step, by the number of cold lookups so far.
    rss_by_count: Vec<(usize, u64)>,
    /// Each admission's latency in the first step, sorted, and that step's duration.
    first_step_latencies: Vec<Duration>,
    first_step_elapsed: Duration,
}

/// Distinct images: one index pushed under many tags, each admitted once (a cold lookup).
/// First 10,000 (the memory target), then on to BENCH_COLD_LOOKUPS (default 100,000) in
/// steps of 10,000, sampling RSS: once the cache is full (cache_max_entries, 20,000 by
/// default) it must stay flat.
fn cold_lookups_and_memory(
    runtime: &tokio::runtime::Runtime,
    registry: &registry::Registry,
    server: &Server,
) {
    let total: usize = std::env::var("BENCH_COLD_LOOKUPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let body = runtime.block_on(many_index(&registry.host));
    let cold = cold_lookups_in_steps(runtime, registry, server, &body, total);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    // One at a time: what a single new image costs, without queueing behind 31 others.
    runtime.block_on(common::fixtures::push_index_tags(
        &registry.host,
        "bench/many",
        &body,
        total..total + SERIAL,
        16,
    ));
    let mut serial = runtime.block_on(cold_admissions(
        server.addr,
        &registry.host,
        total,
        total + SERIAL,
        1,
    ));
    serial.sort();
    println!(
        "| cold admission, one at a time (p50 / p99) | {:.2} / {:.2} ms |",
        ms(serial[SERIAL / 2]),
        ms(serial[SERIAL * 99 / 100])
    );
    let latencies = &cold.first_step_latencies;
    println!(
        "| cold admissions (new image each, {CONNECTIONS} connections) | {:.0} /s; latency p50 / p99 {:.2} / {:.2} ms |",
        DISTINCT as f64 / cold.first_step_elapsed.as_secs_f64(),
        ms(latencies[latencies.len() / 2]),
        ms(latencies[latencies.len() * 99 / 100]),
    );
    rss_rows(&cold.rss_by_count);
}

/// Pushes the multi-arch fixture as `bench/many:t0`; returns its index's manifest body.
async fn many_index(registry_host: &str) -> Vec<u8> {
    common::fixtures::Pusher::for_mode(registry_host, Mode::Plain)
        .push("bench/many", "multiarch-oci", "t0")
        .await;
    let client =
        tolerable::registry::Resolver::new(common::settings(), Default::default()).unwrap();
    let index = client
        .resolve(&format!("{registry_host}/bench/many:t0"))
        .await
        .unwrap()
        .digest
        .clone();
    get_manifest(registry_host, "bench/many", &index).await
}

/// Pushes `body` as `total` tags, DISTINCT at a time, and admits each once over
/// CONNECTIONS connections, sampling the server's RSS after every step. After the first
/// step, prints the registry requests each new image cost.
fn cold_lookups_in_steps(
    runtime: &tokio::runtime::Runtime,
    registry: &registry::Registry,
    server: &Server,
    body: &[u8],
    total: usize,
) -> ColdRun {
    let pid = server.child.id();
    let (before_manifests, before_blobs) = runtime.block_on(registry.requests_for("bench/many"));
    let mut cold = ColdRun {
        rss_by_count: Vec::new(),
        first_step_latencies: Vec::new(),
        first_step_elapsed: Duration::ZERO,
    };
    for from in (0..total).step_by(DISTINCT) {
        let to = (from + DISTINCT).min(total);
        runtime.block_on(common::fixtures::push_index_tags(
            &registry.host,
            "bench/many",
            body,
            from..to,
            16,
        ));
        let started = Instant::now();
        let latencies = runtime.block_on(cold_admissions(
            server.addr,
            &registry.host,
            from,
            to,
            CONNECTIONS,
        ));
        if from == 0 {
            cold.first_step_elapsed = started.elapsed();
            cold.first_step_latencies = latencies;
            let (manifests, blobs) = runtime.block_on(registry.requests_for("bench/many"));
            println!(
                "| registry requests per new image (OCI index with platforms) | {:.2} ({} manifest GETs, {} blob GETs for {DISTINCT} images) |",
                (manifests - before_manifests + blobs - before_blobs) as f64 / DISTINCT as f64,
                manifests - before_manifests,
                blobs - before_blobs
            );
        }
        let rss = common::rss_kib(pid);
        cold.rss_by_count.push((to, rss));
        eprintln!("{to} cold lookups: RSS {:.1} MiB", rss as f64 / 1024.0);
    }
    cold.first_step_latencies.sort();
    cold
}

/// RSS with the first DISTINCT images cached, after each step, and its growth once the cache
/// is full.
fn rss_rows(rss_by_count: &[(usize, u64)]) {
    println!(
        "| RSS with {DISTINCT} distinct images cached | {:.1} MiB |",
        rss_by_count[0].1 as f64 / 1024.0
    );
    let samples: Vec<String> = rss_by_count
        .iter()
        .map(|(n, kib)| format!("{}k: {:.1}", n / 1000, *kib as f64 / 1024.0))
        .collect();
    println!(
        "| RSS (MiB) after N cold lookups | {} |",
        samples.join(", ")
    );
    if let (Some(full), Some(last)) = (
        rss_by_count.iter().find(|(n, _)| *n >= 30_000),
        rss_by_count.last(),
    ) {
        println!(
            "| RSS growth from {}k to {}k cold lookups (cache full at 20k) | {:+.1} MiB |",
            full.0 / 1000,
            last.0 / 1000,
            (last.1 as f64 - full.1 as f64) / 1024.0
        );
    }
}

/// Admits one Pod per tag `t{from}`..`t{to}` over `connections` connections; each latency.
async fn cold_admissions(
    addr: SocketAddr,
    host: &str,
    from: usize,
    to: usize,
    connections: usize,
) -> Vec<Duration> {
    let tls = common::certs::client_config();
    let next = Arc::new(AtomicU64::new(from as u64));
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let mut sender = connect(addr, tls.clone()).await;
        let (next, host) = (next.clone(), host.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= to {
                    break;
                }
                let call = Call {
                    post: Some(review_body(&format!("{host}/bench/many:t{i}"), i)),
                    path: "/mutate?timeout=10s",
                };
                let started = Instant::now();
                send(&mut sender, &call).await;
                latencies.push(started.elapsed());
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

async fn get_manifest(host: &str, repository: &str, digest: &str) -> Vec<u8> {
    let tcp = tokio::net::TcpStream::connect(host).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let request = hyper::Request::get(format!("/v2/{repository}/manifests/{digest}"))
        .header("host", host)
        .header("accept", common::fixtures::OCI_INDEX)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec()
}
