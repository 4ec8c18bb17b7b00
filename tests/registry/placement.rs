//! Placement by what nodes run, and pinning the decided digest, through the webhook over real
//! HTTPS with the real registry (distribution on 127.0.0.1): images of each shape pushed, a
//! recorded Pod CREATE admitted, the patch applied with `json-patch`.

use crate::common;

use std::time::Duration;

use common::fixtures::Pusher;
use common::registry::{self, Mode};
use common::webhook::{self, admit, patched, recorded, TestServer};
use serde_json::{json, Value};
use tolerable::mutate::{Policy, ARCH_LABEL, DECISION_ANNOTATION};

const TIMEOUT: Duration = Duration::from_secs(10);

/// `(os, architecture, variant)` of one image of an index.
type PlatformParts<'a> = (&'a str, &'a str, Option<&'a str>);

/// The recorded simple Pod CREATE, its one container's image replaced by `image`.
fn pod_create(image: &str) -> Value {
    let mut request = recorded("pod-create-simple.v1.json", &registry::plain().host);
    request["request"]["object"]["spec"]["containers"][0]["image"] = json!(image);
    request
}

fn required_architectures(pod: &Value) -> &Value {
    &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
}

fn annotation(pod: &Value) -> &str {
    pod["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap_or_default()
}

/// Pushes an index of `platforms` as `placement/<repo>:v1` to the plain registry.
async fn pushed(repo: &str, platforms: &[PlatformParts<'_>]) -> (String, String) {
    let host = &registry::plain().host;
    let pusher = Pusher::for_mode(host, Mode::Plain);
    let repo = format!("placement/{repo}");
    let digest = pusher.push_platforms(&repo, "v1", platforms).await;
    (format!("{host}/{repo}:v1"), digest)
}

#[tokio::test]
async fn images_are_placed_on_the_node_architectures_that_run_them() {
    let server = TestServer::start(webhook::policy(), common::settings()).await;
    let cases: &[(&str, &[PlatformParts], &[&str])] = &[
        ("only-386", &[("linux", "386", None)], &["amd64"]),
        (
            "386-and-arm64",
            &[("linux", "386", None), ("linux", "arm64", Some("v8"))],
            &["amd64", "arm64"],
        ),
    ];
    for (repo, platforms, want) in cases {
        let (image, _) = pushed(repo, platforms).await;
        let request = pod_create(&image);
        let (response, _) = admit(&server, &request, TIMEOUT).await;
        assert_eq!(response["allowed"], true, "{response}");
        let pod = patched(&request, &response);
        assert_eq!(required_architectures(&pod), &json!(want), "{repo}");
        let note = annotation(&pod);
        assert!(
            note.contains(&format!("amd64 pulls linux/386 for {image}")),
            "{note}"
        );
        // Decided again on the patched Pod: nothing more.
        let mut again = request.clone();
        again["request"]["object"] = pod;
        let (response, _) = admit(&server, &again, TIMEOUT).await;
        assert!(response["patch"].is_null(), "{response}");
    }
}

#[tokio::test]
async fn an_arm32_only_image_follows_arm64_runs_arm32() {
    let (image, _) = pushed("only-arm-v7", &[("linux", "arm", Some("v7"))]).await;
    let request = pod_create(&image);
    let runs_arm32 = Policy {
        arm64_runs_arm32: true,
        ..webhook::policy()
    };
    let server = TestServer::start(runs_arm32, common::settings()).await;
    let (response, _) = admit(&server, &request, TIMEOUT).await;
    let pod = patched(&request, &response);
    assert_eq!(required_architectures(&pod), &json!(["arm", "arm64"]));
    assert_eq!(pod["spec"]["tolerations"][2]["value"], "arm64");
    assert!(annotation(&pod).contains(&format!("arm64 pulls linux/arm/v7 for {image}")));
}

#[tokio::test]
async fn a_pinned_pod_keeps_the_decided_digest_after_the_tag_moves() {
    let both = [("linux", "amd64", None), ("linux", "arm64", Some("v8"))];
    let (image, decided) = pushed("moving", &both).await;
    let pinning = Policy {
        pin_digests: true,
        ..webhook::policy()
    };
    let server = TestServer::start(pinning, common::settings()).await;
    let request = pod_create(&image);
    let (response, _) = admit(&server, &request, TIMEOUT).await;
    assert_eq!(response["allowed"], true, "{response}");
    let pod = patched(&request, &response);
    let pinned = format!("{image}@{decided}");
    assert_eq!(pod["spec"]["containers"][0]["image"], pinned);
    assert_eq!(required_architectures(&pod), &json!(["amd64", "arm64"]));
    assert!(annotation(&pod).contains(&pinned), "{}", annotation(&pod));

    // The tag moves to an amd64-only build.
    let (_, moved) = pushed("moving", &[("linux", "amd64", None)]).await;
    assert_ne!(moved, decided);
    // The Pod, decided on again (reinvocation, or as the kubelet will pull it), keeps the
    // digest decided at admission and its placement.
    let mut again = request.clone();
    again["request"]["object"] = pod.clone();
    let (response, _) = admit(&server, &again, TIMEOUT).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response["patch"].is_null(), "{response}");
    assert_eq!(pod["spec"]["containers"][0]["image"], pinned);
    assert!(pod["spec"]["tolerations"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["key"] == ARCH_LABEL && t["value"] == "arm64"));
}

/// A recorded DaemonSet AdmissionReview (kube-apiserver v1.36), its template's image replaced.
fn daemon_set_review(name: &str, image: &str) -> Value {
    let mut review = recorded(&format!("admissionreview-v1.36/{name}"), "");
    review["request"]["object"]["spec"]["template"]["spec"]["containers"][0]["image"] =
        json!(image);
    review
}

/// The DaemonSet with the response's patch applied, checked to be a DaemonSet still.
fn patched_daemon_set(review: &Value, response: &Value) -> Value {
    use base64::Engine as _;
    let ops = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().expect("a patch"))
        .unwrap();
    let ops: json_patch::Patch = serde_json::from_slice(&ops).unwrap();
    let mut object = review["request"]["object"].clone();
    json_patch::patch(&mut object, &ops).unwrap();
    let _: k8s_openapi::api::apps::v1::DaemonSet =
        serde_json::from_value(object.clone()).expect("a DaemonSet");
    object
}

#[tokio::test]
async fn a_daemon_sets_template_gets_the_tolerations_and_the_term() {
    let server = TestServer::start(webhook::policy(), common::settings()).await;
    // A multi-arch node agent: the arm64 pools' toleration, beside its own, and kept off the
    // s390x pools (supported, tainted) it cannot run on.
    let both = [("linux", "amd64", None), ("linux", "arm64", Some("v8"))];
    let (agent, _) = pushed("ds-agent", &both).await;
    let review = daemon_set_review("daemonset-create.json", &agent);
    let (response, _) = admit(&server, &review, TIMEOUT).await;
    assert_eq!(response["allowed"], true, "{response}");
    let ds = patched_daemon_set(&review, &response);
    let template = &ds["spec"]["template"];
    let tolerations = template["spec"]["tolerations"].as_array().unwrap();
    assert_eq!(tolerations.len(), 2, "{tolerations:?}");
    assert_eq!(
        tolerations[0]["key"],
        "node-role.kubernetes.io/control-plane"
    );
    assert_eq!(
        tolerations[1],
        json!({"key": ARCH_LABEL, "operator": "Equal", "value": "arm64", "effect": "NoSchedule"})
    );
    assert_eq!(required_architectures(template), &json!(["amd64", "arm64"]));
    assert!(annotation(template).starts_with("linux architectures amd64,arm64;"));
    assert_eq!(ds["metadata"], review["request"]["object"]["metadata"]);

    // `kubectl set image` to an amd64-only build: required onto amd64, no arm64 toleration.
    let (amd64_only, _) = pushed("ds-agent-amd64", &[("linux", "amd64", None)]).await;
    let update = daemon_set_review("daemonset-update-image.json", &amd64_only);
    let (response, _) = admit(&server, &update, TIMEOUT).await;
    let ds = patched_daemon_set(&update, &response);
    let template = &ds["spec"]["template"];
    assert_eq!(required_architectures(template), &json!(["amd64"]));
    assert!(!template["spec"]["tolerations"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["key"] == ARCH_LABEL));
    // Decided again on the patched DaemonSet: nothing more.
    let mut again = update.clone();
    again["request"]["object"] = ds;
    let (response, _) = admit(&server, &again, TIMEOUT).await;
    assert!(response["patch"].is_null(), "{response}");
}

/// `tolerable review` decides the same way: a 386-only image on amd64, pinned to its digest
/// with `pin_digests`, as the patched Pod it prints shows.
#[tokio::test]
async fn review_places_and_pins_as_the_webhook_does() {
    let (image, digest) = pushed("review-386", &[("linux", "386", None)]).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pod.yaml");
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: old\n  namespace: shop\nspec:\n  containers:\n  - name: c0\n    image: {image}\n"
    );
    std::fs::write(&file, yaml).unwrap();
    let out = common::cli::tolerable()
        .args(["review", "--patch"])
        .arg(&file)
        .env("TOLERABLE_POLICY__PIN_DIGESTS", "true")
        .output()
        .unwrap();
    let text = common::cli::succeeded(&out);
    assert!(text.contains("\ndecision: allowed\n"), "{text}");
    assert!(
        text.contains(&format!("amd64 pulls linux/386 for {image}@{digest}")),
        "{text}"
    );
    let patched: Value =
        serde_yaml_ng::from_str(text.split("# Patched Pod\n").nth(1).unwrap()).unwrap();
    assert_eq!(
        patched["spec"]["containers"][0]["image"],
        format!("{image}@{digest}")
    );
    assert_eq!(required_architectures(&patched), &json!(["amd64"]));
}
