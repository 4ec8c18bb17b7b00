//! The node watch: a kube-runtime reflector over Nodes, from which the decision core learns which
//! architectures the cluster has and which taints each architecture's nodes carry.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt as _};

use crate::mutate::NodePools;

/// A live view of the cluster's Nodes.
#[derive(Clone)]
pub struct NodeWatch {
    store: Store<Node>,
    /// Set once the first full list is in. Our own signal rather than a second
    /// `Store::wait_until_ready`: kube-runtime's ready signal is a oneshot receiver polled through
    /// a shared lock, so of two tasks waiting on it only the last to register is woken.
    synced: tokio::sync::watch::Receiver<bool>,
    /// The toleration templates' keys: only taints under these describe a pool.
    taint_keys: Arc<BTreeSet<String>>,
    /// Whether the view is in sync with the API server, for the sync metric.
    sync: Arc<Mutex<SyncState>>,
}

/// Whether the node watch is in sync: after a full list and while no error has been reported
/// since (kube-runtime's watcher reports every failed watch or list, and lists again).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct SyncState {
    /// In sync now.
    in_sync: bool,
    /// When it last stopped being in sync; `None` before the first full list.
    until: Option<SystemTime>,
    /// A full list has arrived.
    listed: bool,
}

impl SyncState {
    /// An event from the watch (`Ok`: an object or a list's end; `Err`: the watch or list
    /// failed), at `now`.
    fn event(&mut self, event: Result<&watcher::Event<Node>, ()>, now: SystemTime) {
        match event {
            Ok(watcher::Event::InitDone) => {
                self.listed = true;
                self.in_sync = true;
            }
            // A re-list in progress: the view is the old one until it is done.
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                self.in_sync = self.listed;
            }
            Err(()) => {
                if self.in_sync {
                    self.until = Some(now);
                }
                self.in_sync = false;
            }
        }
    }

    /// Until when the view was known in sync: `now` while it is.
    fn last_synced(&self, now: SystemTime) -> Option<SystemTime> {
        if self.in_sync {
            Some(now)
        } else {
            self.until
        }
    }
}

impl NodeWatch {
    /// Starts watching Nodes in the background (list, then watch; re-lists and backs off on
    /// errors, as kube-runtime's watcher does). Only taints under `taint_keys` are kept.
    pub fn start(client: kube::Client, taint_keys: BTreeSet<String>) -> Self {
        let (store, writer) = reflector::store();
        let api: Api<Node> = Api::all(client);
        let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff();
        let sync = Arc::new(Mutex::new(SyncState::default()));
        let state = sync.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                if let Err(e) = &event {
                    tracing::warn!(error = %e, "node watch failed; retrying");
                }
                // Plain data: still consistent if a holder panicked.
                state
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .event(event.as_ref().map_err(|_| ()), SystemTime::now());
            }
        });
        let (flag, synced) = tokio::sync::watch::channel(false);
        let ready = store.clone();
        tokio::spawn(async move {
            if ready.wait_until_ready().await.is_ok() {
                flag.send_replace(true);
                tracing::info!("node watch synced");
            }
        });
        Self {
            store,
            synced,
            taint_keys: Arc::new(taint_keys),
            sync,
        }
    }

    /// Until when the view was known in sync with the API server: now while it is (a full list
    /// arrived and no error since), the moment it failed while it is not, `None` before the
    /// first full list.
    pub(crate) fn last_synced(&self) -> Option<SystemTime> {
        self.sync
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .last_synced(SystemTime::now())
    }

    /// Whether the first full list has arrived (until then the pools are unknown).
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits until the first full list has arrived.
    pub async fn synced(&self) {
        // An error means the watch task is gone, and with it any hope of a list.
        let _ = self.synced.clone().wait_for(|synced| *synced).await;
    }

    /// The Nodes now (a snapshot of the cache).
    pub(crate) fn nodes(&self) -> Vec<Arc<Node>> {
        self.store.state()
    }

    /// The pools now; `None` before the first list.
    pub fn pools(&self) -> Option<NodePools> {
        if !self.is_synced() {
            return None;
        }
        let nodes = self.store.state();
        Some(NodePools::from_nodes(
            nodes.iter().map(AsRef::as_ref),
            &self.taint_keys,
        ))
    }
}

/// Why tainting was not done.
#[derive(Debug, thiserror::Error)]
pub enum TaintError {
    #[error("refusing to taint: {0} (pass --force to taint anyway)")]
    WebhookNotReady(String),
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    #[error("node {node} kept changing under us; try again")]
    Conflict { node: String },
    #[error("refusing to taint {nodes}: {why}")]
    UnplannedArchitecture { nodes: String, why: String },
}

/// The MutatingWebhookConfiguration kustomize installs.
pub(crate) const WEBHOOK_CONFIGURATION: &str = "tolerable";

/// Whether the webhook is registered and can be called (cert-manager injected its CA bundle).
/// Tainting before that would keep every new Pod off the tainted nodes.
pub async fn webhook_ready(client: &kube::Client) -> Result<(), TaintError> {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let Some(config) = api.get_opt(WEBHOOK_CONFIGURATION).await? else {
        return Err(TaintError::WebhookNotReady(format!(
            "the tolerable webhook is not registered (MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION} not found): \
             new Pods would get no tolerations and stay off every tainted node"
        )));
    };
    let has_ca = config.webhooks.iter().flatten().any(|w| {
        w.client_config
            .ca_bundle
            .as_ref()
            .is_some_and(|b| !b.0.is_empty())
    });
    if !has_ca {
        return Err(TaintError::WebhookNotReady(format!(
            "MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION} has no CA bundle yet (is cert-manager's CA injector running?)"
        )));
    }
    Ok(())
}

/// What `tolerable nodes` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaintAction {
    /// Report what `Taint` would do.
    Plan,
    Taint,
    Untaint,
}

/// Plans for every Node and, unless `action` is `Plan`, applies the changes: one JSON Patch per
/// node, guarded by its resourceVersion; a node that changed meanwhile is read again and planned
/// again (three tries).
pub async fn reconcile_taints(
    client: &kube::Client,
    policy: &crate::taints::TaintPolicy,
    action: TaintAction,
) -> Result<Vec<crate::taints::NodePlan>, TaintError> {
    use kube::api::ListParams;

    let api: Api<Node> = Api::all(client.clone());
    let nodes = api.list(&ListParams::default()).await?.items;
    if action == TaintAction::Taint {
        // All or nothing: fencing off a pool nobody tolerates is a mistake to stop, not to do
        // halfway.
        let refused: Vec<crate::taints::NodePlan> = nodes
            .iter()
            .map(|n| crate::taints::plan_taint(n, policy))
            .filter(|p| p.refused.is_some())
            .collect();
        if let Some(first) = refused.first() {
            return Err(TaintError::UnplannedArchitecture {
                nodes: refused
                    .iter()
                    .map(|p| p.node.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                why: first.refused.clone().unwrap_or_default(),
            });
        }
    }
    apply_taints(client, policy, action, nodes).await
}

/// [`reconcile_taints`] for the given snapshot of Nodes (from a list or the node watch).
pub(crate) async fn apply_taints(
    client: &kube::Client,
    policy: &crate::taints::TaintPolicy,
    action: TaintAction,
    nodes: Vec<Node>,
) -> Result<Vec<crate::taints::NodePlan>, TaintError> {
    use crate::taints::{patch_for, plan_taint, plan_untaint};
    use kube::api::{Patch, PatchParams};

    let api: Api<Node> = Api::all(client.clone());
    let plan = |node: &Node| match action {
        TaintAction::Untaint => plan_untaint(node),
        _ => plan_taint(node, policy),
    };
    let mut plans = Vec::new();
    for node in nodes {
        let mut node = node;
        let mut tries = 0;
        let planned = loop {
            let planned = plan(&node);
            if action == TaintAction::Plan || !planned.changes() {
                break planned;
            }
            let ops = crate::taints::to_json_patch(&patch_for(&node, &planned));
            match api
                .patch(
                    &planned.node,
                    &PatchParams::default(),
                    &Patch::Json::<()>(ops),
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(node = %planned.node, add = ?planned.add, remove = ?planned.remove, "node taints changed");
                    break planned;
                }
                Err(kube::Error::Api(e)) if (e.code == 409 || e.code == 422) && tries < 3 => {
                    tries += 1;
                    node = api.get(&planned.node).await?;
                }
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 422 => {
                    return Err(TaintError::Conflict { node: planned.node });
                }
                Err(e) => return Err(e.into()),
            }
        };
        plans.push(planned);
    }
    plans.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(plans)
}

/// How often `manage_node_taints` looks at the node watch for nodes to taint.
pub const MANAGE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// `manage_node_taints`: taints nodes of supported architectures as the node watch sees them
/// join (never those of an architecture that is neither default nor supported). Runs inside the webhook, so the webhook is up by construction. Never returns.
pub async fn keep_nodes_tainted(
    client: kube::Client,
    watch: NodeWatch,
    policy: crate::taints::TaintPolicy,
) {
    watch.synced().await;
    // Nodes of an architecture nobody tolerates are left alone, said once per node.
    let mut refused_said = BTreeSet::new();
    let mut tick = tokio::time::interval(MANAGE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // Only nodes whose plan changes anything are patched (each re-read on a conflict).
        let mut pending: Vec<Node> = Vec::new();
        for node in watch.nodes() {
            let plan = crate::taints::plan_taint(&node, &policy);
            if let Some(why) = &plan.refused {
                if refused_said.insert(plan.node.clone()) {
                    tracing::warn!(node = %plan.node, "not tainting: {why}");
                }
            } else if plan.changes() {
                pending.push(node.as_ref().clone());
            }
        }
        if pending.is_empty() {
            continue;
        }
        if let Err(e) = apply_taints(&client, &policy, TaintAction::Taint, pending).await {
            tracing::warn!(error = %e, "could not keep node taints up to date; retrying");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn in_sync_after_a_full_list_until_an_error_then_again_after_the_next_event() {
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let node = Node::default();
        let mut sync = SyncState::default();
        assert_eq!(sync.last_synced(t(1)), None, "before the first list");
        sync.event(Ok(&watcher::Event::Init), t(1));
        sync.event(Ok(&watcher::Event::InitApply(node.clone())), t(1));
        assert_eq!(sync.last_synced(t(2)), None, "the list is not done");
        sync.event(Ok(&watcher::Event::Apply(node.clone())), t(2));
        assert_eq!(sync.last_synced(t(2)), None, "an object is no list");
        sync.event(Ok(&watcher::Event::InitDone), t(3));
        assert_eq!(sync.last_synced(t(100)), Some(t(100)), "in sync: now");
        sync.event(Err(()), t(200));
        assert_eq!(sync.last_synced(t(900)), Some(t(200)), "since the failure");
        sync.event(Err(()), t(300));
        assert_eq!(
            sync.last_synced(t(900)),
            Some(t(200)),
            "the first failure counts"
        );
        // The watcher re-lists: not in sync until the list is done.
        sync.event(Ok(&watcher::Event::Init), t(400));
        assert_eq!(sync.last_synced(t(900)), Some(t(200)));
        sync.event(Ok(&watcher::Event::InitDone), t(500));
        assert_eq!(sync.last_synced(t(901)), Some(t(901)));
        // Or the watch resumes without a list: its next event says so.
        sync.event(Err(()), t(1000));
        sync.event(Ok(&watcher::Event::Delete(node)), t(1010));
        assert_eq!(sync.last_synced(t(1020)), Some(t(1020)));
    }
}
