//! Reading manifests, indexes and image configs: pure parsing of the bytes a registry returned.
//! Lenient where real registries differ (missing `mediaType`, missing `platform`), strict where a
//! wrong guess would put a Pod on the wrong architecture.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::mutate::platform::Platform;

pub(crate) const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub(crate) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub(crate) const DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1+json";
pub(crate) const DOCKER_SCHEMA1_SIGNED: &str =
    "application/vnd.docker.distribution.manifest.v1+prettyjws";
pub(crate) const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub(crate) const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";

/// Every manifest type we can read. Sending all four matters: distribution silently answers a
/// manifest list with its linux/amd64 child when only the Docker v2 type is accepted.
pub(crate) const ACCEPT: [&str; 4] = [OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST];

/// The static name of a media type this module accepts (so cached answers do not each carry a
/// copy); anything else is reported as an index, the only type inferred without a name.
pub(crate) fn known_media_type(media_type: &str) -> &'static str {
    match media_type {
        OCI_MANIFEST => OCI_MANIFEST,
        DOCKER_LIST => DOCKER_LIST,
        DOCKER_MANIFEST => DOCKER_MANIFEST,
        DOCKER_SCHEMA1 => DOCKER_SCHEMA1,
        DOCKER_SCHEMA1_SIGNED => DOCKER_SCHEMA1_SIGNED,
        _ => OCI_INDEX,
    }
}

/// Which single-manifest type `body` says it is: Docker's when it names it, else OCI's (an OCI
/// manifest may omit its `mediaType`).
pub(crate) fn single_manifest_type(body: &[u8]) -> &'static str {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Declared {
        media_type: Option<String>,
    }
    match serde_json::from_slice::<Declared>(body) {
        Ok(Declared {
            media_type: Some(m),
        }) if m == DOCKER_MANIFEST => DOCKER_MANIFEST,
        _ => OCI_MANIFEST,
    }
}

/// Annotation buildx puts on attestation manifests inside an index.
const REFERENCE_TYPE_ANNOTATION: &str = "vnd.docker.reference.type";

/// What a manifest body turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParsedManifest {
    /// An OCI index or Docker manifest list.
    Index {
        media_type: String,
        entries: Vec<IndexEntry>,
    },
    /// A single-platform image: its platform is in the config blob.
    Image {
        media_type: String,
        config: Descriptor,
    },
    /// A legacy schema 1 manifest, which names its architecture inline (always linux).
    Schema1 {
        media_type: String,
        platform: Platform,
    },
}

impl ParsedManifest {
    pub(crate) fn media_type(&self) -> &str {
        match self {
            Self::Index { media_type, .. }
            | Self::Image { media_type, .. }
            | Self::Schema1 { media_type, .. } => media_type,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub(crate) media_type: String,
    pub(crate) digest: String,
    pub(crate) size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub(crate) descriptor: Descriptor,
    /// `None` when the index does not say; the child's config must then be read.
    pub(crate) platform: Option<Platform>,
}

impl IndexEntry {
    pub(crate) fn is_index(&self) -> bool {
        matches!(self.descriptor.media_type.as_str(), OCI_INDEX | DOCKER_LIST)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// A manifest whose config is not an image config: an OCI artifact (Helm chart, model
    /// weights, signature), which names no platform.
    #[error("not a container image (media type {media_type})")]
    NotAnImage { media_type: String },
    /// A manifest of a type tolerable does not read.
    #[error("not a container image (media type {media_type})")]
    UnknownType { media_type: String },
    #[error("malformed manifest: {0}")]
    Malformed(String),
    #[error("malformed image config: {0}")]
    MalformedConfig(String),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawManifest {
    schema_version: Option<i64>,
    media_type: Option<String>,
    manifests: Option<Vec<RawDescriptor>>,
    config: Option<RawDescriptor>,
    /// Schema 1 only.
    architecture: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDescriptor {
    media_type: String,
    digest: String,
    #[serde(default)]
    size: u64,
    platform: Option<RawPlatform>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct RawPlatform {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
    variant: Option<String>,
}

impl RawDescriptor {
    fn into_descriptor(self) -> Descriptor {
        Descriptor {
            media_type: self.media_type,
            digest: self.digest,
            size: self.size,
        }
    }
}

/// Parses a manifest body. `content_type` is the response's Content-Type, used only when the body
/// does not name its own media type.
pub fn parse_manifest(
    body: &[u8],
    content_type: Option<&str>,
) -> Result<ParsedManifest, ManifestError> {
    let raw: RawManifest =
        serde_json::from_slice(body).map_err(|e| ManifestError::Malformed(json_error(&e)))?;
    let media_type = raw
        .media_type
        .clone()
        .or_else(|| content_type.map(|c| c.split(';').next().unwrap_or(c).trim().to_owned()))
        .filter(|m| !m.is_empty() && m != "application/json")
        .unwrap_or_else(|| match (&raw.manifests, &raw.config) {
            (Some(_), _) => OCI_INDEX.to_owned(),
            (None, Some(_)) => OCI_MANIFEST.to_owned(),
            _ if raw.schema_version == Some(1) => DOCKER_SCHEMA1.to_owned(),
            _ => String::new(),
        });

    match media_type.as_str() {
        OCI_INDEX | DOCKER_LIST => {
            let manifests = raw
                .manifests
                .ok_or_else(|| ManifestError::Malformed("index without \"manifests\"".into()))?;
            let entries = manifests
                .into_iter()
                .filter(|d| !d.annotations.contains_key(REFERENCE_TYPE_ANNOTATION))
                .filter_map(|d| {
                    let platform = d.platform.as_ref().map(|p| {
                        Platform::normalized(&p.os, &p.architecture, p.variant.as_deref())
                    });
                    if platform.as_ref().is_some_and(Platform::is_unknown) {
                        return None; // attestations and other non-runnable entries
                    }
                    Some(IndexEntry {
                        descriptor: d.into_descriptor(),
                        platform,
                    })
                })
                .collect();
            Ok(ParsedManifest::Index {
                media_type,
                entries,
            })
        }
        OCI_MANIFEST | DOCKER_MANIFEST => {
            let config = raw
                .config
                .ok_or_else(|| ManifestError::Malformed("manifest without \"config\"".into()))?;
            if !matches!(config.media_type.as_str(), OCI_CONFIG | DOCKER_CONFIG) {
                return Err(ManifestError::NotAnImage {
                    media_type: shown_media_type(config.media_type),
                });
            }
            Ok(ParsedManifest::Image {
                media_type,
                config: config.into_descriptor(),
            })
        }
        DOCKER_SCHEMA1 | DOCKER_SCHEMA1_SIGNED => {
            let architecture = raw.architecture.filter(|a| !a.is_empty()).ok_or_else(|| {
                ManifestError::Malformed("schema 1 manifest without architecture".into())
            })?;
            Ok(ParsedManifest::Schema1 {
                media_type,
                platform: Platform::normalized("linux", &architecture, None),
            })
        }
        "" => Err(ManifestError::Malformed(
            "neither an index nor a manifest (no mediaType, manifests or config)".into(),
        )),
        _ => Err(ManifestError::UnknownType {
            media_type: shown_media_type(media_type),
        }),
    }
}

/// A media type as a message may show it: `type/subtype`, short, of media-type characters.
/// Anything else (an error page's `Content-Type`, free text in `mediaType`) is not repeated.
fn shown_media_type(media_type: String) -> String {
    let plausible = media_type.len() <= 128
        && media_type.split_once('/').is_some_and(|(t, s)| {
            !t.is_empty() && !s.is_empty() && media_type.bytes().filter(|b| *b == b'/').count() == 1
        })
        && media_type
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/.+-_".contains(&b));
    if plausible {
        media_type
    } else {
        "(unrecognised)".to_owned()
    }
}

/// serde's message without the string values it quotes (`invalid type: string "…"`): the body
/// may be any URL's answer (a redirect, an error page), and its text must not reach a warning.
fn json_error(e: &serde_json::Error) -> String {
    let text = e.to_string();
    if !e.is_data() {
        return text; // syntax and EOF messages are fixed words and a position
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find("string \"") {
        out.push_str(&rest[..at + "string".len()]);
        // Skip the Debug-quoted value, escapes included.
        let mut chars = rest[at + "string \"".len()..].char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    end = Some(at + "string \"".len() + i + 1);
                    break;
                }
                _ => {}
            }
        }
        rest = end.map_or("", |end| &rest[end..]);
    }
    out.push_str(rest);
    out
}

#[derive(Deserialize)]
struct RawImageConfig {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
    variant: Option<String>,
}

/// Reads os / architecture / variant from an image config blob.
pub fn parse_image_config(body: &[u8]) -> Result<Platform, ManifestError> {
    let raw: RawImageConfig =
        serde_json::from_slice(body).map_err(|e| ManifestError::MalformedConfig(json_error(&e)))?;
    if raw.os.is_empty() || raw.architecture.is_empty() {
        return Err(ManifestError::MalformedConfig(
            "config does not name os and architecture".into(),
        ));
    }
    Ok(Platform::normalized(
        &raw.os,
        &raw.architecture,
        raw.variant.as_deref(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_do_not_repeat_the_body() {
        let body = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":"AKIA-SECRET \"quoted\" tail"}"#;
        let err = parse_manifest(body, None).unwrap_err().to_string();
        assert!(err.contains("invalid type: string, expected"), "{err}");
        assert!(!err.contains("SECRET") && !err.contains("tail"), "{err}");
        let err = parse_image_config(br#"{"os":["AKIA-SECRET"]}"#)
            .unwrap_err()
            .to_string();
        assert!(!err.contains("SECRET"), "{err}");
        for (media_type, shown) in [
            ("text/ht<ml>", "(unrecognised)"),
            ("AKIA SECRET", "(unrecognised)"),
            ("text/html", "text/html"),
        ] {
            let err = parse_manifest(b"{}", Some(media_type))
                .unwrap_err()
                .to_string();
            assert!(err.ends_with(&format!("(media type {shown})")), "{err}");
        }
    }

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    fn entry(platform: &str) -> String {
        format!(
            r#"{{"mediaType":"{OCI_MANIFEST}","digest":"{D1}","size":10,"platform":{platform}}}"#
        )
    }

    #[test]
    fn index_skips_attestations_and_normalizes() {
        let body = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[{},{},{},
            {{"mediaType":"{OCI_MANIFEST}","digest":"{D1}","size":1,"platform":{{"os":"linux","architecture":"amd64"}},
              "annotations":{{"vnd.docker.reference.type":"attestation-manifest"}}}}]}}"#,
            entry(r#"{"os":"linux","architecture":"amd64"}"#),
            entry(r#"{"os":"linux","architecture":"arm64","variant":"v8"}"#),
            entry(r#"{"os":"unknown","architecture":"unknown"}"#),
        );
        let ParsedManifest::Index { entries, .. } = parse_manifest(body.as_bytes(), None).unwrap()
        else {
            panic!("not an index")
        };
        let platforms: Vec<_> = entries
            .iter()
            .map(|e| e.platform.as_ref().unwrap().to_string())
            .collect();
        assert_eq!(platforms, ["linux/amd64", "linux/arm64"]);
    }

    #[test]
    fn media_type_falls_back_to_content_type_then_shape() {
        let body = format!(r#"{{"schemaVersion":2,"manifests":[{}]}}"#, entry("null"));
        let parsed = parse_manifest(body.as_bytes(), Some(DOCKER_LIST)).unwrap();
        assert_eq!(parsed.media_type(), DOCKER_LIST);
        let parsed = parse_manifest(body.as_bytes(), None).unwrap();
        assert_eq!(parsed.media_type(), OCI_INDEX);
        let ParsedManifest::Index { entries, .. } = parsed else {
            panic!()
        };
        assert_eq!(entries[0].platform, None);

        let image = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"{OCI_CONFIG}","digest":"{D1}","size":5}},"layers":[]}}"#
        );
        assert!(matches!(
            parse_manifest(image.as_bytes(), Some("application/json")).unwrap(),
            ParsedManifest::Image { .. }
        ));
    }

    #[test]
    fn rejects_artifacts_and_garbage_without_panicking() {
        let helm = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"application/vnd.cncf.helm.config.v1+json","digest":"{D1}","size":5}}}}"#
        );
        assert_eq!(
            parse_manifest(helm.as_bytes(), None).unwrap_err(),
            ManifestError::NotAnImage {
                media_type: "application/vnd.cncf.helm.config.v1+json".into()
            }
        );
        for bad in [
            &b"{"[..],
            b"",
            b"[]",
            b"null",
            b"{\"manifests\": 3}",
            b"{\"schemaVersion\":2}",
            b"{\"mediaType\":\"application/vnd.oci.image.index.v1+json\"}",
            b"\xff\xfe",
        ] {
            assert!(parse_manifest(bad, None).is_err(), "{bad:?}");
        }
        let err = parse_manifest(br#"{"mediaType":"text/plain"}"#, None).unwrap_err();
        assert!(err.to_string().contains("not a container image"), "{err}");
    }

    #[test]
    fn schema1_names_its_architecture() {
        let parsed = parse_manifest(
            br#"{"schemaVersion":1,"name":"x","tag":"v","architecture":"arm64","fsLayers":[]}"#,
            Some(DOCKER_SCHEMA1_SIGNED),
        )
        .unwrap();
        assert_eq!(
            parsed,
            ParsedManifest::Schema1 {
                media_type: DOCKER_SCHEMA1_SIGNED.into(),
                platform: Platform::normalized("linux", "arm64", None)
            }
        );
    }

    #[test]
    fn image_config() {
        let p = parse_image_config(
            br#"{"architecture":"arm","os":"linux","variant":"v7","rootfs":{}}"#,
        )
        .unwrap();
        assert_eq!(p.to_string(), "linux/arm/v7");
        // A config without the optional `config` key is still an image config.
        let p = parse_image_config(br#"{"architecture":"s390x","os":"linux"}"#).unwrap();
        assert_eq!(p.to_string(), "linux/s390x");
        assert!(parse_image_config(br#"{"os":"linux"}"#).is_err());
        assert!(parse_image_config(b"not json").is_err());
    }
}
