//! Docker credential helpers (`credHelpers`, `credsStore` in `docker_config_path`) in front of
//! real registries (htpasswd Basic and Bearer token): a helper written for the tests speaks the
//! real protocol (`docker-credential-<name> get`, the server URL on stdin, `{"ServerURL",
//! "Username", "Secret"}` on stdout) and counts its runs.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use common::plugins::{basic_image, credential_file, tried, Provider, Providers};
use common::registry::{self, Mode, PASSWORD, USER};
use serde_json::json;
use tolerable::registry::CredentialStore;

fn auth(user: &str, password: &str) -> serde_json::Value {
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    json!({ "auth": encoded })
}

#[tokio::test]
async fn cred_helpers_and_the_creds_store_open_private_images() {
    let (basic, token) = (&registry::basic().host, &registry::token().host);
    common::fixtures::Pusher::for_mode(token, Mode::Token)
        .push("private/helped", "arm64-oci", "v1")
        .await;
    let plugins = Providers::new(Vec::new())
        .helper("ecr-login", json!({"username": USER, "secret": PASSWORD}))
        .helper("store", json!({"username": USER, "secret": PASSWORD}))
        .docker_config(json!({
            // Docker's placeholders for registries whose credentials a helper holds.
            "auths": {basic: {}, token: {}},
            "credHelpers": {basic: "ecr-login"},
            "credsStore": "store",
        }));
    let resolver = plugins.resolver(&[]);
    let found = resolver.resolve(&basic_image("arm64-oci")).await.unwrap();
    assert_eq!(
        found.fact.credentials.to_string(),
        "credential helper docker-credential-ecr-login"
    );
    let found = resolver
        .resolve(&format!("{token}/private/helped:v1"))
        .await
        .unwrap();
    assert_eq!(
        found.fact.credentials.to_string(),
        "credential helper docker-credential-store"
    );
    // Asked as Docker asks: the registry's host and port on stdin.
    assert_eq!(
        plugins.runs("docker-credential-ecr-login"),
        [basic.to_owned()]
    );
    assert_eq!(plugins.runs("docker-credential-store"), [token.to_owned()]);
}

#[tokio::test]
async fn a_registrys_own_helper_replaces_its_auths_entry_and_the_store_comes_after_it() {
    let basic = &registry::basic().host;
    // credHelpers: the auths entry (right) is not used, as Docker does not use it.
    let plugins = Providers::new(Vec::new())
        .helper("own", json!({"username": USER, "secret": "wrong"}))
        .docker_config(json!({
            "auths": {basic: auth(USER, PASSWORD)},
            "credHelpers": {basic: "own"},
        }));
    let refused = plugins
        .resolver(&[])
        .resolve(&basic_image("amd64-docker"))
        .await
        .unwrap_err();
    assert_eq!(
        tried(&refused),
        "credential helper docker-credential-own, anonymous"
    );

    // credsStore: the auths entry first; the store is not run when it opens the image.
    let plugins = Providers::new(Vec::new())
        .helper("store", json!({"username": USER, "secret": PASSWORD}))
        .docker_config(json!({
            "auths": {basic: auth(USER, PASSWORD)},
            "credsStore": "store",
        }));
    let found = plugins
        .resolver(&[])
        .resolve(&basic_image("amd64-docker"))
        .await
        .unwrap();
    assert!(
        found
            .fact
            .credentials
            .to_string()
            .contains("docker-config.json"),
        "{}",
        found.fact.credentials.to_string()
    );
    assert!(plugins.runs("docker-credential-store").is_empty());
}

#[tokio::test]
async fn a_helper_without_credentials_is_asked_again_only_after_a_while() {
    let plugins = Providers::new(Vec::new())
        .helper("empty", json!({"servers": ["elsewhere.example"]}))
        .docker_config(json!({"credsStore": "empty"}));
    let resolver = plugins.resolver(&[]);
    for name in ["arm64-oci", "amd64-docker"] {
        let refused = resolver.resolve(&basic_image(name)).await.unwrap_err();
        assert_eq!(
            tried(&refused),
            "credential helper docker-credential-empty (none for this image), anonymous"
        );
    }
    assert_eq!(plugins.runs("docker-credential-empty").len(), 1);
}

#[tokio::test]
async fn failed_runs_are_reported_cached_briefly_and_never_show_the_secret() {
    let basic = &registry::basic().host;
    for (mode, expected) in [
        ("fail", "credential helper docker-credential-broken failed: exit status 1: error getting credentials"),
        ("invalid-json", "credential helper docker-credential-broken failed: printed no {\"Username\", \"Secret\"} object"),
        ("identity-token", "answered an identity token, which tolerable cannot exchange"),
    ] {
        let plugins = Providers::new(Vec::new())
            .helper("broken", json!({"mode": mode, "username": USER, "secret": PASSWORD}))
            .docker_config(json!({"credHelpers": {basic: "broken"}}));
        let resolver = plugins.resolver(&[]);
        for name in ["arm64-oci", "amd64-docker"] {
            let shown = resolver.resolve(&basic_image(name)).await.unwrap_err().to_string();
            assert!(shown.contains(expected), "{mode}: {shown}");
            assert!(!shown.contains(PASSWORD), "{mode}: {shown}");
        }
        assert_eq!(plugins.runs("docker-credential-broken").len(), 1, "{mode}");
    }
}

#[tokio::test]
async fn concurrent_lookups_share_one_run() {
    let basic = &registry::basic().host;
    let plugins = Providers::new(Vec::new())
        .helper(
            "slow",
            json!({"username": USER, "secret": PASSWORD, "delay": 0.3}),
        )
        .docker_config(json!({"credHelpers": {basic: "slow"}}));
    let resolver = Arc::new(plugins.resolver(&[]));
    let lookups = [
        "multiarch-oci",
        "buildx-single",
        "s390x-docker",
        "windows-mixed",
    ]
    .map(|name| {
        let resolver = resolver.clone();
        tokio::spawn(async move { resolver.resolve(&basic_image(name)).await })
    });
    for lookup in lookups {
        lookup.await.unwrap().unwrap();
    }
    assert_eq!(plugins.runs("docker-credential-slow").len(), 1);
}

#[tokio::test]
async fn a_hanging_helper_is_killed_inside_the_budget_and_the_admission_answered_in_time() {
    let basic = &registry::basic().host;
    let pid_file = tempfile::NamedTempFile::new().unwrap();
    let plugins = Providers::new(Vec::new())
        .helper(
            "hanging",
            json!({"mode": "hang", "pid_file": pid_file.path().display().to_string()}),
        )
        .docker_config(json!({"credHelpers": {basic: "hanging"}}));
    let mut config = plugins.config(&[]);
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
    let warnings = common::webhook::warnings(&response).join("\n");
    assert!(
        warnings.contains("credential helper docker-credential-hanging failed: did not answer"),
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
    common::plugins::hung_plugin_killed_and_counted(
        &server,
        pid_file.path(),
        "docker-credential-hanging",
    )
    .await;
}

/// The whole order, each source refused in turn until the last one opens the image: the Pod's
/// pull secret, a credential provider, the credential file, the Docker config's auths entry, its
/// credential store, anonymous.
#[tokio::test]
async fn every_source_in_order_until_one_is_accepted() {
    let basic = &registry::basic().host;
    let files = credential_file(basic, USER, "wrong-file");
    let files = files.path().to_str().unwrap();
    let mut pod = CredentialStore::default();
    pod.add(
        basic,
        tolerable::registry::Credential::new(USER, "wrong-pod", "secret team-a/regcred"),
    );
    let with_store_secret = |secret: &str| {
        Providers::new(vec![
            Provider::new("cloud", &[basic]).answering(USER, "wrong-provider")
        ])
        .helper("store", json!({"username": USER, "secret": secret}))
        .docker_config(json!({
            "auths": {basic: auth(USER, "wrong-auths")},
            "credsStore": "store",
        }))
    };
    let image = basic_image("multiarch-docker");

    let plugins = with_store_secret("wrong-store");
    let refused = plugins
        .resolver(&[("TOLERABLE_CREDENTIALS__FILES_PATH", files)])
        .resolve_with(&image, &pod)
        .await
        .unwrap_err();
    let docker_config = plugins.dir.path().join("docker-config.json");
    assert_eq!(
        tried(&refused),
        format!(
            "secret team-a/regcred, credential provider cloud, {files}/{}.toml, {} ({basic}), \
             credential helper docker-credential-store, anonymous",
            basic.replace(':', "_"),
            docker_config.display()
        )
    );

    let plugins = with_store_secret(PASSWORD);
    let found = plugins
        .resolver(&[("TOLERABLE_CREDENTIALS__FILES_PATH", files)])
        .resolve_with(&image, &pod)
        .await
        .unwrap();
    assert_eq!(
        found.fact.credentials.to_string(),
        "credential helper docker-credential-store"
    );
    assert_eq!(plugins.runs("cloud").len(), 1);
    assert_eq!(plugins.runs("docker-credential-store").len(), 1);
}
