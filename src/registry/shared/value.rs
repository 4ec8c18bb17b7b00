//! The values kept in the shared cache, as JSON: an answer by digest, and an authoritative
//! failure. What is read back is checked as strictly as a registry's answer (another process
//! wrote it; so could anyone who reaches the cache): a bad value is a miss.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::MAX_VALUE_BYTES;
use crate::registry::manifest::known_media_type;
use crate::registry::{
    ImageFact, ImagePlatforms, LookupError, Platform, Provenance, MAX_PLATFORMS,
};

/// An image's answer by digest as the shared cache keeps it (JSON).
#[derive(Serialize, Deserialize)]
struct SharedAnswer {
    digest: String,
    media_type: String,
    served_by: String,
    platforms: Vec<SharedPlatform>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    artifact: Option<String>,
    /// Where the credential that opened the image came from (`secret apps/regcred`, a file
    /// path); none for anonymous access. Never the credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    credentials: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct SharedPlatform {
    os: String,
    architecture: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    variant: Option<String>,
}

/// A failure worth sharing: the registry's own answer, which every replica would get too.
/// Outages are not shared (each replica's circuit breaker and stale answers handle them).
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "failure", rename_all = "snake_case")]
pub(crate) enum SharedFailure {
    NotFound,
    Unauthorized { tried: String },
    NotAnImage { media_type: String },
    Malformed { reason: String },
    NoPlatforms,
}

impl SharedFailure {
    pub(crate) fn of(error: &LookupError) -> Option<Self> {
        Some(match error {
            LookupError::NotFound { .. } => Self::NotFound,
            LookupError::Unauthorized { tried, .. } => Self::Unauthorized {
                tried: tried.clone(),
            },
            LookupError::NotAnImage { media_type, .. } => Self::NotAnImage {
                media_type: media_type.clone(),
            },
            LookupError::Malformed { reason, .. } => Self::Malformed {
                reason: reason.clone(),
            },
            LookupError::NoPlatforms { .. } => Self::NoPlatforms,
            _ => return None,
        })
    }

    fn into_error(self, reference: &str) -> LookupError {
        let reference = reference.to_owned();
        match self {
            Self::NotFound => LookupError::NotFound { reference },
            Self::Unauthorized { tried } => LookupError::Unauthorized { reference, tried },
            Self::NotAnImage { media_type } => LookupError::NotAnImage {
                reference,
                media_type,
            },
            Self::Malformed { reason } => LookupError::Malformed { reference, reason },
            Self::NoPlatforms => LookupError::NoPlatforms { reference },
        }
    }
}

pub(super) fn encode_answer(found: &ImagePlatforms) -> Vec<u8> {
    let answer = SharedAnswer {
        digest: found.digest.clone(),
        media_type: found.media_type.to_owned(),
        served_by: found.served_by.clone(),
        platforms: found
            .fact
            .platforms
            .iter()
            .map(|p| SharedPlatform {
                os: p.os.to_string(),
                architecture: p.architecture.to_string(),
                variant: p.variant.as_deref().map(str::to_owned),
            })
            .collect(),
        artifact: found.fact.artifact.clone(),
        credentials: match &found.fact.credentials {
            Provenance::Anonymous => None,
            Provenance::Credential(source) => Some(source.to_string()),
        },
    };
    serde_json::to_vec(&answer).expect("an answer serializes")
}

/// The answer `value` holds, if it is a well-formed one.
pub(super) fn answer(value: &[u8]) -> Option<ImagePlatforms> {
    if value.len() > MAX_VALUE_BYTES {
        return None;
    }
    let answer: SharedAnswer = serde_json::from_slice(value).ok()?;
    let media_type = known_media_type(&answer.media_type);
    let usable = crate::registry::client::is_digest(&answer.digest)
        && media_type == answer.media_type
        && answer.platforms.len() <= MAX_PLATFORMS
        && (answer.platforms.is_empty() == answer.artifact.is_some());
    if !usable {
        return None;
    }
    let mut platforms: Vec<Platform> = answer
        .platforms
        .iter()
        .map(|p| Platform::normalized(&p.os, &p.architecture, p.variant.as_deref()))
        .collect();
    // What another replica (or anything that can write the cache) says goes through the same
    // check as what a registry says: a name no node label can hold never reaches a patch.
    if !platforms.iter().all(Platform::is_label_safe) {
        return None;
    }
    platforms.sort();
    platforms.dedup();
    Some(ImagePlatforms {
        digest: answer.digest.clone(),
        media_type,
        served_by: answer.served_by,
        fact: Arc::new(ImageFact {
            platforms,
            artifact: answer.artifact,
            credentials: answer
                .credentials
                .map_or(Provenance::Anonymous, |c| Provenance::Credential(c.into())),
            stale: None,
            digest: Some(answer.digest),
        }),
    })
}

pub(super) fn encode_failure(failure: &SharedFailure) -> Vec<u8> {
    serde_json::to_vec(failure).expect("a failure serializes")
}

/// The failure `value` holds for `reference`, if it is a well-formed one.
pub(super) fn failure(value: &[u8], reference: &str) -> Option<LookupError> {
    if value.len() > MAX_VALUE_BYTES {
        return None;
    }
    let failure: SharedFailure = serde_json::from_slice(value).ok()?;
    Some(failure.into_error(reference))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::manifest::OCI_INDEX;

    fn found(credentials: Provenance) -> ImagePlatforms {
        ImagePlatforms {
            digest: format!("sha256:{}", "a".repeat(64)),
            media_type: OCI_INDEX,
            served_by: "registry.example".into(),
            fact: Arc::new(ImageFact {
                platforms: vec![
                    Platform::normalized("linux", "amd64", None),
                    Platform::normalized("linux", "arm", Some("v7")),
                ],
                artifact: None,
                credentials,
                stale: None,
                digest: Some(format!("sha256:{}", "a".repeat(64))),
            }),
        }
    }

    #[test]
    fn an_answer_naming_a_platform_no_node_label_can_hold_is_not_used() {
        let mut written: serde_json::Value =
            serde_json::from_slice(&encode_answer(&found(Provenance::Anonymous))).unwrap();
        written["platforms"][0]["architecture"] = "amd64 x".into();
        assert_eq!(answer(written.to_string().as_bytes()), None);
        written["platforms"][0]["architecture"] = "a".repeat(64).into();
        assert_eq!(answer(written.to_string().as_bytes()), None);
        written["platforms"][0]["architecture"] = "riscv64".into();
        assert!(answer(written.to_string().as_bytes()).is_some());
    }

    #[test]
    fn answers_read_back_as_written() {
        for credentials in [
            Provenance::Anonymous,
            Provenance::Credential("secret apps/regcred".into()),
        ] {
            let original = found(credentials);
            let encoded = encode_answer(&original);
            assert_eq!(answer(&encoded), Some(original));
        }
    }

    #[test]
    fn values_that_are_not_ours_are_misses() {
        let good: serde_json::Value =
            serde_json::from_slice(&encode_answer(&found(Provenance::Anonymous))).unwrap();
        let mut bad = Vec::new();
        for (field, value) in [
            ("digest", serde_json::json!("sha256:short")),
            ("media_type", serde_json::json!("text/html")),
            ("platforms", serde_json::json!([])),
        ] {
            let mut changed = good.clone();
            changed[field] = value;
            bad.push(serde_json::to_vec(&changed).unwrap());
        }
        bad.push(b"not json".to_vec());
        bad.push(vec![b' '; MAX_VALUE_BYTES + 1]);
        for value in bad {
            assert_eq!(answer(&value), None, "{}", String::from_utf8_lossy(&value));
        }
    }

    #[test]
    fn only_the_registrys_own_answers_are_shared_failures() {
        let reference = "registry.example/app:1";
        let not_found = LookupError::NotFound {
            reference: reference.into(),
        };
        let shared = SharedFailure::of(&not_found).unwrap();
        assert_eq!(
            failure(&encode_failure(&shared), reference),
            Some(not_found)
        );
        let unauthorized = LookupError::Unauthorized {
            reference: reference.into(),
            tried: "secret apps/regcred, anonymous".into(),
        };
        let shared = SharedFailure::of(&unauthorized).unwrap();
        assert_eq!(
            failure(&encode_failure(&shared), reference),
            Some(unauthorized)
        );
        let outage = LookupError::Unreachable {
            reference: reference.into(),
            registry: "registry.example".into(),
            reason: "connection failed".into(),
            cause: String::new(),
        };
        assert_eq!(SharedFailure::of(&outage), None);
        assert_eq!(failure(b"{\"failure\":\"on_fire\"}", reference), None);
    }
}
