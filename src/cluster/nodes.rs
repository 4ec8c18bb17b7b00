//! The node watch: a kube-runtime reflector over Nodes, from which the decision core learns which
//! architectures the cluster has and which taints each architecture's nodes carry.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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
    synced: Arc<AtomicBool>,
    taint_key: Arc<str>,
}

impl NodeWatch {
    /// Starts watching Nodes in the background (list, then watch; re-lists and backs off on
    /// errors, as kube-runtime's watcher does). Only taints under `taint_key` are kept.
    pub fn start(client: kube::Client, taint_key: &str) -> Self {
        let (store, writer) = reflector::store();
        let api: Api<Node> = Api::all(client);
        let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff()
            .touched_objects();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                if let Err(e) = event {
                    tracing::warn!(error = %e, "node watch failed; retrying");
                }
            }
        });
        let synced = Arc::new(AtomicBool::new(false));
        let (ready, flag) = (store.clone(), synced.clone());
        tokio::spawn(async move {
            if ready.wait_until_ready().await.is_ok() {
                flag.store(true, Ordering::Relaxed);
                tracing::info!("node watch synced");
            }
        });
        Self {
            store,
            synced,
            taint_key: Arc::from(taint_key),
        }
    }

    /// Whether the first full list has arrived (until then the pools are unknown).
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// Waits until the first full list has arrived.
    pub async fn synced(&self) {
        let _ = self.store.wait_until_ready().await;
    }

    /// The Nodes now (a snapshot of the cache).
    pub fn nodes(&self) -> Vec<Arc<Node>> {
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
            &self.taint_key,
        ))
    }
}
