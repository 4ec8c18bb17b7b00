//! `tolerable review` over a repository's worth of manifests (`cargo bench --bench review`, or
//! `make bench`): the release binary, run as CI runs it, measured by GNU time (`/usr/bin/time`:
//! wall time and peak RSS).
//!
//! - **repository**: 1,500 files, 30 MB, 700 workloads (Deployments, each with a Service beside
//!   it, each its own image), ConfigMaps of dashboards and kustomizations around them;
//!   `review -R --json DIR`.
//! - **stdin**: 100 MB of the same mix on standard input (`review --json -`).
//!
//! Every lookup fails at once: `registry_allowlist` names a host no image is on, so each image is
//! refused before any request (and any DNS query). Targets: the repository in ≤ 1 s with peak
//! RSS ≤ 64 MiB; 100 MB on standard input with peak RSS ≤ 128 MiB. Results in BENCHMARKS.md.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

const FILES: usize = 1_500;
const WORKLOADS: usize = 700;
const REPOSITORY_BYTES: usize = 30_000_000;
const STDIN_BYTES: usize = 100_000_000;
const RUNS: usize = 5;

/// A Deployment and its Service, as a team writes them.
fn workload(i: usize) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: app-{i}\n  namespace: team-{team}\n  labels: {{app: app-{i}, tier: backend}}\nspec:\n  replicas: 3\n  selector:\n    matchLabels: {{app: app-{i}}}\n  template:\n    metadata:\n      labels: {{app: app-{i}, tier: backend}}\n    spec:\n      serviceAccountName: app-{i}\n      containers:\n      - name: app\n        image: ghcr.io/example/app-{i}:1.{i}.0\n        ports: [{{containerPort: 8080, name: http}}]\n        resources:\n          requests: {{cpu: 100m, memory: 128Mi}}\n          limits: {{memory: 256Mi}}\n        readinessProbe:\n          httpGet: {{path: /healthz, port: http}}\n        env:\n        - {{name: LOG_LEVEL, value: info}}\n        - {{name: PORT, value: '8080'}}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: app-{i}\n  namespace: team-{team}\nspec:\n  selector: {{app: app-{i}}}\n  ports: [{{port: 80, targetPort: http}}]\n",
        team = i % 20
    )
}

/// A ConfigMap holding a dashboard of about `bytes`, as monitoring stacks keep them.
fn dashboard(i: usize, bytes: usize) -> String {
    let mut text = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: dashboard-{i}\n  namespace: monitoring\n  labels: {{grafana_dashboard: '1'}}\ndata:\n  dashboard-{i}.json: |\n    {{\"title\": \"Dashboard {i}\", \"panels\": [\n"
    );
    let mut panel = 0;
    while text.len() < bytes {
        let _ = writeln!(
            text,
            "      {{\"id\": {panel}, \"type\": \"timeseries\", \"title\": \"Requests {panel}\", \"targets\": [{{\"expr\": \"sum(rate(http_requests_total{{job=\\\"app-{i}\\\"}}[5m])) by (code)\"}}]}},"
        );
        panel += 1;
    }
    text.push_str("      {}]}\n");
    text
}

/// The repository: `WORKLOADS` workload files, kustomizations, and dashboards for the rest of
/// the files and bytes.
fn repository(root: &Path) -> usize {
    let mut total = 0;
    let kustomizations = 100;
    let dashboards = FILES - WORKLOADS - kustomizations;
    let workload_bytes: usize = (0..WORKLOADS).map(|i| workload(i).len()).sum();
    let per_dashboard = (REPOSITORY_BYTES - workload_bytes) / dashboards;
    for i in 0..FILES {
        let dir = root.join(format!("apps/team-{}", i % 50));
        std::fs::create_dir_all(&dir).unwrap();
        let (name, text) = if i < WORKLOADS {
            (format!("app-{i}.yaml"), workload(i))
        } else if i < WORKLOADS + kustomizations {
            (
                format!("kustomization-{i}.yaml"),
                format!("resources:\n- app-{i}.yaml\nimages:\n- name: app\n  newTag: '2'\n"),
            )
        } else {
            (format!("dashboard-{i}.yaml"), dashboard(i, per_dashboard))
        };
        total += text.len();
        std::fs::write(dir.join(name), text).unwrap();
    }
    total
}

/// About `bytes` of the same mix as one stream: a workload for every 40 KB of dashboards.
fn stream(bytes: usize) -> (String, usize) {
    let mut text = String::with_capacity(bytes + (1 << 20));
    let mut workloads = 0;
    let mut i = 0;
    while text.len() < bytes {
        text.push_str("---\n");
        if i % 2 == 0 {
            text.push_str(&workload(i));
            workloads += 1;
        } else {
            text.push_str(&dashboard(i, 40_000));
        }
        i += 1;
    }
    (text, workloads)
}

/// One run: wall seconds and peak RSS (KiB), from GNU time; the JSON report's workload count.
fn run(args: &[&str], stdin: Option<&[u8]>) -> (f64, u64, usize) {
    let times = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new("/usr/bin/time")
        .arg("-f")
        .arg("%e %M")
        .arg("-o")
        .arg(times.path())
        .arg(env!("CARGO_BIN_EXE_tolerable"))
        .arg("review")
        .args(args)
        .env_clear()
        .env("TOLERABLE_REGISTRY__ALLOWLIST", "registry.invalid")
        .env("TOLERABLE_REGISTRY__LOOKUP_TIMEOUT", "1s")
        .env("TOLERABLE_LOG__LEVEL", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let feeder = stdin.map(<[u8]>::to_vec).map(|bytes| {
        std::thread::spawn(move || {
            let _ = input.write_all(&bytes);
        })
    });
    let out = child.wait_with_output().unwrap();
    if let Some(feeder) = feeder {
        feeder.join().unwrap();
    }
    // Every lookup fails here (no registry is allowed): no problem found, images not checked.
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let workloads = report["workloads"].as_array().unwrap().len();
    let times = std::fs::read_to_string(times.path()).unwrap();
    // GNU time writes "Command exited with non-zero status 4" before its own line.
    let mut fields = times.lines().last().unwrap().split_whitespace();
    let seconds = fields.next().unwrap().parse().unwrap();
    let kib = fields.next().unwrap().parse().unwrap();
    (seconds, kib, workloads)
}

/// Median wall time and the highest peak RSS of `RUNS` runs.
fn measure(name: &str, args: &[&str], stdin: Option<&[u8]>, workloads: usize, target: &str) {
    let mut seconds = Vec::new();
    let mut peak = 0;
    for _ in 0..RUNS {
        let (s, kib, found) = run(args, stdin);
        assert_eq!(found, workloads, "{name}: every workload reported");
        seconds.push(s);
        peak = peak.max(kib);
    }
    seconds.sort_by(f64::total_cmp);
    println!(
        "| {name} | {target} | {:.2} s (median of {RUNS}; {:.2}–{:.2}) | {:.1} MiB |",
        seconds[RUNS / 2],
        seconds[0],
        seconds[RUNS - 1],
        peak as f64 / 1024.0
    );
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = repository(dir.path());
    println!("| input | target | wall | peak RSS |\n| --- | --- | --- | --- |");
    let root = dir.path().to_str().unwrap();
    let name = format!(
        "{FILES} files, {:.1} MB, {WORKLOADS} workloads (-R)",
        bytes as f64 / 1e6
    );
    measure(
        &name,
        &["-R", "--json", root],
        None,
        WORKLOADS,
        "≤ 1 s, ≤ 64 MiB",
    );
    let (text, workloads) = stream(STDIN_BYTES);
    let name = format!(
        "{:.0} MB on stdin, {workloads} workloads",
        text.len() as f64 / 1e6
    );
    measure(
        &name,
        &["--json", "-"],
        Some(text.as_bytes()),
        workloads,
        "≤ 128 MiB",
    );
}
