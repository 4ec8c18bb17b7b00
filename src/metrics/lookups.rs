//! What image lookups report: registry requests (their hosts' labels capped), the caches,
//! revalidations, circuit breakers, rate limits and credential plugin runs.

use std::time::Duration;

use prometheus_client::registry::Registry;

use crate::registry::{RateLimit, RegistryObserver, RequestMethod, Revalidation};

use super::{
    CircuitLabels, Metrics, PluginLabels, PluginRunLabels, RegistryLabels, RegistryWaitLabels,
    ResultLabels, MAX_REGISTRY_LABELS, PLUGIN_RESULTS,
};

/// API hosts of public registries that always have their own label.
pub(super) const WELL_KNOWN_REGISTRIES: &[&str] = &[
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

impl Metrics {
    /// The shared cache (`cache_url`).
    pub(super) fn register_shared_cache(&self, registry: &mut Registry) {
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

    /// Image lookups, registries, the cache and the circuit breakers.
    pub(super) fn register_lookups(&self, registry: &mut Registry) {
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
            "Bytes of registry answers the lookups hold while they arrive (a process-wide budget of 32 MiB, at most 12 MiB per registry host and per namespace, 5 MiB per lookup)",
            self.registry_bytes.clone(),
        );
        registry.register(
            "tolerable_registry_bytes_waits",
            "Registry answers that waited for room in the registry bytes in flight (the budget, their registry's or their namespace's share spent), by registry host and result: room (it came) or deadline (the lookup ended first, busy)",
            self.registry_bytes_waits.clone(),
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

    fn registry_bytes_wait(&self, host: &str, result: &'static str) {
        let labels = RegistryWaitLabels {
            registry: self.registry_label(host, false),
            result,
        };
        self.registry_bytes_waits.get_or_create(&labels).inc();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::encode;

    const GET: RequestMethod = RequestMethod::Get;

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
