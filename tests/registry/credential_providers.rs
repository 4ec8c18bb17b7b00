//! Kubelet credential provider plugins in front of real registries (htpasswd Basic and Bearer
//! token): a plugin written for the tests speaks the real protocol (a CredentialProviderRequest
//! on stdin, a CredentialProviderResponse on stdout), configured by a kubelet
//! CredentialProviderConfig, and counts its runs.

use crate::common;

use std::sync::Arc;

use base64::Engine as _;
use std::time::Duration;

use common::plugins::{basic_image, credential_file, tried, Provider, Providers};
use common::registry::{self, Mode, PASSWORD, USER};
use tolerable::registry::CredentialStore;

#[tokio::test]
async fn a_providers_credentials_open_private_images_on_htpasswd_and_token_registries() {
    let (basic, token) = (registry::basic(), registry::token());
    common::fixtures::Pusher::for_mode(&token.host, Mode::Token)
        .push("private/provided", "multiarch-oci", "v1")
        .await;
    let providers = Providers::new(vec![Provider::new(
        "registry-login",
        &[&basic.host, &token.host],
    )
    .answering(USER, PASSWORD)]);
    let resolver = providers.resolver(&[]);

    let found = resolver.resolve(&basic_image("arm64-oci")).await.unwrap();
    assert_eq!(
        found.fact.credentials.to_string(),
        "credential provider registry-login"
    );
    let tokens_before = token.token.as_ref().unwrap().requests_by(USER);
    let private = format!("{}/private/provided:v1", token.host);
    let found = resolver.resolve(&private).await.unwrap();
    assert_eq!(
        found.fact.credentials.to_string(),
        "credential provider registry-login"
    );
    assert!(token.token.as_ref().unwrap().requests_by(USER) > tokens_before);
    // Asked as the kubelet asks: the repository, without tag or digest.
    assert_eq!(
        providers.runs("registry-login"),
        [
            format!("{}/fixtures/arm64-oci", basic.host),
            format!("{}/private/provided", token.host),
        ]
    );

    // Without the provider, neither opens.
    let without = Providers::new(Vec::new()).resolver(&[]);
    let refused = without
        .resolve(&basic_image("arm64-oci"))
        .await
        .unwrap_err();
    assert_eq!(tried(&refused), "anonymous");
    without.resolve(&private).await.unwrap_err();
}

#[tokio::test]
async fn the_kubelets_matching_rules_choose_the_plugins() {
    let basic = &registry::basic().host;
    let port = basic.rsplit_once(':').unwrap().1;
    let wrong = |name: &str, pattern: &str| {
        // Credentials the registry refuses, so that every matching provider is tried in turn.
        Provider::new(name, &[pattern]).answering(USER, "not-the-password")
    };
    let providers = Providers::new(vec![
        wrong("exact", basic),
        wrong("other-port", "127.0.0.1:1"),
        wrong("no-port", "127.0.0.1"),
        wrong("label-globs", &format!("*.*.*.*:{port}")),
        wrong("too-few-labels", &format!("*.*.*:{port}")),
        wrong("one-glob-per-label", &format!("*.1:{port}")),
        wrong("path-prefix", &format!("{basic}/fixtures/arm")),
        wrong("other-path", &format!("{basic}/private")),
        wrong("class-glob", &format!("12[0-7].0.0.[1]:{port}")),
    ]);
    let resolver = providers.resolver(&[]);
    let refused = resolver
        .resolve(&basic_image("arm64-oci"))
        .await
        .unwrap_err();
    assert_eq!(
        tried(&refused),
        "credential provider exact, credential provider label-globs, credential provider \
         path-prefix, credential provider class-glob, anonymous"
    );
    let refused = resolver
        .resolve(&basic_image("amd64-docker"))
        .await
        .unwrap_err();
    assert!(!tried(&refused).contains("path-prefix"), "{refused}");
    for never in [
        "other-port",
        "no-port",
        "too-few-labels",
        "one-glob-per-label",
        "other-path",
    ] {
        assert!(providers.runs(never).is_empty(), "{never} ran");
    }
    assert_eq!(providers.runs("path-prefix").len(), 1);
}

/// Runs of a provider answering `key_type` with `duration` (and `default`) while
/// `images` are looked up one after the other.
async fn runs_for(
    key_type: &str,
    duration: Option<&str>,
    default: &str,
    images: &[String],
) -> usize {
    let (basic, token) = (&registry::basic().host, &registry::token().host);
    let mut provider = Provider::new("counted", &[basic, token])
        .answering(USER, PASSWORD)
        .default_cache_duration(default)
        .env("PLUGIN_CACHE_KEY_TYPE", key_type)
        .env("PLUGIN_AUTH_KEY", &format!("{basic},{token}"));
    if let Some(duration) = duration {
        provider = provider.env("PLUGIN_CACHE_DURATION", duration);
    }
    let providers = Providers::new(vec![provider]);
    let resolver = providers.resolver(&[]);
    for image in images {
        resolver.resolve(image).await.unwrap();
    }
    providers.runs("counted").len()
}

#[tokio::test]
async fn answers_are_cached_by_their_key_type_for_their_duration() {
    let token = registry::token();
    common::fixtures::Pusher::for_mode(&token.host, Mode::Token)
        .push("private/cached", "arm64-oci", "v1")
        .await;
    let digest = Providers::new(vec![
        Provider::new("x", &[&registry::basic().host]).answering(USER, PASSWORD)
    ])
    .resolver(&[])
    .resolve(&basic_image("multiarch-oci"))
    .await
    .unwrap()
    .digest
    .clone();
    // One repository by digest and by tag (two lookups), another repository, another registry.
    // The digest first: a tag's answer is also kept under its digest, so the other order would
    // answer the digest from the lookup cache without asking any credential source.
    let same_repository = [
        format!("{}/fixtures/multiarch-oci@{digest}", registry::basic().host),
        basic_image("multiarch-oci"),
    ];
    let other_repository = basic_image("amd64-docker");
    let other_registry = format!("{}/private/cached:v1", token.host);
    let all: Vec<String> = same_repository
        .iter()
        .cloned()
        .chain([other_repository, other_registry])
        .collect();
    assert_eq!(runs_for("Image", Some("1h"), "0s", &all).await, 3);
    assert_eq!(runs_for("Registry", Some("1h"), "0s", &all).await, 2);
    assert_eq!(runs_for("Global", Some("10m0s"), "0s", &all).await, 1);
    // cacheDuration 0: not cached; absent: the provider's defaultCacheDuration.
    assert_eq!(runs_for("Global", Some("0s"), "1h", &all).await, 4);
    assert_eq!(runs_for("Global", None, "0s", &all).await, 4);
    assert_eq!(runs_for("Global", None, "1h", &all).await, 1);
}

#[tokio::test]
async fn concurrent_lookups_share_one_run() {
    let providers = Providers::new(vec![Provider::new("slow", &[&registry::basic().host])
        .answering(USER, PASSWORD)
        .env("PLUGIN_DELAY", "0.3")]);
    let resolver = Arc::new(providers.resolver(&[]));
    let images = [
        "multiarch-oci",
        "buildx-single",
        "multiarch-docker",
        "s390x-docker",
        "amd64-docker",
        "arm64-oci",
        "windows-mixed",
        "nested-index",
    ];
    let lookups = images.map(|name| {
        let resolver = resolver.clone();
        tokio::spawn(async move { resolver.resolve(&basic_image(name)).await })
    });
    for lookup in lookups {
        let found = lookup.await.unwrap().unwrap();
        assert_eq!(
            found.fact.credentials.to_string(),
            "credential provider slow"
        );
    }
    assert_eq!(providers.runs("slow").len(), 1);
}

#[tokio::test]
async fn a_failed_run_is_reported_cached_briefly_and_the_next_source_is_tried() {
    let basic = &registry::basic().host;
    let version_error = "answered apiVersion \"credentialprovider.kubelet.k8s.io/v1beta1\", not \
                         credentialprovider.kubelet.k8s.io/v1 (the provider's apiVersion)";
    for (mode, expected) in [
        ("fail", "credential provider broken failed: exit status 3: "),
        (
            "invalid-json",
            "credential provider broken failed: printed invalid JSON (line 1, column",
        ),
        ("wrong-version", version_error),
    ] {
        let providers = Providers::new(vec![Provider::new("broken", &[basic])
            .answering(USER, PASSWORD)
            .env("PLUGIN_MODE", mode)]);
        let refused = providers
            .resolver(&[])
            .resolve(&basic_image("arm64-oci"))
            .await
            .unwrap_err();
        let shown = refused.to_string();
        assert!(shown.contains(expected), "{mode}: {shown}");
        assert!(shown.ends_with(", anonymous)"), "{mode}: {shown}");
        assert!(!shown.contains(PASSWORD), "{mode}: {shown}");
        if mode == "fail" {
            assert!(
                shown.contains("AccessDenied (password=<redacted>)"),
                "{shown}"
            );
        }

        // With a credential file for the registry, the file opens it; the failure is cached.
        let files = credential_file(basic, USER, PASSWORD);
        let files = files.path().to_str().unwrap();
        let providers = Providers::new(vec![Provider::new("broken", &[basic])
            .answering(USER, PASSWORD)
            .env("PLUGIN_MODE", mode)]);
        let resolver = providers.resolver(&[("TOLERABLE_CREDENTIALS__FILES_PATH", files)]);
        for name in ["arm64-oci", "amd64-docker"] {
            let found = resolver.resolve(&basic_image(name)).await.unwrap();
            assert!(
                found.fact.credentials.to_string().starts_with(files),
                "{}",
                found.fact.credentials.to_string()
            );
        }
        assert_eq!(providers.runs("broken").len(), 1, "{mode}");
    }
}

#[tokio::test]
async fn sources_are_tried_in_order_and_a_refused_one_gives_way_to_the_next() {
    let basic = &registry::basic().host;
    let image = basic_image("s390x-docker");
    let pod_secret = |password: &str| {
        let mut store = CredentialStore::default();
        store.add(
            basic,
            tolerable::registry::Credential::new(USER, password, "secret team-a/regcred"),
        );
        store
    };
    let files = credential_file(basic, USER, PASSWORD);
    let files = files.path().to_str().unwrap();
    let with = |password: &str| {
        Providers::new(vec![
            Provider::new("cloud", &[basic]).answering(USER, password)
        ])
    };

    // The Pod's pull secret first: the plugin is not even run.
    let providers = with(PASSWORD);
    let found = providers
        .resolver(&[("TOLERABLE_CREDENTIALS__FILES_PATH", files)])
        .resolve_with(&image, &pod_secret(PASSWORD))
        .await
        .unwrap();
    assert_eq!(found.fact.credentials.to_string(), "secret team-a/regcred");
    assert!(providers.runs("cloud").is_empty());

    // A refused pull secret: the provider, before the credential files.
    let found = providers
        .resolver(&[("TOLERABLE_CREDENTIALS__FILES_PATH", files)])
        .resolve_with(&image, &pod_secret("wrong"))
        .await
        .unwrap();
    assert_eq!(
        found.fact.credentials.to_string(),
        "credential provider cloud"
    );

    // A refused provider: the credential files.
    let providers = with("wrong");
    let found = providers
        .resolver(&[("TOLERABLE_CREDENTIALS__FILES_PATH", files)])
        .resolve_with(&image, &pod_secret("wrong"))
        .await
        .unwrap();
    assert!(found.fact.credentials.to_string().starts_with(files));
    let refused = providers
        .resolver(&[])
        .resolve_with(&image, &pod_secret("wrong"))
        .await
        .unwrap_err();
    assert_eq!(
        tried(&refused),
        "secret team-a/regcred, credential provider cloud, anonymous"
    );
}

#[tokio::test]
async fn a_hanging_plugin_is_killed_inside_the_budget_and_the_admission_answered_in_time() {
    let basic = &registry::basic().host;
    let pid_file = tempfile::NamedTempFile::new().unwrap();
    let providers = Providers::new(vec![Provider::new("hanging", &[basic])
        .answering(USER, PASSWORD)
        .env("PLUGIN_MODE", "hang")
        .arg(&format!("--pid-file={}", pid_file.path().display()))]);
    let mut config = providers.config(&[]);
    config.policy = common::webhook::policy();
    config.read_pull_secrets = false;
    config.watch_nodes = false;
    let server = common::webhook::TestServer::start_configured(config, None).await;
    let request = common::webhook::recorded("pod-create-simple.v1.json", basic);
    // The bound the code guarantees is the API server's own timeout: lookups (and the plugin
    // runs in them) get the timeout minus a fifth, so at 10 s the answer has 2 s to be encoded
    // and sent, a margin no shared machine's scheduling eats (at 2 s it had 0.4 s).
    let api_timeout = Duration::from_secs(10);
    let (response, took) = common::webhook::admit(&server, &request, api_timeout).await;
    assert!(
        took < api_timeout,
        "answered after {took:?}, past the API server's {api_timeout:?}"
    );
    assert_eq!(response["allowed"], true);
    let warnings = common::webhook::warnings(&response).join("\n");
    assert!(
        warnings.contains("credential provider hanging failed: did not answer within")
            && warnings.contains("killed"),
        "{warnings}"
    );
    // Killed inside the lookups' budget (the API server's timeout minus a fifth), by the time
    // the plugin was given as the warning states it.
    let waited = common::plugins::killed_after(&warnings);
    let budget = api_timeout - api_timeout / 5;
    assert!(
        waited > Duration::ZERO && waited <= budget,
        "killed after {waited:?}, budget {budget:?}"
    );
    common::plugins::hung_plugin_killed_and_counted(&server, pid_file.path(), "hanging").await;
}

#[tokio::test]
async fn runs_are_counted_and_no_password_reaches_a_warning_or_a_metric() {
    let basic = &registry::basic().host;
    let providers = Providers::new(vec![
        Provider::new("careless", &[&format!("{basic}/fixtures/arm64-oci")])
            .answering(USER, PASSWORD)
            .env("PLUGIN_MODE", "fail"),
        Provider::new("working", &[&format!("{basic}/fixtures/amd64-docker")])
            .answering(USER, PASSWORD),
    ]);
    let mut config = providers.config(&[]);
    config.policy = common::webhook::policy();
    config.read_pull_secrets = false;
    config.watch_nodes = false;
    let server = common::webhook::TestServer::start_configured(config, None).await;
    let mut seen = String::new();
    for image in [basic_image("arm64-oci"), basic_image("amd64-docker")] {
        let mut request = common::webhook::recorded("pod-create-simple.v1.json", basic);
        request["request"]["object"]["spec"]["containers"][0]["image"] = image.into();
        let (response, _) =
            common::webhook::admit(&server, &request, Duration::from_secs(10)).await;
        seen.push_str(&response.to_string());
        if let Some(patch) = response["patch"].as_str() {
            let patch = base64::engine::general_purpose::STANDARD
                .decode(patch)
                .unwrap();
            seen.push_str(&String::from_utf8(patch).unwrap());
        }
    }
    assert!(
        seen.contains("credential provider careless failed: exit status 3"),
        "{seen}"
    );
    // The decision annotation of the second Pod names the provider that opened its image.
    assert!(
        seen.contains("credentials from credential provider working"),
        "{seen}"
    );
    let metrics = common::webhook::metrics_text(&server).await;
    for expected in [
        "tolerable_credential_plugin_runs_total{provider=\"careless\",result=\"failed\"} 1",
        "tolerable_credential_plugin_runs_total{provider=\"working\",result=\"ok\"} 1",
        "tolerable_credential_plugin_runs_total{provider=\"working\",result=\"timeout\"} 0",
        "tolerable_credential_plugin_duration_seconds_count{provider=\"working\"} 1",
    ] {
        assert!(metrics.contains(expected), "{expected}:\n{metrics}");
    }
    for text in [&seen, &metrics] {
        assert!(!text.contains(PASSWORD), "{text}");
    }
}

/// With Bearer tokens, the token service refuses the provider's credentials: the next source
/// (the credential file) gets the token.
#[tokio::test]
async fn a_token_service_refusing_a_providers_credentials_gives_way_to_the_next_source() {
    let token = registry::token();
    common::fixtures::Pusher::for_mode(&token.host, Mode::Token)
        .push("private/refused", "s390x-docker", "v1")
        .await;
    let providers = Providers::new(vec![
        Provider::new("cloud", &[&token.host]).answering(USER, "not-the-password")
    ]);
    let files = credential_file(&token.host, USER, PASSWORD);
    let files = files.path().to_str().unwrap();
    let image = format!("{}/private/refused:v1", token.host);
    let found = providers
        .resolver(&[("TOLERABLE_CREDENTIALS__FILES_PATH", files)])
        .resolve(&image)
        .await
        .unwrap();
    assert!(
        found.fact.credentials.to_string().starts_with(files),
        "{}",
        found.fact.credentials.to_string()
    );
    assert_eq!(providers.runs("cloud").len(), 1);
    let refused = providers.resolver(&[]).resolve(&image).await.unwrap_err();
    assert_eq!(tried(&refused), "credential provider cloud, anonymous");
}
