//! The manifest-tree walk: from a tag or digest to the platforms it names. Generic over
//! [`ManifestSource`], the I/O boundary, so it runs the same over HTTP and over a map in a test.
//!
//! Bounded per lookup, not per index ([`LookupBounds`]): every manifest and blob fetched counts
//! against the lookup's total, a few at a time for the whole tree, and each digest is fetched
//! once however many indexes name it (a child naming an ancestor is a loop, walked once).

use std::collections::HashSet;
use std::future::Future;
use std::sync::Mutex;

use bytes::Bytes;
use futures_util::{StreamExt as _, TryStreamExt as _};

use super::bounds::{LookupBounds, FETCHES_AT_ONCE};
use super::manifest::{self, ManifestError, ParsedManifest};
use super::{FetchError, Platform, MAX_INDEX_DEPTH, MAX_INDEX_ENTRIES, MAX_PLATFORMS};

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
pub(crate) struct Walked {
    pub(crate) digest: String,
    pub(crate) media_type: &'static str,
    pub(crate) platforms: Vec<Platform>,
    /// The config media type of a platform-less artifact (then `platforms` is empty).
    pub(crate) artifact: Option<String>,
    /// Platforms left out because a name is not a valid Kubernetes label value (the node
    /// labels a patch selects on could never hold it).
    pub(crate) ignored: usize,
}

/// One walk of one tree: the lookup's bounds, and the digests already fetched in it.
struct Walk<'a, S> {
    source: &'a S,
    repository: &'a str,
    bounds: &'a LookupBounds,
    fetched: Mutex<HashSet<String>>,
}

impl<S: ManifestSource> Walk<'_, S> {
    /// True the first time `digest` is named in this walk: only then is it fetched.
    fn first_time(&self, digest: &str) -> bool {
        self.fetched
            .lock()
            .expect("not poisoned")
            .insert(digest.to_owned())
    }

    async fn manifest(&self, reference: &str) -> Result<(Bytes, String), FetchError> {
        let _turn = self.bounds.fetch_turn().await?;
        self.source.manifest(self.repository, reference).await
    }

    async fn blob(&self, digest: &str) -> Result<Bytes, FetchError> {
        let _turn = self.bounds.fetch_turn().await?;
        self.source.blob(self.repository, digest).await
    }
}

/// Walks from `reference` (tag or digest) to the set of platforms, within the lookup's
/// `bounds`. An index answers in one request when its entries carry platforms; entries without
/// one, and single manifests, cost a config blob read each (done concurrently).
pub(crate) async fn walk(
    source: &impl ManifestSource,
    repository: &str,
    reference: &str,
    bounds: &LookupBounds,
) -> Result<Walked, FetchError> {
    let walk = Walk {
        source,
        repository,
        bounds,
        fetched: Mutex::default(),
    };
    let (body, digest) = walk.manifest(reference).await?;
    walk.first_time(&digest);
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
                ignored: 0,
            })
        }
        Err(e) => return Err(FetchError::Manifest(e)),
    };
    // Not held while the children are fetched.
    drop(body);
    let media_type = manifest::known_media_type(parsed.media_type());
    let mut platforms = platforms_of(&walk, parsed, 0).await?;
    let named = platforms.len();
    platforms.retain(Platform::is_label_safe);
    let ignored = named - platforms.len();
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
        ignored,
    })
}

fn platforms_of<'a, S: ManifestSource>(
    walk: &'a Walk<'a, S>,
    parsed: ParsedManifest,
    depth: usize,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Vec<Platform>, FetchError>> + Send + 'a>> {
    Box::pin(async move {
        match parsed {
            ParsedManifest::Schema1 { platform, .. } => Ok(vec![platform]),
            // A config already read in this walk gave its platform there.
            ParsedManifest::Image { config, .. } if !walk.first_time(&config.digest) => {
                Ok(Vec::new())
            }
            ParsedManifest::Image { config, .. } => {
                let blob = walk.blob(&config.digest).await?;
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
                        // Each child once in the whole walk, however often it is listed.
                        _ if !walk.first_time(&entry.descriptor.digest) => {}
                        _ => unknown.push(entry.descriptor.digest),
                    }
                }
                if !unknown.is_empty() && depth >= MAX_INDEX_DEPTH {
                    return Err(FetchError::TooDeep);
                }
                // The lookup's turns bound the fetches; this bounds the futures waiting. In
                // any order: the first failure ends the walk at once, not after the children
                // listed before it (one may be stalling).
                let children: Vec<Vec<Platform>> = futures_util::stream::iter(
                    unknown
                        .into_iter()
                        .map(move |digest| async move { child(walk, &digest, depth).await }),
                )
                .buffer_unordered(FETCHES_AT_ONCE)
                .try_collect()
                .await?;
                known.extend(children.into_iter().flatten());
                known.retain(|p| !p.is_unknown());
                Ok(known)
            }
        }
    })
}

/// The platforms of the child manifest `digest` of an index at `depth`.
async fn child<S: ManifestSource>(
    walk: &Walk<'_, S>,
    digest: &str,
    depth: usize,
) -> Result<Vec<Platform>, FetchError> {
    let (body, _) = walk.manifest(digest).await?;
    let child = manifest::parse_manifest(&body, None).map_err(FetchError::Manifest);
    drop(body);
    match child {
        Ok(child) => platforms_of(walk, child, depth + 1).await,
        // An artifact inside an index (a signature, an SBOM) is not a platform.
        Err(FetchError::Manifest(
            ManifestError::NotAnImage { .. } | ManifestError::UnknownType { .. },
        )) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// One platform an index claims, checked against the image config of the manifest it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Checked {
    /// What the index says (`linux/arm64/v8`).
    pub(crate) claimed: Platform,
    /// What the child's image config says.
    pub(crate) actual: Platform,
}

impl Checked {
    /// The config names another OS or architecture than the index (a variant the config leaves
    /// out is not a mismatch: many builders write it only in the index).
    pub(crate) fn mislabelled(&self) -> bool {
        self.claimed.os != self.actual.os
            || self.claimed.architecture != self.actual.architecture
            || (self.actual.variant.is_some() && self.claimed.variant != self.actual.variant)
    }
}

/// Reads the image config of every child an index names with a platform, to compare what the
/// index claims with what the image is. One manifest and one blob GET per child: never done at
/// admission (`inspect --verify`, `audit --verify`). A single manifest has nothing to compare.
pub(crate) async fn verify(
    source: &impl ManifestSource,
    repository: &str,
    reference: &str,
) -> Result<Vec<Checked>, FetchError> {
    let (body, _) = source.manifest(repository, reference).await?;
    let ParsedManifest::Index { entries, .. } =
        manifest::parse_manifest(&body, None).map_err(FetchError::Manifest)?
    else {
        return Ok(Vec::new());
    };
    if entries.len() > MAX_INDEX_ENTRIES {
        return Err(FetchError::TooMany(
            "the image index lists more than 512 manifests",
        ));
    }
    let claimed: Vec<(Platform, String)> = entries
        .into_iter()
        .filter(|e| !e.is_index())
        .filter_map(|e| Some((e.platform?, e.descriptor.digest)))
        .filter(|(p, _)| !p.is_unknown())
        .collect();
    futures_util::stream::iter(claimed.into_iter().map(|(claimed, digest)| async move {
        let (body, _) = source.manifest(repository, &digest).await?;
        let ParsedManifest::Image { config, .. } =
            manifest::parse_manifest(&body, None).map_err(FetchError::Manifest)?
        else {
            return Ok(None);
        };
        let blob = source.blob(repository, &config.digest).await?;
        let actual = manifest::parse_image_config(&blob).map_err(FetchError::Manifest)?;
        Ok(Some(Checked { claimed, actual }))
    }))
    .buffered(FETCHES_AT_ONCE)
    .try_filter_map(|checked| async move { Ok(checked) })
    .try_collect()
    .await
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use serde_json::{json, Value};

    use super::*;
    use crate::registry::bounds::{RegistryBytes, MAX_FETCHES_PER_LOOKUP, REGISTRY_BYTES_BUDGET};
    use crate::registry::manifest::{OCI_CONFIG, OCI_INDEX, OCI_MANIFEST};

    /// A registry in a map: manifests by tag or digest, blobs by digest. Records what was asked,
    /// and how many requests were answering at once (each answer yields to the runtime first,
    /// so concurrent requests overlap).
    #[derive(Default)]
    struct MemorySource {
        manifests: HashMap<String, Bytes>,
        blobs: HashMap<String, Bytes>,
        asked: Mutex<Vec<String>>,
        in_flight: AtomicUsize,
        most_in_flight: AtomicUsize,
    }

    impl MemorySource {
        fn manifest(mut self, reference: &str, body: &Value) -> Self {
            self.manifests
                .insert(reference.to_owned(), body.to_string().into());
            self
        }

        fn blob(mut self, digest: &str, body: &Value) -> Self {
            self.blobs
                .insert(digest.to_owned(), body.to_string().into());
            self
        }

        fn asked(&self) -> Vec<String> {
            self.asked.lock().unwrap().clone()
        }

        fn record(&self, what: String) {
            self.asked.lock().unwrap().push(what);
        }

        async fn answer<T>(&self, found: Option<T>) -> Result<T, FetchError> {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_in_flight.fetch_max(now, Ordering::SeqCst);
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            found.ok_or(FetchError::NotFound)
        }
    }

    impl ManifestSource for MemorySource {
        fn manifest(
            &self,
            _: &str,
            reference: &str,
        ) -> impl Future<Output = Result<(Bytes, String), FetchError>> + Send {
            self.record(format!("manifest {reference}"));
            let digest = if reference.starts_with("sha256:") {
                reference.to_owned()
            } else {
                format!("sha256:tag-{reference}")
            };
            let found = self.manifests.get(reference).cloned();
            self.answer(found.map(|body| (body, digest)))
        }

        fn blob(
            &self,
            _: &str,
            digest: &str,
        ) -> impl Future<Output = Result<Bytes, FetchError>> + Send {
            self.record(format!("blob {digest}"));
            self.answer(self.blobs.get(digest).cloned())
        }
    }

    fn image(config_digest: &str) -> Value {
        image_of(OCI_CONFIG, config_digest)
    }

    fn image_of(config_type: &str, config_digest: &str) -> Value {
        json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": config_type, "digest": config_digest, "size": 1},
            "layers": [],
        })
    }

    fn config(architecture: &str) -> Value {
        json!({"os": "linux", "architecture": architecture})
    }

    /// An index entry; `architecture` None leaves the platform out, so the child must be read.
    fn entry(media_type: &str, digest: &str, architecture: Option<&str>) -> Value {
        let mut entry = json!({"mediaType": media_type, "digest": digest, "size": 1});
        if let Some(architecture) = architecture {
            entry["platform"] = json!({"os": "linux", "architecture": architecture});
        }
        entry
    }

    fn index(entries: Vec<Value>) -> Value {
        json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries})
    }

    fn names(walked: &Walked) -> Vec<String> {
        walked.platforms.iter().map(ToString::to_string).collect()
    }

    /// A lookup's bounds, with a process budget of its own.
    fn bounds() -> LookupBounds {
        LookupBounds::new(
            Arc::new(RegistryBytes::new(REGISTRY_BYTES_BUDGET, None)),
            None,
        )
    }

    async fn walk_tag(source: &MemorySource) -> Result<Walked, FetchError> {
        walk(source, "app", "v1", &bounds()).await
    }

    #[tokio::test]
    async fn a_single_manifest_reads_its_config() {
        let source = MemorySource::default()
            .manifest("v1", &image("sha256:c"))
            .blob("sha256:c", &config("s390x"));
        let walked = walk_tag(&source).await.unwrap();
        assert_eq!(names(&walked), ["linux/s390x"]);
        assert_eq!(walked.digest, "sha256:tag-v1");
        assert_eq!(walked.media_type, OCI_MANIFEST);
        assert_eq!(walked.artifact, None);
        assert_eq!(source.asked(), ["manifest v1", "blob sha256:c"]);
    }

    #[tokio::test]
    async fn an_index_answers_from_its_entries_and_reads_only_children_without_a_platform() {
        let source = MemorySource::default()
            .manifest(
                "v1",
                &index(vec![
                    entry(OCI_MANIFEST, "sha256:a", Some("amd64")),
                    entry(OCI_MANIFEST, "sha256:b", Some("arm64")),
                    entry(OCI_MANIFEST, "sha256:s", None),
                ]),
            )
            .manifest("sha256:s", &image("sha256:sc"))
            .blob("sha256:sc", &config("s390x"));
        let walked = walk_tag(&source).await.unwrap();
        assert_eq!(
            names(&walked),
            ["linux/amd64", "linux/arm64", "linux/s390x"]
        );
        assert_eq!(walked.media_type, OCI_INDEX);
        assert_eq!(
            source.asked(),
            ["manifest v1", "manifest sha256:s", "blob sha256:sc"]
        );
    }

    #[tokio::test]
    async fn a_nested_index_is_read_even_when_its_entry_claims_a_platform() {
        let source = MemorySource::default()
            .manifest(
                "v1",
                &index(vec![
                    entry(OCI_MANIFEST, "sha256:a", Some("amd64")),
                    // The claim is not trusted: the nested index says what it holds.
                    entry(OCI_INDEX, "sha256:inner", Some("riscv64")),
                ]),
            )
            .manifest(
                "sha256:inner",
                &index(vec![entry(OCI_MANIFEST, "sha256:p", Some("ppc64le"))]),
            );
        let walked = walk_tag(&source).await.unwrap();
        assert_eq!(names(&walked), ["linux/amd64", "linux/ppc64le"]);
    }

    /// An index `levels` deep whose innermost index lists an image without a platform.
    fn nested(levels: usize) -> MemorySource {
        let mut source = MemorySource::default()
            .manifest("sha256:leaf", &image("sha256:c"))
            .blob("sha256:c", &config("arm64"));
        for level in 0..levels {
            let child = match level {
                0 => entry(OCI_MANIFEST, "sha256:leaf", None),
                _ => entry(OCI_INDEX, &format!("sha256:i{}", level - 1), None),
            };
            let name = match level + 1 == levels {
                true => "v1".to_owned(),
                false => format!("sha256:i{level}"),
            };
            source = source.manifest(&name, &index(vec![child]));
        }
        source
    }

    #[tokio::test]
    async fn indexes_nest_at_most_max_index_depth_deep() {
        let walked = walk_tag(&nested(MAX_INDEX_DEPTH)).await.unwrap();
        assert_eq!(names(&walked), ["linux/arm64"]);
        let too_deep = walk_tag(&nested(MAX_INDEX_DEPTH + 1)).await;
        assert_eq!(too_deep, Err(FetchError::TooDeep));
    }

    #[tokio::test]
    async fn an_artifact_names_no_platform_and_is_skipped_inside_an_index() {
        let helm = "application/vnd.cncf.helm.config.v1+json";
        let source = MemorySource::default().manifest("v1", &image_of(helm, "sha256:c"));
        let walked = walk_tag(&source).await.unwrap();
        assert!(walked.platforms.is_empty());
        assert_eq!(walked.artifact.as_deref(), Some(helm));
        assert_eq!(walked.media_type, OCI_MANIFEST);
        assert_eq!(
            source.asked(),
            ["manifest v1"],
            "an artifact's config is not read"
        );

        let source = MemorySource::default()
            .manifest(
                "v1",
                &index(vec![
                    entry(OCI_MANIFEST, "sha256:a", Some("amd64")),
                    entry(OCI_MANIFEST, "sha256:sig", None),
                    entry(OCI_MANIFEST, "sha256:odd", None),
                ]),
            )
            .manifest("sha256:sig", &image_of(helm, "sha256:c"))
            .manifest("sha256:odd", &json!({"mediaType": "application/x-odd"}));
        let walked = walk_tag(&source).await.unwrap();
        assert_eq!(names(&walked), ["linux/amd64"]);
        assert_eq!(walked.artifact, None);
    }

    #[tokio::test]
    async fn an_unknown_media_type_at_the_top_is_not_an_image() {
        let source = MemorySource::default().manifest("v1", &json!({"mediaType": "text/plain"}));
        let walked = walk_tag(&source).await;
        assert_eq!(
            walked,
            Err(FetchError::Manifest(ManifestError::UnknownType {
                media_type: "text/plain".into()
            }))
        );
    }

    #[tokio::test]
    async fn an_index_may_list_512_manifests_and_64_platforms_and_no_more() {
        let arch = |i: usize| format!("arch{}", i % 64);
        let listing = |n: usize, arch: &dyn Fn(usize) -> String| {
            let entries = (0..n)
                .map(|i| entry(OCI_MANIFEST, &format!("sha256:{i}"), Some(&arch(i))))
                .collect();
            MemorySource::default().manifest("v1", &index(entries))
        };
        let walked = walk_tag(&listing(MAX_INDEX_ENTRIES, &arch)).await.unwrap();
        assert_eq!(walked.platforms.len(), MAX_PLATFORMS);
        assert!(matches!(
            walk_tag(&listing(MAX_INDEX_ENTRIES + 1, &arch)).await,
            Err(FetchError::TooMany(_))
        ));
        let distinct = |i: usize| format!("arch{i}");
        assert!(walk_tag(&listing(MAX_PLATFORMS, &distinct)).await.is_ok());
        assert!(matches!(
            walk_tag(&listing(MAX_PLATFORMS + 1, &distinct)).await,
            Err(FetchError::TooMany(_))
        ));
    }

    #[tokio::test]
    async fn a_child_listed_twice_is_read_once_and_counted_once() {
        let source = MemorySource::default()
            .manifest(
                "v1",
                &index(vec![
                    entry(OCI_MANIFEST, "sha256:s", None),
                    entry(OCI_MANIFEST, "sha256:a", Some("s390x")),
                    entry(OCI_MANIFEST, "sha256:s", None),
                ]),
            )
            .manifest("sha256:s", &image("sha256:sc"))
            .blob("sha256:sc", &config("s390x"));
        let walked = walk_tag(&source).await.unwrap();
        assert_eq!(names(&walked), ["linux/s390x"]);
        assert_eq!(
            source.asked(),
            ["manifest v1", "manifest sha256:s", "blob sha256:sc"]
        );
    }

    #[tokio::test]
    async fn a_child_that_fails_fails_the_walk() {
        let source = MemorySource::default().manifest(
            "v1",
            &index(vec![
                entry(OCI_MANIFEST, "sha256:a", Some("amd64")),
                entry(OCI_MANIFEST, "sha256:gone", None),
            ]),
        );
        assert_eq!(walk_tag(&source).await, Err(FetchError::NotFound));

        let broken = MemorySource::default()
            .manifest("v1", &index(vec![entry(OCI_MANIFEST, "sha256:s", None)]))
            .manifest("sha256:s", &image("sha256:sc"))
            .blob("sha256:sc", &json!({"os": "linux"}));
        assert!(matches!(
            walk_tag(&broken).await,
            Err(FetchError::Manifest(ManifestError::MalformedConfig(_)))
        ));
    }

    #[tokio::test]
    async fn verify_reads_each_claimed_childs_config() {
        let source = MemorySource::default()
            .manifest(
                "v1",
                &index(vec![
                    entry(OCI_MANIFEST, "sha256:a", Some("amd64")),
                    entry(OCI_MANIFEST, "sha256:b", Some("arm64")),
                ]),
            )
            .manifest("sha256:a", &image("sha256:ca"))
            .manifest("sha256:b", &image("sha256:cb"))
            .blob("sha256:ca", &config("amd64"))
            // Built on an amd64 machine and pushed as arm64: the config says so.
            .blob("sha256:cb", &config("amd64"));
        let checked = verify(&source, "repo", "v1").await.unwrap();
        let mislabelled: Vec<String> = checked
            .iter()
            .filter(|c| c.mislabelled())
            .map(|c| format!("{} says {}", c.claimed, c.actual))
            .collect();
        assert_eq!(checked.len(), 2);
        assert_eq!(mislabelled, ["linux/arm64 says linux/amd64"]);
        let single = MemorySource::default()
            .manifest("v1", &image("sha256:ca"))
            .blob("sha256:ca", &config("amd64"));
        assert!(verify(&single, "repo", "v1").await.unwrap().is_empty());
    }

    /// An index of `children` nested indexes, each listing `images` platform-less images of
    /// their own (each with its own config): far more fetches than one lookup may make, while
    /// every index stays within its own limits.
    fn wide_tree(children: usize, images: usize) -> MemorySource {
        let mut source = MemorySource::default();
        let mut top = Vec::new();
        for c in 0..children {
            let mut listed = Vec::new();
            for i in 0..images {
                let (manifest, blob) = (format!("sha256:m{c}-{i}"), format!("sha256:c{c}-{i}"));
                source = source
                    .manifest(&manifest, &image(&blob))
                    .blob(&blob, &config("arm64"));
                listed.push(entry(OCI_MANIFEST, &manifest, None));
            }
            let name = format!("sha256:i{c}");
            source = source.manifest(&name, &index(listed));
            top.push(entry(OCI_INDEX, &name, None));
        }
        source.manifest("v1", &index(top))
    }

    #[tokio::test]
    async fn the_whole_walk_is_bounded_not_each_index() {
        let source = wide_tree(8, 16);
        let err = walk(&source, "app", "v1", &bounds()).await.unwrap_err();
        assert_eq!(
            err,
            FetchError::OverLimit(format!(
                "more than {MAX_FETCHES_PER_LOOKUP} manifests and blobs to read"
            ))
        );
        let asked = source.asked().len();
        assert!(asked <= MAX_FETCHES_PER_LOOKUP, "{asked} fetches");
        // Four at a time for the whole tree, not four per index.
        let most = source.most_in_flight.load(Ordering::SeqCst);
        assert!(most <= FETCHES_AT_ONCE && most > 1, "{most} at once");
        // Within the bound, the same shape is walked whole.
        let small = wide_tree(3, 10);
        let walked = walk(&small, "app", "v1", &bounds()).await.unwrap();
        assert_eq!(names(&walked), ["linux/arm64"]);
        assert_eq!(small.asked().len(), 1 + 3 + 3 * 10 * 2);
    }

    #[tokio::test]
    async fn a_child_named_by_several_indexes_or_looping_back_is_fetched_once() {
        let shared = entry(OCI_MANIFEST, "sha256:s", None);
        let source = MemorySource::default()
            .manifest(
                "v1",
                &index(vec![
                    entry(OCI_INDEX, "sha256:a", None),
                    entry(OCI_INDEX, "sha256:b", None),
                ]),
            )
            .manifest(
                "sha256:a",
                &index(vec![shared.clone(), entry(OCI_INDEX, "sha256:b", None)]),
            )
            // Names the top of the tree again (its digest, as the registry gave it): a loop.
            .manifest(
                "sha256:b",
                &index(vec![shared, entry(OCI_INDEX, "sha256:tag-v1", None)]),
            )
            .manifest("sha256:s", &image("sha256:sc"))
            .blob("sha256:sc", &config("s390x"));
        let walked = walk_tag(&source).await.unwrap();
        assert_eq!(names(&walked), ["linux/s390x"]);
        let mut asked = source.asked();
        asked.sort();
        assert_eq!(
            asked,
            [
                "blob sha256:sc",
                "manifest sha256:a",
                "manifest sha256:b",
                "manifest sha256:s",
                "manifest v1"
            ]
        );
    }

    #[tokio::test]
    async fn platforms_that_are_not_label_values_are_ignored_and_counted() {
        let long = "a".repeat(64);
        let source = MemorySource::default().manifest(
            "v1",
            &index(vec![
                entry(OCI_MANIFEST, "sha256:a", Some("amd64")),
                entry(OCI_MANIFEST, "sha256:b", Some(&long)),
                entry(OCI_MANIFEST, "sha256:c", Some("arm64 ; x")),
                entry(OCI_MANIFEST, "sha256:d", Some("-arm")),
            ]),
        );
        let walked = walk_tag(&source).await.unwrap();
        assert_eq!(names(&walked), ["linux/amd64"]);
        assert_eq!(walked.ignored, 3);
    }
}
