//! The one table of where each kind keeps its Pod specs: Kubernetes' own workloads, the AI/ML
//! and pipeline operators' kinds (Ray, JobSet, LeaderWorkerSet, Kubeflow, KServe, Katib, Tekton,
//! Argo Workflows and Rollouts, Knative), and the in-house kinds `[workloads] pod_specs` adds.
//! Data, not code paths: each row is written as the config writes one,
//! `KIND[.GROUP]=PATH[:SHAPE]`, and read by the one parser below; `review` reads every Pod spec
//! it names, and `audit` names a Pod's owner by it. A leaf: imports nothing of the crate.

use std::sync::{Arc, OnceLock};

use serde_json::Value;

/// How the value at a path makes a Pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// A Pod template (`metadata`, `spec`) or a Pod spec (`containers` …), told apart by what
    /// it holds.
    Template,
    /// A Tekton task spec: its `steps` and `sidecars` are the containers of the Pod it runs in.
    Tekton,
    /// An Argo Workflows template: `container`, `script`, `containerSet`, `sidecars` and
    /// `initContainers` are its Pod's; a template without any (steps, dag) makes no Pod.
    Argo,
    /// A whole Kubernetes object (Katib's trial spec), read by its own kind's row.
    Object,
}

/// One step of a path in a document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Key(String),
    Index(usize),
}

impl Step {
    pub(crate) fn key(key: &str) -> Self {
        Self::Key(key.to_owned())
    }
}

/// One step of a row's path.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Pattern {
    Key(String),
    /// `[]` (each item, named by its `name`) or `[FIELD]` (named by FIELD).
    Each(String),
    /// `*`: each value of a mapping, named by its key.
    Values,
}

/// Where one kind keeps (some of) its Pod specs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Row {
    kind: String,
    /// `None`: any group.
    group: Option<String>,
    path: Vec<Pattern>,
    pub(crate) shape: Shape,
}

/// A value a row's path reached: its steps in the document, and the name reports give it
/// (`workerGroupSpecs[gpu]`; empty for a kind's only template at `spec.template`).
#[derive(Debug)]
pub(crate) struct Reached<'v> {
    pub(crate) steps: Vec<Step>,
    pub(crate) part: String,
    pub(crate) value: &'v Value,
    pub(crate) shape: Shape,
}

/// Every row, each as the config would write it.
const BUILT_IN: &[&str] = &[
    "Deployment.apps=spec.template",
    "StatefulSet.apps=spec.template",
    "DaemonSet.apps=spec.template",
    "ReplicaSet.apps=spec.template",
    "ReplicationController=spec.template",
    "Job.batch=spec.template",
    "CronJob.batch=spec.jobTemplate.spec.template",
    "PodTemplate=template",
    "Rollout.argoproj.io=spec.template",
    "Experiment.argoproj.io=spec.templates[].template",
    "AnalysisTemplate.argoproj.io=spec.metrics[].provider.job.spec.template",
    "ClusterAnalysisTemplate.argoproj.io=spec.metrics[].provider.job.spec.template",
    "AnalysisRun.argoproj.io=spec.metrics[].provider.job.spec.template",
    "Workflow.argoproj.io=spec.templates[]:argo",
    "WorkflowTemplate.argoproj.io=spec.templates[]:argo",
    "ClusterWorkflowTemplate.argoproj.io=spec.templates[]:argo",
    "CronWorkflow.argoproj.io=spec.workflowSpec.templates[]:argo",
    "Service.serving.knative.dev=spec.template",
    "Configuration.serving.knative.dev=spec.template",
    "Revision.serving.knative.dev=spec",
    "RayCluster.ray.io=spec.headGroupSpec.template",
    "RayCluster.ray.io=spec.workerGroupSpecs[groupName].template",
    "RayService.ray.io=spec.rayClusterConfig.headGroupSpec.template",
    "RayService.ray.io=spec.rayClusterConfig.workerGroupSpecs[groupName].template",
    "RayJob.ray.io=spec.rayClusterSpec.headGroupSpec.template",
    "RayJob.ray.io=spec.rayClusterSpec.workerGroupSpecs[groupName].template",
    "RayJob.ray.io=spec.submitterPodTemplate",
    "JobSet.jobset.x-k8s.io=spec.replicatedJobs[].template.spec.template",
    "LeaderWorkerSet.leaderworkerset.x-k8s.io=spec.leaderWorkerTemplate.leaderTemplate",
    "LeaderWorkerSet.leaderworkerset.x-k8s.io=spec.leaderWorkerTemplate.workerTemplate",
    "MPIJob.kubeflow.org=spec.mpiReplicaSpecs.*.template",
    "PyTorchJob.kubeflow.org=spec.pytorchReplicaSpecs.*.template",
    "TFJob.kubeflow.org=spec.tfReplicaSpecs.*.template",
    "XGBoostJob.kubeflow.org=spec.xgbReplicaSpecs.*.template",
    "PaddleJob.kubeflow.org=spec.paddleReplicaSpecs.*.template",
    "JAXJob.kubeflow.org=spec.jaxReplicaSpecs.*.template",
    "Experiment.kubeflow.org=spec.trialTemplate.trialSpec:object",
    "TrainingRuntime.trainer.kubeflow.org=spec.template.spec.replicatedJobs[].template.spec.template",
    "ClusterTrainingRuntime.trainer.kubeflow.org=spec.template.spec.replicatedJobs[].template.spec.template",
    "ServingRuntime.serving.kserve.io=spec",
    "ClusterServingRuntime.serving.kserve.io=spec",
    "InferenceService.serving.kserve.io=spec.predictor",
    "InferenceService.serving.kserve.io=spec.transformer",
    "InferenceService.serving.kserve.io=spec.explainer",
    "Task.tekton.dev=spec:tekton",
    "ClusterTask.tekton.dev=spec:tekton",
    "TaskRun.tekton.dev=spec.taskSpec:tekton",
    "Pipeline.tekton.dev=spec.tasks[].taskSpec:tekton",
    "Pipeline.tekton.dev=spec.finally[].taskSpec:tekton",
    "PipelineRun.tekton.dev=spec.pipelineSpec.tasks[].taskSpec:tekton",
    "PipelineRun.tekton.dev=spec.pipelineSpec.finally[].taskSpec:tekton",
];

/// The table: the config's rows first (a kind they name is read by them alone), then the
/// built-in ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Kinds {
    rows: Vec<Row>,
    /// How many of `rows`, first, the config added.
    from_config: usize,
}

impl Kinds {
    /// The built-in table.
    pub(crate) fn built_in() -> Arc<Kinds> {
        static TABLE: OnceLock<Arc<Kinds>> = OnceLock::new();
        let table = TABLE.get_or_init(|| {
            Arc::new(Kinds {
                rows: BUILT_IN
                    .iter()
                    .map(|row| parse(row).expect("the built-in rows parse"))
                    .collect(),
                from_config: 0,
            })
        });
        Arc::clone(table)
    }

    /// The built-in table with `extra` rows (`[workloads] pod_specs`) read first.
    pub(crate) fn with(extra: &[String]) -> Result<Kinds, String> {
        let mut rows = extra
            .iter()
            .map(|row| parse(row).map_err(|e| format!("{row:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let from_config = rows.len();
        rows.extend(Self::built_in().rows.iter().cloned());
        Ok(Kinds { rows, from_config })
    }

    /// The rows for an object of `kind` in `api_version` (any group when it has none): the
    /// config's that name the kind, else the built-in ones.
    pub(crate) fn rows(&self, kind: &str, api_version: Option<&str>) -> Vec<&Row> {
        let group = api_version.map(|v| v.rsplit_once('/').map_or("", |(group, _)| group));
        let matches = |row: &&Row| {
            row.kind == kind
                && match (&row.group, group) {
                    (Some(want), Some(group)) => want == group,
                    _ => true,
                }
        };
        let (config, built_in) = self.rows.split_at(self.from_config);
        let mine: Vec<&Row> = config.iter().filter(matches).collect();
        if !mine.is_empty() {
            return mine;
        }
        built_in.iter().filter(matches).collect()
    }
}

impl Row {
    /// Whether its path reaches one value at most (no `[]`, no `*`).
    pub(crate) fn reaches_one(&self) -> bool {
        self.path.iter().all(|p| matches!(p, Pattern::Key(_)))
    }

    /// Every value of `object` this row's path reaches, with where it is and its name.
    pub(crate) fn reach<'v>(&self, object: &'v Value) -> Vec<Reached<'v>> {
        let mut reached = Vec::new();
        let mut walk = Walk::default();
        reach_in(&self.path, object, &mut walk, &mut |walk, value| {
            reached.push(Reached {
                steps: walk.steps.clone(),
                part: walk.part(),
                value,
                shape: self.shape,
            });
        });
        reached
    }
}

/// Where a walk down a path is: the steps taken and the name of each.
#[derive(Default)]
struct Walk {
    steps: Vec<Step>,
    names: Vec<String>,
}

impl Walk {
    /// The path as reports name it: `spec.` and a trailing `template` or `spec` left out.
    fn part(&self) -> String {
        let mut names: &[String] = &self.names;
        if names.first().is_some_and(|n| n == "spec") {
            names = &names[1..];
        }
        while let Some((last, rest)) = names.split_last() {
            if last == "template" || last == "spec" {
                names = rest;
            } else {
                break;
            }
        }
        let mut part = String::new();
        for name in names {
            if !name.starts_with('[') && !part.is_empty() {
                part.push('.');
            }
            part.push_str(name);
        }
        part
    }
}

/// Calls `found` with each object `path` reaches from `value`.
fn reach_in<'v>(
    path: &[Pattern],
    value: &'v Value,
    walk: &mut Walk,
    found: &mut dyn FnMut(&Walk, &'v Value),
) {
    let Some((first, rest)) = path.split_first() else {
        if value.is_object() {
            found(walk, value);
        }
        return;
    };
    let mut go = |walk: &mut Walk, step: Step, name: String, next: &'v Value| {
        walk.steps.push(step);
        walk.names.push(name);
        reach_in(rest, next, walk, found);
        walk.steps.pop();
        walk.names.pop();
    };
    match first {
        Pattern::Key(key) => {
            if let Some(next) = value.get(key) {
                go(walk, Step::Key(key.clone()), key.clone(), next);
            }
        }
        Pattern::Each(field) => {
            for (i, item) in value.as_array().into_iter().flatten().enumerate() {
                let name = match item.get(field) {
                    Some(Value::String(name)) => name.clone(),
                    _ => i.to_string(),
                };
                go(walk, Step::Index(i), format!("[{name}]"), item);
            }
        }
        Pattern::Values => {
            for (key, item) in value.as_object().into_iter().flatten() {
                go(walk, Step::Key(key.clone()), key.clone(), item);
            }
        }
    }
}

/// Reads one row: `KIND[.GROUP]=PATH[:SHAPE]`, PATH dotted keys, `[]` / `[FIELD]` after a key
/// for each item of its list, `*` for each value of a mapping; SHAPE `template` (the default),
/// `tekton`, `argo` or `object`.
pub(crate) fn parse(row: &str) -> Result<Row, String> {
    let (name, rest) = row
        .split_once('=')
        .ok_or("expected KIND[.GROUP]=PATH[:SHAPE]")?;
    let (kind, group) = match name.trim().split_once('.') {
        Some((kind, group)) => (kind, Some(group.to_owned())),
        None => (name.trim(), None),
    };
    if kind.is_empty() || !kind.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(format!("{kind:?} is not a kind (letters and digits)"));
    }
    let (path, shape) = match rest.trim().rsplit_once(':') {
        Some((path, shape)) => (path, shape_named(shape)?),
        None => (rest.trim(), Shape::Template),
    };
    Ok(Row {
        kind: kind.to_owned(),
        group,
        path: patterns(path)?,
        shape,
    })
}

fn shape_named(name: &str) -> Result<Shape, String> {
    match name {
        "template" => Ok(Shape::Template),
        "tekton" => Ok(Shape::Tekton),
        "argo" => Ok(Shape::Argo),
        "object" => Ok(Shape::Object),
        _ => Err(format!(
            "unknown shape {name:?} (template, tekton, argo or object)"
        )),
    }
}

fn patterns(path: &str) -> Result<Vec<Pattern>, String> {
    let mut patterns = Vec::new();
    for part in path.split('.') {
        let (key, each) = match part.split_once('[') {
            Some((key, field)) => {
                let field = field
                    .strip_suffix(']')
                    .ok_or_else(|| format!("{part:?}: `[` without `]`"))?;
                let field = if field.is_empty() { "name" } else { field };
                (key, Some(field))
            }
            None => (part, None),
        };
        match key {
            "*" if each.is_none() => patterns.push(Pattern::Values),
            "" => return Err(format!("an empty key in {path:?}")),
            key if key.contains(['*', ']', '=', ':', ' ']) => {
                return Err(format!("{key:?} is not a key"))
            }
            key => patterns.push(Pattern::Key(key.to_owned())),
        }
        if let Some(field) = each {
            patterns.push(Pattern::Each(field.to_owned()));
        }
    }
    Ok(patterns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_read_as_written_and_bad_ones_say_why() {
        let row = parse("Trainer.ml.example.com=spec.roles[role].template:template").unwrap();
        assert_eq!(row.group.as_deref(), Some("ml.example.com"));
        assert!(!row.reaches_one());
        for (bad, says) in [
            ("Trainer", "expected KIND[.GROUP]=PATH"),
            ("Trainer.x=spec..template", "an empty key"),
            ("Trainer.x=spec.roles[.template", "without `]`"),
            ("Trainer.x=spec:pod", "unknown shape"),
            ("Tra-iner=spec", "not a kind"),
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn the_configs_rows_for_a_kind_replace_the_built_in_ones_and_groups_tell_kinds_apart() {
        let kinds = Kinds::with(&["Rollout.argoproj.io=spec.workloadRef.template".into()]).unwrap();
        let rows = kinds.rows("Rollout", Some("argoproj.io/v1alpha1"));
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].path[1], Pattern::Key("workloadRef".into()));
        let built_in = Kinds::built_in();
        assert!(built_in.rows("Service", Some("v1")).is_empty());
        assert_eq!(
            built_in
                .rows("Service", Some("serving.knative.dev/v1"))
                .len(),
            1
        );
        assert_eq!(
            built_in.rows("Experiment", Some("kubeflow.org/v1beta1"))[0].shape,
            Shape::Object
        );
        assert!(Kinds::with(&["nonsense".into()])
            .unwrap_err()
            .contains("\"nonsense\""));
    }
}
