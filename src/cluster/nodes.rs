//! The node watch: kube-runtime's watcher over Nodes, from which the decision core learns which
//! architectures the cluster has and which taints each architecture's nodes carry.
//!
//! Sized by what is read, not by what the API server sends: each Node is kept as its
//! [`NodeFacts`] (a name, two labels, the kubelet's report, a few taints), and the core's
//! [`NodePools`] are built from them only when a fact changes — never per admission, never for
//! a kubelet heartbeat — coalesced over [`COALESCE`], and published as one shared snapshot that
//! an admission reads by cloning an `Arc`.

mod projection;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt as _};

pub(crate) use self::projection::{NodeFacts, WatchedNode};
use super::watch::{Keyed, Seen, Took, WatchStatus};
use crate::mutate::NodePools;

/// Nodes per list page. A page is read whole before it is parsed, twice over in the client's
/// buffers: at ~18 KB per EKS-shaped Node, 250 keep a list's peak ~9 MB above the kept facts
/// (client-go's 500 doubled that; BENCHMARKS.md), for twice the list requests.
pub const LIST_PAGE: u32 = 250;

/// How long changes are gathered before the pools are rebuilt: a burst (a node group scaling,
/// a re-list) costs one build, and an admission sees a change at most this late.
pub const COALESCE: Duration = Duration::from_millis(250);

/// A live view of the cluster's Nodes.
#[derive(Clone)]
pub struct NodeWatch {
    published: Arc<Published>,
    /// Set once the first full list is in.
    synced: tokio::sync::watch::Receiver<bool>,
    /// The watch's state (in sync and until when, for the sync metric).
    status: Arc<WatchStatus>,
}

/// What the watch task publishes for admissions, the tainter and the metrics.
#[derive(Default)]
struct Published {
    /// The pools as of the last build; `None` before the first full list.
    pools: ArcSwapOption<NodePools>,
    /// Every Node's facts as of the last build (for the tainter and the fenced-off warning).
    nodes: ArcSwapOption<Vec<(Arc<str>, Arc<NodeFacts>)>>,
    /// How many times the pools were built.
    builds: AtomicU64,
    /// Nodes in the last build.
    count: AtomicU64,
    /// Watch events that changed a Node's facts, and those that did not.
    changed: AtomicU64,
    unchanged: AtomicU64,
}

/// The watch task's own state: every Node's facts, and whether the published pools are behind.
struct Facts {
    taint_keys: BTreeSet<String>,
    /// `match_node_labels`: the label keys whose values are kept.
    label_keys: BTreeSet<String>,
    /// Each Node's facts (shared with the published list: a build copies two pointers per
    /// Node, not its facts); a re-list is gathered aside until it is done.
    nodes: Keyed<NodeFacts>,
    /// A fact changed since the last build.
    changed: bool,
}

impl Facts {
    fn new(taint_keys: BTreeSet<String>, label_keys: BTreeSet<String>) -> Self {
        Self {
            taint_keys,
            label_keys,
            nodes: Keyed::new(),
            changed: false,
        }
    }

    /// Takes one watch event in: each Node kept as its facts, only taints and labels under
    /// the keys a decision reads.
    fn apply(&mut self, event: watcher::Event<WatchedNode>) -> Took {
        let (taint_keys, label_keys) = (&self.taint_keys, &self.label_keys);
        let took = self.nodes.take(event, |node| {
            let name: Arc<str> = Arc::from(node.name());
            let mut facts = node.facts;
            facts.keep_taints(taint_keys);
            facts.keep_labels(label_keys);
            (name, Some(facts))
        });
        self.changed |= took.changed();
        took
    }

    /// Builds the pools from the facts and publishes them.
    fn publish(&mut self, published: &Published) {
        let mut pools = NodePools::default();
        pools.watch_labels(&self.label_keys);
        let mut nodes = Vec::with_capacity(self.nodes.current().len());
        for (name, facts) in self.nodes.current() {
            if let Some(arch) = facts.architecture() {
                pools.add_node(Some(name), arch, &facts.taints, &self.taint_keys);
                pools.add_node_labels(&facts.labels);
            }
            nodes.push((name.clone(), facts.clone()));
        }
        published.pools.store(Some(Arc::new(pools)));
        published.nodes.store(Some(Arc::new(nodes)));
        published.builds.fetch_add(1, Ordering::Relaxed);
        let count = self.nodes.current().len() as u64;
        published.count.store(count, Ordering::Relaxed);
        self.changed = false;
    }
}

impl NodeWatch {
    /// Starts watching Nodes in the background (a list paged at [`LIST_PAGE`], then a watch;
    /// re-lists and backs off on errors, as kube-runtime's watcher does). Only taints under
    /// `taint_keys` are kept.
    pub fn start(client: kube::Client, taint_keys: BTreeSet<String>) -> Self {
        Self::start_with_labels(client, taint_keys, BTreeSet::new())
    }

    /// As [`NodeWatch::start`], also keeping each Node's labels under `label_keys`
    /// (`match_node_labels`): the pools say which values some node carries.
    pub fn start_with_labels(
        client: kube::Client,
        taint_keys: BTreeSet<String>,
        label_keys: BTreeSet<String>,
    ) -> Self {
        let api: Api<WatchedNode> = Api::all(client);
        let config = watcher::Config::default().page_size(LIST_PAGE);
        let stream = watcher(api, config).default_backoff();
        let status = Arc::new(WatchStatus::new(false));
        let published = Arc::new(Published::default());
        let (flag, synced) = tokio::sync::watch::channel(false);
        let facts = Facts::new(taint_keys, label_keys);
        tokio::spawn(keep_facts(
            stream,
            facts,
            published.clone(),
            status.clone(),
            flag,
        ));
        Self {
            published,
            synced,
            status,
        }
    }

    /// Until when the view was known in sync with the API server: now while it is (a full list
    /// arrived and no error since), the moment it failed while it is not, `None` before the
    /// first full list.
    pub(crate) fn last_synced(&self) -> Option<SystemTime> {
        self.status.last_synced()
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

    /// The Nodes as of the last build, as minimal Nodes holding what the watch keeps (for the
    /// tainter and the fenced-off warning; they plan on whole Nodes).
    pub(crate) fn nodes(&self) -> Vec<Node> {
        self.published
            .nodes
            .load_full()
            .map(|nodes| {
                nodes
                    .iter()
                    .map(|(name, facts)| facts.to_node(name))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The architecture of the Node `name` as of the last build (its label, else its
    /// kubelet's), for the crash watch; a scan of the published list (crash reads are few).
    pub(crate) fn architecture_of(&self, name: &str) -> Option<String> {
        let nodes = self.published.nodes.load_full()?;
        let (_, facts) = nodes.iter().find(|(n, _)| &**n == name)?;
        facts.architecture().map(str::to_owned)
    }

    /// The pools now (shared, built when a Node's facts last changed); `None` before the first
    /// list.
    pub fn pools(&self) -> Option<Arc<NodePools>> {
        self.published.pools.load_full()
    }

    /// How many times the pools have been built (each full list, each coalesced change).
    pub fn pool_builds(&self) -> u64 {
        self.published.builds.load(Ordering::Relaxed)
    }

    /// Watch events so far that changed a Node's facts, and those that changed nothing a
    /// decision reads (heartbeats).
    pub fn events_seen(&self) -> (u64, u64) {
        (
            self.published.changed.load(Ordering::Relaxed),
            self.published.unchanged.load(Ordering::Relaxed),
        )
    }

    /// How many Nodes the last build saw.
    pub(crate) fn node_count(&self) -> u64 {
        self.published.count.load(Ordering::Relaxed)
    }
}

/// The watch task: takes each event in, rebuilds the pools [`COALESCE`] after the first change
/// of a burst (at once for the first full list, which readiness waits for).
async fn keep_facts(
    stream: impl futures_util::Stream<Item = Result<watcher::Event<WatchedNode>, watcher::Error>>,
    mut facts: Facts,
    published: Arc<Published>,
    status: Arc<WatchStatus>,
    flag: tokio::sync::watch::Sender<bool>,
) {
    let mut stream = std::pin::pin!(stream);
    let mut rebuild_at: Option<tokio::time::Instant> = None;
    loop {
        let event = match rebuild_at {
            Some(at) => tokio::select! {
                event = stream.next() => event,
                () = tokio::time::sleep_until(at) => {
                    facts.publish(&published);
                    rebuild_at = None;
                    continue;
                }
            },
            None => stream.next().await,
        };
        let Some(event) = event else { return };
        let seen = Seen::of(&event);
        let took = match event {
            Ok(event) => facts.apply(event),
            Err(e) => {
                tracing::warn!(error = %e, "node watch failed; retrying");
                Took::Unchanged
            }
        };
        status.event(seen);
        match (&took, seen) {
            (Took::Changed(_), _) => published.changed.fetch_add(1, Ordering::Relaxed),
            (Took::Unchanged, Seen::Object) => published.unchanged.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        if seen == Seen::Listed && !*flag.borrow() {
            facts.publish(&published);
            rebuild_at = None;
            flag.send_replace(true);
            tracing::info!(nodes = facts.nodes.current().len(), "node watch synced");
        } else if facts.changed && rebuild_at.is_none() {
            rebuild_at = Some(tokio::time::Instant::now() + COALESCE);
        }
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
        // Only nodes whose plan changes anything are patched, each read whole first (the watch
        // keeps only what planning reads; the patch is guarded by the whole taint list).
        let mut pending: Vec<String> = Vec::new();
        for node in watch.nodes() {
            let plan = crate::taints::plan_taint(&node, &policy);
            if let Some(why) = &plan.refused {
                if refused_said.insert(plan.node.clone()) {
                    tracing::warn!(node = %plan.node, "not tainting: {why}");
                }
            } else if plan.changes() {
                pending.push(plan.node);
            }
        }
        if pending.is_empty() {
            continue;
        }
        let api: Api<Node> = Api::all(client.clone());
        let mut whole = Vec::with_capacity(pending.len());
        for name in pending {
            match api.get_opt(&name).await {
                Ok(Some(node)) => whole.push(node),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(node = %name, error = %e, "could not read node to taint; retrying")
                }
            }
        }
        if let Err(e) = apply_taints(&client, &policy, TaintAction::Taint, whole).await {
            tracing::warn!(error = %e, "could not keep node taints up to date; retrying");
        }
    }
}

#[cfg(test)]
mod facts_tests {
    //! What each recorded kind of watch event does to the facts (the EKS-shaped recording: a
    //! kubelet heartbeat, a label under another key, a taint change).
    use super::*;
    use crate::mutate::ARCH_LABEL;

    fn recorded(name: &str) -> String {
        std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data/kube-api/scale")
                .join(name),
        )
        .unwrap()
    }

    fn listed() -> Facts {
        let list: serde_json::Value =
            serde_json::from_str(&recorded("node-list-limit-2.body.json")).unwrap();
        let mut facts = Facts::new(BTreeSet::from([ARCH_LABEL.to_owned()]), BTreeSet::new());
        assert_eq!(facts.apply(watcher::Event::Init), Took::Listing);
        for item in list["items"].as_array().unwrap() {
            let node: WatchedNode = serde_json::from_value(item.clone()).unwrap();
            assert_eq!(facts.apply(watcher::Event::InitApply(node)), Took::Listing);
            assert!(
                facts.nodes.current().is_empty(),
                "the old view serves until the list is done"
            );
        }
        assert!(facts.apply(watcher::Event::InitDone).changed());
        assert_eq!(facts.nodes.current().len(), 2);
        facts
    }

    fn events() -> Vec<WatchedNode> {
        recorded("node-watch.body.json")
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|e| e["type"] == "MODIFIED")
            .map(|e| serde_json::from_value(e["object"].clone()).unwrap())
            .collect()
    }

    #[test]
    fn a_heartbeat_or_another_label_changes_nothing_a_taint_change_does() {
        let mut facts = listed();
        facts.changed = false;
        let [heartbeat, label, taint] = <[WatchedNode; 3]>::try_from(events()).unwrap();
        assert_eq!(
            facts.apply(watcher::Event::Apply(heartbeat)),
            Took::Unchanged
        );
        assert_eq!(facts.apply(watcher::Event::Apply(label)), Took::Unchanged);
        assert!(!facts.changed, "nothing to rebuild");
        let name = taint.name().to_owned();
        assert!(facts.apply(watcher::Event::Apply(taint.clone())).changed());
        assert!(facts.changed);
        assert_eq!(
            facts.nodes.current()[name.as_str()].taints[0]
                .value
                .as_deref(),
            Some("amd64")
        );
        // The same event again (a watch resumed) changes nothing more.
        facts.changed = false;
        assert_eq!(
            facts.apply(watcher::Event::Apply(taint.clone())),
            Took::Unchanged
        );
        assert!(facts.apply(watcher::Event::Delete(taint.clone())).changed());
        assert_eq!(facts.apply(watcher::Event::Delete(taint)), Took::Unchanged);
    }

    #[test]
    fn a_relist_of_the_same_nodes_changes_nothing() {
        let mut facts = listed();
        facts.changed = false;
        let published = Published::default();
        let list: serde_json::Value =
            serde_json::from_str(&recorded("node-list-limit-2.body.json")).unwrap();
        facts.apply(watcher::Event::Init);
        for item in list["items"].as_array().unwrap() {
            let node: WatchedNode = serde_json::from_value(item.clone()).unwrap();
            facts.apply(watcher::Event::InitApply(node));
        }
        assert!(!facts.apply(watcher::Event::InitDone).changed());
        assert!(!facts.changed);
        facts.publish(&published);
        assert_eq!(published.builds.load(Ordering::Relaxed), 1);
        let pools = published.pools.load_full().unwrap();
        assert_eq!(pools.architectures.keys().collect::<Vec<_>>(), ["arm64"]);
        assert_eq!(pools.nodes.len(), 2);
    }
}
