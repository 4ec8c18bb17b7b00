//! The webhook over real HTTPS on 127.0.0.1, with the real registry, fed AdmissionReviews
//! recorded from a real kube-apiserver. Every returned patch is applied with `json-patch`.

use crate::common;

use std::io::Write as _;
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::registry;
use common::webhook::{self, client, recorded, TestServer};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};
use tolerable::mutate::{ARCH_LABEL, DECISION_ANNOTATION};

async fn post(server: &TestServer, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let response = client()
        .post(server.url(path))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.bytes().await.unwrap();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// Applies the response's patch to the request's object; `None` when there is no patch.
fn apply(request: &Value, response: &Value) -> Option<Value> {
    let patch = response["response"]["patch"].as_str()?;
    assert_eq!(response["response"]["patchType"], "JSONPatch");
    let ops: Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(patch)
            .unwrap(),
    )
    .unwrap();
    let mut object = request["request"]["object"].clone();
    json_patch::patch(
        &mut object,
        &serde_json::from_value::<json_patch::Patch>(ops).unwrap(),
    )
    .unwrap();
    let _: Pod = serde_json::from_value(object.clone()).expect("patched object is a Pod");
    Some(object)
}

fn arch_toleration(arch: &str) -> Value {
    json!({"key": ARCH_LABEL, "operator": "Equal", "value": arch, "effect": "NoSchedule"})
}

async fn server() -> TestServer {
    TestServer::start(webhook::policy(), common::settings()).await
}

#[tokio::test]
async fn recorded_simple_create_gets_tolerations_affinity_and_no_second_patch() {
    let server = server().await;
    let request = recorded("pod-create-simple.v1.json", &registry::plain().host);
    let (status, response) = post(&server, "/mutate?timeout=10s", request.to_string()).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(response["kind"], "AdmissionReview");
    assert_eq!(response["response"]["uid"], request["request"]["uid"]);
    assert_eq!(response["response"]["allowed"], true);
    let patched = apply(&request, &response).expect("a patch");
    // The two DefaultTolerationSeconds tolerations stay; arm64 is appended.
    let tolerations = patched["spec"]["tolerations"].as_array().unwrap();
    assert_eq!(tolerations.len(), 3);
    assert_eq!(tolerations[2], arch_toleration("arm64"));
    assert_eq!(
        patched["spec"]["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
        json!([{"matchExpressions": [{"key": ARCH_LABEL, "operator": "In", "values": ["arm64"]}]}])
    );
    let note = patched["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(note.contains("tolerates arm64"), "{note}");

    // Reinvocation (reinvocationPolicy: IfNeeded) with the patched Pod: nothing more to do.
    let mut again = request.clone();
    again["request"]["object"] = patched;
    let (status, response) = post(&server, "/mutate?timeout=10s", again.to_string()).await;
    assert_eq!(status, 200);
    assert_eq!(response["response"]["allowed"], true);
    assert!(response["response"].get("patch").is_none(), "{response}");
    assert!(
        response["response"].get("patchType").is_none(),
        "{response}"
    );
}

#[tokio::test]
async fn dry_run_gets_the_same_answer() {
    let server = server().await;
    let request = recorded("pod-create-dryrun.v1.json", &registry::plain().host);
    assert_eq!(request["request"]["dryRun"], true);
    let (_, dry) = post(&server, "/mutate", request.to_string()).await;
    let mut wet = request.clone();
    wet["request"]["dryRun"] = json!(false);
    let (_, real) = post(&server, "/mutate", wet.to_string()).await;
    assert_eq!(dry["response"]["patch"], real["response"]["patch"]);
    let patched = apply(&request, &dry).unwrap();
    // windows-mixed on a Linux Pod: amd64 only, an untainted pool: no toleration, pinned.
    assert_eq!(patched["spec"]["tolerations"].as_array().unwrap().len(), 2);
    assert_eq!(
        patched["spec"]["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            ["matchExpressions"][0]["values"],
        json!(["amd64"])
    );
}

#[tokio::test]
async fn recorded_init_containers_with_no_common_architecture_are_denied_naming_each_image() {
    let registry = registry::plain();
    let digest = common::digest_of(&format!("{}/fixtures/multiarch-oci:v1", registry.host)).await;
    let text = recorded(
        "pod-create-generatename-initcontainers-digest-affinity.v1.json",
        &registry.host,
    )
    .to_string()
    .replace(
        "sha256:f692f4ce527a4af383ffe3778b515679f8110a1d7642d0e6976d38c56796a4b9",
        &digest,
    );
    let server = server().await;
    let (status, response) = post(&server, "/mutate", text).await;
    assert_eq!(status, 200);
    assert_eq!(response["response"]["allowed"], false, "{response}");
    let message = response["response"]["status"]["message"].as_str().unwrap();
    assert_eq!(response["response"]["status"]["code"], 403);
    for image in [
        "fixtures/s390x-docker:v1 (linux/s390x)",
        "fixtures/multiarch-docker:v1 (",
        &digest,
    ] {
        assert!(message.contains(image), "{image} missing from: {message}");
    }
    assert!(response["response"].get("patch").is_none());
}

#[tokio::test]
async fn existing_required_affinity_is_narrowed_not_widened() {
    let registry = registry::plain();
    let server = server().await;
    let mut request = recorded(
        "pod-create-generatename-initcontainers-digest-affinity.v1.json",
        &registry.host,
    );
    // Keep the recorded affinity and tolerations, with images that do share architectures.
    let spec = &mut request["request"]["object"]["spec"];
    spec["initContainers"][0]["image"] = json!(format!("{}/fixtures/arm64-oci:v1", registry.host));
    spec["containers"][0]["image"] = json!(format!("{}/fixtures/multiarch-oci:v1", registry.host));
    spec["containers"][1]["image"] =
        json!(format!("{}/fixtures/multiarch-docker:v1", registry.host));
    let (_, response) = post(&server, "/mutate", request.to_string()).await;
    let patched = apply(&request, &response).unwrap();
    let terms = &patched["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    assert_eq!(
        terms,
        &json!([{"matchExpressions": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]},
            {"key": ARCH_LABEL, "operator": "In", "values": ["arm64"]},
        ]}])
    );
    assert_eq!(patched["spec"]["tolerations"][2], arch_toleration("arm64"));
}

/// Image indexes nest at most `MAX_INDEX_DEPTH` deep, on a real registry: one level more is
/// refused by the depth check (allowed unchanged, with the reason), as deep as allowed is read.
#[tokio::test]
async fn an_index_nested_too_deep_reaches_the_depth_limit() {
    use tolerable::registry::MAX_INDEX_DEPTH;
    let server = server().await;
    let host = &registry::plain().host;
    let pusher = common::fixtures::Pusher::for_mode(host, registry::Mode::Plain);
    pusher
        .push_nested("nesting", "deepest", MAX_INDEX_DEPTH)
        .await;
    pusher
        .push_nested("nesting", "too-deep", MAX_INDEX_DEPTH + 1)
        .await;
    let review = |tag: &str| {
        let mut request = recorded("pod-create-simple.v1.json", host);
        request["request"]["object"]["spec"]["containers"][0]["image"] =
            json!(format!("{host}/nesting:{tag}"));
        request
    };

    let deepest = review("deepest");
    let (status, response) = post(&server, "/mutate", deepest.to_string()).await;
    assert_eq!(status, 200);
    let patched = apply(&deepest, &response).expect("the deepest allowed index is read");
    assert!(
        patched["spec"]["tolerations"]
            .as_array()
            .unwrap()
            .contains(&arch_toleration("arm64")),
        "{patched}"
    );

    let too_deep = review("too-deep");
    let (status, response) = post(&server, "/mutate", too_deep.to_string()).await;
    assert_eq!(status, 200);
    assert_eq!(response["response"]["allowed"], true, "{response}");
    let warnings = response["response"]["warnings"].to_string();
    assert!(
        warnings.contains("nesting:too-deep")
            && warnings.contains(&format!(
                "image indexes nested deeper than {MAX_INDEX_DEPTH}"
            )),
        "{warnings}"
    );
    assert!(apply(&too_deep, &response).is_none(), "{response}");
}

#[tokio::test]
async fn unknown_image_is_allowed_unchanged_with_a_warning() {
    let server = server().await;
    let mut request = recorded("pod-create-simple.v1.json", &registry::plain().host);
    request["request"]["object"]["spec"]["containers"][0]["image"] = json!(format!(
        "{}/fixtures/nothing-here:v1",
        registry::plain().host
    ));
    let (status, response) = post(&server, "/mutate", request.to_string()).await;
    assert_eq!(status, 200);
    assert_eq!(response["response"]["allowed"], true);
    let warnings = response["response"]["warnings"].as_array().unwrap();
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .contains("nothing-here:v1: not found"),
        "{warnings:?}"
    );
    // Left exactly as it came: no patch at all.
    assert!(apply(&request, &response).is_none(), "{response}");
}

/// The deadline a warning says a lookup was cut off at ("did not finish within 7599ms").
fn reported_deadline(warning: &str) -> Duration {
    let after = warning
        .split("did not finish within ")
        .nth(1)
        .unwrap_or_else(|| panic!("no deadline in {warning}"));
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    let value: u64 = digits.parse().unwrap();
    match &after[digits.len()..] {
        unit if unit.starts_with("ms") => Duration::from_millis(value),
        unit if unit.starts_with('s') => Duration::from_secs(value),
        other => panic!("unit of {other}"),
    }
}

/// A hung registry and an API server that waits 10 s (`?timeout=10s`): the lookup is cut off at
/// the deadline the server derived from that timeout — as its warning reports, within the
/// admission's budget (four fifths of it, the rest left to answer), not the 20 s lookup and
/// read timeouts configured here — and the Pod is answered, allowed. Checked against what the
/// server says it applied, not against this machine's speed.
#[tokio::test]
async fn a_hung_registry_is_cut_off_at_the_deadline_the_api_servers_timeout_leaves() {
    let hung = common::fake::hung_server();
    let mut settings = common::settings();
    settings.transport.insecure_registries.push(hung.clone());
    settings.lookup_timeout = Duration::from_secs(20);
    settings.transport.read_timeout = Duration::from_secs(20);
    let server = TestServer::start(webhook::policy(), settings).await;
    let mut request = recorded("pod-create-simple.v1.json", &registry::plain().host);
    request["request"]["object"]["spec"]["containers"][0]["image"] =
        json!(format!("{hung}/app:v1"));
    let api_server_timeout = Duration::from_secs(10);
    let started = Instant::now();
    let (status, response) = post(&server, "/mutate?timeout=10s", request.to_string()).await;
    let elapsed = started.elapsed();
    assert_eq!(status, 200);
    assert_eq!(response["response"]["allowed"], true);
    let warning = response["response"]["warnings"][0].as_str().unwrap();
    let applied = reported_deadline(warning);
    assert!(
        applied <= api_server_timeout * 4 / 5,
        "cut off at {applied:?}, not within the admission's budget: {warning}"
    );
    // It waited that long: the deadline, not an early failure, ended the lookup.
    assert!(elapsed >= applied, "answered after {elapsed:?}: {warning}");
}

#[tokio::test]
async fn only_pod_create_is_mutated() {
    let server = server().await;
    let base = recorded("pod-create-simple.v1.json", &registry::plain().host);
    let mut update = base.clone();
    update["request"]["operation"] = json!("UPDATE");
    let mut subresource = base.clone();
    subresource["request"]["subResource"] = json!("ephemeralcontainers");
    let mut deployment = base.clone();
    deployment["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    for request in [update, subresource, deployment] {
        let (status, response) = post(&server, "/mutate", request.to_string()).await;
        assert_eq!(status, 200);
        assert_eq!(response["response"]["allowed"], true);
        assert_eq!(response["response"]["uid"], base["request"]["uid"]);
        assert!(response["response"].get("patch").is_none(), "{response}");
    }
}

#[tokio::test]
async fn bad_input_gets_a_clear_answer_never_a_panic() {
    let server = server().await;
    let good = recorded("pod-create-simple.v1.json", &registry::plain().host);

    for (body, reason) in [
        ("this is not json".to_owned(), "not JSON"),
        ("{\"kind\": \"AdmissionReview\", \"apiVersion\": \"admission.k8s.io/v1\"}".to_owned(), "no request"),
        (json!({"kind": "Pod", "apiVersion": "v1", "request": {}}).to_string(), "not an AdmissionReview"),
        (json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": 5}}).to_string(), "not an AdmissionReview"),
        ("[1,2,3]".to_owned(), "not an AdmissionReview"),
        ("".to_owned(), "not JSON"),
    ] {
        let (status, response) = post(&server, "/mutate", body.clone()).await;
        assert_eq!(status, 400, "{body}");
        assert!(response["error"].as_str().unwrap().contains(reason), "{body}: {response}");
    }

    // The API server needs an AdmissionReview back for these: allowed, unchanged, with a reason.
    let mut no_object = good.clone();
    no_object["request"]
        .as_object_mut()
        .unwrap()
        .remove("object");
    let mut no_image = good.clone();
    no_image["request"]["object"]["spec"]["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("image");
    let mut not_a_pod = good.clone();
    not_a_pod["request"]["object"]["spec"] = json!("nonsense");
    for (request, reason) in [
        (no_object, "no object"),
        (no_image, "has no image"),
        (not_a_pod, "not a valid Pod"),
    ] {
        let (status, response) = post(&server, "/mutate", request.to_string()).await;
        assert_eq!(status, 200);
        assert_eq!(response["response"]["allowed"], true);
        assert!(response["response"].get("patch").is_none());
        let warning = response["response"]["warnings"][0].as_str().unwrap();
        assert!(warning.contains(reason), "{warning}");
    }

    // Oversized: refused before it is read.
    let huge = vec![b' '; tolerable::server::MAX_BODY_BYTES + 1];
    let (status, response) = post(&server, "/mutate", huge).await;
    assert_eq!(status, 413, "{response}");

    // Routing.
    let c = client();
    assert_eq!(
        c.get(server.url("/mutate")).send().await.unwrap().status(),
        405
    );
    assert_eq!(
        c.get(server.url("/nope")).send().await.unwrap().status(),
        404
    );
}

#[tokio::test]
async fn gzip_bodies_are_accepted() {
    let server = server().await;
    let request = recorded("pod-create-simple.v1.json", &registry::plain().host);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(request.to_string().as_bytes()).unwrap();
    let body = gz.finish().unwrap();
    let c = client();
    let response = c
        .post(server.url("/mutate"))
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let response: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert!(apply(&request, &response).is_some());

    let bad = c
        .post(server.url("/mutate"))
        .header("content-encoding", "gzip")
        .body("not gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let unknown = c
        .post(server.url("/mutate"))
        .header("content-encoding", "br")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 415);
}

#[tokio::test]
async fn health_readiness_metrics_and_h2() {
    let server = server().await;
    let c = client();
    assert_eq!(
        c.get(server.url("/healthz")).send().await.unwrap().status(),
        200
    );
    assert_eq!(
        c.get(server.url("/readyz")).send().await.unwrap().status(),
        200
    );

    let request = recorded("pod-create-simple.v1.json", &registry::plain().host);
    for _ in 0..3 {
        post(&server, "/mutate", request.to_string()).await;
    }
    post(&server, "/mutate", "garbage").await;
    let metrics = webhook::metrics_text(&server).await;
    for (series, value) in [
        ("tolerable_admissions_total{outcome=\"decided\"}", 3.0),
        ("tolerable_admissions_total{outcome=\"bad_request\"}", 1.0),
        (
            "tolerable_image_lookup_duration_seconds_count{result=\"ok\"}",
            3.0,
        ),
        ("tolerable_cache_lookups_total{result=\"hit\"}", 2.0),
        ("tolerable_cache_lookups_total{result=\"miss\"}", 1.0),
        // The tag's answer, and the same answer kept under its digest.
        ("tolerable_cache_entries", 2.0),
    ] {
        assert_eq!(
            webhook::metric_value(&metrics, series),
            Some(value),
            "{series}:\n{metrics}"
        );
    }
    let registry_gets = format!(
        "tolerable_registry_requests_total{{registry=\"{}\",method=\"GET\",status=\"200\"}}",
        registry::plain().host
    );
    assert!(
        webhook::metric_value(&metrics, &registry_gets).is_some_and(|gets| gets >= 1.0),
        "{registry_gets}:\n{metrics}"
    );

    // h2 through ALPN.
    let h2 = webhook::client_builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let response = h2.get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    assert_eq!(response.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_requests_in_flight() {
    let (hung, reached) = common::fake::hung_server_counting();
    let mut settings = common::settings();
    settings.transport.insecure_registries.push(hung.clone());
    settings.lookup_timeout = Duration::from_secs(20);
    let mut server = TestServer::start(webhook::policy(), settings).await;
    let mut request = recorded("pod-create-simple.v1.json", &registry::plain().host);
    request["request"]["object"]["spec"]["containers"][0]["image"] =
        json!(format!("{hung}/slow:v1"));
    // In flight for ~4 s (the lookup budget of a 5 s timeout): seconds of margin for the
    // shutdown to begin while it is, well inside the 20 s shutdown grace.
    let url = server.url("/mutate?timeout=5s");
    let in_flight = tokio::spawn(async move {
        client()
            .post(url)
            .header("content-type", "application/json")
            .body(request.to_string())
            .send()
            .await
    });
    // In flight once its lookup has reached the registry: wait for that, not for a sleep.
    common::until("the lookup reached the hung registry", || {
        reached.load(std::sync::atomic::Ordering::SeqCst) > 0
    })
    .await;
    assert!(!in_flight.is_finished(), "answered before shutdown began");
    server.begin_shutdown();
    // The server reports not ready once it has stopped accepting (then drops its listener).
    common::until("the server reported not ready", || {
        !server
            .state
            .ready
            .load(std::sync::atomic::Ordering::Relaxed)
    })
    .await;
    // New connections are refused once shutdown has begun.
    let refused = client().get(server.url("/healthz")).send().await;
    assert!(
        refused.is_err(),
        "accepted a new connection during shutdown"
    );
    let response = in_flight
        .await
        .unwrap()
        .expect("the in-flight request was answered");
    assert_eq!(response.status(), 200);
    let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(body["response"]["allowed"], true);
    server.shutdown().await;
}

/// `enforce = false` (the first roll-out): the Pod gets only the decision annotation saying what
/// tolerable would have added, and the metric counts it; the config's environment variable
/// turns it off as docs/install.md says.
#[tokio::test]
async fn report_only_annotates_and_counts_without_changing_the_pod() {
    let overridden = tolerable::config::Config::load(
        None,
        vec![("TOLERABLE_POLICY__ENFORCE".to_owned(), "false".to_owned())],
    )
    .unwrap();
    assert!(!overridden.policy.enforce);
    let policy = tolerable::mutate::Policy {
        enforce: false,
        ..webhook::policy()
    };
    let server = TestServer::start(policy, common::settings()).await;
    let request = recorded("pod-create-simple.v1.json", &registry::plain().host);
    let (status, response) = post(&server, "/mutate?timeout=10s", request.to_string()).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["response"]["allowed"], true);
    let patched = apply(&request, &response).expect("the annotation");
    assert_eq!(
        patched["spec"], request["request"]["object"]["spec"],
        "the spec is untouched"
    );
    let note = patched["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(
        note.starts_with("report only (enforce = false): would add toleration kubernetes.io/arch=arm64:NoSchedule"),
        "{note}"
    );
    let metrics = webhook::metrics_text(&server).await;
    assert_eq!(
        webhook::metric_value(
            &metrics,
            "tolerable_admissions_not_enforced_total{would=\"change\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        webhook::metric_value(
            &metrics,
            "tolerable_admissions_not_enforced_total{would=\"deny\"}"
        ),
        Some(0.0),
        "{metrics}"
    );
}

/// `[policy] match_node_labels` on a real AdmissionReview: the Pod's `team` label is ANDed into
/// its recorded required term beside the architecture; its own `topology.kubernetes.io/zone`
/// constraint, which contradicts its zone label, is kept with a warning; the patched Pod gets
/// no second patch.
#[tokio::test]
async fn match_node_labels_are_anded_into_the_recorded_term() {
    let configured = tolerable::config::Config::load(
        None,
        vec![(
            "TOLERABLE_POLICY__MATCH_NODE_LABELS".to_owned(),
            "team, topology.kubernetes.io/zone".to_owned(),
        )],
    )
    .unwrap();
    let policy = tolerable::mutate::Policy {
        match_node_labels: configured.policy.match_node_labels.clone(),
        ..webhook::policy()
    };
    let server = TestServer::start(policy, common::settings()).await;
    let registry = registry::plain();
    let mut request = recorded(
        "pod-create-generatename-initcontainers-digest-affinity.v1.json",
        &registry.host,
    );
    let object = &mut request["request"]["object"];
    object["metadata"]["labels"] = json!({"team": "ml", "topology.kubernetes.io/zone": "z9"});
    let spec = &mut object["spec"];
    spec["initContainers"][0]["image"] = json!(format!("{}/fixtures/arm64-oci:v1", registry.host));
    spec["containers"][0]["image"] = json!(format!("{}/fixtures/multiarch-oci:v1", registry.host));
    spec["containers"][1]["image"] =
        json!(format!("{}/fixtures/multiarch-docker:v1", registry.host));
    let (status, response) = post(&server, "/mutate", request.to_string()).await;
    assert_eq!(status, 200, "{response}");
    let patched = apply(&request, &response).unwrap();
    assert_eq!(
        patched["spec"]["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
        json!([{"matchExpressions": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]},
            {"key": ARCH_LABEL, "operator": "In", "values": ["arm64"]},
            {"key": "team", "operator": "In", "values": ["ml"]},
        ]}])
    );
    let warnings = response["response"]["warnings"].to_string();
    assert!(
        warnings.contains("topology.kubernetes.io/zone=z9") && warnings.contains("In (z1)"),
        "{response}"
    );
    let note = patched["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap();
    assert!(
        note.contains("nodes labelled like the Pod: team=ml"),
        "{note}"
    );

    let mut again = request.clone();
    again["request"]["object"] = patched;
    let (_, response) = post(&server, "/mutate", again.to_string()).await;
    assert_eq!(response["response"]["allowed"], true);
    assert!(response["response"].get("patch").is_none(), "{response}");
}
