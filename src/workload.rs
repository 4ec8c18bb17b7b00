//! Workloads in manifests: every object that makes Pods (a Pod, a Deployment, a CronJob, an Argo
//! Rollout …), found in the documents an operator keeps in Git, with the Pod its template makes.
//! `tolerable review` decides on that Pod as the webhook would when the controller creates it.

mod depth;
mod documents;
pub(crate) mod encoding;

use std::sync::Arc;

use serde_json::Value;

use crate::engine::PodObject;
use crate::kinds::Kinds;

pub(crate) use self::documents::{Document, Documents, Place, Step, Unread};

/// An object with a Pod template, and the Pod the template makes.
#[derive(Clone, Debug)]
pub(crate) struct Workload {
    pub(crate) kind: String,
    pub(crate) name: String,
    /// Which of the kind's Pod templates, when it has several or keeps one elsewhere than
    /// `spec.template`: `workerGroupSpecs[gpu]`, `tasks[build].taskSpec`.
    pub(crate) part: Option<String>,
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
    /// `Deployment/web` (or `Deployment/shop/web` when the namespace is known;
    /// `RayCluster/ml/ray (workerGroupSpecs[gpu])` for one of several templates).
    pub(crate) fn label(&self) -> String {
        let label = label(&self.kind, self.namespace.as_deref(), &self.name);
        match &self.part {
            Some(part) => format!("{label} ({part})"),
            None => label,
        }
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
#[derive(Debug)]
pub(crate) struct Found {
    pub(crate) workloads: Vec<Workload>,
    pub(crate) skipped: Vec<Skipped>,
    /// Documents (and List items) that are no Kubernetes object, and partial Pod templates.
    pub(crate) unread: Vec<Unread>,
    /// Where each kind keeps its Pod templates.
    kinds: Arc<Kinds>,
}

impl Default for Found {
    fn default() -> Self {
        Self::with_kinds(Kinds::built_in())
    }
}

impl Found {
    /// Reads with `kinds` (the built-in table and the config's rows).
    pub(crate) fn with_kinds(kinds: Arc<Kinds>) -> Self {
        Self {
            workloads: Vec::new(),
            skipped: Vec::new(),
            unread: Vec::new(),
            kinds,
        }
    }

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
        let object = Value::Object(object);
        let meta = object.get("metadata");
        let name = name_of(meta);
        let namespace = meta
            .and_then(|m| m.get("namespace"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let pods = template::pods_of(&kind, &object, namespace.as_deref(), read, &self.kinds);
        if let Some(path) = pods.elsewhere {
            return self.unread(
                read,
                format!("{kind}/{name}: containers at a position review does not read ({path}): name where the kind keeps its Pod templates in [workloads] pod_specs"),
            );
        }
        if pods.found.is_empty() {
            return self.skipped.push(Skipped {
                kind,
                name,
                source: read.place.source(),
            });
        }
        self.add_pods(pods.found, &kind, &name, namespace.as_ref(), read);
    }

    /// Each Pod template of one object: a workload, or a partial template's skipped input.
    fn add_pods(
        &mut self,
        pods: Vec<(String, template::Template)>,
        kind: &str,
        name: &str,
        namespace: Option<&String>,
        read: &Read,
    ) {
        for (part, pod) in pods {
            let label = if part.is_empty() {
                format!("{kind}/{name}")
            } else {
                format!("{kind}/{name} ({part})")
            };
            match pod {
                template::Template::None => {}
                template::Template::Partial(why) => self.unread(
                    read,
                    format!("{label}: a partial Pod template ({why}): a patch or an overlay's part; review the rendered manifests"),
                ),
                template::Template::Pod {
                    pod,
                    object,
                    problems,
                } => self.workloads.push(Workload {
                    kind: kind.to_owned(),
                    name: name.to_owned(),
                    part: (!part.is_empty()).then_some(part),
                    namespace: namespace.cloned(),
                    source: read.place.source(),
                    line: read.place.line,
                    pod,
                    object,
                    problems,
                }),
            }
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
            full.extend([Step::key("items"), Step::Index(item)]);
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
    /// The images of a workload's Pod, as `tests/data/kinds/expected.txt` names them.
    fn short_images(workload: &Workload) -> Vec<String> {
        let spec = &workload.pod["spec"];
        ["initContainers", "containers"]
            .iter()
            .flat_map(|list| spec[list].as_array().into_iter().flatten())
            .map(|c| {
                let image = c["image"].as_str().unwrap();
                let image = image.trim_start_matches("REGISTRY/fixtures/");
                image.trim_end_matches(":v1").to_owned()
            })
            .collect()
    }

    #[test]
    fn every_pod_template_the_kinds_table_names_is_a_workload_with_the_kinds_names() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/kinds");
        let expected = std::fs::read_to_string(format!("{dir}/expected.txt")).unwrap();
        let mut files: Vec<&str> = expected
            .lines()
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        files.dedup();
        for file in files {
            let text = std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
            let found = read(&text);
            assert!(found.unread.is_empty(), "{file}: {:?}", reasons(&found));
            let got: Vec<String> = found
                .workloads
                .iter()
                .map(|w| format!("{file} {} {}", w.label(), short_images(w).join(" ")))
                .collect();
            let want: Vec<&str> = expected
                .lines()
                .filter(|l| l.starts_with(&format!("{file} ")))
                .collect();
            assert_eq!(got, want, "{file}");
            for workload in &found.workloads {
                assert!(
                    workload.problems.is_empty(),
                    "{}: {:?}",
                    workload.label(),
                    workload.problems
                );
                assert!(
                    workload.object.is_ok(),
                    "{}: {:?}",
                    workload.label(),
                    workload.object
                );
            }
        }
    }

    #[test]
    fn containers_where_no_row_looks_are_named_with_their_path_and_a_row_reads_them() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/kinds");
        let text = std::fs::read_to_string(format!("{dir}/inhouse.yaml")).unwrap();
        let found = read(&text);
        assert!(found.workloads.is_empty() && found.skipped.is_empty());
        assert_eq!(
            reasons(&found),
            ["repo/app.yaml:1 (line 1): Runner/runner: containers at a position review does not read (spec.pool.pod.containers): name where the kind keeps its Pod templates in [workloads] pod_specs"]
        );
        let kinds = Kinds::with(&["Runner.ci.example.com=spec.pool.pod".to_owned()]).unwrap();
        let mut found = Found::with_kinds(Arc::new(kinds));
        let document = Documents::new(text.as_bytes(), "runner.yaml")
            .next()
            .unwrap()
            .unwrap();
        found.add_document(document.parse().unwrap(), &document);
        assert_eq!(found.workloads[0].label(), "Runner/runner");
        assert_eq!(short_images(&found.workloads[0]), ["multiarch-oci"]);
    }

    #[test]
    fn an_image_with_white_space_around_it_is_a_problem_not_trimmed() {
        let found = read(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: a\n    image: '  nginx  '\n",
        );
        assert_eq!(
            found.workloads[0].problems,
            ["container \"a\": its image \"  nginx  \" has leading or trailing white space (line 7)"]
        );
    }
}
