//! The node watch: the real `kube` client and kube-runtime reflector against the thin fake API
//! server replaying a recorded NodeList and watch stream, feeding the webhook's decisions.

use crate::common;

use std::time::{Duration, Instant};

use common::kube_api::{FakeApiServer, RegistryHosts};
use common::kube_fake::Exchange;
use common::registry;
use common::webhook::{self, TestServer};
use serde_json::{json, Value};
use tolerable::cluster::nodes::NodeWatch;
use tolerable::mutate::ARCH_LABEL;

fn hosts() -> RegistryHosts {
    RegistryHosts {
        basic: registry::basic().host.clone(),
        token: registry::token().host.clone(),
    }
}

use common::until;

#[tokio::test]
async fn the_watch_learns_architectures_and_their_taints() {
    let api = FakeApiServer::start(hosts());
    let watch = NodeWatch::start(
        api.client("admintoken"),
        tolerable::mutate::Policy::default().taint_keys(),
    );
    until("the node watch to sync", || watch.is_synced()).await;
    let pools = watch.pools().unwrap();
    assert_eq!(
        pools.architectures.keys().collect::<Vec<_>>(),
        ["amd64", "arm64", "s390x"]
    );
    assert_eq!(pools.taints("arm64")[0].value.as_deref(), Some("arm64"));
    assert!(pools.taints("amd64").is_empty());
    // The recorded watch events were consumed too (arm-2 came and went): the watch is live.
    until("the watch to be opened", || {
        api.requests()
            .iter()
            .filter(|p| *p == "/api/v1/nodes")
            .count()
            >= 2
    })
    .await;
}

/// Everyone waiting for the first list is woken, not just one (kube-runtime's own ready signal
/// wakes only the last of several waiters; the webhook's readiness and the node tainter both wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_task_waiting_for_the_first_list_is_woken() {
    let api = FakeApiServer::start_with(hosts(), Duration::from_millis(300));
    let watch = NodeWatch::start(
        api.client("admintoken"),
        tolerable::mutate::Policy::default().taint_keys(),
    );
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let watch = watch.clone();
            tokio::spawn(async move { watch.synced().await })
        })
        .collect();
    // The 30 s only keep a waiter never woken from hanging the test: the event is the wake-up.
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .expect("a task waiting for the node watch was never woken")
            .unwrap();
    }
    assert!(watch.is_synced());
}

async fn post(server: &TestServer, body: &Value) -> Value {
    let response = webhook::client()
        .post(server.url("/mutate?timeout=10s"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

/// The request's Pod patched by the AdmissionReview `review`'s answer.
fn patched(request: &Value, review: &Value) -> Value {
    webhook::patched(request, &review["response"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_until_synced_then_tolerates_the_taints_that_exist() {
    let api = FakeApiServer::start_with(hosts(), Duration::from_millis(1500));
    let server = TestServer::start_with_cluster(
        webhook::policy(),
        common::settings(),
        api.client("admintoken"),
    )
    .await;

    ready_only_once_the_node_watch_synced(&server).await;

    // Images for every architecture in the cluster (amd64, arm64, s390x): both tainted pools'
    // taints are tolerated, and nothing steers.
    let host = &registry::plain().host;
    let mut request = webhook::recorded("pod-create-simple.v1.json", host);
    request["request"]["object"]["spec"]["containers"][0]["image"] =
        json!(format!("{host}/fixtures/nested-index:v1"));
    let response = post(&server, &request).await;
    let pod = patched(&request, &response);
    let tolerations = pod["spec"]["tolerations"].as_array().unwrap();
    let arch: Vec<&Value> = tolerations
        .iter()
        .filter(|t| t["key"] == ARCH_LABEL)
        .collect();
    assert_eq!(
        arch,
        [
            &json!({"key": ARCH_LABEL, "operator": "Equal", "value": "arm64", "effect": "NoSchedule"}),
            &json!({"key": ARCH_LABEL, "operator": "Equal", "value": "s390x", "effect": "NoSchedule"}),
        ]
    );
    assert!(
        pod["spec"]["affinity"].is_null(),
        "{}",
        pod["spec"]["affinity"]
    );

    // Images for amd64 and arm64 only: arm64's taint, and kept off s390x.
    request["request"]["object"]["spec"]["containers"][0]["image"] =
        json!(format!("{host}/fixtures/multiarch-oci:v1"));
    let response = post(&server, &request).await;
    let pod = patched(&request, &response);
    assert_eq!(pod["spec"]["tolerations"][2]["value"], "arm64");
    assert_eq!(
        pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"][0]["values"],
        // The image's linux/arm/v7 is no node architecture here: no arm node exists and none
        // is configured (and arm64 nodes are not said to run 32-bit arm).
        json!(["amd64", "arm64"])
    );

    the_gauges_count_each_architectures_taints(&server).await;
}

/// /readyz answers 503 naming the node watch until its first list arrives, then 200.
async fn ready_only_once_the_node_watch_synced(server: &TestServer) {
    let client = webhook::client();
    let readyz = client.get(server.url("/readyz")).send().await.unwrap();
    assert_eq!(readyz.status(), 503);
    assert!(readyz
        .text()
        .await
        .unwrap()
        .contains("node watch not synced"));
    let started = Instant::now();
    loop {
        if client
            .get(server.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status()
            == 200
        {
            break;
        }
        // Only keeps a watch that never syncs from hanging the test (the event is the 200).
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never became ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `tolerable_node_architecture_taints`: one taint on arm64 and on s390x, none on amd64.
async fn the_gauges_count_each_architectures_taints(server: &TestServer) {
    let metrics = webhook::metrics_text(server).await;
    for (arch, taints) in [("amd64", 0.0), ("arm64", 1.0), ("s390x", 1.0)] {
        let series = format!("tolerable_node_architecture_taints{{architecture=\"{arch}\"}}");
        assert_eq!(
            webhook::metric_value(&metrics, &series),
            Some(taints),
            "{series}:\n{metrics}"
        );
    }
}

/// A pool that scales from zero (Karpenter, cluster-autoscaler min size 0): no arm64 node at
/// first, then one joins (a watch event), then it is gone again. The answer for the same Pod
/// keeps the template toleration throughout — the autoscaler grows the pool only for a Pending
/// Pod that tolerates its taint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_scales_from_zero_and_back_keeps_its_toleration() {
    let api = FakeApiServer::start_scaled_to_zero(hosts());
    let server = TestServer::start_with_cluster(
        webhook::policy(),
        common::settings(),
        api.client("admintoken"),
    )
    .await;
    let watch = server.nodes.clone().expect("the node watch runs");
    until("the node watch to sync", || watch.is_synced()).await;
    let host = &registry::plain().host;
    let mut request = webhook::recorded("pod-create-simple.v1.json", host);
    // amd64, arm/v7 and arm64.
    request["request"]["object"]["spec"]["containers"][0]["image"] =
        json!(format!("{host}/fixtures/multiarch-oci:v1"));
    let arm_tolerations = webhook::arch_tolerations;
    let template =
        json!({"key": ARCH_LABEL, "operator": "Equal", "value": "arm64", "effect": "NoSchedule"});
    let arch_of = |w: &NodeWatch| -> Vec<String> {
        w.pools().unwrap().architectures.keys().cloned().collect()
    };

    // Scaled to zero: only amd64 nodes.
    assert_eq!(arch_of(&watch), ["amd64"]);
    let zero = patched(&request, &post(&server, &request).await);
    assert_eq!(arm_tolerations(&zero), std::slice::from_ref(&template));
    let steered = &zero["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
        ["matchExpressions"][0]["values"];
    // No arm node, none configured: the image's linux/arm/v7 places it nowhere more.
    assert_eq!(steered, &json!(["amd64", "arm64"]));

    // arm-2 joins (ADDED, then MODIFIED as it becomes ready).
    api.release_events(2);
    until("arm-2 to join", || {
        arch_of(&watch).contains(&"arm64".to_owned())
    })
    .await;
    let grown = patched(&request, &post(&server, &request).await);
    assert_eq!(arm_tolerations(&grown), std::slice::from_ref(&template));
    assert_eq!(grown, zero, "the same Pod gets the same answer");

    // bare-1 modified, arm-2 deleted: back to zero.
    api.release_events(3);
    until("arm-2 to leave", || {
        !arch_of(&watch).contains(&"arm64".to_owned())
    })
    .await;
    let shrunk = patched(&request, &post(&server, &request).await);
    assert_eq!(arm_tolerations(&shrunk), [template]);
    assert_eq!(shrunk, zero);
}

/// `match_node_labels` with the node watch: the watch keeps the listed label's values, and a
/// Pod labelled with a value no node carries is admitted with a warning (it would stay
/// Pending), never denied; a value some node carries says nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matched_label_no_node_carries_is_warned_of() {
    let api = FakeApiServer::start(hosts());
    let mut policy = webhook::policy();
    policy.match_node_labels = vec!["kubernetes.io/hostname".into()];
    let server =
        TestServer::start_with_cluster(policy, common::settings(), api.client("admintoken")).await;
    let nodes = server.nodes.clone().unwrap();
    until("the node watch to sync", || nodes.is_synced()).await;
    let host = &registry::plain().host;
    let review = |hostname: &str| {
        let mut request = webhook::recorded("pod-create-simple.v1.json", host);
        let object = &mut request["request"]["object"];
        object["spec"]["containers"][0]["image"] =
            json!(format!("{host}/fixtures/multiarch-oci:v1"));
        object["metadata"]["labels"]["kubernetes.io/hostname"] = json!(hostname);
        request
    };
    for (hostname, warned) in [("amd-1", false), ("gone-1", true)] {
        let request = review(hostname);
        let response = post(&server, &request).await;
        assert_eq!(response["response"]["allowed"], true);
        let warnings = webhook::warnings(&response["response"]);
        let said = format!(
            "no node is labelled kubernetes.io/hostname={hostname} (match_node_labels): the Pod stays Pending until one is"
        );
        assert_eq!(
            warnings.contains(&said),
            warned,
            "{hostname}: {warnings:#?}"
        );
        let pod = patched(&request, &response);
        let terms = &pod["spec"]["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
        assert!(
            terms
                .to_string()
                .contains(&format!("\"values\":[\"{hostname}\"]")),
            "required all the same: {terms}"
        );
    }
}

/// How the Node fake answers one exchange recorded in `tests/data/kube-api/index.json`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// The recorded status and body (lists, objects and Status bodies as JSON, watches line by
    /// line).
    AsRecorded,
    /// Refused as unrecorded (501): a write the fake does not emulate (Node creation and
    /// deletion, status, merge, strategic and apply patches, dry runs).
    Refused,
    /// The recording needs server state the fake cannot reach (history before its seed, an
    /// etcd compaction, 130 writes later); the test checks the fake's own answer for it.
    Diverges,
}

/// Every Node exchange of `tests/data/kube-api/index.json`, in the order the replay sends them
/// (the state they need follows: the first watch applies the recorded events).
const NODE_EXCHANGES: [(&str, Expect); 36] = {
    use Expect::*;
    [
        ("node-list", AsRecorded),
        ("node-list-limit-500", AsRecorded),
        ("node-list-label-arch-arm64", AsRecorded),
        ("node-list-label-arch-in", AsRecorded),
        ("node-list-label-has-arch", AsRecorded),
        ("node-list-label-no-arch", AsRecorded),
        ("node-list-label-nomatch", AsRecorded),
        ("node-list-label-invalid-400", AsRecorded),
        ("node-list-limit-2-page1", AsRecorded),
        ("node-list-limit-2-page2", AsRecorded),
        ("node-get-arm-1", AsRecorded),
        ("node-get-missing-404", AsRecorded),
        ("node-list-403", AsRecorded),
        ("node-watch-403", AsRecorded),
        ("node-watch-streaming-list-unsupported", AsRecorded),
        ("node-watch-from-list-rv", AsRecorded),
        ("node-watch-rv-0", AsRecorded),
        ("node-list-rv-exact-expired-410", AsRecorded),
        ("node-watch-rv-future", AsRecorded),
        ("node-watch-rv-1-replay", Diverges),
        ("node-watch-too-old-rv", Diverges),
        ("node-list-continue-expired-410", Diverges),
        ("node-amd-1-json-patch-add-taint", Diverges),
        ("node-amd-1-json-patch-test-failed", AsRecorded),
        ("node-amd-1-create", Refused),
        ("node-amd-1-status-merge-patch", Refused),
        ("node-arm-2-create-during-watch", Refused),
        ("node-arm-2-status-during-watch", Refused),
        ("node-bare-1-add-label-during-watch", Refused),
        ("node-arm-2-delete-during-watch", Refused),
        ("node-amd-1-merge-patch-add-taint", Refused),
        ("node-amd-1-merge-patch-stale-rv-409", Refused),
        ("node-s390-1-strategic-patch-dryrun", Refused),
        ("node-amd-1-ssa-add-taint-conflict-409", Refused),
        ("node-amd-1-ssa-add-taint-force", Refused),
        ("node-bare-1-ssa-add-taint-dryrun", Refused),
    ]
};

fn kube_api_file(name: &str) -> String {
    let path = format!("{}/tests/data/kube-api/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Sends recorded exchange `entry` (of `index.json`), `path` in place of its own if given.
async fn send_recorded(
    api: &FakeApiServer,
    entry: &Exchange,
    path: Option<&str>,
) -> (u16, Vec<Value>) {
    let client = api.client(entry.token.as_deref().unwrap());
    let content_type = entry.request_content_type.as_deref();
    let path = path.unwrap_or(&entry.path_and_query);
    let body = entry.request_body.as_ref();
    let (code, bytes) =
        common::recorded::send_raw(&client, &entry.method, path, content_type, body).await;
    (code, common::recorded::json_lines(&bytes))
}

/// What the fake answers where the recording needs state it cannot reach: the recorded 410
/// shapes for a watch older than its seed and a continue token older than its seed, and the
/// recorded taint appended by the JSON Patch once its `test` names amd-1's resourceVersion now.
async fn diverging(api: &FakeApiServer, name: &str, entry: &Exchange) {
    let recorded = |f: &str| common::recorded::json_lines(kube_api_file(f).as_bytes());
    match name {
        "node-watch-rv-1-replay" | "node-watch-too-old-rv" => {
            let path = entry
                .path_and_query
                .replace("resourceVersion=218", "resourceVersion=1");
            let (code, lines) = send_recorded(api, entry, Some(&path)).await;
            let mut want = recorded("node-watch-too-old-rv.body.jsonl");
            want[0]["object"]["message"] = json!("too old resource version: 1 (224)");
            assert_eq!((code, lines), (200, want), "{name}");
        }
        "node-list-continue-expired-410" => {
            let token = common::kube_pages::Continue {
                revision: 1,
                after: "arm-1".into(),
            }
            .encode();
            let path = format!("/api/v1/nodes?&limit=2&continue={token}");
            let (code, lines) = send_recorded(api, entry, Some(&path)).await;
            assert_eq!(
                (code, lines),
                (410, recorded("node-list-continue-expired-410.body.json"))
            );
        }
        _ => {
            let mut ops = entry.request_body.clone().unwrap();
            ops[0]["value"] = api.node("amd-1")["metadata"]["resourceVersion"].clone();
            let client = api.client("admintoken");
            let json_patch = Some("application/json-patch+json");
            let (code, node) = common::recorded::send(
                &client,
                "PATCH",
                "/api/v1/nodes/amd-1?",
                json_patch,
                Some(&ops),
            )
            .await;
            assert_eq!(code, 200, "{node}");
            let want = common::recorded::json_lines(&entry.body).remove(0);
            assert_eq!(
                node["spec"]["taints"].as_array().unwrap().last(),
                want["spec"]["taints"].as_array().unwrap().last()
            );
        }
    }
}

/// Every Node exchange recorded from a real kube-apiserver (`tests/data/kube-api/index.json`),
/// replayed over the wire with a real `kube` client: those the fake serves get the recorded
/// status and body; those needing state it cannot reach are checked as `diverging` says; the
/// writes it does not emulate are refused (501), not invented.
#[tokio::test]
async fn the_node_fake_answers_every_recorded_exchange_as_recorded() {
    let api = FakeApiServer::start(hosts());
    let index = common::kube_fake::exchanges("");
    let nodes = index.iter().filter(|e| e.name.starts_with("node-"));
    assert_eq!(
        nodes.count(),
        NODE_EXCHANGES.len(),
        "every recorded Node exchange"
    );
    for (name, expect) in NODE_EXCHANGES {
        let entry = index
            .iter()
            .find(|e| e.name == name)
            .unwrap_or_else(|| panic!("{name}"));
        match expect {
            Expect::AsRecorded => {
                let (code, lines) = send_recorded(&api, entry, None).await;
                let want = common::recorded::json_lines(&entry.body);
                assert_eq!(code, entry.status, "{name}: {lines:?}");
                assert_eq!(lines, want, "{name}");
            }
            Expect::Refused => {
                let (code, lines) = send_recorded(&api, entry, None).await;
                assert_eq!(
                    (code, &lines[0]["reason"]),
                    (501, &json!("NotImplemented")),
                    "{name}"
                );
            }
            Expect::Diverges => diverging(&api, name, entry).await,
        }
    }
}
