//! `tolerable audit` against a thin fake API server serving the responses recorded from a real
//! kube-apiserver (`tests/data/kube-api/workloads/`), with the workloads' images in the real test
//! registry: every status (misplaced, movable, ready, pinned, unknown), the summary, namespaces,
//! label selectors, and a cluster that cannot be read.

use crate::common;

use std::process::{Command, Output};

use common::cli::{succeeded, workload};
use common::fixtures::Pusher;
use common::kube_pages::{self, Continue};
use common::registry::{self, Mode};
use common::workloads_api::{RecordedList, WorkloadsApi};
use serde_json::Value;

/// The recorded cluster's images, pushed as: multi-architecture (amd64, arm/v7, arm64),
/// amd64 only, or mislabelled. `batch/once:1` is left out: it cannot be resolved.
const IMAGES: &[(&str, &str, &str)] = &[
    ("team-a/web", "1.4", "multiarch-oci"),
    ("team-a/migrate", "7", "multiarch-oci"),
    ("team-a/api", "2.0", "multiarch-oci"),
    ("library/nginx", "1.25", "multiarch-oci"),
    ("team-a/postgres", "16", "amd64-docker"),
    ("team-b/agent", "3", "amd64-docker"),
    ("library/busybox", "1.36", "multiarch-oci"),
    // Claims amd64 and arm64; the arm64 entry is an amd64 image (found by `--verify`).
    ("batch/report", "5", "mislabelled"),
];

/// The fake API server, once per test binary, after the images are pushed.
pub(super) fn cluster() -> &'static WorkloadsApi {
    static CLUSTER: std::sync::OnceLock<WorkloadsApi> = std::sync::OnceLock::new();
    CLUSTER.get_or_init(|| {
        let host = registry::plain().host.clone();
        common::block_on_own_thread({
            let host = host.clone();
            async move {
                let pusher = Pusher::for_mode(&host, Mode::Plain);
                for (repository, tag, fixture) in IMAGES {
                    pusher.push(repository, fixture, tag).await;
                }
            }
        });
        WorkloadsApi::start(&host)
    })
}

fn audit(api: &WorkloadsApi, token: &str, args: &[&str]) -> Output {
    audit_with(api, token, args, &[])
}

/// [`audit`] with these variables set too.
pub(super) fn audit_with(
    api: &WorkloadsApi,
    token: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Output {
    let kubeconfig = api.kubeconfig(token);
    let host = &registry::plain().host;
    Command::new(env!("CARGO_BIN_EXE_tolerable"))
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("TOLERABLE_REGISTRY__INSECURE", host)
        // docker.io/library/nginx and busybox come from the test registry.
        .env("TOLERABLE_REGISTRY__MIRRORS", format!("docker.io={host}"))
        .env("TOLERABLE_REGISTRY__LOOKUP_TIMEOUT", "3s")
        .current_dir(std::env::temp_dir())
        .envs(env.iter().copied())
        .arg("audit")
        .arg("--kubeconfig")
        .arg(kubeconfig.path())
        .args(args)
        .output()
        .unwrap()
}

fn report(out: &Output) -> Value {
    serde_json::from_str(&succeeded(out)).unwrap()
}

#[test]
fn every_status_of_the_recorded_cluster() {
    let out = audit(cluster(), "admintoken", &["--json"]);
    let report = report(&out);
    // The DaemonSet's image is amd64 only; three of its Pods run on arm64 and s390x nodes (the
    // one on z-1 is the recorded CrashLoopBackOff).
    let agent = workload(&report, "DaemonSet", "agent");
    assert_eq!(agent["status"], "misplaced", "{agent:#}");
    // One reason per architecture its images do not support, naming the Pods and nodes.
    let reasons = agent["reasons"].to_string();
    for pod in [
        "2 of 5 Pods on arm64 nodes: agent-c9v5t on arm-1 and agent-h4r2w on arm-2",
        "1 of 5 Pods on s390x nodes: agent-zt6ls on z-1",
    ] {
        assert!(reasons.contains(pod), "{reasons}");
    }
    assert_eq!(agent["reasons"].as_array().unwrap().len(), 2, "{reasons}");
    assert!(
        !reasons.contains("agent-2xk8p"),
        "the amd64 Pods are where they belong: {reasons}"
    );

    // Multi-architecture, running on amd64, no toleration yet: movable; its two replicas'
    // requests count.
    let web = workload(&report, "Deployment", "web");
    assert_eq!(web["status"], "movable", "{web:#}");
    assert_eq!(web["requests"]["cpuMillis"], 500);
    assert_eq!(web["requests"]["memoryBytes"], 2 * 128 * 1024 * 1024);
    assert!(web["reasons"][0]
        .as_str()
        .unwrap()
        .contains("runs on amd64 (2 Pods)"));
    assert_eq!(workload(&report, "CronJob", "nightly")["status"], "movable");
    // Bound to an arm64 node by hand (nodeName): it is there already, nothing to move.
    let debug = workload(&report, "Pod", "debug");
    assert_eq!(debug["status"], "ready", "{debug:#}");
    assert!(debug["reasons"][0]
        .as_str()
        .unwrap()
        .contains("runs on arm64 (1 Pod)"));

    // Already tolerates arm64 and pins its own architectures: nothing to add.
    let api = workload(&report, "Deployment", "api");
    assert_eq!(api["status"], "ready", "{api:#}");
    assert_eq!(
        api["images"].as_object().unwrap().len(),
        3,
        "init container included"
    );

    let db = workload(&report, "StatefulSet", "db");
    assert_eq!(db["status"], "pinned", "{db:#}");
    assert!(db["reasons"]
        .to_string()
        .contains("postgres:16 (linux/amd64)"));

    let once = workload(&report, "Job", "once");
    assert_eq!(once["status"], "unknown", "{once:#}");
    assert!(once["reasons"][0]
        .as_str()
        .unwrap()
        .contains("batch/once:1"));

    // The ReplicaSets and the CronJob's Job are not workloads of their own.
    assert_eq!(
        report["workloads"].as_array().unwrap().len(),
        7,
        "{report:#}"
    );
    let summary = &report["summary"];
    assert_eq!(summary["statuses"]["movable"], 2);
    assert_eq!(summary["statuses"]["ready"], 2);
    assert_eq!(summary["statuses"]["misplaced"], 1);
    // web's two replicas and nightly's 100m.
    assert_eq!(summary["movableRequests"]["cpuMillis"], 600);
}

#[test]
fn the_table_and_summary_line_for_people() {
    let out = audit(cluster(), "admintoken", &[]);
    let text = succeeded(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("WORKLOAD") && lines[0].contains("STATUS"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("DaemonSet/team-b/agent") && lines[1].contains("misplaced"),
        "misplaced first: {text}"
    );
    assert_eq!(
        *lines.last().unwrap(),
        "7 workloads: 1 misplaced, 2 movable, 2 ready, 1 pinned, 1 unknown; requests that could move: cpu 600m, memory 256Mi",
        "{text}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("read 7 workloads, 5 nodes and 10 running Pods; resolving 9 images"),
        "{stderr}"
    );
}

#[test]
fn namespace_and_label_selector_narrow_what_is_read() {
    let api = cluster();
    let report_in = report(&audit(api, "admintoken", &["--json", "-n", "team-a"]));
    let mut names: Vec<&str> = report_in["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["api", "db", "web"]);
    let web_only = report(&audit(
        api,
        "admintoken",
        &["--json", "-n", "team-a", "-l", "app=web"],
    ));
    let workloads = web_only["workloads"].as_array().unwrap();
    assert_eq!(workloads.len(), 1);
    assert_eq!(workloads[0]["pods"].as_array().unwrap().len(), 2);
    // Every list is paged, 500 items a page as kubectl asks (paging itself: below).
    assert!(api
        .requests()
        .iter()
        .any(|r| r.starts_with("/api/v1/namespaces/team-a/pods?") && r.contains("limit=500")));
    assert!(
        api.requests()
            .iter()
            .filter(|r| r.contains('?') && !r.contains("/serviceaccounts/"))
            .all(|r| r.contains("limit=")),
        "{:?}",
        api.requests()
    );
    assert!(api.requests().iter().any(|r| r
        .starts_with("/apis/apps/v1/namespaces/team-a/deployments?")
        && r.contains("labelSelector=app%3Dweb")));
}

/// Read-only, but reading is needed: a cluster that refuses the list ends with exit status 2
/// and the API server's reason.
#[test]
fn a_cluster_that_cannot_be_read_is_an_error() {
    let out = audit(cluster(), "nobodytoken", &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("could not list deployments"), "{stderr}");
    assert!(stderr.contains("forbidden"), "{stderr}");
}

/// `--verify` reads each platform's image config: the CronJob's image claims arm64 but is an
/// amd64 image, and its reasons say so; without `--verify` nothing is read beyond manifests.
#[test]
fn verify_finds_a_mislabelled_image() {
    let verified = report(&audit(cluster(), "admintoken", &["--json", "--verify"]));
    let nightly = workload(&verified, "CronJob", "nightly");
    let mislabelled = nightly["mislabelled"].as_array().unwrap();
    assert_eq!(mislabelled.len(), 1, "{nightly:#}");
    let note = mislabelled[0].as_str().unwrap();
    assert!(
        note.contains("batch/report:5: the index says linux/arm64, its config linux/amd64"),
        "{note}"
    );
    assert!(nightly["reasons"].to_string().contains("mislabelled"));
    // Its arm64 is an amd64 image: the CronJob runs on amd64 only, pinned, not movable.
    assert_eq!(nightly["status"], "pinned", "{nightly:#}");
    assert_eq!(nightly["architectures"], serde_json::json!(["amd64"]));
    assert!(
        nightly["unverified"].as_array().unwrap().is_empty(),
        "{nightly:#}"
    );
    // Every image verified, docker.io's through the mirror the lookups use.
    let api = workload(&verified, "Deployment", "api");
    assert!(api["unverified"].as_array().unwrap().is_empty(), "{api:#}");
    let web = workload(&verified, "Deployment", "web");
    assert!(web["mislabelled"].as_array().unwrap().is_empty(), "{web:#}");

    let plain = report(&audit(cluster(), "admintoken", &["--json"]));
    assert!(workload(&plain, "CronJob", "nightly")
        .get("mislabelled")
        .is_none());
}

/// What a report says of each workload: kind, name, status, reasons, Pods.
fn verdicts(report: &Value) -> Vec<String> {
    let mut all: Vec<String> = report["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            format!(
                "{} {} {} {} {}",
                w["kind"], w["name"], w["status"], w["reasons"], w["pods"]
            )
        })
        .collect();
    all.sort();
    all
}

/// A fake of its own (a test that expires continue tokens must not expire another's), with the
/// images `cluster()` pushed.
fn own_cluster() -> WorkloadsApi {
    cluster();
    WorkloadsApi::start(&registry::plain().host)
}

fn pod_pages_requested(api: &WorkloadsApi) -> Vec<String> {
    api.requests()
        .into_iter()
        .filter(|r| r.starts_with("/api/v1/pods?"))
        .collect()
}

/// `--chunk-size 3` reads the Pods in the 4 pages the real API server served (the recorded
/// tokens, followed to the last page, which has no `continue`), and the report is the one read
/// in a single page.
#[test]
fn small_pages_follow_the_recorded_continue_tokens_to_the_same_report() {
    let api = own_cluster();
    let paged = report(&audit(&api, "admintoken", &["--json", "--chunk-size", "3"]));
    let whole = report(&audit(cluster(), "admintoken", &["--json"]));
    assert_eq!(verdicts(&paged), verdicts(&whole));
    let index: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/kube-api/workloads/index.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let recorded_pages: Vec<&str> = index
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["name"]
                .as_str()
                .unwrap()
                .starts_with("pod-list-limit-3-page")
        })
        .map(|e| e["path_and_query"].as_str().unwrap())
        .collect();
    assert_eq!(recorded_pages.len(), 4);
    assert_eq!(pod_pages_requested(&api), recorded_pages);
}

/// The API server answers 410 Expired to a continue token etcd compacted away: the audit reads
/// that list again from its first page (as client-go does) and reports the same.
#[test]
fn an_expired_continue_token_starts_the_list_again() {
    let api = own_cluster();
    api.expire_continue_tokens(1);
    let out = audit(&api, "admintoken", &["--json", "--chunk-size", "3"]);
    let again = report(&out);
    let whole = report(&audit(cluster(), "admintoken", &["--json"]));
    assert_eq!(verdicts(&again), verdicts(&whole));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("expired the list of pods") && stderr.contains("Expired"),
        "{stderr}"
    );
    let pages = pod_pages_requested(&api);
    let first_pages = pages.iter().filter(|r| !r.contains("continue=")).count();
    assert_eq!(first_pages, 2, "{pages:#?}");
    // Page 1, the expired page 2, then the 4 pages of the fresh list.
    assert_eq!(pages.len(), 6, "{pages:#?}");
}

/// A list that expires every time is given up after a bounded number of fresh starts, with
/// the API server's reason, and exit status 2.
#[test]
fn a_list_that_keeps_expiring_is_given_up_after_three_starts() {
    let api = own_cluster();
    api.expire_continue_tokens(usize::MAX);
    let out = audit(&api, "admintoken", &["--json", "--chunk-size", "3"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("could not list pods: the API server expired its continue token 3 times"),
        "{stderr}"
    );
    let pages = pod_pages_requested(&api);
    let first_pages = pages.iter().filter(|r| !r.contains("continue=")).count();
    assert_eq!((first_pages, pages.len()), (3, 6), "{pages:#?}");
}

/// The fake's paging rules reproduce the real server's pages byte for byte (items, tokens,
/// `remainingItemCount`, no `continue` on the last page), and it refuses what the real one
/// refuses.
#[test]
fn the_fake_pages_and_refuses_as_the_recorded_api_server() {
    let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/kube-api/workloads");
    let list = RecordedList::read("pod-list.body.json", "registry.test:5000");
    let mut after: Option<String> = None;
    for n in 1..=4 {
        let page = kube_pages::page(&list.items, Some(3), after.as_deref(), 301);
        let body = kube_pages::list_body(&list.kind, &list.api_version, 301, &page);
        let recorded =
            std::fs::read_to_string(format!("{folder}/pod-list-limit-3-page{n}.body.json"))
                .unwrap();
        assert_eq!(body, recorded, "page {n}");
        after = page
            .more
            .as_ref()
            .map(|(token, _)| Continue::decode(token).unwrap().after);
        assert_eq!(after.is_none(), n == 4);
    }
    // The 410's token for an inconsistent continuation: rv -1, the same place.
    let expired =
        std::fs::read_to_string(format!("{folder}/pod-list-continue-expired-410.body.json"))
            .unwrap();
    let expired: Value = serde_json::from_str(&expired).unwrap();
    let token = Continue::decode(expired["metadata"]["continue"].as_str().unwrap()).unwrap();
    assert_eq!(token.revision, -1);
    assert_eq!(token.after, "team-a/api-7f8b6c-x5rtz");

    let api = own_cluster();
    let refused = |path: &str| {
        let port = api.port;
        let path = path.to_owned();
        common::block_on_own_thread(async move {
            let client = common::kube_api::client(port, "admintoken");
            let request = http::Request::get(&path).body(Vec::new()).unwrap();
            match client.request_text(request).await {
                Err(kube::Error::Api(status)) => (status.code, status.message),
                other => panic!("{path}: {other:?}"),
            }
        })
    };
    let (code, message) = refused("/api/v1/pods?&limit=3&continue=bm90LWEtdG9rZW4");
    assert_eq!(code, 400);
    assert!(
        message.contains("invalid character 'o' in literal null"),
        "{message}"
    );
    let (code, message) = refused("/api/v1/pods?&limit=3&continue=eyJub3QiOiJ0aGlzIn0");
    assert_eq!(code, 400, "{message}");
    let token = Continue {
        revision: 301,
        after: "batch/once-f5gbc".into(),
    }
    .encode();
    let (code, message) = refused(&format!(
        "/api/v1/pods?&limit=3&continue={token}&resourceVersion=301"
    ));
    assert_eq!(code, 400);
    assert!(
        message.contains("resource version is not allowed"),
        "{message}"
    );
    let (code, _) = refused("/apis/apps/v1/namespaces/team-a/replicasets/web-0ld0ne");
    assert_eq!(code, 404);
}

/// `match_node_labels`: what the webhook would add to a movable workload includes its Pods'
/// listed labels required of their nodes, as the webhook adds them.
#[test]
fn match_node_labels_are_in_what_would_be_added() {
    let env = [("TOLERABLE_POLICY__MATCH_NODE_LABELS", "app")];
    let matched = report(&audit_with(cluster(), "admintoken", &["--json"], &env));
    let web = workload(&matched, "Deployment", "web");
    assert_eq!(web["status"], "movable", "{web:#}");
    let reason = web["reasons"][0].as_str().unwrap();
    assert!(
        reason.contains("tolerable would add toleration kubernetes.io/arch=arm64:NoSchedule; requires app in (web)"),
        "{reason}"
    );
    let without = audit(cluster(), "admintoken", &["--json"]);
    let web = workload(&report(&without), "Deployment", "web").to_string();
    assert!(!web.contains("app in (web)"), "{web}");
}

/// The Namespaces' preferences (batch: `arm64=80, amd64=20`, the recorded annotation) are in
/// what would be added to the workloads there, as the webhook adds them; a workload elsewhere
/// gets none. Namespaces are listed once, metadata only.
#[test]
fn a_namespace_preference_is_in_what_would_be_added() {
    let report = report(&audit(cluster(), "admintoken", &["--json"]));
    let nightly = workload(&report, "CronJob", "nightly");
    assert_eq!(nightly["status"], "movable", "{nightly:#}");
    let reason = nightly["reasons"][0].as_str().unwrap();
    assert!(
        reason.contains("prefers arm64 (weight 80), amd64 (weight 20)"),
        "{reason}"
    );
    let web = workload(&report, "Deployment", "web").to_string();
    assert!(!web.contains("prefers"), "{web}");
    assert!(cluster()
        .requests()
        .iter()
        .any(|r| r.starts_with("/api/v1/namespaces?")));
}

/// The recorded DaemonSet team-b/agent tolerates every `kubernetes.io/arch` taint and has a Pod
/// on each node; with its image for amd64, arm/v7 and arm64 (pushed so to a registry of its
/// own), the tainted arm64 nodes its images run on all have its Pod: its `nodeAgent` is empty
/// and the table has no DaemonSet section. (The recording holds no DaemonSet that lacks a
/// toleration: `src/audit/node_agents.rs`'s tests check that case on real objects.)
#[test]
fn a_daemonset_that_tolerates_the_pools_is_missing_from_none_of_their_nodes() {
    let own = registry::Registry::start(Mode::Plain);
    common::block_on_own_thread({
        let host = own.host.clone();
        async move {
            let pusher = Pusher::for_mode(&host, Mode::Plain);
            pusher.push("team-b/agent", "multiarch-oci", "3").await;
        }
    });
    let api = WorkloadsApi::start(&own.host);
    let env = [("TOLERABLE_REGISTRY__INSECURE", own.host.as_str())];
    let report = report(&audit_with(&api, "admintoken", &["--json"], &env));
    let agent = workload(&report, "DaemonSet", "agent");
    assert_eq!(
        agent["architectures"],
        serde_json::json!(["amd64", "arm", "arm64"]),
        "{agent:#}"
    );
    assert_eq!(agent["nodeAgent"], serde_json::json!([]), "{agent:#}");
    // Only DaemonSets are checked.
    assert!(workload(&report, "Deployment", "web")
        .get("nodeAgent")
        .is_none());
    let table = audit_with(&api, "admintoken", &[], &env);
    let text = succeeded(&table);
    assert!(!text.contains("DaemonSets missing"), "{text}");
}
