//! Per-namespace policy from the cluster: a watch of Namespaces' metadata only (kube-runtime's
//! watcher over `PartialObjectMeta<Namespace>`, which asks the API server for
//! `PartialObjectMetadata` — names, labels and annotations, never a spec or status), each
//! Namespace read once into the core's [`NamespacePolicy`].
//!
//! Sized by what is kept, not by the cluster: a Namespace that says nothing tolerable reads is
//! not kept at all; one that does is kept as its name and its parsed policy (a few words). The
//! map is published as one shared snapshot on each change; an admission reads it by cloning an
//! `Arc`, as it reads the node pools.
//!
//! Without `list`/`watch` on namespaces (403), decisions keep to the config: one warning, the
//! `tolerable_namespace_policy_available` gauge at 0, readiness not held back; the watcher keeps
//! retrying (with its backoff) and the policy comes back on its own once the access is granted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::{watcher, WatchStreamExt as _};

use crate::mutate::NamespacePolicy;

/// Namespaces per list page (metadata only: a few hundred bytes each).
pub const LIST_PAGE: u32 = 500;

/// Each Namespace that says something tolerable reads, by name.
type PolicyMap = HashMap<Arc<str>, Arc<NamespacePolicy>>;

/// A view of the cluster's per-namespace policy: live (the watch), or fixed (`review`'s
/// command line and input, one list for `review --kubeconfig` and `audit`).
#[derive(Clone)]
pub struct NamespacePolicies {
    shared: Arc<Shared>,
}

struct Shared {
    map: ArcSwap<PolicyMap>,
    /// Set once the first list is in, or the API server refused it (readiness waits for
    /// this, never for a refused watch).
    settled: tokio::sync::watch::Sender<bool>,
    /// Whether the Namespaces could be read (`false` before the first list and while refused).
    available: AtomicBool,
    /// Lists or watches the API server refused (403).
    refusals: AtomicU64,
    /// Times the published map changed.
    updates: AtomicU64,
}

impl NamespacePolicies {
    fn new(map: PolicyMap, settled: bool) -> Self {
        Self {
            shared: Arc::new(Shared {
                map: ArcSwap::from_pointee(map),
                settled: tokio::sync::watch::channel(settled).0,
                available: AtomicBool::new(settled),
                refusals: AtomicU64::new(0),
                updates: AtomicU64::new(0),
            }),
        }
    }

    /// A fixed view: each Namespace's labels and annotations (`review` without a cluster).
    /// Namespaces that say nothing tolerable reads are dropped.
    pub fn fixed(namespaces: impl IntoIterator<Item = (String, NamespacePolicy)>) -> Self {
        let map = namespaces
            .into_iter()
            .filter(|(_, policy)| !policy.is_empty())
            .map(|(name, policy)| (Arc::from(name), Arc::new(policy)))
            .collect();
        Self::new(map, true)
    }

    /// One list of every Namespace's metadata, paged (`review --kubeconfig`, `audit`).
    pub async fn list(client: kube::Client) -> Result<Self, kube::Error> {
        let api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
        let mut map = PolicyMap::new();
        let mut params = ListParams::default().limit(LIST_PAGE);
        loop {
            let page = api.list(&params).await?;
            for namespace in page.items {
                if let Some((name, policy)) = read(&namespace.metadata) {
                    warn_of_problems(&name, &policy);
                    map.insert(name, policy);
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        Ok(Self::new(map, true))
    }

    /// Starts watching Namespaces in the background (metadata only; re-lists and backs off on
    /// errors, as kube-runtime's watcher does).
    pub fn watch(client: kube::Client) -> Self {
        let api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
        let config = watcher::Config::default().page_size(LIST_PAGE);
        let stream = watcher(api, config).default_backoff();
        let policies = Self::new(PolicyMap::new(), false);
        tokio::spawn(keep_policies(stream, policies.shared.clone()));
        policies
    }

    /// Sets what the Namespace `name` says (`review`: the command line, a Namespace in the
    /// input), replacing what was known of it.
    pub(crate) fn set(&self, name: &str, policy: NamespacePolicy) {
        let policy = (!policy.is_empty()).then(|| Arc::new(policy));
        publish_one(&self.shared, name, policy);
    }

    /// The same view with only the Namespaces' preferences (and their problems): `audit`
    /// reports on every namespace as enforced, as it does for `skip_namespaces` and
    /// `enforce = false`.
    pub(crate) fn preferences_only(&self) -> Self {
        let map = self.shared.map.load();
        Self::fixed(map.iter().map(|(name, policy)| {
            let preference = NamespacePolicy {
                preferred: policy.preferred.clone(),
                problems: policy.problems.clone(),
                ..NamespacePolicy::default()
            };
            (name.to_string(), preference)
        }))
    }

    /// What the Namespace `name` says, if anything tolerable reads.
    pub fn get(&self, name: &str) -> Option<Arc<NamespacePolicy>> {
        self.shared.map.load().get(name).cloned()
    }

    /// Whether the first list is in, or was refused (decisions go on without it then).
    pub fn is_settled(&self) -> bool {
        *self.shared.settled.borrow()
    }

    /// Waits until [`NamespacePolicies::is_settled`].
    pub async fn settled(&self) {
        let _ = self.shared.settled.subscribe().wait_for(|s| *s).await;
    }

    /// Whether the Namespaces are read (`false` before the first list and while refused).
    pub fn is_available(&self) -> bool {
        self.shared.available.load(Ordering::Relaxed)
    }

    /// Lists or watches refused (403) so far.
    pub fn refusals(&self) -> u64 {
        self.shared.refusals.load(Ordering::Relaxed)
    }

    /// Times the published policy changed (each list that changed it, each changed Namespace).
    pub fn updates(&self) -> u64 {
        self.shared.updates.load(Ordering::Relaxed)
    }

    /// Namespaces with a policy now.
    pub fn len(&self) -> usize {
        self.shared.map.load().len()
    }

    /// Whether no Namespace has a policy now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The name and policy of a Namespace that says something tolerable reads.
fn read(meta: &ObjectMeta) -> Option<(Arc<str>, Arc<NamespacePolicy>)> {
    let name = meta.name.as_deref()?;
    let policy = NamespacePolicy::from_metadata(meta.labels.as_ref(), meta.annotations.as_ref());
    (!policy.is_empty()).then(|| (Arc::from(name), Arc::new(policy)))
}

/// Says once per change which keys of a Namespace were ignored, and why.
fn warn_of_problems(name: &str, policy: &NamespacePolicy) {
    for problem in policy.problems() {
        tracing::warn!(namespace = %name, "namespace policy: {problem}");
    }
}

/// Whether the API server refused the list or watch (no RBAC for it).
fn is_forbidden(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 403,
        watcher::Error::WatchError(status) => status.code == 403,
        _ => false,
    }
}

/// The watch task: a re-list replaces the map once it is done; each change after it replaces
/// one entry (the old snapshot serves until then).
async fn keep_policies(
    stream: impl futures_util::Stream<
        Item = Result<watcher::Event<PartialObjectMeta<Namespace>>, watcher::Error>,
    >,
    shared: Arc<Shared>,
) {
    let mut stream = std::pin::pin!(stream);
    let mut listing: Option<PolicyMap> = None;
    // Said once per refusal, not once per retry.
    let mut refused = false;
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(event) => event,
            Err(e) if is_forbidden(&e) => {
                shared.refusals.fetch_add(1, Ordering::Relaxed);
                shared.available.store(false, Ordering::Relaxed);
                // Access revoked while running: the config alone, not a view nobody updates.
                publish_list(&shared, PolicyMap::new());
                if !refused {
                    refused = true;
                    tracing::warn!(error = %e, "namespace policy unavailable: not allowed to list/watch namespaces (RBAC); deciding with the config alone until it is");
                }
                shared.settled.send_replace(true);
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "namespace watch failed; retrying");
                continue;
            }
        };
        match event {
            watcher::Event::Init => listing = Some(PolicyMap::new()),
            watcher::Event::InitApply(namespace) => {
                if let Some((name, policy)) = read(&namespace.metadata) {
                    listing
                        .get_or_insert_with(PolicyMap::new)
                        .insert(name, policy);
                }
            }
            watcher::Event::InitDone => {
                let listed = listing.take().unwrap_or_default();
                publish_list(&shared, listed);
                if std::mem::take(&mut refused) {
                    tracing::info!("namespace policy available: namespaces listed");
                }
                shared.available.store(true, Ordering::Relaxed);
                shared.settled.send_replace(true);
            }
            watcher::Event::Apply(namespace) => {
                let name = namespace.metadata.name.as_deref().unwrap_or_default();
                let policy = read(&namespace.metadata).map(|(_, p)| p);
                publish_one(&shared, name, policy);
            }
            watcher::Event::Delete(namespace) => {
                let name = namespace.metadata.name.as_deref().unwrap_or_default();
                publish_one(&shared, name, None);
            }
        }
    }
}

/// A full list is in: published when it differs from what is.
fn publish_list(shared: &Shared, listed: PolicyMap) {
    let current = shared.map.load();
    if **current == listed {
        return;
    }
    for (name, policy) in &listed {
        if current.get(name) != Some(policy) {
            warn_of_problems(name, policy);
        }
    }
    shared.map.store(Arc::new(listed));
    shared.updates.fetch_add(1, Ordering::Relaxed);
}

/// One Namespace changed (`None`: it says nothing tolerable reads now, or is gone): published
/// when its policy differs.
fn publish_one(shared: &Shared, name: &str, policy: Option<Arc<NamespacePolicy>>) {
    let current = shared.map.load();
    if current.get(name) == policy.as_ref() || name.is_empty() {
        return;
    }
    let mut map = PolicyMap::clone(&current);
    match policy {
        Some(policy) => {
            warn_of_problems(name, &policy);
            map.insert(Arc::from(name), policy);
        }
        None => {
            map.remove(name);
        }
    }
    shared.map.store(Arc::new(map));
    shared.updates.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    //! The recorded metadata list and watch, taken in as the watch task takes them.
    use super::*;

    fn recorded(name: &str) -> String {
        std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data/kube-api/namespaces")
                .join(name),
        )
        .unwrap()
    }

    fn listed() -> Vec<PartialObjectMeta<Namespace>> {
        let list: serde_json::Value =
            serde_json::from_str(&recorded("namespace-list-metadata.body.json")).unwrap();
        serde_json::from_value(list["items"].clone()).unwrap()
    }

    #[test]
    fn only_namespaces_with_a_policy_are_kept() {
        let items = listed();
        assert_eq!(items.len(), 7, "the recording's Namespaces");
        let kept: PolicyMap = items.iter().filter_map(|n| read(&n.metadata)).collect();
        let mut names: Vec<&str> = kept.keys().map(|k| &**k).collect();
        names.sort_unstable();
        assert_eq!(names, ["batch", "team-a", "team-b"]);
        assert_eq!(kept["team-a"].enforce, Some(false));
        assert!(kept["team-b"].skip);
        assert_eq!(kept["batch"].preferred.as_ref().map(Vec::len), Some(2));
    }

    #[test]
    fn audit_keeps_only_the_preferences() {
        let listed = NamespacePolicies::new(
            listed().iter().filter_map(|n| read(&n.metadata)).collect(),
            true,
        );
        let audited = listed.preferences_only();
        assert_eq!(audited.len(), 1, "batch alone sets a preference");
        let batch = audited.get("batch").unwrap();
        assert_eq!(batch.preferred, listed.get("batch").unwrap().preferred);
        assert!(audited.get("team-a").is_none() && audited.get("team-b").is_none());
    }

    #[test]
    fn the_recorded_watch_changes_one_namespace_at_a_time() {
        let shared = NamespacePolicies::new(PolicyMap::new(), false).shared;
        publish_list(
            &shared,
            listed().iter().filter_map(|n| read(&n.metadata)).collect(),
        );
        assert_eq!(shared.updates.load(Ordering::Relaxed), 1);
        let events: Vec<serde_json::Value> = recorded("namespace-watch-metadata.body.json")
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|e: &serde_json::Value| e["type"] != "BOOKMARK")
            .collect();
        for event in &events {
            let namespace: PartialObjectMeta<Namespace> =
                serde_json::from_value(event["object"].clone()).unwrap();
            let name = namespace.metadata.name.clone().unwrap();
            publish_one(&shared, &name, read(&namespace.metadata).map(|(_, p)| p));
        }
        let map = shared.map.load();
        assert_eq!(map["team-a"].enforce, Some(true), "relabelled");
        assert!(!map.contains_key("batch"), "annotation removed: not kept");
        assert!(
            !map.contains_key("new-team"),
            "added without a policy: not kept"
        );
        // team-a and batch changed; new-team says nothing.
        assert_eq!(shared.updates.load(Ordering::Relaxed), 3);
    }
}
