//! Workloads in manifests: every object that makes Pods (a Pod, a Deployment, a CronJob, an Argo
//! Rollout …), found in the documents an operator keeps in Git, with the Pod its template makes.
//! `tolerable review` decides on that Pod as the webhook would when the controller creates it.

use serde_json::{json, Map, Value};

/// An object with a Pod template, and the Pod the template makes.
#[derive(Clone, Debug)]
pub(crate) struct Workload {
    pub(crate) kind: String,
    pub(crate) name: String,
    pub(crate) namespace: Option<String>,
    /// Where it was read (a file, or `-` for standard input).
    pub(crate) source: String,
    /// The Pod the template makes: `apiVersion: v1`, `kind: Pod`, the template's metadata (in the
    /// workload's namespace) and spec.
    pub(crate) pod: Value,
}

impl Workload {
    /// `Deployment/web` (or `Deployment/shop/web` when the namespace is known).
    pub(crate) fn label(&self) -> String {
        label(&self.kind, self.namespace.as_deref(), &self.name)
    }
}

/// `Deployment/shop/web`, or `Deployment/web` without a namespace: how reports name a workload.
pub(crate) fn label(kind: &str, namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(namespace) => format!("{kind}/{namespace}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

/// An object without a Pod template (a Service, a ConfigMap …): counted, not reviewed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Skipped {
    pub(crate) kind: String,
    pub(crate) name: String,
    pub(crate) source: String,
}

/// What a set of documents holds.
#[derive(Debug, Default)]
pub(crate) struct Found {
    pub(crate) workloads: Vec<Workload>,
    pub(crate) skipped: Vec<Skipped>,
}

impl Found {
    /// Adds what `document` holds: itself, or the items of a `List` (`kind: List`,
    /// `DeploymentList` …), each read the same way. `Err` for a document that is no Kubernetes
    /// object at all (a scalar, a mapping without `kind`).
    pub(crate) fn add(&mut self, document: Value, source: &str) -> Result<(), String> {
        let Value::Object(mut object) = document else {
            return Err(format!(
                "{source}: expected a Kubernetes object, got {}",
                value_kind(&document)
            ));
        };
        let Some(kind) = object
            .get("kind")
            .and_then(Value::as_str)
            .map(str::to_owned)
        else {
            return Err(format!("{source}: an object without a kind"));
        };
        if kind.ends_with("List") {
            if let Some(Value::Array(items)) = object.remove("items") {
                for item in items {
                    self.add(item, source)?;
                }
                return Ok(());
            }
        }
        let meta = object.get("metadata");
        let name = string_at(meta, "name")
            .or_else(|| string_at(meta, "generateName"))
            .unwrap_or_default();
        let namespace = string_at(meta, "namespace");
        match pod_of(&kind, &object, namespace.as_deref()) {
            Some(pod) => self.workloads.push(Workload {
                kind,
                name,
                namespace,
                source: source.to_owned(),
                pod,
            }),
            None => self.skipped.push(Skipped {
                kind,
                name,
                source: source.to_owned(),
            }),
        }
        Ok(())
    }
}

/// The Pod `object` makes: a Pod is its own; a CronJob's is under `spec.jobTemplate`; a
/// PodTemplate's under `template`; any other kind's under `spec.template` when that has
/// containers (Deployments, StatefulSets, Jobs, and custom kinds shaped like them).
fn pod_of(kind: &str, object: &Map<String, Value>, namespace: Option<&str>) -> Option<Value> {
    let template = match kind {
        "Pod" => return Some(Value::Object(object.clone())),
        "CronJob" => object.get("spec")?.pointer("/jobTemplate/spec/template")?,
        "PodTemplate" => object.get("template")?,
        _ => object.get("spec")?.get("template")?,
    };
    let spec = template.get("spec")?;
    spec.get("containers")?.as_array()?;
    let mut metadata = template
        .get("metadata")
        .cloned()
        .unwrap_or_else(|| json!({}));
    if let (Some(namespace), Some(meta)) = (namespace, metadata.as_object_mut()) {
        meta.entry("namespace")
            .or_insert_with(|| Value::String(namespace.to_owned()));
    }
    Some(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
    }))
}

fn string_at(meta: Option<&Value>, key: &str) -> Option<String> {
    Some(meta?.get(key)?.as_str()?.to_owned())
}

fn value_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "an empty document",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The documents of one text: one JSON value, or every document of a (multi-document) YAML
/// stream, empty documents left out.
pub(crate) fn documents(text: &str) -> Result<Vec<Value>, String> {
    if let Ok(value) = serde_json::from_str::<Value>(text) {
        return Ok(vec![value]);
    }
    let mut out = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(text) {
        let value: Value = serde::Deserialize::deserialize(document)
            .map_err(|e| format!("input is neither JSON nor YAML: {e}"))?;
        if !value.is_null() {
            out.push(value);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(text: &str) -> Found {
        let mut found = Found::default();
        for document in documents(text).unwrap() {
            found.add(document, "f.yaml").unwrap();
        }
        found
    }

    const CONTAINERS: &str = "spec:\n      containers:\n      - name: c\n        image: app:1\n";

    #[test]
    fn every_kind_with_a_pod_template_is_a_workload() {
        let text = format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: shop}}\nspec:\n  template:\n    metadata: {{labels: {{app: web}}}}\n    {CONTAINERS}\
             ---\napiVersion: batch/v1\nkind: CronJob\nmetadata: {{name: nightly}}\nspec:\n  jobTemplate:\n    spec:\n      template:\n        spec:\n          containers: [{{name: c, image: 'app:2'}}]\n\
             ---\napiVersion: v1\nkind: PodTemplate\nmetadata: {{name: t}}\ntemplate:\n  spec:\n    containers: [{{name: c, image: 'app:3'}}]\n\
             ---\napiVersion: argoproj.io/v1alpha1\nkind: Rollout\nmetadata: {{name: canary}}\nspec:\n  template:\n    {CONTAINERS}\
             ---\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nspec: {{ports: [{{port: 80}}]}}\n"
        );
        let found = found(&text);
        let kinds: Vec<_> = found.workloads.iter().map(|w| w.label()).collect();
        assert_eq!(
            kinds,
            [
                "Deployment/shop/web",
                "CronJob/nightly",
                "PodTemplate/t",
                "Rollout/canary"
            ]
        );
        let web = &found.workloads[0].pod;
        assert_eq!(web["kind"], "Pod");
        assert_eq!(web["metadata"]["namespace"], "shop");
        assert_eq!(web["metadata"]["labels"]["app"], "web");
        assert_eq!(web["spec"]["containers"][0]["image"], "app:1");
        assert_eq!(
            found.workloads[1].pod["spec"]["containers"][0]["image"],
            "app:2"
        );
        assert_eq!(
            found.skipped,
            [Skipped {
                kind: "Service".into(),
                name: "web".into(),
                source: "f.yaml".into()
            }]
        );
    }

    #[test]
    fn lists_are_opened_and_templates_without_containers_skipped() {
        let text = r#"{"apiVersion":"v1","kind":"List","items":[
            {"kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"a"}]}},
            {"kind":"DeploymentList","items":[{"kind":"Deployment","metadata":{"name":"d"},
              "spec":{"template":{"spec":{"containers":[{"name":"c","image":"b"}]}}}}]},
            {"kind":"Deployment","metadata":{"name":"empty"},"spec":{}}]}"#;
        let found = found(text);
        let names: Vec<_> = found.workloads.iter().map(|w| w.label()).collect();
        assert_eq!(names, ["Pod/p", "Deployment/d"]);
        assert_eq!(found.skipped.len(), 1);
        assert_eq!(found.skipped[0].name, "empty");
    }

    #[test]
    fn documents_that_are_no_object_are_errors() {
        let mut found = Found::default();
        for (text, want) in [
            ("just a string", "got a string"),
            ("- a\n- b\n", "got a list"),
            ("metadata: {name: x}\n", "without a kind"),
        ] {
            let err = documents(text)
                .unwrap()
                .into_iter()
                .try_for_each(|d| found.add(d, "in.yaml"))
                .unwrap_err();
            assert!(err.contains(want) && err.starts_with("in.yaml"), "{err}");
        }
        assert!(documents("key: [unclosed")
            .unwrap_err()
            .contains("neither JSON nor YAML"));
    }
}
