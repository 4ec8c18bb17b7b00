//! Revalidation by HEAD, counted in the real registry's own access log: a tag whose answer is
//! no longer fresh costs one HEAD when its digest is unchanged or already known, one HEAD and
//! the new digest's GETs when it moved somewhere new; a registry that names no digest on HEAD is
//! asked with a GET (and remembered); a digest reference is never revalidated.
//!
//! `cache_tag_ttl = 0s` makes every lookup of a tag after the first a revalidation, so the
//! tests need no clock and no sleep.

use crate::common;

use std::time::Duration;

use common::fault_proxy::{Fault, FaultProxy};
use common::fixtures::Pusher;
use common::registry::{self, Mode, Requests};
use common::webhook::{self, TestServer};
use tolerable::registry::{CredentialStore, ImagePlatforms, Resolver, ResolverSettings};

/// Tags are never fresh: each lookup after the first revalidates.
fn settings(insecure: &[&str]) -> ResolverSettings {
    let mut settings = common::settings();
    settings.cache.tag_ttl = Duration::ZERO;
    settings
        .transport
        .insecure_registries
        .extend(insecure.iter().map(|h| (*h).to_owned()));
    settings
}

fn resolver(insecure: &[&str]) -> Resolver {
    Resolver::new(settings(insecure), CredentialStore::default()).unwrap()
}

/// Pushes fixture `name` to the plain registry as `repository:tag`; its digest.
async fn push(repository: &str, name: &str, tag: &str) -> String {
    let host = &registry::plain().host;
    Pusher::for_mode(host, Mode::Plain)
        .push(repository, name, tag)
        .await
}

fn platforms(found: &ImagePlatforms) -> Vec<String> {
    found
        .fact
        .platforms
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn requests(manifest_gets: usize, manifest_heads: usize, blob_gets: usize) -> Requests {
    Requests {
        manifest_gets,
        manifest_heads,
        blob_gets,
    }
}

/// Through the webhook: the second admission of an unchanged tag costs one HEAD and no GET,
/// and the metrics say so (requests by method, a revalidation that saved a GET).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_tag_costs_one_head_and_no_get() {
    let registry = registry::plain();
    let repository = "revalidate/unchanged";
    push(repository, "multiarch-oci", "v1").await;
    let server = TestServer::start(webhook::policy(), settings(&[])).await;
    let mut request = webhook::recorded("pod-create-simple.v1.json", &registry.host);
    request["request"]["object"]["spec"]["containers"][0]["image"] =
        format!("{}/{repository}:v1", registry.host).into();
    let mut patches = Vec::new();
    for _ in 0..2 {
        let (response, _) = webhook::admit(&server, &request, Duration::from_secs(10)).await;
        patches.push(response["patch"].clone());
    }
    assert!(patches[0].is_string(), "{patches:?}");
    assert_eq!(patches[0], patches[1], "the same answer, renewed");
    assert_eq!(
        registry.requests_by_method(repository).await,
        requests(1, 1, 0)
    );
    let metrics = webhook::metrics_text(&server).await;
    let host = &registry.host;
    for series in [
        format!("tolerable_registry_requests_total{{registry=\"{host}\",method=\"GET\",status=\"200\"}}"),
        format!("tolerable_registry_requests_total{{registry=\"{host}\",method=\"HEAD\",status=\"200\"}}"),
        "tolerable_registry_revalidations_total{result=\"unchanged\"}".to_owned(),
    ] {
        assert_eq!(
            webhook::metric_value(&metrics, &series),
            Some(1.0),
            "{series}:\n{metrics}"
        );
    }
}

/// A tag moved to a digest whose answer is known (another tag of the repository named it):
/// one HEAD, no GET, and the known digest's platforms.
#[tokio::test]
async fn a_tag_moved_to_a_known_digest_costs_one_head() {
    let registry = registry::plain();
    let repository = "revalidate/known";
    push(repository, "multiarch-oci", "app").await;
    let arm64 = push(repository, "arm64-oci", "arm64").await;
    let resolver = resolver(&[]);
    let image = |tag: &str| format!("{}/{repository}:{tag}", registry.host);
    let before = resolver.resolve(&image("app")).await.unwrap();
    assert_eq!(platforms(&before).len(), 3);
    resolver.resolve(&image("arm64")).await.unwrap();
    let fetched = registry.requests_by_method(repository).await;
    assert_eq!(fetched, requests(2, 0, 1), "two manifests, one config");

    push(repository, "arm64-oci", "app").await; // the tag moves
    let after = resolver.resolve(&image("app")).await.unwrap();
    assert_eq!(after.digest, arm64);
    assert_eq!(platforms(&after), ["linux/arm64"]);
    assert_eq!(
        registry.requests_by_method(repository).await,
        requests(2, 1, 1),
        "one HEAD more, nothing else"
    );
    // The digest reference is the same known answer: no request at all.
    let pinned = format!("{}/{repository}@{arm64}", registry.host);
    assert_eq!(resolver.resolve(&pinned).await.unwrap().digest, arm64);
    assert_eq!(
        registry.requests_by_method(repository).await,
        requests(2, 1, 1)
    );
}

/// A tag moved to a digest never seen: one HEAD, then the new digest's manifest and config.
#[tokio::test]
async fn a_tag_moved_to_a_new_digest_costs_one_head_and_its_gets() {
    let registry = registry::plain();
    let repository = "revalidate/new";
    push(repository, "multiarch-oci", "app").await;
    let resolver = resolver(&[]);
    let image = format!("{}/{repository}:app", registry.host);
    resolver.resolve(&image).await.unwrap();
    let s390x = push(repository, "s390x-docker", "app").await;
    let after = resolver.resolve(&image).await.unwrap();
    assert_eq!(after.digest, s390x);
    assert_eq!(platforms(&after), ["linux/s390x"]);
    assert_eq!(
        registry.requests_by_method(repository).await,
        requests(2, 1, 1),
        "GET, then HEAD + GET by digest + its config"
    );
    // Unchanged since: one HEAD each time.
    resolver.resolve(&image).await.unwrap();
    assert_eq!(
        registry.requests_by_method(repository).await,
        requests(2, 2, 1)
    );
}

/// A registry (here a proxy in front of the real one) whose HEAD answers name no digest: the
/// first revalidation falls back to a GET, and later ones go straight to GET.
#[tokio::test]
async fn a_registry_naming_no_digest_on_head_is_asked_with_get_from_then_on() {
    let registry = registry::plain();
    let repository = "revalidate/no-digest";
    push(repository, "multiarch-oci", "v1").await;
    let proxy = FaultProxy::start(&registry.host);
    proxy.set(Fault::NoDigestOnHead);
    let resolver = resolver(&[&proxy.host]);
    let image = format!("{}/{repository}:v1", proxy.host);
    for _ in 0..4 {
        let found = resolver.resolve(&image).await.unwrap();
        assert_eq!(platforms(&found).len(), 3);
    }
    assert_eq!(
        registry.requests_by_method(repository).await,
        requests(4, 1, 0),
        "a GET each time, and one HEAD that named no digest"
    );
    // The memory is per registry: the registry itself still revalidates by HEAD.
    let direct = format!("{}/{repository}:v1", registry.host);
    for _ in 0..2 {
        resolver.resolve(&direct).await.unwrap();
    }
    assert_eq!(
        registry.requests_by_method(repository).await,
        requests(5, 2, 0)
    );
}

/// A digest reference is never revalidated, however short the tag TTL.
#[tokio::test]
async fn digest_references_never_revalidate() {
    let registry = registry::plain();
    let repository = "revalidate/pinned";
    let digest = push(repository, "multiarch-oci", "v1").await;
    let resolver = resolver(&[]);
    let pinned = format!("{}/{repository}@{digest}", registry.host);
    for _ in 0..3 {
        resolver.resolve(&pinned).await.unwrap();
    }
    assert_eq!(
        registry.requests_by_method(repository).await,
        requests(1, 0, 0)
    );
}
