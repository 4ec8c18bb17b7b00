//! A workload's Pod decided on outside an admission — what `review` and `audit` share: the Pod
//! a manifest or a template makes (`crate::workload`), read once into the same typed
//! [`PodObject`] the webhook reads, decided on as the webhook does when the controller creates
//! it.

use std::time::Duration;

use serde_json::Value;

use super::{read_pod, Engine, PodAnswer, PodObject, PodRead};
use crate::cluster::PullSecretRefs;
use crate::mutate::{self, Answer, PodCreate};

/// Workloads decided at the same time by `review` and `audit`: each looks up to 16 images at
/// once, and the registry client bounds requests per registry (16) on top.
pub(crate) const WORKLOADS_AT_ONCE: usize = 8;

/// What the webhook would answer for one workload's Pod (a Pod manifest, or the Pod a template
/// makes), with the architectures its images share and the request (to ask more of it).
pub(crate) struct WorkloadAnswer {
    pub(crate) answered: PodAnswer,
    pub(crate) common: Option<Vec<String>>,
    pub(crate) asked: Option<(PodCreate, PullSecretRefs)>,
}

impl Engine {
    /// A Pod manifest's answer (`review` of one Pod): read as the webhook reads it, then
    /// [`Engine::answer_workload`].
    pub(crate) async fn answer_pod_manifest(
        &self,
        pod: &Value,
        budget: Duration,
    ) -> WorkloadAnswer {
        self.answer_workload(PodObject::from_value(pod), budget)
            .await
    }

    /// The one way `review` and `audit` decide on a workload's Pod (`Workload::object`, or
    /// why it could not be read): as the webhook does when its controller creates it (in its
    /// own namespace, else `default`).
    pub(crate) async fn answer_workload(
        &self,
        object: Result<PodObject, String>,
        budget: Duration,
    ) -> WorkloadAnswer {
        let policy = self.policy();
        let asked = match object {
            Err(reason) => PodRead::Answered(Answer::invalid_object(&reason)),
            Ok(object) => read_pod(None, object, policy, self.namespaces()),
        };
        match asked {
            PodRead::Decide(pod, pull_secrets) => {
                let mut answered = self.decide(&pod, &pull_secrets, budget).await;
                let unread = self.unread_pull_secrets(&pod, &pull_secrets);
                answered.shell_warnings.extend(unread);
                let common = mutate::architectures_in_common(&pod, &answered.facts, None, policy);
                WorkloadAnswer {
                    answered,
                    common,
                    asked: Some((pod, pull_secrets)),
                }
            }
            PodRead::Answered(answer) => WorkloadAnswer {
                answered: answer.into(),
                common: None,
                asked: None,
            },
        }
    }

    /// Without `--kubeconfig` / `--cluster`, `review` reads no cluster: the pull secrets a Pod
    /// names are not read, and its warnings say so by name rather than leave a bare "refused
    /// access (tried: anonymous)" unexplained.
    fn unread_pull_secrets(&self, pod: &PodCreate, refs: &PullSecretRefs) -> Option<String> {
        if self.reads_cluster() || refs.secrets.is_empty() || pod.images_to_look_up().is_empty() {
            return None;
        }
        let names: Vec<String> = refs
            .secrets
            .iter()
            .map(|name| format!("{}/{name}", pod.namespace))
            .collect();
        Some(format!(
            "review reads no cluster: image pull secrets not read: {}; images behind them need a credential file or docker_config_path",
            names.join(", ")
        ))
    }
}
