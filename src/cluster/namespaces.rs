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
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::{watcher, WatchStreamExt as _};

use super::watch::{Keyed, Notice, Seen, WatchStatus};
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
    /// What admissions read: the store's view as of its last change.
    map: ArcSwap<PolicyMap>,
    /// Each Namespace that sets a policy, as the watch (or `review`) last said.
    store: Mutex<Keyed<NamespacePolicy>>,
    status: WatchStatus,
}

impl NamespacePolicies {
    fn new(map: PolicyMap, settled: bool) -> Self {
        let mut store = Keyed::new();
        for (name, policy) in &map {
            store.set(name.clone(), Some(NamespacePolicy::clone(policy)));
        }
        Self {
            shared: Arc::new(Shared {
                map: ArcSwap::from_pointee(map),
                store: Mutex::new(store),
                status: WatchStatus::new(settled),
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
        let policy = (!policy.is_empty()).then_some(policy);
        let mut store = self.shared.lock_store();
        let took = store.set(Arc::from(name), policy);
        publish(&self.shared, &store, took);
    }

    /// The same view with only the Namespaces' preferences (and their problems): `audit`
    /// reports on every namespace as enforced, as it does for `skip_namespaces` and
    /// `enforce = false`.
    pub(crate) fn preferences_only(&self) -> Self {
        let map = self.shared.map.load();
        Self::fixed(map.iter().map(|(name, policy)| {
            let preference = NamespacePolicy {
                knobs: crate::mutate::Knobs {
                    preferred: policy.knobs.preferred.clone(),
                    ..crate::mutate::Knobs::default()
                },
                problems: policy.problems.clone(),
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
        self.shared.status.is_settled()
    }

    /// Waits until [`NamespacePolicies::is_settled`].
    pub async fn settled(&self) {
        self.shared.status.settled().await;
    }

    /// Whether the Namespaces are read (`false` before the first list and while refused).
    pub fn is_available(&self) -> bool {
        self.shared.status.is_available()
    }

    /// Lists or watches refused (403) so far.
    pub fn refusals(&self) -> u64 {
        self.shared.status.refusals()
    }

    /// Times the published policy changed (each list that changed it, each changed Namespace).
    pub fn updates(&self) -> u64 {
        self.shared.status.updates()
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

/// A Namespace as the store keeps it: its name, and its policy when it sets one.
fn project(namespace: PartialObjectMeta<Namespace>) -> (Arc<str>, Option<NamespacePolicy>) {
    let meta = &namespace.metadata;
    let name: Arc<str> = Arc::from(meta.name.as_deref().unwrap_or_default());
    let policy = NamespacePolicy::from_metadata(meta.labels.as_ref(), meta.annotations.as_ref());
    (name, (!policy.is_empty()).then_some(policy))
}

/// Says once per change which keys of a Namespace were ignored, and why.
fn warn_of_problems(name: &str, policy: &NamespacePolicy) {
    for problem in policy.problems() {
        tracing::warn!(namespace = %name, "namespace policy: {problem}");
    }
}

impl Shared {
    fn lock_store(&self) -> std::sync::MutexGuard<'_, Keyed<NamespacePolicy>> {
        // Plain data: still consistent if a holder panicked.
        self.store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The watch task: the primitive's store and status (a re-list replaces the view once it is
/// done; each change after it, one entry), published on each change.
async fn keep_policies(
    stream: impl futures_util::Stream<
        Item = Result<watcher::Event<PartialObjectMeta<Namespace>>, watcher::Error>,
    >,
    shared: Arc<Shared>,
) {
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        let seen = Seen::of(&event);
        // The view first, then the status: whoever waits for "settled" or "unavailable" reads
        // the view that goes with it.
        let error = match event {
            Ok(event) => {
                let mut store = shared.lock_store();
                let took = store.take(event, project);
                publish(&shared, &store, took);
                None
            }
            Err(e) => Some(e),
        };
        if seen == Seen::Refused {
            // Access revoked while running: the config alone, not a view nobody updates.
            *shared.lock_store() = Keyed::new();
            shared.map.store(Arc::new(PolicyMap::new()));
        }
        match (shared.status.event(seen), error) {
            (Notice::FirstRefusal, Some(e)) => {
                tracing::warn!(error = %e, "namespace policy unavailable: not allowed to list/watch namespaces (RBAC); deciding with the config alone until it is")
            }
            (Notice::AvailableAgain, _) => {
                tracing::info!("namespace policy available: namespaces listed")
            }
            (Notice::Nothing, Some(e)) if seen == Seen::Failed => {
                tracing::warn!(error = %e, "namespace watch failed; retrying")
            }
            _ => {}
        }
    }
}

/// Publishes the store's view when it changed, saying what is wrong with each changed policy.
fn publish(shared: &Shared, store: &Keyed<NamespacePolicy>, took: super::watch::Took) {
    use super::watch::Took;
    let changed: &[Arc<str>] = match &took {
        Took::Listed { changed, .. } => changed,
        Took::Changed(name) => std::slice::from_ref(name),
        Took::Listing | Took::Unchanged => &[],
    };
    if !took.changed() {
        return;
    }
    for name in changed {
        if let Some(policy) = store.current().get(name) {
            warn_of_problems(name, policy);
        }
    }
    shared.map.store(Arc::new(store.current().clone()));
    shared.status.updated();
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
        assert_eq!(kept["team-a"].knobs.enforce, Some(false));
        assert_eq!(kept["team-b"].knobs.skip, Some(true));
        assert_eq!(
            kept["batch"].knobs.preferred.as_ref().map(Vec::len),
            Some(2)
        );
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
        assert_eq!(
            batch.knobs.preferred,
            listed.get("batch").unwrap().knobs.preferred
        );
        assert!(audited.get("team-a").is_none() && audited.get("team-b").is_none());
    }

    #[test]
    fn the_recorded_watch_changes_one_namespace_at_a_time() {
        use watcher::Event;
        let shared = NamespacePolicies::new(PolicyMap::new(), false).shared;
        let take = |event| {
            let mut store = shared.lock_store();
            let took = store.take(event, project);
            publish(&shared, &store, took);
        };
        take(Event::Init);
        listed().into_iter().for_each(|n| take(Event::InitApply(n)));
        take(Event::InitDone);
        assert_eq!(shared.status.updates(), 1);
        let events: Vec<serde_json::Value> = recorded("namespace-watch-metadata.body.json")
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|e: &serde_json::Value| e["type"] != "BOOKMARK")
            .collect();
        for event in &events {
            let namespace: PartialObjectMeta<Namespace> =
                serde_json::from_value(event["object"].clone()).unwrap();
            take(if event["type"] == "DELETED" {
                Event::Delete(namespace)
            } else {
                Event::Apply(namespace)
            });
        }
        let map = shared.map.load();
        assert_eq!(map["team-a"].knobs.enforce, Some(true), "relabelled");
        assert!(!map.contains_key("batch"), "annotation removed: not kept");
        assert!(
            !map.contains_key("new-team"),
            "added without a policy: not kept"
        );
        // team-a and batch changed; new-team says nothing.
        assert_eq!(shared.status.updates(), 3);
    }
}
