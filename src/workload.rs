//! Workloads in manifests: every object that makes Pods (a Pod, a Deployment, a CronJob, an Argo
//! Rollout …), found in the documents an operator keeps in Git, with the Pod its template makes.
//! `tolerable review` decides on that Pod as the webhook would when the controller creates it.

mod documents;

use serde_json::Value;

use crate::admission::wire::PodObject;

pub(crate) use self::documents::{Document, Documents, Place, Step, Unread};

/// An object with a Pod template, and the Pod the template makes.
#[derive(Clone, Debug)]
pub(crate) struct Workload {
    pub(crate) kind: String,
    pub(crate) name: String,
    pub(crate) namespace: Option<String>,
    /// Where it was read: `file:document` (`-` for standard input), `cluster` for `audit`.
    pub(crate) source: String,
    /// The line its document starts on.
    pub(crate) line: Option<usize>,
    /// The Pod the template makes: `apiVersion: v1`, `kind: Pod`, the template's metadata (in the
    /// workload's namespace) and spec — without the containers whose image is unreadable.
    pub(crate) pod: Value,
    /// That Pod read once into the typed model the webhook decides on (`PodObject`: the core's
    /// `PodView` and the pull secrets), or why the webhook would refuse it: what `review` and
    /// `audit` decide on.
    pub(crate) object: Result<PodObject, String>,
    /// What in its manifest the API server would refuse (an image that is not a string), each
    /// on its container, with the input's line: the workload is then `invalid_object`, and its
    /// other images are still looked up.
    pub(crate) problems: Vec<String>,
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
    /// Documents (and List items) that are no Kubernetes object, and partial Pod templates.
    pub(crate) unread: Vec<Unread>,
}

impl Found {
    /// Adds what `document` holds: itself, or the items of a `List` (`kind: List`,
    /// `DeploymentList` …), each read the same way. `Err` for a document that is no Kubernetes
    /// object at all (a scalar, a mapping without `kind`), or for a List item that is none.
    pub(crate) fn add(&mut self, document: Value, source: &str) -> Result<(), String> {
        let unread = self.unread.len();
        self.add_object(document, &Read::new(Place::file(source), None));
        match self.unread.get(unread) {
            Some(first) => Err(format!("{source}: {}", first.reason)),
            None => Ok(()),
        }
    }

    /// Adds what one document read from a file holds; what is not a Kubernetes object is kept
    /// in `unread`, with where it is and why.
    pub(crate) fn add_document(&mut self, value: Value, document: &Document) {
        let read = Read::new(document.place.clone(), Some(document));
        self.add_object(value, &read);
    }

    fn add_object(&mut self, value: Value, read: &Read) {
        let mut object = match value {
            Value::Object(object) => object,
            other => return self.not_an_object(read, &other),
        };
        let Some(kind) = object
            .get("kind")
            .and_then(Value::as_str)
            .map(str::to_owned)
        else {
            let hint = hint_for(&read.place.file);
            return self.unread(read, format!("an object without a kind{hint}"));
        };
        // kustomize's own files (Kustomization, Component) carry a kind but are no Kubernetes
        // object: named as skipped, like a kustomization without one.
        if object
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| v.starts_with("kustomize.config.k8s.io/"))
        {
            return self.unread(
                read,
                format!("a kustomize {kind}, not a Kubernetes object (review `kubectl kustomize DIR` instead)"),
            );
        }
        if kind.ends_with("List") {
            if let Some(Value::Array(items)) = object.remove("items") {
                for (i, item) in items.into_iter().enumerate() {
                    self.add_object(item, &read.item(i));
                }
                return;
            }
        }
        let meta = object.get("metadata");
        let name = name_of(meta);
        let namespace = meta
            .and_then(|m| m.get("namespace"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        match template::pod_of(&kind, &object, namespace.as_deref(), read) {
            template::Template::None => self.skipped.push(Skipped {
                kind,
                name,
                source: read.place.source(),
            }),
            template::Template::Partial(why) => self.unread(
                read,
                format!("{kind}/{name}: a partial Pod template ({why}): a patch or an overlay's part; review the rendered manifests"),
            ),
            template::Template::Pod {
                pod,
                object,
                problems,
            } => self.workloads.push(Workload {
                kind,
                name,
                namespace,
                source: read.place.source(),
                line: read.place.line,
                pod,
                object,
                problems,
            }),
        }
    }

    fn not_an_object(&mut self, read: &Read, value: &Value) {
        let patch = value
            .as_array()
            .and_then(|items| items.first())
            .is_some_and(|first| first.get("op").is_some() && first.get("path").is_some());
        let hint = if patch { " (a JSON Patch)" } else { "" };
        let reason = format!(
            "expected a Kubernetes object, got {}{hint}",
            value_kind(value)
        );
        self.unread(read, reason);
    }

    fn unread(&mut self, read: &Read, reason: String) {
        let reason = match read.item {
            Some(i) => format!("List item {}: {reason}", i + 1),
            None => reason,
        };
        self.unread.push(Unread {
            place: read.place.clone(),
            reason,
        });
    }
}

/// Where an object is being read: its place, its document (to find lines in), and its index in
/// the document's List.
struct Read<'d> {
    place: Place,
    document: Option<&'d Document>,
    item: Option<usize>,
}

impl<'d> Read<'d> {
    fn new(place: Place, document: Option<&'d Document>) -> Self {
        Self {
            place,
            document,
            item: None,
        }
    }

    fn item(&self, index: usize) -> Self {
        Self {
            place: self.place.clone(),
            document: self.document,
            item: Some(index),
        }
    }

    /// The input's line of `path` in this object, if known.
    fn line_of(&self, path: &[Step]) -> Option<usize> {
        let document = self.document?;
        let mut full = Vec::with_capacity(path.len() + 2);
        if let Some(item) = self.item {
            full.extend([Step::Key("items"), Step::Index(item)]);
        }
        full.extend_from_slice(path);
        document.line_of(&full)
    }
}

/// Why a file's object has no kind, when its name says what it is.
fn hint_for(file: &str) -> &'static str {
    let name = file.rsplit('/').next().unwrap_or(file);
    match name {
        "kustomization.yaml" | "kustomization.yml" | "Kustomization" => {
            " (a kustomization: review `kubectl kustomize DIR` instead)"
        }
        "Chart.yaml" => " (a Helm chart's Chart.yaml: review `helm template` instead)",
        _ if name.starts_with("values") => " (Helm values? review `helm template` instead)",
        _ => ": not a Kubernetes object",
    }
}

/// `metadata.name`; `cleanup-*` for a `generateName: cleanup-`; a number as written;
/// `(no name)` without either.
fn name_of(meta: Option<&Value>) -> String {
    match meta.and_then(|m| m.get("name")) {
        Some(Value::String(name)) => name.clone(),
        Some(other @ (Value::Number(_) | Value::Bool(_))) => other.to_string(),
        _ => match meta
            .and_then(|m| m.get("generateName"))
            .and_then(Value::as_str)
        {
            Some(prefix) => format!("{prefix}*"),
            None => "(no name)".to_owned(),
        },
    }
}

mod template;

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

/// The documents of one text, empty documents left out.
#[cfg(test)]
pub(crate) fn documents(text: &str) -> Result<Vec<Value>, String> {
    Documents::new(text.as_bytes(), "-")
        .filter(|d| !matches!(d, Err(u) if u.reason.starts_with("empty")))
        .map(|d| d.map_err(|u| u.reason)?.parse())
        .filter(|v| !matches!(v, Ok(Value::Null)))
        .collect()
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
            (
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [a.yaml]\n",
                "a kustomize Kustomization, not a Kubernetes object",
            ),
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

    #[test]
    fn a_misspelt_containers_is_named() {
        for (key, named) in [
            ("contianers", true),
            ("container", true),
            ("initContainers", false),
        ] {
            let text = format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: typo}}\nspec:\n  template:\n    spec:\n      {key}:\n      - {{name: a, image: nginx}}\n"
            );
            let found = read(&text);
            let reason = &found.unread[0].reason;
            assert!(
                reason.contains("Deployment/typo: a partial Pod template (no containers"),
                "{reason}"
            );
            let says = format!("unknown field `{key}`: did you mean `containers`?");
            assert_eq!(reason.contains(&says), named, "{reason}");
        }
    }

    /// Every document of `text`, read as `review` reads a file.
    fn read(text: &str) -> Found {
        let mut found = Found::default();
        for document in Documents::new(text.as_bytes(), "repo/app.yaml") {
            match document {
                Ok(document) => match document.parse() {
                    Ok(value) => found.add_document(value, &document),
                    Err(reason) => found.unread.push(Unread {
                        place: document.place,
                        reason,
                    }),
                },
                Err(unread) => found.unread.push(unread),
            }
        }
        found
    }

    fn reasons(found: &Found) -> Vec<String> {
        found.unread.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_knative_service_needs_no_container_name_and_a_deployment_does() {
        let found = read(
            "apiVersion: serving.knative.dev/v1\nkind: Service\nmetadata: {name: hello}\nspec:\n  template:\n    spec:\n      containers:\n      - image: nginx\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  template:\n    spec:\n      containers:\n      - image: nginx\n",
        );
        let hello = &found.workloads[0];
        assert_eq!(
            (hello.label(), hello.source.as_str()),
            ("Service/hello".into(), "repo/app.yaml:1")
        );
        assert!(hello.problems.is_empty(), "{:?}", hello.problems);
        assert_eq!(hello.pod["spec"]["containers"][0]["name"], "containers[0]");
        assert_eq!(
            found.workloads[1].problems,
            ["containers[0] has no name (line 17)"]
        );
    }

    #[test]
    fn an_image_that_is_not_a_string_is_its_containers_problem_at_its_line() {
        let found = read(
            "# web\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  template:\n    spec:\n      containers:\n      - name: app\n        image: nginx\n      - name: sidecar\n        image: 1.0\n",
        );
        let web = &found.workloads[0];
        assert_eq!(
            web.problems,
            ["container \"sidecar\": its image 1.0 is not a string (line 12)"]
        );
        // The valid image is still looked up.
        let images: Vec<_> = web.pod["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["image"].clone())
            .collect();
        assert_eq!(images, ["nginx"]);
    }

    #[test]
    fn patches_and_partial_templates_follow_one_rule() {
        let found = read(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: a}\nspec:\n  template:\n    spec:\n      nodeSelector: {disk: ssd}\n\
             ---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: b}\nspec:\n  template:\n    spec:\n      containers: []\n\
             ---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: c}\nspec:\n  template:\n    spec:\n      containers:\n      - name: app\n        env: [{name: X, value: '1'}]\n",
        );
        assert!(found.workloads.is_empty());
        assert_eq!(
            reasons(&found),
            [
                "repo/app.yaml:1 (line 1): Deployment/a: a partial Pod template (no containers): a patch or an overlay's part; review the rendered manifests",
                "repo/app.yaml:2 (line 9): Deployment/b: a partial Pod template (containers: []): a patch or an overlay's part; review the rendered manifests",
                "repo/app.yaml:3 (line 17): Deployment/c: a partial Pod template (containers[0] (app) has no image): a patch or an overlay's part; review the rendered manifests",
            ]
        );
    }

    #[test]
    fn one_bad_document_or_list_item_loses_nothing_else() {
        let found = read(
            "apiVersion: v1\nkind: Pod\nmetadata: {generateName: cleanup-}\nspec: {containers: [{name: c, image: a}]}\n\
             ---\n- {op: add, path: /spec/replicas, value: 3}\n\
             ---\nimage: {{ .Values.image }}\n\
             ---\napiVersion: v1\nkind: List\nitems:\n- {metadata: {name: x}}\n- {apiVersion: v1, kind: Pod, metadata: {name: 7}, spec: {containers: [{name: c, image: b}]}}\n",
        );
        let names: Vec<_> = found
            .workloads
            .iter()
            .map(|w| (w.label(), w.source.clone()))
            .collect();
        assert_eq!(
            names,
            [
                ("Pod/cleanup-*".to_owned(), "repo/app.yaml:1".to_owned()),
                ("Pod/7".to_owned(), "repo/app.yaml:4".to_owned())
            ]
        );
        let reasons = reasons(&found);
        assert_eq!(
            reasons[0],
            "repo/app.yaml:2 (line 6): expected a Kubernetes object, got a list (a JSON Patch)"
        );
        assert!(
            reasons[1].starts_with("repo/app.yaml:3 (line 8): a template ({{ … }})"),
            "{}",
            reasons[1]
        );
        assert_eq!(reasons[2], "repo/app.yaml:4 (line 10): List item 1: an object without a kind: not a Kubernetes object");
        assert_eq!(reasons.len(), 3);
    }

    #[test]
    fn a_field_the_webhook_refuses_is_placed_in_the_input_not_in_a_rewritten_pod() {
        let found = read(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  template:\n    spec:\n      tolerations: [{key: a, effect: 5}]\n      containers: [{name: a, image: app}]\n",
        );
        assert_eq!(
            found.workloads[0].problems,
            ["the object is not a valid Pod: invalid type: integer `5`, expected a string (in the Pod template at line 10)"]
        );
        let unnamed = read(
            "apiVersion: v1\nkind: Pod\nmetadata: {}\nspec: {containers: [{name: c, image: a}]}\n",
        );
        assert_eq!(unnamed.workloads[0].label(), "Pod/(no name)");
    }
}
