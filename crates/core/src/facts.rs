//! What the decision knows of each image: the core's own input types. The registry layer
//! produces them; nothing here knows how (no HTTP, no manifests, no cache).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::platform::Platform;

/// What is known of one image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageFact {
    /// Sorted, without duplicates; empty only for an artifact.
    pub platforms: Vec<Platform>,
    /// Set for an OCI artifact that is not a container image (a Helm chart, model weights in an
    /// image volume): its config's media type. It names no platform and runs anywhere.
    pub artifact: Option<String>,
    /// Which credential opened the image.
    pub credentials: Provenance,
    /// Set when this is the last known answer, used because the registry is unavailable.
    pub stale: Option<Staleness>,
    /// The digest of the manifest or index the platforms were read from (`sha256:…`): what a
    /// pinned image names. `None`: not known.
    pub digest: Option<String>,
}

/// Where the credential that opened an image came from — never the credential itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Provenance {
    Anonymous,
    /// A pull secret, a credential file, the Docker config: named as `secret apps/regcred`, ….
    Credential(Arc<str>),
}

impl fmt::Display for Provenance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Anonymous => f.write_str("anonymous"),
            Self::Credential(source) => f.write_str(source),
        }
    }
}

/// A last known answer standing in while its registry is unavailable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Staleness {
    /// Why the registry could not be asked (a reason safe to show).
    pub cause: String,
    /// How long ago the registry gave the answer.
    pub age: Duration,
}

impl fmt::Display for Staleness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "registry unavailable ({}); used the platforms it reported {} ago",
            self.cause,
            short_age(self.age)
        )
    }
}

/// Why an image's platforms are unknown, by kind, each with a reason that is safe to show (no
/// credentials, no remote body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LookupFailure {
    /// The image reference cannot be parsed.
    InvalidReference(String),
    /// The registry says the image (or tag) does not exist.
    NotFound(String),
    /// No credential tolerable has opens the image.
    Unauthorized(String),
    /// Not a container image, no platform, or a manifest tolerable cannot read.
    NotAnImage(String),
    /// The access rules forbid asking that registry.
    NotAllowed(String),
    /// The image is more than one lookup may cost (tolerable's bounds per image): the image's
    /// own doing, not its registry's.
    OverLimit(String),
    /// The registry could not be asked in time: unreachable, erroring, rate limiting, its circuit
    /// open, or the admission's budget spent.
    Unavailable(String),
}

impl LookupFailure {
    pub fn reason(&self) -> &str {
        match self {
            Self::InvalidReference(reason)
            | Self::NotFound(reason)
            | Self::Unauthorized(reason)
            | Self::NotAnImage(reason)
            | Self::NotAllowed(reason)
            | Self::OverLimit(reason)
            | Self::Unavailable(reason) => reason,
        }
    }
}

impl fmt::Display for LookupFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

/// What the registries said, per image as the Pod spec writes it.
pub type ImageFacts = BTreeMap<String, Result<Arc<ImageFact>, LookupFailure>>;

/// `1h2m3s`, `4m0s`, `12s`: short enough for a warning.
pub fn short_age(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}
