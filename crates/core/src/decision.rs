//! What the core answers: a [`Decision`] (one of three kinds, so a denial cannot carry changes)
//! and the [`Outcome`] label metrics, logs and `tolerable review`'s exit status all use.

use k8s_openapi::api::core::v1::Toleration;

use super::WeightedArchitecture;

/// What to do with the Pod. Changes are described, not yet encoded; [`super::patch`] turns them
/// into a JSON Patch against the same Pod.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// The Pod is left exactly as it came (no patch at all).
    Unchanged {
        why: Untouched,
        /// One line: what was decided and why.
        summary: String,
        warnings: Vec<String>,
    },
    /// The Pod is rejected with `message`.
    Denied {
        /// What would have left it unchanged had the policy not said deny.
        why: Untouched,
        message: String,
        summary: String,
        warnings: Vec<String>,
    },
    /// The Pod gets what it lacks of `placement` (possibly nothing, on reinvocation).
    Placed(Placement),
    /// `on_lookup_failure = "gate"`: the Pod is held behind tolerable's scheduling gate until
    /// its images are known; nothing else is decided now.
    Gated {
        /// Each image waited for, with why it is unknown (`image: reason`).
        waiting: Vec<String>,
        summary: String,
        warnings: Vec<String>,
    },
}

/// Why a Pod is left unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Untouched {
    /// Not a Pod being created (an update, a subresource, another kind).
    NotPodCreate,
    /// The object cannot be read as a Pod tolerable can decide on.
    InvalidObject,
    /// Opted out, or in a skipped namespace.
    Skipped,
    /// Some image's platforms are unknown (or the Pod is over the lookup limits).
    LookupFailed,
    /// No architecture is common to all images.
    NoCommonArchitecture,
}

/// The changes a Pod gets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    pub tolerations: Vec<Toleration>,
    /// Pin `kubernetes.io/arch` in the nodeSelector.
    pub node_selector: Option<String>,
    /// AND `kubernetes.io/arch In (…)` into every required nodeSelectorTerm.
    pub required_architectures: Option<Vec<String>>,
    /// `match_node_labels`: `key=value` set in the nodeSelector.
    pub node_selector_labels: Vec<(String, String)>,
    /// `match_node_labels`: `key In [value]` ANDed into every required nodeSelectorTerm that
    /// does not constrain `key` yet (or the term created).
    pub required_labels: Vec<(String, String)>,
    /// Add a preferred term for each of these architectures.
    pub preferred_architectures: Vec<WeightedArchitecture>,
    /// `pin_digests`: images by tag rewritten to the digest decided on.
    pub pins: Vec<super::pin::Pin>,
    /// New value of the decision annotation, when it differs from the Pod's.
    pub annotation: Option<String>,
    pub warnings: Vec<String>,
    pub summary: String,
}

impl Placement {
    /// Whether the placement changes the Pod.
    #[cfg(test)]
    pub fn changes_pod(&self) -> bool {
        !self.tolerations.is_empty()
            || self.node_selector.is_some()
            || self.required_architectures.is_some()
            || !self.node_selector_labels.is_empty()
            || !self.required_labels.is_empty()
            || !self.preferred_architectures.is_empty()
            || !self.pins.is_empty()
            || self.annotation.is_some()
    }
}

/// How a request is answered: the one bounded label set of metrics, logs and
/// `tolerable review`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The body is not an AdmissionReview (answered HTTP 400 by the server, never decided).
    BadRequest,
    NotPodCreate,
    InvalidObject,
    Skipped,
    LookupFailed,
    NoCommonArchitecture,
    /// Changes made (or already in place from an earlier invocation).
    Decided,
    Denied,
    /// Held behind tolerable's scheduling gate until its images are known.
    Gated,
}

impl Outcome {
    /// Every outcome, for metrics that show each one from the start.
    pub const ALL: [Self; 9] = [
        Self::BadRequest,
        Self::NotPodCreate,
        Self::InvalidObject,
        Self::Skipped,
        Self::LookupFailed,
        Self::NoCommonArchitecture,
        Self::Decided,
        Self::Denied,
        Self::Gated,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::BadRequest => "bad_request",
            Self::NotPodCreate => "not_pod_create",
            Self::InvalidObject => "invalid_object",
            Self::Skipped => "skipped",
            Self::LookupFailed => "lookup_failed",
            Self::NoCommonArchitecture => "no_common_architecture",
            Self::Decided => "decided",
            Self::Denied => "denied",
            Self::Gated => "gated",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

impl Decision {
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Unchanged { why, .. } => match why {
                Untouched::NotPodCreate => Outcome::NotPodCreate,
                Untouched::InvalidObject => Outcome::InvalidObject,
                Untouched::Skipped => Outcome::Skipped,
                Untouched::LookupFailed => Outcome::LookupFailed,
                Untouched::NoCommonArchitecture => Outcome::NoCommonArchitecture,
            },
            Self::Denied { .. } => Outcome::Denied,
            Self::Placed(_) => Outcome::Decided,
            Self::Gated { .. } => Outcome::Gated,
        }
    }

    pub fn summary(&self) -> &str {
        match self {
            Self::Unchanged { summary, .. }
            | Self::Denied { summary, .. }
            | Self::Gated { summary, .. } => summary,
            Self::Placed(placement) => &placement.summary,
        }
    }

    pub fn warnings(&self) -> &[String] {
        match self {
            Self::Unchanged { warnings, .. }
            | Self::Denied { warnings, .. }
            | Self::Gated { warnings, .. } => warnings,
            Self::Placed(placement) => &placement.warnings,
        }
    }

    pub(super) fn warnings_mut(&mut self) -> &mut Vec<String> {
        match self {
            Self::Unchanged { warnings, .. }
            | Self::Denied { warnings, .. }
            | Self::Gated { warnings, .. } => warnings,
            Self::Placed(placement) => &mut placement.warnings,
        }
    }

    /// The message a denied Pod is rejected with.
    pub fn denial(&self) -> Option<&str> {
        match self {
            Self::Denied { message, .. } => Some(message),
            _ => None,
        }
    }

    /// The changes, when the Pod is placed.
    #[cfg(test)]
    pub fn placement(&self) -> Option<&Placement> {
        match self {
            Self::Placed(placement) => Some(placement),
            _ => None,
        }
    }

    /// Whether the decision changes the Pod.
    #[cfg(test)]
    pub fn changes_pod(&self) -> bool {
        self.placement().is_some_and(Placement::changes_pod)
    }
}
