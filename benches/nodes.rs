//! Node-watch benchmark (`cargo bench --bench nodes`, or `make bench`): the release binary
//! `tolerable serve` with the shipped defaults (node watch on, pull secrets read) against a
//! thin fake API server serving EKS-shaped Nodes (`tests/common/scale_api.rs`: ~18 KB each,
//! paged at 250, heartbeats as whole Nodes; and the recorded Namespaces, for the namespace
//! watch), beside the same server with only the node watch switched off (or, with
//! `BENCH_OFF=KEY=VALUE`, another one setting changed), in the same run. Prints a Markdown
//! table; method and results in BENCHMARKS.md.
//!
//! For each cluster size (`BENCH_NODES`, default "5000,15000"):
//! - start to ready (spawn → /readyz 200: the first list synced) and peak RSS (VmHWM) then;
//! - server CPU per warm admission (closed loop, 8 connections), watch on and watch off, by
//!   turns over `BENCH_ROUNDS` rounds (min / median / max);
//! - 500 kubelet-style heartbeats per second: the watch's CPU (share of one core) with no
//!   admissions, and the admissions' CPU while it runs (the churn's own CPU subtracted).

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::registry;
use common::scale_api::ScaleApiServer;

const CONNECTIONS: usize = 8;
const HEARTBEATS_PER_SECOND: u64 = 500;

type Server = common::process::ServerProcess;

use common::process::{cpu_us, status_mib};

/// `tolerable serve` as shipped (one worker thread, as the Deployment's 1-CPU limit gives; the
/// shipped `info` level, one line per admission, written to a file in the server's directory),
/// its cluster the fake behind `kubeconfig`; `changed` the one setting that differs, if any.
fn spawn(
    kubeconfig: &std::path::Path,
    registry_host: &str,
    changed: Option<(&str, &str)>,
) -> (Server, Duration) {
    let (dir, addr) = common::process::prepare();
    let started = Instant::now();
    let child = common::process::serve_command(env!("CARGO_BIN_EXE_tolerable"), dir.path(), addr)
        .arg("serve")
        .env("KUBECONFIG", kubeconfig)
        .env("TOLERABLE_REGISTRY__INSECURE", registry_host)
        .env("TOLERABLE_POLICY__SUPPORTED_ARCHITECTURES", "arm64,s390x")
        .env("TOLERABLE_SERVER__WORKER_THREADS", "1")
        .envs(changed)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("stderr.log")).unwrap())
        .spawn()
        .unwrap();
    let server = Server { child, addr, dir };
    let client = common::webhook::client();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        loop {
            let url = format!("https://localhost:{}/readyz", addr.port());
            if let Ok(r) = client.get(url).send().await {
                if r.status() == 200 {
                    break;
                }
            }
            assert!(started.elapsed() < Duration::from_secs(120), "never ready");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    (server, started.elapsed())
}

fn review_body(image: &str) -> bytes::Bytes {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/pod-create-simple.v1.json"
    ))
    .unwrap();
    let mut review: serde_json::Value = serde_json::from_str(&text).unwrap();
    review["request"]["object"]["spec"]["containers"][0]["image"] = serde_json::json!(image);
    bytes::Bytes::from(review.to_string())
}

/// Closed loop for `run`: server CPU µs per admission.
async fn admissions(server: &Server, body: &bytes::Bytes, run: Duration) -> (f64, u64, Duration) {
    let client = common::webhook::client();
    let url = format!(
        "https://localhost:{}/mutate?timeout=10s",
        server.addr.port()
    );
    let send = |client: reqwest::Client, url: String, body: bytes::Bytes| async move {
        let r = client.post(url).body(body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    };
    for _ in 0..CONNECTIONS * 4 {
        send(client.clone(), url.clone(), body.clone()).await;
    }
    let done = Arc::new(AtomicU64::new(0));
    let pid = server.child.id();
    let cpu_before = cpu_us(pid);
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let (client, url, body, done) =
                (client.clone(), url.clone(), body.clone(), done.clone());
            tokio::spawn(async move {
                while started.elapsed() < run {
                    send(client.clone(), url.clone(), body.clone()).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let cpu = cpu_us(pid) - cpu_before;
    let n = done.load(Ordering::Relaxed);
    (cpu as f64 / n as f64, n, started.elapsed())
}

/// Heartbeats at [`HEARTBEATS_PER_SECOND`] across all Nodes until `stop`.
fn churn(
    api: Arc<ScaleApiServer>,
    nodes: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let started = Instant::now();
        let mut sent = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let due = started + Duration::from_micros(sent * 1_000_000 / HEARTBEATS_PER_SECOND);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            api.heartbeat((sent as usize * 7919) % nodes);
            sent += 1;
        }
        sent
    })
}

fn spread(v: &mut [f64]) -> String {
    v.sort_by(f64::total_cmp);
    format!(
        "{:.1} / {:.1} / {:.1}",
        v[0],
        v[v.len() / 2],
        v[v.len() - 1]
    )
}

fn size(runtime: &tokio::runtime::Runtime, registry_host: &str, nodes: usize, rounds: usize) {
    let api = Arc::new(ScaleApiServer::start(nodes, nodes * 3 / 10));
    let kubeconfig = api.kubeconfig();
    let (on, ready) = spawn(kubeconfig.path(), registry_host, None);
    let (rss, peak) = (
        status_mib(on.child.id(), "VmRSS:"),
        status_mib(on.child.id(), "VmHWM:"),
    );
    println!(
        "| {nodes} | ready (first list synced) | {:.2} s; RSS {rss:.1} MiB, peak {peak:.1} MiB ({} list pages) |",
        ready.as_secs_f64(),
        api.lists()
    );
    // The second server: the node watch off (the default), or with `BENCH_OFF` another
    // default switched off (`TOLERABLE_POLICY__NAMESPACE_POLICY=false`, say), by turns.
    let off_setting =
        std::env::var("BENCH_OFF").unwrap_or_else(|_| "TOLERABLE_NODES__WATCH=false".into());
    let (off_key, off_value) = off_setting.split_once('=').expect("BENCH_OFF is KEY=VALUE");
    let (off, _) = spawn(kubeconfig.path(), registry_host, Some((off_key, off_value)));
    println!(
        "| {nodes} | RSS, {off_setting} | {:.1} MiB |",
        status_mib(off.child.id(), "VmRSS:")
    );
    let body = review_body(&format!("{registry_host}/fixtures/multiarch-oci:v1"));
    let run = Duration::from_secs(4);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    runtime.block_on(async {
        for _ in 0..rounds {
            with.push(admissions(&on, &body, run).await.0);
            without.push(admissions(&off, &body, run).await.0);
        }
    });
    let ratio = with.iter().sum::<f64>() / without.iter().sum::<f64>();
    println!(
        "| {nodes} | server CPU per warm admission, shipped / {off_setting} (min / median / max µs) | {} / {} ({ratio:.2}× by the means) |",
        spread(&mut with),
        spread(&mut without)
    );
    heartbeats(runtime, &api, &on, &body, nodes);
    println!(
        "| {nodes} | RSS after the runs, watch on | {:.1} MiB (peak {:.1} MiB) |",
        status_mib(on.child.id(), "VmRSS:"),
        status_mib(on.child.id(), "VmHWM:")
    );
}

/// The watch's CPU under heartbeats alone, then the admissions' CPU while they go on.
fn heartbeats(
    runtime: &tokio::runtime::Runtime,
    api: &Arc<ScaleApiServer>,
    on: &Server,
    body: &bytes::Bytes,
    nodes: usize,
) {
    let pid = on.child.id();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let beats = churn(api.clone(), nodes, stop.clone());
    std::thread::sleep(Duration::from_secs(1));
    let (cpu, started) = (cpu_us(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(5));
    let share = (cpu_us(pid) - cpu) as f64 / started.elapsed().as_micros() as f64;
    let (per_admission, n, elapsed) =
        runtime.block_on(admissions(on, body, Duration::from_secs(4)));
    let watch_part = share * elapsed.as_micros() as f64 / n as f64;
    stop.store(true, Ordering::Relaxed);
    let sent = beats.join().unwrap();
    println!(
        "| {nodes} | {HEARTBEATS_PER_SECOND} heartbeats/s: the watch's CPU, no admissions | {:.1} % of a core ({sent} heartbeats sent) |",
        share * 100.0
    );
    println!(
        "| {nodes} | server CPU per warm admission during the heartbeats, the watch's share subtracted | {:.1} µs ({per_admission:.1} µs with it) |",
        per_admission - watch_part
    );
}

fn main() {
    common::init();
    let registry = registry::plain();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sizes: Vec<usize> = std::env::var("BENCH_NODES")
        .unwrap_or_else(|_| "5000,15000".into())
        .split(',')
        .map(|n| n.trim().parse().unwrap())
        .collect();
    let rounds = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    println!("| Nodes | measurement | result |");
    println!("| --- | --- | --- |");
    for nodes in sizes {
        size(&runtime, &registry.host, nodes, rounds);
    }
}
