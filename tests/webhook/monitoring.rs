//! The monitoring component (`kustomize/components/monitoring`, rendered through
//! `kustomize/overlays/monitoring`): its PodMonitor and PrometheusRule validate against
//! prometheus-operator's API, `promtool check rules` accepts the rules (and the dashboard's
//! queries), `promtool test rules` shows every alert firing when it should and quiet when it
//! should not, every alert carries a severity, a summary and a runbook that exists, and every
//! metric the alerts and the dashboard use is one a running `tolerable serve` exposes from the
//! start — on a `/metrics` that `promtool check metrics` accepts.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, SystemTime};

use common::kube_api::{FakeApiServer, RegistryHosts};
use common::tools::{self, documents, render, root, write_temp};
use common::webhook::{self, TestServer};
use common::{registry, settings};
use serde_json::{json, Value};

const OVERLAY: &str = "kustomize/overlays/monitoring";

fn object<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

/// The rendered PrometheusRule's rule groups.
fn groups(docs: &[Value]) -> Value {
    object(docs, "PrometheusRule")["spec"]["groups"].clone()
}

/// Every alerting rule.
fn alerts(groups: &Value) -> Vec<Value> {
    groups
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

fn name(alert: &Value) -> &str {
    alert["alert"].as_str().unwrap()
}

/// The Grafana dashboard shipped in the component's ConfigMap.
fn dashboard(docs: &[Value]) -> Value {
    let config_map = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "tolerable-dashboard")
        .expect("the dashboard ConfigMap");
    serde_json::from_str(config_map["data"]["tolerable.json"].as_str().unwrap()).unwrap()
}

/// Every query of the dashboard.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect()
}

/// `promtool ARGS` in `dir` (reading `stdin`, a file in `dir`, if given): success, and what it
/// printed.
fn promtool_with(dir: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut command = tools::command("promtool");
    command.args(args).current_dir(dir);
    if let Some(file) = stdin {
        command.stdin(std::fs::File::open(dir.join(file)).unwrap());
    }
    let out = command.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    promtool_with(dir, args, None)
}

/// A Prometheus rule file holding `groups`.
fn rule_file(dir: &Path, name: &str, groups: &Value) {
    let yaml = serde_yaml_ng::to_string(&json!({ "groups": groups })).unwrap();
    std::fs::write(dir.join(name), yaml).unwrap();
}

#[test]
fn the_custom_resources_validate_against_prometheus_operators_api() {
    let yaml = render(OVERLAY);
    let validate = |text: &str| {
        let file = write_temp(text);
        let out = tools::python_script("validate-custom-resources.py")
            .arg(file.path())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, report) = validate(&yaml);
    assert!(ok, "{report}");
    for object in ["PodMonitor/tolerable", "PrometheusRule/tolerable"] {
        assert!(report.contains(&format!("OK {object}\n")), "{report}");
    }
    // The validator rejects what the API would: an unknown field, a malformed duration.
    for (from, to) in [
        ("podMetricsEndpoints:", "podMetricEndpoints:"),
        ("for: 5m", "for: five minutes"),
        ("jobLabel:", "jobLabels:"),
    ] {
        assert!(yaml.contains(from), "{from}");
        let (ok, report) = validate(&yaml.replacen(from, to, 1));
        assert!(!ok, "accepted {to}: {report}");
    }
}

#[test]
fn the_pod_monitor_scrapes_the_metrics_port_of_the_webhooks_pods() {
    let docs = documents(&render(OVERLAY));
    let monitor = &object(&docs, "PodMonitor")["spec"];
    let deployment = object(&docs, "Deployment");
    let pod = &deployment["spec"]["template"];
    for (key, value) in monitor["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&pod["metadata"]["labels"][key], value, "selector {key}");
    }
    let endpoint = &monitor["podMetricsEndpoints"][0];
    let ports = pod["spec"]["containers"][0]["ports"].as_array().unwrap();
    assert!(ports.iter().any(|p| p["name"] == endpoint["port"]));
    assert_eq!(endpoint["path"], "/metrics");
    // The alerts select job="tolerable": the job label comes from the Pods' name label.
    let job_label = monitor["jobLabel"].as_str().unwrap();
    assert_eq!(pod["metadata"]["labels"][job_label], "tolerable");
    assert_eq!(
        object(&docs, "PodMonitor")["metadata"]["namespace"],
        deployment["metadata"]["namespace"]
    );
}

#[test]
fn the_rules_and_the_dashboards_queries_pass_promtool_check_rules() {
    let docs = documents(&render(OVERLAY));
    let groups = groups(&docs);
    let dir = tempfile::tempdir().unwrap();
    rule_file(dir.path(), "rules.yaml", &groups);
    let (ok, out) = promtool(dir.path(), &["check", "rules", "rules.yaml"]);
    assert!(ok, "{out}");
    let count = alerts(&groups).len();
    assert!(
        out.contains(&format!("SUCCESS: {count} rules found")),
        "{out}"
    );

    // The dashboard's queries, as recording rules ($__rate_interval is Grafana's).
    let queries: Vec<Value> = dashboard_queries(&dashboard(&docs))
        .iter()
        .enumerate()
        .map(|(i, q)| json!({"record": format!("dashboard:query_{i}"), "expr": q.replace("$__rate_interval", "5m")}))
        .collect();
    assert!(queries.len() >= 15, "{queries:?}");
    let dashboard_rules = json!([{ "name": "dashboard", "rules": queries }]);
    rule_file(dir.path(), "dashboard.yaml", &dashboard_rules);
    let (ok, out) = promtool(dir.path(), &["check", "rules", "dashboard.yaml"]);
    assert!(ok, "{out}");

    // promtool refuses a broken query.
    let mut broken = groups.clone();
    broken[0]["rules"][0]["expr"] = json!("sum(rate(tolerable_admissions_total[5m])");
    rule_file(dir.path(), "broken.yaml", &broken);
    assert!(!promtool(dir.path(), &["check", "rules", "broken.yaml"]).0);
}

#[test]
fn every_alert_fires_when_it_should_and_stays_quiet_when_it_should_not() {
    let docs = documents(&render(OVERLAY));
    let mut groups = groups(&docs);
    // The tests assert labels and summaries; descriptions and runbooks are checked elsewhere.
    for group in groups.as_array_mut().unwrap() {
        for rule in group["rules"].as_array_mut().unwrap() {
            if let Some(annotations) = rule["annotations"].as_object_mut() {
                annotations.remove("description");
                annotations.remove("runbook_url");
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    rule_file(dir.path(), "rules.yaml", &groups);
    let tests = root().join("tests/data/monitoring/alerts.test.yaml");
    std::fs::copy(&tests, dir.path().join("alerts.test.yaml")).unwrap();
    let (ok, out) = promtool(dir.path(), &["test", "rules", "alerts.test.yaml"]);
    assert!(ok, "{out}");
    assert!(out.contains("SUCCESS"), "{out}");

    // Every alert is tested both ways.
    let cases: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&tests).unwrap()).unwrap();
    let (mut fires, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for test in cases["tests"].as_array().unwrap() {
        for case in test["alert_rule_test"].as_array().unwrap() {
            let alert = case["alertname"].as_str().unwrap().to_owned();
            let expected = case["exp_alerts"].as_array().map_or(0, Vec::len);
            if expected == 0 {
                quiet.insert(alert);
            } else {
                fires.insert(alert);
            }
        }
    }
    for alert in alerts(&groups) {
        assert!(
            fires.contains(name(&alert)),
            "no test fires {}",
            name(&alert)
        );
        assert!(
            quiet.contains(name(&alert)),
            "no test keeps {} quiet",
            name(&alert)
        );
    }
}

#[test]
fn every_alert_has_a_severity_a_summary_naming_what_it_is_about_and_a_runbook() {
    let docs = documents(&render(OVERLAY));
    let base_url: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(root().join(OVERLAY).join("runbooks.yaml")).unwrap(),
    )
    .unwrap();
    let base_url = base_url["data"]["url"].as_str().unwrap();
    let index = std::fs::read_to_string(root().join("docs/runbooks/README.md")).unwrap();
    let alerts = alerts(&groups(&docs));
    assert!(alerts.len() >= 12, "{alerts:?}");
    for alert in &alerts {
        let name = name(alert);
        let severity = alert["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["critical", "warning", "info"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        let expr = alert["expr"].as_str().unwrap();
        let summary = alert["annotations"]["summary"].as_str().unwrap_or_default();
        assert!(!summary.is_empty(), "{name}: no summary");
        assert!(
            alert["annotations"]["description"]
                .as_str()
                .is_some_and(|d| !d.is_empty()),
            "{name}: no description"
        );
        // An alert per registry names it; an alert per Pod (no aggregation, or by Pod) names
        // the Pod.
        if expr.contains("by (registry)") {
            assert!(
                summary.contains("{{ $labels.registry }}"),
                "{name}: {summary}"
            );
        }
        let aggregated = [
            "sum(",
            "sum by",
            "min by",
            "max by",
            "absent(",
            "histogram_quantile(",
        ]
        .iter()
        .any(|a| expr.contains(a));
        if !aggregated || expr.contains("by (namespace, pod)") {
            assert!(summary.contains("{{ $labels.pod }}"), "{name}: {summary}");
        }
        assert_eq!(
            alert["annotations"]["runbook_url"],
            format!("{base_url}/{name}.md"),
            "{name}"
        );
        let runbook = std::fs::read_to_string(root().join(format!("docs/runbooks/{name}.md")))
            .unwrap_or_else(|e| panic!("docs/runbooks/{name}.md: {e}"));
        for section in ["## What it means", "## How to confirm", "## What to do"] {
            assert!(runbook.contains(section), "{name}.md lacks {section}");
        }
        assert!(
            runbook.starts_with(&format!("# {name}\n")),
            "{name}.md title"
        );
        assert!(
            index.contains(&format!("[{name}]({name}.md)")),
            "index lacks {name}"
        );
    }
    // Every runbook belongs to an alert.
    for entry in std::fs::read_dir(root().join("docs/runbooks")).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        let Some(alert) = file.strip_suffix(".md") else {
            continue;
        };
        assert!(
            alert == "README" || alerts.iter().any(|a| name(a) == alert),
            "docs/runbooks/{file} has no alert"
        );
    }
}

/// The latency alert's threshold, in seconds, and its summary.
fn latency_alert(docs: &[Value]) -> (f64, String) {
    let alerts = alerts(&groups(docs));
    let alert = alerts
        .iter()
        .find(|a| name(a) == "TolerableAdmissionLatencyHigh")
        .unwrap();
    let expr = alert["expr"].as_str().unwrap();
    let threshold = expr.rsplit("> ").next().unwrap().trim().parse().unwrap();
    let summary = alert["annotations"]["summary"].as_str().unwrap().to_owned();
    (threshold, summary)
}

/// The latency alert fires near the webhook's timeout: above half of it, and no later than the
/// server's own answer deadline (the timeout minus a fifth), else it could never fire. (That
/// the histogram has buckets above it is checked on a running server, below.)
#[test]
fn the_latency_alert_fits_the_webhook_timeout() {
    let docs = documents(&render(OVERLAY));
    let (threshold, summary) = latency_alert(&docs);
    let mwc = object(&docs, "MutatingWebhookConfiguration");
    let timeout = mwc["webhooks"][0]["timeoutSeconds"].as_u64().unwrap();
    let budget = tolerable::budget::for_query(Some(&format!("timeout={timeout}s")));
    assert!(
        threshold > timeout as f64 / 2.0 && threshold <= budget.as_secs_f64(),
        "threshold {threshold}s, timeoutSeconds {timeout}, answer deadline {budget:?}"
    );
    assert!(summary.contains(&format!("({timeout}s)")), "{summary}");
}

#[test]
fn the_dashboard_is_a_configmap_for_grafanas_sidecar() {
    let docs = documents(&render(OVERLAY));
    let config_map = docs
        .iter()
        .find(|d| d["metadata"]["name"] == "tolerable-dashboard")
        .unwrap();
    assert_eq!(config_map["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(config_map["metadata"]["namespace"], "tolerable-system");
    let dashboard = dashboard(&docs);
    assert_eq!(dashboard["uid"], "tolerable");
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert!(variables
        .iter()
        .any(|v| v["name"] == "datasource" && v["type"] == "datasource"));
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        assert!(ids.insert(panel["id"].as_u64().unwrap()), "duplicate id");
        let grid = &panel["gridPos"];
        assert!(grid["x"].as_u64().unwrap() + grid["w"].as_u64().unwrap() <= 24);
        for target in panel["targets"].as_array().into_iter().flatten() {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{panel}");
        }
    }
}

/// The metric names (`tolerable_…`) a query uses.
fn metric_names(query: &str) -> BTreeSet<String> {
    query
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.starts_with("tolerable_"))
        .map(str::to_owned)
        .collect()
}

/// Whether the exposition has a sample of `name`.
fn has_sample(text: &str, name: &str) -> bool {
    text.lines().any(|l| {
        l.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(['{', ' ']))
    })
}

/// The value of the sample `series` (name and labels, as exposed).
fn value(text: &str, series: &str) -> f64 {
    webhook::metric_value(text, series).unwrap_or_else(|| panic!("no {series}:\n{text}"))
}

#[tokio::test]
async fn every_metric_the_alerts_and_dashboard_use_is_exposed_from_the_start() {
    let docs = documents(&render(OVERLAY));
    let used = metrics_used(&docs);
    assert!(used.len() >= 15, "{used:?}");
    let started = SystemTime::now();
    let (server, _api) = ready_server_with_node_watch().await;
    let text = webhook::metrics_text(&server).await;
    series_at_start(&text, &used, started, &docs);
    after_a_denial(&server, &used).await;
    open_metrics_when_asked(&server).await;
}

/// Every metric name the alerts and the dashboard's queries read.
fn metrics_used(docs: &[Value]) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for alert in alerts(&groups(docs)) {
        used.extend(metric_names(alert["expr"].as_str().unwrap()));
    }
    for query in dashboard_queries(&dashboard(docs)) {
        used.extend(metric_names(&query));
    }
    used
}

/// The server as `serve` runs it in a cluster: the node watch on (a fake API server), the test
/// registries trusted through registry_ca_path's CA; once ready.
async fn ready_server_with_node_watch() -> (TestServer, FakeApiServer) {
    let api = FakeApiServer::start(RegistryHosts {
        basic: registry::basic().host.clone(),
        token: registry::token().host.clone(),
    });
    let server =
        TestServer::start_with_cluster(webhook::policy(), settings(), api.client("admintoken"))
            .await;
    webhook::until_ready(&server).await;

    (server, api)
}

/// Series that exist only once a registry sends what they show: its rate-limit headers (the test
/// registry sends none; a series at 0 would claim a spent limit). tests/webhook/faults.rs checks their
/// names and values with a registry that sends the headers.
const SENT_BY_REGISTRIES: [&str; 2] = [
    "tolerable_registry_rate_limit",
    "tolerable_registry_rate_limit_remaining",
];

/// Before any admission: every series an alert or panel reads exists, except the registry
/// requests, labelled by the status a registry answered, and [`SENT_BY_REGISTRIES`].
/// Exposed only where a replica competes for the gate releasers' Lease (`on_lookup_failure =
/// "gate"`): TolerableNoGateReleaser stays quiet without it, and this server does not gate.
/// (The other gate series exist on every server, at 0.)
const ONLY_WITH_GATES: [&str; 1] = ["tolerable_gate_leader"];

fn series_at_start(text: &str, used: &BTreeSet<String>, started: SystemTime, docs: &[Value]) {
    for name in used {
        if name != "tolerable_registry_requests_total"
            && !SENT_BY_REGISTRIES.contains(&name.as_str())
            && !ONLY_WITH_GATES.contains(&name.as_str())
        {
            assert!(
                has_sample(text, name),
                "{name} not exposed at start:\n{text}"
            );
        }
    }
    assert_eq!(value(text, "tolerable_ready"), 1.0);
    // The test certificates are rcgen's default validity: until 4096-01-01.
    for series in [
        "tolerable_certificate_expiry_timestamp_seconds",
        "tolerable_registry_ca_expiry_timestamp_seconds",
    ] {
        assert_eq!(value(text, series), 67_090_118_400.0, "{series}");
    }
    let synced = value(text, "tolerable_node_watch_last_sync_timestamp_seconds");
    let since_epoch = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    assert!(
        synced >= since_epoch(started).as_secs_f64() - 1.0
            && synced <= since_epoch(SystemTime::now()).as_secs_f64() + 1.0,
        "node watch synced at {synced}"
    );
    for zero in [
        "tolerable_admission_denials_total{reason=\"no_common_architecture\"}",
        "tolerable_admissions_total{outcome=\"denied\"}",
        "tolerable_cache_lookups_total{result=\"stale\"}",
        "tolerable_certificate_reloads_total{result=\"error\"}",
    ] {
        assert_eq!(value(text, zero), 0.0, "{zero}");
    }
    promtool_check_metrics(text);
    // The latency histogram has a bucket above the alert's threshold, so p99 can exceed it.
    let (threshold, _) = latency_alert(docs);
    let above = text
        .lines()
        .filter_map(|l| l.strip_prefix("tolerable_admission_duration_seconds_bucket{le=\""))
        .filter_map(|l| l.split('"').next()?.parse::<f64>().ok())
        .any(|le| le > threshold && le.is_finite());
    assert!(above, "no bucket above {threshold}s:\n{text}");
}

fn promtool_check_metrics(text: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("metrics.txt"), text).unwrap();
    let (ok, report) = promtool_with(dir.path(), &["check", "metrics"], Some("metrics.txt"));
    assert!(ok && report.trim().is_empty(), "{report}");
}

/// One admission of two images from a test registry that share no architecture: now the
/// registry requests are there too, and the denial is counted by its reason.
async fn after_a_denial(server: &TestServer, used: &BTreeSet<String>) {
    let host = &registry::plain().host;
    let pusher = common::fixtures::Pusher::for_mode(host, registry::Mode::Plain);
    pusher.push("monitoring/amd64", "buildx-single", "v1").await;
    pusher.push("monitoring/s390x", "s390x-docker", "v1").await;
    let mut request = webhook::recorded("pod-create-simple.v1.json", host);
    request["request"]["object"]["spec"]["containers"] = json!([
        {"name": "a", "image": format!("{host}/monitoring/amd64:v1")},
        {"name": "b", "image": format!("{host}/monitoring/s390x:v1")},
    ]);
    let (response, _) = webhook::admit(server, &request, Duration::from_secs(10)).await;
    assert_eq!(response["allowed"], false, "{response}");
    let text = webhook::metrics_text(server).await;
    for name in used.iter().filter(|n| {
        !SENT_BY_REGISTRIES.contains(&n.as_str()) && !ONLY_WITH_GATES.contains(&n.as_str())
    }) {
        assert!(has_sample(&text, name), "{name} not exposed:\n{text}");
    }
    assert_eq!(
        value(
            &text,
            "tolerable_admission_denials_total{reason=\"no_common_architecture\"}"
        ),
        1.0
    );
    promtool_check_metrics(&text);
}

/// Prometheus asks for OpenMetrics and gets it.
async fn open_metrics_when_asked(server: &TestServer) {
    let open_metrics = webhook::client()
        .get(server.url("/metrics"))
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3",
        )
        .send()
        .await
        .unwrap();
    let content_type = open_metrics.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let body = open_metrics.text().await.unwrap();
    assert!(body.ends_with("# EOF\n"), "{body}");
    assert!(body.contains("# TYPE tolerable_admission_denials counter\n"));
}

/// The fail-open alert reads the API server's metrics for the webhook by the name the shipped
/// MutatingWebhookConfiguration gives it (kustomize/base's; the chart's is the same, as
/// tests/project/kustomize.rs checks), and every query of it names that webhook.
#[test]
fn the_fail_open_alert_selects_the_shipped_webhooks_name() {
    let docs = documents(&render(OVERLAY));
    let alert = alerts(&groups(&docs))
        .into_iter()
        .find(|a| name(a) == "TolerableWebhookFailingOpen")
        .expect("TolerableWebhookFailingOpen");
    let webhook = docs
        .iter()
        .find(|d| d["kind"] == "MutatingWebhookConfiguration")
        .unwrap()["webhooks"][0]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let expr = alert["expr"].as_str().unwrap();
    let queries = expr.matches("apiserver_admission_webhook_").count();
    assert_eq!(queries, 4, "{expr}");
    assert_eq!(
        expr.matches(&format!("name=\"{webhook}\"")).count(),
        queries,
        "{expr}"
    );
}
