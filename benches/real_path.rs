//! The real path (`cargo bench --bench real_path`, or `make bench`): what one admission costs
//! the server when a real API server sends it. The release binary `tolerable serve` with the
//! shipped defaults (`info` log, one line per admission, written to a file; the node watch over
//! `BENCH_NODES` Nodes of the scale fake, `tests/common/scale_api.rs`; the namespace watch; pull
//! secrets read), one worker thread as the Deployment's 1-CPU limit gives; a load generator
//! shaped like the API server's webhook client: [`CONNECTIONS`] HTTP/1.1 keep-alive
//! connections over TLS, one request in flight on each, requests dispatched open loop at
//! `BENCH_RATE` per second to whichever connection is free, the request line and headers the
//! API server sends, and the AdmissionReview a v1.36.3 API server sent for a ReplicaSet's Pod
//! (`tests/data/admissionreview/v1.36/`, as compact as it was on the wire, 7,363 bytes; its
//! three images pointed at the local registry's fixtures), each request with its own uid and
//! service-account token volume ([`VARIANTS`]), as the Pods of one template come.
//!
//! Three kinds of request on the same connections, by turns in each of `BENCH_ROUNDS` rounds
//! (`BENCH_SECONDS` each): deciding (the Pod in `default`: a patch), nothing to do (the same
//! Pod in `kube-system`, which the shipped `skip_namespaces` names) and `GET /healthz`. Server
//! CPU per request = utime + stime from `/proc/PID/stat` over the turn / requests answered;
//! printed as min / median / max over the rounds, and each round's ratios to `/healthz` in the
//! same round. `BENCH_PROFILE=deciding|nothing|healthz` sends only that kind for
//! `BENCH_SECONDS` (for `perf record -g -p PID`; the PID is printed first);
//! `BENCH_SERVER_BINARY` runs another build of `tolerable` (an earlier commit's, or the
//! image's static musl binary: `make bench-shipped`) instead.

#[path = "../tests/common/mod.rs"]
mod common;

use common::webhook::keep_alive_connection as connect;

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::process::{cpu_us, ServerProcess};
use common::scale_api::ScaleApiServer;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;

/// About as many connections as a v1.36 API server opened to tolerable under 16 clients
/// creating Pods (13–19 in the recordings and the issue's measurement).
const CONNECTIONS: usize = 15;

/// The recorded request as it was on the wire (the stored file is pretty-printed).
const WIRE_LENGTH: usize = 7363;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Deciding,
    NothingToDo,
    Healthz,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Deciding, Kind::NothingToDo, Kind::Healthz];

    fn name(self) -> &'static str {
        match self {
            Kind::Deciding => "deciding (a patch)",
            Kind::NothingToDo => "nothing to do (skip_namespaces)",
            Kind::Healthz => "/healthz",
        }
    }
}

/// How many variants of each body the load cycles through. Each has its own request uid and
/// its own service-account token volume (`kube-api-access-` and five random characters, which
/// the ServiceAccount admission plugin gives every Pod: in the spec's volumes, in every
/// container's volumeMounts and in managedFields), as an API server sends the Pods of one
/// template — never one body again and again, which a server could answer from memory.
const VARIANTS: usize = 256;

/// The two AdmissionReview bodies, in [`VARIANTS`] each: the recorded one, and the same Pod in
/// `kube-system`.
struct Bodies {
    deciding: Vec<Bytes>,
    nothing_to_do: Vec<Bytes>,
    sent: AtomicU64,
}

impl Bodies {
    /// The next variant of `kind`'s body.
    fn next(&self, kind: Kind) -> Bytes {
        let n = self.sent.fetch_add(1, Ordering::Relaxed) as usize % VARIANTS;
        match kind {
            Kind::Deciding => self.deciding[n].clone(),
            _ => self.nothing_to_do[n].clone(),
        }
    }
}

/// The recorded request uid and token volume suffix.
const RECORDED_UID: &str = "892f6fc9-8f59-4695-9a29-c1c9c245be8c";
const RECORDED_TOKEN_VOLUME: &str = "kube-api-access-x7k2p";

/// `wire` as the `n`th Pod of its template: its own request uid and token volume (the same
/// lengths as recorded, so the body's length is too).
fn variant(wire: &str, n: usize) -> Bytes {
    // The characters of Kubernetes' random name suffixes (`k8s.io/apimachinery` rand).
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let suffix: String = (0..5u32)
        .map(|i| ALPHABET[n / ALPHABET.len().pow(i) % ALPHABET.len()] as char)
        .collect();
    let uid = format!("{}{n:012x}", &RECORDED_UID[..24]);
    let body = wire
        .replace(RECORDED_TOKEN_VOLUME, &format!("kube-api-access-{suffix}"))
        .replace(RECORDED_UID, &uid);
    assert_eq!(body.len(), wire.len());
    Bytes::from(body)
}

/// `json` without the whitespace between tokens, as Go's encoder writes it.
fn compact(json: &str) -> String {
    let (mut out, mut in_string, mut escaped) = (String::with_capacity(json.len()), false, false);
    for c in json.chars() {
        if in_string {
            (escaped, in_string) = (!escaped && c == '\\', escaped || c != '"');
        } else if c.is_ascii_whitespace() {
            continue;
        } else {
            in_string = c == '"';
        }
        out.push(c);
    }
    out
}

fn bodies(registry_host: &str) -> Bodies {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/admissionreview/v1.36/pod-create-replicaset-shaped.json"
    ))
    .unwrap();
    // Go's json.Encoder ends the document with a newline.
    let wire = compact(&text) + "\n";
    assert_eq!(wire.len(), WIRE_LENGTH, "the recorded Content-Length");
    let mut deciding = wire;
    for (recorded, fixture) in [
        ("registry.example.com/shop/migrate:1.4.2", "multiarch-oci"),
        ("registry.example.com/shop/web:1.4.2", "multiarch-docker"),
        ("registry.example.com/mesh/proxy:2.11", "nested-index"),
    ] {
        assert!(deciding.contains(recorded));
        deciding = deciding.replace(recorded, &format!("{registry_host}/fixtures/{fixture}:v1"));
    }
    let team = r#""namespace":"team-a""#;
    assert_eq!(deciding.matches(team).count(), 2, "request and object");
    let nothing_to_do = deciding.replace(team, r#""namespace":"kube-system""#);
    // Deciding in `default`: the recorded Namespaces set no policy there (`team-a` is report
    // only: its answer would be the annotation alone, not the patch a real decision writes).
    let deciding = deciding.replace(team, r#""namespace":"default""#);
    assert_eq!(deciding.matches(RECORDED_TOKEN_VOLUME).count(), 5);
    assert_eq!(deciding.matches(RECORDED_UID).count(), 1);
    Bodies {
        deciding: (0..VARIANTS).map(|n| variant(&deciding, n)).collect(),
        nothing_to_do: (0..VARIANTS).map(|n| variant(&nothing_to_do, n)).collect(),
        sent: AtomicU64::new(0),
    }
}

/// `tolerable serve` with the shipped defaults, its cluster the fake behind `kubeconfig`, ready
/// (the first node list synced).
fn spawn(kubeconfig: &std::path::Path, registry_host: &str) -> ServerProcess {
    let (dir, addr) = common::process::prepare();
    let binary = common::process::server_binary();
    let child = common::process::serve_command(binary, dir.path(), addr)
        .arg("serve")
        .env("KUBECONFIG", kubeconfig)
        .env("TOLERABLE_REGISTRY__INSECURE", registry_host)
        .env("TOLERABLE_SERVER__WORKER_THREADS", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("stderr.log")).unwrap())
        .spawn()
        .unwrap();
    let server = ServerProcess { child, addr, dir };
    let client = common::webhook::client();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    runtime.block_on(async {
        let url = format!("https://localhost:{}/readyz", addr.port());
        while !matches!(client.get(&url).send().await, Ok(r) if r.status() == 200) {
            assert!(started.elapsed() < Duration::from_secs(120), "never ready");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    server
}

/// One request of `kind`, with the API server's request line and headers; checks the answer
/// is what that kind promises; the answer's body.
async fn send(sender: &mut SendRequest<Full<Bytes>>, kind: Kind, bodies: &Bodies) -> Bytes {
    sender.ready().await.unwrap();
    let builder = hyper::Request::builder().header("host", "tolerable.tolerable.svc:443");
    let request = match kind {
        Kind::Healthz => builder
            .method("GET")
            .uri("/healthz")
            .body(Full::new(Bytes::new())),
        Kind::Deciding | Kind::NothingToDo => builder
            .method("POST")
            .uri("/mutate?timeout=10s")
            .header("user-agent", "kube-apiserver-admission")
            .header("accept", "application/json, */*")
            .header("content-type", "application/json")
            .header("accept-encoding", "gzip")
            .body(Full::new(bodies.next(kind))),
    }
    .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let text = std::str::from_utf8(&body).unwrap();
    match kind {
        Kind::Healthz => {}
        Kind::Deciding => assert!(text.contains(r#""patch":"#), "{text}"),
        Kind::NothingToDo => assert!(
            text.contains(r#""allowed":true"#) && !text.contains("patch"),
            "{text}"
        ),
    }
    body
}

/// What the API server must apply for a deciding answer: the patch's operations and bytes (the
/// smaller, the less it spends on it, issue 39), and of those the decision annotation's.
fn describe_patch(answer: &[u8]) -> String {
    use base64::Engine as _;
    let review: serde_json::Value = serde_json::from_slice(answer).unwrap();
    let encoded = review["response"]["patch"].as_str().unwrap();
    let patch = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    let ops: Vec<serde_json::Value> = serde_json::from_slice(&patch).unwrap();
    let paths: Vec<&str> = ops.iter().map(|op| op["path"].as_str().unwrap()).collect();
    let annotation = ops
        .iter()
        .find(|op| {
            op["path"]
                .as_str()
                .unwrap()
                .starts_with("/metadata/annotations")
        })
        .map_or(0, |op| op["value"].to_string().len());
    if std::env::var_os("BENCH_SHOW_PATCH").is_some() {
        eprintln!("{}", String::from_utf8_lossy(&patch));
    }
    format!(
        "{} operations ({}), {} bytes of JSON Patch, of which the annotation {annotation}",
        ops.len(),
        paths.join(", "),
        patch.len()
    )
}

/// The load generator: a queue of requests due, served by whichever connection is free.
struct Load {
    queue: tokio::sync::mpsc::UnboundedSender<Kind>,
    answered: Arc<AtomicU64>,
}

impl Load {
    async fn start(addr: SocketAddr, bodies: Arc<Bodies>) -> Self {
        let tls = common::certs::client_config();
        let (queue, rx) = tokio::sync::mpsc::unbounded_channel::<Kind>();
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let answered = Arc::new(AtomicU64::new(0));
        for connection in 0..CONNECTIONS {
            let mut sender = connect(addr, tls.clone()).await;
            // Warm: the first deciding admission looks the images up and reads the secret.
            for kind in Kind::ALL {
                let answer = send(&mut sender, kind, &bodies).await;
                if connection == 1 && kind == Kind::Deciding {
                    println!("Deciding answer: {}", describe_patch(&answer));
                }
            }
            let (rx, bodies, answered) = (rx.clone(), bodies.clone(), answered.clone());
            tokio::spawn(async move {
                loop {
                    let Some(kind) = rx.lock().await.recv().await else {
                        return;
                    };
                    send(&mut sender, kind, &bodies).await;
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        Self { queue, answered }
    }

    /// `kind` at `rate`/s for `run`, open loop; server CPU µs per request, once all are answered.
    async fn turn(&self, pid: u32, kind: Kind, rate: u32, run: Duration) -> f64 {
        let total = (run.as_secs_f64() * f64::from(rate)) as u64;
        let interval = Duration::from_secs(1) / rate;
        let answered_before = self.answered.load(Ordering::Relaxed);
        let cpu_before = cpu_us(pid);
        let start = tokio::time::Instant::now();
        for i in 0..total {
            tokio::time::sleep_until(start + interval * i as u32).await;
            self.queue.send(kind).unwrap();
        }
        let waited = Instant::now();
        while self.answered.load(Ordering::Relaxed) - answered_before < total {
            assert!(waited.elapsed() < Duration::from_secs(60), "answers hung");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        (cpu_us(pid) - cpu_before) as f64 / total as f64
    }
}

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The machine, as `lscpu` names it, and its load now (the cores are shared).
fn machine() -> String {
    let lscpu = std::process::Command::new("lscpu")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let field = |name: &str| {
        lscpu
            .lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
            .unwrap_or_else(|| "?".into())
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "{}, {} CPUs ({}); load average {}",
        field("Model name:"),
        field("CPU(s):"),
        field("Hypervisor vendor:"),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}

fn spread(v: &[f64]) -> String {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    format!(
        "{:.1} / {:.1} / {:.1}",
        v[0],
        v[v.len() / 2],
        v[v.len() - 1]
    )
}

fn report(cpu: &[Vec<f64>; 3], rounds: usize, rate: u32, run: Duration) {
    println!(
        "| server CPU per request, {rounds} rounds × {:.0} s per kind at {rate}/s over {CONNECTIONS} connections | min / median / max µs | × /healthz in the same round (min / median / max) |",
        run.as_secs_f64()
    );
    println!("| --- | --- | --- |");
    for (i, kind) in Kind::ALL.iter().enumerate() {
        let ratios: Vec<f64> = (0..rounds).map(|r| cpu[i][r] / cpu[2][r]).collect();
        let ratio = match kind {
            Kind::Healthz => "1".to_owned(),
            _ => {
                let mut r = ratios.clone();
                r.sort_by(f64::total_cmp);
                format!(
                    "{:.2} / {:.2} / {:.2}",
                    r[0],
                    r[r.len() / 2],
                    r[r.len() - 1]
                )
            }
        };
        println!("| {} | {} | {ratio} |", kind.name(), spread(&cpu[i]));
    }
}

fn main() {
    common::init();
    let registry = common::registry::plain();
    let nodes: usize = env_or("BENCH_NODES", 5000);
    let (rounds, rate) = (
        env_or("BENCH_ROUNDS", 5usize),
        env_or("BENCH_RATE", 1000u32),
    );
    // `/proc/PID/stat` counts CPU in 10 ms ticks: over 10 s at 1,000/s a figure is within 1 µs
    // per request (5 s gave 2 µs steps, a sixth of a `/healthz`, too coarse for its ratios).
    let run = Duration::from_secs_f64(env_or("BENCH_SECONDS", 10.0));
    let api = ScaleApiServer::start(nodes, nodes * 3 / 10);
    let kubeconfig = api.kubeconfig();
    let server = spawn(kubeconfig.path(), &registry.host);
    let pid = server.child.id();
    let bodies = Arc::new(bodies(&registry.host));
    println!("Machine: {}", machine());
    println!("Server PID {pid}; {nodes} Nodes in the fake cluster");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let load = Load::start(server.addr, bodies).await;
        if let Ok(only) = std::env::var("BENCH_PROFILE") {
            let kind = match only.as_str() {
                "deciding" => Kind::Deciding,
                "nothing" => Kind::NothingToDo,
                _ => Kind::Healthz,
            };
            let cpu = load.turn(pid, kind, rate, run).await;
            println!("| {} | {cpu:.1} µs |", kind.name());
            return;
        }
        let mut cpu: [Vec<f64>; 3] = Default::default();
        for round in 0..rounds {
            // Each round starts with another kind, so none always follows the same one.
            for k in 0..3 {
                let i = (round + k) % 3;
                cpu[i].push(load.turn(pid, Kind::ALL[i], rate, run).await);
            }
        }
        report(&cpu, rounds, rate, run);
    });
    println!("After the run: {}", machine());
}
