//! What the scheduling gates report: Pods gated at admission, released by the gate controller
//! (by outcome, with how long they were held), left unrunnable, the oldest still gated (every
//! replica, read from its own watch at scrape time) and the configured `gate_timeout`.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::OutcomeLabels;

/// How a gated Pod was released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GateRelease {
    /// Its images learned, the decision applied.
    Decided,
    /// Its lookups did not answer within `gate_timeout`: released unchanged.
    TimedOut,
}

impl GateRelease {
    const ALL: [Self; 2] = [Self::Decided, Self::TimedOut];

    fn label(self) -> &'static str {
        match self {
            Self::Decided => "decided",
            Self::TimedOut => "timed_out",
        }
    }
}

pub(crate) struct GateMetrics {
    gated: Counter,
    releases: Family<OutcomeLabels, Counter>,
    held: Histogram,
    oldest_age: Gauge<f64, AtomicU64>,
    timeout: Gauge<f64, AtomicU64>,
    unrunnable: Counter,
}

impl GateMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            gated: Counter::default(),
            releases: Family::default(),
            // 0.5 s … ~4.5 h: from a release on the first retry to a day-long gate_timeout.
            held: Histogram::new(exponential_buckets(0.5, 2.0, 16)),
            oldest_age: Gauge::default(),
            timeout: Gauge::default(),
            unrunnable: Counter::default(),
        };
        for outcome in GateRelease::ALL {
            let _ = metrics.releases.get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            });
        }
        registry.register(
            "tolerable_gated_pods",
            "Pods gated at admission (on_lookup_failure = gate): their images could not all be looked up",
            metrics.gated.clone(),
        );
        registry.register(
            "tolerable_gate_releases",
            "Gated Pods released by the gate controller, by outcome: decided (images learned), timed_out (released unchanged after gate_timeout)",
            metrics.releases.clone(),
        );
        registry.register(
            "tolerable_gate_held_seconds",
            "How long a released Pod was gated: its creation to its release",
            metrics.held.clone(),
        );
        registry.register(
            "tolerable_gate_oldest_pod_age_seconds",
            "Age of the oldest Pod still labelled tolerable.io/gated=true (0: none)",
            metrics.oldest_age.clone(),
        );
        registry.register(
            "tolerable_gate_timeout_seconds",
            "[policy] gate_timeout: how long a gated Pod waits for its lookups before it is released unchanged",
            metrics.timeout.clone(),
        );
        registry.register(
            "tolerable_gate_unrunnable",
            "Gated Pods whose images, once known, share no architecture: they stay gated, labelled tolerable.io/gated=unrunnable",
            metrics.unrunnable.clone(),
        );
        metrics
    }

    /// A Pod gated at admission.
    pub(crate) fn gated(&self) {
        self.gated.inc();
    }

    /// A gated Pod released, `held` after its creation.
    pub(crate) fn released(&self, how: GateRelease, held: Duration) {
        self.releases
            .get_or_create(&OutcomeLabels {
                outcome: how.label(),
            })
            .inc();
        self.held.observe(held.as_secs_f64());
    }

    pub(crate) fn unrunnable(&self) {
        self.unrunnable.inc();
    }

    /// The oldest Pod labelled gated=true is this old (`None`: there is none).
    pub(crate) fn set_oldest_age(&self, age: Option<Duration>) {
        self.oldest_age
            .set(age.map_or(0.0, |age| age.as_secs_f64()));
    }

    pub(crate) fn set_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout.as_secs_f64());
    }
}
