//! `tolerable inspect`, run as the operator runs it: the real binary, a config file, the
//! `TOLERABLE_*` environment, real registries.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use common::registry::{self, PASSWORD, USER};

/// Runs the binary with a config file that trusts the test CA and the given extra environment.
fn inspect(args: &[&str], env: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &common::certs::ca().ca_pem).unwrap();
    let config = dir.path().join("tolerable.toml");
    std::fs::write(
        &config,
        format!("registry_ca_path = {:?}\nlookup_timeout = \"3s\"\n", ca),
    )
    .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_tolerable"));
    command
        .arg("inspect")
        .args(["--config", config.to_str().unwrap()])
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("TOLERABLE_REGISTRY__INSECURE", &registry::plain().host);
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().unwrap()
}

#[test]
fn json_output_one_object_per_argument_in_order() {
    let plain = registry::plain();
    let tls = registry::tls();
    let good = format!("{}/fixtures/multiarch-oci:v1", plain.host);
    let single = format!("{}/fixtures/arm64-oci:v1", tls.host);
    let missing = format!("{}/fixtures/multiarch-oci:nope", plain.host);
    let out = inspect(
        &["--json", &good, "not a reference", &single, &missing],
        &[],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let items: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(items.len(), 4);

    assert_eq!(items[0]["image"], good);
    assert_eq!(items[0]["reference"], good);
    assert_eq!(items[0]["mediaType"], common::fixtures::OCI_INDEX);
    assert!(items[0]["digest"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(
        items[0]["platforms"],
        serde_json::json!([
            {"os": "linux", "architecture": "amd64"},
            {"os": "linux", "architecture": "arm", "variant": "v7"},
            {"os": "linux", "architecture": "arm64"},
        ])
    );
    assert_eq!(items[1]["image"], "not a reference");
    assert!(items[1]["error"]
        .as_str()
        .unwrap()
        .contains("invalid image reference"));
    assert_eq!(
        items[2]["platforms"],
        serde_json::json!([{"os": "linux", "architecture": "arm64"}])
    );
    assert_eq!(items[2]["mediaType"], common::fixtures::OCI_MANIFEST);
    assert!(items[3]["error"].as_str().unwrap().contains("not found"));
    assert!(items[3].get("platforms").is_none());
}

#[test]
fn human_output_and_success_status() {
    let image = format!("{}/fixtures/multiarch-docker:v1", registry::plain().host);
    let out = inspect(&[&image], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with(&image), "{text}");
    assert!(text.contains("digest:     sha256:"), "{text}");
    assert!(text.contains(common::fixtures::DOCKER_LIST), "{text}");
    assert!(
        text.contains("platforms:  linux/amd64, linux/arm64, linux/ppc64le, windows/amd64"),
        "{text}"
    );
}

/// `Authorization: Basic` for the test registry's user: base64("testuser:testpass").
const BASIC_AUTH: &str = "dGVzdHVzZXI6dGVzdHBhc3M=";

#[test]
fn credentials_from_files_and_docker_config_never_printed() {
    let basic = registry::basic();
    let image = format!("{}/fixtures/s390x-docker:v1", basic.host);
    let dir = tempfile::tempdir().unwrap();

    // Per-registry credential file.
    let creds = dir.path().join("creds");
    std::fs::create_dir(&creds).unwrap();
    write_credential_file(&creds, &basic.host, USER, PASSWORD);
    let out = inspect_with_credential_files(&[&image], &creds);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    the_image_was_read_and_no_credential_shown(&out);

    // A docker config.json (.dockerconfigjson format).
    let docker_config = dir.path().join("config.json");
    std::fs::write(
        &docker_config,
        format!(
            r#"{{"auths":{{"{}":{{"auth":"{BASIC_AUTH}"}}}}}}"#,
            basic.host
        ),
    )
    .unwrap();
    // Logging at trace as for the credential files, so a leak of the config's `auth` would show.
    let out = inspect(
        &[&image],
        &[
            (
                "TOLERABLE_CREDENTIALS__DOCKER_CONFIG_PATH",
                docker_config.to_str().unwrap(),
            ),
            ("TOLERABLE_LOG__LEVEL", "trace"),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    the_image_was_read_and_no_credential_shown(&out);

    // Wrong credentials: a clear error without the secret.
    write_credential_file(&creds, &basic.host, "testuser", "not-the-password-123");
    let out = inspect_with_credential_files(&["--json", &image], &creds);
    assert_eq!(out.status.code(), Some(1));
    let items: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        items[0]["error"]
            .as_str()
            .unwrap()
            .contains("refused access"),
        "{items:?}"
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !all.contains("not-the-password-123"),
        "secret leaked:\n{all}"
    );
}

/// The per-registry credential file for `host` in `dir` (`host_port.toml`).
fn write_credential_file(dir: &Path, host: &str, user: &str, secret: &str) {
    std::fs::write(
        dir.join(format!("{}.toml", host.replace(':', "_"))),
        format!("user = \"{user}\"\nsecret = \"{secret}\"\n"),
    )
    .unwrap();
}

/// `inspect` with the credential files in `dir`, logging at trace so a leak would show.
fn inspect_with_credential_files(args: &[&str], dir: &Path) -> Output {
    inspect(
        args,
        &[
            ("TOLERABLE_CREDENTIALS__FILES_PATH", dir.to_str().unwrap()),
            ("TOLERABLE_LOG__LEVEL", "trace"),
        ],
    )
}

/// The s390x image's platform was printed, the trace log was written, and neither shows the
/// password or the Authorization header made of it.
fn the_image_was_read_and_no_credential_shown(out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("linux/s390x"), "{stdout}");
    assert!(
        stderr.len() > 100,
        "trace logging produced nothing: {stderr}"
    );
    for shown in [&stdout, &stderr] {
        assert!(!shown.contains(PASSWORD), "password leaked:\n{shown}");
        assert!(
            !shown.contains(BASIC_AUTH),
            "Authorization leaked:\n{shown}"
        );
    }
}

#[test]
fn bearer_tokens_never_printed() {
    let token = registry::token();
    let image = format!("{}/fixtures/multiarch-oci:v1", token.host);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path()
            .join(format!("{}.toml", token.host.replace(':', "_"))),
        format!("user = \"{USER}\"\nsecret = \"{PASSWORD}\"\n"),
    )
    .unwrap();
    let insecure = format!("{},{}", registry::plain().host, token.token_host());
    let out = inspect(
        &[&image],
        &[
            (
                "TOLERABLE_CREDENTIALS__FILES_PATH",
                dir.path().to_str().unwrap(),
            ),
            ("TOLERABLE_LOG__LEVEL", "trace"),
            ("TOLERABLE_REGISTRY__INSECURE", &insecure),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Every JWT starts with the base64 of `{"`: eyJ.
    assert!(!all.contains("eyJ"), "token leaked:\n{all}");
    assert!(!all.contains(PASSWORD), "password leaked:\n{all}");
}

#[test]
fn bad_config_refuses_to_start_naming_the_key() {
    let out = inspect(
        &["nginx"],
        &[("TOLERABLE_REGISTRY__LOOKUP_TIMEOUT", "forever")],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("lookup_timeout") && stderr.contains("forever"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

/// `--verify` reads each platform's image config: an index that claims arm64 for an amd64
/// image is reported, and fails the exit status; an honest one passes.
#[tokio::test]
async fn verify_reports_an_index_that_mislabels_a_platform() {
    let host = registry::plain().host.clone();
    common::fixtures::Pusher::for_mode(&host, registry::Mode::Plain)
        .push("verify/mislabelled", "mislabelled", "v1")
        .await;
    let mislabelled = format!("{host}/verify/mislabelled:v1");
    let honest = format!("{host}/fixtures/multiarch-oci:v1");
    let (text_out, json_out) = tokio::task::spawn_blocking({
        let (mislabelled, honest) = (mislabelled.clone(), honest.clone());
        move || {
            (
                inspect(&["--verify", &mislabelled], &[]),
                inspect(&["--verify", "--json", &mislabelled, &honest], &[]),
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(text_out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&text_out.stdout);
    assert!(
        text.contains(
            "verified:   linux/amd64 ok, linux/arm64 MISLABELLED: its config says linux/amd64"
        ),
        "{text}"
    );
    let items: serde_json::Value = serde_json::from_slice(&json_out.stdout).unwrap();
    assert_eq!(items[0]["verified"][1]["mislabelled"], true, "{items:#}");
    assert_eq!(items[0]["verified"][1]["config"], "linux/amd64");
    let honest_checks = items[1]["verified"].as_array().unwrap();
    assert_eq!(honest_checks.len(), 3, "{items:#}");
    assert!(honest_checks.iter().all(|c| c["mislabelled"] == false));
}

/// What an operator runs from a node shell: the node's CredentialProviderConfig and plugins, and
/// the Docker config's helpers, the same as `serve` uses; at trace, nothing shows a password.
#[test]
fn credential_providers_and_helpers_as_serve_uses_them_and_no_password_shown() {
    let basic = &registry::basic().host;
    let token = registry::token();
    let token_host = token.host.clone();
    common::block_on_own_thread(async move {
        common::fixtures::Pusher::for_mode(&token_host, registry::Mode::Token)
            .push("private/inspected", "arm64-oci", "v1")
            .await;
    });
    let provided = format!("{basic}/fixtures/s390x-docker:v1");
    let helped = format!("{}/private/inspected:v1", token.host);
    let refused = format!("{basic}/fixtures/amd64-docker:v1");
    let (_plugins, env) = node_plugins();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();

    let out = inspect(&["--json", &provided, &helped, &refused], &env);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let items: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        items[0]["credentials"],
        "credential provider ecr-credential-provider"
    );
    assert_eq!(items[0]["platforms"][0]["architecture"], "s390x");
    // amd64 and arm64 share no provider: the credential store opens the arm64 image.
    assert_eq!(
        items[1]["credentials"],
        "credential helper docker-credential-ecr-login"
    );
    let error = items[2]["error"].as_str().unwrap();
    assert!(
        error.contains("credential provider careless failed: exit status 3:")
            && error.contains("(password=<redacted>)"),
        "{error}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("credential provider plugin failed"),
        "{stderr}"
    );
    for shown in [String::from_utf8_lossy(&out.stdout), stderr] {
        assert!(!shown.contains(PASSWORD), "password leaked:\n{shown}");
        assert!(
            !shown.contains(BASIC_AUTH),
            "Authorization leaked:\n{shown}"
        );
    }

    // The human output names the source too.
    let out = inspect(&[&provided], &env);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "source:     {basic} (credential provider ecr-credential-provider)"
        )),
        "{text}"
    );
}

/// A node's plugins: providers for the Basic registry's s390x (answering) and amd64 (failing,
/// careless with the password) images, a helper for the token registry; and the environment
/// that configures them, logging at trace.
fn node_plugins() -> (common::plugins::Providers, Vec<(String, String)>) {
    use common::plugins::{Provider, Providers};
    let basic = &registry::basic().host;
    let token = registry::token();
    let plugins = Providers::new(vec![
        Provider::new(
            "ecr-credential-provider",
            &[&format!("{basic}/fixtures/s390x")],
        )
        .answering(USER, PASSWORD),
        Provider::new("careless", &[&format!("{basic}/fixtures/amd64")])
            .answering(USER, PASSWORD)
            .env("PLUGIN_MODE", "fail"),
    ])
    .helper(
        "ecr-login",
        serde_json::json!({"username": USER, "secret": PASSWORD}),
    )
    .docker_config(serde_json::json!({"credHelpers": {&token.host: "ecr-login"}}));
    let insecure = format!("{},{}", registry::plain().host, token.token_host());
    let mut env = plugins.env();
    env.push(("TOLERABLE_LOG__LEVEL".into(), "trace".into()));
    env.push(("TOLERABLE_REGISTRY__INSECURE".into(), insecure));
    (plugins, env)
}

#[test]
fn a_missing_credential_helper_refuses_to_start_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(&config, r#"{"credsStore": "not-installed-anywhere"}"#).unwrap();
    let out = inspect(
        &["nginx"],
        &[(
            "TOLERABLE_CREDENTIALS__DOCKER_CONFIG_PATH",
            config.to_str().unwrap(),
        )],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("config key `credentials.docker_config_path`")
            && stderr.contains("credsStore: docker-credential-not-installed-anywhere not found"),
        "{stderr}"
    );
}

/// Two registries that cannot be reached: a port nothing listens on, and a name under
/// `.invalid` (RFC 6761: never resolves). Both read the same in the message — "unreachable:
/// connection failed" — and the operator at a terminal gets the cause beside it.
fn unreachable_images() -> [(String, &'static str); 2] {
    [
        (
            format!("{}/app:v1", common::fake::closed_port()),
            "Connection refused",
        ),
        (
            "registry.invalid/app:v1".to_owned(),
            "failed to lookup address information",
        ),
    ]
}

/// `inspect` and `review` print why a registry could not be reached (the resolver's or the
/// socket's words); the webhook's warnings for the same images stay as terse as before, so a
/// Pod author cannot tell a closed port from a name that does not resolve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cause_of_an_unreachable_registry_reaches_a_terminal_never_the_webhook() {
    let images = unreachable_images();
    inspect_prints_the_causes(&images);
    let names: Vec<&str> = images.iter().map(|(image, _)| image.as_str()).collect();
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "unreachable"},
        "spec": {"containers": names.iter().enumerate()
            .map(|(i, image)| serde_json::json!({"name": format!("c{i}"), "image": image}))
            .collect::<Vec<_>>()},
    });
    review_prints_the_causes(&images, &pod);
    the_webhook_keeps_them_to_itself(&images, &pod).await;
}

/// `inspect`: a `cause:` line under each error, and a `cause` beside the error in `--json`.
fn inspect_prints_the_causes(images: &[(String, &str)]) {
    let names: Vec<&str> = images.iter().map(|(image, _)| image.as_str()).collect();
    let out = inspect(&names, &[]);
    assert!(!out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for (image, cause) in images {
        let shown = text.split(&format!("{image}\n")).nth(1).unwrap_or_default();
        let mut lines = shown.lines();
        let error = lines.next().unwrap_or_default();
        assert!(error.ends_with("unreachable: connection failed"), "{text}");
        let cause_line = lines.next().unwrap_or_default();
        assert!(cause_line.starts_with("  cause: "), "{text}");
        assert!(cause_line.contains(cause), "{image}: {text}");
        // The transport's causes only: reqwest's own message names the URL (a realm's or a
        // redirect's may carry user info), and is left out.
        assert!(!cause_line.contains("://"), "{text}");
    }
    let json = inspect(&["--json", names[0]], &[]);
    let items: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(
        items[0]["cause"].as_str().unwrap().contains(images[0].1),
        "{items}"
    );
}

/// `review`: with `--patch` a Pod shows its terse warning and a `cause:` line per image on
/// standard error; the workloads report a cause line per workload and image, on standard error
/// too, none on standard output.
fn review_prints_the_causes(images: &[(String, &str)], pod: &serde_json::Value) {
    let out = common::cli::review(&["--patch", "-"], Some(pod.to_string().as_bytes()));
    let text = String::from_utf8(out.stdout).unwrap();
    let errors = String::from_utf8(out.stderr).unwrap();
    for (image, cause) in images {
        let warned = text
            .lines()
            .find(|l| l.starts_with("warning:  ") && l.contains(&format!("{image}: registry ")))
            .unwrap_or_else(|| panic!("no warning for {image}: {text}"));
        assert!(warned.ends_with("unreachable: connection failed"), "{text}");
        let cause_line = errors
            .lines()
            .find(|l| l.starts_with(&format!("cause:    {image}: ")))
            .unwrap_or_else(|| panic!("no cause for {image}: {errors}"));
        assert!(cause_line.contains(cause), "{errors}");
    }
    assert!(!text.contains("cause:"), "{text}");
    let mut second = pod.clone();
    second["metadata"]["name"] = "unreachable-too".into();
    let documents = format!("{pod}\n---\n{second}\n");
    let out = common::cli::review(&["-"], Some(documents.as_bytes()));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("cause:"));
    let text = String::from_utf8(out.stderr).unwrap();
    for (image, cause) in images {
        let causes = text
            .lines()
            .filter(|l| l.starts_with("cause: ") && l.contains(&format!(": {image}: ")))
            .filter(|l| l.contains(cause));
        assert_eq!(causes.count(), 2, "{image}: {text}");
    }
}

/// The webhook: the same images, the same terse warnings, no cause anywhere in the answer.
async fn the_webhook_keeps_them_to_itself(images: &[(String, &str)], pod: &serde_json::Value) {
    let server =
        common::webhook::TestServer::start(common::webhook::policy(), common::settings()).await;
    let mut request = common::webhook::recorded("pod-create-simple.v1.json", "unused");
    request["request"]["object"]["spec"]["containers"] = pod["spec"]["containers"].clone();
    let (response, _) =
        common::webhook::admit(&server, &request, std::time::Duration::from_secs(10)).await;
    let warnings = common::webhook::warnings(&response);
    for (image, _) in images {
        assert!(
            warnings.iter().any(
                |w| w.contains(image.as_str()) && w.ends_with("unreachable: connection failed")
            ),
            "{warnings:?}"
        );
    }
    let answer = response.to_string().to_lowercase();
    for hidden in ["refused", "lookup address", "dns"] {
        assert!(!answer.contains(hidden), "{hidden}: {answer}");
    }
}
