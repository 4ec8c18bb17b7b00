//! The deployment: `kubectl kustomize` renders the base and the example overlay, the output
//! validates offline (Kubernetes schemas with `kubernetes-validate --strict`, cert-manager objects
//! against cert-manager's API models), the enum fields those schemas do not check are checked
//! here, and every name, port, path and secret that must agree across objects does.

use crate::common;

use std::path::{Path, PathBuf};

use common::deployed;
use common::tools::{self, write_temp};
use serde_json::Value;
use tolerable::config::Config;
use tolerable::mutate::OnLookupFailure;

const OVERLAYS: &[&str] = &[
    "kustomize",
    "kustomize/overlays/example",
    "kustomize/overlays/no-cluster-access",
    "kustomize/overlays/manage-node-taints",
    "kustomize/overlays/monitoring",
    "kustomize/overlays/shared-cache",
    "kustomize/overlays/namespaced-pull-secrets",
    "kustomize/overlays/node-credential-providers",
    "kustomize/overlays/credential-provider-image",
    "kustomize/overlays/gates",
    "kustomize/overlays/gke-private-cluster",
    "kustomize/overlays/eks-overlay-cni",
    "kustomize/overlays/aks",
    "kustomize/overlays/daemonsets",
    "kustomize/overlays/events",
    "kustomize/overlays/crash-watch",
    "kustomize/overlays/crash-heal",
];

fn root() -> PathBuf {
    tools::root()
}

fn render(dir: impl AsRef<Path>) -> String {
    tools::render(dir)
}

fn documents(yaml: &str) -> Vec<Value> {
    tools::documents(yaml)
}

fn object<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| {
            d["kind"] == kind
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n == name || n.starts_with(&format!("{name}-")))
        })
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn str_of<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{pointer} missing in {}", v["metadata"]["name"]))
}

/// The kubectl the tests use (and docs/install.md asks for) has kustomize 5: Debian's kubectl 1.20
/// (kustomize 2) cannot read `kustomize/`.
#[test]
fn kubectl_has_kustomize_5() {
    let out = tools::command("kubectl")
        .args(["version", "--client"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let kustomize = text
        .lines()
        .find_map(|l| l.strip_prefix("Kustomize Version: v"))
        .unwrap_or_else(|| panic!("no kustomize in kubectl version: {text}"));
    let major: u32 = kustomize.split('.').next().unwrap().parse().unwrap();
    assert!(major >= 5, "kustomize {kustomize} is too old: {text}");
}

#[test]
fn rendered_manifests_validate_offline() {
    for dir in OVERLAYS {
        let yaml = render(dir);
        let file = write_temp(&yaml);
        let mut kinds = vec![
            "namespace",
            "serviceaccount",
            "configmap",
            "secret",
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
        tools::validate_against_kubernetes(file.path(), &kinds, dir);
        let out = tools::python_script("validate-custom-resources.py")
            .arg(file.path())
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{dir}: cert-manager validation failed:\n{report}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cert_manager = report
            .lines()
            .filter(|l| l.starts_with("OK Certificate/") || l.starts_with("OK Issuer/"))
            .count();
        assert_eq!(cert_manager, 4, "{report}");
    }
}

#[test]
fn the_validators_reject_what_they_should() {
    // The checks above could pass by accident if a validator accepted anything.
    let yaml = render("kustomize");
    let broken = yaml.replacen(
        "revisionHistoryLimit: 5",
        "revisionHistoryLimit: 5\n  replicaz: 3",
        1,
    );
    let file = write_temp(&broken);
    let out = tools::command("kubernetes-validate")
        .args(["--strict", "--no-warn"])
        .arg(file.path())
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "kubernetes-validate accepted an unknown field"
    );
    let broken = yaml.replacen("dnsNames:", "dnsNamez:", 1);
    let file = write_temp(&broken);
    let out = tools::python_script("validate-custom-resources.py")
        .arg(file.path())
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "the cert-manager validator accepted an unknown field"
    );
}

/// What the schemas do not check: enum values, and the policy tolerable's safety depends on.
#[test]
fn webhook_settings() {
    for dir in OVERLAYS {
        let docs = documents(&render(dir));
        let mwc = object(&docs, "MutatingWebhookConfiguration", "tolerable");
        let webhooks = mwc["webhooks"].as_array().unwrap();
        assert_eq!(webhooks.len(), 1);
        let hook = &webhooks[0];
        let one_of = |field: &str, allowed: &[&str]| {
            let value = hook[field]
                .as_str()
                .unwrap_or_else(|| panic!("{field} unset"));
            assert!(
                allowed.contains(&value),
                "{dir}: {field}: {value:?} not one of {allowed:?}"
            );
            value.to_owned()
        };
        // Valid values (admissionregistration.k8s.io/v1)...
        one_of("sideEffects", &["None", "NoneOnDryRun", "Some", "Unknown"]);
        one_of("failurePolicy", &["Ignore", "Fail"]);
        one_of("reinvocationPolicy", &["Never", "IfNeeded"]);
        one_of("matchPolicy", &["Exact", "Equivalent"]);
        // ...and the ones tolerable must have: never block a Pod, never claim side effects,
        // run again when another webhook changed the Pod.
        assert_eq!(hook["sideEffects"], "None");
        assert_eq!(hook["failurePolicy"], "Ignore");
        assert_eq!(hook["reinvocationPolicy"], "IfNeeded");
        assert_eq!(hook["admissionReviewVersions"], serde_json::json!(["v1"]));
        let name = hook["name"].as_str().unwrap();
        assert!(
            name.split('.').count() >= 3,
            "webhook name must be fully qualified: {name}"
        );
        let rules = hook["rules"].as_array().unwrap();
        // Pods CREATE; with the daemonsets component also apps/v1 DaemonSets CREATE, UPDATE.
        let daemon_sets = *dir == "kustomize/overlays/daemonsets";
        assert_eq!(rules.len(), if daemon_sets { 2 } else { 1 }, "{dir}");
        assert_eq!(rules[0]["operations"], serde_json::json!(["CREATE"]));
        assert_eq!(rules[0]["apiGroups"], serde_json::json!([""]));
        assert_eq!(rules[0]["resources"], serde_json::json!(["pods"]));
        if daemon_sets {
            assert_eq!(
                rules[1],
                serde_json::json!({"operations": ["CREATE", "UPDATE"], "apiGroups": ["apps"],
                    "apiVersions": ["v1"], "resources": ["daemonsets"], "scope": "Namespaced"})
            );
        }
        for rule in rules {
            for op in rule["operations"].as_array().unwrap() {
                assert!(
                    ["CREATE", "UPDATE", "DELETE", "CONNECT", "*"].contains(&op.as_str().unwrap())
                );
            }
            assert!(["Cluster", "Namespaced", "*"].contains(&rule["scope"].as_str().unwrap()));
        }
        // The deadline must leave room for a lookup: the server keeps a fifth (≥ 300 ms) back.
        let timeout = hook["timeoutSeconds"].as_u64().unwrap();
        assert!((1..=30).contains(&timeout), "timeoutSeconds {timeout}");
        let budget = tolerable::budget::for_query(Some(&format!("timeout={timeout}s")));
        let config = deployed_config(&docs);
        assert!(
            config.resolver.lookup_timeout <= budget,
            "lookup_timeout {:?} does not fit timeoutSeconds {timeout} (budget {budget:?})",
            config.resolver.lookup_timeout
        );
    }
}

/// The deployed config, loaded the way the container loads it: the ConfigMap's file overlaid
/// with the Deployment's environment. Paths of mounted volumes are swapped for local temporary
/// files (they only exist in the Pod) after checking they point into the mounts.
fn deployed_config(docs: &[Value]) -> deployed::LoadedConfig {
    let config_map = object(docs, "ConfigMap", "tolerable-config");
    let text = str_of(config_map, "/data/tolerable.toml");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tolerable.toml");
    std::fs::write(&file, text).unwrap();
    let deployment = object(docs, "Deployment", "tolerable");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let mut env: Vec<(String, String)> = Vec::new();
    for e in container["env"].as_array().unwrap() {
        let value = kubelet_env_value(e, deployment);
        let value = deployed::expand_env_references(&value, &env);
        env.push((e["name"].as_str().unwrap().to_owned(), value));
    }
    deployed::local_tls_and_credential_files(dir.path(), &mut env);
    deployed::local_credential_providers(docs, deployment_pod(docs), dir.path(), &mut env);
    let config = Config::load(Some(&file), env)
        .unwrap_or_else(|e| panic!("deployed config is invalid: {e}"));
    // Its own namespace, from the downward API: its Pods are never gated.
    assert_eq!(
        config.policy.own_namespace.as_deref(),
        deployment["metadata"]["namespace"].as_str()
    );
    deployed::LoadedConfig::new(config, dir)
}

/// A container's environment variable as the kubelet sets it (before `$(VAR)` expansion): its
/// value, the downward API's, or a stand-in for a Secret's value (it exists only in the cluster).
fn kubelet_env_value(e: &Value, deployment: &Value) -> String {
    match e["value"].as_str() {
        Some(value) => value.to_owned(),
        None if e["valueFrom"]["secretKeyRef"]["name"].is_string() => "from-a-secret".to_owned(),
        None => deployed::downward_value(e, deployment).unwrap_or_else(|| panic!("{e}")),
    }
}

/// The Deployment's Pod template spec.
fn deployment_pod(docs: &[Value]) -> &Value {
    &object(docs, "Deployment", "tolerable")["spec"]["template"]["spec"]
}

/// The volume of the Deployment's Pod that `path` lies in, and where its container mounts it.
fn volume_of<'a>(docs: &'a [Value], path: &str) -> Option<(&'a Value, String)> {
    deployed::volume_of(deployment_pod(docs), path)
}

fn toml_table(text: &str) -> toml::Table {
    text.parse().unwrap()
}

#[test]
fn objects_agree_with_each_other() {
    for dir in OVERLAYS {
        let docs = documents(&render(dir));
        let overlay = Overlay::new(dir, &docs);
        overlay.service_matches_the_webhooks_client();
        let container_port = overlay.webhook_container_port();
        overlay.network_policy_admits_the_webhook(container_port);
        overlay.ports_and_probes_match_the_config(container_port);
        overlay.selectors_match_the_pods();
        overlay.certificate_and_mounts_match_the_config();
        overlay.tolerable_never_depends_on_itself();
    }
}

/// One rendered overlay and the objects most cross-checks look at.
struct Overlay<'a> {
    dir: &'a str,
    docs: &'a [Value],
    namespace: &'a str,
    service: &'a Value,
    /// The MutatingWebhookConfiguration's one webhook.
    hook: &'a Value,
    /// The Deployment's Pod template spec, its first container and its labels.
    pod: &'a Value,
    container: &'a Value,
    labels: &'a Value,
}

impl<'a> Overlay<'a> {
    fn new(dir: &'a str, docs: &'a [Value]) -> Self {
        let namespace = str_of(
            object(docs, "Namespace", "tolerable-system"),
            "/metadata/name",
        );
        let deployment = object(docs, "Deployment", "tolerable");
        let pod = &deployment["spec"]["template"]["spec"];
        Self {
            dir,
            docs,
            namespace,
            service: object(docs, "Service", "tolerable"),
            hook: &object(docs, "MutatingWebhookConfiguration", "tolerable")["webhooks"][0],
            pod,
            container: &pod["containers"][0],
            labels: &deployment["spec"]["template"]["metadata"]["labels"],
        }
    }

    /// Service ↔ the webhook's clientConfig ↔ the server's route.
    fn service_matches_the_webhooks_client(&self) {
        let (dir, service) = (self.dir, self.service);
        let client = &self.hook["clientConfig"]["service"];
        assert_eq!(client["name"], service["metadata"]["name"], "{dir}");
        assert_eq!(
            client["namespace"], service["metadata"]["namespace"],
            "{dir}"
        );
        assert_eq!(service["metadata"]["namespace"], self.namespace);
        assert_eq!(
            client["path"], "/mutate",
            "{dir}: the server serves POST /mutate"
        );
        let port = &service["spec"]["ports"][0];
        assert_eq!(client["port"], port["port"], "{dir}");
    }

    /// The container port the Service's targetPort names (by name or number).
    fn webhook_container_port(&self) -> &'a Value {
        let target = &self.service["spec"]["ports"][0]["targetPort"];
        self.container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == *target || p["containerPort"] == *target)
            .unwrap_or_else(|| {
                panic!(
                    "{}: targetPort {target} matches no container port",
                    self.dir
                )
            })
    }

    /// The NetworkPolicy selects the webhook's Pods and lets the API server reach its port;
    /// the metrics port is open only to the monitoring namespace.
    fn network_policy_admits_the_webhook(&self, container_port: &Value) {
        let dir = self.dir;
        let policy = object(self.docs, "NetworkPolicy", "tolerable");
        let selector = policy["spec"]["podSelector"]["matchLabels"]
            .as_object()
            .unwrap();
        for (key, value) in selector {
            assert_eq!(
                &self.labels[key], value,
                "{dir}: NetworkPolicy selects {key}={value}"
            );
        }
        let allowed = policy["spec"]["ingress"][0]["ports"][0]["port"].clone();
        assert!(
            allowed == container_port["name"] || allowed == container_port["containerPort"],
            "{dir}: the NetworkPolicy allows {allowed}, the webhook listens on {container_port}"
        );
        let metrics_rule = &policy["spec"]["ingress"][1];
        assert_eq!(metrics_rule["ports"][0]["port"], "metrics", "{dir}");
        assert!(
            metrics_rule["from"][0]["namespaceSelector"].is_object(),
            "{dir}: metrics open to a namespace selector only"
        );
    }

    /// The metrics port is where metrics_addr says, the webhook's where listen_addr says, and
    /// the probes ask the health endpoints on the webhook's port.
    fn ports_and_probes_match_the_config(&self, container_port: &Value) {
        let (dir, container) = (self.dir, self.container);
        let metrics_port = container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "metrics")
            .expect("a metrics container port");
        let config = deployed_config(self.docs);
        assert_eq!(
            config.metrics_addr.map(|a| a.port()),
            metrics_port["containerPort"].as_u64().map(|p| p as u16),
            "{dir}: metrics_addr and the metrics container port"
        );
        assert_eq!(
            container_port["containerPort"].as_u64().unwrap(),
            u64::from(config.listen_addr.port()),
            "{dir}"
        );
        for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
            let get = &container[probe]["httpGet"];
            assert_eq!(get["path"], path, "{dir} {probe}");
            assert_eq!(get["scheme"], "HTTPS", "{dir} {probe}");
            assert!(
                get["port"] == container_port["name"]
                    || get["port"] == container_port["containerPort"],
                "{dir} {probe}"
            );
        }
    }

    /// The Service selects the Deployment's Pods; so does the PodDisruptionBudget.
    fn selectors_match_the_pods(&self) {
        for selector in [
            &self.service["spec"]["selector"],
            &object(self.docs, "PodDisruptionBudget", "tolerable")["spec"]["selector"]
                ["matchLabels"],
        ] {
            for (k, v) in selector.as_object().unwrap() {
                assert_eq!(
                    &self.labels[k], v,
                    "{}: selector {k}={v} does not match the Pods",
                    self.dir
                );
            }
        }
    }

    /// Certificate dnsNames ↔ Service; inject-ca-from ↔ Certificate; secretName ↔ the mounted
    /// Secret ↔ tls.cert_path / tls.key_path in the deployed config; registry credentials
    /// Secret ↔ `[credentials] files_path`; config map ↔ TOLERABLE_CONFIG.
    fn certificate_and_mounts_match_the_config(&self) {
        let (dir, docs) = (self.dir, self.docs);
        let certificate = object(docs, "Certificate", "tolerable-tls");
        let service_dns = format!(
            "{}.{}.svc",
            str_of(self.service, "/metadata/name"),
            self.namespace
        );
        let dns: Vec<&str> = certificate["spec"]["dnsNames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap())
            .collect();
        assert!(
            dns.contains(&service_dns.as_str()),
            "{dir}: dnsNames {dns:?} lack {service_dns}"
        );
        let mwc = object(docs, "MutatingWebhookConfiguration", "tolerable");
        assert_eq!(
            str_of(mwc, "/metadata/annotations/cert-manager.io~1inject-ca-from"),
            format!(
                "{}/{}",
                str_of(certificate, "/metadata/namespace"),
                str_of(certificate, "/metadata/name")
            ),
            "{dir}"
        );
        let secret_name = str_of(certificate, "/spec/secretName");
        let tls_mount = self.mount_of(|v| v["secret"]["secretName"] == secret_name);
        let config_map = object(docs, "ConfigMap", "tolerable-config");
        let file = toml_table(str_of(config_map, "/data/tolerable.toml"));
        for (key, path) in [
            ("cert_path", format!("{tls_mount}/tls.crt")),
            ("key_path", format!("{tls_mount}/tls.key")),
        ] {
            assert_eq!(file["tls"][key].as_str().unwrap(), path, "{dir}");
        }
        let creds = object(docs, "Secret", "tolerable-registry-creds");
        let creds_mount = self.mount_of(|v| v["secret"]["secretName"] == creds["metadata"]["name"]);
        assert_eq!(
            file["credentials"]["files_path"].as_str().unwrap(),
            creds_mount,
            "{dir}"
        );
        let config_mount =
            self.mount_of(|v| v["configMap"]["name"] == config_map["metadata"]["name"]);
        let config_env = self.container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "TOLERABLE_CONFIG")
            .unwrap();
        assert_eq!(
            config_env["value"].as_str().unwrap(),
            format!("{config_mount}/tolerable.toml"),
            "{dir}"
        );
    }

    /// Where the container mounts the Pod's volume that `is_it` picks.
    fn mount_of(&self, is_it: impl Fn(&Value) -> bool) -> String {
        let dir = self.dir;
        let volume = self.pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| is_it(v))
            .unwrap_or_else(|| panic!("{dir}: volume missing"));
        let name = volume["name"].as_str().unwrap();
        let mount = self.container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("{dir}: {name} not mounted"));
        mount["mountPath"].as_str().unwrap().to_owned()
    }

    /// tolerable's own Pods never depend on tolerable: its namespace and its Pods are excluded.
    fn tolerable_never_depends_on_itself(&self) {
        let dir = self.dir;
        let excluded_namespaces = &self.hook["namespaceSelector"]["matchExpressions"][0];
        assert_eq!(excluded_namespaces["key"], "kubernetes.io/metadata.name");
        assert_eq!(excluded_namespaces["operator"], "NotIn");
        assert!(
            excluded_namespaces["values"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v == self.namespace),
            "{dir}"
        );
        // Nor are namespaces the platform team switched off (the namespace policy's skip).
        assert_eq!(
            self.hook["namespaceSelector"]["matchExpressions"][1],
            serde_json::json!({"key": tolerable::mutate::SKIP_KEY, "operator": "NotIn", "values": ["true"]}),
            "{dir}"
        );
        let object_selector = &self.hook["objectSelector"]["matchExpressions"][0];
        assert_eq!(object_selector["key"], tolerable::mutate::SKIP_KEY);
        assert_eq!(object_selector["operator"], "NotIn");
        assert_eq!(
            self.labels[tolerable::mutate::SKIP_KEY],
            "true",
            "{dir}: tolerable's Pods must carry the opt-out label"
        );
    }
}

#[test]
fn the_deployment_is_hardened() {
    for dir in OVERLAYS {
        let docs = documents(&render(dir));
        let deployment = object(&docs, "Deployment", "tolerable");
        pods_are_locked_down(dir, &docs, deployment);
        rbac_is_only_what_the_enabled_features_need(dir, &docs, deployment);
    }
    // The example overlay configures the cluster through the environment and sets the image.
    let docs = documents(&render("kustomize/overlays/example"));
    let container =
        &object(&docs, "Deployment", "tolerable")["spec"]["template"]["spec"]["containers"][0];
    assert!(container["env"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "TOLERABLE_POLICY__SUPPORTED_ARCHITECTURES"));
    // The overlay's image replaces the base's placeholder.
    assert_eq!(
        container["image"], "registry.example.com/platform/tolerable:v0.1.0",
        "{}",
        container["image"]
    );
    let config = deployed_config(&docs);
    assert!(config.policy.supported_architectures.contains("s390x"));
}

/// Two replicas kept apart and one always available; non-root, no privilege escalation, no
/// capabilities, a read-only root file system, and bounded resources.
fn pods_are_locked_down(dir: &str, docs: &[Value], deployment: &Value) {
    assert_eq!(deployment["spec"]["replicas"], 2, "{dir}");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(pod["enableServiceLinks"], false);
    assert!(pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname");
    let container = &pod["containers"][0];
    let security = &container["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    for kind in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                container["resources"][kind][resource].is_string(),
                "{dir}: {kind}.{resource}"
            );
        }
    }
    assert_eq!(
        object(docs, "PodDisruptionBudget", "tolerable")["spec"]["minAvailable"],
        1
    );
}

/// Least privilege: `get` on secrets and serviceaccounts when pull secrets are read,
/// `list`/`watch` on nodes when nodes are watched, `get`/`list`/`patch` when node taints are
/// managed, for the Deployment's own ServiceAccount; nothing at all (not even a token) when
/// none is.
fn rbac_is_only_what_the_enabled_features_need(dir: &str, docs: &[Value], deployment: &Value) {
    let pod = &deployment["spec"]["template"]["spec"];
    let rbac: Vec<&Value> = docs
        .iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some("Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding")
            )
        })
        .collect();
    let mut expected = 0;
    for (enabled, role_name, rules) in roles_of_features(&deployed_config(docs)) {
        if !enabled {
            assert!(
                !rbac.iter().any(|d| d["metadata"]["name"] == role_name),
                "{dir}: {role_name} granted but disabled"
            );
            continue;
        }
        let role = object(docs, "ClusterRole", role_name);
        assert_eq!(role["rules"], rules, "{dir}");
        let bindings = bindings_of(docs, role_name);
        assert!(!bindings.is_empty(), "{dir}: {role_name} is bound nowhere");
        expected += 1 + bindings.len();
        for binding in bindings {
            // Only reading pull secrets may be granted namespace by namespace.
            if binding["kind"] == "RoleBinding" {
                assert_eq!(role_name, "tolerable-pull-secrets", "{dir}");
                assert_ne!(
                    binding["metadata"]["namespace"], deployment["metadata"]["namespace"],
                    "{dir}"
                );
            }
            assert_eq!(binding["roleRef"]["kind"], "ClusterRole", "{dir}");
            assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
            assert_eq!(
                binding["subjects"][0]["name"], pod["serviceAccountName"],
                "{dir}"
            );
            assert_eq!(
                binding["subjects"][0]["namespace"], deployment["metadata"]["namespace"],
                "{dir}"
            );
        }
    }
    expected += leader_elected_rbac(docs);
    assert_eq!(
        rbac.len(),
        expected,
        "{dir}: RBAC beyond what the enabled features need"
    );
    if expected == 0 {
        assert_eq!(
            pod["automountServiceAccountToken"], false,
            "{dir}: no API access is needed"
        );
    } else {
        assert_ne!(
            pod["automountServiceAccountToken"], false,
            "{dir}: the API token is needed"
        );
    }
}

/// The RBAC objects of the lease-led controllers the config enables, which must all be there:
/// the gate releaser's (gates) and the crash watch's, each a ClusterRole and a Lease Role, each
/// bound once (their rules are checked by each component's own test).
fn leader_elected_rbac(docs: &[Value]) -> usize {
    let config = deployed_config(docs);
    let mut count = 0;
    for (enabled, name) in [
        (
            config.policy.on_lookup_failure == OnLookupFailure::Gate,
            "tolerable-gates",
        ),
        (config.crash_watch, "tolerable-crash-watch"),
    ] {
        if !enabled {
            continue;
        }
        let election = format!("{name}-leader-election");
        for (kind, name) in [
            ("ClusterRole", name),
            ("ClusterRoleBinding", name),
            ("Role", election.as_str()),
            ("RoleBinding", election.as_str()),
        ] {
            object(docs, kind, name);
        }
        count += 4;
    }
    count
}

/// The bindings of the ClusterRole `role_name`: one ClusterRoleBinding of that name, or (pull
/// secrets only) RoleBindings of that name in the namespaces listed.
fn bindings_of<'a>(docs: &'a [Value], role_name: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some("RoleBinding" | "ClusterRoleBinding")
            ) && d["metadata"]["name"] == role_name
        })
        .collect()
}

/// The per-namespace variant grants reading pull secrets in the listed namespaces only, with the
/// same ClusterRole, and keeps everything else the base grants.
#[test]
fn pull_secrets_can_be_granted_per_namespace() {
    let docs = documents(&render("kustomize/overlays/namespaced-pull-secrets"));
    let bindings = bindings_of(&docs, "tolerable-pull-secrets");
    let namespaces: Vec<&str> = bindings
        .iter()
        .map(|b| {
            assert_eq!(b["kind"], "RoleBinding");
            str_of(b, "/metadata/namespace")
        })
        .collect();
    assert_eq!(namespaces, ["team-a", "team-b"]);
    assert_eq!(
        bindings_of(&docs, "tolerable-nodes")[0]["kind"],
        "ClusterRoleBinding"
    );
    assert!(deployed_config(&docs).read_pull_secrets);
}

/// The value of the container's environment variable `name`.
fn env_value<'a>(docs: &'a [Value], name: &str) -> &'a str {
    let container =
        &object(docs, "Deployment", "tolerable")["spec"]["template"]["spec"]["containers"][0];
    let var = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("{name} not set"));
    var["value"].as_str().unwrap()
}

/// The node's plugins, mounted read-only from the node (the kubelet's config file and its
/// plugins' directory) where the environment says they are.
#[test]
fn node_credential_providers_are_mounted_read_only_from_the_node() {
    let docs = documents(&render("kustomize/overlays/node-credential-providers"));
    let container =
        &object(&docs, "Deployment", "tolerable")["spec"]["template"]["spec"]["containers"][0];
    for (var, kind, node_path) in [
        (
            "TOLERABLE_CREDENTIALS__PROVIDER_CONFIG",
            "File",
            "/etc/eks/image-credential-provider/config.json",
        ),
        (
            "TOLERABLE_CREDENTIALS__PROVIDER_BIN_DIR",
            "Directory",
            "/etc/eks/image-credential-provider",
        ),
    ] {
        let path = env_value(&docs, var);
        let (volume, mount) = volume_of(&docs, path).unwrap();
        assert_eq!(mount, path, "{var} is the mount itself");
        assert_eq!(volume["hostPath"]["type"], kind);
        assert_eq!(volume["hostPath"]["path"], node_path);
        let mounted = container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == path)
            .unwrap();
        assert_eq!(mounted["readOnly"], true, "{var}");
    }
    // Nothing else of the node is mounted.
    let host_paths = object(&docs, "Deployment", "tolerable")["spec"]["template"]["spec"]
        ["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v.get("hostPath").is_some())
        .count();
    assert_eq!(host_paths, 2);
    deployed_config(&docs);
}

/// The plugins built into the image: the directory the Dockerfile lines of
/// docs/cloud-registries.md copy them to is the one the component configures (in the image, not a
/// volume), and the component's CredentialProviderConfig is valid; the overlay gives the
/// ServiceAccount its IAM role.
#[test]
fn the_plugin_image_matches_the_docs_and_the_config_is_valid() {
    let docs = documents(&render("kustomize/overlays/credential-provider-image"));
    let bin_dir = env_value(&docs, "TOLERABLE_CREDENTIALS__PROVIDER_BIN_DIR");
    assert!(
        volume_of(&docs, bin_dir).is_none(),
        "{bin_dir} is in the image"
    );
    let page = std::fs::read_to_string(root().join("docs/cloud-registries.md")).unwrap();
    for plugin in [
        "ecr-credential-provider",
        "auth-provider-gcp",
        "acr-credential-provider",
    ] {
        let copy = format!("COPY --from=plugin /out/{plugin} {bin_dir}/{plugin}");
        assert!(
            page.contains(&copy),
            "docs/cloud-registries.md lacks {copy}"
        );
    }
    let (volume, _) = volume_of(
        &docs,
        env_value(&docs, "TOLERABLE_CREDENTIALS__PROVIDER_CONFIG"),
    )
    .expect("the provider config is mounted");
    assert!(volume["configMap"]["name"]
        .as_str()
        .unwrap()
        .starts_with("tolerable-credential-providers-"));
    deployed_config(&docs);
    let account = object(&docs, "ServiceAccount", "tolerable");
    assert!(account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].is_string());
}

/// Each feature that needs the API: whether the config enables it, the ClusterRole (and its
/// binding) named for it, and the rules that role must hold.
fn roles_of_features(config: &Config) -> [(bool, &'static str, Value); 6] {
    [
        (
            config.read_pull_secrets,
            "tolerable-pull-secrets",
            serde_json::json!([{"apiGroups": [""], "resources": ["secrets", "serviceaccounts"], "verbs": ["get"]}]),
        ),
        (
            config.watch_nodes,
            "tolerable-nodes",
            serde_json::json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]),
        ),
        (
            config.namespace_policy,
            "tolerable-namespaces",
            serde_json::json!([{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}]),
        ),
        (
            config.manage_node_taints,
            "tolerable-node-taints",
            serde_json::json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}]),
        ),
        (
            config.events_on_admission,
            "tolerable-events",
            serde_json::json!([{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]}]),
        ),
        (
            config.crash_heal,
            "tolerable-crash-heal",
            serde_json::json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}]),
        ),
    ]
}

/// The shared-cache component: tolerable's `[shared_cache] url` names the Valkey Service, the Service
/// reaches the Valkey Pod's port, only tolerable's Pods may connect to it (and it connects to
/// nothing), it keeps nothing on disk, is as locked down as tolerable's Pods, and never goes
/// through tolerable. Without the component, no `[shared_cache] url`.
#[test]
fn the_shared_cache_is_reachable_by_tolerable_alone() {
    let docs = documents(&render("kustomize/overlays/shared-cache"));
    let shared = deployed_config(&docs)
        .resolver
        .shared_cache
        .clone()
        .expect("[shared_cache] url is set");
    let url = reqwest::Url::parse(shared.url()).unwrap();
    let service = object(&docs, "Service", "valkey");
    let namespace = str_of(service, "/metadata/namespace");
    let service_name = str_of(service, "/metadata/name");
    assert_eq!(
        url.host_str().unwrap(),
        format!("{service_name}.{namespace}.svc")
    );
    assert_eq!(
        Some(url.port().unwrap()),
        service["spec"]["ports"][0]["port"]
            .as_u64()
            .map(|p| p as u16)
    );
    let deployment = object(&docs, "Deployment", "valkey");
    let pod = &deployment["spec"]["template"];
    let labels = &pod["metadata"]["labels"];
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&labels[key], value, "the Service selects the Valkey Pod");
    }
    let container = &pod["spec"]["containers"][0];
    assert_eq!(
        container["ports"][0]["name"], service["spec"]["ports"][0]["targetPort"],
        "the Service reaches the container's port"
    );
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for pair in [["--save", ""], ["--appendonly", "no"]] {
        assert!(args.windows(2).any(|w| w == pair), "{args:?}");
    }
    assert!(args.contains(&"--maxmemory"), "memory bounded: {args:?}");
    valkey_asks_for_the_password_tolerable_sends(&docs, container, &args);
    assert_eq!(labels["tolerable.io/skip"], "true");
    assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
    assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true);
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));

    only_tolerable_reaches_valkey(&docs, labels, container);

    let without = documents(&render("kustomize"));
    assert!(deployed_config(&without).resolver.shared_cache.is_none());
    assert!(!without.iter().any(|d| d["metadata"]["name"] == "valkey"));
}

/// Valkey keeps protected mode on and requires a password, from the Secret tolerable's
/// `TOLERABLE_SHARED_CACHE__PASSWORD` reads (optional there: tolerable starts without it).
fn valkey_asks_for_the_password_tolerable_sends(docs: &[Value], valkey: &Value, args: &[&str]) {
    assert!(
        args.windows(2).any(|w| w == ["--protected-mode", "yes"]),
        "{args:?}"
    );
    assert!(
        args.windows(2)
            .any(|w| w == ["--requirepass", "$(VALKEY_PASSWORD)"]),
        "{args:?}"
    );
    let from = |container: &Value, variable: &str| {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == variable)
            .unwrap_or_else(|| panic!("{variable}"))["valueFrom"]["secretKeyRef"]
            .clone()
    };
    let theirs = from(valkey, "VALKEY_PASSWORD");
    let tolerable =
        &object(docs, "Deployment", "tolerable")["spec"]["template"]["spec"]["containers"][0];
    let ours = from(tolerable, "TOLERABLE_SHARED_CACHE__PASSWORD");
    assert_eq!(ours["name"], theirs["name"]);
    assert_eq!(ours["key"], theirs["key"]);
    assert_eq!(ours["optional"], true);
}

/// The Valkey NetworkPolicy covers the Valkey Pod (`labels`), admits tolerable's Pods alone on
/// the container's port, and lets Valkey reach nothing.
fn only_tolerable_reaches_valkey(docs: &[Value], labels: &Value, container: &Value) {
    let policy = object(docs, "NetworkPolicy", "valkey");
    for (key, value) in policy["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&labels[key], value, "the policy covers the Valkey Pod");
    }
    assert_eq!(
        policy["spec"]["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );
    assert!(
        policy["spec"].get("egress").is_none(),
        "Valkey reaches nothing"
    );
    let ingress = policy["spec"]["ingress"].as_array().unwrap();
    assert_eq!(ingress.len(), 1);
    let from = ingress[0]["from"].as_array().unwrap();
    assert_eq!(from.len(), 1, "one peer: tolerable's Pods");
    assert!(from[0].get("namespaceSelector").is_none() && from[0].get("ipBlock").is_none());
    let tolerable_pods =
        &object(docs, "Deployment", "tolerable")["spec"]["template"]["metadata"]["labels"];
    for (key, value) in from[0]["podSelector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&tolerable_pods[key], value, "the peer is tolerable's Pods");
    }
    assert_eq!(
        ingress[0]["ports"][0]["port"],
        container["ports"][0]["name"]
    );
}

/// The example overlay copied into `copy` as its comments say to: every file of it, the base
/// pointed at the checkout's kustomize/base by a relative path; `edit` then changes its
/// kustomization.yaml, given that path's prefix up to the repository (for components).
fn copy_example_overlay(copy: &Path, edit: impl Fn(String, &str) -> String) {
    let example = root().join("kustomize/overlays/example");
    // The relative path from the copy to the repository: up to /, then down.
    let up = "../".repeat(copy.components().count() - 1);
    let repository = format!("{up}{}", root().strip_prefix("/").unwrap().display());
    for file in std::fs::read_dir(&example).unwrap() {
        let file = file.unwrap().path();
        std::fs::copy(&file, copy.join(file.file_name().unwrap())).unwrap();
    }
    let kustomization = std::fs::read_to_string(example.join("kustomization.yaml")).unwrap();
    assert!(kustomization.contains("  - ../../base\n"));
    let kustomization = kustomization.replace(
        "  - ../../base\n",
        &format!("  - {repository}/kustomize/base\n"),
    );
    std::fs::write(
        copy.join("kustomization.yaml"),
        edit(kustomization, &repository),
    )
    .unwrap();
}

/// The example overlay copied out of the repository, as its comments say to: its base pointed
/// at the checkout's kustomize/base by a relative path, the image set to the operator's own;
/// it starts report-only.
#[test]
fn the_example_overlay_works_when_copied_elsewhere() {
    let copy = tempfile::tempdir().unwrap();
    copy_example_overlay(copy.path(), |kustomization, _| {
        assert!(kustomization
            .contains("kustomize edit set image registry.example.com/tolerable/tolerable="));
        kustomization.replace(
            "newName: registry.example.com/platform/tolerable",
            "newName: registry.example.com/other/tolerable",
        )
    });
    let docs = documents(&render(copy.path()));
    let container =
        &object(&docs, "Deployment", "tolerable")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"],
        "registry.example.com/other/tolerable:v0.1.0"
    );
    // As the docs say to start: report-only (the base itself enforces).
    assert!(!deployed_config(&docs).policy.enforce);
    assert!(
        deployed_config(&documents(&render("kustomize")))
            .policy
            .enforce
    );
}

/// The example overlay copied and given another namespace (its commented `namespace:` line),
/// with the shared cache and gates: no object and no string names tolerable-system any more —
/// the certificate's DNS names are the Service's, cert-manager injects the CA from the
/// Certificate that exists, the webhook leaves the new namespace out and calls the Service
/// where it is, the shared cache's URL names Valkey's Service there, the bindings name the
/// ServiceAccount there — and it validates.
#[test]
fn an_overlay_in_another_namespace_carries_it_into_every_field() {
    let copy = tempfile::tempdir().unwrap();
    copy_example_overlay(copy.path(), |kustomization, repository| {
        assert!(kustomization.contains("\n# namespace: platform-tolerable\n"));
        let components = ["shared-cache", "gates"]
            .map(|c| format!("  - {repository}/kustomize/components/{c}\n"))
            .concat();
        kustomization.replace(
            "\n# namespace: platform-tolerable\n",
            "\nnamespace: platform-tolerable\n",
        ) + "components:\n"
            + &components
    });
    let yaml = render(copy.path());
    tools::validate_against_kubernetes(write_temp(&yaml).path(), &[], "the namespaced overlay");
    let docs = documents(&yaml);
    for doc in &docs {
        assert!(!doc.to_string().contains("tolerable-system"), "{doc}");
    }
    let ns = "platform-tolerable";
    let service = object(&docs, "Service", "tolerable");
    assert_eq!(service["metadata"]["namespace"], ns);
    let certificate = object(&docs, "Certificate", "tolerable-tls");
    assert_eq!(
        certificate["spec"]["dnsNames"],
        serde_json::json!([
            format!("tolerable.{ns}.svc"),
            format!("tolerable.{ns}.svc.cluster.local")
        ])
    );
    let mwc = object(&docs, "MutatingWebhookConfiguration", "tolerable");
    let inject = str_of(mwc, "/metadata/annotations/cert-manager.io~1inject-ca-from");
    assert_eq!(
        inject,
        format!("{ns}/{}", str_of(certificate, "/metadata/name"))
    );
    assert_eq!(certificate["metadata"]["namespace"], ns);
    let hook = &mwc["webhooks"][0];
    assert_eq!(hook["clientConfig"]["service"]["namespace"], ns);
    let excluded = &hook["namespaceSelector"]["matchExpressions"][0];
    assert_eq!(excluded["key"], "kubernetes.io/metadata.name");
    assert_eq!(excluded["values"], serde_json::json!([ns, "kube-system"]));
    let deployed = deployed_config(&docs);
    let shared = deployed
        .resolver
        .shared_cache
        .as_ref()
        .expect("[shared_cache] url");
    let url = reqwest::Url::parse(shared.url()).unwrap();
    assert_eq!(url.host_str(), Some(format!("valkey.{ns}.svc").as_str()));
    for binding in rbac_objects(&docs)
        .into_iter()
        .filter(|o| o["kind"].as_str().unwrap().ends_with("Binding"))
    {
        for subject in binding["subjects"].as_array().unwrap() {
            assert_eq!(subject["namespace"], ns, "{binding}");
        }
    }
}

/// The RBAC objects of `docs`.
fn rbac_objects(docs: &[Value]) -> Vec<&Value> {
    docs.iter()
        .filter(|d| d["apiVersion"] == "rbac.authorization.k8s.io/v1")
        .collect()
}

/// The gates component (`kustomize/overlays/gates`): the base plus exactly what the releaser
/// needs — pods get/list/watch/patch and events create cluster-wide, the leader election's Lease
/// (named as the code names it) in tolerable's own namespace only, bound to the Deployment's
/// ServiceAccount — and `on_lookup_failure = "gate"`; the rest is the base, unchanged. It
/// validates against the Kubernetes schemas as every overlay does.
#[test]
fn the_gates_component_grants_the_releaser_what_it_needs_and_nothing_else() {
    let dir = "kustomize/overlays/gates";
    let yaml = render(dir);
    let file = write_temp(&yaml);
    let kinds = [
        "deployment",
        "clusterrole",
        "clusterrolebinding",
        "role",
        "rolebinding",
    ];
    tools::validate_against_kubernetes(file.path(), &kinds, dir);
    let docs = documents(&yaml);
    let base = documents(&render("kustomize"));
    let deployment = object(&docs, "Deployment", "tolerable");
    let namespace = str_of(deployment, "/metadata/namespace");
    let account = str_of(deployment, "/spec/template/spec/serviceAccountName");
    assert_eq!(
        env_value(&docs, "TOLERABLE_POLICY__ON_LOOKUP_FAILURE"),
        "gate"
    );

    let role = object(&docs, "ClusterRole", "tolerable-gates");
    assert_eq!(
        role["rules"],
        serde_json::json!([
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        ])
    );
    let lease = tolerable::cluster::lease::DEFAULT_LEASE_NAME;
    let election = object(&docs, "Role", "tolerable-gates-leader-election");
    assert_eq!(election["metadata"]["namespace"], namespace);
    assert_eq!(
        election["rules"],
        serde_json::json!([
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [lease], "verbs": ["get", "update"]},
        ])
    );
    for (kind, name, role_kind) in [
        ("ClusterRoleBinding", "tolerable-gates", "ClusterRole"),
        ("RoleBinding", "tolerable-gates-leader-election", "Role"),
    ] {
        let binding = object(&docs, kind, name);
        assert_eq!(binding["roleRef"]["kind"], role_kind);
        assert_eq!(binding["roleRef"]["name"], name);
        assert_eq!(
            binding["subjects"],
            serde_json::json!([{"kind": "ServiceAccount", "name": account, "namespace": namespace}])
        );
        if kind == "RoleBinding" {
            assert_eq!(binding["metadata"]["namespace"], namespace);
        }
    }
    // Beyond these four objects and the variable, the overlay is the base.
    assert_eq!(rbac_objects(&docs).len(), rbac_objects(&base).len() + 4);
    let is_gates = |d: &&Value| {
        d["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("tolerable-gates"))
    };
    let mut rest: Vec<Value> = docs.iter().filter(|d| !is_gates(d)).cloned().collect();
    let container = rest
        .iter_mut()
        .find(|d| d["kind"] == "Deployment")
        .and_then(|d| d.pointer_mut("/spec/template/spec/containers/0/env"))
        .and_then(Value::as_array_mut)
        .unwrap();
    container.retain(|e| e["name"] != "TOLERABLE_POLICY__ON_LOOKUP_FAILURE");
    assert_eq!(rest, base);
}

/// The container port named `name` in the Deployment's Pod.
fn container_port(docs: &[Value], name: &str) -> u64 {
    deployment_pod(docs)["containers"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no port {name}"))["containerPort"]
        .as_u64()
        .unwrap()
}

/// Each provider's overlay puts the webhook where that provider's control plane reaches it, and
/// tolerable listens where its container port says: GKE private clusters on 10250 (the one
/// node port their firewall opens besides 443), EKS with an overlay CNI on the node's network
/// on 10260 and /metrics on 10261 (cluster DNS kept); AKS's overlay opts the webhook out of
/// the admissions enforcer. The Service still reaches the port by name, and each validates.
#[test]
fn provider_overlays_put_the_webhook_where_the_control_plane_reaches_it() {
    for (overlay, https, metrics, host_network) in [
        ("gke-private-cluster", 10250, 9090, false),
        ("eks-overlay-cni", 10260, 10261, true),
        ("aks", 8443, 9090, false),
    ] {
        let dir = format!("kustomize/overlays/{overlay}");
        let yaml = render(&dir);
        tools::validate_against_kubernetes(write_temp(&yaml).path(), &["deployment"], &dir);
        let docs = documents(&yaml);
        let config = deployed_config(&docs);
        assert_eq!(u64::from(config.listen_addr.port()), https, "{overlay}");
        assert_eq!(container_port(&docs, "https"), https, "{overlay}");
        assert_eq!(
            config.metrics_addr.map(|a| u64::from(a.port())),
            Some(metrics),
            "{overlay}"
        );
        assert_eq!(container_port(&docs, "metrics"), metrics, "{overlay}");
        let ports = deployment_pod(&docs)["containers"][0]["ports"]
            .as_array()
            .unwrap()
            .len();
        assert_eq!(ports, 2, "{overlay}: ports replaced, not added");
        let service = object(&docs, "Service", "tolerable");
        assert_eq!(service["spec"]["ports"][0]["targetPort"], "https");
        let pod = deployment_pod(&docs);
        assert_eq!(
            pod["hostNetwork"].as_bool().unwrap_or(false),
            host_network,
            "{overlay}"
        );
        if host_network {
            assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
        }
        let labels =
            &object(&docs, "MutatingWebhookConfiguration", "tolerable")["metadata"]["labels"];
        let enforcer_off = labels["admissions.enforcer/disabled"] == "true";
        assert_eq!(enforcer_off, overlay == "aks", "{overlay}");
    }
}

/// The base runs tolerable at the admission webhooks' priority, and admits it where a cluster
/// limits that priority to quota-covered namespaces (GKE): a ResourceQuota scoped to exactly
/// the Deployment's class, in its namespace, with room for a rollout.
#[test]
fn the_priority_class_comes_with_its_quota() {
    let docs = documents(&render("kustomize"));
    let deployment = object(&docs, "Deployment", "tolerable");
    let class = str_of(deployment, "/spec/template/spec/priorityClassName");
    assert_eq!(class, "system-cluster-critical");
    let quota = object(&docs, "ResourceQuota", "tolerable-priority");
    assert_eq!(
        quota["metadata"]["namespace"],
        deployment["metadata"]["namespace"]
    );
    assert_eq!(
        quota["spec"]["scopeSelector"]["matchExpressions"],
        serde_json::json!([{"scopeName": "PriorityClass", "operator": "In", "values": [class]}])
    );
    let pods: u64 = str_of(quota, "/spec/hard/pods").parse().unwrap();
    let replicas = deployment["spec"]["replicas"].as_u64().unwrap();
    assert!(pods > replicas + 1, "a rollout's surge fits: {pods}");
}

/// README's and install.md's kustomize lines, run literally by `sh` in a copy of the checkout's
/// `kustomize/` (the test tools' kubectl first on PATH): the example copied inside the checkout
/// keeps its `../../base`, renders without a cluster into `tolerable.yaml`, starts report-only
/// and names the example's image until the copy's `images:` is edited; install.md's `grep`s of
/// the render print its samples.
#[test]
fn the_documented_overlay_commands_run_as_written() {
    let checkout = tempfile::tempdir().unwrap();
    let copied = tools::command("cp")
        .args(["-r"])
        .arg(root().join("kustomize"))
        .arg(checkout.path())
        .status()
        .unwrap();
    assert!(copied.success());
    let kubectl_dir = tools::path("kubectl").parent().unwrap().to_owned();
    let path = std::env::join_paths(std::iter::once(kubectl_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let out = std::process::Command::new("sh")
        .args([
            "-ec",
            "cp -r kustomize/overlays/example kustomize/overlays/mine\n\
             kubectl kustomize kustomize/overlays/mine/ > tolerable.yaml",
        ])
        .current_dir(checkout.path())
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = std::fs::read_to_string(checkout.path().join("tolerable.yaml")).unwrap();
    let docs = documents(&yaml);
    let container =
        &object(&docs, "Deployment", "tolerable")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"],
        "registry.example.com/platform/tolerable:v0.1.0"
    );
    assert!(
        !deployed_config(&docs).policy.enforce,
        "report-only at first"
    );
    // install.md's checks of the render print its samples.
    for (command, _) in common::doc_samples::COMPARED
        .iter()
        .filter(|(c, _)| c.ends_with(" tolerable.yaml"))
    {
        let out = std::process::Command::new("sh")
            .args(["-ec", command])
            .current_dir(checkout.path())
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            common::doc_samples::sample("docs/install.md", command),
            "{command}"
        );
    }
}

/// The crash-watch component (`kustomize/overlays/crash-watch`): the base plus reading BackOff
/// Events and the Pods they name (with their log), listing their owners' Pods, marking those
/// Pods, writing Events, and the gate releasers'
/// Lease in tolerable's own namespace — nothing else.
#[test]
fn the_crash_watch_component_grants_what_it_reads_and_writes() {
    let docs = documents(&render("kustomize/overlays/crash-watch"));
    assert!(deployed_config(&docs).crash_watch);
    let role = object(&docs, "ClusterRole", "tolerable-crash-watch");
    assert_eq!(
        role["rules"],
        serde_json::json!([
            {"apiGroups": [""], "resources": ["events"], "verbs": ["list", "watch", "create"]},
            {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
        ])
    );
    let election = object(&docs, "Role", "tolerable-crash-watch-leader-election");
    assert_eq!(election["metadata"]["namespace"], "tolerable-system");
    assert_eq!(
        election["rules"][1]["resourceNames"],
        serde_json::json!(["tolerable-gates"])
    );
}

/// The crash-heal component (`kustomize/overlays/crash-heal`, with crash-watch): the crash
/// watch's grants plus `delete` on pods — in a ClusterRole of its own, which the crash watch
/// alone does not have.
#[test]
fn the_crash_heal_component_grants_only_deleting_pods() {
    let docs = documents(&render("kustomize/overlays/crash-heal"));
    let config = deployed_config(&docs);
    assert!(config.crash_watch && config.crash_heal);
    let role = object(&docs, "ClusterRole", "tolerable-crash-heal");
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}])
    );
    let watch_only = documents(&render("kustomize/overlays/crash-watch"));
    assert!(!deployed_config(&watch_only).crash_heal);
    let deletes = |docs: &[Value]| {
        docs.iter()
            .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
            .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
            .any(|r| {
                r["verbs"]
                    .as_array()
                    .is_some_and(|v| v.contains(&"delete".into()))
            })
    };
    assert!(!deletes(&watch_only));
}
