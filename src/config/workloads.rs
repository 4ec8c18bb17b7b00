//! `[workloads]`: where in-house custom kinds keep their Pod templates, for `review` (rows added
//! before the built-in table of [`crate::kinds`]).

use std::sync::Arc;

use serde::Deserialize;

use super::values::List;
use super::ConfigError;
use crate::kinds::Kinds;

/// `[workloads]` as written.
#[derive(Debug, Default, Deserialize)]
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
