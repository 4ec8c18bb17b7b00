//! Platform resolution against real registries (distribution 2.8 on 127.0.0.1) in every auth
//! mode, with fixture images of every shape.

use crate::common;

use std::time::{Duration, Instant};

use common::fixtures::{self, Pusher, EXPECTED};
use common::registry::{self, Mode, Registry, PASSWORD, USER};
use tolerable::registry::{Credential, CredentialStore, LookupError, Resolver};

fn platforms(found: &tolerable::registry::ImagePlatforms) -> Vec<String> {
    found
        .fact
        .platforms
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// A credential store as an operator writes it: `<dir>/<host>_<port>.toml`.
fn creds_dir(
    registry: &Registry,
    user: &str,
    secret: &str,
) -> (tempfile::TempDir, CredentialStore) {
    let dir = tempfile::tempdir().unwrap();
    let file = format!("{}.toml", registry.host.replace(':', "_"));
    std::fs::write(
        dir.path().join(file),
        format!("user = \"{user}\"\nsecret = \"{secret}\"\n"),
    )
    .unwrap();
    let store = CredentialStore::load_dir(dir.path()).unwrap();
    (dir, store)
}

async fn assert_every_shape(registry: &Registry, resolver: &Resolver) {
    for (name, expected) in EXPECTED {
        let image = format!("{}/fixtures/{name}:v1", registry.host);
        let result = resolver.resolve(&image).await;
        match expected {
            Some(expected) => {
                let found = result.unwrap_or_else(|e| panic!("{:?} {image}: {e}", registry.mode));
                assert_eq!(platforms(&found), *expected, "{:?} {image}", registry.mode);
                assert!(found.digest.starts_with("sha256:"), "{}", found.digest);
            }
            None => {
                let found = result.unwrap_or_else(|e| panic!("{image}: expected an artifact: {e}"));
                assert_eq!(
                    found.fact.artifact.as_deref(),
                    Some("application/vnd.cncf.helm.config.v1+json")
                );
                assert!(found.fact.platforms.is_empty(), "{found:?}");
            }
        }
    }
}

#[tokio::test]
async fn every_shape_over_plain_http() {
    let resolver = Resolver::new(common::settings(), CredentialStore::default()).unwrap();
    assert_every_shape(registry::plain(), &resolver).await;
}

#[tokio::test]
async fn every_shape_over_tls_with_private_ca() {
    let resolver = Resolver::new(common::settings(), CredentialStore::default()).unwrap();
    assert_every_shape(registry::tls(), &resolver).await;
}

#[tokio::test]
async fn every_shape_with_basic_auth() {
    let registry = registry::basic();
    let (_dir, store) = creds_dir(registry, USER, PASSWORD);
    let resolver = Resolver::new(common::settings(), store).unwrap();
    assert_every_shape(registry, &resolver).await;
    let found = resolver
        .resolve(&format!("{}/fixtures/amd64-docker:v1", registry.host))
        .await
        .unwrap();
    assert!(
        found.fact.credentials.to_string().ends_with(".toml"),
        "{}",
        found.fact.credentials
    );
}

#[tokio::test]
async fn every_shape_with_bearer_tokens() {
    let registry = registry::token();
    let (_dir, store) = creds_dir(registry, USER, PASSWORD);
    let resolver = Resolver::new(common::settings(), store).unwrap();
    assert_every_shape(registry, &resolver).await;
}

#[tokio::test]
async fn media_types_are_reported() {
    let registry = registry::plain();
    let resolver = Resolver::new(common::settings(), CredentialStore::default()).unwrap();
    for (name, media_type) in [
        ("multiarch-oci", fixtures::OCI_INDEX),
        ("multiarch-docker", fixtures::DOCKER_LIST),
        ("s390x-docker", fixtures::DOCKER_MANIFEST),
        ("arm64-oci", fixtures::OCI_MANIFEST),
    ] {
        let found = resolver
            .resolve(&format!("{}/fixtures/{name}:v1", registry.host))
            .await
            .unwrap();
        assert_eq!(found.media_type, media_type, "{name}");
    }
}

#[tokio::test]
async fn digest_references_and_digest_winning_over_tag() {
    let registry = registry::plain();
    let resolver = Resolver::new(common::settings(), CredentialStore::default()).unwrap();
    let by_tag = resolver
        .resolve(&format!("{}/fixtures/multiarch-docker:v1", registry.host))
        .await
        .unwrap();
    let by_digest = resolver
        .resolve(&format!(
            "{}/fixtures/multiarch-docker@{}",
            registry.host, by_tag.digest
        ))
        .await
        .unwrap();
    assert_eq!(by_digest.digest, by_tag.digest);
    assert_eq!(by_digest.fact.platforms, by_tag.fact.platforms);
    // A tag that does not exist, with the digest of a real manifest: the digest wins.
    let both = resolver
        .resolve(&format!(
            "{}/fixtures/multiarch-docker:no-such-tag@{}",
            registry.host, by_tag.digest
        ))
        .await
        .unwrap();
    assert_eq!(both.fact.platforms, by_tag.fact.platforms);
}

#[tokio::test]
async fn missing_tag_and_repository_are_not_found() {
    let registry = registry::plain();
    let resolver = Resolver::new(common::settings(), CredentialStore::default()).unwrap();
    for image in [
        format!("{}/fixtures/multiarch-oci:no-such-tag", registry.host),
        format!("{}/no/such-repository:v1", registry.host),
        format!(
            "{}/fixtures/multiarch-oci@sha256:{}",
            registry.host,
            "0".repeat(64)
        ),
    ] {
        let err = resolver.resolve(&image).await.unwrap_err();
        assert!(
            matches!(err, LookupError::NotFound { .. }),
            "{image}: {err:?}"
        );
        assert!(err.to_string().contains(&image), "{err}");
    }
    let err = resolver.resolve("Not A Reference").await.unwrap_err();
    assert!(matches!(err, LookupError::InvalidReference(_)), "{err:?}");
    assert!(err.to_string().contains("Not A Reference"), "{err}");
}

#[tokio::test]
async fn wrong_or_missing_credentials_are_refused_without_leaking_them() {
    let registry = registry::basic();
    let image = format!("{}/fixtures/multiarch-oci:v1", registry.host);

    let (_dir, store) = creds_dir(registry, USER, "wrong-password-XYZ");
    let resolver = Resolver::new(common::settings(), store).unwrap();
    let err = resolver.resolve(&image).await.unwrap_err();
    let LookupError::Unauthorized { tried, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(
        tried.contains(".toml") && tried.ends_with("anonymous"),
        "{tried}"
    );
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("wrong-password-XYZ"), "{shown}");

    let resolver = Resolver::new(common::settings(), CredentialStore::default()).unwrap();
    let err = resolver.resolve(&image).await.unwrap_err();
    assert!(matches!(err, LookupError::Unauthorized { .. }), "{err:?}");

    // A Pod's own credential goes first; a rejected one falls through to the next.
    let (_dir, store) = creds_dir(registry, USER, PASSWORD);
    let resolver = Resolver::new(common::settings(), store).unwrap();
    let mut pod_secrets = CredentialStore::default();
    pod_secrets.add(
        &registry.host,
        Credential::new(USER, "also-wrong", "secret default/stale"),
    );
    // A credential for another registry is never sent here.
    pod_secrets.add(
        "ghcr.io",
        Credential::new(USER, PASSWORD, "secret default/ghcr"),
    );
    let found = resolver.resolve_with(&image, &pod_secrets).await.unwrap();
    assert!(
        found.fact.credentials.to_string().ends_with(".toml"),
        "{}",
        found.fact.credentials
    );
}

#[tokio::test]
async fn bearer_tokens_private_repositories_and_token_reuse() {
    let registry = registry::token();
    let token_server = registry.token.as_ref().unwrap();
    let digest = Pusher::for_mode(&registry.host, Mode::Token)
        .push("private/app", "multiarch-oci", "v1")
        .await;
    let image = format!("{}/private/app:v1", registry.host);

    // Anonymous: the token service grants nothing on private/, the registry refuses.
    let anonymous = Resolver::new(common::settings(), CredentialStore::default()).unwrap();
    let err = anonymous.resolve(&image).await.unwrap_err();
    assert!(matches!(err, LookupError::Unauthorized { .. }), "{err:?}");
    // Public repositories on the same registry work anonymously.
    anonymous
        .resolve(&format!("{}/fixtures/amd64-docker:v1", registry.host))
        .await
        .unwrap();

    // A token answer that carries only `access_token`.
    let resolver = Resolver::new(common::settings(), CredentialStore::default()).unwrap();
    let mut access_only = CredentialStore::default();
    access_only.add(
        &registry.host,
        Credential::new("accessuser", "accesspass", "test access_token user"),
    );
    let found = resolver.resolve_with(&image, &access_only).await.unwrap();
    assert_eq!(
        platforms(&found),
        ["linux/amd64", "linux/arm/v7", "linux/arm64"]
    );

    // Tokens are reused: a second image in the same repository costs no token request.
    let (_dir, store) = creds_dir(registry, "reuseuser", "reusepass");
    let resolver = Resolver::new(common::settings(), store).unwrap();
    resolver.resolve(&image).await.unwrap();
    assert_eq!(token_server.requests_by("reuseuser"), 1);
    resolver
        .resolve(&format!("{}/private/app@{digest}", registry.host))
        .await
        .unwrap();
    assert_eq!(
        token_server.requests_by("reuseuser"),
        1,
        "token was not reused"
    );
}

#[tokio::test]
async fn expired_tokens_are_renewed() {
    let registry = registry::token();
    let token_server = registry.token.as_ref().unwrap();
    let pusher = Pusher::for_mode(&registry.host, Mode::Token);
    for tag in ["v1", "v2"] {
        pusher.push("private/short", "amd64-docker", tag).await;
    }
    let (_dir, store) = creds_dir(registry, "shortuser", "shortpass");
    let resolver = Resolver::new(common::settings(), store).unwrap();
    resolver
        .resolve(&format!("{}/private/short:v1", registry.host))
        .await
        .unwrap();
    // Tokens for shortuser live 2 s; oci-client treats one as expired once the whole second
    // after `exp` has begun.
    assert_eq!(token_server.requests_by("shortuser"), 1);
    tokio::time::sleep(Duration::from_millis(3200)).await;
    // Another tag (the digest's answer is cached now): the registry is asked again.
    resolver
        .resolve(&format!("{}/private/short:v2", registry.host))
        .await
        .unwrap();
    assert_eq!(
        token_server.requests_by("shortuser"),
        2,
        "expired token was reused"
    );
}

#[tokio::test]
async fn tls_registry_needs_its_ca_and_plain_http_needs_listing() {
    let mut settings = common::settings();
    settings.transport.extra_roots_pem.clear();
    settings.transport.insecure_registries.clear();
    let resolver = Resolver::new(settings, CredentialStore::default()).unwrap();

    let err = resolver
        .resolve(&format!(
            "{}/fixtures/multiarch-oci:v1",
            registry::tls().host
        ))
        .await
        .unwrap_err();
    assert!(matches!(err, LookupError::Unreachable { .. }), "{err:?}");
    // The certificate problem is in the debug log only: an admission warning must not tell a
    // bad certificate from a closed port (that would make tolerable a port scanner).
    assert!(err.to_string().ends_with("connection failed"), "{err}");
    assert!(
        !err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );

    // A plain-http registry not listed in insecure_registries is spoken to over https: refused.
    let err = resolver
        .resolve(&format!(
            "{}/fixtures/multiarch-oci:v1",
            registry::plain().host
        ))
        .await
        .unwrap_err();
    assert!(matches!(err, LookupError::Unreachable { .. }), "{err:?}");
}

#[tokio::test]
async fn unreachable_registry_fails_fast() {
    let host = common::fake::closed_port();
    let mut settings = common::settings();
    settings.transport.insecure_registries.push(host.clone());
    // Fast means it waits for no timeout: every one the lookup has is a minute away, so a
    // lookup that waited for any would end as a Timeout, or after a minute. The refused
    // connection is the answer, whatever the machine's speed.
    let far = Duration::from_secs(60);
    settings.lookup_timeout = far;
    settings.transport.connect_timeout = far;
    settings.transport.read_timeout = far;
    let resolver = Resolver::new(settings, CredentialStore::default()).unwrap();
    let started = Instant::now();
    let err = resolver
        .resolve(&format!("{host}/app:v1"))
        .await
        .unwrap_err();
    assert!(matches!(err, LookupError::Unreachable { .. }), "{err:?}");
    assert!(err.to_string().contains(&host), "{err}");
    assert!(
        started.elapsed() < far,
        "waited {:?}, as long as a timeout",
        started.elapsed()
    );
}

#[tokio::test]
async fn hung_registry_is_abandoned_at_the_deadline() {
    let host = common::fake::hung_server();
    let mut settings = common::settings();
    settings.transport.insecure_registries.push(host.clone());
    // The bound the code guarantees: abandoned at `lookup_timeout` — the deadline the error
    // reports applying is the one configured here — not before it, and before anything else
    // would end it (the read timeout, here 30 s). How soon after the deadline is this
    // machine's speed, not asserted.
    let deadline = Duration::from_secs(2);
    let read_timeout = Duration::from_secs(30);
    settings.lookup_timeout = deadline;
    settings.transport.read_timeout = read_timeout;
    let resolver = Resolver::new(settings, CredentialStore::default()).unwrap();
    let started = Instant::now();
    let err = resolver
        .resolve(&format!("{host}/app:v1"))
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    match &err {
        LookupError::Timeout { after, .. } => assert_eq!(*after, deadline, "{err}"),
        other => panic!("not abandoned at a deadline: {other:?}"),
    }
    assert!(
        err.to_string().ends_with("did not finish within 2s"),
        "{err}"
    );
    assert!(
        elapsed >= deadline && elapsed < read_timeout,
        "deadline of {deadline:?} not honoured: {elapsed:?}"
    );
}

#[tokio::test]
async fn malformed_manifest_is_a_clear_error() {
    for (body, content_type) in [
        (&b"{\"schemaVersion\": 2, \"manifests\": [ not json"[..], fixtures::OCI_INDEX),
        (&b"<html>proxy error</html>"[..], "text/html"),
        (&b"{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\"manifests\":[{\"digest\":5}]}"[..], fixtures::OCI_INDEX),
    ] {
        let host = common::fake::manifest_server(body, content_type);
        let mut settings = common::settings();
        settings.transport.insecure_registries.push(host.clone());
        let resolver = Resolver::new(settings, CredentialStore::default()).unwrap();
        let err = resolver.resolve(&format!("{host}/app:v1")).await.unwrap_err();
        assert!(matches!(err, LookupError::Malformed { .. }), "{err:?}");
        assert!(err.to_string().contains("malformed"), "{err}");
    }
}

#[tokio::test]
async fn registry_request_counts() {
    let registry = registry::plain();
    let pusher = Pusher::for_mode(&registry.host, Mode::Plain);
    pusher.push("count/index", "multiarch-oci", "v1").await;
    pusher.push("count/single", "s390x-docker", "v1").await;
    pusher
        .push("count/concurrent", "multiarch-docker", "v1")
        .await;
    pusher
        .push("count/no-platform", "index-no-platform", "v1")
        .await;
    let resolver = Resolver::new(common::settings(), CredentialStore::default()).unwrap();

    // An index with platforms: one manifest GET.
    let index = format!("{}/count/index:v1", registry.host);
    resolver.resolve(&index).await.unwrap();
    assert_eq!(registry.requests_for("count/index").await, (1, 0));
    // Warm: nothing.
    for _ in 0..10 {
        resolver.resolve(&index).await.unwrap();
    }
    assert_eq!(registry.requests_for("count/index").await, (1, 0));

    // A single manifest: the manifest and its config blob.
    resolver
        .resolve(&format!("{}/count/single:v1", registry.host))
        .await
        .unwrap();
    assert_eq!(registry.requests_for("count/single").await, (1, 1));

    // An index without platforms: the index, each child, each child's config.
    resolver
        .resolve(&format!("{}/count/no-platform:v1", registry.host))
        .await
        .unwrap();
    assert_eq!(registry.requests_for("count/no-platform").await, (3, 2));

    // 50 concurrent cold lookups of one image: one request.
    let image = format!("{}/count/concurrent:v1", registry.host);
    let lookups = (0..50).map(|_| resolver.resolve(&image));
    let results = futures_util::future::join_all(lookups).await;
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(registry.requests_for("count/concurrent").await, (1, 0));
}

#[tokio::test]
async fn mirror_first_then_origin() {
    let registry = registry::plain();
    let closed = common::fake::closed_port();
    let mut settings = common::settings();
    settings.transport.insecure_registries.push(closed.clone());

    // The origin is down; the mirror answers.
    settings
        .mirrors
        .insert(closed.clone(), registry.host.clone());
    // The mirror is down; the origin answers.
    settings
        .mirrors
        .insert(registry.host.clone(), closed.clone());
    let resolver = Resolver::new(settings, CredentialStore::default()).unwrap();

    let via_mirror = resolver
        .resolve(&format!("{closed}/fixtures/multiarch-oci:v1"))
        .await
        .unwrap();
    assert_eq!(via_mirror.served_by, registry.host);
    assert_eq!(
        platforms(&via_mirror),
        ["linux/amd64", "linux/arm/v7", "linux/arm64"]
    );

    let via_origin = resolver
        .resolve(&format!("{}/fixtures/multiarch-oci:v1", registry.host))
        .await
        .unwrap();
    assert_eq!(via_origin.served_by, registry.host);
}

#[tokio::test]
async fn docker_hub_images_through_a_mirror() {
    // `nginx` means docker.io/library/nginx:latest; a mirror serves it without the internet.
    let registry = registry::plain();
    Pusher::for_mode(&registry.host, Mode::Plain)
        .push("library/nginx", "multiarch-docker", "latest")
        .await;
    let mut settings = common::settings();
    settings
        .mirrors
        .insert("docker.io".into(), registry.host.clone());
    let resolver = Resolver::new(settings, CredentialStore::default()).unwrap();
    let found = resolver.resolve("nginx").await.unwrap();
    assert_eq!(found.served_by, registry.host);
    assert_eq!(
        platforms(&found),
        [
            "linux/amd64",
            "linux/arm64",
            "linux/ppc64le",
            "windows/amd64"
        ]
    );
}

#[tokio::test]
async fn credentials_never_go_to_a_plain_http_token_service_unless_listed() {
    let registry = registry::token();
    let mut settings = common::settings();
    settings
        .transport
        .insecure_registries
        .retain(|h| *h != registry.token_host());
    let (_dir, store) = creds_dir(registry, "leakcheck", "leak-check-pass");
    let resolver = Resolver::new(settings, store).unwrap();
    let err = resolver
        .resolve(&format!("{}/fixtures/amd64-docker:v1", registry.host))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("refusing to send credentials"),
        "{err}"
    );
    assert_eq!(registry.token.as_ref().unwrap().requests_by("leakcheck"), 0);
}

#[tokio::test]
async fn token_service_down_is_a_clear_error() {
    // A token-auth registry whose realm is a closed port.
    let closed = common::fake::closed_port();
    let registry = Registry::start_with_realm(Mode::Token, Some(format!("http://{closed}/token")));
    let mut settings = common::settings();
    settings.transport.insecure_registries.push(closed);
    let resolver = Resolver::new(settings, CredentialStore::default()).unwrap();
    let err = resolver
        .resolve(&format!("{}/fixtures/amd64-docker:v1", registry.host))
        .await
        .unwrap_err();
    assert!(matches!(err, LookupError::Unreachable { .. }), "{err:?}");
    assert!(err.to_string().contains("token service"), "{err}");
}
