//! A workload's Pod template, read as the decision needs it: its images. The one rule for
//! patches and partial templates: a Pod template with no `containers`, `containers: []`, or a
//! container without `image` is partial (a kustomize patch, an overlay's part) — listed as a
//! skipped input with the reason, never reviewed. A container's name is optional where the
//! kind allows it (custom kinds such as Knative Services); an image that is not a string is a
//! problem of that container, and the workload's other images are still looked up.

use serde_json::{json, Map, Value};

use super::{Read, Step};
use crate::engine::PodObject;
use crate::kinds::{Kinds, Shape};

// Built and taken apart once per object read, never stored in bulk: boxing the large variant
// would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub(super) enum Template {
    /// No Pod template (a Service, a ConfigMap, a Deployment without `spec.template`).
    None,
    /// A template without everything a Pod needs: why.
    Partial(String),
    Pod {
        pod: Value,
        /// The Pod read as the webhook reads it, or why it cannot be.
        object: Result<PodObject, String>,
        problems: Vec<String>,
    },
}

/// What one object holds: its Pod templates (each with its name in the kind:
/// `workerGroupSpecs[gpu]`, empty for a kind's one template), or none and where `containers`
/// are that review does not read.
pub(super) struct Pods {
    pub(super) found: Vec<(String, Template)>,
    pub(super) elsewhere: Option<String>,
}

/// Kubernetes' own kinds with a Pod template (or that are a Pod): their containers need names,
/// and a template of theirs without containers is partial.
const BUILT_IN: [&str; 9] = [
    "Pod",
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "ReplicationController",
    "Job",
    "CronJob",
    "PodTemplate",
];

/// Where `object`'s Pods are read.
struct At<'r, 'd> {
    read: &'r Read<'d>,
    namespace: Option<&'r str>,
    kinds: &'r Kinds,
    /// Kubernetes' own kind: container names required, a template without containers partial.
    built_in: bool,
}

/// The Pods `object` makes: a Pod is its own; every other kind's are where the kinds table
/// ([`crate::kinds`]) says, and a kind it does not name has one at `spec.template` when that
/// has `containers` (custom kinds shaped like a Deployment).
pub(super) fn pods_of(
    kind: &str,
    object: &Value,
    namespace: Option<&str>,
    read: &Read,
    kinds: &Kinds,
) -> Pods {
    let api_version = object.get("apiVersion").and_then(Value::as_str);
    // Kubernetes' own groups have no dot in their name (v1, apps/v1); custom resources' do.
    let group = api_version.map_or("", |v| v.split('/').next().unwrap_or_default());
    let at = At {
        read,
        namespace,
        kinds,
        built_in: BUILT_IN.contains(&kind) && !group.contains('.'),
    };
    let mut found = Vec::new();
    if kind == "Pod" && at.built_in {
        let spec = object.get("spec").and_then(Value::as_object);
        let Some(spec) = spec else {
            return Pods {
                found: vec![(String::new(), Template::Partial("no spec".into()))],
                elsewhere: None,
            };
        };
        let template = at.pod(spec, Some(object), vec![Step::key("spec")], true);
        found.push((String::new(), template));
    } else {
        found = at.table(kind, api_version, object, &[]);
    }
    let elsewhere = found
        .is_empty()
        .then(|| containers_at(object, &mut String::new(), 0))
        .flatten();
    Pods { found, elsewhere }
}

impl At<'_, '_> {
    /// The Pods at the paths the table gives `kind` (`base`: where `object` is in its
    /// document).
    fn table(
        &self,
        kind: &str,
        api_version: Option<&str>,
        object: &Value,
        base: &[Step],
    ) -> Vec<(String, Template)> {
        let rows = self.kinds.rows(kind, api_version);
        if rows.is_empty() {
            // A kind the table does not name, shaped like a Deployment.
            let spec = object.pointer("/spec/template/spec/containers");
            if !spec.is_some_and(Value::is_array) {
                return Vec::new();
            }
            let template = &object["spec"]["template"];
            let path = [base, &[Step::key("spec"), Step::key("template")]].concat();
            return vec![(String::new(), self.template(template, path))];
        }
        // A kind with one template names it no further (`CronJob/nightly`).
        let one = rows.len() == 1 && rows[0].reaches_one();
        let mut found = Vec::new();
        for row in rows {
            for mut reached in row.reach(object) {
                if one {
                    reached.part.clear();
                }
                let steps = [base, &reached.steps].concat();
                match reached.shape {
                    Shape::Template => {
                        found.push((reached.part, self.template(reached.value, steps)))
                    }
                    Shape::Tekton => found.push((reached.part, self.tekton(reached.value, steps))),
                    Shape::Argo => {
                        if let Some(pod) = self.argo(reached.value, steps) {
                            found.push((reached.part, pod));
                        }
                    }
                    Shape::Object => {
                        let inner = reached.value;
                        let kind = inner
                            .get("kind")
                            .and_then(Value::as_str)
                            .unwrap_or_default();
                        let version = inner.get("apiVersion").and_then(Value::as_str);
                        for (part, pod) in self.table(kind, version, inner, &steps) {
                            let part = [reached.part.as_str(), part.as_str()]
                                .into_iter()
                                .filter(|p| !p.is_empty())
                                .collect::<Vec<_>>()
                                .join(".");
                            found.push((part, pod));
                        }
                    }
                }
            }
        }
        found.retain(|(_, pod)| !matches!(pod, Template::None));
        found
    }

    /// A Pod template (`metadata`, `spec`) or a Pod spec (`containers`) at `path`.
    fn template(&self, value: &Value, path: Vec<Step>) -> Template {
        if let Some(spec) = value.as_object().filter(|v| v.contains_key("containers")) {
            if !value.get("spec").is_some_and(Value::is_object) {
                return self.pod(spec, None, path, false);
            }
        }
        match value.get("spec").and_then(Value::as_object) {
            Some(spec) => {
                let path = [path, vec![Step::key("spec")]].concat();
                self.pod(spec, Some(value), path, false)
            }
            None if self.built_in => Template::Partial("no spec".into()),
            None => Template::None,
        }
    }

    /// A Tekton task spec: its steps (an image from `stepTemplate` when a step names none)
    /// and sidecars, the containers of the one Pod it runs in.
    fn tekton(&self, task: &Value, path: Vec<Step>) -> Template {
        let Some(steps) = task.get("steps").and_then(Value::as_array) else {
            return Template::Partial("no steps".into());
        };
        let default_image = task.pointer("/stepTemplate/image");
        let mut containers: Vec<Value> = steps
            .iter()
            .map(|step| {
                let mut step = step.clone();
                if let (Some(fields), Some(image)) = (step.as_object_mut(), default_image) {
                    fields.entry("image").or_insert_with(|| image.clone());
                }
                step
            })
            .collect();
        containers.extend(
            task.get("sidecars")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .cloned(),
        );
        let mut spec = Map::new();
        spec.insert("containers".into(), Value::Array(containers));
        self.pod(&spec, task.get("metadata").map(|_| task), path, false)
    }

    /// An Argo Workflows template's Pod: none for a template that runs no container (steps,
    /// dag, suspend, resource).
    fn argo(&self, template: &Value, path: Vec<Step>) -> Option<Template> {
        let mut containers = Vec::new();
        for key in ["container", "script"] {
            if let Some(container) = template.get(key).filter(|c| c.is_object()) {
                let mut container = container.clone();
                if let Some(fields) = container.as_object_mut() {
                    fields.remove("source");
                    fields
                        .entry("name")
                        .or_insert_with(|| Value::String("main".into()));
                }
                containers.push(container);
            }
        }
        let set = template
            .pointer("/containerSet/containers")
            .and_then(Value::as_array);
        containers.extend(set.into_iter().flatten().cloned());
        if containers.is_empty() {
            return None;
        }
        containers.extend(
            template
                .get("sidecars")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .cloned(),
        );
        let mut spec = Map::new();
        spec.insert("containers".into(), Value::Array(containers));
        if let Some(init) = template.get("initContainers") {
            spec.insert("initContainers".into(), init.clone());
        }
        Some(self.pod(&spec, Some(template), path, false))
    }

    /// The Pod of `spec` (at `spec_path`) with `template`'s metadata: `whole` for a Pod
    /// itself, whose other fields are kept.
    fn pod(
        &self,
        spec: &Map<String, Value>,
        template: Option<&Value>,
        spec_path: Vec<Step>,
        whole: bool,
    ) -> Template {
        let mut spec = spec.clone();
        let mut problems = Vec::new();
        let images = Containers {
            names_required: self.built_in,
            spec_path: &spec_path,
            read: self.read,
        };
        if let Err(why) = images.read(&mut spec, &mut problems) {
            return Template::Partial(why);
        }
        let pod = match template.and_then(Value::as_object) {
            Some(pod) if whole => {
                let mut pod = pod.clone();
                pod.insert("spec".into(), Value::Object(spec));
                Value::Object(pod)
            }
            template => pod_from_template(template, Value::Object(spec), self.namespace),
        };
        // What else the webhook would refuse, said here with the input's line (of the template:
        // the parser names no field).
        let object = PodObject::from_value(&pod);
        if let Err(reason) = &object {
            let template_path = &spec_path[..spec_path.len().saturating_sub(1)];
            let at = self
                .read
                .line_of(template_path)
                .map(|l| format!(" (in the Pod template at line {l})"));
            problems.push(format!("{reason}{}", at.unwrap_or_default()));
        }
        Template::Pod {
            pod,
            object,
            problems,
        }
    }
}

/// Where a list of containers with images is in `value`, when there is one: `spec.jobs[0].containers`.
fn containers_at(value: &Value, path: &mut String, depth: usize) -> Option<String> {
    // The document's nesting was bounded before it was parsed; this is a second stop.
    if depth > 64 {
        return None;
    }
    let len = path.len();
    let found = match value {
        Value::Object(fields) => fields.iter().find_map(|(key, item)| {
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(key);
            let here = key == "containers"
                && item.as_array().is_some_and(|list| {
                    list.iter()
                        .any(|c| c.get("image").is_some_and(Value::is_string))
                });
            let found = if here {
                Some(path.clone())
            } else {
                containers_at(item, path, depth + 1)
            };
            path.truncate(len);
            found
        }),
        Value::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
            path.push_str(&format!("[{i}]"));
            let found = containers_at(item, path, depth + 1);
            path.truncate(len);
            found
        }),
        _ => None,
    };
    found
}

fn pod_from_template(
    template: Option<&Map<String, Value>>,
    spec: Value,
    namespace: Option<&str>,
) -> Value {
    let mut metadata = template
        .and_then(|t| t.get("metadata"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    if let (Some(namespace), Some(meta)) = (namespace, metadata.as_object_mut()) {
        meta.entry("namespace")
            .or_insert_with(|| Value::String(namespace.to_owned()));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
    })
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" (line {l})")).unwrap_or_default()
}

/// A key of a Pod spec that looks like a misspelt `containers` (`contianers`, `container`):
/// named, so a typo is not mistaken for a patch.
fn misspelt_containers(spec: &Map<String, Value>) -> String {
    let near = |key: &str| {
        let a = key.to_ascii_lowercase();
        let sorted = |s: &str| {
            let mut c: Vec<char> = s.chars().collect();
            c.sort_unstable();
            c
        };
        let known = ["containers", "initcontainers", "ephemeralcontainers"];
        !known.contains(&a.as_str())
            && a.len().abs_diff("containers".len()) <= 2
            && (sorted(&a) == sorted("containers") || a.starts_with("contain"))
    };
    match spec.keys().find(|k| near(k)) {
        Some(key) => format!("; unknown field `{key}`: did you mean `containers`?"),
        None => String::new(),
    }
}

/// Reads a template's container lists.
struct Containers<'r, 'd> {
    names_required: bool,
    spec_path: &'r [Step],
    read: &'r Read<'d>,
}

impl Containers<'_, '_> {
    /// Keeps the containers whose image can be looked up (named, when the kind lets them go
    /// without a name, by their place: `containers[0]`); `Err` for a partial template.
    fn read(
        &self,
        spec: &mut Map<String, Value>,
        problems: &mut Vec<String>,
    ) -> Result<(), String> {
        match spec.get("containers") {
            None => return Err(format!("no containers{}", misspelt_containers(spec))),
            Some(Value::Array(list)) if list.is_empty() => return Err("containers: []".into()),
            _ => {}
        }
        for list in ["initContainers", "containers"] {
            let Some(value) = spec.remove(list) else {
                continue;
            };
            let Value::Array(items) = value else {
                let line = self.read.line_of(&self.path(list, None, None));
                problems.push(format!("{list} is not a list{}", at_line(line)));
                continue;
            };
            let mut kept = Vec::with_capacity(items.len());
            for (i, container) in items.into_iter().enumerate() {
                if let Some(container) = self.container(list, i, container, problems)? {
                    kept.push(container);
                }
            }
            spec.insert(list.into(), Value::Array(kept));
        }
        Ok(())
    }

    fn path(
        &self,
        list: &'static str,
        index: Option<usize>,
        key: Option<&'static str>,
    ) -> Vec<Step> {
        let mut path = self.spec_path.to_vec();
        path.push(Step::key(list));
        path.extend(index.map(Step::Index));
        path.extend(key.map(Step::key));
        path
    }

    /// One container, or `None` when its image cannot be looked up (a problem said so).
    fn container(
        &self,
        list: &'static str,
        index: usize,
        mut container: Value,
        problems: &mut Vec<String>,
    ) -> Result<Option<Value>, String> {
        let line = |key| self.read.line_of(&self.path(list, Some(index), key));
        let Some(fields) = container.as_object_mut() else {
            problems.push(format!(
                "{list}[{index}] is not an object{}",
                at_line(line(None))
            ));
            return Ok(None);
        };
        let name = match fields.get("name") {
            Some(Value::String(name)) => name.clone(),
            found => {
                let place = format!("{list}[{index}]");
                if found.is_some() {
                    let at = at_line(line(Some("name")));
                    problems.push(format!("{place}: its name is not a string{at}"));
                } else if self.names_required {
                    problems.push(format!("{place} has no name{}", at_line(line(None))));
                }
                fields.insert("name".into(), Value::String(place.clone()));
                place
            }
        };
        match fields.get("image") {
            None | Some(Value::Null) => Err(format!("{list}[{index}] ({name}) has no image")),
            Some(Value::String(image)) if image.trim() != image => {
                // The API server refuses it; trimmed, a different image would be looked up.
                let at = at_line(line(Some("image")));
                problems.push(format!(
                    "container {name:?}: its image {image:?} has leading or trailing white space{at}"
                ));
                Ok(None)
            }
            Some(Value::String(_)) => Ok(Some(container)),
            Some(other) => {
                let at = at_line(line(Some("image")));
                problems.push(format!(
                    "container {name:?}: its image {other} is not a string{at}"
                ));
                Ok(None)
            }
        }
    }
}
