//! Where a crashed Pod's images would be placed now (`[crashes] heal`): the Pod's images, in
//! its namespace, decided on as the webhook decides on a Pod that names them — the
//! architectures the crash watch learned they do not run on left out, the node pools read —
//! so the crash watch deletes a Pod only when its replacement would go elsewhere.

use std::time::Duration;

use serde_json::json;

use super::{read_pod, Engine, PodObject, PodRead};
use crate::mutate;

impl Engine {
    /// The architectures a Pod in `namespace` with `labels` naming `images` (by digest where
    /// known) would be placed on now, within `budget`; `None` when it would not be decided on
    /// (opted out by its labels, skipped by its Namespace, over the limits) or its images'
    /// facts are not all known. The Pod's annotations and pull secrets are not read: its images
    /// are looked up anonymously, as the crash watch reads the index.
    pub(crate) async fn placement_now(
        &self,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
        images: &[String],
        budget: Duration,
    ) -> Option<Vec<String>> {
        let containers: Vec<_> = images
            .iter()
            .enumerate()
            .map(|(i, image)| json!({"name": format!("c{i}"), "image": image}))
            .collect();
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "crashed", "namespace": namespace, "labels": labels},
            "spec": {"containers": containers}});
        let object = PodObject::from_value(&pod).ok()?;
        let PodRead::Decide(create, pull_secrets) =
            read_pod(Some(namespace), object, self.policy(), self.namespaces())
        else {
            return None;
        };
        let (facts, pools) = self.facts(&create, &pull_secrets, budget).await;
        mutate::architectures_in_common(&create, &facts, pools.as_deref(), self.policy())
    }
}
