//! `tolerable audit` at scale (`cargo bench --bench audit`, or `make bench`): 10,000 workloads,
//! 50,000 Pods and 5,000 Nodes served by a thin fake API server, the workloads' 200 images in
//! the real test registry (Debian's docker-registry on 127.0.0.1).
//!
//! The cluster is generated from recorded shapes: every workload, ReplicaSet, Job and Pod is a
//! copy of one recorded from a real kube-apiserver (`tests/data/kube-api/workloads/`) with its
//! name, namespace, uid, owner, node and image varied; every Node a copy of a recorded EKS-style
//! Node (`tests/data/kube-api/scale/`, about 18 KB of JSON each, managed fields and 50 status
//! images included) with its name, addresses and IDs varied as `make_nodes.py` does, 30 % arm64.
//! Lists are paged as the real server pages them (`tests/common/kube_pages.rs`).
//!
//! Measured on the release binary, run as an operator runs it (`tolerable audit -A --json`),
//! under GNU time: peak RSS (target ≤ 512 MiB) and wall time (≤ 60 s); from the registry's own
//! access log, tag-manifest requests per distinct image (must be exactly 1). The run fails when a
//! target is missed. `BENCH_AUDIT_WORKLOADS` (10000) and `BENCH_AUDIT_NODES` (5000) change the
//! size. Results and method in BENCHMARKS.md.

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use common::fixtures::Pusher;
use common::kube_pages::{self, ListQuery};
use common::registry::{self, Mode, Registry};
use serde_json::{json, Value};

const IMAGES: usize = 200;
const PODS_PER_WORKLOAD: usize = 5;
const NAMESPACES: usize = 100;
const REVISION: i64 = 1000;
const TARGET_RSS_MIB: u64 = 512;
const TARGET_SECONDS: f64 = 60.0;

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One kind's list: its kind, apiVersion and items (etcd key, JSON text), in key order.
struct Served {
    kind: &'static str,
    api_version: &'static str,
    items: Vec<(String, String)>,
}

impl Served {
    fn new(kind: &'static str, api_version: &'static str, items: Vec<Value>) -> Self {
        let mut items: Vec<(String, String)> = items
            .iter()
            .map(|item| (kube_pages::key_of(item), item.to_string()))
            .collect();
        items.sort_by(|a, b| a.0.cmp(&b.0));
        Self {
            kind,
            api_version,
            items,
        }
    }
}

/// The recorded item of `file` named `name`.
fn recorded_item(folder: &str, file: &str, name: &str) -> Value {
    let path = format!(
        "{}/tests/data/kube-api/{folder}/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    let list: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|item| item["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{path}: no {name}"))
        .clone()
}

fn set(value: &mut Value, pointer: &str, to: Value) {
    *value
        .pointer_mut(pointer)
        .unwrap_or_else(|| panic!("no {pointer}")) = to;
}

/// Node `i` of a 5,000-node EKS-style cluster, from the recorded arm64 or amd64 Node.
fn node(template: &Value, i: usize, arch: &str) -> Value {
    let mut node = template.clone();
    let name = format!(
        "ip-10-{}-{}-{}.ec2.internal",
        i / 65536 % 256,
        i / 256 % 256,
        i % 256
    );
    let instance = format!("i-0{i:016x}");
    set(&mut node, "/metadata/name", json!(name));
    set(
        &mut node,
        "/metadata/uid",
        json!(format!("{i:08x}-0000-4000-8000-000000000000")),
    );
    let labels = &mut node["metadata"]["labels"];
    labels["kubernetes.io/hostname"] = json!(name);
    labels["kubernetes.io/arch"] = json!(arch);
    labels["beta.kubernetes.io/arch"] = json!(arch);
    let zone = ["us-east-1a", "us-east-1b", "us-east-1c"][i % 3];
    set(
        &mut node,
        "/spec/providerID",
        json!(format!("aws:///{zone}/{instance}")),
    );
    let address = format!("10.0.{}.{}", i / 256 % 256, i % 256);
    set(
        &mut node,
        "/status/addresses",
        json!([{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name},
               {"type": "InternalDNS", "address": name}]),
    );
    let info = &mut node["status"]["nodeInfo"];
    info["machineID"] = json!(format!("{i:032x}"));
    info["systemUUID"] = json!(format!("ec2{i:029x}"));
    info["bootID"] = json!(format!("{i:08x}-aaaa-bbbb-cccc-{i:012x}"));
    node
}

fn nodes(n: usize) -> Vec<Value> {
    let arm = recorded_item(
        "scale",
        "node-list-limit-2.body.json",
        "ip-10-0-0-0.ec2.internal",
    );
    let amd = recorded_item(
        "scale",
        "node-list-continue.body.json",
        "ip-10-0-0-2.ec2.internal",
    );
    (0..n)
        .map(|i| {
            if i * 10 < n * 3 {
                node(&arm, i, "arm64")
            } else {
                node(&amd, i, "amd64")
            }
        })
        .collect()
}

fn node_name(i: usize) -> String {
    format!(
        "ip-10-{}-{}-{}.ec2.internal",
        i / 65536 % 256,
        i / 256 % 256,
        i % 256
    )
}

/// The recorded shapes the generated objects are copies of.
struct Shapes {
    deployment: Value,
    replica_set: Value,
    stateful_set: Value,
    cron_job: Value,
    job: Value,
    pod: Value,
}

impl Shapes {
    fn recorded() -> Self {
        let item = |file, name| recorded_item("workloads", file, name);
        Self {
            deployment: item("deployment-list.body.json", "web"),
            replica_set: item("replicaset-list.body.json", "web-5d9c7b"),
            stateful_set: item("statefulset-list.body.json", "db"),
            cron_job: item("cronjob-list.body.json", "nightly"),
            job: item("job-list.body.json", "nightly-29000000"),
            pod: item("pod-list.body.json", "web-5d9c7b-k7x2p"),
        }
    }
}

/// `shape` as object `name` in `namespace`, with `uid`, controlled by `owner` (kind, name,
/// uid), its containers (and its template's) running `image`.
fn copy(
    shape: &Value,
    (namespace, name, uid): (&str, &str, &str),
    owner: Option<(&str, &str, &str)>,
    image: &str,
) -> Value {
    let mut object = shape.clone();
    let meta = &mut object["metadata"];
    meta["name"] = json!(name);
    meta["namespace"] = json!(namespace);
    meta["uid"] = json!(uid);
    match owner {
        Some((kind, owner_name, owner_uid)) => {
            let api_version = if kind == "Job" || kind == "CronJob" {
                "batch/v1"
            } else {
                "apps/v1"
            };
            meta["ownerReferences"] = json!([{"apiVersion": api_version, "kind": kind,
                "name": owner_name, "uid": owner_uid, "controller": true, "blockOwnerDeletion": true}]);
        }
        None => {
            if let Some(meta) = meta.as_object_mut() {
                meta.remove("ownerReferences");
            }
        }
    }
    for pointer in [
        "/spec/containers",
        "/spec/template/spec/containers",
        "/spec/jobTemplate/spec/template/spec/containers",
    ] {
        if let Some(Value::Array(containers)) = object.pointer_mut(pointer) {
            for container in containers {
                container["image"] = json!(image);
            }
        }
    }
    object
}

/// Every generated object, by the plural its list is served under.
#[derive(Default)]
struct Generated {
    deployments: Vec<Value>,
    replicasets: Vec<Value>,
    statefulsets: Vec<Value>,
    cronjobs: Vec<Value>,
    jobs: Vec<Value>,
    pods: Vec<Value>,
}

/// Workload `w`: 7 in 10 Deployments (a current ReplicaSet with the Pods and an old one scaled
/// to 0), 2 in 10 StatefulSets, 1 in 10 CronJobs (one Job with the Pods); each with 5 Pods.
fn workload(shapes: &Shapes, out: &mut Generated, w: usize, image: &str, nodes: usize) {
    let namespace = format!("team-{}", w % NAMESPACES);
    let ns = namespace.as_str();
    let name = format!("app-{w}");
    let uid = |what: &str| format!("{w:08x}-{what}-4000-8000-000000000000");
    let (owner_kind, owner_name, owner_uid) = match w % 10 {
        0..=6 => {
            let deployment = uid("dddd");
            out.deployments.push(copy(
                &shapes.deployment,
                (ns, &name, &deployment),
                None,
                image,
            ));
            let owner = Some(("Deployment", name.as_str(), deployment.as_str()));
            let old = copy(
                &shapes.replica_set,
                (ns, &format!("{name}-0ld"), &uid("0000")),
                owner,
                image,
            );
            out.replicasets.push(old);
            let rs = format!("{name}-5d9c7b");
            out.replicasets.push(copy(
                &shapes.replica_set,
                (ns, &rs, &uid("rrrr")),
                owner,
                image,
            ));
            ("ReplicaSet", rs, uid("rrrr"))
        }
        7 | 8 => {
            out.statefulsets.push(copy(
                &shapes.stateful_set,
                (ns, &name, &uid("ssss")),
                None,
                image,
            ));
            ("StatefulSet", name.clone(), uid("ssss"))
        }
        _ => {
            let cron_job = uid("cccc");
            out.cronjobs
                .push(copy(&shapes.cron_job, (ns, &name, &cron_job), None, image));
            let owner = Some(("CronJob", name.as_str(), cron_job.as_str()));
            let job = format!("{name}-29000000");
            out.jobs
                .push(copy(&shapes.job, (ns, &job, &uid("jjjj")), owner, image));
            ("Job", job, uid("jjjj"))
        }
    };
    for k in 0..PODS_PER_WORKLOAD {
        let pod_name = format!("{owner_name}-{k}");
        let owner = Some((owner_kind, owner_name.as_str(), owner_uid.as_str()));
        let mut pod = copy(
            &shapes.pod,
            (
                ns,
                &pod_name,
                &format!("{w:08x}-{k:04x}-4000-8000-000000000000"),
            ),
            owner,
            image,
        );
        pod["spec"]["nodeName"] = json!(node_name((w * PODS_PER_WORKLOAD + k) * 7 % nodes));
        out.pods.push(pod);
    }
}

fn image(host: &str, w: usize) -> String {
    format!("{host}/bench-audit/app-{}:v1", w % IMAGES)
}

/// The fake API server's lists, by plural.
fn cluster(host: &str, workloads: usize, node_count: usize) -> Vec<(&'static str, Served)> {
    let shapes = Shapes::recorded();
    let mut out = Generated::default();
    for w in 0..workloads {
        workload(&shapes, &mut out, w, &image(host, w), node_count);
    }
    vec![
        (
            "deployments",
            Served::new("DeploymentList", "apps/v1", out.deployments),
        ),
        (
            "statefulsets",
            Served::new("StatefulSetList", "apps/v1", out.statefulsets),
        ),
        (
            "daemonsets",
            Served::new("DaemonSetList", "apps/v1", Vec::new()),
        ),
        (
            "replicasets",
            Served::new("ReplicaSetList", "apps/v1", out.replicasets),
        ),
        ("jobs", Served::new("JobList", "batch/v1", out.jobs)),
        (
            "cronjobs",
            Served::new("CronJobList", "batch/v1", out.cronjobs),
        ),
        ("pods", Served::new("PodList", "v1", out.pods)),
        ("nodes", Served::new("NodeList", "v1", nodes(node_count))),
    ]
}

fn json_response(status: u16, body: String) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
    common::kube_fake::status(hyper::StatusCode::from_u16(status).unwrap(), body)
}

/// One answer of the thin fake: a page of a cluster-wide list, or a namespace's `default`
/// ServiceAccount (no pull secrets).
fn answer(
    lists: &[(&'static str, Served)],
    path: &str,
    query: Option<&str>,
) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if let ["api", "v1", "namespaces", ns, "serviceaccounts", name] = parts[..] {
        let account = json!({"kind": "ServiceAccount", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": ns, "uid": format!("sa-{ns}-{name}")}});
        return json_response(200, account.to_string());
    }
    let plural = parts.last().copied().unwrap_or_default();
    let (Some(query), Some((_, list))) = (query, lists.iter().find(|(p, _)| *p == plural)) else {
        return json_response(
            404,
            json!({"kind": "Status", "code": 404, "reason": "NotFound"}).to_string(),
        );
    };
    let asked = ListQuery::parse(query).expect("audit asks what the API server accepts");
    let after = asked
        .continue_token
        .as_deref()
        .map(|t| kube_pages::Continue::decode(t).unwrap().after);
    let page = kube_pages::page(&list.items, asked.limit, after.as_deref(), REVISION);
    json_response(
        200,
        kube_pages::list_body(list.kind, list.api_version, REVISION, &page),
    )
}

/// The generated cluster, a handler on the one fake API server (`common::kube_fake`); the
/// server lives as long as the bench.
fn serve(lists: Vec<(&'static str, Served)>) -> u16 {
    let lists = Arc::new(lists);
    let api = common::kube_fake::FakeApi::new()
        .handler(Arc::new(move |req: &common::kube_fake::Req| {
            let response = if req.token() == Some("admintoken") {
                let query = req.has_query.then_some(req.raw_query.as_str());
                answer(&lists, &req.path, query)
            } else {
                return common::kube_fake::ready(common::kube_fake::unauthorized());
            };
            common::kube_fake::ready(common::kube_fake::full(response))
        }))
        .start();
    api.port
}

/// Tag-manifest requests tolerable sent for each image, from the registry's access log.
fn lookups_per_image(registry: &'static Registry) -> Vec<usize> {
    // Waits for the access log to catch up.
    common::block_on_own_thread(registry.requests_by_method("bench-audit/marker"));
    let log = registry.log();
    (0..IMAGES)
        .map(|i| {
            let tag = format!(" /v2/bench-audit/app-{i}/manifests/v1 ");
            log.lines()
                .filter(|l| l.contains("\"tolerable/") && l.contains(&tag))
                .count()
        })
        .collect()
}

fn push_images(host: &str) {
    let host = host.to_owned();
    common::block_on_own_thread(async move {
        let pusher = Pusher::for_mode(&host, Mode::Plain);
        for i in 0..IMAGES {
            // One in five single-architecture, the rest amd64 + arm64 + arm/v7.
            let fixture = if i % 5 == 0 {
                "amd64-docker"
            } else {
                "multiarch-oci"
            };
            pusher
                .push(&format!("bench-audit/app-{i}"), fixture, "v1")
                .await;
        }
    });
}

/// Runs `tolerable audit -A --json` under GNU time: (peak RSS KiB, wall seconds, report).
fn run_audit(port: u16, host: &str) -> (u64, f64, Value) {
    let kubeconfig = common::kube_fake::kubeconfig(port, "admintoken");
    let times = tempfile::NamedTempFile::new().unwrap();
    let started = Instant::now();
    let out = Command::new("/usr/bin/time")
        .arg("-f")
        .arg("%M")
        .arg("-o")
        .arg(times.path())
        .arg(env!("CARGO_BIN_EXE_tolerable"))
        .args(["audit", "-A", "--json", "--kubeconfig"])
        .arg(kubeconfig.path())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("TOLERABLE_REGISTRY__INSECURE", host)
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    let wall = started.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "audit failed: {stderr}");
    let progress: Vec<&str> = stderr.lines().filter(|l| l.contains("read ")).collect();
    eprintln!("{}", progress.join("\n"));
    let rss_kib = std::fs::read_to_string(times.path())
        .unwrap()
        .trim()
        .parse()
        .expect("GNU time's %M");
    (rss_kib, wall, serde_json::from_slice(&out.stdout).unwrap())
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let workloads = env_number("BENCH_AUDIT_WORKLOADS", 10_000);
    let node_count = env_number("BENCH_AUDIT_NODES", 5_000);
    let registry = registry::plain();
    push_images(&registry.host);
    let generating = Instant::now();
    let lists = cluster(&registry.host, workloads, node_count);
    let pods = lists
        .iter()
        .find(|(p, _)| *p == "pods")
        .unwrap()
        .1
        .items
        .len();
    eprintln!(
        "generated {workloads} workloads, {pods} Pods, {node_count} Nodes in {:.1} s",
        generating.elapsed().as_secs_f64()
    );
    let port = serve(lists);
    let (rss_kib, wall, report) = run_audit(port, &registry.host);
    let audited = report["workloads"].as_array().unwrap();
    let pods_seen: usize = audited
        .iter()
        .map(|w| w["pods"].as_array().unwrap().len())
        .sum();
    let lookups = lookups_per_image(registry);
    let (min, max) = (lookups.iter().min().unwrap(), lookups.iter().max().unwrap());
    let rss_mib = rss_kib / 1024;
    println!("| workloads | Pods | Nodes | peak RSS | wall time | lookups per distinct image (min–max over {IMAGES}) |");
    println!("| --- | --- | --- | --- | --- | --- |");
    println!(
        "| {} | {pods_seen} | {node_count} | {rss_mib} MiB | {wall:.1} s | {min}–{max} |",
        audited.len()
    );
    println!("summary: {}", report["summary"]);
    let mut failed = Vec::new();
    if audited.len() != workloads || pods_seen != pods {
        failed.push(format!(
            "audited {} workloads and {pods_seen} Pods",
            audited.len()
        ));
    }
    if rss_mib > TARGET_RSS_MIB {
        failed.push(format!("peak RSS {rss_mib} MiB > {TARGET_RSS_MIB} MiB"));
    }
    if wall > TARGET_SECONDS {
        failed.push(format!("{wall:.1} s > {TARGET_SECONDS} s"));
    }
    if (*min, *max) != (1, 1) {
        failed.push(format!("lookups per image {min}–{max}, not 1"));
    }
    assert!(failed.is_empty(), "targets missed: {failed:?}");
}
