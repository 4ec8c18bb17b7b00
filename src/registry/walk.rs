//! The manifest-tree walk: from a tag or digest to the platforms it names. Generic over
//! [`ManifestSource`], the I/O boundary, so it runs the same over HTTP and over a map in a test.

use std::future::Future;

use bytes::Bytes;
use futures_util::{StreamExt as _, TryStreamExt as _};

use super::manifest::{self, ManifestError, ParsedManifest};
use super::{FetchError, Platform, MAX_INDEX_DEPTH, MAX_INDEX_ENTRIES, MAX_PLATFORMS};

/// Child manifests of one index fetched at the same time.
const CHILD_FETCHES: usize = 4;

/// The I/O boundary: one registry host with one credential.
pub trait ManifestSource: Sync {
    /// The manifest body and its digest. `reference` is a tag or a digest.
    fn manifest(
        &self,
        repository: &str,
        reference: &str,
    ) -> impl Future<Output = Result<(Bytes, String), FetchError>> + Send;
    fn blob(
        &self,
        repository: &str,
        digest: &str,
    ) -> impl Future<Output = Result<Bytes, FetchError>> + Send;
}

/// The result of walking one manifest tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Walked {
    pub digest: String,
    pub media_type: &'static str,
    pub platforms: Vec<Platform>,
    /// The config media type of a platform-less artifact (then `platforms` is empty).
    pub artifact: Option<String>,
}

/// Walks from `reference` (tag or digest) to the set of platforms. An index answers in one
/// request when its entries carry platforms; entries without one, and single manifests, cost a
/// config blob read each (done concurrently).
pub async fn walk(
    source: &impl ManifestSource,
    repository: &str,
    reference: &str,
) -> Result<Walked, FetchError> {
    let (body, digest) = source.manifest(repository, reference).await?;
    let parsed = match manifest::parse_manifest(&body, None) {
        Ok(parsed) => parsed,
        // A single manifest whose config is not an image config names no platform: an
        // artifact, pulled the same on every node (image volumes carry such).
        Err(ManifestError::NotAnImage { media_type }) => {
            return Ok(Walked {
                digest,
                media_type: manifest::single_manifest_type(&body),
                platforms: Vec::new(),
                artifact: Some(media_type),
            })
        }
        Err(e) => return Err(FetchError::Manifest(e)),
    };
    let media_type = manifest::known_media_type(parsed.media_type());
    let mut platforms = platforms_of(source, repository, parsed, 0).await?;
    platforms.sort();
    platforms.dedup();
    if platforms.len() > MAX_PLATFORMS {
        return Err(FetchError::TooMany(
            "the image names more than 64 platforms",
        ));
    }
    platforms.shrink_to_fit();
    Ok(Walked {
        digest,
        media_type,
        platforms,
        artifact: None,
    })
}

fn platforms_of<'a, S: ManifestSource>(
    source: &'a S,
    repository: &'a str,
    parsed: ParsedManifest,
    depth: usize,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Vec<Platform>, FetchError>> + Send + 'a>> {
    Box::pin(async move {
        match parsed {
            ParsedManifest::Schema1 { platform, .. } => Ok(vec![platform]),
            ParsedManifest::Image { config, .. } => {
                let blob = source.blob(repository, &config.digest).await?;
                Ok(vec![
                    manifest::parse_image_config(&blob).map_err(FetchError::Manifest)?
                ])
            }
            ParsedManifest::Index { entries, .. } => {
                if entries.len() > MAX_INDEX_ENTRIES {
                    return Err(FetchError::TooMany(
                        "the image index lists more than 512 manifests",
                    ));
                }
                let mut known = Vec::new();
                let mut unknown: Vec<String> = Vec::new();
                for entry in entries {
                    match entry.platform {
                        // A nested index's own platform field is not trusted: read it.
                        Some(p) if !entry.is_index() => known.push(p),
                        // Each child once, however often the index lists it.
                        _ if unknown.contains(&entry.descriptor.digest) => {}
                        _ => unknown.push(entry.descriptor.digest),
                    }
                }
                if !unknown.is_empty() && depth >= MAX_INDEX_DEPTH {
                    return Err(FetchError::TooDeep);
                }
                // A few children at a time: an index is a list the registry's owner chose.
                let children: Vec<Vec<Platform>> =
                    futures_util::stream::iter(unknown.into_iter().map(move |digest| async move {
                        let (body, _) = source.manifest(repository, &digest).await?;
                        let child =
                            manifest::parse_manifest(&body, None).map_err(FetchError::Manifest);
                        match child {
                            Ok(child) => platforms_of(source, repository, child, depth + 1).await,
                            // An artifact inside an index (a signature, an SBOM) is not a platform.
                            Err(FetchError::Manifest(
                                ManifestError::NotAnImage { .. }
                                | ManifestError::UnknownType { .. },
                            )) => Ok(Vec::new()),
                            Err(e) => Err(e),
                        }
                    }))
                    .buffered(CHILD_FETCHES)
                    .try_collect()
                    .await?;
                known.extend(children.into_iter().flatten());
                known.retain(|p| !p.is_unknown());
                Ok(known)
            }
        }
    })
}
