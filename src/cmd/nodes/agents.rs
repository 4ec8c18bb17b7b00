//! What `nodes plan` reads to name the DaemonSets a taint would take off its nodes: every
//! DaemonSet (its template's tolerations) and the nodes its Pods run on. Lists through
//! [`crate::cluster::list::Lister`], each page into the few fields kept here.

use std::collections::HashMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, Toleration};
use serde::Deserialize;

use crate::cluster::list::Lister;
use crate::taints::AgentPods;

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    uid: String,
    #[serde(default)]
    owner_references: Vec<Owner>,
}

#[derive(Deserialize)]
struct Owner {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    uid: String,
    controller: Option<bool>,
}

#[derive(Deserialize)]
struct DaemonSetItem {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    spec: DaemonSetSpec,
}

#[derive(Default, Deserialize)]
struct DaemonSetSpec {
    #[serde(default)]
    template: Template,
}

#[derive(Default, Deserialize)]
struct Template {
    #[serde(default)]
    spec: TemplateSpec,
}

#[derive(Default, Deserialize)]
struct TemplateSpec {
    #[serde(default)]
    tolerations: Vec<Toleration>,
}

#[derive(Deserialize)]
struct PodItem {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    spec: PodSpec,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodSpec {
    node_name: Option<String>,
}

/// Every DaemonSet with the nodes its Pods are on (its controller's Pods only).
pub(super) async fn daemonsets(client: &kube::Client) -> anyhow::Result<Vec<AgentPods>> {
    let lister = Lister {
        client,
        namespace: None,
        page: 500,
        progress: &|_| {},
    };
    let listed = lister.list::<DaemonSet, _, _>(None, |item: DaemonSetItem| {
        let Meta {
            name,
            namespace,
            uid,
            ..
        } = item.metadata;
        let agent = AgentPods {
            name: format!("{namespace}/{name}"),
            tolerations: item.spec.template.spec.tolerations,
            nodes: Default::default(),
        };
        Some((uid, agent))
    });
    let mut agents: HashMap<String, AgentPods> = listed.await?.into_iter().collect();
    let pods = lister.list::<Pod, _, _>(None, |item: PodItem| {
        let owner = item
            .metadata
            .owner_references
            .into_iter()
            .find(|o| o.controller == Some(true) && o.kind == "DaemonSet")?;
        Some((owner.uid, item.spec.node_name?))
    });
    for (owner, node) in pods.await? {
        if let Some(agent) = agents.get_mut(&owner) {
            agent.nodes.insert(node);
        }
    }
    let mut agents: Vec<AgentPods> = agents.into_values().collect();
    agents.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(agents)
}
