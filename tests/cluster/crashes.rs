//! The crash-signal watch (`[crashes] watch`, issue 38) against a fake API server replaying a
//! real one's recorded crash (`tests/data/kube-api/crashes/`): the kubelet's BackOff Events
//! listed and watched with a field selector, the Pod read, classified, confirmed, and Evented
//! on the Pod and its owner — and the fake's conformance with those recordings.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tolerable::config::Config;

use crate::common;
use crate::common::crashes_api::{Crashes, NODE};
use crate::common::kube_api::{FakeApiServer, RegistryHosts};
use crate::common::recorded::{exchanges, json_lines, send, send_raw};
use crate::common::registry;
use crate::common::webhook::{self, TestServer};

/// An upper bound on what a test waits for (a hung test's guard, not a timing claim).
pub(crate) const BOUND: Duration = Duration::from_secs(60);

pub(super) fn hosts() -> RegistryHosts {
    RegistryHosts {
        basic: registry::basic().host.clone(),
        token: registry::token().host.clone(),
    }
}

/// `serve` with the crash watch, leading (not competing for the Lease: what only a leader does,
/// it does), and the node watch.
pub(crate) async fn watching(api: &FakeApiServer) -> TestServer {
    watching_with(api, |_| {}).await
}

/// [`watching`], the config changed by `change` first (`[crashes] heal` on, …).
pub(crate) async fn watching_with(
    api: &FakeApiServer,
    change: impl FnOnce(&mut Config),
) -> TestServer {
    let mut config = Config::load(None, Vec::new()).unwrap();
    config.policy = webhook::policy();
    config.resolver = common::settings();
    config.read_pull_secrets = false;
    config.namespace_policy = false;
    config.watch_nodes = true;
    config.crash_watch = true;
    change(&mut config);
    TestServer::start_configured(config, Some(api.client("admintoken"))).await
}

/// Waits (at most [`BOUND`]) until the server's metrics show `series` at `value`.
pub(crate) async fn until_metric(server: &TestServer, series: &str, value: f64) {
    let deadline = Instant::now() + BOUND;
    loop {
        let text = webhook::metrics_text(server).await;
        if webhook::metric_value(&text, series) == Some(value) {
            return;
        }
        assert!(Instant::now() < deadline, "{series} never {value}:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The two Events written (on the Pod, core/v1; on its ReplicaSet, events.k8s.io/v1).
pub(super) async fn pod_and_owner_events(api: &FakeApiServer) -> (Value, Value) {
    assert!(
        api.wait_for_events(BOUND, |e| e.len() >= 2).await,
        "{:#?}",
        api.events()
    );
    let events = api.events();
    assert_eq!(events.len(), 2, "{events:#?}");
    let on = |kind: &str| {
        events
            .iter()
            .find(|e| e["involvedObject"]["kind"] == kind || e["regarding"]["kind"] == kind)
            .unwrap_or_else(|| panic!("no Event on a {kind}: {events:#?}"))
            .clone()
    };
    (on("Pod"), on("ReplicaSet"))
}

/// The recorded crash as it is (runc's text, exit 255, a ~0 s run) on an arm64 node, its image
/// on a registry no test reaches: an exec format error, not shown to be the architecture (the
/// index cannot be read) — Evented on the Pod and its ReplicaSet, counted as unconfirmed, the
/// Pod read (and marked) once however many BackOffs name it.
#[tokio::test]
async fn the_recorded_crash_is_reported_unconfirmed_on_the_pod_and_its_owner() {
    let api = FakeApiServer::start_with_crashes(hosts(), Crashes::recorded());
    let server = watching(&api).await;
    let (pod, owner) = pod_and_owner_events(&api).await;
    assert_eq!(pod["apiVersion"], "v1");
    assert_eq!(pod["involvedObject"]["name"], "web-7d9c6b8f5-abcde");
    assert_eq!(
        pod["involvedObject"]["uid"],
        "26be13ca-16c0-4b8b-9e31-07601681d14b"
    );
    assert_eq!(
        (&pod["type"], &pod["reason"]),
        (&json!("Warning"), &json!("ExecFormatError"))
    );
    let message = pod["message"].as_str().unwrap();
    let head = format!("container web: exec format error on arm64 node {NODE}");
    for text in [
        head.as_str(),
        "not shown to be the architecture",
        "registry.example.com/shop/web@sha256:5c4d2b0a",
    ] {
        assert!(message.contains(text), "{text} missing from: {message}");
    }
    assert_eq!(owner["apiVersion"], "events.k8s.io/v1");
    assert_eq!(owner["regarding"]["name"], "web-7d9c6b8f5");
    assert_eq!(owner["action"], "Detected");
    assert!(owner["note"]
        .as_str()
        .unwrap()
        .starts_with("Pod web-7d9c6b8f5-abcde: container web"));
    until_metric(
        &server,
        "tolerable_exec_format_crashes_total{architecture=\"arm64\",verdict=\"unconfirmed\"}",
        1.0,
    )
    .await;
    let pod_requests = api
        .requests()
        .iter()
        .filter(|p| p.as_str() == "/api/v1/namespaces/shop/pods/web-7d9c6b8f5-abcde")
        .count();
    // One read, and the mark's one patch (unconfirmed: `exec-format-error`).
    let marks = api.crash_patches();
    assert_eq!((pod_requests, marks.len()), (2, 1), "{marks:#?}");
    let mark = marks[0][2]["value"]["tolerable.io/crash"].as_str().unwrap();
    assert!(
        mark.starts_with("exec-format-error; container=web"),
        "{mark}"
    );
}

/// The fake replaying the recorded crash, its container's image `repository:v1` on `host` and
/// its `imageID` that tag's digest as the registry serves it now; with the tag and the imageID.
pub(crate) async fn crashing_image(
    host: &str,
    repository: &str,
) -> (FakeApiServer, String, String) {
    crashing_image_with(host, repository, |c| c).await
}

/// [`crashing_image`], the recorded crash changed by `change` (the heal tests' Pods).
pub(crate) async fn crashing_image_with(
    host: &str,
    repository: &str,
    change: impl FnOnce(Crashes) -> Crashes,
) -> (FakeApiServer, String, String) {
    let tag = format!("{host}/{repository}:v1");
    let digest = common::digest_of(&tag).await;
    let image_id = format!("{host}/{repository}@{digest}");
    let crashes = change(Crashes::with_image(&tag, &image_id));
    let api = FakeApiServer::start_with_crashes(hosts(), crashes);
    (api, tag, image_id)
}

/// The same crash, the image pulled by digest from a test registry whose index claims only
/// linux/s390x, on an arm64 node (a Pod placed without tolerable's decision, confirmation
/// (a)): a wrong-architecture crash, flagged as such, learning nothing new.
#[tokio::test]
async fn a_crash_on_an_architecture_the_index_lacks_is_flagged() {
    let registry = registry::plain();
    let (api, _, _) = crashing_image(&registry.host, "fixtures/s390x-docker").await;
    let server = watching(&api).await;
    let (pod, _) = pod_and_owner_events(&api).await;
    assert_eq!(pod["reason"], "WrongArchitecture");
    let message = pod["message"].as_str().unwrap();
    assert!(message.contains("claims only linux/s390x"), "{message}");
    until_metric(
        &server,
        "tolerable_exec_format_crashes_total{architecture=\"arm64\",verdict=\"not_among_platforms\"}",
        1.0,
    )
    .await;
}

/// The same crash, the image a test registry's mislabelled index (linux/amd64 and linux/arm64,
/// both the same amd64 image) on an arm64 node: confirmation (b) reads the arm64 entry's image
/// config — it says amd64 — and calls it a wrong architecture, learned: the next admission of
/// the image leaves arm64 out.
#[tokio::test]
async fn a_mislabelled_index_is_confirmed_from_the_entrys_image_config() {
    let registry = registry::plain();
    let pusher = common::fixtures::Pusher::for_mode(&registry.host, registry.mode);
    pusher
        .push("crashes/mislabelled", "mislabelled", "v1")
        .await;
    let (api, tag, image_id) = crashing_image(&registry.host, "crashes/mislabelled").await;
    let server = watching(&api).await;
    let (pod, owner) = pod_and_owner_events(&api).await;
    assert_eq!(pod["reason"], "WrongArchitecture");
    let message = pod["message"].as_str().unwrap();
    assert!(
        message.contains("its entry for arm64 is a linux/amd64 image"),
        "{message}"
    );
    assert!(message.contains(&image_id), "{message}");
    assert_eq!(owner["reason"], "WrongArchitecture");
    until_metric(
        &server,
        "tolerable_exec_format_crashes_total{architecture=\"arm64\",verdict=\"wrong_architecture\"}",
        1.0,
    )
    .await;
    learned_then_left_out(&server, &tag).await;
}

/// An admission of the one-container Pod `name` running `image` in `shop` (allowed): the review
/// sent and the answer.
pub(super) async fn admit_in_shop(server: &TestServer, image: &str, name: &str) -> (Value, Value) {
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": name,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop", "operation": "CREATE",
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "shop"},
                "spec": {"containers": [{"name": "web", "image": image}]}}}});
    let (response, _) = webhook::admit(server, &review, Duration::from_secs(10)).await;
    assert_eq!(response["allowed"], true, "{response}");
    (review, response)
}

/// The next admission of the image (by its tag: the same digest) leaves arm64 out — its index
/// claims amd64 and arm64 — and says why.
pub(super) async fn learned_then_left_out(server: &TestServer, image: &str) {
    let (review, response) = admit_in_shop(server, image, "web-2").await;
    let warnings = webhook::warnings(&response);
    assert!(
        warnings.iter().any(|w| w.contains("arm64 left out")),
        "{warnings:?}"
    );
    let patched = webhook::patched(&review, &response);
    let terms = &patched["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    assert_eq!(
        terms[0]["matchExpressions"][0]["values"],
        json!(["amd64"]),
        "{patched:#}"
    );
    assert!(
        webhook::arch_tolerations(&patched).is_empty(),
        "{patched:#}"
    );
}

/// The same text for an image whose index is consistent (its arm64 entry is an arm64 image) and
/// that runs nowhere else: reported as not shown to be the architecture.
#[tokio::test]
async fn a_consistent_index_leaves_the_crash_unconfirmed() {
    let registry = registry::plain();
    let (api, _, _) = crashing_image(&registry.host, "fixtures/arm64-oci").await;
    let server = watching(&api).await;
    let (pod, _) = pod_and_owner_events(&api).await;
    assert_eq!(pod["reason"], "ExecFormatError");
    let message = pod["message"].as_str().unwrap();
    assert!(
        message.contains("not shown to be the architecture"),
        "{message}"
    );
    assert!(message.contains("claims linux/arm64"), "{message}");
    until_metric(
        &server,
        "tolerable_exec_format_crashes_total{architecture=\"arm64\",verdict=\"unconfirmed\"}",
        1.0,
    )
    .await;
}

/// The recorded crash without the text in its termination message: the previous log is read
/// (the recorded 500: no kubelet here), nothing is found, nothing is said or counted.
#[tokio::test]
async fn without_the_text_the_previous_log_is_read_and_nothing_said() {
    let api = FakeApiServer::start_with_crashes(hosts(), Crashes::recorded().without_message());
    let server = watching(&api).await;
    let log = "/api/v1/namespaces/shop/pods/web-7d9c6b8f5-abcde/log";
    let deadline = Instant::now() + BOUND;
    while !api.requests().iter().any(|p| p == log) {
        assert!(Instant::now() < deadline, "{:?}", api.requests());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The log read is the watch's last step for this crash; a count or an Event it made after
    // the 500 would come later than this scrape (an upper bound this test cannot wait out),
    // so this checks what was done up to the log read.
    let text = webhook::metrics_text(&server).await;
    for verdict in ["wrong_architecture", "not_among_platforms", "unconfirmed"] {
        let series = format!(
            "tolerable_exec_format_crashes_total{{architecture=\"arm64\",verdict=\"{verdict}\"}}"
        );
        assert_eq!(webhook::metric_value(&text, &series), Some(0.0), "{series}");
    }
    assert!(api.events().is_empty());
}

/// Not leading: the BackOffs are watched, nothing is read or written.
#[tokio::test]
async fn a_replica_that_does_not_lead_reads_and_writes_nothing() {
    let api = FakeApiServer::start_with_crashes(hosts(), Crashes::recorded());
    let mut config = Config::load(None, Vec::new()).unwrap();
    config.resolver = common::settings();
    config.read_pull_secrets = false;
    config.namespace_policy = false;
    config.crash_watch = true;
    // Another replica holds the Lease (the real election, on the fake's Leases).
    let (_server, _holder) = TestServer::start_following(config, api.client("admintoken")).await;
    // The Events were listed (and a watch opened after the list): by then a leader would have
    // queued the Pod's read.
    let deadline = Instant::now() + BOUND;
    let listed_and_watched = |api: &FakeApiServer| {
        api.requests()
            .iter()
            .filter(|p| *p == "/api/v1/events")
            .count()
            >= 2
    };
    while !listed_and_watched(&api) {
        assert!(Instant::now() < deadline, "{:?}", api.requests());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!api.requests().iter().any(|p| p.contains("/pods/")));
    assert!(api.events().is_empty());
}

/// The recorded reads replayed against the fake: each status and body as recorded (the Pod's
/// nodeName aside, moved to the node fake's arm64 Node), the watch's lines as recorded.
#[tokio::test]
async fn the_fake_answers_the_recorded_reads_as_recorded() {
    let api = FakeApiServer::start_with_crashes(hosts(), Crashes::recorded());
    let client = api.client("admintoken");
    let mut replayed = 0;
    for exchange in exchanges("crashes") {
        let request = &exchange.request;
        let path = request.path.as_str();
        let served = request.method == "GET"
            && (path.starts_with("/api/v1/events") || path.contains("/pods/web-7d9c6b8f5-abcde"));
        if !served {
            continue;
        }
        replayed += 1;
        let note = &exchange.note;
        if path.contains("watch=1") {
            let (code, bytes) = send_raw(&client, "GET", path, None, None).await;
            assert_eq!(code, exchange.response.status, "{note}");
            let lines = json_lines(&bytes);
            assert_eq!(Value::Array(lines), exchange.response.body, "{note}");
            continue;
        }
        let (code, mut answer) = send(&client, "GET", path, None, None).await;
        assert_eq!(code, exchange.response.status, "{note}: {answer}");
        if answer["kind"] == "Pod" {
            assert_eq!(answer["spec"]["nodeName"], NODE);
            answer["spec"]["nodeName"] = exchange.response.body["spec"]["nodeName"].clone();
        }
        assert_eq!(answer, exchange.response.body, "{note}");
    }
    assert_eq!(replayed, 6, "lists, paged, 400, watch, Pod, log");
}
