//! What `audit` reads of the cluster (list only): the workloads of every kind with a Pod
//! template, their Pods and the Nodes' architectures. Every list is read through
//! [`crate::cluster::list::Lister`] (paged, started again when its continue token expires),
//! each page straight into the compact projections of [`crate::audit::seen`]: memory grows with
//! what `audit` keeps, not with what the API server sends.

use std::collections::HashSet;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Deserialize;

use crate::audit::seen::{self, ClusterState, Listed, NodeItem, ObjectItem, PodItem};
use crate::cluster::list::Lister;

/// Lists everything `audit` needs, in the lister's namespace (else all), workloads and Pods
/// matching `selector`.
pub(super) async fn cluster(
    lister: &Lister<'_>,
    selector: Option<&str>,
) -> anyhow::Result<ClusterState> {
    let mut listed = Listed::default();
    // The kinds that own others first: a ReplicaSet or Job listed after its owner keeps no
    // template.
    let top = |kind: &'static str| move |item: ObjectItem| Some(item.project(kind, |_| false));
    listed.workloads = lister
        .list::<Deployment, _, _>(selector, top("Deployment"))
        .await?;
    let more = lister.list::<StatefulSet, _, _>(selector, top("StatefulSet"));
    listed.workloads.extend(more.await?);
    let more = lister.list::<DaemonSet, _, _>(selector, top("DaemonSet"));
    listed.workloads.extend(more.await?);
    let more = lister.list::<CronJob, _, _>(selector, top("CronJob"));
    listed.workloads.extend(more.await?);
    let owners = listed.workload_uids();
    let below = |kind: &'static str, owners: &HashSet<String>| {
        let owners = owners.clone();
        move |item: ObjectItem| Some(item.project(kind, |uid| owners.contains(uid)))
    };
    let more = lister.list::<ReplicaSet, _, _>(selector, below("ReplicaSet", &owners));
    listed.workloads.extend(more.await?);
    let more = lister.list::<Job, _, _>(selector, below("Job", &owners));
    listed.workloads.extend(more.await?);
    // The selector chooses workloads by their own labels; the ReplicaSets and Jobs between a
    // workload and its Pods, and the Pods, are all read, so a Deployment's Pods are found
    // whatever labels its template gives them.
    if let Some(selector) = selector {
        let chosen = lister.list::<Pod, _, _>(Some(selector), |item: UidItem| item.uid());
        listed.selected_pods = Some(chosen.await?.into_iter().collect());
        listed.between = lister
            .list::<ReplicaSet, _, _>(None, below("ReplicaSet", &owners))
            .await?;
        let more = lister.list::<Job, _, _>(None, below("Job", &owners));
        listed.between.extend(more.await?);
    }
    let pods = {
        let owners = listed.owners();
        let project = |item: PodItem| Some(item.project(|c| owners.pod_may_stand_alone(c)));
        lister.list::<Pod, _, _>(None, project).await?
    };
    listed.pods = pods;
    let nodes = lister.list::<Node, _, _>(None, |item: NodeItem| item.project());
    for (name, arch, taints) in nodes.await? {
        if !taints.is_empty() {
            listed.tainted.push((name.clone(), arch.clone(), taints));
        }
        listed.nodes.insert(name, arch);
    }
    Ok(seen::assemble(listed))
}

/// A list item read for its uid only.
#[derive(Deserialize)]
struct UidItem {
    #[serde(default)]
    metadata: UidMeta,
}

#[derive(Default, Deserialize)]
struct UidMeta {
    uid: Option<String>,
}

impl UidItem {
    fn uid(self) -> Option<String> {
        self.metadata.uid
    }
}
