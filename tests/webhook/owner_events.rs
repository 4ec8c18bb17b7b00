//! `[events] on_admission` (issue 37, "Events where users look"): a Pod whose images share no
//! node architecture gets a Warning Event on its controller owner, through the webhook, written
//! to a fake API server that takes Events exactly as a real one did
//! (`tests/data/kube-api/crashes/`) — and the fake's own conformance with those recordings.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tolerable::config::Config;

use crate::common::kube_api::{FakeApiServer, RegistryHosts};
use crate::common::recorded::{exchanges, send, Ids};
use crate::common::registry;
use crate::common::webhook::{self, TestServer};

/// An upper bound on an Event the test waits for (a hung test's guard, not a timing claim).
const EVENT_BOUND: Duration = Duration::from_secs(30);

fn api() -> FakeApiServer {
    FakeApiServer::start(RegistryHosts {
        basic: registry::basic().host.clone(),
        token: registry::token().host.clone(),
    })
}

/// The server `serve` runs with `[events] on_admission = true` and the node watch, once ready.
async fn server_writing_events(api: &FakeApiServer) -> TestServer {
    let mut config = Config::load(None, Vec::new()).unwrap();
    config.policy = webhook::policy();
    config.resolver = crate::common::settings();
    config.read_pull_secrets = false;
    config.namespace_policy = false;
    config.watch_nodes = true;
    config.events_on_admission = true;
    let server = TestServer::start_configured(config, Some(api.client("admintoken"))).await;
    webhook::until_ready(&server).await;
    server
}

const OWNER_UID: &str = "97e82c63-9fad-48bc-b270-54fd6362efb4";

/// A ReplicaSet's Pod (as in the recording: generateName, the controller reference) whose two
/// images share no architecture (s390x only, arm64 only).
fn review_of_owned_pod(uid: &str, owners: Value) -> Value {
    let host = &registry::plain().host;
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop", "operation": "CREATE",
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "web-7d9c6b8f5-", "namespace": "shop",
                             "ownerReferences": owners},
                "spec": {"containers": [
                    {"name": "web", "image": format!("{host}/fixtures/s390x-docker:v1")},
                    {"name": "helper", "image": format!("{host}/fixtures/arm64-oci:v1")}]}}}})
}

fn replica_set() -> Value {
    json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9c6b8f5",
            "uid": OWNER_UID, "controller": true, "blockOwnerDeletion": true}])
}

async fn denied(server: &TestServer, review: Value) {
    let (response, _) = webhook::admit(server, &review, Duration::from_secs(10)).await;
    assert_eq!(response["allowed"], false, "{response}");
}

/// A denied Pod with a controller owner: exactly one Warning Event, on the owner, in the shape
/// the API server accepted (events.k8s.io/v1), naming each image and why.
#[tokio::test]
async fn a_denied_pod_warns_its_owner_once_naming_each_image() {
    let api = api();
    let server = server_writing_events(&api).await;
    denied(&server, review_of_owned_pod("a1", replica_set())).await;
    assert!(
        api.wait_for_events(EVENT_BOUND, |e| !e.is_empty()).await,
        "no Event"
    );
    let events = api.events();
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = &events[0];
    assert_eq!(event["apiVersion"], "events.k8s.io/v1");
    assert_eq!(event["metadata"]["generateName"], "web-7d9c6b8f5-");
    assert_eq!(
        event["regarding"],
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "namespace": "shop",
               "name": "web-7d9c6b8f5", "uid": OWNER_UID})
    );
    assert_eq!(
        (&event["type"], &event["reason"], &event["action"]),
        (
            &json!("Warning"),
            &json!("NoCommonArchitecture"),
            &json!("Denied")
        )
    );
    assert_eq!(event["reportingController"], "tolerable.io/tolerable");
    let note = event["note"].as_str().unwrap();
    for image in [
        "fixtures/s390x-docker:v1 (linux/s390x)",
        "fixtures/arm64-oci:v1 (linux/arm64)",
    ] {
        assert!(note.contains(image), "{image} missing from: {note}");
    }
    // Counted once the API server's answer is back, which follows the fake's storing it.
    let deadline = Instant::now() + EVENT_BOUND;
    loop {
        let metrics = webhook::metrics_text(&server).await;
        let sent = webhook::metric_value(&metrics, "tolerable_events_total{result=\"sent\"}");
        if sent == Some(1.0) {
            break;
        }
        assert!(Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Twenty Pods of one owner denied: one Event (the limit is per owner); the other nineteen are
/// counted as limited, none dropped. Another owner still gets its own.
#[tokio::test]
async fn twenty_denied_pods_of_one_owner_make_one_event() {
    let api = api();
    let server = server_writing_events(&api).await;
    for i in 0..20 {
        denied(
            &server,
            review_of_owned_pod(&format!("b{i}"), replica_set()),
        )
        .await;
    }
    let other = json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                        "uid": "3c0a3d1e-0000-4000-8000-000000000001", "controller": true}]);
    denied(&server, review_of_owned_pod("other", other)).await;
    assert!(
        api.wait_for_events(EVENT_BOUND, |e| e.len() >= 2).await,
        "{:#?}",
        api.events()
    );
    let owners: Vec<Value> = api
        .events()
        .iter()
        .map(|e| e["regarding"]["name"].clone())
        .collect();
    assert_eq!(owners, [json!("web-7d9c6b8f5"), json!("db")]);
    let metrics = webhook::metrics_text(&server).await;
    let count = |result: &str| {
        webhook::metric_value(
            &metrics,
            &format!("tolerable_events_total{{result=\"{result}\"}}"),
        )
    };
    assert_eq!(count("limited"), Some(19.0), "{metrics}");
    assert_eq!(count("dropped"), Some(0.0), "{metrics}");
}

/// A bare Pod (no controller owner) and a dry run: denied as ever, no Event.
#[tokio::test]
async fn a_bare_pod_and_a_dry_run_write_no_event() {
    let api = api();
    let server = server_writing_events(&api).await;
    denied(&server, review_of_owned_pod("bare", json!([]))).await;
    let mut dry = review_of_owned_pod("dry", replica_set());
    dry["request"]["dryRun"] = json!(true);
    denied(&server, dry).await;
    // Then one that does warn: the Events queue is drained in order, so once its Event is
    // there, the two before it would have been too.
    let other = json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "migrate",
                        "uid": "3c0a3d1e-0000-4000-8000-000000000002", "controller": true}]);
    denied(&server, review_of_owned_pod("job", other)).await;
    assert!(api.wait_for_events(EVENT_BOUND, |e| !e.is_empty()).await);
    let events = api.events();
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["regarding"]["kind"], "Job");
}

/// The Event exchanges recorded from a real kube-apiserver v1.36.3 (a controller's Warning
/// Event on a Pod, core/v1; on the owner Deployment, events.k8s.io/v1; and the 422 for a
/// generateName ending in a dot without eventTime), replayed against the fake: the recorded
/// status, and the recorded body but for what each server makes up (name suffix, uid,
/// resourceVersion, creationTimestamp, managedFields).
#[tokio::test]
async fn the_fake_takes_events_as_the_recorded_api_server_did() {
    let api = api();
    let client = api.client("admintoken");
    let mut ids = Ids::default();
    let replayed: Vec<_> = exchanges("crashes")
        .into_iter()
        .filter(|e| {
            e.request.method == "POST"
                && e.request.path.ends_with("/events")
                && !e.note.starts_with("the kubelet's")
        })
        .collect();
    assert_eq!(replayed.len(), 3, "the controller's Events and the 422");
    for exchange in &replayed {
        let request = &exchange.request;
        let (code, mut answer) = send(
            &client,
            &request.method,
            &request.path,
            request.content_type.as_deref(),
            request.body.as_ref(),
        )
        .await;
        let note = &exchange.note;
        assert_eq!(code, exchange.response.status, "{note}: {answer}");
        let mut recorded = exchange.response.body.clone();
        for pointer in [
            "/metadata/name",
            "/metadata/uid",
            "/metadata/resourceVersion",
        ] {
            ids.align(&mut answer, &recorded, pointer);
        }
        // The time it was created: the fake's now (two may share a second or not).
        if let Some(at) = recorded.pointer("/metadata/creationTimestamp").cloned() {
            assert!(
                answer["metadata"]["creationTimestamp"].is_string(),
                "{note}"
            );
            answer["metadata"]["creationTimestamp"] = at;
        }
        if let Some(meta) = recorded["metadata"].as_object_mut() {
            meta.remove("managedFields");
        }
        assert_eq!(answer, recorded, "{note}");
    }
}

/// What no recording shows is refused (501): an events.k8s.io Event without `regarding`'s uid,
/// and one whose `reportingController` is not a qualified name.
#[tokio::test]
async fn the_fake_refuses_event_shapes_no_recording_shows() {
    let api = api();
    let client = api.client("admintoken");
    let accepted = exchanges("crashes")
        .into_iter()
        .find(|e| {
            e.note
                .starts_with("a controller's Warning Event on the owner")
        })
        .unwrap();
    let body = accepted.request.body.unwrap();
    let mut no_uid = body.clone();
    no_uid["regarding"].as_object_mut().unwrap().remove("uid");
    let mut unqualified = body.clone();
    unqualified["reportingController"] = json!("tolerable");
    for event in [no_uid, unqualified] {
        let (code, answer) = send(
            &client,
            "POST",
            &accepted.request.path,
            Some("application/json"),
            Some(&event),
        )
        .await;
        assert_eq!((code, &answer["reason"]), (501, &json!("NotImplemented")));
    }
    assert!(api.events().is_empty());
}
