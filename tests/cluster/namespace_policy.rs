//! Per-namespace policy end to end: the webhook as `serve` builds it, its namespace watch (the
//! real `kube` client and kube-runtime watcher, metadata only) against the thin fake API server
//! serving the Namespace list and watch recorded from a real kube-apiserver, admissions through
//! HTTPS with images from a real registry. Every wait is on the watch's published state.

use crate::common;

use common::namespaces_api::NamespaceApi;
use common::registry;
use common::until;
use common::webhook::{self, TestServer};
use serde_json::{json, Value};
use tolerable::mutate::{DECISION_ANNOTATION, ENFORCE_KEY, PREFERRED_KEY};

/// The webhook with namespace policy read from `kube` (no node watch, no pull secrets).
async fn server(kube: kube::Client) -> TestServer {
    let mut config = tolerable::config::Config::load(None, Vec::new()).unwrap();
    config.policy = webhook::policy();
    config.resolver = common::settings();
    config.read_pull_secrets = false;
    config.watch_nodes = false;
    assert!(config.namespace_policy, "on by default");
    TestServer::start_configured(config, Some(kube)).await
}

/// A Pod (the recorded AdmissionReview's) of a multi-architecture image (amd64, arm/v7,
/// arm64), created in `namespace`, with `labels` of its own.
fn pod_in(namespace: &str, labels: Value) -> Value {
    let host = &registry::plain().host;
    let mut review = webhook::recorded("pod-create-simple.v1.json", host);
    let request = &mut review["request"];
    request["namespace"] = json!(namespace);
    request["object"]["metadata"]["namespace"] = json!(namespace);
    request["object"]["spec"]["containers"][0]["image"] =
        json!(format!("{host}/fixtures/multiarch-oci:v1"));
    let own = request["object"]["metadata"]["labels"]
        .as_object_mut()
        .unwrap();
    own.extend(labels.as_object().unwrap().clone());
    review
}

/// What the webhook did to a Pod: the patched Pod (`None`: no patch at all) and its warnings.
async fn admitted(server: &TestServer, review: &Value) -> (Option<Value>, Vec<String>) {
    let (response, _) = webhook::admit(server, review, std::time::Duration::from_secs(10)).await;
    assert_eq!(response["allowed"], true, "{response:#}");
    let warnings = webhook::warnings(&response);
    let patched = response
        .get("patch")
        .map(|_| webhook::patched(review, &response));
    (patched, warnings)
}

fn annotation(pod: &Value) -> &str {
    pod["metadata"]["annotations"][DECISION_ANNOTATION]
        .as_str()
        .unwrap_or_default()
}

fn has_tolerations(pod: &Value) -> bool {
    pod["spec"]["tolerations"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["key"] == tolerable::mutate::ARCH_LABEL))
}

/// The preferred architecture terms' (architecture, weight), in order.
fn preferred(pod: &Value) -> Vec<(String, i64)> {
    pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            let values = &t["preference"]["matchExpressions"][0]["values"];
            (
                values[0].as_str().unwrap().to_owned(),
                t["weight"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// Admissions let through under report only that would have been changed.
async fn would_change(server: &TestServer) -> Option<f64> {
    let metrics = webhook::metrics_text(server).await;
    let series = r#"tolerable_admissions_not_enforced_total{would="change"}"#;
    webhook::metric_value(&metrics, series)
}

/// batch: the Namespace's weighted preference; the Pod's own preference wins over it.
async fn batch_prefers_as_annotated_unless_the_pod_says(server: &TestServer) {
    let pod = admitted(server, &pod_in("batch", json!({})))
        .await
        .0
        .unwrap();
    assert_eq!(
        preferred(&pod),
        [("arm64".into(), 80), ("amd64".into(), 20)]
    );
    assert!(annotation(&pod).contains(&format!("(namespace batch's {PREFERRED_KEY})")));
    let own = pod_in("batch", json!({PREFERRED_KEY: "amd64"}));
    let pod = admitted(server, &own).await.0.unwrap();
    assert_eq!(preferred(&pod), [("amd64".into(), 50)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recorded_namespaces_decide_with_precedence_pod_namespace_config() {
    let api = NamespaceApi::start();
    let server = server(api.client("admintoken")).await;
    let namespaces = server.namespaces.clone().expect("the namespace watch runs");
    until("the namespace list", || namespaces.is_settled()).await;
    assert!(namespaces.is_available());
    assert_eq!(
        namespaces.len(),
        3,
        "team-a, batch, team-b; not the other four"
    );
    let ready = webhook::client()
        .get(server.url("/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);

    // team-a (enforce=false): report only, the namespace named; nothing else changes.
    let (pod, _) = admitted(&server, &pod_in("team-a", json!({}))).await;
    let pod = pod.expect("the annotation");
    assert!(!has_tolerations(&pod));
    assert!(
        annotation(&pod).starts_with(&format!(
            "report only (namespace team-a's {ENFORCE_KEY}): would add toleration kubernetes.io/arch=arm64:NoSchedule"
        )),
        "{}",
        annotation(&pod)
    );
    assert_eq!(
        would_change(&server).await,
        Some(1.0),
        "counted as report only"
    );
    // The Pod's own label wins over its Namespace.
    let own = pod_in("team-a", json!({ENFORCE_KEY: "true"}));
    let pod = admitted(&server, &own).await.0.unwrap();
    assert!(has_tolerations(&pod));
    assert!(
        annotation(&pod).ends_with(&format!("; the Pod's {ENFORCE_KEY}")),
        "{}",
        annotation(&pod)
    );

    batch_prefers_as_annotated_unless_the_pod_says(&server).await;

    // team-b (skip=true): left alone, saying so; default: the config (enforced, no preference).
    let (pod, _) = admitted(&server, &pod_in("team-b", json!({}))).await;
    assert_eq!(pod, None, "a skipped Pod is left exactly as it came");
    let pod = admitted(&server, &pod_in("default", json!({})))
        .await
        .0
        .unwrap();
    assert!(has_tolerations(&pod));
    assert!(preferred(&pod).is_empty());
    assert!(
        !annotation(&pod).contains(ENFORCE_KEY),
        "{}",
        annotation(&pod)
    );

    // Asked as kube-runtime's metadata watcher asks: metadata only, list and watch.
    let requests = api.requests();
    assert!(
        requests
            .iter()
            .all(|(_, accept)| accept.contains("as=PartialObjectMetadata")),
        "{requests:#?}"
    );
    until("the watch", || api.counts().1 == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_in_the_watch_decides_the_next_admission_without_a_restart() {
    let api = NamespaceApi::start();
    let server = server(api.client("admintoken")).await;
    let namespaces = server.namespaces.clone().unwrap();
    until("the namespace list", || namespaces.is_settled()).await;
    until("the watch", || api.counts().1 == 1).await;
    let updates = namespaces.updates();
    assert_eq!(updates, 1, "the first list");

    // MODIFIED: team-a relabelled enforce=true.
    api.release(1);
    until("team-a relabelled", || namespaces.updates() == updates + 1).await;
    let pod = admitted(&server, &pod_in("team-a", json!({})))
        .await
        .0
        .unwrap();
    assert!(has_tolerations(&pod), "enforced now");
    assert!(
        annotation(&pod).ends_with(&format!("; namespace team-a's {ENFORCE_KEY}")),
        "{}",
        annotation(&pod)
    );

    // MODIFIED: batch's annotation removed: back to the config (no preference).
    api.release(1);
    until("batch's annotation removed", || {
        namespaces.updates() == updates + 2
    })
    .await;
    let pod = admitted(&server, &pod_in("batch", json!({})))
        .await
        .0
        .unwrap();
    assert!(preferred(&pod).is_empty(), "{pod:#}");
    assert_eq!(namespaces.len(), 2, "batch says nothing now: not kept");

    // ADDED new-team (no policy: nothing to keep), the bookmark, then a Namespace added with a
    // policy of its own.
    api.release(2);
    api.add_namespace(
        "ml",
        json!({ENFORCE_KEY: "false"}),
        json!({PREFERRED_KEY: "arm64"}),
        217,
    );
    until("ml added", || namespaces.updates() == updates + 3).await;
    assert!(namespaces.get("new-team").is_none());
    let pod = admitted(&server, &pod_in("new-team", json!({})))
        .await
        .0
        .unwrap();
    assert!(has_tolerations(&pod), "the config");
    let pod = admitted(&server, &pod_in("ml", json!({}))).await.0.unwrap();
    assert!(!has_tolerations(&pod));
    assert!(
        annotation(&pod).starts_with("report only (namespace ml's"),
        "{}",
        annotation(&pod)
    );
    assert!(annotation(&pod).contains(&format!("prefers arm64 (namespace ml's {PREFERRED_KEY})")));
    assert_eq!(
        api.counts().0,
        1,
        "one list: every change came through the watch"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_namespace_value_is_a_warning_never_a_failed_admission() {
    let api = NamespaceApi::start();
    let server = server(api.client("admintoken")).await;
    let namespaces = server.namespaces.clone().unwrap();
    until("the namespace list", || namespaces.is_settled()).await;
    until("the watch", || api.counts().1 == 1).await;
    api.add_namespace(
        "odd",
        json!({ENFORCE_KEY: "False"}),
        json!({PREFERRED_KEY: "arm64=eighty"}),
        214,
    );
    until("odd added", || namespaces.get("odd").is_some()).await;
    let (pod, warnings) = admitted(&server, &pod_in("odd", json!({}))).await;
    assert!(has_tolerations(&pod.unwrap()), "the config decides");
    assert!(
        warnings.contains(&format!(
            "namespace odd: {ENFORCE_KEY} ignored: \"False\" is not \"true\" or \"false\""
        )),
        "{warnings:#?}"
    );
    assert!(
        warnings.iter().any(|w| w.starts_with(&format!(
            "namespace odd: {PREFERRED_KEY} ignored: \"arm64=eighty\""
        ))),
        "{warnings:#?}"
    );
}

/// Without `list namespaces` (the recorded 403): ready all the same, decisions keep to the
/// config, one warning however often the watcher retries, and the metrics say so.
// One thread: the subscriber set here sees every task of the webhook.
#[tokio::test]
async fn refused_by_rbac_the_config_decides_with_one_warning_and_a_metric() {
    let log = common::captured_log::CapturedLog::default();
    let _guard = tracing::subscriber::set_default(log.subscriber());
    let api = NamespaceApi::start();
    let server = server(api.client("nobodytoken")).await;
    let namespaces = server.namespaces.clone().unwrap();
    until("the refusal", || namespaces.is_settled()).await;
    let ready = webhook::client()
        .get(server.url("/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        ready.status(),
        200,
        "a refused watch does not hold readiness back"
    );
    // The watcher retries (with its backoff): refused again, said once.
    until("a second refusal", || namespaces.refusals() >= 2).await;
    assert!(!namespaces.is_available());
    let text = log.text();
    let said = text
        .lines()
        .filter(|l| l.contains("namespace policy unavailable"))
        .collect::<Vec<_>>();
    assert_eq!(said.len(), 1, "{text}");
    assert!(said[0].contains("WARN"), "{}", said[0]);
    assert!(api.counts().2 >= 2);

    // team-a's enforce=false is unknown: the config (enforce) decides, and the Pod is answered.
    let pod = admitted(&server, &pod_in("team-a", json!({})))
        .await
        .0
        .unwrap();
    assert!(has_tolerations(&pod));
    let metrics = webhook::metrics_text(&server).await;
    let value = |series| webhook::metric_value(&metrics, series);
    assert_eq!(
        value("tolerable_namespace_policy_available"),
        Some(0.0),
        "{metrics}"
    );
    assert!(
        value("tolerable_namespace_policy_refusals_total") >= Some(2.0),
        "{metrics}"
    );
    assert_eq!(value("tolerable_namespace_policy_namespaces"), Some(0.0));
}

/// A Deployment `name` in `namespace` of the multi-architecture image, as YAML.
fn deployment(name: &str, namespace: &str) -> String {
    let image = format!("{}/fixtures/multiarch-oci:v1", registry::plain().host);
    format!(
        "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  template:\n    spec:\n      containers: [{{name: c, image: '{image}'}}]\n"
    )
}

fn text<'a>(workload: &'a Value, field: &str) -> &'a str {
    workload[field].as_str().unwrap_or_default()
}

/// `review` without a cluster: a Namespace in the input (for the workloads after it) and the
/// command line's labels; the Namespace's preference is in what would be added, its opt-out
/// skips the workload.
#[test]
fn review_takes_namespace_policy_from_the_input_and_the_command_line() {
    use common::cli::{json_report, review, workload};
    // batch's Namespace alone, team-ml's in a List.
    let yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: batch\n  annotations:\n    {PREFERRED_KEY}: \"arm64=80, amd64=20\"\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Namespace\n  metadata: {{name: team-ml, annotations: {{{PREFERRED_KEY}: amd64}}}}\n{}{}{}{}",
        deployment("crunch", "batch"),
        deployment("web", "team-b"),
        deployment("api", "default"),
        deployment("train", "team-ml"),
    );
    let skip = "team-b:tolerable.io/skip=true";
    let out = review(
        &["--json", "--namespace-label", skip, "-"],
        Some(yaml.as_bytes()),
    );
    let report = json_report(&out);
    let crunch = workload(&report, "Deployment", "crunch");
    let adds: Vec<&str> = crunch["adds"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        adds.contains(&"prefers arm64 (weight 80), amd64 (weight 20)"),
        "{crunch:#}"
    );
    assert!(text(crunch, "summary").contains(&format!("(namespace batch's {PREFERRED_KEY})")));
    let web = workload(&report, "Deployment", "web");
    assert_eq!(web["outcome"], "skipped", "{web:#}");
    assert!(text(web, "summary").contains("namespace team-b opted out with tolerable.io/skip=true"));
    let api = workload(&report, "Deployment", "api");
    assert_eq!(api["outcome"], "decided", "{api:#}");
    assert!(!api["adds"].to_string().contains("prefers"), "{api:#}");
    let train = workload(&report, "Deployment", "train");
    assert!(
        text(train, "summary").contains(&format!(
            "prefers amd64 (namespace team-ml's {PREFERRED_KEY})"
        )),
        "{train:#}"
    );

    // A malformed flag: could not run (2), naming the flag and the form.
    let out = review(
        &["--namespace-label", "tolerable.io/skip=true", "-"],
        Some(yaml.as_bytes()),
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .contains("--namespace-label \"tolerable.io/skip=true\": expected NAMESPACE:KEY=VALUE"),
        "{stderr}"
    );
}

/// `review --kubeconfig`: the cluster's Namespaces (one metadata-only list) decide, and a
/// Pod manifest's JSON Patch carries the namespace's report only.
#[test]
fn review_with_a_kubeconfig_reads_the_namespaces() {
    use common::cli::{json_report, tolerable, workload};
    use common::kube_fake::kubeconfig;
    let api = NamespaceApi::start();
    let config = kubeconfig(api.port, "admintoken");
    let file = tempfile::NamedTempFile::new().unwrap();
    let yaml = format!(
        "{}{}",
        deployment("crunch", "batch"),
        deployment("web", "team-b")
    );
    std::fs::write(file.path(), yaml).unwrap();
    let out = tolerable()
        .args(["review", "--json", "--kubeconfig"])
        .arg(config.path())
        .arg(file.path())
        .output()
        .unwrap();
    let report = json_report(&out);
    let crunch = workload(&report, "Deployment", "crunch");
    assert!(
        text(crunch, "summary").contains(&format!("(namespace batch's {PREFERRED_KEY})")),
        "{crunch:#}"
    );
    assert_eq!(workload(&report, "Deployment", "web")["outcome"], "skipped");
    // (It asks for the workloads' ServiceAccounts too, for their pull secrets: not served here.)
    let lists: Vec<(String, String)> = api
        .requests()
        .into_iter()
        .filter(|(path, _)| path.starts_with("/api/v1/namespaces?"))
        .collect();
    assert_eq!(lists.len(), 1, "one list: {lists:#?}");
    assert!(
        lists[0].1.contains("as=PartialObjectMetadataList"),
        "{lists:#?}"
    );

    // One Pod in team-a (enforce=false): its patch writes only the annotation.
    let pod = webhook::recorded("pod-create-simple.v1.json", &registry::plain().host);
    let mut pod = pod["request"]["object"].clone();
    pod["metadata"]["namespace"] = json!("team-a");
    pod["spec"]["containers"][0]["image"] = json!(format!(
        "{}/fixtures/multiarch-oci:v1",
        registry::plain().host
    ));
    std::fs::write(file.path(), pod.to_string()).unwrap();
    let out = tolerable()
        .args(["review", "--json", "--patch", "--kubeconfig"])
        .arg(config.path())
        .arg(file.path())
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains(&format!(
            "report only (namespace team-a's {ENFORCE_KEY}): would add"
        )),
        "{shown}"
    );
    assert!(!shown.contains("/spec/tolerations"), "{shown}");
}

/// The recorded folder (`tests/data/kube-api/namespaces/`) replayed: the full and the
/// metadata-only list and the 403 byte for byte as JSON, the metadata watch from the list's
/// resourceVersion line for line; a re-watch from a later resourceVersion (what kube-runtime
/// sends after a watch ends) gets exactly the recorded changes after it.
#[tokio::test]
async fn the_namespace_fake_replays_its_recorded_folder() {
    let api = NamespaceApi::start();
    let client = webhook::client();
    let get = |query: &str, accept: &str, token: &str| {
        let url = format!("https://localhost:{}/api/v1/namespaces?{query}", api.port);
        client
            .get(url)
            .header("accept", accept)
            .bearer_auth(token)
            .send()
    };
    let recorded = |name: &str| {
        let path = format!(
            "{}/tests/data/kube-api/namespaces/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        common::recorded::json_lines(&std::fs::read(path).unwrap())
    };
    let metadata = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
    let watch = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
    for (query, accept, token, code, file) in [
        (
            "limit=500",
            "application/json",
            "admintoken",
            200,
            "namespace-list.body.json",
        ),
        (
            "limit=500",
            metadata,
            "admintoken",
            200,
            "namespace-list-metadata.body.json",
        ),
        (
            "limit=500",
            metadata,
            "nobodytoken",
            403,
            "namespace-list-403.body.json",
        ),
    ] {
        let response = get(query, accept, token).await.unwrap();
        assert_eq!(response.status().as_u16(), code, "{file}");
        let body = response.bytes().await.unwrap();
        assert_eq!(
            common::recorded::json_lines(&body),
            recorded(file),
            "{file}"
        );
    }
    api.release(4);
    let lines = |body: bytes::Bytes| common::recorded::json_lines(&body);
    let whole = get("watch=true&resourceVersion=213", watch, "admintoken")
        .await
        .unwrap();
    api.end_watch();
    let events = recorded("namespace-watch-metadata.body.json");
    assert_eq!(
        lines(whole.bytes().await.unwrap()),
        events,
        "the recorded watch"
    );
    let later = get("watch=true&resourceVersion=214", watch, "admintoken")
        .await
        .unwrap();
    api.end_watch();
    assert_eq!(
        lines(later.bytes().await.unwrap()),
        events[1..],
        "the changes after 214"
    );
}

/// The fake refuses what the recorded API server refuses, and what no recording covers.
#[tokio::test]
async fn the_fake_answers_and_refuses_as_recorded() {
    let api = NamespaceApi::start();
    let client = webhook::client();
    let get = |query: &str, accept: &str, token: &str| {
        client
            .get(format!(
                "https://localhost:{}/api/v1/namespaces?{query}",
                api.port
            ))
            .header("accept", accept)
            .bearer_auth(token)
            .send()
    };
    let metadata = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
    let full: Value = get("limit=500", "application/json", "admintoken")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(full["kind"], "NamespaceList");
    assert_eq!(
        full["items"][0]["status"]["phase"], "Active",
        "whole objects"
    );
    let meta: Value = get("limit=500", metadata, "admintoken")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(meta["kind"], "PartialObjectMetadataList");
    assert!(meta["items"][0].get("status").is_none(), "metadata only");
    for (query, accept, token, code) in [
        ("limit=abc", metadata, "admintoken", 400),
        ("limit=500&continue=bogus", metadata, "admintoken", 400),
        // A full-object watch and one from before the list were not recorded.
        (
            "watch=true&resourceVersion=213",
            "application/json",
            "admintoken",
            501,
        ),
        (
            "watch=true&resourceVersion=100",
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
            "admintoken",
            501,
        ),
        ("limit=500", metadata, "nobodytoken", 403),
        ("limit=500", metadata, "whoever", 401),
    ] {
        let response = get(query, accept, token).await.unwrap();
        assert_eq!(response.status().as_u16(), code, "{query} {accept} {token}");
        let status: Value = response.json().await.unwrap();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["code"], code);
    }
}

/// Not ready before the first list of Namespaces (every Pod would be decided without their
/// policy), ready once it is in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_until_the_namespaces_are_listed() {
    let api = NamespaceApi::start_held();
    let server = server(api.client("admintoken")).await;
    until("the list asked", || {
        api.requests()
            .iter()
            .any(|(path, _)| path.contains("limit="))
    })
    .await;
    let ready = webhook::client()
        .get(server.url("/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    assert!(ready
        .text()
        .await
        .unwrap()
        .contains("namespace watch not synced"));
    api.answer_list();
    let namespaces = server.namespaces.clone().unwrap();
    until("the namespace list", || namespaces.is_settled()).await;
    let ready = webhook::client()
        .get(server.url("/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
}

/// Access revoked while running: the next watch is refused, and decisions keep to the config
/// (not to the last view, which nothing would update any more), with the metric saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_revoked_while_running_falls_back_to_the_config() {
    let api = NamespaceApi::start();
    let server = server(api.client("admintoken")).await;
    let namespaces = server.namespaces.clone().unwrap();
    until("the namespace list", || namespaces.is_settled()).await;
    until("the watch", || api.counts().1 == 1).await;
    assert_eq!(namespaces.len(), 3);
    api.revoke();
    api.end_watch();
    until("the refused watch", || namespaces.refusals() >= 1).await;
    assert!(!namespaces.is_available());
    assert!(namespaces.is_empty(), "no stale view");
    let pod = admitted(&server, &pod_in("team-a", json!({})))
        .await
        .0
        .unwrap();
    assert!(has_tolerations(&pod), "the config enforces");
    let metrics = webhook::metrics_text(&server).await;
    assert_eq!(
        webhook::metric_value(&metrics, "tolerable_namespace_policy_available"),
        Some(0.0)
    );
}
