//! Prometheus metrics. `serve` owns the registry; components get an `Arc<Metrics>`. Every label
//! value comes from a bounded set (registry hosts are capped, see [`MAX_REGISTRY_LABELS`]).

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

use crate::mutate::{Outcome, Untouched};
use crate::registry::{RateLimit, RegistryObserver, RequestMethod, Revalidation};

/// Distinct registry hosts given their own label value besides the operator's own (mirrors,
/// credential files, insecure registries) and the well-known public ones; the rest count as
/// `other`, so Pods naming random registries cannot blow up the metric's cardinality. A host
/// earns a slot only by answering a request successfully, so made-up hosts cannot use the slots
/// up and hide the real registries under `other`.
pub(crate) const MAX_REGISTRY_LABELS: usize = 50;

/// Namespaces given their own label value in `tolerable_pull_secrets_forbidden_total`; the rest
/// count as `other`.
pub(crate) const MAX_NAMESPACE_LABELS: usize = 100;

/// API hosts of public registries that always have their own label.
const WELL_KNOWN_REGISTRIES: &[&str] = &[
    "registry-1.docker.io",
    "ghcr.io",
    "quay.io",
    "gcr.io",
    "registry.k8s.io",
    "public.ecr.aws",
    "mcr.microsoft.com",
    "docker.elastic.co",
    "nvcr.io",
];

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
    registries_named: Mutex<HashSet<String>>,
    registries_reserved: Mutex<HashSet<String>>,
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
            registries_named: Mutex::default(),
            registries_reserved: Mutex::default(),
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

    /// A Pod denied (counted besides its `denied` outcome), by why.
    pub(crate) fn denied(&self, why: Untouched) {
        let reason = match why {
            Untouched::NoCommonArchitecture => DENIAL_REASONS[1],
            _ => DENIAL_REASONS[0],
        };
        self.denials.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// The shared cache (`cache_url`).
    fn register_shared_cache(&self, registry: &mut Registry) {
        registry.register(
            "tolerable_shared_cache_lookups",
            "In-memory cache misses asked of the shared cache, by result: hit, miss, error (failed or too slow), skipped (it failed under a second ago)",
            self.shared_cache_lookups.clone(),
        );
        registry.register(
            "tolerable_shared_cache_writes",
            "Registry answers written to the shared cache, by result: ok, error, skipped",
            self.shared_cache_writes.clone(),
        );
        registry.register(
            "tolerable_shared_cache_up",
            "1 when the shared cache answered the last request, 0 when it failed (or none was made)",
            self.shared_cache_up.clone(),
        );
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
            "Pods let through unchanged but for the decision annotation (enforce = false), by what tolerable would have done: change (add tolerations or steering) or deny",
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

    /// Image lookups, registries, the cache and the circuit breakers.
    fn register_lookups(&self, registry: &mut Registry) {
        registry.register(
            "tolerable_image_lookup_duration_seconds",
            "Time to learn an image's platforms (cache hits included), by result",
            self.lookup_duration.clone(),
        );
        registry.register(
            "tolerable_registry_requests",
            "HTTP requests to registries and token services, by registry host, method (GET, HEAD) and status",
            self.registry_requests.clone(),
        );
        registry.register(
            "tolerable_cache_lookups",
            "Image lookups answered from the cache (hit) or the registry (miss); stale: a last known answer served while the registry is unavailable",
            self.cache_lookups.clone(),
        );
        registry.register(
            "tolerable_cache_entries",
            "Answers in the lookup cache (a tag's answer counts twice: by tag and by digest)",
            self.cache_entries.clone(),
        );
        registry.register(
            "tolerable_registry_bytes_in_flight",
            "Bytes of registry answers the lookups hold while they arrive (a process-wide budget of 32 MiB, at most 5 MiB per lookup)",
            self.registry_bytes.clone(),
        );
        registry.register(
            "tolerable_registry_circuit_opened",
            "Times the circuit breaker stopped asking a registry (repeated failures or Retry-After)",
            self.circuits_opened.clone(),
        );
        registry.register(
            "tolerable_registry_rate_limit",
            "Requests per window the registry allows this client, as its last answer said (Docker Hub's ratelimit-limit)",
            self.rate_limit.clone(),
        );
        registry.register(
            "tolerable_registry_rate_limit_remaining",
            "Requests left in the registry's window, as its last answer said (Docker Hub's ratelimit-remaining)",
            self.rate_limit_remaining.clone(),
        );
        registry.register(
            "tolerable_registry_revalidations",
            "Tags no longer fresh revalidated with a HEAD, by result: unchanged and known_digest saved a manifest GET; changed (a new digest) and no_digest (the registry named none) did not",
            self.revalidations.clone(),
        );
        registry.register(
            "tolerable_credential_plugin_runs",
            "Credential plugin runs (kubelet credential providers, Docker credential helpers), by provider and result: ok, failed (non-zero exit), invalid_response, timeout (killed), not_started, none (a helper without a credential)",
            self.plugin_runs.clone(),
        );
        registry.register(
            "tolerable_credential_plugin_duration_seconds",
            "Time a credential plugin ran, by provider",
            self.plugin_duration.clone(),
        );
    }

    /// Gives the configured credential plugins their series from the start.
    pub(crate) fn name_credential_plugins<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        let mut named = self.plugins_named.lock().expect("metrics lock poisoned");
        for name in names {
            for result in PLUGIN_RESULTS {
                let _ = self.plugin_runs.get_or_create(&PluginRunLabels {
                    provider: name.to_owned(),
                    result,
                });
            }
            let _ = self.plugin_duration.get_or_create(&PluginLabels {
                provider: name.to_owned(),
            });
            named.insert(name.to_owned());
        }
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
    pub(crate) fn not_enforced(&self, would_deny: bool) {
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

    /// Gives the operator's registries (`host` or `host:port`, as configured) labels of their
    /// own, outside the capped slots, and their circuit breaker series from the start.
    pub(crate) fn name_registries<'a>(&self, hosts: impl IntoIterator<Item = &'a str>) {
        let mut reserved = self
            .registries_reserved
            .lock()
            .expect("metrics lock poisoned");
        for host in hosts {
            let host = host.to_ascii_lowercase();
            let _ = self.circuits_opened.get_or_create(&CircuitLabels {
                registry: host.clone(),
            });
            reserved.insert(host);
        }
    }

    /// The label for `host`; `answered` when it just answered a request successfully (which
    /// earns a free slot).
    fn registry_label(&self, host: &str, answered: bool) -> String {
        let host = host.to_ascii_lowercase();
        if WELL_KNOWN_REGISTRIES.contains(&host.as_str())
            || self
                .registries_reserved
                .lock()
                .expect("metrics lock poisoned")
                .contains(&host)
        {
            return host;
        }
        let mut named = self.registries_named.lock().expect("metrics lock poisoned");
        if named.contains(&host) {
            return host;
        }
        if answered && named.len() < MAX_REGISTRY_LABELS {
            named.insert(host.clone());
            return host;
        }
        "other".to_owned()
    }
}

/// An open connection, counted in `tolerable_open_connections` while it lives.
pub(crate) struct OpenConnection(std::sync::Arc<Metrics>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open_connections.dec();
    }
}

impl RegistryObserver for Metrics {
    fn registry_request(&self, host: &str, method: RequestMethod, status: Option<u16>) {
        let labels = RegistryLabels {
            registry: self.registry_label(host, status.is_some_and(|s| (200..300).contains(&s))),
            method: method.label(),
            status: status.map_or_else(|| "error".to_owned(), |s| s.to_string()),
        };
        self.registry_requests.get_or_create(&labels).inc();
    }

    fn rate_limit(&self, host: &str, limit: RateLimit) {
        let labels = CircuitLabels {
            registry: self.registry_label(host, false),
        };
        let gauges = [
            (&self.rate_limit, limit.limit),
            (&self.rate_limit_remaining, limit.remaining),
        ];
        for (gauge, value) in gauges {
            if let Some(value) = value {
                gauge
                    .get_or_create(&labels)
                    .set(i64::try_from(value).unwrap_or(i64::MAX));
            }
        }
    }

    fn cache_lookup(&self, hit: bool) {
        let result = if hit { "hit" } else { "miss" };
        self.cache_lookups
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    fn circuit_opened(&self, host: &str) {
        self.circuits_opened
            .get_or_create(&CircuitLabels {
                registry: self.registry_label(host, false),
            })
            .inc();
    }

    fn revalidated(&self, outcome: Revalidation) {
        self.revalidations
            .get_or_create(&ResultLabels {
                result: outcome.label(),
            })
            .inc();
    }

    fn shared_cache_lookup(&self, result: &'static str) {
        self.shared_cache_lookups
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    fn shared_cache_write(&self, result: &'static str) {
        self.shared_cache_writes
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    fn shared_cache_up(&self, up: bool) {
        self.shared_cache_up.set(i64::from(up));
    }

    fn registry_bytes(&self, change: i64) {
        self.registry_bytes.inc_by(change);
    }

    fn stale_answer(&self) {
        self.cache_lookups
            .get_or_create(&ResultLabels { result: "stale" })
            .inc();
    }

    fn credential_plugin_run(&self, plugin: &str, result: &'static str, elapsed: Duration) {
        let named = self.plugins_named.lock().expect("metrics lock poisoned");
        let provider = if named.contains(plugin) {
            plugin.to_owned()
        } else {
            "other".to_owned()
        };
        drop(named);
        self.plugin_runs
            .get_or_create(&PluginRunLabels {
                provider: provider.clone(),
                result,
            })
            .inc();
        self.plugin_duration
            .get_or_create(&PluginLabels { provider })
            .observe(elapsed.as_secs_f64());
    }
}

/// The text exposition of `registry` (OpenMetrics).
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}

/// The exposition of `registry` in the Prometheus text format (0.0.4), for scrapers that do not
/// ask for OpenMetrics: the same samples, with a counter's HELP and TYPE under its `_total`
/// sample name (OpenMetrics names the family without it), no `# UNIT` and no `# EOF`.
pub(crate) fn encode_text_format(registry: &Registry) -> String {
    let open_metrics = encode(registry);
    let mut out = String::with_capacity(open_metrics.len());
    let mut lines = open_metrics.lines().peekable();
    while let Some(line) = lines.next() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default();
            if lines.peek() == Some(&format!("# TYPE {name} counter").as_str()) {
                out.push_str(&format!("# HELP {name}_total{}\n", &rest[name.len()..]));
                continue;
            }
        } else if let Some(name) = line
            .strip_prefix("# TYPE ")
            .and_then(|rest| rest.strip_suffix(" counter"))
        {
            out.push_str(&format!("# TYPE {name}_total counter\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GET: RequestMethod = RequestMethod::Get;

    #[test]
    fn the_text_format_declares_every_sample_under_its_own_name() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.denied(Untouched::NoCommonArchitecture);
        let text = encode_text_format(&registry);
        for expected in [
            "# HELP tolerable_admission_denials_total Pods denied, by reason",
            "# TYPE tolerable_admission_denials_total counter\n",
            "tolerable_admission_denials_total{reason=\"no_common_architecture\"} 1\n",
            "tolerable_admission_denials_total{reason=\"lookup_failed\"} 0\n",
            "# TYPE tolerable_admission_duration_seconds histogram\n",
            "tolerable_build_info{version=\"",
        ] {
            assert!(text.contains(expected), "{expected}:\n{text}");
        }
        assert!(!text.contains("# EOF"), "{text}");
        for sample in text.lines().filter(|l| !l.starts_with('#')) {
            let name = sample.split(['{', ' ']).next().unwrap();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    let family = name.strip_suffix(suffix)?;
                    text.contains(&format!("# TYPE {family} histogram\n"))
                        .then_some(family)
                })
                .unwrap_or(name);
            assert!(
                text.contains(&format!("# TYPE {family} ")),
                "{sample} has no TYPE line:\n{text}"
            );
            assert!(
                text.contains(&format!("# HELP {family} ")),
                "{sample} has no HELP line"
            );
        }
    }

    #[test]
    fn made_up_registries_cannot_take_the_label_slots() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.name_registries(["Mirror.Example.com:5000"]);
        // A flood of references to hosts that do not exist or do not answer 2xx.
        for i in 0..500 {
            metrics.registry_request(&format!("10.0.0.{i}:5000"), GET, None);
            metrics.registry_request(&format!("evil{i}.example"), GET, Some(404));
        }
        // Real registries answering afterwards still get labels of their own.
        metrics.registry_request("registry.example.org", GET, Some(200));
        metrics.registry_request("mirror.example.com:5000", GET, Some(500));
        metrics.registry_request("ghcr.io", RequestMethod::Head, Some(401));
        let text = encode(&registry);
        for host in ["registry.example.org", "mirror.example.com:5000", "ghcr.io"] {
            assert!(
                text.contains(&format!("registry=\"{host}\"")),
                "{host}:\n{text}"
            );
        }
        assert!(!text.contains("evil1.example"), "{text}");
        assert!(text.contains("registry=\"other\""));
        let named = metrics.registries_named.lock().unwrap().len();
        assert_eq!(named, 1, "only the registry that answered 2xx took a slot");
        assert!(
            text.contains(r#"tolerable_registry_requests_total{registry="ghcr.io",method="HEAD",status="401"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn rate_limits_are_gauges_per_registry() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::register(&mut registry);
        let hub = "registry-1.docker.io";
        for remaining in [76, 75] {
            metrics.rate_limit(
                hub,
                RateLimit {
                    limit: Some(100),
                    remaining: Some(remaining),
                },
            );
        }
        // A later answer naming only what is left keeps the limit.
        metrics.rate_limit(
            hub,
            RateLimit {
                limit: None,
                remaining: Some(74),
            },
        );
        let text = encode(&registry);
        assert!(
            text.contains(&format!(
                "tolerable_registry_rate_limit{{registry=\"{hub}\"}} 100"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "tolerable_registry_rate_limit_remaining{{registry=\"{hub}\"}} 74"
            )),
            "{text}"
        );
    }
}
