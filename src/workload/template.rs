//! A workload's Pod template, read as the decision needs it: its images. The one rule for
//! patches and partial templates: a Pod template with no `containers`, `containers: []`, or a
//! container without `image` is partial (a kustomize patch, an overlay's part) — listed as a
//! skipped input with the reason, never reviewed. A container's name is optional where the
//! kind allows it (custom kinds such as Knative Services); an image that is not a string is a
//! problem of that container, and the workload's other images are still looked up.

use serde_json::{json, Map, Value};

use super::{Read, Step};
use crate::admission::wire::PodObject;

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

const CRONJOB: [Step; 5] = [
    Step::Key("spec"),
    Step::Key("jobTemplate"),
    Step::Key("spec"),
    Step::Key("template"),
    Step::Key("spec"),
];
const POD_TEMPLATE: [Step; 2] = [Step::Key("template"), Step::Key("spec")];
const SPEC_TEMPLATE: [Step; 3] = [Step::Key("spec"), Step::Key("template"), Step::Key("spec")];

/// The Pod `object` makes: a Pod is its own; a CronJob's is under `spec.jobTemplate`; a
/// PodTemplate's under `template`; any other kind's under `spec.template` (Deployments,
/// StatefulSets, Jobs, and custom kinds shaped like them when it has `spec.containers`).
pub(super) fn pod_of(
    kind: &str,
    object: &Map<String, Value>,
    namespace: Option<&str>,
    read: &Read,
) -> Template {
    let api_version = object.get("apiVersion").and_then(Value::as_str);
    // Kubernetes' own groups have no dot in their name (v1, apps/v1); custom resources' do.
    let group = api_version.map_or("", |v| v.split('/').next().unwrap_or_default());
    let built_in = BUILT_IN.contains(&kind) && !group.contains('.');
    let (spec_path, template): (&[Step], _) = match kind {
        "Pod" if built_in => (&[Step::Key("spec")], Some(object)),
        "CronJob" => (
            &CRONJOB,
            object
                .get("spec")
                .and_then(|s| s.pointer("/jobTemplate/spec/template"))
                .and_then(Value::as_object),
        ),
        "PodTemplate" => (
            &POD_TEMPLATE,
            object.get("template").and_then(Value::as_object),
        ),
        _ => (
            &SPEC_TEMPLATE,
            object
                .get("spec")
                .and_then(|s| s.get("template"))
                .and_then(Value::as_object),
        ),
    };
    let Some(template) = template else {
        return Template::None;
    };
    let spec = template.get("spec").and_then(Value::as_object);
    let has_containers = spec.is_some_and(|s| s.get("containers").is_some_and(Value::is_array));
    if !built_in && !has_containers {
        return Template::None;
    }
    let Some(spec) = spec else {
        return Template::Partial("no spec".into());
    };
    let mut spec = spec.clone();
    let mut problems = Vec::new();
    let images = Containers {
        names_required: built_in,
        spec_path,
        read,
    };
    if let Err(why) = images.read(&mut spec, &mut problems) {
        return Template::Partial(why);
    }
    let pod = if kind == "Pod" && built_in {
        let mut pod = object.clone();
        pod.insert("spec".into(), Value::Object(spec));
        Value::Object(pod)
    } else {
        pod_from_template(template, Value::Object(spec), namespace)
    };
    // What else the webhook would refuse, said here with the input's line (of the template:
    // the parser names no field).
    let object = PodObject::from_value(&pod);
    if let Err(reason) = &object {
        let template_path = &spec_path[..spec_path.len() - 1];
        let at = read
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

fn pod_from_template(template: &Map<String, Value>, spec: Value, namespace: Option<&str>) -> Value {
    let mut metadata = template
        .get("metadata")
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
        path.push(Step::Key(list));
        path.extend(index.map(Step::Index));
        path.extend(key.map(Step::Key));
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
