//! `tolerable serve` and `tolerable review`, run as the binary an operator runs.

use crate::common;

use std::io::{BufRead, BufReader, Read as _};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::cli::{review, succeeded, tolerable};
use common::registry;
use serde_json::{json, Value};

fn pod_yaml(images: &[&str]) -> String {
    let mut yaml = String::from("apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: shop\nspec:\n  containers:\n");
    for (i, image) in images.iter().enumerate() {
        yaml.push_str(&format!("  - name: c{i}\n    image: {image}\n"));
    }
    yaml
}

/// The README's example manifest, `examples/pod.yaml`, reviewed as the README shows: its Docker
/// Hub images come from a mirror on 127.0.0.1 (Docker Hub itself is refused: only loopback).
#[tokio::test]
async fn review_the_shipped_example_pod() {
    let host = registry::plain().host.clone();
    let pusher = common::fixtures::Pusher::for_mode(&host, registry::Mode::Plain);
    pusher.push("library/nginx", "multiarch-oci", "1.27").await;
    pusher
        .push("library/busybox", "multiarch-oci", "1.36")
        .await;
    let example = common::tools::root().join("examples/pod.yaml");
    let out = tolerable()
        .args(["review", "--patch"])
        .arg(&example)
        .env("TOLERABLE_REGISTRY__MIRRORS", format!("docker.io={host}"))
        .env("TOLERABLE_REGISTRY__ALLOWLIST", "127.0.0.1")
        .output()
        .unwrap();
    let pod = allowed_tolerating_arm64(&out);
    assert_eq!(pod["metadata"]["name"], "web");
    assert_eq!(pod["spec"]["containers"][0]["image"], "nginx:1.27");
}

/// `review --patch`'s output, under the Pod's heading, says allowed, tolerating arm64, with its
/// JSON Patch; the patched Pod.
fn allowed_tolerating_arm64(out: &Output) -> Value {
    let text = succeeded(out);
    let (heading, text) = text.split_once('\n').unwrap();
    assert!(heading.starts_with("# Pod/"), "{heading}");
    assert!(text.starts_with("decision: allowed"), "{text}");
    assert!(text.contains("tolerates arm64"), "{text}");
    assert!(text.contains("# JSON Patch"), "{text}");
    let patched = text.split("# Patched Pod\n").nth(1).unwrap();
    serde_yaml_ng::from_str(patched).unwrap()
}

#[test]
fn review_a_pod_manifest_in_yaml() {
    let host = &registry::plain().host;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pod.yaml");
    std::fs::write(
        &file,
        pod_yaml(&[&format!("{host}/fixtures/multiarch-oci:v1")]),
    )
    .unwrap();
    let out = review(&["--patch", file.to_str().unwrap()], None);
    // The patched Pod, in YAML.
    let pod = allowed_tolerating_arm64(&out);
    assert_eq!(pod["spec"]["tolerations"][0]["value"], "arm64");
    assert_eq!(pod["metadata"]["name"], "web");
}

#[test]
fn review_an_admission_review_as_json_from_stdin() {
    let request = common::webhook::recorded("pod-create-simple.v1.json", &registry::plain().host);
    let out = review(
        &["--json", "--patch", "-"],
        Some(request.to_string().as_bytes()),
    );
    succeeded(&out);
    // One array, however many were shown.
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown.as_array().unwrap().len(), 1, "{shown:#}");
    let report = &shown[0];
    assert_eq!(report["allowed"], true);
    assert_eq!(report["outcome"], "decided");
    assert_eq!(
        report["response"]["response"]["uid"],
        request["request"]["uid"]
    );
    assert_eq!(
        report["pod"]["spec"]["tolerations"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert!(!report["patch"].as_array().unwrap().is_empty());
    // Without --patch: the report, the AdmissionReview's Pod one workload in it.
    let out = review(&["--json", "-"], Some(request.to_string().as_bytes()));
    let report: Value = serde_json::from_slice(&succeeded(&out).into_bytes()).unwrap();
    let workloads = report["workloads"].as_array().unwrap();
    assert_eq!(workloads.len(), 1, "{report:#}");
    assert_eq!(workloads[0]["kind"], "Pod");
    assert_eq!(workloads[0]["outcome"], "decided");
}

#[test]
fn review_exit_status_says_denied() {
    let host = &registry::plain().host;
    let yaml = pod_yaml(&[
        &format!("{host}/fixtures/s390x-docker:v1"),
        &format!("{host}/fixtures/amd64-docker:v1"),
    ]);
    let out = review(&["--patch", "-"], Some(yaml.as_bytes()));
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("# Pod/shop/web (-:1)\ndecision: denied"),
        "{text}"
    );
    assert!(text.contains("s390x-docker:v1 (linux/s390x)"), "{text}");
    assert!(!text.contains("# Patched Pod"), "{text}");
}

#[test]
fn review_bad_input_is_a_clear_error() {
    for (input, want) in [
        ("key: [unclosed", "neither JSON nor YAML"),
        ("just a string", "expected a Kubernetes object"),
    ] {
        let out = review(&["-"], Some(input.as_bytes()));
        assert_eq!(out.status.code(), Some(2), "{input}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{input}: {stderr}");
    }
    let out = review(&["/nonexistent/pod.yaml"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/pod.yaml"));
}

/// A newcomer's first run: no certificate configured, so `serve` makes one and prints its CA;
/// `/healthz` answers as the README's sample shows; SIGTERM stops it cleanly.
#[tokio::test]
async fn serve_without_certificates_prints_its_ca_and_stops_on_sigterm() {
    common::init();
    let port = common::free_port();
    let metrics_port = common::free_port();
    let cwd = tempfile::tempdir().unwrap();
    let mut child = tolerable()
        .current_dir(cwd.path())
        .arg("serve")
        .env("TOLERABLE_SERVER__LISTEN_ADDR", format!("127.0.0.1:{port}"))
        .env(
            "TOLERABLE_SERVER__METRICS_ADDR",
            format!("127.0.0.1:{metrics_port}"),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Held to the end of the test, so serve's stdout stays open while it runs.
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let ca = read_printed_ca(&mut stdout);
    // The CA is also in a file in the working directory, for `curl --cacert`.
    let saved = std::fs::read_to_string(cwd.path().join("tolerable-ca.pem")).unwrap();
    assert_eq!(saved.trim(), ca.trim());
    let client = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(saved.as_bytes()).unwrap()])
        .build()
        .unwrap();
    let url = format!("https://127.0.0.1:{port}");
    wait_until_ready(&client, &url).await;
    // What the README's `curl --cacert tolerable-ca.pem …/healthz` prints.
    let healthz = client.get(format!("{url}/healthz")).send().await.unwrap();
    let curl = "curl --cacert tolerable-ca.pem https://localhost:8443/healthz";
    assert_eq!(
        healthz.text().await.unwrap(),
        common::doc_samples::sample("README.md", curl)
    );
    a_second_serve_on_the_same_port_leaves_the_ca_alone(cwd.path(), port, &saved);
    let request = common::webhook::recorded("pod-create-simple.v1.json", &registry::plain().host);
    let response = mutate(&client, &url, &request).await;
    assert_eq!(response["response"]["allowed"], json!(true), "{response}");
    assert!(response["response"]["patch"].is_string());

    metrics_are_on_their_own_port(&client, &url, metrics_port).await;

    let response = mutate(&client, &url, &log_forging_admission(&request)).await;
    assert_eq!(response["response"]["allowed"], json!(true), "{response}");

    let stderr = stop_with_sigterm(&mut child).await;
    assert!(stderr.contains("SIGTERM received"), "{stderr}");
    the_log_names_the_uids_and_forges_no_line(&stderr, &request);
}

/// A second `serve` started by mistake in the same directory fails on its port, naming the
/// key, and leaves the running server's CA file as it was (it used to write its own first).
fn a_second_serve_on_the_same_port_leaves_the_ca_alone(
    cwd: &std::path::Path,
    port: u16,
    saved: &str,
) {
    let second = tolerable()
        .current_dir(cwd)
        .arg("serve")
        .env("TOLERABLE_SERVER__LISTEN_ADDR", format!("127.0.0.1:{port}"))
        .output()
        .unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("listen_addr"), "{stderr}");
    let after = std::fs::read_to_string(cwd.join("tolerable-ca.pem")).unwrap();
    assert_eq!(after, saved, "the running server's CA was overwritten");
}

/// The CA certificate `serve` prints on stdout when it made its own: printed before serve
/// exits (the event; how soon is this machine's speed).
fn read_printed_ca(stdout: &mut impl BufRead) -> String {
    let mut ca = String::new();
    let mut line = String::new();
    while !ca.contains("-----END CERTIFICATE-----") {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "serve exited before printing its CA"
        );
        if line.starts_with("-----BEGIN") || !ca.is_empty() {
            ca.push_str(&line);
        }
    }
    ca
}

/// Waits for the server to answer /readyz, and asserts that answer is 200. The 600 tries
/// (30 s) only keep a server that never listens from hanging the test.
async fn wait_until_ready(client: &reqwest::Client, url: &str) {
    let mut ready = false;
    for _ in 0..600 {
        if let Ok(r) = client.get(format!("{url}/readyz")).send().await {
            ready = r.status() == 200;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "not ready");
}

async fn mutate(client: &reqwest::Client, url: &str, review: &Value) -> Value {
    client
        .post(format!("{url}/mutate?timeout=10s"))
        .body(review.to_string())
        .send()
        .await
        .unwrap()
        .json_or_text()
        .await
}

/// Metrics on their own plain-HTTP port (for a NetworkPolicy), not on the webhook port.
async fn metrics_are_on_their_own_port(client: &reqwest::Client, url: &str, metrics_port: u16) {
    let scraped = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .await
        .unwrap();
    assert_eq!(scraped.status(), 200);
    assert!(scraped
        .text()
        .await
        .unwrap()
        .contains("tolerable_admissions_total"));
    let on_webhook = client.get(format!("{url}/metrics")).send().await.unwrap();
    assert_eq!(on_webhook.status(), 404);
}

/// `request` with uid `forged-uid` and image names a Pod author could use against the log:
/// one with a newline and a forged line after it, one 1 MiB long.
fn log_forging_admission(request: &Value) -> Value {
    let mut forged = request.clone();
    forged["request"]["uid"] = json!("forged-uid");
    forged["request"]["object"]["spec"]["containers"] = json!([
        {"name": "a", "image": "app:1\nERROR tolerable: FORGED line"},
        {"name": "b", "image": format!("huge/{}:1", "x".repeat(1 << 20))},
    ]);
    forged
}

/// Sends SIGTERM and waits for a successful exit; returns what serve logged. The 30 s only
/// keep a serve that ignores SIGTERM from hanging the test.
async fn stop_with_sigterm(child: &mut std::process::Child) -> String {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let started = Instant::now();
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let mut stderr = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut stderr)
                .unwrap();
            panic!("serve did not stop on SIGTERM:\n{stderr}");
        }
        // An async sleep: the client's (h2) connection must stay polled to answer the server's
        // GOAWAY/PING during graceful shutdown.
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "{exit:?}");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    stderr
}

/// Each admission's log line carries its request uid; a Pod author's image names reach the
/// log, but a newline cannot forge a line of its own, and a 1 MiB name does not make a 1 MiB
/// line.
fn the_log_names_the_uids_and_forges_no_line(stderr: &str, request: &Value) {
    let uid = request["request"]["uid"].as_str().unwrap();
    assert!(
        stderr
            .lines()
            .any(|l| l.contains(uid) && l.contains("tolerates arm64")),
        "{stderr}"
    );
    assert!(
        stderr.lines().any(|l| l.contains("forged-uid")),
        "the forged admission was logged"
    );
    assert!(
        !stderr
            .lines()
            .any(|l| l.starts_with("ERROR tolerable: FORGED")),
        "a forged log line"
    );
    assert!(stderr.contains("app:1\\nERROR tolerable: FORGED line"));
    let longest = stderr.lines().map(str::len).max().unwrap();
    assert!(longest < 9 << 10, "a {longest}-byte log line");
}

#[test]
fn serve_refuses_to_start_on_bad_certificates_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    std::fs::write(&cert, "not a certificate").unwrap();
    std::fs::write(&key, "not a key").unwrap();
    let out = tolerable()
        .arg("serve")
        .env("TOLERABLE_TLS__CERT_PATH", &cert)
        .env("TOLERABLE_TLS__KEY_PATH", &key)
        .env(
            "TOLERABLE_SERVER__LISTEN_ADDR",
            format!("127.0.0.1:{}", common::free_port()),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tls.cert_path") && stderr.contains("holds no certificate"),
        "{stderr}"
    );

    let out = tolerable()
        .arg("serve")
        .env("TOLERABLE_TLS__CERT_PATH", &cert)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tls.key_path"));
}

trait JsonOrText {
    async fn json_or_text(self) -> Value;
}

impl JsonOrText for reqwest::Response {
    async fn json_or_text(self) -> Value {
        let bytes = self.bytes().await.unwrap();
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
    }
}
