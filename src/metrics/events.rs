//! What the Event recorder (`cluster::events`) and the crash watch (`crate::crashes`) report: Warning Events sent, and those never
//! written — dropped (its queue was full), limited (one per object per window), refused by the
//! API server (4xx: RBAC, validation) or failed (unreachable, 5xx, timed out).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::ResultLabels;

/// What became of one Warning Event handed to the recorder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventResult {
    Sent,
    /// The queue, or its namespace's share of it, was full: not written, so an admission
    /// never waits for the API server.
    Dropped,
    /// An Event on the same object was sent within the window.
    Limited,
    /// The API server said no (4xx).
    Refused,
    /// Not answered, or a 5xx.
    Failed,
}

impl EventResult {
    const ALL: [Self; 5] = [
        Self::Sent,
        Self::Dropped,
        Self::Limited,
        Self::Refused,
        Self::Failed,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Sent => "sent",
            Self::Dropped => "dropped",
            Self::Limited => "limited",
            Self::Refused => "refused",
            Self::Failed => "failed",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct CrashLabels {
    architecture: &'static str,
    verdict: &'static str,
}

#[derive(Default)]
pub(crate) struct EventMetrics {
    events: Family<ResultLabels, Counter>,
    crashes: Family<CrashLabels, Counter>,
    heals: Family<ResultLabels, Counter>,
}

impl EventMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        for result in EventResult::ALL {
            let _ = metrics.events.get_or_create(&ResultLabels {
                result: result.label(),
            });
        }
        for architecture in crate::mutate::arch::KUBERNETES_ARCHITECTURES
            .iter()
            .chain(&["other"])
        {
            for verdict in crate::mutate::crash::Verdict::LABELS {
                let _ = metrics.crashes.get_or_create(&CrashLabels {
                    architecture,
                    verdict,
                });
            }
        }
        registry.register(
            "tolerable_exec_format_crashes",
            "Containers the crash watch saw fail to start with a runtime's exec format error, by the node's architecture (a Kubernetes architecture name, else other) and verdict: wrong_architecture (confirmed: learn it), not_among_platforms (the node's architecture is not in the image's index), unconfirmed (not shown to be the architecture)",
            metrics.crashes.clone(),
        );
        for result in crate::mutate::heal::LABELS {
            let _ = metrics.heals.get_or_create(&ResultLabels { result });
        }
        registry.register(
            "tolerable_crash_heals",
            "Pods of wrong-architecture crashes the crash watch deleted for their controllers to recreate elsewhere ([crashes] heal), or did not, by result: deleted, held (no controller that recreates it elsewhere, local data, or the decision would not move it), limited (once per Pod, one per controller per 10 minutes, 20 in all per 10 minutes), gone (replaced or gone before the delete), failed",
            metrics.heals.clone(),
        );
        registry.register(
            "tolerable_events",
            "Warning Events tolerable wrote or would have written, by result: sent, dropped (the recorder's queue was full), limited (one per object per window), refused (the API server answered 4xx), failed (no answer, or 5xx)",
            metrics.events.clone(),
        );
        metrics
    }

    /// One exec-format crash on a node of `architecture`, with its verdict's label.
    pub(crate) fn crashed(&self, architecture: &str, verdict: &'static str) {
        let architecture = crate::mutate::arch::KUBERNETES_ARCHITECTURES
            .iter()
            .find(|a| **a == architecture)
            .copied()
            .unwrap_or("other");
        self.crashes
            .get_or_create(&CrashLabels {
                architecture,
                verdict,
            })
            .inc();
    }

    /// One heal's result ([`crate::mutate::heal::LABELS`]).
    pub(crate) fn healed(&self, result: &'static str) {
        self.heals.get_or_create(&ResultLabels { result }).inc();
    }

    pub(crate) fn count(&self, result: EventResult) {
        self.events
            .get_or_create(&ResultLabels {
                result: result.label(),
            })
            .inc();
    }
}
