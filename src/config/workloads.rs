//! `[workloads]`: where in-house custom kinds keep their Pod templates, for `review` (rows added
//! before the built-in table of [`crate::kinds`]).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::reference::{KeyDoc, SectionDoc};
use super::values::List;
use super::ConfigError;
use crate::kinds::Kinds;

/// `[workloads]` as written.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct WorkloadsSection {
    /// `KIND[.GROUP]=PATH[:SHAPE]` rows.
    pod_specs: List,
}

impl WorkloadsSection {
    pub(super) fn validate(&self) -> Result<Arc<Kinds>, ConfigError> {
        let rows: Vec<String> = self
            .pod_specs
            .0
            .iter()
            .map(|row| row.trim().to_owned())
            .filter(|row| !row.is_empty())
            .collect();
        Kinds::with(&rows)
            .map(Arc::new)
            .map_err(|why| ConfigError::key("workloads.pod_specs", why))
    }
}

pub(super) const WORKLOADS_DOC: SectionDoc = SectionDoc {
    name: "workloads",
    banner: Some("Workloads (review)"),
    about: &[
        "Where in-house custom kinds keep their Pod templates, for `tolerable review`: rows",
        "KIND[.GROUP]=PATH[:SHAPE] read before the built-in table (Ray, JobSet, LeaderWorkerSet,",
        "Kubeflow, KServe, Katib, Tekton, Argo, Knative, docs/cli.md). PATH is dotted keys, `[]` after",
        "a key for each item of its list (named by its `name`; `[FIELD]`: by FIELD), `*` for each value",
        "of a mapping; it reaches a Pod template (metadata, spec) or a Pod spec (containers). SHAPE:",
        "template (the default), tekton (steps and sidecars), argo (an Argo Workflows template) or",
        "object (a whole object read by its own kind's row). A kind named here is read by its rows only.",
        "  pod_specs = [\"Runner.ci.example.com=spec.pool.pod\", \"Trainer.ml.example.com=spec.roles[].template\"]",
    ],
    intro: "What `tolerable review` reads as workloads, beside the built-in table of kinds ([cli.md](cli.md#tolerable-review)).",
    keys: &[
        KeyDoc {
            key: "pod_specs",
            meaning: "where in-house custom kinds keep their Pod templates: rows `KIND[.GROUP]=PATH[:SHAPE]` (`Runner.ci.example.com=spec.pool.pod`), read before the built-in rows; a kind named here is read by its rows only. PATH: dotted keys, `[]` after a key for each item of its list (named by its `name`; `[FIELD]` by FIELD), `*` for each value of a mapping, reaching a Pod template (`metadata`, `spec`) or a Pod spec (`containers`). SHAPE: `template` (default), `tekton` (a task spec: steps and sidecars), `argo` (an Argo Workflows template), `object` (a whole object, read by its own kind's rows). A bad row stops start-up naming it",
            about: &[],
            example: None,
            inline: None,
            default_note: None,
            deployed: false,
        },
    ],
};
