//! kustomize/ is rendered from the Helm chart (`scripts/kustomize-from-chart.py`, run by `make
//! generate`): the one drift check. (a) The committed base and generated components are what
//! the generator prints now; (b) `kubectl kustomize` of the base, and of the base with each
//! component, is the chart's render with the matching values, object by object, after the
//! generator's normalisation (Helm-only labels dropped, kustomize's name suffixes removed, the
//! config compared as tolerable loads it). The hand-written components (monitoring,
//! shared-cache, namespaced-pull-secrets, credential-provider-image, crash-heal) are held to the
//! chart the same way, through their example overlays.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use common::tools::{self, write_temp};
use serde_json::{json, Value};

/// The generator's answer to `args`, as JSON.
fn generator(args: &[&str]) -> Value {
    let out = tools::python_script("kustomize-from-chart.py")
        .args(args)
        .current_dir(tools::root())
        .output()
        .unwrap();
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "kustomize-from-chart.py {args:?}: {why}"
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The chart rendered with `values`, normalised.
fn chart(values: &Value) -> Vec<Value> {
    let values = values.to_string();
    as_list(generator(&["chart", &values]))
}

/// `kubectl kustomize dir`, normalised as the chart's render is.
fn kustomize(dir: &Path) -> Vec<Value> {
    let file = write_temp(&tools::render(dir));
    as_list(generator(&["kustomize", file.path().to_str().unwrap()]))
}

fn as_list(value: Value) -> Vec<Value> {
    value.as_array().unwrap().clone()
}

/// The objects of `docs` by kind, namespace and name.
fn by_key(docs: Vec<Value>) -> BTreeMap<String, Value> {
    docs.into_iter()
        .map(|d| {
            let meta = &d["metadata"];
            let key = format!(
                "{} {}/{}",
                d["kind"].as_str().unwrap(),
                meta["namespace"].as_str().unwrap_or(""),
                meta["name"].as_str().unwrap()
            );
            (key, d)
        })
        .collect()
}

/// `kustomize`'s objects are `chart`'s: the same objects, each equal.
fn assert_same_objects(case: &str, chart: Vec<Value>, kustomize: Vec<Value>) {
    let (chart, kustomize) = (by_key(chart), by_key(kustomize));
    assert_eq!(
        chart.keys().collect::<Vec<_>>(),
        kustomize.keys().collect::<Vec<_>>(),
        "{case}: the objects"
    );
    for (key, object) in &chart {
        if let Some(at) = first_difference(object, &kustomize[key], String::new()) {
            panic!("{case}: {key} differs at {at} (chart, then kustomize)");
        }
    }
}

/// Where `a` and `b` first differ: a JSON pointer, and the two values there.
fn first_difference(a: &Value, b: &Value, at: String) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let (null, path) = (Value::Null, format!("{at}/{k}"));
                first_difference(x.get(k).unwrap_or(&null), y.get(k).unwrap_or(&null), path)
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(p, q, format!("{at}/{i}"))),
        _ if a == b => None,
        _ => Some(format!("{at}: {a} / {b}")),
    }
}

/// A kustomization in a temporary directory using the base and `component` (through a link to
/// the checkout's kustomize/: kustomize refuses absolute paths to a base).
fn with_component(component: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(tools::root().join("kustomize"), dir.path().join("k")).unwrap();
    std::fs::create_dir(dir.path().join("overlay")).unwrap();
    std::fs::write(
        dir.path().join("overlay/kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n  - ../k/base\ncomponents:\n  - ../k/components/{component}\n"
        ),
    )
    .unwrap();
    dir
}

/// (a): every file the generator writes is committed as it prints it, and a generated
/// component's directory holds nothing else; the base's other files are the hand-written
/// kustomization, Namespace, generated config (`tolerable reference`) and credentials README.
#[test]
fn the_kustomize_files_are_what_the_generator_prints() {
    let printed = generator(&["print"]);
    let printed = printed.as_object().unwrap();
    let root = tools::root();
    for (path, text) in printed {
        let committed = std::fs::read_to_string(root.join(path))
            .unwrap_or_else(|e| panic!("{path}: {e}; run `make generate`"));
        assert_eq!(
            &committed,
            text.as_str().unwrap(),
            "{path} drifted from the chart: run `make generate`"
        );
    }
    let components = generator(&["components"]);
    let mut dirs: Vec<String> = components
        .as_object()
        .unwrap()
        .keys()
        .map(|c| format!("kustomize/components/{c}"))
        .collect();
    dirs.push("kustomize/base".to_owned());
    let hand_written = [
        "kustomize/base/kustomization.yaml",
        "kustomize/base/namespace.yaml",
        "kustomize/base/tolerable.toml",
        "kustomize/base/creds",
    ];
    for dir in dirs {
        for entry in std::fs::read_dir(root.join(&dir)).unwrap() {
            let path = format!("{dir}/{}", entry.unwrap().file_name().to_string_lossy());
            assert!(
                printed.contains_key(&path) || hand_written.contains(&path.as_str()),
                "{path}: neither generated nor known hand-written (stale? run `make generate`)"
            );
        }
    }
}

/// (b) for the base and every generated component: kustomize renders what the chart renders
/// with the component's values.
#[test]
fn kustomize_renders_what_the_chart_renders() {
    assert_same_objects(
        "kustomize/base",
        chart(&json!({})),
        kustomize(&tools::root().join("kustomize/base")),
    );
    let components = generator(&["components"]);
    for (component, values) in components.as_object().unwrap() {
        let dir = with_component(component);
        assert_same_objects(
            component,
            chart(values),
            kustomize(&dir.path().join("overlay")),
        );
    }
}

/// (b) for the hand-written components, each through the overlay that shows it, with the chart
/// values that overlay stands for; and the overlay of no API access at all.
#[test]
fn the_hand_written_components_render_what_the_chart_renders() {
    let root = tools::root();
    let provider_config = std::fs::read_to_string(
        root.join("kustomize/components/credential-provider-image/credential-providers.yaml"),
    )
    .unwrap();
    let runbooks = "https://git.example.com/platform/tolerable/blob/v0.1.0/docs/runbooks";
    let cases = [
        (
            "monitoring",
            json!({"monitoring": {"podMonitor": {"enabled": true},
                "prometheusRule": {"enabled": true, "runbookBaseUrl": runbooks},
                "dashboard": {"enabled": true}}}),
        ),
        (
            "namespaced-pull-secrets",
            json!({"rbac": {"pullSecretNamespaces": ["team-a", "team-b"]}}),
        ),
        (
            "credential-provider-image",
            json!({"credentialProviders": {"image": {"enabled": true, "config": provider_config}},
                   "image": {"repository": "registry.example.com/platform/tolerable-ecr"},
                   "serviceAccount": {"annotations": {
                       "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/tolerable-ecr-read"}}}),
        ),
        (
            "crash-heal",
            json!({"config": {"crashes": {"watch": true, "heal": true}}}),
        ),
        (
            "no-cluster-access",
            json!({"config": {"credentials": {"read_pull_secrets": false},
                "nodes": {"watch": false}, "policy": {"namespace_policy": false}}}),
        ),
    ];
    let runbook_file =
        std::fs::read_to_string(root.join("kustomize/overlays/monitoring/runbooks.yaml")).unwrap();
    assert!(runbook_file.contains(&format!("url: {runbooks}\n")));
    for (overlay, values) in cases {
        assert_same_objects(
            overlay,
            chart(&values),
            kustomize(&root.join("kustomize/overlays").join(overlay)),
        );
    }
}

/// The monitoring component's rule and dashboard files are the chart's, byte for byte (the
/// comparison above collapses the rule's white space).
#[test]
fn the_monitoring_files_are_the_charts() {
    let component = tools::root().join("kustomize/components/monitoring");
    let files = tools::root().join("charts/tolerable/files");
    for file in ["prometheusrule.yaml", "dashboard.json"] {
        assert_eq!(
            std::fs::read(files.join(file)).unwrap(),
            std::fs::read(component.join(file)).unwrap(),
            "charts/tolerable/files/{file} drifted from kustomize/components/monitoring/{file}"
        );
    }
}

/// The shared cache, hand-written: the chart's Valkey with its values, but for what kustomize
/// does otherwise by design — its objects are named `valkey` (the chart's after the release),
/// the URL takes Valkey's namespace from the Pod (so an overlay's `namespace:` reaches it) and
/// the password's Secret, which no kustomize file can generate, is optional until created.
#[test]
fn the_shared_cache_renders_what_the_chart_renders() {
    let values = json!({"sharedCache": {"valkey": {"enabled": true},
                                        "passwordSecret": {"name": "valkey-auth"}}});
    let mut chart = chart(&values);
    let dir = with_component("shared-cache");
    let mut kustomize = kustomize(&dir.path().join("overlay"));
    for object in &mut chart {
        if object["metadata"]["name"] == "tolerable-valkey" {
            object["metadata"]["name"] = json!("valkey");
        }
    }
    let config = chart
        .iter_mut()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "tolerable-config")
        .unwrap();
    let url = &mut config["data"]["tolerable.toml"]["shared_cache"]["url"];
    assert_eq!(url, "redis://tolerable-valkey.tolerable-system.svc:6379/0");
    *url = json!("redis://valkey.$(VALKEY_NAMESPACE).svc:6379/0");
    let env = kustomize
        .iter_mut()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "tolerable")
        .and_then(|d| d.pointer_mut("/spec/template/spec/containers/0/env"))
        .and_then(Value::as_array_mut)
        .unwrap();
    let namespace_var = json!({"name": "VALKEY_NAMESPACE",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}});
    assert_eq!(env.remove(0), namespace_var);
    let password = env.remove(0);
    assert_eq!(password["valueFrom"]["secretKeyRef"]["optional"], true);
    let mut required = password.clone();
    required["valueFrom"]["secretKeyRef"]
        .as_object_mut()
        .unwrap()
        .remove("optional");
    env.push(required);
    assert_same_objects("shared-cache", chart, kustomize);
}
