//! The Helm chart, `charts/tolerable`, checked by the real Helm engine (Helm v4's Go SDK from
//! PyPI's helm-python-sdk, in the test tools' Python: `scripts/helm-chart.py`): `helm lint` is
//! clean, the rendered objects validate offline as `kustomize/` does (tests/project/deploy.rs), the
//! values schema refuses typos and accepts umbrella charts' keys, and every rendered
//! tolerable.toml loads in tolerable. kustomize/ is rendered from the chart and held to it by
//! tests/project/kustomize.rs.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;

use common::deployed::{self, object};
use common::tools::{self, write_temp, KUBERNETES_VERSIONS};
use serde_json::{json, Value};
use tolerable::config::Config;

const CHART: &str = "charts/tolerable";
/// The chart rendered with `values` as release `name` in `namespace`: the manifests' YAML and
/// NOTES.txt, or Helm's error.
fn try_render(values: &Value, name: &str, namespace: &str) -> Result<(String, String), String> {
    try_render_chart(&tools::root().join(CHART), values, name, namespace)
}

/// [`try_render`] for the chart in `chart`.
fn try_render_chart(
    chart: &std::path::Path,
    values: &Value,
    name: &str,
    namespace: &str,
) -> Result<(String, String), String> {
    let out = tools::python_script("helm-chart.py")
        .arg("render")
        .arg(chart)
        .args([name, namespace, &values.to_string()])
        .output()
        .unwrap();
    let why = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!why.contains("not installed"), "{why}");
    if !out.status.success() {
        return Err(why);
    }
    let rendered: Value = serde_json::from_slice(&out.stdout).unwrap();
    Ok((
        rendered["manifests"].as_str().unwrap().to_owned(),
        rendered["notes"].as_str().unwrap().to_owned(),
    ))
}

fn render(values: &Value, name: &str, namespace: &str) -> (String, String) {
    try_render(values, name, namespace)
        .unwrap_or_else(|why| panic!("helm template {values}: {why}"))
}

/// The default release: named tolerable in tolerable-system, as kustomize/base installs it.
fn render_defaults() -> Vec<Value> {
    tools::documents(&render(&json!({}), "tolerable", "tolerable-system").0)
}

/// Whether values.schema.json accepts `values`, and Helm's reasons when not.
fn schema_accepts(values: &Value) -> Result<(), String> {
    let out = tools::python_script("helm-chart.py")
        .args(["schema", CHART, &values.to_string()])
        .current_dir(tools::root())
        .output()
        .unwrap();
    let why = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!why.contains("not installed"), "{why}");
    if out.status.success() {
        Ok(())
    } else {
        Err(why)
    }
}

fn deployment_pod(docs: &[Value], name: &str) -> Value {
    object(docs, "Deployment", name)["spec"]["template"]["spec"].clone()
}

/// Values switching on what the defaults leave off, and changing names and selectors.
fn switched_values() -> Value {
    json!({
        "image": {"repository": "registry.example.com/platform/tolerable",
                  "digest": format!("sha256:{}", "ab".repeat(32))},
        "env": [{"name": "TOLERABLE_LOG__LEVEL", "value": "debug"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "networkPolicy": {"webhookFrom": [{"ipBlock": {"cidr": "10.0.0.0/16"}}]},
        "rbac": {"pullSecretNamespaces": ["team-a"]},
        "registryCredentials": {"existingSecret": "registry-logins",
                                "dockerConfigSecret": "pull-secret"},
        "sharedCache": {"passwordSecret": {"name": "valkey-auth"}},
        "webhook": {
            "timeoutSeconds": 5,
            "excludeNamespaces": ["istio-system"],
            "namespaceSelector": {
                "matchLabels": {"tolerable.io/enabled": "true"},
                "matchExpressions": [{"key": "team", "operator": "Exists"}]
            },
            "objectSelector": {"matchLabels": {"arch-aware": "yes"}}
        },
        "config": {
            "server": {"max_connections": 500, "metrics_addr": "0.0.0.0:9191"},
            "policy": {"supported_architectures": ["arm64", "s390x"],
                       // As tolerable also takes it: one comma-separated string.
                       "skip_namespaces": "kube-system, batch,",
                       "preferred_architecture": [{"architecture": "arm64", "weight": 80},
                                                  {"architecture": "amd64", "weight": 20}]},
            "architecture_tolerations": {"arm64": [{"key": "arm64", "value": "true"},
                                                   {"key": "kubernetes.io/arch"}]},
            "nodes": {"manage_taints": true},
            "registry": {"lookup_timeout": "3s", "mirrors": {"docker.io": "mirror.gcr.io"}},
            "shared_cache": {"url": "redis://valkey.cache.svc:6379/0"}
        }
    })
}

/// Values under which tolerable needs no API access at all.
fn no_api_values() -> Value {
    json!({"config": {"credentials": {"read_pull_secrets": false}, "nodes": {"watch": false}, "policy": {"namespace_policy": false}}})
}

#[test]
fn chart_metadata_matches_the_crate_and_the_supported_range() {
    let text = std::fs::read_to_string(tools::root().join(CHART).join("Chart.yaml")).unwrap();
    let chart: Value = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(chart["apiVersion"], "v2");
    assert_eq!(chart["name"], "tolerable");
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"));
    // A lower bound only: a cluster upgraded past the tested range must not make every
    // `helm upgrade` fail. The tested range is the schemas' below, and docs and NOTES say it.
    assert_eq!(chart["kubeVersion"], ">=1.30.0-0");
    let install = std::fs::read_to_string(tools::root().join("docs/install.md")).unwrap();
    assert!(install.contains("**Kubernetes 1.30 or newer; tested with 1.30 to 1.37.**"));
    let tested = format!(
        "tested with Kubernetes {} to {}",
        KUBERNETES_VERSIONS[0].trim_end_matches(".0"),
        KUBERNETES_VERSIONS[1].trim_end_matches(".0")
    );
    let (_, notes) = render(&json!({}), "tolerable", "tolerable-system");
    assert!(notes.contains(&tested), "{notes}");
}

/// `helm lint --strict` finds nothing above "info" at both ends of the supported range; the
/// same lint finds a broken template (so "clean" means something).
#[test]
fn helm_lint_is_clean() {
    let lint_with = |chart: &std::path::Path, version: &str, values: &Value| -> Value {
        let out = tools::python_script("helm-chart.py")
            .arg("lint")
            .arg(chart)
            .args([version, &values.to_string()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let lint = |chart: &std::path::Path, version: &str| lint_with(chart, version, &json!({}));
    let chart = tools::root().join(CHART);
    let mut switched = switched_values();
    switched["monitoring"] = json!({"podMonitor": {"enabled": true},
        "prometheusRule": {"enabled": true, "runbookBaseUrl": "https://docs.example/runbooks"},
        "dashboard": {"enabled": true}});
    switched["certificates"] = json!({"mode": "helm"});
    for (version, values) in KUBERNETES_VERSIONS
        .into_iter()
        .flat_map(|v| [(v, json!({})), (v, switched.clone())])
    {
        let report = lint_with(&chart, version, &values);
        assert_eq!(report["errors"], json!([]), "{version} {values}: {report}");
        let findings: Vec<&Value> = report["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["severity"].as_u64().unwrap() >= 2) // warning, error
            .collect();
        assert!(findings.is_empty(), "{version}: {findings:?}");
    }
    let copy = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("cp")
        .arg("-r")
        .arg(&chart)
        .arg(copy.path())
        .status()
        .unwrap();
    assert!(status.success());
    let broken = copy.path().join("tolerable");
    let service = broken.join("templates/service.yaml");
    let text = std::fs::read_to_string(&service).unwrap();
    std::fs::write(
        &service,
        text.replace(".Values.service.port", ".Values.servce.port"),
    )
    .unwrap();
    let report = lint(&broken, KUBERNETES_VERSIONS[0]);
    assert_ne!(
        report["errors"],
        json!([]),
        "a broken template passed: {report}"
    );
}

/// Every rendered object validates against Kubernetes' schemas (strict: unknown fields are
/// errors) at both ends of the supported range, and cert-manager's against its API models;
/// with the defaults, with the switches on, and with no API access.
#[test]
fn rendered_objects_validate_offline() {
    for values in [json!({}), switched_values(), no_api_values()] {
        let yaml = render(&values, "tolerable", "tolerable-system").0;
        let file = write_temp(&yaml);
        let mut kinds = vec![
            "serviceaccount",
            "configmap",
            "service",
            "deployment",
            "poddisruptionbudget",
            "mutatingwebhookconfiguration",
            "networkpolicy",
        ];
        kinds.extend(
            yaml.contains("kind: ClusterRole\n")
                .then_some("clusterrole"),
        );
        tools::validate_against_kubernetes(file.path(), &kinds, &values.to_string());
        let out = tools::python_script("validate-custom-resources.py")
            .arg(file.path())
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{values}: cert-manager:\n{report}");
        let checked = report.lines().filter(|l| l.starts_with("OK ")).count();
        assert_eq!(checked, 4, "{report}");
    }
}

/// The chart's Pods spread over hosts first (never two on one node while another can take one)
/// and then over zones (kustomize/base is the chart's render: tests/project/kustomize.rs).
#[test]
fn the_pods_spread_over_hosts_then_zones() {
    let pod = deployment_pod(&render_defaults(), "tolerable");
    let keys: Vec<&Value> = pod["topologySpreadConstraints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["topologyKey"])
        .collect();
    assert_eq!(
        keys,
        ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
    );
}

/// The rendered tolerable.toml loaded as the container loads it (the ConfigMap's file and the
/// Deployment's environment), its mounted files' paths checked against the mounts and then
/// swapped for local files (they exist only in the Pod).
fn load_rendered_config(docs: &[Value], fullname: &str) -> Result<deployed::LoadedConfig, String> {
    let config_map = object(docs, "ConfigMap", &format!("{fullname}-config"));
    let text = config_map["data"]["tolerable.toml"].as_str().unwrap();
    let file: toml::Table = text.parse().map_err(|e| format!("not TOML: {e}"))?;
    let pod = deployment_pod(docs, fullname);
    let deployment = object(docs, "Deployment", fullname);
    let container = &pod["containers"][0];
    let mount_of = |volume: &str| -> String {
        let mount = container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == volume)
            .unwrap_or_else(|| panic!("{volume} not mounted"));
        mount["mountPath"].as_str().unwrap().to_owned()
    };
    assert_eq!(
        file["tls"]["cert_path"].as_str(),
        Some(&*format!("{}/tls.crt", mount_of("tls")))
    );
    assert_eq!(
        file["tls"]["key_path"].as_str(),
        Some(&*format!("{}/tls.key", mount_of("tls")))
    );
    assert_eq!(
        file["credentials"]["files_path"].as_str(),
        Some(&*mount_of("registry-creds"))
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tolerable.toml");
    std::fs::write(&path, text).unwrap();
    // A value from a Secret is only in the cluster: a stand-in here.
    let mut env: Vec<(String, String)> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let value = match e["value"].as_str() {
                Some(value) => value.to_owned(),
                None => match e["valueFrom"]["fieldRef"].is_object() {
                    true => deployed::downward_value(e, deployment).unwrap(),
                    false => {
                        assert!(e["valueFrom"]["secretKeyRef"]["name"].is_string(), "{e}");
                        "from-a-secret".to_owned()
                    }
                },
            };
            (e["name"].as_str().unwrap().into(), value)
        })
        .collect();
    assert!(env.contains(&(
        "TOLERABLE_CONFIG".into(),
        format!("{}/tolerable.toml", mount_of("config"))
    )));
    deployed::local_tls_and_credential_files(dir.path(), &mut env);
    deployed::local_credential_providers(docs, &pod, dir.path(), &mut env);
    local_docker_config(&pod, dir.path(), &mut env);
    let config = Config::load(Some(&path), env).map_err(|e| e.to_string())?;
    Ok(deployed::LoadedConfig::new(config, dir))
}

/// The Docker config.json the environment names, checked to be the `.dockerconfigjson` of the
/// Secret mounted there, made a local (empty) one in `dir`.
fn local_docker_config(pod: &Value, dir: &Path, env: &mut [(String, String)]) {
    let Some((_, path)) = env
        .iter_mut()
        .find(|(k, _)| k == "TOLERABLE_CREDENTIALS__DOCKER_CONFIG_PATH")
    else {
        return;
    };
    let (mount_path, file) = path.rsplit_once('/').unwrap();
    let (volume, mount) = deployed::volume_of(pod, path).expect("the Docker config is mounted");
    assert_eq!(mount, mount_path, "{volume}");
    let items = &volume["secret"]["items"];
    assert_eq!(
        items,
        &json!([{"key": ".dockerconfigjson", "path": file}]),
        "{volume}"
    );
    let local = dir.join("docker-config.json");
    std::fs::write(&local, r#"{"auths": {}}"#).unwrap();
    *path = local.display().to_string();
}

/// Every rendered config loads in tolerable — numbers stay integers (Helm's toToml would write
/// 1000.0), maps and lists of tables arrive whole — and says what the
/// values said; the ports, RBAC and API token follow the config; a value tolerable refuses is
/// caught here, not in the cluster.
#[test]
fn rendered_config_loads_in_tolerable() {
    let defaults = load_rendered_config(&render_defaults(), "tolerable").unwrap();
    assert_eq!(defaults.server_limits.max_connections, 1000);
    // Whole numbers are written as integers, as tolerable.toml has them (YAML numbers reach
    // the templates as floats, and Helm's toToml would write 1000.0).
    let docs = render_defaults();
    let text = object(&docs, "ConfigMap", "tolerable-config")["data"]["tolerable.toml"]
        .as_str()
        .unwrap();
    assert!(text.contains("\nmax_connections = 1000\n"), "{text}");
    assert!(defaults.read_pull_secrets && defaults.watch_nodes && !defaults.manage_node_taints);

    let docs = tools::documents(&render(&switched_values(), "edge", "infra").0);
    let config = load_rendered_config(&docs, "edge-tolerable").unwrap();
    assert_eq!(config.server_limits.max_connections, 500);
    assert_eq!(config.metrics_addr.unwrap().port(), 9191);
    assert_eq!(
        config.policy.supported_architectures,
        ["arm64", "s390x"].map(String::from).into()
    );
    assert_eq!(config.policy.preferred_architectures.len(), 2);
    assert_eq!(config.policy.architecture_tolerations["arm64"].len(), 2);
    assert_eq!(config.resolver.mirrors["docker.io"], "mirror.gcr.io");
    assert_eq!(
        config.resolver.lookup_timeout,
        std::time::Duration::from_secs(3)
    );
    assert!(config.manage_node_taints);
    let shared = config
        .resolver
        .shared_cache
        .clone()
        .expect("[shared_cache] url");
    assert_eq!(shared.url(), "redis://valkey.cache.svc:6379/0");
    let text =
        object(&docs, "ConfigMap", "edge-tolerable-config")["data"]["tolerable.toml"].to_string();
    assert!(
        !text.contains("password"),
        "the password stays in its Secret: {text}"
    );
    let pod = deployment_pod(&docs, "edge-tolerable");
    let metrics = pod["containers"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics");
    assert_eq!(metrics.unwrap()["containerPort"], 9191);
    let roles: BTreeSet<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRole")
        .filter(|d| d["metadata"]["annotations"]["helm.sh/hook"].is_null())
        .map(|d| d["metadata"]["name"].as_str().unwrap())
        .collect();
    let expected = [
        "edge-tolerable-pull-secrets",
        "edge-tolerable-nodes",
        "edge-tolerable-namespaces",
        "edge-tolerable-node-taints",
    ];
    assert_eq!(roles, expected.into());
    assert_eq!(
        object(&docs, "ClusterRole", "edge-tolerable-node-taints")["rules"][0]["verbs"],
        json!(["get", "list", "watch", "patch"])
    );

    let docs = tools::documents(&render(&no_api_values(), "tolerable", "tolerable-system").0);
    let config = load_rendered_config(&docs, "tolerable").unwrap();
    assert!(!config.read_pull_secrets && !config.watch_nodes);
    assert!(rbac_of(&docs).is_empty(), "{:?}", rbac_of(&docs));
    assert_eq!(
        deployment_pod(&docs, "tolerable")["automountServiceAccountToken"],
        false
    );

    let refused = json!({"config": {"policy": {"steering": "sideways"}}});
    let docs = tools::documents(&render(&refused, "tolerable", "tolerable-system").0);
    let why = load_rendered_config(&docs, "tolerable").unwrap_err();
    assert!(why.contains("steering"), "{why}");
}

/// values.schema.json refuses misspelt and mistyped values of tolerable's own, and accepts
/// `global` and other top-level keys an umbrella chart passes, and the documented examples.
#[test]
fn the_values_schema_refuses_typos_and_accepts_umbrella_keys() {
    for ok in [
        json!({}),
        json!({"global": {"imageRegistry": "mirror.example", "imagePullSecrets": []}}),
        json!({"enabled": true, "global": {}}),
        switched_values(),
        no_api_values(),
    ] {
        schema_accepts(&ok).unwrap_or_else(|why| panic!("{ok} refused: {why}"));
    }
    for (bad, reason) in [
        (json!({"image": {"tga": "v1"}}), "tga"),
        (json!({"replicas": "two"}), "replicas"),
        // A misspelt top-level value is refused before anything is installed.
        (json!({"replica": 3}), "replica"),
        (json!({"postgresql": {"enabled": false}}), "postgresql"),
        (
            json!({"webhook": {"matchConditions": [{"name": "x"}]}}),
            "expression",
        ),
        (
            json!({"webhook": {"failurePolicy": "Maybe"}}),
            "failurePolicy",
        ),
        (json!({"webhook": {"timeoutSeconds": 31}}), "timeoutSeconds"),
        // archy drops a misspelt selector silently: here it is refused.
        (
            json!({"webhook": {"namespaceSelector": {"matchLabel": {"a": "b"}}}}),
            "matchLabel",
        ),
        (json!({"config": {"polciy": {"enforce": false}}}), "polciy"),
        (
            json!({"config": {"policy": {"enforcee": false}}}),
            "enforcee",
        ),
        // The shared cache's password never goes into the ConfigMap.
        (
            json!({"config": {"shared_cache": {"password": "x"}}}),
            "password",
        ),
        (
            json!({"certificates": {"certManager": {"duration": "90 days"}}}),
            "duration",
        ),
        (json!({"image": {"digest": "sha256:abc"}}), "digest"),
        (
            json!({"networkPolicy": {"webhookFrom": [{"ipblock": {}}]}}),
            "ipblock",
        ),
    ] {
        let why = schema_accepts(&bad).expect_err(&bad.to_string());
        assert!(why.contains(reason), "{bad}: {why}");
    }
}

/// The webhook never selects the release's own namespace or kube-system, whatever the values
/// add, nor the namespaces `skip_namespaces` names (tolerable would leave their Pods alone);
/// what they add is kept (matchLabels included); names follow the release, and every object
/// that names another agrees with it.
#[test]
fn the_webhook_keeps_its_exclusions_and_objects_agree() {
    let (yaml, notes) = render(&switched_values(), "edge", "infra");
    let docs = tools::documents(&yaml);
    let mwc = object(&docs, "MutatingWebhookConfiguration", "edge-tolerable");
    let hook = &mwc["webhooks"][0];
    assert_eq!(hook["failurePolicy"], "Ignore");
    assert_eq!(hook["timeoutSeconds"], 5);
    let namespaces = &hook["namespaceSelector"];
    assert_eq!(
        namespaces["matchLabels"],
        json!({"tolerable.io/enabled": "true"})
    );
    assert_eq!(
        namespaces["matchExpressions"],
        json!([{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                "values": ["infra", "kube-system", "istio-system", "batch"]},
               {"key": tolerable::mutate::SKIP_KEY, "operator": "NotIn", "values": ["true"]},
               {"key": "team", "operator": "Exists"}])
    );
    let objects = &hook["objectSelector"];
    assert_eq!(objects["matchLabels"], json!({"arch-aware": "yes"}));
    assert_eq!(
        objects["matchExpressions"],
        json!([{"key": tolerable::mutate::SKIP_KEY, "operator": "NotIn", "values": ["true"]}])
    );
    let pod_labels =
        &object(&docs, "Deployment", "edge-tolerable")["spec"]["template"]["metadata"]["labels"];
    assert_eq!(pod_labels[tolerable::mutate::SKIP_KEY], "true");
    let service = object(&docs, "Service", "edge-tolerable");
    assert_eq!(hook["clientConfig"]["service"]["name"], "edge-tolerable");
    assert_eq!(hook["clientConfig"]["service"]["namespace"], "infra");
    assert_eq!(
        hook["clientConfig"]["service"]["port"],
        service["spec"]["ports"][0]["port"]
    );
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&pod_labels[key], value, "the Service selects the Pods");
    }
    let certificate = object(&docs, "Certificate", "edge-tolerable-tls");
    assert_eq!(
        mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "infra/edge-tolerable-tls"
    );
    assert_eq!(
        certificate["spec"]["dnsNames"][0],
        "edge-tolerable.infra.svc"
    );
    let pod = deployment_pod(&docs, "edge-tolerable");
    let tls = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "tls")
        .unwrap();
    assert_eq!(
        tls["secret"]["secretName"],
        certificate["spec"]["secretName"]
    );
    the_values_reach_the_pod(&docs, &notes);
}

/// What the switched values set for the Pod, its NetworkPolicy and NOTES.txt is there.
fn the_values_reach_the_pod(docs: &[Value], notes: &str) {
    let pod = deployment_pod(docs, "edge-tolerable");
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"],
        format!(
            "registry.example.com/platform/tolerable@sha256:{}",
            "ab".repeat(32)
        )
    );
    let env = container["env"].as_array().unwrap();
    assert!(
        env.contains(&json!({"name": "TOLERABLE_SHARED_CACHE__PASSWORD",
               "valueFrom": {"secretKeyRef": {"name": "valkey-auth", "key": "password"}}}))
    );
    // The values' own variables come last, so they override the chart's.
    assert_eq!(
        env.last().unwrap(),
        &json!({"name": "TOLERABLE_LOG__LEVEL", "value": "debug"})
    );
    assert_eq!(pod["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    let policy = object(docs, "NetworkPolicy", "edge-tolerable");
    // The peers given, and `helm test`'s Pod.
    let test_pod = object(docs, "Pod", "edge-tolerable-test-readyz");
    let test_labels = &test_pod["metadata"]["labels"];
    let from = policy["spec"]["ingress"][0]["from"].as_array().unwrap();
    assert_eq!(from[0], json!({"ipBlock": {"cidr": "10.0.0.0/16"}}));
    for (key, value) in from[1]["podSelector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&test_labels[key], value, "{key}");
    }
    assert!(
        notes.contains("kubectl -n infra rollout status deploy/edge-tolerable"),
        "{notes}"
    );
    assert!(
        notes.contains("infra, kube-system, istio-system, batch"),
        "{notes}"
    );
}

/// `kubernetes-validate --strict` passes `yaml` at both ends of the supported range.
fn validates_against_kubernetes(yaml: &str) {
    let file = write_temp(yaml);
    for version in KUBERNETES_VERSIONS {
        let out = tools::command("kubernetes-validate")
            .args(["--strict", "--no-warn", "--kubernetes-version", version])
            .arg(file.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "Kubernetes {version}:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// A base64 field of a rendered object, decoded, in a file.
fn decoded(object: &Value, pointer: &str) -> tempfile::NamedTempFile {
    use base64::Engine as _;
    let text = object.pointer(pointer).and_then(Value::as_str).unwrap();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap();
    write_temp(std::str::from_utf8(&bytes).unwrap())
}

/// `openssl verify`: whether `ca` verifies `cert` as a TLS server certificate for `host`.
fn openssl_verifies(ca: &std::path::Path, cert: &std::path::Path, host: &str) -> bool {
    let out = std::process::Command::new("openssl")
        .args([
            "verify",
            "-purpose",
            "sslserver",
            "-verify_hostname",
            host,
            "-CAfile",
        ])
        .arg(ca)
        .arg(cert)
        .output()
        .expect("openssl (scripts/install-test-deps.sh installs it)");
    out.status.success()
}

/// Certificates made by Helm: one CA is both the webhook's caBundle and the signer of the
/// serving certificate (openssl verifies it for the Service's name; another render's CA does
/// not), the Secret is the one the Pods mount, and nothing of cert-manager is rendered.
#[test]
fn helm_made_certificates_verify() {
    let values = json!({"certificates": {"mode": "helm"}});
    let yaml = render(&values, "edge", "infra").0;
    validates_against_kubernetes(&yaml);
    let docs = tools::documents(&yaml);
    assert!(!docs.iter().any(|d| d["apiVersion"] == "cert-manager.io/v1"));
    let secret = object(&docs, "Secret", "edge-tolerable-tls");
    assert_eq!(secret["type"], "kubernetes.io/tls");
    let mwc = object(&docs, "MutatingWebhookConfiguration", "edge-tolerable");
    assert!(
        mwc["metadata"].get("annotations").is_none(),
        "no inject-ca-from"
    );
    let hook = &mwc["webhooks"][0];
    assert_eq!(hook["clientConfig"]["caBundle"], secret["data"]["ca.crt"]);
    let pod = deployment_pod(&docs, "edge-tolerable");
    let tls = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "tls");
    assert_eq!(tls.unwrap()["secret"]["secretName"], "edge-tolerable-tls");
    let ca = decoded(hook, "/clientConfig/caBundle");
    let cert = decoded(secret, "/data/tls.crt");
    let key = decoded(secret, "/data/tls.key");
    assert!(std::fs::read_to_string(key.path())
        .unwrap()
        .contains("PRIVATE KEY"));
    assert!(openssl_verifies(
        ca.path(),
        cert.path(),
        "edge-tolerable.infra.svc"
    ));
    assert!(!openssl_verifies(ca.path(), cert.path(), "other.infra.svc"));
    let other = tools::documents(&render(&values, "edge", "infra").0);
    let other_ca = decoded(
        object(&other, "Secret", "edge-tolerable-tls"),
        "/data/ca.crt",
    );
    assert!(!openssl_verifies(
        other_ca.path(),
        cert.path(),
        "edge-tolerable.infra.svc"
    ));
}

/// Certificates from an existing Secret: the Pods mount it, the webhook trusts the CA given,
/// nothing else is made; without the CA the chart refuses to render, naming the value.
#[test]
fn certificates_from_an_existing_secret() {
    let ca = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==";
    let values = json!({"certificates": {"mode": "existingSecret",
                                         "existingSecret": {"name": "my-tls", "caBundle": ca}}});
    let yaml = render(&values, "tolerable", "tolerable-system").0;
    validates_against_kubernetes(&yaml);
    let docs = tools::documents(&yaml);
    assert!(!docs
        .iter()
        .any(|d| d["apiVersion"] == "cert-manager.io/v1" || d["kind"] == "Secret"));
    let mwc = object(&docs, "MutatingWebhookConfiguration", "tolerable");
    assert_eq!(mwc["webhooks"][0]["clientConfig"]["caBundle"], ca);
    let pod = deployment_pod(&docs, "tolerable");
    let tls = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "tls");
    assert_eq!(tls.unwrap()["secret"]["secretName"], "my-tls");
    load_rendered_config(&docs, "tolerable").unwrap();
    let without_ca = json!({"certificates": {"mode": "existingSecret",
                                             "existingSecret": {"name": "my-tls"}}});
    let why = try_render(&without_ca, "tolerable", "tolerable-system").unwrap_err();
    assert!(
        why.contains("certificates.existingSecret.caBundle"),
        "{why}"
    );
    let typo = json!({"certificates": {"mode": "self-signed"}});
    assert!(schema_accepts(&typo).unwrap_err().contains("mode"));
}

/// `helm test`'s Pod asks /readyz of the webhook through its Service, trusting the CA the webhook
/// is served with: the cert-manager (or Helm-made) Secret's ca.crt, or the caBundle given with
/// an existing Secret; it runs as locked down as tolerable.
#[test]
fn the_helm_test_asks_readyz_through_the_service() {
    for values in [
        json!({}),
        json!({"certificates": {"mode": "helm"}}),
        json!({"certificates": {"mode": "existingSecret",
               "existingSecret": {"name": "my-tls", "caBundle": "LS0tLS0K"}}}),
    ] {
        let docs = tools::documents(&render(&values, "tolerable", "tolerable-system").0);
        let pod = object(&docs, "Pod", "tolerable-test-readyz");
        assert_eq!(pod["metadata"]["annotations"]["helm.sh/hook"], "test");
        let container = &pod["spec"]["containers"][0];
        let args: Vec<&str> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let service = object(&docs, "Service", "tolerable");
        let url = format!(
            "https://tolerable.tolerable-system.svc:{}/readyz",
            service["spec"]["ports"][0]["port"]
        );
        assert_eq!(args.last(), Some(&url.as_str()), "{values}");
        assert!(args.contains(&"--fail"), "{args:?}");
        let cacert = args[args.iter().position(|a| *a == "--cacert").unwrap() + 1];
        let mount = &container["volumeMounts"][0];
        assert_eq!(
            format!("{}/ca.crt", mount["mountPath"].as_str().unwrap()),
            cacert
        );
        let volume = &pod["spec"]["volumes"][0];
        let tls = deployment_pod(&docs, "tolerable")["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "tls")
            .cloned()
            .unwrap();
        match volume["configMap"]["name"].as_str() {
            Some(name) => assert_eq!(
                object(&docs, "ConfigMap", name)["data"]["ca.crt"],
                "-----\n"
            ),
            None => {
                assert_eq!(volume["secret"]["secretName"], tls["secret"]["secretName"]);
                assert_eq!(volume["secret"]["items"][0]["key"], "ca.crt");
            }
        }
        assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true);
        assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
    }
}

/// The chart packaged and pushed as an OCI artifact to a real registry (Debian's
/// docker-registry on 127.0.0.1), as `helm push` publishes a release, then pulled back with
/// `helm pull`: the pulled chart renders exactly what the checkout does, schema included.
#[test]
fn the_chart_round_trips_through_an_oci_registry() {
    let registry = common::registry::Registry::start(common::registry::Mode::Plain);
    let work = tempfile::tempdir().unwrap();
    let out = tools::python_script("helm-chart.py")
        .arg("publish")
        .arg(tools::root().join(CHART))
        .arg(format!("oci://{}/charts", registry.host))
        .arg(work.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm package/push/pull: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let version = env!("CARGO_PKG_VERSION");
    let log = registry.log();
    assert!(
        log.contains(&format!("PUT /v2/charts/tolerable/manifests/{version}")),
        "no chart manifest pushed:\n{log}"
    );
    let pulled = work.path().join("pulled/tolerable");
    for values in [json!({}), switched_values()] {
        assert_eq!(
            try_render_chart(&pulled, &values, "tolerable", "tolerable-system").unwrap(),
            render(&values, "tolerable", "tolerable-system"),
            "{values}"
        );
    }
    let typo = json!({"image": {"tga": "v1"}});
    assert!(try_render_chart(&pulled, &typo, "tolerable", "tolerable-system").is_err());
}

/// The RBAC objects of `docs` and what they grant to whom, labels aside.
fn rbac_of(docs: &[Value]) -> BTreeSet<String> {
    // `helm test`'s own (its check's ServiceAccount) exist only while the test runs.
    docs.iter()
        .filter(|d| d["apiVersion"] == "rbac.authorization.k8s.io/v1")
        .filter(|d| d["metadata"]["annotations"]["helm.sh/hook"].is_null())
        .map(|d| {
            json!({"kind": d["kind"], "name": d["metadata"]["name"],
                   "namespace": d["metadata"]["namespace"], "rules": d["rules"],
                   "roleRef": d["roleRef"], "subjects": d["subjects"]})
            .to_string()
        })
        .collect()
}

/// For each RBAC variant — pull secrets per namespace, node tainting, no API access, gates, owner
/// Events, the crash watch — the config the chart renders enables exactly what its roles grant
/// (kustomize renders the same objects: tests/project/kustomize.rs).
#[test]
fn the_charts_rbac_grants_what_its_config_enables() {
    for values in [
        json!({"rbac": {"pullSecretNamespaces": ["team-a", "team-b"]}}),
        json!({"config": {"nodes": {"manage_taints": true}}}),
        no_api_values(),
        json!({"config": {"policy": {"on_lookup_failure": "gate"}}}),
        json!({"config": {"events": {"on_admission": true}}}),
        json!({"config": {"crashes": {"watch": true}}}),
        json!({"config": {"crashes": {"watch": true, "heal": true}}}),
    ] {
        let chart = tools::documents(&render(&values, "tolerable", "tolerable-system").0);
        let config = load_rendered_config(&chart, "tolerable").unwrap();
        let granted = |name: &str| rbac_of(&chart).iter().any(|r| r.contains(name));
        let pull_secrets = granted("tolerable-pull-secrets");
        assert_eq!(config.read_pull_secrets, pull_secrets, "{values}");
        assert_eq!(
            config.watch_nodes,
            granted("\"tolerable-nodes\""),
            "{values}"
        );
        assert_eq!(config.manage_node_taints, granted("tolerable-node-taints"));
        assert_eq!(config.namespace_policy, granted("tolerable-namespaces"));
        assert_eq!(config.events_on_admission, granted("tolerable-events"));
        assert_eq!(config.crash_watch, granted("tolerable-crash-watch"));
        assert_eq!(config.crash_heal, granted("tolerable-crash-heal"));
    }
}

/// Registry credential files: by default the release's own Secret, mounted when it exists; an
/// existing Secret named in the values is mounted (and must exist) instead.
#[test]
fn registry_credentials_come_from_a_secret() {
    let creds = |values: &Value| {
        let docs = tools::documents(&render(values, "tolerable", "tolerable-system").0);
        let pod = deployment_pod(&docs, "tolerable");
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "registry-creds")
            .cloned()
            .unwrap();
        load_rendered_config(&docs, "tolerable").unwrap();
        volume["secret"].clone()
    };
    assert_eq!(
        creds(&json!({})),
        json!({"secretName": "tolerable-registry-creds", "optional": true})
    );
    assert_eq!(
        creds(&json!({"registryCredentials": {"existingSecret": "registry-logins"}})),
        json!({"secretName": "registry-logins"})
    );
    let values = json!({"registryCredentials": {"dockerConfigSecret": "pull-secret"}});
    let docs = tools::documents(&render(&values, "tolerable", "tolerable-system").0);
    let volume = deployment_pod(&docs, "tolerable")["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "docker-config")
        .cloned()
        .expect("the Docker config's volume");
    assert_eq!(volume["secret"]["secretName"], "pull-secret");
    load_rendered_config(&docs, "tolerable").unwrap();
}

/// The monitoring values render a PodMonitor (with its labels, selecting tolerable's Pods), a
/// PrometheusRule and a Grafana dashboard, valid against prometheus-operator's models; the rule
/// refuses to render without a runbook URL, and the defaults render none of them (kustomize's
/// monitoring component renders the same objects: tests/project/kustomize.rs).
#[test]
fn monitoring_values_render_valid_objects() {
    let values = json!({"monitoring": {
        "podMonitor": {"enabled": true, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": true, "runbookBaseUrl": "https://docs.example/runbooks"},
        "dashboard": {"enabled": true}}});
    let yaml = render(&values, "tolerable", "tolerable-system").0;
    validates_against_kubernetes(&yaml);
    let out = tools::python_script("validate-custom-resources.py")
        .arg(write_temp(&yaml).path())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{report}");
    assert!(
        report.contains("OK PodMonitor/tolerable")
            && report.contains("OK PrometheusRule/tolerable")
    );
    let chart = tools::documents(&yaml);
    let ours = object(&chart, "PodMonitor", "tolerable");
    assert_eq!(
        ours["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    let pod_labels =
        &object(&chart, "Deployment", "tolerable")["spec"]["template"]["metadata"]["labels"];
    for (key, value) in ours["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&pod_labels[key], value, "the PodMonitor selects the Pods");
    }
    let rule = object(&chart, "PrometheusRule", "tolerable");
    let url = rule["spec"]["groups"][0]["rules"][0]["annotations"]["runbook_url"].as_str();
    assert!(url.unwrap().starts_with("https://docs.example/runbooks/"));
    let dashboard = object(&chart, "ConfigMap", "tolerable-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");

    let without_url = json!({"monitoring": {"prometheusRule": {"enabled": true}}});
    let why = try_render(&without_url, "tolerable", "tolerable-system").unwrap_err();
    assert!(
        why.contains("monitoring.prometheusRule.runbookBaseUrl"),
        "{why}"
    );
    assert!(!render_defaults()
        .iter()
        .any(|d| d["apiVersion"] == "monitoring.coreos.com/v1"));
}

/// Credential provider plugins, the nodes' own or built into the image with their config in a
/// ConfigMap: the objects validate and the config loads with them; both at once is refused
/// (kustomize's components render the same objects: tests/project/kustomize.rs).
#[test]
fn credential_provider_values_render_and_load() {
    let provider_config = std::fs::read_to_string(
        tools::root()
            .join("kustomize/components/credential-provider-image/credential-providers.yaml"),
    )
    .unwrap();
    for values in [
        json!({"credentialProviders": {"node": {"enabled": true}}}),
        json!({"credentialProviders": {"image": {"enabled": true, "config": provider_config}}}),
    ] {
        let yaml = render(&values, "tolerable", "tolerable-system").0;
        validates_against_kubernetes(&yaml);
        let chart = tools::documents(&yaml);
        load_rendered_config(&chart, "tolerable").unwrap();
    }
    let both = json!({"credentialProviders": {"node": {"enabled": true},
                                              "image": {"enabled": true, "config": "x"}}});
    let why = try_render(&both, "tolerable", "tolerable-system").unwrap_err();
    assert!(why.contains("cannot both be enabled"), "{why}");
}

/// The version is the crate's, everywhere an operator reads one: the chart's `version` and
/// `appVersion`, every image tag of tolerable in the README, the docs, the kustomizations and
/// the chart (`v<version>`), and the newest CHANGELOG.md entry.
#[test]
fn the_version_is_the_crates_everywhere() {
    let version = env!("CARGO_PKG_VERSION");
    let chart: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(tools::root().join(CHART).join("Chart.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(chart["version"], version);
    assert_eq!(chart["appVersion"], version);
    let tag = format!("v{version}");
    let mut files = vec![tools::root().join("README.md")];
    for dir in ["docs", "kustomize", CHART] {
        files.extend(files_under(&tools::root().join(dir)));
    }
    let mut checked = 0;
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (at, _) in text
            .match_indices("/tolerable:")
            .chain(text.match_indices("/tolerable-ecr:"))
        {
            let rest = &text[at..];
            let found = rest[rest.find(':').unwrap() + 1..]
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-'))
                .next()
                .unwrap();
            if found.starts_with(|c: char| c.is_ascii_digit() || c == 'v') {
                assert_eq!(found, tag, "{}: image tag {found}", file.display());
                checked += 1;
            }
        }
    }
    // A floor that catches a scan that finds nothing (the mentions are README's build line,
    // install.md's, cloud-registries.md's and the base's image; the example overlay no longer
    // says `kustomize edit set image`).
    assert!(checked >= 7, "only {checked} image tags found");
    let readme = std::fs::read_to_string(tools::root().join("README.md")).unwrap();
    for pinned in [
        format!("tolerable-{version}.tgz"),
        format!("--version {version}"),
        format!("?ref=v{version}"),
    ] {
        assert!(readme.contains(&pinned), "README.md lacks {pinned}");
    }
    let changelog = std::fs::read_to_string(tools::root().join("CHANGELOG.md")).unwrap();
    let newest = changelog.lines().find(|l| l.starts_with("## ")).unwrap();
    assert!(newest.starts_with(&format!("## {version} ")), "{newest}");
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// The ServiceMonitor alternative: a Service of the metrics port that selects tolerable's Pods
/// and reaches their metrics port, a ServiceMonitor that selects that Service alone (not the
/// webhook's) with kustomize's PodMonitor's endpoint and job label, valid for
/// prometheus-operator; never both monitors at once.
#[test]
fn the_service_monitor_scrapes_the_metrics_port() {
    let values = json!({"monitoring": {"serviceMonitor": {"enabled": true}}});
    let yaml = render(&values, "tolerable", "tolerable-system").0;
    validates_against_kubernetes(&yaml);
    let out = tools::python_script("validate-custom-resources.py")
        .arg(write_temp(&yaml).path())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && report.contains("OK ServiceMonitor/tolerable"),
        "{report}"
    );
    let docs = tools::documents(&yaml);
    let service = object(&docs, "Service", "tolerable-metrics");
    let pod = deployment_pod(&docs, "tolerable");
    let metrics = pod["containers"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics")
        .unwrap();
    assert_eq!(service["spec"]["ports"][0]["targetPort"], metrics["name"]);
    let pod_labels =
        &object(&docs, "Deployment", "tolerable")["spec"]["template"]["metadata"]["labels"];
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(
            &pod_labels[key], value,
            "the metrics Service selects the Pods"
        );
    }
    let monitor = object(&docs, "ServiceMonitor", "tolerable");
    let selects = |svc: &Value| {
        monitor["spec"]["selector"]["matchLabels"]
            .as_object()
            .unwrap()
            .iter()
            .all(|(k, v)| &svc["metadata"]["labels"][k] == v)
    };
    assert!(selects(service));
    assert!(
        !selects(object(&docs, "Service", "tolerable")),
        "not the webhook's Service"
    );
    let kustomize = tools::documents(&tools::render("kustomize/overlays/monitoring"));
    let pod_monitor = object(&kustomize, "PodMonitor", "tolerable");
    assert_eq!(
        monitor["spec"]["endpoints"],
        pod_monitor["spec"]["podMetricsEndpoints"]
    );
    assert_eq!(monitor["spec"]["jobLabel"], pod_monitor["spec"]["jobLabel"]);
    assert_eq!(
        service["metadata"]["labels"]["app.kubernetes.io/name"],
        "tolerable"
    );
    let both = json!({"monitoring": {"serviceMonitor": {"enabled": true},
                                     "podMonitor": {"enabled": true}}});
    let why = try_render(&both, "tolerable", "tolerable-system").unwrap_err();
    assert!(why.contains("not both"), "{why}");
}

/// The chart's own Valkey: its Pods are never sent through tolerable, its Service selects them,
/// it is reachable from tolerable's Pods alone, and the rendered config's `[shared_cache] url`
/// names its Service (kustomize's shared-cache component renders the same objects:
/// tests/project/kustomize.rs).
#[test]
fn the_charts_valkey_is_reachable_by_tolerable_alone() {
    let values = json!({"sharedCache": {"valkey": {"enabled": true}}});
    let yaml = render(&values, "tolerable", "tolerable-system").0;
    validates_against_kubernetes(&yaml);
    let chart = tools::documents(&yaml);
    let service = object(&chart, "Service", "tolerable-valkey");
    let valkey_labels =
        &object(&chart, "Deployment", "tolerable-valkey")["spec"]["template"]["metadata"]["labels"];
    assert_eq!(valkey_labels[tolerable::mutate::SKIP_KEY], "true");
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&valkey_labels[key], value, "the Service selects Valkey");
    }
    valkey_admits_tolerable_alone(&chart, valkey_labels);
    let config = load_rendered_config(&chart, "tolerable").unwrap();
    let url = config
        .resolver
        .shared_cache
        .clone()
        .expect("[shared_cache] url")
        .url()
        .to_owned();
    assert_eq!(
        url,
        format!(
            "redis://tolerable-valkey.tolerable-system.svc:{}/0",
            service["spec"]["ports"][0]["port"]
        )
    );
}

/// The chart's Valkey NetworkPolicy: tolerable's Pods alone may connect, on Valkey's port, and
/// Valkey reaches nothing.
fn valkey_admits_tolerable_alone(chart: &[Value], valkey_labels: &Value) {
    let policy = object(chart, "NetworkPolicy", "tolerable-valkey");
    assert_eq!(
        policy["spec"]["policyTypes"],
        json!(["Ingress", "Egress"]),
        "egress denied"
    );
    assert!(
        policy["spec"].get("egress").is_none(),
        "Valkey reaches nothing"
    );
    let ingress = &policy["spec"]["ingress"];
    assert_eq!(ingress.as_array().unwrap().len(), 1);
    let port = &object(chart, "Service", "tolerable-valkey")["spec"]["ports"][0]["targetPort"];
    assert_eq!(ingress[0]["ports"][0]["port"], *port);
    let tolerable_pods =
        &object(chart, "Deployment", "tolerable")["spec"]["template"]["metadata"]["labels"];
    let peer = ingress[0]["from"][0]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap();
    assert!(
        peer.iter().all(|(k, v)| &tolerable_pods[k] == v),
        "the peer is tolerable's Pods"
    );
    assert!(
        peer.iter().any(|(k, v)| valkey_labels[k] != *v),
        "not Valkey itself"
    );
}

/// The webhook's deadline leaves room for a lookup, with the defaults and with the values that
/// change both (the server keeps a fifth, at least 300 ms, back: `tolerable::budget`).
#[test]
fn lookups_fit_the_webhooks_timeout() {
    for (values, name, namespace, fullname) in [
        (json!({}), "tolerable", "tolerable-system", "tolerable"),
        (switched_values(), "edge", "infra", "edge-tolerable"),
    ] {
        let docs = tools::documents(&render(&values, name, namespace).0);
        let hook = &object(&docs, "MutatingWebhookConfiguration", fullname)["webhooks"][0];
        let timeout = hook["timeoutSeconds"].as_u64().unwrap();
        let budget = tolerable::budget::for_query(Some(&format!("timeout={timeout}s")));
        let config = load_rendered_config(&docs, fullname).unwrap();
        assert!(
            config.resolver.lookup_timeout <= budget,
            "{values}: lookup_timeout {:?} does not fit timeoutSeconds {timeout} ({budget:?})",
            config.resolver.lookup_timeout
        );
    }
}

/// A PodDisruptionBudget that no drain could satisfy is refused, not rendered; the one
/// rendered lets a drain evict a Pod that is not ready.
#[test]
fn the_disruption_budget_never_blocks_a_drain() {
    let defaults = render_defaults();
    let pdb = object(&defaults, "PodDisruptionBudget", "tolerable");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    for replicas in [0, 1] {
        let why = try_render(
            &json!({"replicas": replicas}),
            "tolerable",
            "tolerable-system",
        )
        .expect_err("a budget of 1 with fewer than 2 replicas");
        assert!(
            why.contains(&format!(
                "podDisruptionBudget.minAvailable (1) keeps 1 of {replicas} replicas"
            )),
            "{why}"
        );
    }
    let single = json!({"replicas": 1, "podDisruptionBudget": {"enabled": false}});
    let docs = tools::documents(&render(&single, "tolerable", "tolerable-system").0);
    assert!(!docs.iter().any(|d| d["kind"] == "PodDisruptionBudget"));
    percentages_are_counted_as_the_disruption_controller_does();
}

/// Percentages (rounded up, as the disruption controller does) and maxUnavailable: refused when
/// they keep every replica, rendered as given otherwise; the two fields together are refused.
fn percentages_are_counted_as_the_disruption_controller_does() {
    let budget = |replicas: u32, pdb: Value| {
        let values = json!({"replicas": replicas, "podDisruptionBudget": pdb});
        try_render(&values, "tolerable", "tolerable-system").map(|(yaml, _)| {
            object(&tools::documents(&yaml), "PodDisruptionBudget", "tolerable")["spec"].clone()
        })
    };
    for (replicas, pdb, kept) in [
        (2, json!({"minAvailable": "51%"}), 2),
        (3, json!({"minAvailable": "100%"}), 3),
        (2, json!({"minAvailable": null, "maxUnavailable": 0}), 2),
        (4, json!({"minAvailable": null, "maxUnavailable": "0%"}), 4),
    ] {
        let why = budget(replicas, pdb.clone()).expect_err(&pdb.to_string());
        assert!(
            why.contains(&format!("keeps {kept} of {replicas} replicas")),
            "{pdb}: {why}"
        );
    }
    for (replicas, pdb, field, value) in [
        (
            2,
            json!({"minAvailable": "50%"}),
            "minAvailable",
            json!("50%"),
        ),
        (
            2,
            json!({"minAvailable": null, "maxUnavailable": "10%"}),
            "maxUnavailable",
            json!("10%"),
        ),
        (
            3,
            json!({"minAvailable": null, "maxUnavailable": 1}),
            "maxUnavailable",
            json!(1),
        ),
    ] {
        let spec = budget(replicas, pdb.clone()).unwrap_or_else(|why| panic!("{pdb}: {why}"));
        assert_eq!(spec[field], value, "{pdb}");
        assert_eq!(
            spec.as_object().unwrap().len(),
            3,
            "one of the two fields: {spec}"
        );
    }
    let both = budget(3, json!({"minAvailable": 1, "maxUnavailable": 1})).unwrap_err();
    assert!(both.contains("not both"), "{both}");
    let typo = budget(3, json!({"minAvailable": "50 percent"})).unwrap_err();
    assert!(typo.contains("minAvailable"), "{typo}");
}

/// Every Service name stays within Kubernetes' 63 characters and the CA's common name within
/// cert-manager's 64, however long the release's name.
#[test]
fn long_release_names_keep_names_within_their_limits() {
    let release = format!("platform-{}", "x".repeat(44));
    assert_eq!(release.len(), 53, "Helm's longest release name");
    let values = json!({
        "monitoring": {"serviceMonitor": {"enabled": true}},
        "sharedCache": {"valkey": {"enabled": true}},
        "config": {"server": {"metrics_addr": "0.0.0.0:9090"}}
    });
    let docs = tools::documents(&render(&values, &release, "tolerable-system").0);
    let services: Vec<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "Service")
        .map(|d| d["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(services.len(), 3, "{services:?}");
    for name in &services {
        assert!(name.len() <= 63, "{name} is {} characters", name.len());
    }
    for certificate in docs.iter().filter(|d| d["kind"] == "Certificate") {
        if let Some(common_name) = certificate["spec"]["commonName"].as_str() {
            assert!(common_name.len() <= 64, "{common_name}");
        }
    }
}

/// The Valkey the chart runs asks for the password tolerable sends, from the same Secret: the
/// one named in the values, else one the chart generates (40 random characters), with
/// protected mode on either way.
#[test]
fn the_bundled_valkey_takes_the_password_tolerable_sends() {
    let secret = json!({"name": "valkey-auth", "key": "secret"});
    let values = json!({"sharedCache": {"valkey": {"enabled": true}, "passwordSecret": secret}});
    let docs = tools::documents(&render(&values, "tolerable", "tolerable-system").0);
    let valkey = &deployment_pod(&docs, "tolerable-valkey")["containers"][0];
    let args: Vec<&str> = valkey["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let at = args
        .iter()
        .position(|a| *a == "--requirepass")
        .expect("--requirepass");
    assert_eq!(args[at + 1], "$(VALKEY_PASSWORD)");
    let from = |container: &Value, variable: &str| {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == variable)
            .unwrap()["valueFrom"]["secretKeyRef"]
            .clone()
    };
    let tolerable = &deployment_pod(&docs, "tolerable")["containers"][0];
    assert_eq!(from(valkey, "VALKEY_PASSWORD"), secret);
    assert_eq!(from(tolerable, "TOLERABLE_SHARED_CACHE__PASSWORD"), secret);
    // Without a password neither asks for one.
    let docs = tools::documents(
        &render(
            &json!({"sharedCache": {"valkey": {"enabled": true}}}),
            "tolerable",
            "tolerable-system",
        )
        .0,
    );
    let generated = json!({"name": "tolerable-valkey", "key": "password"});
    let valkey = &deployment_pod(&docs, "tolerable-valkey")["containers"][0];
    let tolerable = &deployment_pod(&docs, "tolerable")["containers"][0];
    assert_eq!(from(valkey, "VALKEY_PASSWORD"), generated);
    assert_eq!(
        from(tolerable, "TOLERABLE_SHARED_CACHE__PASSWORD"),
        generated
    );
    assert!(valkey["args"]
        .to_string()
        .contains(r#""--protected-mode","yes""#));
    let password = object(&docs, "Secret", "tolerable-valkey")["data"]["password"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(base64_len(&password), 40, "{password}");
}

/// How many bytes a base64 text decodes to.
fn base64_len(text: &str) -> usize {
    text.len() / 4 * 3 - text.chars().rev().take_while(|c| *c == '=').count()
}

/// Alerts and the dashboard select job="tolerable": the scrape sets it whatever nameOverride
/// makes of the Pods' name label; null dashboard labels render nothing rather than `null`.
#[test]
fn monitoring_survives_name_overrides_and_empty_labels() {
    for monitor in ["podMonitor", "serviceMonitor"] {
        let values = json!({
            "nameOverride": "archguard",
            "config": {"server": {"metrics_addr": "0.0.0.0:9090"}},
            "monitoring": {monitor: {"enabled": true}, "dashboard": {"enabled": true, "labels": null}}
        });
        let docs = tools::documents(&render(&values, "tolerable", "tolerable-system").0);
        let (kind, endpoints) = match monitor {
            "podMonitor" => ("PodMonitor", "podMetricsEndpoints"),
            _ => ("ServiceMonitor", "endpoints"),
        };
        let scrape = docs.iter().find(|d| d["kind"] == kind).unwrap();
        assert_eq!(
            scrape["spec"][endpoints][0]["relabelings"],
            json!([{"action": "replace", "targetLabel": "job", "replacement": "tolerable"}]),
            "{scrape}"
        );
        let dashboard = docs
            .iter()
            .find(|d| {
                d["kind"] == "ConfigMap" && d["metadata"]["name"] == "tolerable-archguard-dashboard"
            })
            .unwrap();
        assert!(dashboard["metadata"]["labels"].is_object(), "{dashboard}");
    }
}

/// tolerable reads its credential providers' config only at start: a changed config rolls the
/// Pods. The `helm test` Pod is placed as tolerable's Pods are.
#[test]
fn a_changed_provider_config_rolls_the_pods_and_the_test_pod_is_placed_like_them() {
    let checksum = |config: &str| {
        let values = json!({"credentialProviders": {"image": {"enabled": true, "config": config}},
                            "nodeSelector": {"pool": "system"}});
        let docs = tools::documents(&render(&values, "tolerable", "tolerable-system").0);
        let test_pod = docs.iter().find(|d| d["kind"] == "Pod").unwrap();
        assert_eq!(test_pod["spec"]["nodeSelector"], json!({"pool": "system"}));
        object(&docs, "Deployment", "tolerable")["spec"]["template"]["metadata"]["annotations"]
            ["checksum/credential-providers"]
            .as_str()
            .expect("a checksum of the providers' config")
            .to_owned()
    };
    let ecr =
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders: []\n";
    let other = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: CredentialProviderConfig\nproviders: []\n";
    assert_ne!(checksum(ecr), checksum(other));
}

/// webhook.annotations and webhook.labels reach the MutatingWebhookConfiguration beside the
/// chart's own (cert-manager's injection kept); its matchConditions are kustomize/base's by
/// default (each Pod kind tolerable leaves alone named), replaced by the values', and absent
/// when the values empty them.
#[test]
fn the_webhook_takes_annotations_labels_and_match_conditions() {
    let kustomize = tools::documents(&tools::render("kustomize"));
    let theirs = &object(&kustomize, "MutatingWebhookConfiguration", "tolerable")["webhooks"][0];
    let defaults = render_defaults();
    let ours = &object(&defaults, "MutatingWebhookConfiguration", "tolerable")["webhooks"][0];
    assert_eq!(ours["matchConditions"], theirs["matchConditions"]);
    let conditions = ours["matchConditions"].to_string();
    for needle in [
        tolerable::mutate::SKIP_KEY,
        "kubernetes.io/config.mirror",
        "tolerable.io/decision",
    ] {
        assert!(conditions.contains(needle), "{needle}: {conditions}");
    }
    let own =
        json!([{"name": "not-kube-public", "expression": "request.namespace != 'kube-public'"}]);
    let values = json!({"webhook": {
        "annotations": {"example.com/owner": "platform"},
        "labels": {"admissions.enforcer/disabled": "true"},
        "matchConditions": own,
    }});
    let docs = tools::documents(&render(&values, "tolerable", "tolerable-system").0);
    let mwc = object(&docs, "MutatingWebhookConfiguration", "tolerable");
    let metadata = &mwc["metadata"];
    assert_eq!(metadata["labels"]["admissions.enforcer/disabled"], "true");
    assert_eq!(metadata["labels"]["app.kubernetes.io/name"], "tolerable");
    assert_eq!(metadata["annotations"]["example.com/owner"], "platform");
    assert_eq!(
        metadata["annotations"]["cert-manager.io/inject-ca-from"],
        "tolerable-system/tolerable-tls"
    );
    assert_eq!(mwc["webhooks"][0]["matchConditions"], own);
    let none = json!({"webhook": {"matchConditions": []}});
    let docs = tools::documents(&render(&none, "tolerable", "tolerable-system").0);
    let hook = &object(&docs, "MutatingWebhookConfiguration", "tolerable")["webhooks"][0];
    assert!(hook.get("matchConditions").is_none(), "{hook}");
}

/// A podLabels key the chart sets itself (selector, part-of, the webhook's own opt-out) is
/// refused with the key named; another is added.
#[test]
fn pod_labels_cannot_replace_the_charts_own() {
    for key in [
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/component",
        tolerable::mutate::SKIP_KEY,
    ] {
        let values = json!({"podLabels": {key: "mine"}});
        let why = try_render(&values, "tolerable", "tolerable-system").expect_err(key);
        assert!(
            why.contains(&format!("podLabels.{key}: a label the chart sets itself")),
            "{why}"
        );
    }
    let values = json!({"podLabels": {"team": "platform"}});
    let docs = tools::documents(&render(&values, "tolerable", "tolerable-system").0);
    let labels =
        &object(&docs, "Deployment", "tolerable")["spec"]["template"]["metadata"]["labels"];
    assert_eq!(labels["team"], "platform");
    assert_eq!(labels[tolerable::mutate::SKIP_KEY], "true");
}

/// Gates: the rendered config gates, the releaser keeps its API token when nothing else needs
/// the API, the defaults grant no gates RBAC, and the leader election's Role and RoleBinding
/// live in the release's namespace (kustomize's gates component renders the same objects:
/// tests/project/kustomize.rs).
#[test]
fn gates_values_grant_the_releaser_in_the_releases_namespace() {
    let values = json!({"config": {"policy": {"on_lookup_failure": "gate"}}});
    let (yaml, _) = render(&values, "tolerable", "tolerable-system");
    validates_against_kubernetes(&yaml);
    let chart = tools::documents(&yaml);
    let config_map = object(&chart, "ConfigMap", "tolerable-config");
    let file: toml::Table = config_map["data"]["tolerable.toml"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(file["policy"]["on_lookup_failure"].as_str(), Some("gate"));
    let no_api_but_gates = json!({"config": {
        "credentials": {"read_pull_secrets": false},
        "nodes": {"watch": false},
        "policy": {"on_lookup_failure": "gate"},
    }});
    let only_gates =
        tools::documents(&render(&no_api_but_gates, "tolerable", "tolerable-system").0);
    assert_ne!(
        deployment_pod(&only_gates, "tolerable")["automountServiceAccountToken"],
        false,
        "the releaser needs the API token"
    );
    assert!(!rbac_of(&render_defaults())
        .iter()
        .any(|r| r.contains("tolerable-gates")));
    let elsewhere = tools::documents(&render(&values, "gatekeeper", "platform").0);
    for kind in ["Role", "RoleBinding"] {
        let object = object(
            &elsewhere,
            kind,
            "gatekeeper-tolerable-gates-leader-election",
        );
        assert_eq!(object["metadata"]["namespace"], "platform");
    }
    let binding = object(
        &elsewhere,
        "RoleBinding",
        "gatekeeper-tolerable-gates-leader-election",
    );
    assert_eq!(binding["subjects"][0]["namespace"], "platform");
}

/// The provider notes' values: GKE private clusters listen on 10250 (the container port and the
/// rendered config follow `config.server.listen_addr`), EKS with an overlay CNI runs on the
/// node's network with cluster DNS on 10260/10261, AKS labels the webhook out of the admissions
/// enforcer; a system priority class brings its ResourceQuota, another class or none does not.
#[test]
fn provider_values_put_the_webhook_where_the_control_plane_reaches_it() {
    let server = |listen: &str, metrics: &str| json!({"server": {"listen_addr": listen, "metrics_addr": metrics}});
    for (values, https, host_network) in [
        (
            json!({"config": server("0.0.0.0:10250", "0.0.0.0:9090")}),
            10250,
            false,
        ),
        (
            json!({"hostNetwork": true, "config": server("0.0.0.0:10260", "0.0.0.0:10261")}),
            10260,
            true,
        ),
    ] {
        let yaml = render(&values, "tolerable", "tolerable-system").0;
        validates_against_kubernetes(&yaml);
        let docs = tools::documents(&yaml);
        let config = load_rendered_config(&docs, "tolerable").unwrap();
        assert_eq!(config.listen_addr.port(), https);
        let pod = deployment_pod(&docs, "tolerable");
        let port = &pod["containers"][0]["ports"][0];
        assert_eq!(
            (port["name"].as_str(), port["containerPort"].as_u64()),
            (Some("https"), Some(u64::from(https)))
        );
        assert_eq!(pod["hostNetwork"].as_bool().unwrap_or(false), host_network);
        if host_network {
            assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
        }
    }
    let aks = json!({"webhook": {"labels": {"admissions.enforcer/disabled": "true"}}});
    let docs = tools::documents(&render(&aks, "tolerable", "tolerable-system").0);
    let labels = &object(&docs, "MutatingWebhookConfiguration", "tolerable")["metadata"]["labels"];
    assert_eq!(labels["admissions.enforcer/disabled"], "true");
    for (class, quota) in [
        ("system-node-critical", true),
        ("platform-high", false),
        ("", false),
    ] {
        let values = json!({"priorityClassName": class});
        let docs = tools::documents(&render(&values, "tolerable", "tolerable-system").0);
        let found = docs.iter().find(|d| d["kind"] == "ResourceQuota");
        assert_eq!(found.is_some(), quota, "{class}");
        if let Some(found) = found {
            assert_eq!(
                found["spec"]["scopeSelector"]["matchExpressions"][0]["values"],
                json!([class])
            );
        }
    }
}

/// With gates, `helm uninstall` first runs a pre-delete Job releasing every gated Pod with the
/// image's own binary (`gates release --all`), under the ServiceAccount the gates ClusterRole
/// is bound to (list and patch on Pods), never held by the webhook itself; without gates there
/// is no such hook.
#[test]
fn uninstalling_with_gates_releases_the_gated_pods_first() {
    let values = json!({"config": {"policy": {"on_lookup_failure": "gate"}}});
    let (yaml, _) = render(&values, "tolerable", "tolerable-system");
    validates_against_kubernetes(&yaml);
    let docs = tools::documents(&yaml);
    let job = object(&docs, "Job", "tolerable-release-gates");
    assert_eq!(job["metadata"]["annotations"]["helm.sh/hook"], "pre-delete");
    let template = &job["spec"]["template"];
    assert_eq!(
        template["metadata"]["labels"][tolerable::mutate::SKIP_KEY],
        "true"
    );
    let pod = &template["spec"];
    let container = &pod["containers"][0];
    assert_eq!(container["args"], json!(["gates", "release", "--all"]));
    assert_eq!(
        container["image"],
        deployment_pod(&docs, "tolerable")["containers"][0]["image"]
    );
    let account = pod["serviceAccountName"].as_str().unwrap();
    let binding = object(&docs, "ClusterRoleBinding", "tolerable-gates");
    assert_eq!(binding["subjects"][0]["name"], account);
    assert_eq!(binding["subjects"][0]["namespace"], "tolerable-system");
    let role = object(
        &docs,
        "ClusterRole",
        binding["roleRef"]["name"].as_str().unwrap(),
    );
    let pods_rule = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resources"] == json!(["pods"]))
        .expect("a rule on pods");
    for verb in ["list", "patch"] {
        assert!(
            pods_rule["verbs"]
                .as_array()
                .unwrap()
                .contains(&json!(verb)),
            "{verb}"
        );
    }
    assert!(!render_defaults().iter().any(|d| d["kind"] == "Job"));
}

/// `helm test` also runs the image's own `tolerable check` against this release's webhook
/// configuration in `test.check.namespace`, under a ServiceAccount allowed exactly that (create
/// Pods there, get this webhook configuration), all of it test hooks; the namespace is one the
/// webhook covers by default; `test.check.enabled=false` leaves it all out.
#[test]
fn the_helm_test_checks_the_webhook_as_the_api_server_calls_it() {
    let (yaml, _) = render(&json!({}), "edge", "infra");
    validates_against_kubernetes(&yaml);
    let docs = tools::documents(&yaml);
    let pod = object(&docs, "Pod", "edge-tolerable-test-check");
    assert_eq!(pod["metadata"]["annotations"]["helm.sh/hook"], "test");
    let container = &pod["spec"]["containers"][0];
    assert_eq!(
        container["args"],
        json!([
            "check",
            "-n",
            "default",
            "--webhook-configuration",
            "edge-tolerable"
        ])
    );
    assert_eq!(
        container["image"],
        deployment_pod(&docs, "edge-tolerable")["containers"][0]["image"]
    );
    object(&docs, "MutatingWebhookConfiguration", "edge-tolerable");
    let account = pod["spec"]["serviceAccountName"].as_str().unwrap();
    let role = object(&docs, "Role", account);
    assert_eq!(role["metadata"]["namespace"], "default");
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}])
    );
    let cluster_role = object(&docs, "ClusterRole", account);
    assert_eq!(
        cluster_role["rules"][0]["resourceNames"],
        json!(["edge-tolerable"])
    );
    assert_eq!(cluster_role["rules"][0]["verbs"], json!(["get"]));
    for kind in [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
    ] {
        assert_eq!(
            object(&docs, kind, account)["metadata"]["annotations"]["helm.sh/hook"],
            "test",
            "{kind}"
        );
    }
    let off = json!({"test": {"check": {"enabled": false}}});
    let docs = tools::documents(&render(&off, "edge", "infra").0);
    assert!(!docs
        .iter()
        .any(|d| d["metadata"]["name"] == "edge-tolerable-test-check"));
}

/// webhook.daemonSets adds the DaemonSets rule beside the Pods' one; the defaults have the Pods'
/// alone (kustomize's daemonsets component renders the same: tests/project/kustomize.rs).
#[test]
fn the_daemon_sets_value_adds_their_rule() {
    let rules = |docs: &[Value]| {
        object(docs, "MutatingWebhookConfiguration", "tolerable")["webhooks"][0]["rules"].clone()
    };
    let values = json!({"webhook": {"daemonSets": true}});
    let (yaml, _) = render(&values, "tolerable", "tolerable-system");
    validates_against_kubernetes(&yaml);
    let chart = tools::documents(&yaml);
    assert_eq!(rules(&chart).as_array().unwrap().len(), 2);
    assert_eq!(rules(&chart)[1]["resources"], json!(["daemonsets"]));
    assert_eq!(rules(&render_defaults()).as_array().unwrap().len(), 1);
}

/// install.md's way to render the chart without a helm binary, run as the page writes it (by
/// `sh`, from a directory laid out like the checkout: `.test-tools/`, `scripts/`, `charts/`):
/// the YAML `helm template` renders with the defaults.
#[test]
fn the_chart_renders_without_helm_as_install_md_says() {
    let page = std::fs::read_to_string(tools::root().join("docs/install.md")).unwrap();
    let command = crate::docs::shell_commands(&page)
        .into_iter()
        .map(|(_, command)| command)
        .find(|command| command.starts_with(".test-tools/bin/python3 scripts/helm-chart.py "))
        .expect("install.md renders the chart without helm");
    let checkout = tempfile::tempdir().unwrap();
    for name in [".test-tools", "scripts", "charts"] {
        std::os::unix::fs::symlink(tools::root().join(name), checkout.path().join(name)).unwrap();
    }
    let out = tools::command("sh")
        .args(["-ec", &command])
        .current_dir(checkout.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{command}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = std::fs::read_to_string(checkout.path().join("tolerable.yaml")).unwrap();
    assert_eq!(
        written,
        render(&json!({}), "tolerable", "tolerable-system").0
    );
    assert!(written.contains("kind: MutatingWebhookConfiguration\n"));
}
