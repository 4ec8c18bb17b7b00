//! What `audit` reads of the cluster (list only): the workloads of every kind with a Pod
//! template, their Pods and the Nodes' architectures. Every list is paged (`limit`, then the
//! `continue` token, as kubectl and client-go's pager do) and each page is read straight into the
//! compact projections of [`crate::audit::seen`]: memory grows with what `audit` keeps, not with
//! what the API server sends. The ownership assembly is there too (pure).

use std::collections::HashSet;

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::audit::seen::{self, ClusterState, Listed, NodeItem, ObjectItem, PodItem};

/// How many times a list is started again when the API server says its continue token expired
/// (410 Gone, reason Expired: etcd compacted past the list's revision while it was paged). The
/// cluster is changing under the list; a few fresh starts is what client-go's reflector does
/// before it gives up for a while.
pub(crate) const LIST_TRIES: usize = 3;

/// One page of a list: the items as projections, and where to go on.
#[derive(Deserialize)]
struct Page<T> {
    #[serde(default)]
    metadata: PageMeta,
    #[serde(default = "Vec::new")]
    items: Vec<T>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PageMeta {
    #[serde(rename = "continue")]
    continue_: Option<String>,
    remaining_item_count: Option<i64>,
}

/// Where and how to list.
pub(super) struct Lister<'a> {
    pub(super) client: &'a kube::Client,
    pub(super) namespace: Option<&'a str>,
    /// `limit`: items per page (kubectl's `--chunk-size`, 500 by default).
    pub(super) page: u32,
}

impl Lister<'_> {
    fn path<K>(&self) -> String
    where
        K: kube::Resource<DynamicType = ()>,
        K::Scope: 'static,
    {
        let namespaced = std::any::TypeId::of::<K::Scope>()
            == std::any::TypeId::of::<k8s_openapi::NamespaceResourceScope>();
        let namespace = if namespaced { self.namespace } else { None };
        K::url_path(&(), namespace)
    }

    /// Every item of the list of `K` (matching `selector`), each read as `T` and projected as
    /// `P`, page by page; started again from the first page when the continue token expires.
    async fn list<K, T, P>(
        &self,
        selector: Option<&str>,
        project: impl Fn(T) -> Option<P>,
    ) -> anyhow::Result<Vec<P>>
    where
        K: kube::Resource<DynamicType = ()>,
        K::Scope: 'static,
        T: DeserializeOwned,
    {
        let plural = K::plural(&());
        let path = self.path::<K>();
        let mut params = ListParams::default().limit(self.page);
        if let Some(selector) = selector {
            params = params.labels(selector);
        }
        for _ in 0..LIST_TRIES {
            match self.pages(&path, &plural, params.clone(), &project).await {
                Ok(items) => return Ok(items),
                Err(kube::Error::Api(status)) if status.code == 410 => {
                    super::progress(&format!(
                        "the API server expired the list of {plural} while it was paged ({}); listing again from the start",
                        status.reason
                    ));
                }
                Err(e) => return Err(e).with_context(|| format!("could not list {plural}")),
            }
        }
        anyhow::bail!(
            "could not list {plural}: the API server expired its continue token {LIST_TRIES} times in a row (410 Expired: the cluster changed faster than the list was read; a larger --chunk-size reads it in fewer pages)"
        )
    }

    /// One pass over the pages of a list.
    async fn pages<T, P>(
        &self,
        path: &str,
        plural: &str,
        mut params: ListParams,
        project: impl Fn(T) -> Option<P>,
    ) -> Result<Vec<P>, kube::Error>
    where
        T: DeserializeOwned,
    {
        let mut items = Vec::new();
        loop {
            let request = kube::core::Request::new(path)
                .list(&params)
                .map_err(kube::Error::BuildRequest)?;
            let page: Page<T> = self.client.request(request).await?;
            items.extend(page.items.into_iter().filter_map(&project));
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => {
                    let more = page
                        .metadata
                        .remaining_item_count
                        .map_or(String::new(), |n| format!(", {n} more"));
                    super::progress(&format!("{plural}: {} read{more}", items.len()));
                    params = params.continue_token(&token);
                }
                _ => return Ok(items),
            }
        }
    }
}

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
    listed.nodes = nodes.await?.into_iter().collect();
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
