//! Image pull secrets from the cluster: the real `kube` client against a thin fake API server
//! serving recorded kube-apiserver responses, and real registries whose private repositories
//! only the recorded pull secrets can open.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use common::kube_api::{FakeApiServer, RegistryHosts};
use common::registry::{self, Mode};
use serde_json::{json, Value};
use tolerable::admission::{Admission, AnsweredReview};
use tolerable::cluster::Cluster;
use tolerable::engine::Sources;

fn fake_api() -> FakeApiServer {
    FakeApiServer::start(RegistryHosts {
        basic: registry::basic().host.clone(),
        token: registry::token().host.clone(),
    })
}

fn admission(cluster: Option<Cluster>) -> Admission {
    let sources = Sources {
        pull_secrets: cluster.map(Arc::new),
        ..Sources::default()
    };
    Admission::new(common::webhook::engine(
        common::webhook::policy(),
        common::settings(),
        sources,
    ))
}

/// The recorded Pod CREATE, moved to namespace team-a, with `image` and extra spec fields.
fn review(image: &str, spec: Value) -> Vec<u8> {
    let mut review =
        common::webhook::recorded("pod-create-simple.v1.json", &registry::plain().host);
    review["request"]["namespace"] = json!("team-a");
    let object = &mut review["request"]["object"];
    object["metadata"]["namespace"] = json!("team-a");
    object["spec"]["containers"][0]["image"] = json!(image);
    for (k, v) in spec.as_object().unwrap() {
        object["spec"][k] = v.clone();
    }
    serde_json::to_vec(&review).unwrap()
}

async fn run(admission: &Admission, body: &[u8]) -> (AnsweredReview, String) {
    let reviewed = admission
        .answer_review(body, Duration::from_secs(8))
        .await
        .unwrap();
    let wire = String::from_utf8(reviewed.out.to_json()).unwrap();
    // Whatever happened, no credential went out in the answer.
    for secret in ["testpass", "dGVzdHVzZXI6dGVzdHBhc3M=", "!!not-base64!!"] {
        assert!(!wire.contains(secret), "{secret} leaked: {wire}");
    }
    (reviewed, wire)
}

fn annotation(reviewed: &AnsweredReview) -> String {
    reviewed.answer.decision.summary().to_owned()
}

#[tokio::test]
async fn a_pods_pull_secret_opens_a_private_image_and_without_it_nothing_changes() {
    let api = fake_api();
    let admission = admission(Some(Cluster::new(api.client("admintoken"))));
    let image = format!("{}/fixtures/arm64-oci:v1", registry::basic().host);

    let (reviewed, _) = run(
        &admission,
        &review(&image, json!({"imagePullSecrets": [{"name": "regcred"}]})),
    )
    .await;
    assert!(
        reviewed.out.response.patch.is_some(),
        "{:?}",
        reviewed.out.response.warnings
    );
    assert!(
        reviewed.out.response.warnings.is_empty(),
        "{:?}",
        reviewed.out.response.warnings
    );
    let summary = annotation(&reviewed);
    assert!(summary.contains("tolerates arm64"), "{summary}");
    assert!(
        summary.contains("credentials from secret team-a/regcred"),
        "{summary}"
    );
    assert!(api
        .requests()
        .contains(&"/api/v1/namespaces/team-a/secrets/regcred".to_owned()));

    // The same Pod without the secret: the registry refuses; a warning, and no patch at all.
    let (reviewed, _) = run(&admission, &review(&image, json!({}))).await;
    assert!(reviewed.out.response.allowed);
    assert!(reviewed.out.response.patch.is_none());
    let warnings = reviewed.out.response.warnings.join("\n");
    assert!(warnings.contains("refused access"), "{warnings}");
}

#[tokio::test]
async fn service_account_pull_secrets_count_too() {
    let api = fake_api();
    let admission = admission(Some(Cluster::new(api.client("admintoken"))));
    let image = format!("{}/fixtures/s390x-docker:v1", registry::basic().host);
    let (reviewed, _) = run(
        &admission,
        &review(&image, json!({"serviceAccountName": "builder"})),
    )
    .await;
    assert!(
        reviewed.out.response.patch.is_some(),
        "{:?}",
        reviewed.out.response.warnings
    );
    assert!(annotation(&reviewed).contains("secret team-a/regcred"));
}

#[tokio::test]
async fn missing_and_malformed_secrets_are_warnings_and_the_next_secret_is_tried() {
    let api = fake_api();
    let admission = admission(Some(Cluster::new(api.client("admintoken"))));
    // A private repository on the token registry; the legacy .dockercfg secret (keyed with a
    // scheme) holds its credentials.
    registry::token();
    common::fixtures::Pusher::for_mode(&registry::token().host, Mode::Token)
        .push("private/pulled", "multiarch-oci", "v1")
        .await;
    let image = format!("{}/private/pulled:v1", registry::token().host);
    // ServiceAccount multi: [legacy, does-not-exist, broken-shape, regcred].
    let (reviewed, _) = run(
        &admission,
        &review(&image, json!({"serviceAccountName": "multi"})),
    )
    .await;
    assert!(
        reviewed.out.response.patch.is_some(),
        "{:?}",
        reviewed.out.response.warnings
    );
    assert!(
        annotation(&reviewed).contains("secret team-a/legacy"),
        "{}",
        annotation(&reviewed)
    );
    let warnings = reviewed.out.response.warnings.join("\n");
    assert!(
        warnings.contains("image pull secret team-a/does-not-exist not found"),
        "{warnings}"
    );
    assert!(
        warnings.contains("secret team-a/broken-shape"),
        "{warnings}"
    );

    // A Pod secret whose credential the registry rejects falls through to the next one.
    let basic = format!("{}/fixtures/amd64-docker:v1", registry::basic().host);
    let (reviewed, _) = run(
        &admission,
        &review(
            &basic,
            json!({"imagePullSecrets": [{"name": "broken-shape"}, {"name": "regcred"}]}),
        ),
    )
    .await;
    assert!(
        reviewed.out.response.patch.is_some(),
        "{:?}",
        reviewed.out.response.warnings
    );
}

#[tokio::test]
async fn forbidden_reads_say_there_is_no_access_in_the_namespace() {
    let api = fake_api();
    let admission = admission(Some(Cluster::new(api.client("nobodytoken"))));
    let image = format!("{}/fixtures/arm64-oci:v1", registry::basic().host);
    let (reviewed, _) = run(
        &admission,
        &review(&image, json!({"imagePullSecrets": [{"name": "regcred"}]})),
    )
    .await;
    assert!(reviewed.out.response.allowed);
    assert!(reviewed.out.response.patch.is_none());
    let warnings = &reviewed.out.response.warnings;
    let no_access: Vec<_> = warnings
        .iter()
        .filter(|w| w.starts_with("no access to pull secrets in team-a (RBAC"))
        .collect();
    assert_eq!(no_access.len(), 1, "said once: {warnings:?}");
    assert!(
        !warnings.join("\n").contains("may not read"),
        "not once per secret: {warnings:?}"
    );
}

/// kustomize/components/namespaced-pull-secrets: RoleBindings in the listed namespaces only.
/// Elsewhere, a warning and a metric name the namespace.
#[tokio::test]
async fn with_access_in_some_namespaces_the_others_are_named_and_counted() {
    let api = fake_api();
    let mut config = tolerable::config::Config::load(None, Vec::new()).unwrap();
    config.policy = common::webhook::policy();
    config.resolver = common::settings();
    config.read_pull_secrets = true;
    config.watch_nodes = false;
    let server =
        common::webhook::TestServer::start_configured(config, Some(api.client("teamatoken"))).await;
    let image = format!("{}/fixtures/arm64-oci:v1", registry::basic().host);
    let body = review(&image, json!({"imagePullSecrets": [{"name": "regcred"}]}));
    let mut request: Value = serde_json::from_slice(&body).unwrap();
    let timeout = Duration::from_secs(10);
    let (response, _) = common::webhook::admit(&server, &request, timeout).await;
    assert!(response["patch"].is_string(), "{response}");
    assert!(
        common::webhook::warnings(&response).is_empty(),
        "{response}"
    );

    request["request"]["namespace"] = json!("team-b");
    request["request"]["object"]["metadata"]["namespace"] = json!("team-b");
    for _ in 0..2 {
        let (response, _) = common::webhook::admit(&server, &request, timeout).await;
        assert!(response["patch"].is_null(), "{response}");
        let warnings = common::webhook::warnings(&response);
        assert!(
            warnings
                .iter()
                .any(|w| w.starts_with("no access to pull secrets in team-b (RBAC")),
            "{warnings:?}"
        );
    }
    let metrics = common::webhook::metrics_text(&server).await;
    assert_eq!(
        common::webhook::metric_value(
            &metrics,
            "tolerable_pull_secrets_forbidden_total{namespace=\"team-b\"}"
        ),
        Some(2.0),
        "{metrics}"
    );
    assert!(!metrics.contains("namespace=\"team-a\""), "{metrics}");
}

#[tokio::test]
async fn reads_are_cached_and_the_feature_can_be_off() {
    let api = fake_api();
    let admission_on = admission(Some(Cluster::new(api.client("admintoken"))));
    let image = format!("{}/fixtures/multiarch-docker:v1", registry::basic().host);
    let body = review(&image, json!({"imagePullSecrets": [{"name": "regcred"}]}));
    run(&admission_on, &body).await;
    let after_first = api.requests().len();
    assert_eq!(after_first, 2, "{:?}", api.requests()); // the ServiceAccount and the Secret
    for _ in 0..5 {
        run(&admission_on, &body).await;
    }
    assert_eq!(
        api.requests().len(),
        after_first,
        "the API server was asked again"
    );

    // read_pull_secrets = false: no cluster at all; the private image is not opened.
    let (reviewed, _) = run(&admission(None), &body).await;
    assert!(reviewed.out.response.patch.is_none());
    assert!(reviewed
        .out
        .response
        .warnings
        .join("\n")
        .contains("refused access"));
}

/// The fake serves the recorded Secret through the API, changing only the registry host, and
/// the product reads it: the recorded credential, as served, opens the private image.
#[tokio::test]
async fn recorded_secrets_are_what_the_fake_serves() {
    let recorded: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/kube-api/secret-regcred-get.body.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let engine = base64::engine::general_purpose::STANDARD;
    let decode = |data: &str| String::from_utf8(engine.decode(data).unwrap()).unwrap();
    let recorded_config = decode(recorded["data"][".dockerconfigjson"].as_str().unwrap());
    let config: Value = serde_json::from_str(&recorded_config).unwrap();
    assert_eq!(config["auths"]["127.0.0.1:25001"]["username"], "testuser");

    // Read back as the product reads it: a k8s-openapi Secret through kube.
    let api = fake_api();
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(api.client("admintoken"), "team-a");
    let served = secrets.get("regcred").await.unwrap();
    assert_eq!(served.type_.as_deref(), recorded["type"].as_str());
    assert_eq!(
        serde_json::to_value(&served.metadata).unwrap(),
        recorded["metadata"]
    );
    let data = served.data.unwrap();
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        [".dockerconfigjson"],
        "{data:?}"
    );
    let served_config = String::from_utf8(data[".dockerconfigjson"].0.clone()).unwrap();
    assert_eq!(
        served_config,
        recorded_config
            .replace("127.0.0.1:25001", &registry::basic().host)
            .replace("127.0.0.1:25444", &registry::token().host)
    );

    // The product, reading that Secret for a Pod that names it, opens the private image.
    let admission_on = admission(Some(Cluster::new(api.client("admintoken"))));
    let image = format!("{}/fixtures/multiarch-docker:v1", registry::basic().host);
    let body = review(&image, json!({"imagePullSecrets": [{"name": "regcred"}]}));
    let (reviewed, wire) = run(&admission_on, &body).await;
    assert!(reviewed.out.response.patch.is_some(), "{wire}");
    assert!(
        api.requests()
            .iter()
            .any(|r| r == "/api/v1/namespaces/team-a/secrets/regcred"),
        "{:?}",
        api.requests()
    );
}
