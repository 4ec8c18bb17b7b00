//! Registry cost of a cluster (`cargo bench --bench cluster`, or `make bench`), first a rollout
//! storm (2,000 admissions in 2 s of one new image over 3 replicas sharing redis, 5,000 Nodes,
//! each answer within 1 s, one GET per digest), then how many manifest
//! GETs and HEADs the real registry sees, counted in its own access log, while admissions are
//! spread over several release `tolerable serve` processes — with a shared cache (one Debian
//! `redis-server`) and without.
//!
//! 200 images (each its own repository and index digest) are admitted at random for
//! `BENCH_PERIODS` (6) tag TTLs of `BENCH_TTL_MS` (2 s): short TTLs stand in for the shipped
//! 5 minutes, so the run stands for 30 minutes. A third of the way through, 20 tags move to a
//! new digest (one more platform, so the answer shows it); two thirds through, they move back
//! to the digest they had (known). Checked: manifest GETs == distinct digests, HEADs ≤ images ×
//! periods, every admission of a moved tag more than one TTL after the move saw it, and (with
//! the shared cache) 0 GETs after all replicas restart. Results and method in BENCHMARKS.md.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::fixtures::{Pusher, DOCKER_MANIFEST, OCI_INDEX};
use common::redis::RedisServer;
use common::registry::{self, Mode, Registry};
use serde_json::{json, Value};

const IMAGES: usize = 200;
const MOVED: usize = 20;
/// Admissions per second, over all replicas.
const RATE: u32 = 400;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One image: its repository, and the two index bodies its tag `v1` takes.
struct Image {
    repository: String,
    original: Vec<u8>,
    moved: Vec<u8>,
}

/// A manifest's body by digest or tag (as the bench, not as tolerable: not counted).
async fn manifest(host: &str, repository: &str, reference: &str, accept: &str) -> Vec<u8> {
    reqwest::Client::new()
        .get(format!(
            "http://{host}/v2/{repository}/manifests/{reference}"
        ))
        .header("accept", accept)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec()
}

/// Pushes image `i` under `prefix`: the three-platform index (its children), an s390x image, and
/// as `v1` the index annotated with its name (a digest of its own). The moved body adds s390x.
async fn push_image(host: &str, prefix: &str, i: usize) -> Image {
    let repository = format!("{prefix}/img{i}");
    let pusher = Pusher::for_mode(host, Mode::Plain);
    let base = pusher.push(&repository, "multiarch-oci", "base").await;
    let s390x = pusher.push(&repository, "s390x-docker", "s390x").await;
    let mut index: Value =
        serde_json::from_slice(&manifest(host, &repository, &base, OCI_INDEX).await).unwrap();
    index["annotations"] = json!({"bench.image": repository});
    let original = serde_json::to_vec(&index).unwrap();
    let s390x_body = manifest(host, &repository, &s390x, DOCKER_MANIFEST).await;
    index["manifests"].as_array_mut().unwrap().push(json!({
        "mediaType": DOCKER_MANIFEST, "digest": s390x, "size": s390x_body.len(),
        "platform": {"os": "linux", "architecture": "s390x"},
    }));
    let moved = serde_json::to_vec(&index).unwrap();
    pusher
        .manifest(&repository, "v1", OCI_INDEX, &original)
        .await;
    Image {
        repository,
        original,
        moved,
    }
}

async fn push_images(host: &str, prefix: &str) -> Vec<Image> {
    let mut images = Vec::new();
    for chunk in (0..IMAGES).collect::<Vec<_>>().chunks(20) {
        let pushed = chunk.iter().map(|i| push_image(host, prefix, *i));
        images.extend(futures_util::future::join_all(pushed).await);
    }
    images
}

/// A release `tolerable serve` on a free port.
type Server = common::process::ServerProcess;

fn start_server(registry: &str, cache_url: Option<&str>, ttl: Duration) -> Server {
    start_server_in(registry, cache_url, ttl, None)
}

/// [`start_server`], reading the cluster behind `kubeconfig` (pull secrets, the node watch)
/// when given.
fn start_server_in(
    registry: &str,
    cache_url: Option<&str>,
    ttl: Duration,
    kubeconfig: Option<&std::path::Path>,
) -> Server {
    let (dir, addr) = common::process::prepare();
    let mut command =
        common::process::serve_command(env!("CARGO_BIN_EXE_tolerable"), dir.path(), addr);
    command
        .arg("serve")
        .env("TOLERABLE_REGISTRY__INSECURE", registry)
        .env("TOLERABLE_POLICY__SUPPORTED_ARCHITECTURES", "arm64,s390x")
        .env("TOLERABLE_LOG__LEVEL", "warn")
        .env("TOLERABLE_SERVER__WORKER_THREADS", "1")
        .env("TOLERABLE_CACHE__TAG_TTL", format!("{}ms", ttl.as_millis()))
        .stdout(Stdio::null());
    if let Some(url) = cache_url {
        command.env("TOLERABLE_SHARED_CACHE__URL", url);
    }
    if let Some(kubeconfig) = kubeconfig {
        command.env("KUBECONFIG", kubeconfig);
    }
    let child = command.spawn().unwrap();
    let server = Server { child, addr, dir };
    let started = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never listened"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    server
}

/// The AdmissionReview of a Pod naming `image`.
fn review(image: &str) -> String {
    let mut review = common::webhook::recorded("pod-create-simple.v1.json", "unused");
    review["request"]["object"]["spec"]["containers"][0]["image"] = json!(image);
    review.to_string()
}

/// One admission's outcome: which image, when it was sent (since the run began), whether the
/// answer tolerated s390x (the moved digest's extra platform).
#[derive(Clone, Copy)]
struct Answered {
    image: usize,
    sent: Duration,
    s390x: bool,
}

/// Admits `image` at `server`; whether the patch tolerates s390x.
async fn admit(client: &reqwest::Client, server: SocketAddr, body: String) -> bool {
    let response = client
        .post(format!(
            "https://localhost:{}/mutate?timeout=10s",
            server.port()
        ))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    let patch = answer["response"]["patch"]
        .as_str()
        .unwrap_or_else(|| panic!("not patched: {answer}"));
    use base64::Engine as _;
    let patch = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .unwrap();
    String::from_utf8(patch).unwrap().contains("s390x")
}

/// What the tags should point at, when: moves happen at these offsets into the run.
struct Moves {
    away: Duration,
    back: Duration,
}

/// Admissions at [`RATE`]/s for `run`, each naming a random image and going to the next
/// server in turn; the first [`MOVED`] images' tags move as `moves` says.
async fn run_load(
    host: &str,
    images: &[Image],
    servers: &[SocketAddr],
    run: Duration,
    moves: &Moves,
) -> Vec<Answered> {
    let client = common::webhook::client();
    let answered = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let mover = move_tags(host, images, started, moves);
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / RATE);
    let mut tasks = Vec::new();
    let mut n = 0usize;
    let load = async {
        while started.elapsed() < run {
            ticks.tick().await;
            let image = pseudo_random(n) % images.len();
            let server = servers[n % servers.len()];
            let body = review(&format!("{host}/{}:v1", images[image].repository));
            let (client, answered) = (client.clone(), answered.clone());
            tasks.push(tokio::spawn(async move {
                let sent = started.elapsed();
                let s390x = admit(&client, server, body).await;
                answered
                    .lock()
                    .unwrap()
                    .push(Answered { image, sent, s390x });
            }));
            n += 1;
        }
    };
    tokio::join!(load, mover);
    for task in tasks {
        task.await.unwrap();
    }
    let answered = answered.lock().unwrap().clone();
    answered
}

/// Moves the first [`MOVED`] tags to their moved digest at `moves.away`, back at `moves.back`.
async fn move_tags(host: &str, images: &[Image], started: Instant, moves: &Moves) {
    let pusher = Pusher::for_mode(host, Mode::Plain);
    for (at, moved) in [(moves.away, true), (moves.back, false)] {
        tokio::time::sleep_until((started + at).into()).await;
        for image in &images[..MOVED] {
            let body = if moved { &image.moved } else { &image.original };
            pusher
                .manifest(&image.repository, "v1", OCI_INDEX, body)
                .await;
        }
    }
}

/// A fixed pseudo-random sequence (the same images in every run).
fn pseudo_random(n: usize) -> usize {
    let x = (n as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((x ^ (x >> 31)) % (1 << 31)) as usize
}

/// The latest an admission saw a moved tag's old digest (or the restored tag's moved one),
/// after the move: how long tolerable took to pick the move up, at most.
fn pickup_lag(answered: &[Answered], moves: &Moves) -> Duration {
    let mut lag = Duration::ZERO;
    for a in answered.iter().filter(|a| a.image < MOVED) {
        let (since, expected) = if a.sent >= moves.back {
            (moves.back, false)
        } else if a.sent >= moves.away {
            (moves.away, true)
        } else {
            continue;
        };
        if a.s390x != expected {
            lag = lag.max(a.sent - since);
        }
    }
    lag
}

/// Manifest GETs and HEADs tolerable sent for repositories under `prefix`, from the registry's
/// access log (after it caught up).
async fn manifest_requests(registry: &Registry, prefix: &str) -> (usize, usize) {
    registry.requests_by_method("bench-cluster/marker").await;
    let log = registry.log();
    let ours = log.lines().filter(|l| l.contains("\"tolerable/"));
    let (mut gets, mut heads) = (0, 0);
    for line in ours.filter(|l| l.contains(&format!(" /v2/{prefix}/")) && l.contains("/manifests/"))
    {
        if line.contains("\"GET ") {
            gets += 1;
        } else if line.contains("\"HEAD ") {
            heads += 1;
        }
    }
    (gets, heads)
}

/// One scenario's figures.
struct Figures {
    admissions: usize,
    gets: usize,
    heads: usize,
    distinct_digests: usize,
    lag: Duration,
    gets_after_restart: Option<usize>,
}

/// Distinct (repository, digest) pairs the admissions saw: every image's original digest, and
/// the moved one of each moved image whose move an admission saw (a tag moved and moved back
/// within one TTL may never be asked for in between).
fn distinct_digests(answered: &[Answered]) -> usize {
    let moved_seen: BTreeSet<usize> = answered
        .iter()
        .filter(|a| a.image < MOVED && a.s390x)
        .map(|a| a.image)
        .collect();
    IMAGES + moved_seen.len()
}

/// A scenario: `replicas` servers, sharing `redis` or not, for `periods` TTLs; then, with the
/// shared cache, all replicas restarted and every image admitted once more.
async fn scenario(
    registry: &Registry,
    prefix: &str,
    replicas: usize,
    redis: Option<&RedisServer>,
    ttl: Duration,
    periods: u32,
) -> Figures {
    let images = push_images(&registry.host, prefix).await;
    let url = redis.map(RedisServer::url);
    let start = || -> Vec<Server> {
        (0..replicas)
            .map(|_| start_server(&registry.host, url.as_deref(), ttl))
            .collect()
    };
    let servers = start();
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr).collect();
    let run = ttl * periods;
    let moves = Moves {
        away: run / 3,
        back: run * 2 / 3,
    };
    let answered = run_load(&registry.host, &images, &addrs, run, &moves).await;
    let (gets, heads) = manifest_requests(registry, prefix).await;
    let mut figures = Figures {
        admissions: answered.len(),
        gets,
        heads,
        distinct_digests: distinct_digests(&answered),
        lag: pickup_lag(&answered, &moves),
        gets_after_restart: None,
    };
    drop(servers);
    if redis.is_some() {
        let restarted = start();
        let client = common::webhook::client();
        for (i, image) in images.iter().enumerate() {
            let server = restarted[i % restarted.len()].addr;
            let body = review(&format!("{}/{}:v1", registry.host, image.repository));
            admit(&client, server, body).await;
        }
        let (after, _) = manifest_requests(registry, prefix).await;
        figures.gets_after_restart = Some(after - gets);
    }
    figures
}

/// Prints a row; with `checked`, fails unless GETs == distinct digests and HEADs are within
/// their bound (the targets; the comparison scenario is only shown).
fn report(name: &str, f: &Figures, ttl: Duration, periods: u32, checked: bool) {
    let head_bound = IMAGES * periods as usize;
    println!(
        "| {name} | {} | {} ({}) | {} (≤ {head_bound}) | {:.2} s (TTL {:.1} s) | {} |",
        f.admissions,
        f.gets,
        f.distinct_digests,
        f.heads,
        f.lag.as_secs_f64(),
        ttl.as_secs_f64(),
        f.gets_after_restart
            .map_or("—".to_owned(), |g| g.to_string()),
    );
    let mut failed = Vec::new();
    if f.gets != f.distinct_digests && checked {
        failed.push("GETs != distinct digests");
    }
    if f.heads > head_bound && checked {
        failed.push("HEADs over the bound");
    }
    if f.lag > ttl + Duration::from_millis(250) {
        failed.push("a move was picked up later than one TTL");
    }
    if f.gets_after_restart.is_some_and(|g| g > 0) {
        failed.push("GETs after the restart");
    }
    assert!(failed.is_empty(), "{name}: {failed:?}");
}

/// Issue 22's rollout storm: [`STORM`] admissions in 2 s of Pods naming one image no replica
/// has seen, spread over 3 replicas sharing `redis`, each with the shipped defaults against a
/// cluster of 5,000 EKS-shaped Nodes (node watch on, pull secrets read). Returns the slowest
/// answer and the manifest GETs the registry saw for the image.
async fn storm(registry: &Registry, redis: &RedisServer) -> (Duration, usize, usize) {
    let api = common::scale_api::ScaleApiServer::start(5_000, 1_500);
    let kubeconfig = api.kubeconfig();
    let url = redis.url();
    let servers: Vec<Server> = (0..3)
        .map(|_| {
            start_server_in(
                &registry.host,
                Some(&url),
                Duration::from_secs(300),
                Some(kubeconfig.path()),
            )
        })
        .collect();
    let client = common::webhook::client();
    for server in &servers {
        let readyz = format!("https://localhost:{}/readyz", server.addr.port());
        let started = Instant::now();
        while client
            .get(&readyz)
            .send()
            .await
            .map(|r| r.status().as_u16())
            .ok()
            != Some(200)
        {
            assert!(started.elapsed() < Duration::from_secs(60), "never synced");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let image = push_image(&registry.host, "bench-storm", 0).await;
    let body = review(&format!("{}/{}:v1", registry.host, image.repository));
    let mut ticks = tokio::time::interval(Duration::from_secs(2) / STORM as u32);
    let mut tasks = Vec::new();
    for n in 0..STORM {
        ticks.tick().await;
        let (client, body) = (client.clone(), body.clone());
        let server = servers[n % servers.len()].addr;
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            admit(&client, server, body).await;
            sent.elapsed()
        }));
    }
    let mut slowest = Duration::ZERO;
    for task in tasks {
        slowest = slowest.max(task.await.unwrap());
    }
    let (gets, _) = manifest_requests(registry, "bench-storm").await;
    (slowest, gets, STORM)
}

const STORM: usize = 2_000;

fn main() {
    common::init();
    let registry = registry::plain();
    let ttl = Duration::from_millis(env_number("BENCH_TTL_MS", 2000));
    let periods = env_number("BENCH_PERIODS", 6) as u32;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("| scenario | admissions | manifest GETs (distinct digests) | HEADs (bound) | latest pick-up of a move | GETs after restart |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let redis = RedisServer::start();
    {
        let (slowest, gets, sent) = runtime.block_on(storm(registry, &redis));
        println!(
            "| rollout storm: {sent} admissions in 2 s, one new image, 3 replicas sharing redis, 5,000 Nodes | {sent} | {gets} (1) | — | slowest answer {:.0} ms | — |",
            slowest.as_secs_f64() * 1000.0
        );
        assert!(
            slowest < Duration::from_secs(1),
            "an answer took {slowest:?}"
        );
        assert_eq!(gets, 1, "one manifest GET for the one digest");
        if std::env::var_os("BENCH_STORM_ONLY").is_some() {
            return;
        }
    }
    let shared = runtime.block_on(scenario(
        registry,
        "bench-shared",
        3,
        Some(&redis),
        ttl,
        periods,
    ));
    report("3 replicas, shared cache", &shared, ttl, periods, true);
    let solo = runtime.block_on(scenario(registry, "bench-solo", 1, None, ttl, periods));
    report("1 replica, no shared cache", &solo, ttl, periods, true);
    let apart = runtime.block_on(scenario(registry, "bench-apart", 3, None, ttl, periods));
    report("3 replicas, no shared cache", &apart, ttl, periods, false);
}
