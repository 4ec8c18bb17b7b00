//! What the namespace watch reports (only when it runs): whether per-namespace policy is
//! available (0 while the API server refuses to list namespaces: decisions keep to the
//! config), how many Namespaces carry one, how often it changed, and the refusals. Read from
//! the watch at scrape time.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Default)]
pub(crate) struct NamespaceMetrics {
    available: Gauge,
    namespaces: Gauge,
    updates: Counter,
    refusals: Counter,
}

/// The namespace watch's state, as read at scrape time.
pub(crate) struct NamespaceWatchState {
    pub(crate) available: bool,
    pub(crate) namespaces: usize,
    pub(crate) updates: u64,
    pub(crate) refusals: u64,
}

impl NamespaceMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "tolerable_namespace_policy_available",
            "1 while per-namespace policy is read from the cluster's Namespaces, 0 before the first list and while the API server refuses to list or watch them (decisions keep to the config)",
            self.available.clone(),
        );
        registry.register(
            "tolerable_namespace_policy_namespaces",
            "Namespaces whose labels or annotations set tolerable's policy (tolerable.io/enforce, tolerable.io/skip, tolerable.io/preferred-architecture)",
            self.namespaces.clone(),
        );
        registry.register(
            "tolerable_namespace_policy_updates",
            "Times the per-namespace policy decisions read changed (a list that changed it, a Namespace whose policy changed)",
            self.updates.clone(),
        );
        registry.register(
            "tolerable_namespace_policy_refusals",
            "Lists or watches of Namespaces the API server refused (403: no RBAC for list/watch namespaces)",
            self.refusals.clone(),
        );
    }

    pub(super) fn set(&self, state: &NamespaceWatchState) {
        self.available.set(i64::from(state.available));
        self.namespaces
            .set(i64::try_from(state.namespaces).unwrap_or(i64::MAX));
        self.updates
            .inc_by(state.updates.saturating_sub(self.updates.get()));
        self.refusals
            .inc_by(state.refusals.saturating_sub(self.refusals.get()));
    }
}
