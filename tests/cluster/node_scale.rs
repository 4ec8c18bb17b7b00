//! The node watch at cluster scale, through the real server and the real `kube` watcher against
//! a thin fake API server serving EKS-shaped Nodes (18 KB each, paged at 500 as a real API
//! server pages kube-runtime's list): the pools are built once for the first list and then
//! only when a fact a decision reads changes — never per admission, never for a kubelet
//! heartbeat — and a change reaches admissions within the coalescing window.

use crate::common;

use std::time::Duration;

use common::registry;
use common::scale_api::ScaleApiServer;
use common::webhook::{self, TestServer};
use serde_json::{json, Value};
use tolerable::cluster::nodes::{NodeWatch, COALESCE};
use tolerable::mutate::ARCH_LABEL;

use common::until;

/// The architecture tolerations a multi-arch Pod gets now.
async fn arch_tolerations(server: &TestServer, request: &Value) -> Vec<Value> {
    let (response, _) = webhook::admit(server, request, Duration::from_secs(10)).await;
    webhook::arch_tolerations(&webhook::patched(request, &response))
}

/// A number from the server's `/metrics`, by its exact series name.
async fn metric(server: &TestServer, series: &str) -> f64 {
    let text = webhook::metrics_text(server).await;
    webhook::metric_value(&text, series).unwrap_or_else(|| panic!("{series} not in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_are_built_once_then_only_when_a_fact_changes() {
    // 1,200 Nodes: five pages of 250 (the last one short), 400 arm64 ones tainted.
    let api = ScaleApiServer::start(1200, 400);
    let server =
        TestServer::start_with_cluster(webhook::policy(), common::settings(), api.client()).await;
    let watch: NodeWatch = server.nodes.clone().expect("the node watch runs");
    until("the node watch to sync", || watch.is_synced()).await;
    assert_eq!(api.lists(), 5, "the list is paged at 250");
    assert_eq!(
        watch.pool_builds(),
        1,
        "the first list builds the pools once"
    );
    assert_eq!(metric(&server, "tolerable_node_watch_nodes").await, 1200.0);

    let host = &registry::plain().host;
    let mut request = webhook::recorded("pod-create-simple.v1.json", host);
    request["request"]["object"]["spec"]["containers"][0]["image"] =
        json!(format!("{host}/fixtures/multiarch-oci:v1"));
    let before = arch_tolerations(&server, &request).await;
    assert_eq!(
        before,
        [json!({"key": ARCH_LABEL, "operator": "Equal", "value": "arm64", "effect": "NoSchedule"})]
    );
    a_thousand_admissions_build_nothing(&server, &watch, &request).await;
    heartbeats_and_other_labels_build_nothing(&api, &watch).await;
    a_taint_change_reaches_admissions(&api, &server, &watch, &request).await;
    an_architecture_label_change_is_seen(&api, &server, &watch).await;
}

async fn a_thousand_admissions_build_nothing(
    server: &TestServer,
    watch: &NodeWatch,
    request: &Value,
) {
    let body = request.to_string();
    let client = webhook::client();
    for round in 0..125 {
        let answers = (0..8).map(|_| {
            client
                .post(server.url("/mutate?timeout=10s"))
                .body(body.clone())
                .send()
        });
        for answer in futures_util::future::join_all(answers).await {
            assert_eq!(answer.unwrap().status(), 200, "round {round}");
        }
    }
    assert_eq!(
        watch.pool_builds(),
        1,
        "1,000 admissions with no Node change"
    );
    assert_eq!(
        metric(server, "tolerable_node_pool_builds_total").await,
        1.0
    );
}

async fn heartbeats_and_other_labels_build_nothing(api: &ScaleApiServer, watch: &NodeWatch) {
    until("the watch to open", || api.watches() >= 1).await;
    for i in 0..300 {
        api.heartbeat(i * 4);
    }
    api.set_label(7, "team", "ml");
    until("301 events to be read", || watch.events_seen().1 >= 301).await;
    assert_eq!(watch.events_seen(), (0, 301), "no event changed a fact");
    // Nothing is waiting to be built either: a change now is built alone.
    assert_eq!(watch.pool_builds(), 1);
}

async fn a_taint_change_reaches_admissions(
    api: &ScaleApiServer,
    server: &TestServer,
    watch: &NodeWatch,
    request: &Value,
) {
    assert!(COALESCE <= Duration::from_secs(1));
    // Node 3 (arm64) gets a second architecture taint: a burst of the same change on ten
    // Nodes is one build.
    let taints = json!([
        {"key": ARCH_LABEL, "value": "arm64", "effect": "NoSchedule"},
        {"key": ARCH_LABEL, "value": "arm64", "effect": "NoExecute"},
    ]);
    for i in 3..13 {
        api.set_taints(i, taints.clone());
    }
    until("the change to be built", || watch.pool_builds() >= 2).await;
    assert_eq!(watch.events_seen().0, 10);
    assert_eq!(watch.pool_builds(), 2, "ten changes in a burst, one build");
    let after = arch_tolerations(server, request).await;
    assert_eq!(
        after,
        [
            json!({"key": ARCH_LABEL, "operator": "Equal", "value": "arm64", "effect": "NoSchedule"}),
            json!({"key": ARCH_LABEL, "operator": "Equal", "value": "arm64", "effect": "NoExecute"}),
        ]
    );
}

async fn an_architecture_label_change_is_seen(
    api: &ScaleApiServer,
    server: &TestServer,
    watch: &NodeWatch,
) {
    api.set_label(1000, ARCH_LABEL, "s390x");
    // The pools are published before the build is counted: wait for both.
    until("s390x to appear", || {
        watch
            .pools()
            .is_some_and(|p| p.architectures.contains_key("s390x"))
            && watch.pool_builds() >= 3
    })
    .await;
    assert_eq!(watch.pool_builds(), 3);
    assert_eq!(
        metric(
            server,
            "tolerable_node_architecture_taints{architecture=\"s390x\"}"
        )
        .await,
        0.0
    );
}

/// A watcher that reads nothing while the cluster changes more than its buffer holds: its watch
/// ends (as the real server closes an unresponsive watcher) and every line it did get is the
/// next change, none skipped — a slow watcher never misses an event silently.
#[tokio::test]
async fn a_slow_watcher_is_ended_never_sent_a_gap() {
    let api = ScaleApiServer::start_with_watch_buffer(4, 0, 8);
    let request = http::Request::get("/api/v1/nodes?&watch=true&resourceVersion=1000")
        .body(kube::client::Body::empty())
        .unwrap();
    let response = api.client().send(request).await.unwrap();
    assert_eq!(response.status(), 200);
    // Far more changes than the buffer and the socket's buffers hold, none read meanwhile.
    let changes = 2_000;
    for n in 0..changes {
        api.heartbeat(n % 4);
    }
    let body = tokio::time::timeout(
        Duration::from_secs(60),
        response.into_body().collect_bytes(),
    )
    .await
    .expect("the watch ended")
    .unwrap();
    let versions: Vec<u64> = std::str::from_utf8(&body)
        .unwrap()
        .lines()
        .map(|l| {
            let event: Value = serde_json::from_str(l).unwrap();
            event["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(versions.len() < changes, "ended before the last change");
    let expected: Vec<u64> = (1001..1001 + versions.len() as u64).collect();
    assert_eq!(
        versions, expected,
        "consecutive from the first change, no gap"
    );
}
