//! Prometheus metrics. `serve` owns the registry; components get an `Arc<Metrics>`. Every label
//! value comes from a bounded set (registry hosts are capped, see [`MAX_REGISTRY_LABELS`]).
//!
//! Parts: this file (the metrics, registered; admissions, the server, health, the node
//! watch), `lookups` (what image lookups report: registries, the caches, circuit breakers,
//! credential plugins), `exposition` (OpenMetrics and the Prometheus text format).

mod events;
mod exposition;
mod gates;
mod lookups;
mod namespaces;

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::mutate::{Answer, Decision, Outcome, Untouched};

use self::lookups::WELL_KNOWN_REGISTRIES;

pub(crate) use self::events::{EventMetrics, EventResult};
pub use self::exposition::encode;
pub(crate) use self::exposition::encode_text_format;
pub(crate) use self::gates::{GateMetrics, GateRelease};
pub(crate) use self::namespaces::NamespaceWatchState;

/// Distinct registry hosts given their own label value besides the operator's own (mirrors,
/// credential files, insecure registries) and the well-known public ones; the rest count as
/// `other`, so Pods naming random registries cannot blow up the metric's cardinality. A host
/// earns a slot only by answering a request successfully, so made-up hosts cannot use the slots
/// up and hide the real registries under `other`.
pub(crate) const MAX_REGISTRY_LABELS: usize = 50;

/// Namespaces given their own label value in `tolerable_pull_secrets_forbidden_total`; the rest
/// count as `other`.
pub(crate) const MAX_NAMESPACE_LABELS: usize = 100;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WouldLabels {
    would: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChangedLabels {
    changed: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerClassLabels {
    peer_class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BodyRefusalLabels {
    peer_class: &'static str,
    budget: &'static str,
}

/// `tolerable_body_refusals_total`'s peer classes and budgets.
const PEER_CLASSES: [&str; 2] = ["serving", "other"];
const BODY_BUDGETS: [&str; 3] = ["connection", "peer", "process"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ArchitectureLabels {
    architecture: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CircuitLabels {
    registry: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NamespaceLabels {
    namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginRunLabels {
    provider: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginLabels {
    provider: String,
}

/// `tolerable_credential_plugin_runs_total`'s results.
const PLUGIN_RESULTS: [&str; 6] = [
    "ok",
    "failed",
    "invalid_response",
    "timeout",
    "not_started",
    "none",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegistryWaitLabels {
    registry: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegistryLabels {
    registry: String,
    method: &'static str,
    status: String,
}

/// Why a Pod was denied: the two policies that deny (`on_lookup_failure`,
/// `on_no_common_architecture`).
const DENIAL_REASONS: [&str; 2] = ["lookup_failed", "no_common_architecture"];

/// `tolerable_requests_refused_total`'s reasons.
const REFUSAL_REASONS: [&str; 4] = [
    "requests_in_flight",
    "body_memory",
    "read_timeout",
    "too_many_connections",
];

/// A gauge holding a point in time, in seconds since the Unix epoch (0: none).
type Timestamp = Gauge<f64, AtomicU64>;

/// Seconds since the Unix epoch.
fn unix_seconds(at: SystemTime) -> f64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

pub struct Metrics {
    admissions: Family<OutcomeLabels, Counter>,
    denials: Family<ReasonLabels, Counter>,
    admission_duration: Histogram,
    not_enforced: Family<WouldLabels, Counter>,
    ready: Gauge,
    certificate_expiry: Timestamp,
    registry_ca_expiry: Timestamp,
    node_watch_synced: Timestamp,
    node_pool_builds: Counter,
    node_watch_nodes: Gauge,
    node_watch_events: Family<ChangedLabels, Counter>,
    namespace_watch: namespaces::NamespaceMetrics,
    build_info: Family<VersionLabels, Gauge>,
    lookup_duration: Family<ResultLabels, Histogram>,
    registry_requests: Family<RegistryLabels, Counter>,
    cache_lookups: Family<ResultLabels, Counter>,
    cache_entries: Gauge,
    registry_bytes: Gauge,
    certificate_reloads: Family<ResultLabels, Counter>,
    architecture_taints: Family<ArchitectureLabels, Gauge>,
    circuits_opened: Family<CircuitLabels, Counter>,
    rate_limit: Family<CircuitLabels, Gauge>,
    rate_limit_remaining: Family<CircuitLabels, Gauge>,
    revalidations: Family<ResultLabels, Counter>,
    shared_cache_lookups: Family<ResultLabels, Counter>,
    shared_cache_writes: Family<ResultLabels, Counter>,
    shared_cache_up: Gauge,
    plugin_runs: Family<PluginRunLabels, Counter>,
    plugin_duration: Family<PluginLabels, Histogram>,
    /// The configured plugins' names: the only `provider` label values.
    plugins_named: Mutex<HashSet<String>>,
    pull_secrets_forbidden: Family<NamespaceLabels, Counter>,
    namespaces_named: Mutex<HashSet<String>>,
    open_connections: Gauge,
    request_body_bytes: Gauge,
    requests_in_flight: Gauge,
    connections_refused: Counter,
    connections_closed: Family<ReasonLabels, Counter>,
    requests_refused: Family<ReasonLabels, Counter>,
    body_refusals: Family<BodyRefusalLabels, Counter>,
    body_evictions: Family<PeerClassLabels, Counter>,
    registry_bytes_waits: Family<RegistryWaitLabels, Counter>,
    registries_named: Mutex<HashSet<String>>,
    registries_reserved: Mutex<HashSet<String>>,
    gate_leader: Gauge,
    /// The scheduling gates: admissions gated, the gate controller's releases.
    pub(crate) gates: GateMetrics,
    /// The Warning Events tolerable writes (`cluster::events`).
    pub(crate) events: EventMetrics,
}

fn latency_histogram() -> Histogram {
    // 100 µs … ~13 s: past the webhook's timeoutSeconds (10 in the base), so a p99 near it shows.
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

impl Metrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            admissions: Family::default(),
            denials: Family::default(),
            admission_duration: latency_histogram(),
            not_enforced: Family::default(),
            ready: Gauge::default(),
            certificate_expiry: Timestamp::default(),
            registry_ca_expiry: Timestamp::default(),
            node_watch_synced: Timestamp::default(),
            node_pool_builds: Counter::default(),
            node_watch_nodes: Gauge::default(),
            node_watch_events: Family::default(),
            namespace_watch: namespaces::NamespaceMetrics::default(),
            build_info: Family::default(),
            lookup_duration: Family::new_with_constructor(latency_histogram),
            registry_requests: Family::default(),
            cache_lookups: Family::default(),
            cache_entries: Gauge::default(),
            registry_bytes: Gauge::default(),
            certificate_reloads: Family::default(),
            architecture_taints: Family::default(),
            circuits_opened: Family::default(),
            rate_limit: Family::default(),
            rate_limit_remaining: Family::default(),
            revalidations: Family::default(),
            shared_cache_lookups: Family::default(),
            shared_cache_writes: Family::default(),
            shared_cache_up: Gauge::default(),
            plugin_runs: Family::default(),
            plugin_duration: Family::new_with_constructor(latency_histogram),
            plugins_named: Mutex::default(),
            pull_secrets_forbidden: Family::default(),
            namespaces_named: Mutex::default(),
            open_connections: Gauge::default(),
            request_body_bytes: Gauge::default(),
            requests_in_flight: Gauge::default(),
            connections_refused: Counter::default(),
            connections_closed: Family::default(),
            requests_refused: Family::default(),
            body_refusals: Family::default(),
            body_evictions: Family::default(),
            registry_bytes_waits: Family::default(),
            registries_named: Mutex::default(),
            registries_reserved: Mutex::default(),
            gate_leader: Gauge::default(),
            gates: GateMetrics::register(registry),
            events: EventMetrics::register(registry),
        };
        metrics.register_connections(registry);
        metrics.register_admissions(registry);
        metrics.register_health(registry);
        metrics.register_lookups(registry);
        metrics.register_shared_cache(registry);
        metrics.create_series();
        metrics
    }

    /// Every series of a bounded label set exists from the start, at zero, so alerts and
    /// `rate()` see the first event (a series born at 1 looks like no increase).
    fn create_series(&self) {
        for outcome in Outcome::ALL {
            let _ = self.admissions.get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            });
        }
        for reason in DENIAL_REASONS {
            let _ = self.denials.get_or_create(&ReasonLabels { reason });
        }
        for would in ["change", "deny"] {
            let _ = self.not_enforced.get_or_create(&WouldLabels { would });
        }
        for reason in REFUSAL_REASONS {
            let _ = self
                .requests_refused
                .get_or_create(&ReasonLabels { reason });
        }
        for peer_class in PEER_CLASSES {
            let _ = self
                .body_evictions
                .get_or_create(&PeerClassLabels { peer_class });
            for budget in BODY_BUDGETS {
                let _ = self
                    .body_refusals
                    .get_or_create(&BodyRefusalLabels { peer_class, budget });
            }
        }
        for reason in ["idle", "reclaimed"] {
            let _ = self
                .connections_closed
                .get_or_create(&ReasonLabels { reason });
        }
        for result in ["ok", "error"] {
            let _ = self.lookup_duration.get_or_create(&ResultLabels { result });
            let _ = self
                .certificate_reloads
                .get_or_create(&ResultLabels { result });
        }
        for result in ["hit", "miss", "stale"] {
            let _ = self.cache_lookups.get_or_create(&ResultLabels { result });
        }
        for host in WELL_KNOWN_REGISTRIES {
            let _ = self.circuits_opened.get_or_create(&CircuitLabels {
                registry: (*host).to_owned(),
            });
        }
        self.build_info
            .get_or_create(&VersionLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
    }

    /// Health an operator alerts on: readiness, certificate expiry, the build.
    fn register_health(&self, registry: &mut Registry) {
        registry.register(
            "tolerable_ready",
            "1 when /readyz answers 200 (serving, and the node watch synced when enabled), else 0",
            self.ready.clone(),
        );
        registry.register(
            "tolerable_certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate served now, in seconds since the Unix epoch",
            self.certificate_expiry.clone(),
        );
        registry.register(
            "tolerable_registry_ca_expiry_timestamp_seconds",
            "Earliest notAfter of the certificates in registry_ca_path, in seconds since the Unix epoch; 0 when none is configured",
            self.registry_ca_expiry.clone(),
        );
        registry.register(
            "tolerable_build_info",
            "The running build: version label, value 1",
            self.build_info.clone(),
        );
    }

    /// Whether this replica leads the gate releasers (1) or not (0); registered only where the
    /// leader election runs, so `sum(tolerable_gate_leader) == 0` means "no leader", not "no gates".
    pub(crate) fn register_gate_leader(&self, registry: &mut Registry) {
        registry.register(
            "tolerable_gate_leader",
            "1 while this replica holds the gate releasers' Lease (it releases gated Pods), else 0; exactly one replica should say 1",
            self.gate_leader.clone(),
        );
    }

    /// The gauge the leader election keeps (see [`Metrics::register_gate_leader`]).
    pub(crate) fn gate_leader(&self) -> Gauge {
        self.gate_leader.clone()
    }

    /// The node watch's health; registered only when the node watch feeds decisions.
    pub(crate) fn register_node_watch(&self, registry: &mut Registry) {
        registry.register(
            "tolerable_node_watch_last_sync_timestamp_seconds",
            "Until when the node watch was known in sync with the API server (now while it is; when it failed, else), in seconds since the Unix epoch; 0 before the first full list",
            self.node_watch_synced.clone(),
        );
        registry.register(
            "tolerable_node_pool_builds",
            "Times the node pools were built from the watched Nodes: each full list and each coalesced change of a Node's architecture, OS or architecture taints (never a kubelet heartbeat)",
            self.node_pool_builds.clone(),
        );
        registry.register(
            "tolerable_node_watch_nodes",
            "Nodes in the node watch's view",
            self.node_watch_nodes.clone(),
        );
        registry.register(
            "tolerable_node_watch_events",
            "Node watch events (after the first list): changed=\"true\" when a Node was added or removed or its architecture, OS or architecture taints changed, \"false\" for everything else (kubelet heartbeats, images, conditions)",
            self.node_watch_events.clone(),
        );
        for changed in ["true", "false"] {
            let _ = self
                .node_watch_events
                .get_or_create(&ChangedLabels { changed });
        }
    }

    /// The namespace watch's metrics (registered only when it runs).
    pub(crate) fn register_namespace_watch(&self, registry: &mut Registry) {
        self.namespace_watch.register(registry);
    }

    /// The namespace watch's state, read at scrape time.
    pub(crate) fn set_namespace_watch(&self, state: &NamespaceWatchState) {
        self.namespace_watch.set(state);
    }

    /// What requests hold now: body bytes, and admissions being answered.
    pub(crate) fn set_request_load(&self, body_bytes: usize, in_flight: usize) {
        self.request_body_bytes
            .set(i64::try_from(body_bytes).unwrap_or(i64::MAX));
        self.requests_in_flight
            .set(i64::try_from(in_flight).unwrap_or(i64::MAX));
    }

    pub(crate) fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// The serving certificate's `notAfter` (seconds since the Unix epoch).
    pub(crate) fn set_certificate_expiry(&self, not_after: Option<i64>) {
        self.certificate_expiry
            .set(not_after.map_or(0.0, |t| t as f64));
    }

    /// The registry CA bundle's earliest `notAfter` (seconds since the Unix epoch).
    pub(crate) fn set_registry_ca_expiry(&self, not_after: Option<i64>) {
        self.registry_ca_expiry
            .set(not_after.map_or(0.0, |t| t as f64));
    }

    pub(crate) fn set_node_watch_synced(&self, at: Option<SystemTime>) {
        self.node_watch_synced.set(at.map_or(0.0, unix_seconds));
    }

    /// The node watch's build count and size, read at scrape time.
    pub(crate) fn set_node_watch_size(&self, builds: u64, nodes: u64, events: (u64, u64)) {
        for (changed, count) in [("true", events.0), ("false", events.1)] {
            let counter = self
                .node_watch_events
                .get_or_create(&ChangedLabels { changed });
            counter.inc_by(count.saturating_sub(counter.get()));
        }
        self.node_pool_builds
            .inc_by(builds.saturating_sub(self.node_pool_builds.get()));
        self.node_watch_nodes
            .set(i64::try_from(nodes).unwrap_or(i64::MAX));
    }

    /// What the admission shell decided, beyond its outcome (counted by the server with the
    /// time taken): a Pod denied, by why; under `enforce = false`, where nothing is denied,
    /// what would have been done.
    pub(crate) fn decided(&self, answer: &Answer) {
        if let Some(would_deny) = answer.not_enforced() {
            self.not_enforced(would_deny);
        } else if let Decision::Denied { why, .. } = &answer.decision {
            self.denied(*why);
        } else if let (Decision::Gated { .. }, false) = (&answer.decision, answer.patch.is_empty())
        {
            // Counted when the gate is added, not on a reinvocation that finds it there.
            self.gates.gated();
        }
    }

    /// A Pod denied (counted besides its `denied` outcome), by why.
    fn denied(&self, why: Untouched) {
        let reason = match why {
            Untouched::NoCommonArchitecture => DENIAL_REASONS[1],
            _ => DENIAL_REASONS[0],
        };
        self.denials.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// The server's connections and refused requests.
    fn register_connections(&self, registry: &mut Registry) {
        registry.register(
            "tolerable_open_connections",
            "Client connections open now",
            self.open_connections.clone(),
        );
        registry.register(
            "tolerable_connections_refused",
            "Connections closed as soon as accepted: max_connections (and the probes' headroom) reached",
            self.connections_refused.clone(),
        );
        registry.register(
            "tolerable_request_body_bytes",
            "Bytes of request bodies held now (inflated gzip bodies included), within a process-wide budget of 48 MiB",
            self.request_body_bytes.clone(),
        );
        registry.register(
            "tolerable_requests_in_flight",
            "POST /mutate requests being answered now (bodies read), at most max_requests_in_flight",
            self.requests_in_flight.clone(),
        );
        registry.register(
            "tolerable_connections_closed",
            "Connections the server closed, by reason: idle (connection_idle_timeout, or no request within request_read_timeout), reclaimed (at max_connections or max_connections_per_peer, its slot given to a new connection: one with no request answered yet, or an idle one for a request)",
            self.connections_closed.clone(),
        );
        registry.register(
            "tolerable_requests_refused",
            "Requests refused before being answered, by reason: requests_in_flight (503), body_memory (503: a body, or what an admission parses from it, past the body budgets), read_timeout (408), too_many_connections (503)",
            self.requests_refused.clone(),
        );
        registry.register(
            "tolerable_body_refusals",
            "Request bodies refused for memory (the body_memory refusals), by who was refused — peer_class serving (a connection that had an admission answered: the API server's) or other — and the budget that was spent: connection, peer (the peer address's share) or process (the budget and, for serving connections, its reserve)",
            self.body_refusals.clone(),
        );
        registry.register(
            "tolerable_body_evictions",
            "Request bodies cut off (503 body_memory, or 408 for an HTTP/2 stream left to drain) because they stalled, or came too slowly to be read by request_read_timeout, while a new body needed the memory they held; by the evicted request's peer_class: serving (a connection that had an admission answered) or other",
            self.body_evictions.clone(),
        );
    }

    /// Admissions, certificates and the node pools.
    fn register_admissions(&self, registry: &mut Registry) {
        registry.register(
            "tolerable_admissions",
            "AdmissionReviews answered, by outcome",
            self.admissions.clone(),
        );
        registry.register(
            "tolerable_admissions_not_enforced",
            "Pods let through unchanged but for the decision annotation (report only: enforce = false, or a Namespace's or Pod's tolerable.io/enforce=false), by what tolerable would have done: change (add tolerations or steering) or deny",
            self.not_enforced.clone(),
        );
        registry.register(
            "tolerable_admission_denials",
            "Pods denied, by reason: lookup_failed (on_lookup_failure = deny), no_common_architecture (on_no_common_architecture = deny)",
            self.denials.clone(),
        );
        registry.register(
            "tolerable_admission_duration_seconds",
            "Time to answer an AdmissionReview, body read to response",
            self.admission_duration.clone(),
        );
        registry.register(
            "tolerable_pull_secrets_forbidden",
            "Pods whose image pull secrets (or ServiceAccount) tolerable may not read (403: no RoleBinding in their namespace), by namespace (after 100 namespaces: other)",
            self.pull_secrets_forbidden.clone(),
        );
        registry.register(
            "tolerable_certificate_reloads",
            "Serving certificate reloads, by result",
            self.certificate_reloads.clone(),
        );
        registry.register(
            "tolerable_node_architecture_taints",
            "Architectures the node watch has seen, with how many distinct taints under the toleration templates' keys their nodes carry",
            self.architecture_taints.clone(),
        );
    }

    /// The architectures present in the cluster (bounded by what nodes exist).
    pub(crate) fn set_architectures(&self, pools: &crate::mutate::NodePools) {
        self.architecture_taints.clear();
        for (architecture, taints) in &pools.architectures {
            self.architecture_taints
                .get_or_create(&ArchitectureLabels {
                    architecture: architecture.clone(),
                })
                .set(i64::try_from(taints.len()).unwrap_or(i64::MAX));
        }
    }

    /// A request to `/mutate` that was no AdmissionReview (or whose body could not be read).
    pub(crate) fn bad_request(&self, elapsed: Duration) {
        self.admission(Outcome::BadRequest, elapsed);
    }

    pub(crate) fn admission(&self, outcome: Outcome, elapsed: Duration) {
        self.admissions
            .get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            })
            .inc();
        self.admission_duration.observe(elapsed.as_secs_f64());
    }

    /// A Pod in `namespace` whose pull secrets RBAC did not let tolerable read.
    pub(crate) fn pull_secrets_forbidden(&self, namespace: &str) {
        let mut named = self.namespaces_named.lock().expect("metrics lock poisoned");
        let namespace = if named.contains(namespace) || named.len() < MAX_NAMESPACE_LABELS {
            named.insert(namespace.to_owned());
            namespace.to_owned()
        } else {
            "other".to_owned()
        };
        drop(named);
        self.pull_secrets_forbidden
            .get_or_create(&NamespaceLabels { namespace })
            .inc();
    }

    /// Under `enforce = false`: a Pod tolerable would have denied (`true`) or changed.
    fn not_enforced(&self, would_deny: bool) {
        let would = if would_deny { "deny" } else { "change" };
        self.not_enforced
            .get_or_create(&WouldLabels { would })
            .inc();
    }

    pub(crate) fn observe_lookup(&self, elapsed: Duration, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.lookup_duration
            .get_or_create(&ResultLabels { result })
            .observe(elapsed.as_secs_f64());
    }

    pub(crate) fn certificate_reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.certificate_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Returns a guard that counts the connection as open until dropped.
    pub(crate) fn connection_opened(self: &std::sync::Arc<Self>) -> OpenConnection {
        self.open_connections.inc();
        OpenConnection(self.clone())
    }

    pub(crate) fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    /// `reason` is one of a fixed set (see the metric's help).
    pub(crate) fn connection_closed(&self, reason: &'static str) {
        self.connections_closed
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// A body refused for memory: `serving` whether its connection had an admission answered,
    /// `budget` which budget was spent (a fixed set).
    pub(crate) fn body_refused(&self, serving: bool, budget: &'static str) {
        let peer_class = if serving { "serving" } else { "other" };
        self.body_refusals
            .get_or_create(&BodyRefusalLabels { peer_class, budget })
            .inc();
    }

    /// A body read evicted for a newcomer: `serving` whether its connection had an admission
    /// answered.
    pub(crate) fn body_evicted(&self, serving: bool) {
        let peer_class = if serving { "serving" } else { "other" };
        self.body_evictions
            .get_or_create(&PeerClassLabels { peer_class })
            .inc();
    }

    /// `reason` is one of a fixed set (see the metric's help).
    pub(crate) fn request_refused(&self, reason: &'static str) {
        self.requests_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub(crate) fn set_cache_entries(&self, entries: u64) {
        self.cache_entries
            .set(i64::try_from(entries).unwrap_or(i64::MAX));
    }
}

/// An open connection, counted in `tolerable_open_connections` while it lives.
pub(crate) struct OpenConnection(std::sync::Arc<Metrics>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open_connections.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tolerable_gate_leader` (what the TolerableNoGateReleaser alert sums) is exposed only once
    /// registered, as a gauge following the election's value.
    #[test]
    fn the_gate_leader_gauge_is_exposed_where_it_is_registered() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        assert!(!exposition::encode(&registry).contains("tolerable_gate_leader"));
        metrics.register_gate_leader(&mut registry);
        let text = exposition::encode(&registry);
        assert!(
            text.contains("# TYPE tolerable_gate_leader gauge\n"),
            "{text}"
        );
        assert!(text.contains("\ntolerable_gate_leader 0\n"), "{text}");
        metrics.gate_leader().set(1);
        let text = exposition::encode(&registry);
        assert!(text.contains("\ntolerable_gate_leader 1\n"), "{text}");
    }
}
