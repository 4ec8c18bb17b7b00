//! Scheduling gates end to end: the real server (the composition root `serve` runs) gating a
//! Pod at admission while the registry (Debian's docker-registry behind a fault proxy) is
//! down, and its gate controller releasing it through the real `kube` client against the thin
//! fake API server of `tests/common/gates_api.rs`, which refuses what a real v1.36 API server
//! refuses on a gated Pod (checked first against the recorded exchanges).

use crate::common;

use std::time::Duration;

use common::fault_proxy::{Fault, FaultProxy};
use common::gates_api::{recorded_json, recording, GatesApiServer};
use common::recorded::Ids;
use common::registry;
use common::webhook::{self, metric_value, TestServer};
use serde_json::{json, Value};
use tolerable::mutate::gate::{GATE, GATED_LABEL, UNRUNNABLE};
use tolerable::mutate::{OnLookupFailure, ARCH_LABEL, DECISION_ANNOTATION};

/// How long a test waits for the controller to act: far above what it needs (a retry after a
/// second), a bound on a hung test, never an order.
const WAIT: Duration = Duration::from_secs(30);
const OTHER_GATE: &str = "example.com/other-gate";

/// The exchanges recorded in `tests/data/kube-api/gates/` (README there), in the recorded
/// order: the file name, the method, the path and query. gated-3's creation was not recorded;
/// the test creates it (one gate) before its three exchanges.
const RECORDED: [(&str, &str, &str); 13] = [
    ("pod-create-gated", "POST", "/api/v1/namespaces/e2e/pods"),
    (
        "pod-patch-release-gate",
        "PATCH",
        "/api/v1/namespaces/e2e/pods/gated-1",
    ),
    ("pod-create-gated-2", "POST", "/api/v1/namespaces/e2e/pods"),
    (
        "pod-patch-new-term-422",
        "PATCH",
        "/api/v1/namespaces/e2e/pods/gated-2",
    ),
    (
        "pod-patch-affinity-other-gate-left",
        "PATCH",
        "/api/v1/namespaces/e2e/pods/gated-1",
    ),
    (
        "pod-patch-nodeselector-gated",
        "PATCH",
        "/api/v1/namespaces/e2e/pods/gated-2",
    ),
    (
        "pod-patch-gates-test-failed",
        "PATCH",
        "/api/v1/namespaces/e2e/pods/gated-1",
    ),
    (
        "pod-create-gated-with-nodename-422",
        "POST",
        "/api/v1/namespaces/e2e/pods",
    ),
    (
        "pod-patch-add-gate-422",
        "PATCH",
        "/api/v1/namespaces/e2e/pods/gated-2",
    ),
    (
        "pod-list-gated-label",
        "GET",
        "/api/v1/pods?labelSelector=tolerable.io%2Fgated%3Dtrue",
    ),
    (
        "pod-patch-remove-last-gate",
        "PATCH",
        "/api/v1/namespaces/e2e/pods/gated-3",
    ),
    (
        "pod-patch-affinity-ungated-422",
        "PATCH",
        "/api/v1/namespaces/e2e/pods/gated-3",
    ),
    (
        "pod-patch-toleration-ungated",
        "PATCH",
        "/api/v1/namespaces/e2e/pods/gated-3",
    ),
];

/// The recorded status of exchange `name` (from its headers' status line).
fn recorded_status(name: &str) -> u16 {
    let headers = recording(&format!("{name}.headers.txt"));
    let line = headers.lines().next().unwrap();
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

/// A Pod (or an item of a list) with what each server makes up (uid, resourceVersion) paired
/// with the recording's and replaced by it; timestamps and `managedFields` (which the fake does
/// not write) left out of the comparison.
fn align_pod(fake: &mut Value, recorded: &mut Value, ids: &mut Ids) {
    ids.align(fake, recorded, "/metadata/uid");
    ids.align(fake, recorded, "/metadata/resourceVersion");
    for object in [&mut *fake, &mut *recorded] {
        if let Some(meta) = object["metadata"].as_object_mut() {
            meta.remove("managedFields");
            meta.remove("creationTimestamp");
        }
        for condition in object["status"]["conditions"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            condition
                .as_object_mut()
                .unwrap()
                .remove("lastTransitionTime");
        }
    }
}

fn align(fake: &mut Value, recorded: &mut Value, ids: &mut Ids) {
    if recorded["kind"] == "PodList" {
        ids.align(fake, recorded, "/metadata/resourceVersion");
        let (f, r) = (
            fake["items"].as_array_mut(),
            recorded["items"].as_array_mut(),
        );
        for (f, r) in f.into_iter().flatten().zip(r.into_iter().flatten()) {
            align_pod(f, r, ids);
        }
    } else if recorded["kind"] == "Pod" {
        align_pod(fake, recorded, ids);
    }
}

/// Every exchange recorded from a real kube-apiserver v1.36 in `tests/data/kube-api/gates/`,
/// sent over the wire in the recorded order with a real `kube` client: each gets the recorded
/// status and the recorded body (the created, patched and listed Pods field for field, the
/// refusals' Status bodies byte for byte as JSON).
#[tokio::test]
async fn the_fake_answers_the_recorded_exchanges_as_recorded() {
    let api = GatesApiServer::start();
    let client = api.client();
    let mut ids = Ids::default();
    for (name, method, path) in RECORDED {
        if name == "pod-patch-remove-last-gate" {
            let mut third = recorded_json("pod-create-gated.request.json");
            third["metadata"]["name"] = json!("gated-3");
            third["spec"]["schedulingGates"] = json!([{"name": GATE}]);
            api.create("e2e", third).unwrap();
        }
        let body = (method != "GET").then(|| recorded_json(&format!("{name}.request.json")));
        let content_type = match method {
            "PATCH" => Some("application/json-patch+json"),
            "POST" => Some("application/json"),
            _ => None,
        };
        let (code, mut answer) =
            common::recorded::send(&client, method, path, content_type, body.as_ref()).await;
        assert_eq!(code, recorded_status(name), "{name}: {answer}");
        let mut recorded = recorded_json(&format!("{name}.body.json"));
        align(&mut answer, &mut recorded, &mut ids);
        assert_eq!(answer, recorded, "{name}");
    }
    assert!(recording("README.md").contains("v1.36"));
}

/// On a gated Pod, what no recording shows accepted is refused (501 NotImplemented) and the Pod
/// left as it was: a nodeSelector changed, a toleration removed, another spec field changed, a
/// merge patch; and an Event of a shape not recorded (events.k8s.io/v1-style, or `Normal`).
#[tokio::test]
async fn the_fake_refuses_what_no_gates_recording_covers() {
    let api = GatesApiServer::start();
    let mut pod = recorded_json("pod-create-gated.request.json");
    pod["spec"]["nodeSelector"] = json!({"disk": "ssd"});
    pod["spec"]["tolerations"] = json!([{"key": "k", "operator": "Exists"}]);
    let created = api.create("e2e", pod).unwrap();
    let client = api.client();
    let path = "/api/v1/namespaces/e2e/pods/gated-1";
    let json_patch = Some("application/json-patch+json");
    for ops in [
        json!([{"op": "replace", "path": "/spec/nodeSelector/disk", "value": "hdd"}]),
        json!([{"op": "remove", "path": "/spec/tolerations/0"}]),
        json!([{"op": "add", "path": "/spec/activeDeadlineSeconds", "value": 5}]),
    ] {
        let (code, body) =
            common::recorded::send(&client, "PATCH", path, json_patch, Some(&ops)).await;
        assert_eq!(
            (code, &body["reason"]),
            (501, &json!("NotImplemented")),
            "{ops}"
        );
    }
    let merge = json!({"spec": {"nodeSelector": {"disk": "hdd"}}});
    let merge_type = Some("application/merge-patch+json");
    let (code, _) = common::recorded::send(&client, "PATCH", path, merge_type, Some(&merge)).await;
    assert_eq!(code, 501);
    assert_eq!(api.pod("e2e", "gated-1").unwrap(), created, "unchanged");
    let mut event = json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": "gated-1."},
        "involvedObject": {"kind": "Pod", "namespace": "e2e", "name": "gated-1",
                           "uid": created["metadata"]["uid"], "apiVersion": "v1"},
        "reason": "R", "message": "m", "type": "Warning", "source": {"component": "tolerable"}});
    let events = "/api/v1/namespaces/e2e/events";
    let post = Some("application/json");
    let (code, made) = common::recorded::send(&client, "POST", events, post, Some(&event)).await;
    assert_eq!(code, 201, "the recorded shape: {made}");
    event["type"] = json!("Normal");
    let (code, _) = common::recorded::send(&client, "POST", events, post, Some(&event)).await;
    assert_eq!(code, 501, "a Normal Event was not recorded");
    assert_eq!(api.events().len(), 1);
}

/// The server gating on lookup failures, its controller on the fake API server; lookups through
/// `proxy` (so the test can take the registry away and give it back).
fn gate_config(api_port_proxy: &str, gate_timeout: Duration) -> tolerable::config::Config {
    let mut config = tolerable::config::Config::load(None, Vec::new()).unwrap();
    config.policy = webhook::policy();
    config.policy.on_lookup_failure = OnLookupFailure::Gate;
    let mut settings = common::settings();
    settings
        .transport
        .insecure_registries
        .push(api_port_proxy.to_owned());
    settings.lookup_timeout = Duration::from_secs(1);
    settings.cache.failure_ttl = Duration::from_millis(100);
    settings.breaker.cooldown = Duration::from_millis(200);
    config.resolver = settings;
    config.read_pull_secrets = false;
    config.watch_nodes = false;
    config.gate_timeout = gate_timeout;
    config
}

/// A Pod as `gated-1` was recorded (another controller's gate, two ORed zone terms), named
/// `name`, with `images`, through the webhook: its answer applied and the Pod created in the
/// fake API server, as the API server does after admission. The created Pod.
async fn admit_and_create(
    server: &TestServer,
    api: &GatesApiServer,
    name: &str,
    images: &[String],
) -> Value {
    let mut pod = recorded_json("pod-create-gated.request.json");
    pod["metadata"] = json!({"name": name, "namespace": "e2e", "labels": {"app": "web"}});
    pod["spec"]["schedulingGates"] = json!([{"name": OTHER_GATE}]);
    pod["spec"]["containers"] = images
        .iter()
        .enumerate()
        .map(|(i, image)| json!({"name": format!("c{i}"), "image": image}))
        .collect();
    let mut review = webhook::recorded("pod-create-simple.v1.json", "unused");
    review["request"]["name"] = json!(name);
    review["request"]["object"] = pod;
    let (response, _) = webhook::admit(server, &review, WAIT).await;
    assert_eq!(response["allowed"], true, "{response}");
    let gated = webhook::patched(&review, &response);
    assert_eq!(
        gated["spec"]["schedulingGates"],
        json!([{"name": OTHER_GATE}, {"name": GATE}])
    );
    assert_eq!(gated["metadata"]["labels"][GATED_LABEL], "true");
    let note = gated["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(
        note.contains("waiting for the platforms of") && note.contains(&images[0]),
        "{note}"
    );
    assert_eq!(
        gated["spec"]["tolerations"],
        Value::Null,
        "nothing else decided"
    );
    api.create("e2e", gated).unwrap()
}

fn released(api: &GatesApiServer, name: &str) -> bool {
    api.pod("e2e", name)
        .is_some_and(|p| p["metadata"]["labels"].get(GATED_LABEL).is_none())
}

async fn metric(server: &TestServer, series: &str) -> f64 {
    let text = webhook::metrics_text(server).await;
    metric_value(&text, series).unwrap_or_else(|| panic!("no {series}:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_down_gates_then_back_releases_with_the_decision() {
    let proxy = FaultProxy::start(&registry::plain().host);
    proxy.set(Fault::Status(503));
    let api = GatesApiServer::start();
    let server =
        TestServer::start_configured(gate_config(&proxy.host, WAIT * 4), Some(api.client())).await;
    let image = format!("{}/fixtures/arm64-oci:v1", proxy.host);
    admit_and_create(&server, &api, "web", std::slice::from_ref(&image)).await;
    assert_eq!(metric(&server, "tolerable_gated_pods_total").await, 1.0);
    let gated_outcome = "tolerable_admissions_total{outcome=\"gated\"}";
    assert_eq!(metric(&server, gated_outcome).await, 1.0);
    proxy.set(Fault::None);
    assert!(
        api.wait_for(WAIT, |api| released(api, "web")).await,
        "never released"
    );
    let pod = api.pod("e2e", "web").unwrap();
    assert_eq!(
        pod["spec"]["schedulingGates"],
        json!([{"name": OTHER_GATE}]),
        "the other gate stays"
    );
    assert_eq!(
        webhook::arch_tolerations(&pod),
        vec![
            json!({"key": ARCH_LABEL, "operator": "Equal", "value": "arm64", "effect": "NoSchedule"})
        ]
    );
    let terms = pod["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(terms.len(), 2, "no new ORed term");
    for term in &terms {
        let expressions = term["matchExpressions"].as_array().unwrap();
        assert_eq!(
            expressions.last().unwrap(),
            &json!({"key": ARCH_LABEL, "operator": "In", "values": ["arm64"]})
        );
    }
    let note = pod["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(
        note.contains(&image) && note.contains("linux/arm64"),
        "{note}"
    );
    let patches = api.patches();
    assert!(
        patches.iter().all(|(_, _, ops, _)| ops[0]["op"] == "test"),
        "{patches:?}"
    );
    assert_eq!(
        patches.iter().filter(|p| p.3 == 200).count(),
        1,
        "one patch released it"
    );
    assert_eq!(
        metric(
            &server,
            "tolerable_gate_releases_total{outcome=\"decided\"}"
        )
        .await,
        1.0
    );
    assert_eq!(
        metric(&server, "tolerable_gate_held_seconds_count").await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn still_down_at_gate_timeout_releases_unchanged_with_a_warning_event() {
    let proxy = FaultProxy::start(&registry::plain().host);
    proxy.set(Fault::Status(503));
    let api = GatesApiServer::start();
    let timeout = Duration::from_secs(2);
    let server =
        TestServer::start_configured(gate_config(&proxy.host, timeout), Some(api.client())).await;
    assert_eq!(metric(&server, "tolerable_gate_timeout_seconds").await, 2.0);
    let image = format!("{}/fixtures/arm64-oci:v1", proxy.host);
    let created = admit_and_create(&server, &api, "late", &[image]).await;
    assert!(
        api.wait_for(WAIT, |api| released(api, "late")).await,
        "never released"
    );
    let pod = api.pod("e2e", "late").unwrap();
    assert_eq!(
        pod["spec"]["schedulingGates"],
        json!([{"name": OTHER_GATE}])
    );
    assert_eq!(
        pod["spec"]["tolerations"], created["spec"]["tolerations"],
        "unchanged"
    );
    assert_eq!(
        pod["spec"]["affinity"], created["spec"]["affinity"],
        "unchanged"
    );
    let note = pod["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(
        note.starts_with("released unchanged") && note.contains("gate_timeout (2s)"),
        "{note}"
    );
    assert!(
        api.wait_for(WAIT, |api| !api.events().is_empty()).await,
        "no Event"
    );
    let event = &api.events()[0];
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["reason"], "TolerableGateTimeout");
    assert_eq!(event["involvedObject"]["name"], "late");
    assert_eq!(event["involvedObject"]["uid"], created["metadata"]["uid"]);
    // Released no earlier than gate_timeout after the Pod was created, by the API's own
    // timestamps (both whole seconds, rounded down: a release at or after creation + 2 s is
    // stamped at least 2 s after the creation's stamp), not by a clock in the test.
    let stamp = |v: &Value| {
        v.as_str()
            .unwrap()
            .parse::<k8s_openapi::jiff::Timestamp>()
            .unwrap()
    };
    let held = stamp(&event["firstTimestamp"]).as_second()
        - stamp(&created["metadata"]["creationTimestamp"]).as_second();
    assert!(
        held >= timeout.as_secs() as i64,
        "released {held} s after creation"
    );
    assert_eq!(
        metric(
            &server,
            "tolerable_gate_releases_total{outcome=\"timed_out\"}"
        )
        .await,
        1.0
    );
    assert_eq!(
        metric(
            &server,
            "tolerable_gate_releases_total{outcome=\"decided\"}"
        )
        .await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_without_a_common_architecture_stay_gated_as_unrunnable() {
    let proxy = FaultProxy::start(&registry::plain().host);
    proxy.set(Fault::Status(503));
    let api = GatesApiServer::start();
    let server =
        TestServer::start_configured(gate_config(&proxy.host, WAIT * 4), Some(api.client())).await;
    let images = [
        format!("{}/fixtures/amd64-docker:v1", proxy.host),
        format!("{}/fixtures/arm64-oci:v1", proxy.host),
    ];
    admit_and_create(&server, &api, "split", &images).await;
    proxy.set(Fault::None);
    let unrunnable = |api: &GatesApiServer| {
        api.pod("e2e", "split")
            .is_some_and(|p| p["metadata"]["labels"][GATED_LABEL] == UNRUNNABLE)
    };
    assert!(
        api.wait_for(WAIT, unrunnable).await,
        "never marked unrunnable"
    );
    let pod = api.pod("e2e", "split").unwrap();
    assert_eq!(
        pod["spec"]["schedulingGates"],
        json!([{"name": OTHER_GATE}, {"name": GATE}]),
        "stays gated"
    );
    let note = pod["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap();
    for (image, platform) in images.iter().zip(["linux/amd64", "linux/arm64"]) {
        assert!(note.contains(&format!("{image} ({platform}")), "{note}");
    }
    assert!(
        api.wait_for(WAIT, |api| !api.events().is_empty()).await,
        "no Event"
    );
    assert_eq!(api.events()[0]["reason"], "TolerableGateUnrunnable");
    assert_eq!(
        metric(&server, "tolerable_gate_unrunnable_total").await,
        1.0
    );
    // Out of the watched set: not counted as a Pod still waiting (once the watch has seen the
    // new label).
    let deadline = tokio::time::Instant::now() + WAIT;
    while metric(&server, "tolerable_gate_oldest_pod_age_seconds").await != 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still counted as waiting"
        );
        tokio::task::yield_now().await;
    }
}

/// A replica that does not lead (another holds the Lease, through the same API: the real
/// election against the Lease fake) sends no patch; once the leader hands the Lease over, it
/// releases the Pod, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_patch_while_not_the_leader() {
    let api = GatesApiServer::start();
    let proxy = FaultProxy::start(&registry::plain().host);
    proxy.set(Fault::Status(503));
    let config = gate_config(&proxy.host, WAIT * 4);
    let (server, leader) = TestServer::start_following(config, api.client()).await;
    let image = format!("{}/fixtures/arm64-oci:v1", proxy.host);
    admit_and_create(&server, &api, "waits", &[image]).await;
    proxy.set(Fault::None);
    // The follower's own watch sees the gated Pod (its oldest-age gauge, every replica) and
    // holds it, with the registry back, for at least 3 s by that gauge: longer than a leader
    // takes to release it (its retry comes after a second) ...
    let deadline = tokio::time::Instant::now() + WAIT;
    while metric(&server, "tolerable_gate_oldest_pod_age_seconds").await < 3.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watch never saw the Pod age"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // ... and in all that time sent no patch at all (the fake logs every PATCH it receives,
    // refused ones too, since the start) and the Pod is still gated.
    assert!(api.patches().is_empty(), "{:?}", api.patches());
    assert!(!released(&api, "waits"));
    assert!(
        !*server.leader.as_ref().unwrap().borrow(),
        "the follower leads"
    );
    leader.shutdown().await;
    assert!(
        api.wait_for(WAIT, |api| released(api, "waits")).await,
        "never released"
    );
    let applied = api.patches().iter().filter(|p| p.3 == 200).count();
    assert_eq!(applied, 1, "released once, by the leader");
}

/// Another controller removes its gate between the controller's read and its patch: the patch's
/// `test` fails (422), the controller reads the Pod again and releases it from what it read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_read_is_read_again_and_the_release_made_from_it() {
    let proxy = FaultProxy::start(&registry::plain().host);
    proxy.set(Fault::Status(503));
    let api = GatesApiServer::start();
    let server =
        TestServer::start_configured(gate_config(&proxy.host, WAIT * 4), Some(api.client())).await;
    let image = format!("{}/fixtures/arm64-oci:v1", proxy.host);
    api.before_next_patch(
        "e2e",
        "raced",
        json!([{"op": "remove", "path": "/spec/schedulingGates/0"}]),
    );
    admit_and_create(&server, &api, "raced", &[image]).await;
    proxy.set(Fault::None);
    assert!(
        api.wait_for(WAIT, |api| released(api, "raced")).await,
        "never released"
    );
    let codes: Vec<u16> = api.patches().iter().map(|p| p.3).collect();
    assert_eq!(
        codes,
        [422, 200],
        "the stale patch refused, the fresh one applied"
    );
    let pod = api.pod("e2e", "raced").unwrap();
    // No gate left: the list is gone, as the real server answers (pod-patch-remove-last-gate).
    assert_eq!(pod["spec"]["schedulingGates"], Value::Null);
    assert_eq!(webhook::arch_tolerations(&pod).len(), 1);
}

/// `tolerable gates list` shows the gated Pods and what they wait for; `gates release --all`
/// releases them unchanged (other gates stay) — what the uninstall order runs first.
#[test]
fn gates_list_and_release_by_hand() {
    let api = GatesApiServer::start();
    let mut waiting = recorded_json("pod-create-gated.request.json");
    waiting["metadata"]["namespace"] = json!("e2e");
    api.create("e2e", waiting).unwrap();
    let mut stuck = recorded_json("pod-create-gated-2.request.json");
    stuck["metadata"]["labels"][GATED_LABEL] = json!(UNRUNNABLE);
    api.create("e2e", stuck).unwrap();
    let kubeconfig = common::kube_fake::kubeconfig(api.port, "admintoken");
    let home = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = common::cli::isolated(home.path(), "1s")
            .args(args)
            .arg("--kubeconfig")
            .arg(kubeconfig.path())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (
            out.status.code(),
            text,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, listed, err) = run(&["gates", "list"]);
    assert_eq!(code, Some(0), "{err}");
    let row = |name: &str| {
        listed
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("{listed}"))
    };
    assert!(
        row("gated-1").contains("waiting") && row("gated-1").contains("127.0.0.1:5000/app:1"),
        "{listed}"
    );
    assert!(row("gated-2").contains(UNRUNNABLE), "{listed}");
    let (code, released, err) = run(&["gates", "release", "--all", "-n", "e2e"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        released.contains("e2e/gated-1: released unchanged"),
        "{released}"
    );
    for name in ["gated-1", "gated-2"] {
        let pod = api.pod("e2e", name).unwrap();
        assert_eq!(
            pod["spec"]["schedulingGates"],
            json!([{"name": OTHER_GATE}]),
            "{name}"
        );
        assert!(
            pod["metadata"]["labels"].get(GATED_LABEL).is_none(),
            "{name}"
        );
        let note = pod["metadata"]["annotations"][DECISION_ANNOTATION]
            .as_str()
            .unwrap();
        assert!(
            note.starts_with("released unchanged: released by hand"),
            "{note}"
        );
    }
    let (code, listed, _) = run(&["gates", "list"]);
    assert_eq!(
        (code, listed.trim()),
        (Some(0), "no Pod is gated by tolerable")
    );
    let (code, again, _) = run(&["gates", "release", "-n", "e2e", "gated-1"]);
    assert_eq!(code, Some(0));
    assert!(
        again.contains("e2e/gated-1: not gated by tolerable"),
        "{again}"
    );
}

/// Gating with no cluster to release the Pods from would hold them forever: `serve` refuses to
/// start, naming the key.
#[test]
fn serve_refuses_to_gate_without_a_cluster() {
    let home = tempfile::tempdir().unwrap();
    let out = common::cli::isolated(home.path(), "1s")
        .env("TOLERABLE_POLICY__ON_LOOKUP_FAILURE", "gate")
        .env("TOLERABLE_SERVER__LISTEN_ADDR", "127.0.0.1:0")
        .arg("serve")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("policy.on_lookup_failure") && err.contains("needs the cluster"),
        "{err}"
    );
}

/// Two replicas that gate, electing their releaser through the Lease on the same API as the
/// Pods (the gates fake serves `lease_api`'s Leases too), as `serve` runs them: exactly one
/// leads; a Pod gated through either is released once (one JSON Patch, no second release that
/// its `test` would refuse); the leader shut down, the other takes the Lease over and releases
/// the next gated Pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_one_releaser_and_the_other_takes_over() {
    let proxy = FaultProxy::start(&registry::plain().host);
    proxy.set(Fault::Status(503));
    let api = GatesApiServer::start();
    let mut replicas = Vec::new();
    for identity in ["replica-a", "replica-b"] {
        let config = gate_config(&proxy.host, WAIT * 4);
        let client = Some(api.client_as(identity));
        let election = webhook::short_election(identity);
        replicas.push(TestServer::start_electing(config, client, election).await);
    }
    let leading = |replicas: &[TestServer]| -> Vec<usize> {
        (0..replicas.len())
            .filter(|&i| *replicas[i].leader.as_ref().unwrap().borrow())
            .collect()
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    while leading(&replicas).len() != 1 {
        assert!(tokio::time::Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let leader = leading(&replicas)[0];
    let image = format!("{}/fixtures/arm64-oci:v1", proxy.host);
    // Gated through the replica that does not lead: the leader releases it.
    admit_and_create(
        &replicas[1 - leader],
        &api,
        "first",
        std::slice::from_ref(&image),
    )
    .await;
    proxy.set(Fault::None);
    assert!(
        api.wait_for(WAIT, |api| released(api, "first")).await,
        "never released"
    );
    let patches_of = |name: &str| -> Vec<u16> {
        api.patches()
            .into_iter()
            .filter(|(_, pod, _, _)| pod == name)
            .map(|(_, _, _, code)| code)
            .collect()
    };
    assert_eq!(
        patches_of("first"),
        vec![200],
        "one release, by one replica"
    );
    assert_eq!(leading(&replicas), vec![leader], "never two leaders");

    // The leader goes (as on SIGTERM: it gives the Lease up); the other takes over.
    replicas[leader].shutdown().await;
    let survivor = &replicas[1 - leader];
    let deadline = tokio::time::Instant::now() + WAIT;
    while !*survivor.leader.as_ref().unwrap().borrow() {
        assert!(tokio::time::Instant::now() < deadline, "no takeover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.set(Fault::Status(503));
    admit_and_create(survivor, &api, "second", std::slice::from_ref(&image)).await;
    proxy.set(Fault::None);
    assert!(
        api.wait_for(WAIT, |api| released(api, "second")).await,
        "not released after the takeover"
    );
    assert_eq!(patches_of("second"), vec![200]);
}
