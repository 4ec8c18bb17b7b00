//! Hostile registries, peak memory (`cargo bench --bench hostile_registry`, or `make bench`):
//! the release binary `tolerable serve` as its own process with one worker thread (as the
//! shipped Deployment runs it), the hostile registry of the tests (`tests/common/hostile.rs`:
//! nested indexes, children that send 4 MiB − 2 bytes and stall, config blobs that stall), and
//! each attack of issue 23 in turn, on fresh repositories so nothing is cached. The server's
//! RSS is sampled from `/proc/<pid>/status` every 10 ms. Prints a Markdown table; method and
//! results in BENCHMARKS.md.

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::hostile::HostileRegistry;
use serde_json::{json, Value};

/// `tolerable serve`, release build, one worker thread, the hostile registries (`hosts`,
/// comma-separated) spoken to over plain http.
struct Served(common::process::ServerProcess);

impl Served {
    async fn start(hosts: &str) -> Self {
        common::init();
        let (dir, addr) = common::process::prepare();
        let child =
            common::process::serve_command(env!("CARGO_BIN_EXE_tolerable"), dir.path(), addr)
                .arg("serve")
                .env("TOLERABLE_CREDENTIALS__READ_PULL_SECRETS", "false")
                .env("TOLERABLE_NODES__WATCH", "false")
                .env("TOLERABLE_SERVER__WORKER_THREADS", "1")
                .env("TOLERABLE_LOG__LEVEL", "error")
                .env("TOLERABLE_REGISTRY__INSECURE", hosts)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap();
        let served = Self(common::process::ServerProcess { child, addr, dir });
        for _ in 0..200 {
            if served.get("/readyz").await.is_some_and(|s| s == 200) {
                return served;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("tolerable serve did not become ready");
    }

    fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.0.addr.port())
    }

    async fn get(&self, path: &str) -> Option<u16> {
        let response = common::webhook::client().get(self.url(path)).send().await;
        response.ok().map(|r| r.status().as_u16())
    }

    /// One admission of a Pod naming `images`: the AdmissionReview's `response`.
    async fn admit(&self, images: &[String]) -> Value {
        let mut request = common::webhook::recorded("pod-create-simple.v1.json", "unused");
        let containers: Vec<Value> = images
            .iter()
            .enumerate()
            .map(|(i, image)| json!({"name": format!("c{i}"), "image": image}))
            .collect();
        request["request"]["object"]["spec"]["containers"] = json!(containers);
        let response = common::webhook::client()
            .post(self.url("/mutate?timeout=10s"))
            .header("content-type", "application/json")
            .body(request.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let review: Value = response.json().await.unwrap();
        review["response"].clone()
    }

    fn rss_kib(&self) -> u64 {
        common::rss_kib(self.0.child.id())
    }

    /// The highest RSS seen until the returned flag is set, sampled every 10 ms.
    fn sample_peak_rss(&self) -> (Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
        let stop = Arc::new(AtomicBool::new(false));
        let pid = self.0.child.id();
        let handle = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let peak = AtomicU64::new(0);
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(common::rss_kib(pid), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(10));
                }
                peak.load(Ordering::Relaxed)
            }
        });
        (stop, handle)
    }
}

/// One attack: `pods` Pods at once, each naming `images` images of the hostile repository
/// `repository` (fresh names each run, so nothing is cached).
struct Attack {
    name: &'static str,
    pods: usize,
    images: usize,
    repository: &'static str,
}

const ATTACKS: [Attack; 7] = [
    Attack {
        name: "one image of nested indexes (64 × 64 × 64, each index within its limits)",
        pods: 1,
        images: 1,
        repository: "evil/nested",
    },
    Attack {
        name: "16 images of nested indexes, one Pod",
        pods: 1,
        images: 16,
        repository: "evil/nested",
    },
    Attack {
        name: "one image: an index of 16 children that send 4 MiB − 2 bytes and stall",
        pods: 1,
        images: 1,
        repository: "evil/stalled",
    },
    Attack {
        name: "16 such images, one Pod",
        pods: 1,
        images: 16,
        repository: "evil/stalled",
    },
    Attack {
        name: "4 Pods × 16 single images whose config blobs stall at 4 MiB − 2 bytes",
        pods: 4,
        images: 16,
        repository: "evil/stallcfg",
    },
    Attack {
        name: "5 Pods, each one tag of nested indexes, on one registry",
        pods: 5,
        images: 1,
        repository: "evil/nested",
    },
    Attack {
        name: "5 Pods, each one image whose config blob stalls after its headers, on one registry",
        pods: 5,
        images: 1,
        repository: "evil/stallcfg",
    },
];

/// What one attack did.
struct Row {
    before_kib: u64,
    peak_kib: u64,
    requests: usize,
    elapsed: Duration,
    allowed: bool,
    /// Whether an ordinary image on the same registry got its patch afterwards (its breaker
    /// closed).
    ordinary_patched: bool,
}

/// Runs `attack` (the `n`th) against a hostile registry of its own (its own circuit breaker).
async fn run(served: &Served, hostile: &HostileRegistry, (n, attack): (usize, &Attack)) -> Row {
    let before_kib = served.rss_kib();
    let (stop, sampler) = served.sample_peak_rss();
    let started = Instant::now();
    let pods = (0..attack.pods).map(|pod| {
        let images: Vec<String> = (0..attack.images)
            .map(|i| format!("{}/{}{n}-{pod}-{i}:v1", hostile.host, attack.repository))
            .collect();
        async move { served.admit(&images).await["allowed"] == true }
    });
    let allowed = futures_util::future::join_all(pods).await;
    let elapsed = started.elapsed();
    // Lookups an admission gave up on end by their own deadline: let the memory settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let requests = hostile.requests();
    let ordinary = served
        .admit(&[format!("{}/good/app:v1", hostile.host)])
        .await;
    Row {
        before_kib,
        peak_kib: sampler.join().unwrap(),
        requests,
        elapsed,
        allowed: allowed.iter().all(|a| *a),
        ordinary_patched: ordinary.get("patch").is_some(),
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let registries: Vec<HostileRegistry> =
            ATTACKS.iter().map(|_| HostileRegistry::start()).collect();
        let hosts: Vec<&str> = registries.iter().map(|r| r.host.as_str()).collect();
        let served = Served::start(&hosts.join(",")).await;
        println!("| attack | RSS before → peak | registry requests | answered in | allowed | an ordinary image there afterwards |");
        println!("| --- | --- | --- | --- | --- | --- |");
        for (n, (attack, hostile)) in ATTACKS.iter().zip(&registries).enumerate() {
            let row = run(&served, hostile, (n, attack)).await;
            println!(
                "| {} | {:.1} → {:.1} MiB | {} | {:.2} s | {} | {} |",
                attack.name,
                mib(row.before_kib),
                mib(row.peak_kib),
                row.requests,
                row.elapsed.as_secs_f64(),
                row.allowed,
                if row.ordinary_patched { "patched" } else { "not patched" },
            );
        }
        println!("\nRSS at the end: {:.1} MiB", mib(served.rss_kib()));
    });
}
