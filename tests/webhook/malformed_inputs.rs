//! The bad-input corpus (`tests/data/malformed/`): AdmissionReviews, image references,
//! manifests and image configs, token-service answers and config files that are wrong in the
//! ways real ones are. Each must get the clear error or the documented fallback that
//! `tests/data/malformed/expected.toml` names, never a panic. The same corpus and the fuzz
//! targets' seed corpora (`fuzz/corpus/`) are also run through the fuzz harnesses, so the
//! harnesses are exercised on every test run.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::registry;
use common::webhook::{self, TestServer};
use tolerable::config::Config;
use tolerable::registry::client::parse_token_response;
use tolerable::registry::{manifest, ImageReference};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/malformed")
}

/// Every corpus file, by kind (its directory).
fn corpus() -> BTreeMap<String, BTreeMap<String, Vec<u8>>> {
    let mut kinds = BTreeMap::new();
    for kind in std::fs::read_dir(root()).unwrap() {
        let kind = kind.unwrap();
        if !kind.file_type().unwrap().is_dir() {
            continue;
        }
        let files = std::fs::read_dir(kind.path())
            .unwrap()
            .map(|f| {
                let f = f.unwrap();
                (
                    f.file_name().into_string().unwrap(),
                    std::fs::read(f.path()).unwrap(),
                )
            })
            .collect();
        kinds.insert(kind.file_name().into_string().unwrap(), files);
    }
    kinds
}

fn expectations() -> BTreeMap<String, BTreeMap<String, String>> {
    toml::from_str(&std::fs::read_to_string(root().join("expected.toml")).unwrap()).unwrap()
}

/// What tolerable made of one input, as one line to match the expectation against.
async fn outcome(server: &TestServer, kind: &str, name: &str, data: &[u8]) -> String {
    let text = || String::from_utf8_lossy(data).into_owned();
    match kind {
        "admission" => {
            let response = webhook::client()
                .post(server.url("/mutate"))
                .header("content-type", "application/json")
                .body(data.to_vec())
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body: serde_json::Value = response.json().await.unwrap();
            match status {
                200 => {
                    let answer = &body["response"];
                    assert!(
                        answer.get("patch").is_none(),
                        "{name}: a malformed request was patched"
                    );
                    let allowed = if answer["allowed"] == true {
                        "allowed"
                    } else {
                        "denied"
                    };
                    format!("200 {allowed}: {}", answer["warnings"])
                }
                _ => format!("{status}: {}", body["error"].as_str().unwrap_or_default()),
            }
        }
        "reference" => match ImageReference::parse(&text()) {
            Ok(parsed) => format!("ok: {parsed}"),
            Err(e) => format!("error: {e}"),
        },
        "manifest" => match manifest::parse_manifest(data, None) {
            Ok(parsed) => format!("ok: {parsed:?}"),
            Err(e) => format!("error: {e}"),
        },
        "config-blob" => match manifest::parse_image_config(data) {
            Ok(platform) => format!("ok: {platform}"),
            Err(e) => format!("error: {e}"),
        },
        "token" => match parse_token_response(data) {
            Ok(_) => "ok".to_owned(),
            Err(e) => format!("error: {e:?}"),
        },
        "config" => {
            let path = root().join(kind).join(name);
            match Config::load(Some(&path), []) {
                Ok(_) => "ok".to_owned(),
                Err(e) => format!("error: {e}"),
            }
        }
        other => panic!("unknown corpus kind {other}"),
    }
}

#[tokio::test]
async fn every_malformed_input_gets_its_clear_error_or_fallback() {
    let server = TestServer::start(webhook::policy(), common::settings()).await;
    let _ = registry::plain(); // the settings trust it; nothing here should reach it
    let corpus = corpus();
    let expected = expectations();
    let total: usize = corpus.values().map(BTreeMap::len).sum();
    assert!(total >= 30, "the corpus has only {total} inputs");

    let mut failures = Vec::new();
    for (kind, files) in &corpus {
        let wanted = expected.get(kind).cloned().unwrap_or_default();
        for (name, data) in files {
            let got = outcome(&server, kind, name, data).await;
            match wanted.get(name) {
                Some(want) if got.contains(want.as_str()) => {}
                Some(want) => failures.push(format!("{kind}/{name}: want {want:?}, got {got}")),
                None => failures.push(format!("{kind}/{name}: no expectation (got {got})")),
            }
        }
        for name in wanted.keys().filter(|n| !files.contains_key(*n)) {
            failures.push(format!("{kind}/{name}: expected, but no such file"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// The fuzz harnesses over their seed corpora and the malformed corpus: what `cargo fuzz run`
/// starts from must pass here.
#[test]
fn fuzz_harnesses_accept_their_seeds() {
    type Harness = fn(&[u8]);
    let targets: [(&str, Harness, &str); 4] = [
        ("reference", tolerable::fuzzing::reference, "reference"),
        ("manifest", tolerable::fuzzing::manifest, "manifest"),
        (
            "token_response",
            tolerable::fuzzing::token_response,
            "token",
        ),
        (
            "admission_review",
            tolerable::fuzzing::admission_review,
            "admission",
        ),
    ];
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let corpus = corpus();
    for (target, harness, malformed_kind) in targets {
        let dir = seeds.join(target);
        let mut inputs: Vec<Vec<u8>> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|f| std::fs::read(f.unwrap().path()).unwrap())
            .collect();
        assert!(!inputs.is_empty(), "{target} has no seeds");
        inputs.extend(corpus[malformed_kind].values().cloned());
        if target == "manifest" {
            inputs.extend(corpus["config-blob"].values().cloned());
        }
        if target == "admission_review" {
            // The AdmissionReviews recorded from a real kube-apiserver.
            for name in [
                "pod-create-simple.v1.json",
                "pod-create-dryrun.v1.json",
                "pod-create-generatename-initcontainers-digest-affinity.v1.json",
            ] {
                inputs.push(
                    std::fs::read(
                        Path::new(env!("CARGO_MANIFEST_DIR"))
                            .join("tests/data")
                            .join(name),
                    )
                    .unwrap(),
                );
            }
        }
        for input in inputs {
            harness(&input);
        }
    }
}
