//! `tolerable review` over the manifests operators keep in Git: every kind with a Pod template,
//! multi-document files, Lists, directories, kustomize output on standard input, against the
//! real test registry; the per-workload answers, the table, and the exit status a CI gate uses.

use crate::common;

use std::path::Path;
use std::process::Stdio;

use common::cli::{json_report, review, succeeded, tolerable, workload};
use common::fixtures::Pusher;
use common::registry::{self, Mode};
use serde_json::Value;

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/workloads");

/// One object of each kind the kinds table names (`src/kinds.rs`), and what review reports.
const KINDS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/kinds");

/// The corpus copied to a temporary directory, `REGISTRY` replaced by `host`.
fn corpus(host: &str) -> tempfile::TempDir {
    copy_of(CORPUS, host)
}

/// `from` copied to a temporary directory, `REGISTRY` replaced by `host`.
fn copy_of(from: &str, host: &str) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path, host: &str) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let path = entry.unwrap().path();
            let target = to.join(path.file_name().unwrap());
            if path.is_dir() {
                copy(&path, &target, host);
            } else {
                let text = std::fs::read_to_string(&path).unwrap();
                std::fs::write(target, text.replace("REGISTRY", host)).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy(Path::new(from), dir.path(), host);
    dir
}

#[track_caller]
fn strings(value: &Value) -> Vec<&str> {
    let Some(items) = value.as_array() else {
        panic!("not a list: {value}")
    };
    items.iter().map(|v| v.as_str().unwrap()).collect()
}

/// A reviewed workload as `tests/data/kinds/expected.txt` writes it, its images sorted: `FILE
/// KIND/[NAMESPACE/]NAME[ (PART)] IMAGE…`; each image looked up, the workload decided.
fn reviewed_line(w: &Value) -> String {
    let source = w["source"].as_str().unwrap();
    let file = source
        .rsplit('/')
        .next()
        .unwrap()
        .split(':')
        .next()
        .unwrap();
    let mut label = format!("{}/", w["kind"].as_str().unwrap());
    if let Some(namespace) = w["namespace"].as_str() {
        label.push_str(&format!("{namespace}/"));
    }
    label.push_str(w["name"].as_str().unwrap());
    if let Some(part) = w["part"].as_str() {
        label.push_str(&format!(" ({part})"));
    }
    let images = w["images"].as_object().unwrap();
    for (image, fact) in images {
        assert!(fact["platforms"].is_array(), "{label}: {image}: {fact}");
    }
    assert_eq!(w["outcome"], "decided", "{label}: {w:#}");
    let mut short: Vec<&str> = images
        .keys()
        .map(|i| i.rsplit('/').next().unwrap().trim_end_matches(":v1"))
        .collect();
    short.sort_unstable();
    format!("{file} {label} {}", short.join(" "))
}

/// `tests/data/kinds/expected.txt`, each line's images sorted, the lines sorted.
fn expected_lines() -> Vec<String> {
    let expected = std::fs::read_to_string(format!("{KINDS}/expected.txt")).unwrap();
    let mut want: Vec<String> = expected
        .lines()
        .map(|line| {
            let (head, images) = line.split_once(") ").map_or_else(
                || {
                    let mut words: Vec<&str> = line.split(' ').collect();
                    let images = words.split_off(2);
                    (words.join(" "), images.join(" "))
                },
                |(head, images)| (format!("{head})"), images.to_owned()),
            );
            let mut images: Vec<&str> = images.split(' ').collect();
            images.sort_unstable();
            format!("{head} {}", images.join(" "))
        })
        .collect();
    want.sort();
    want
}

/// `review -R` over a tree with one object of each AI/ML and pipeline kind: every image of
/// every Pod template is looked up and reported, each template named by the kind's own names
/// (`tests/data/kinds/expected.txt`); containers where no row of the table looks are a skipped
/// input naming their path, which `--strict` fails on.
#[test]
fn every_pod_template_of_the_ai_ml_and_pipeline_kinds_is_reviewed_with_its_images() {
    let host = &registry::plain().host;
    let dir = copy_of(KINDS, host);
    let root = dir.path().to_str().unwrap();
    let out = review(&["-R", "--json", root], None);
    let report = json_report(&out);
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    let mut got: Vec<String> = report["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(reviewed_line)
        .collect();
    got.sort();
    assert_eq!(got, expected_lines());
    let skipped = report["skipped_inputs"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{skipped:#?}");
    let reason = skipped[0]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("Runner/runner: containers at a position review does not read (spec.pool.pod.containers)"),
        "{reason}"
    );
    assert_eq!(report["skipped"][0]["name"], "sklearn", "{report:#}");
    let strict = review(&["-R", "--strict", root], None);
    assert_eq!(strict.status.code(), Some(3));
    // A row for the in-house kind reads its Pod.
    let out = common::cli::tolerable()
        .env(
            "TOLERABLE_WORKLOADS__POD_SPECS",
            "Runner.ci.example.com=spec.pool.pod",
        )
        .args(["review", "--json", "--strict"])
        .arg(dir.path().join("inhouse.yaml"))
        .output()
        .unwrap();
    let report = json_report(&out);
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(workload(&report, "Runner", "runner")["outcome"], "decided");
}

#[test]
fn every_kind_in_a_directory_with_its_answer_and_a_failing_exit_status() {
    let dir = corpus(&registry::plain().host);
    let out = review(&["--json", dir.path().to_str().unwrap()], None);
    // mixed.yaml's images share no architecture: the gate fails.
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = json_report(&out);

    let web = workload(&report, "Deployment", "web");
    assert_eq!(web["namespace"], "shop");
    assert_eq!(web["outcome"], "decided");
    assert_eq!(strings(&web["architectures"]), ["amd64", "arm", "arm64"]);
    assert_eq!(
        strings(&web["adds"]),
        [
            "toleration kubernetes.io/arch=arm64:NoSchedule",
            "requires kubernetes.io/arch in (amd64,arm,arm64)"
        ]
    );
    let image = format!("{}/fixtures/multiarch-oci:v1", registry::plain().host);
    assert_eq!(
        strings(&web["images"][&image]["platforms"]),
        ["linux/amd64", "linux/arm/v7", "linux/arm64"]
    );

    // An init container's image narrows the set as a container's does.
    let db = workload(&report, "StatefulSet", "db");
    assert_eq!(strings(&db["architectures"]), ["amd64", "arm64"]);
    let agent = workload(&report, "DaemonSet", "agent");
    assert_eq!(strings(&agent["architectures"]), ["amd64"]);
    assert_eq!(
        strings(&agent["adds"]),
        ["requires kubernetes.io/arch in (amd64)"],
        "no toleration: amd64 is a default architecture"
    );
    let migrate = workload(&report, "Job", "migrate");
    assert_eq!(strings(&migrate["architectures"]), ["arm64"]);
    let nightly = workload(&report, "CronJob", "nightly");
    assert_eq!(nightly["outcome"], "decided");
    assert!(nightly["adds"][0].as_str().unwrap().contains("arm64"));
    // From the List: a Pod and a custom kind shaped like a Deployment.
    assert_eq!(workload(&report, "Pod", "debug")["outcome"], "decided");
    assert_eq!(workload(&report, "Rollout", "canary")["outcome"], "decided");

    let mixed = workload(&report, "Deployment", "mixed");
    // Denied: the shipped on_no_common_architecture.
    assert_eq!(mixed["outcome"], "denied");
    assert!(strings(&mixed["architectures"]).is_empty());
    assert!(
        mixed["denied"].as_str().unwrap().contains("s390x"),
        "{mixed:#}"
    );

    // Top-level files only without -R: 8 workloads; the Service, ConfigMap and Secret counted.
    assert_eq!(report["workloads"].as_array().unwrap().len(), 8);
    let skipped: Vec<_> = report["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["kind"].as_str().unwrap())
        .collect();
    assert_eq!(skipped, ["Service", "ConfigMap", "Secret"]);
}

#[test]
fn recursive_reads_nested_directories_and_the_table_says_what_would_change() {
    let dir = corpus(&registry::plain().host);
    let legacy = dir.path().join("legacy");
    let flat = review(&["--json", legacy.to_str().unwrap()], None);
    let names: Vec<_> = json_report(&flat)["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["old-web", "old-api"]);

    let out = review(&["-R", legacy.to_str().unwrap()], None);
    let text = succeeded(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("WORKLOAD") && lines[0].ends_with("WOULD ADD"),
        "{text}"
    );
    let row = |name: &str| {
        *lines
            .iter()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("no row for {name}: {text}"))
    };
    assert!(
        row("ReplicationController/legacy/old-web").contains("amd64,arm64"),
        "{text}"
    );
    assert!(
        row("ReplicaSet/legacy/old-api").contains("toleration kubernetes.io/arch=s390x:NoSchedule"),
        "{text}"
    );
    assert!(
        row("PodTemplate/legacy/worker").contains("decided"),
        "{text}"
    );
    assert_eq!(lines.last().unwrap(), &"3 workloads: 3 decided", "{text}");
}

#[test]
fn kustomize_output_on_standard_input() {
    let dir = corpus(&registry::plain().host);
    // The test tools' kubectl (scripts/install-test-deps.sh), not whatever PATH has.
    let rendered = common::tools::render(dir.path().join("kustomize"));
    let out = review(&["--json", "-"], Some(rendered.as_bytes()));
    succeeded(&out);
    let api = workload(&json_report(&out), "Deployment", "api").clone();
    assert_eq!(api["namespace"], "kustomized");
    assert_eq!(strings(&api["architectures"]), ["amd64", "arm", "arm64"]);
}

/// All images of all documents are looked up concurrently, each once.
#[tokio::test]
async fn an_image_in_many_workloads_is_looked_up_once() {
    let registry = registry::plain();
    Pusher::for_mode(&registry.host, Mode::Plain)
        .push("review-once/app", "multiarch-oci", "v1")
        .await;
    let mut yaml = String::new();
    for i in 0..6 {
        yaml.push_str(&format!(
            "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: d{i}}}\nspec:\n  template:\n    spec:\n      containers: [{{name: c, image: '{}/review-once/app:v1'}}]\n",
            registry.host
        ));
    }
    let out = tokio::task::spawn_blocking(move || review(&["--json", "-"], Some(yaml.as_bytes())))
        .await
        .unwrap();
    succeeded(&out);
    assert_eq!(json_report(&out)["workloads"].as_array().unwrap().len(), 6);
    // The index names the platforms: one manifest request in all, for six workloads.
    assert_eq!(registry.requests_for("review-once/app").await, (1, 0));
}

/// The output's shape is the flags': `--patch` shows each workload in detail, and one Pod alone
/// is a row of the table without it.
#[test]
fn patch_shows_each_workload_in_detail_and_one_pod_is_a_row_without_it() {
    let dir = corpus(&registry::plain().host);
    let out = review(
        &["--patch", dir.path().join("batch.yaml").to_str().unwrap()],
        None,
    );
    let text = succeeded(&out);
    assert!(text.starts_with("# Job/shop/migrate ("), "{text}");
    assert!(text.contains("# CronJob/shop/nightly ("), "{text}");
    assert_eq!(text.matches("# JSON Patch").count(), 2, "{text}");
    assert_eq!(text.matches("# Patched Pod").count(), 2, "{text}");

    let list = std::fs::read_to_string(dir.path().join("list.json")).unwrap();
    let list: Value = serde_json::from_str(&list).unwrap();
    let pod = serde_yaml_ng::to_string(&list["items"][0]).unwrap();
    let out = review(&["-"], Some(pod.as_bytes()));
    let text = succeeded(&out);
    assert!(text.starts_with("WORKLOAD "), "{text}");
    assert!(text.ends_with("1 workload: 1 decided\n"), "{text}");
    let out = review(&["--patch", "-"], Some(pod.as_bytes()));
    let text = succeeded(&out);
    assert!(text.contains("\ndecision: allowed\n"), "{text}");
}

#[test]
fn no_workload_passes_and_unreadable_documents_are_clear_errors() {
    // A directory of ConfigMaps passes the gate: nothing to review.
    let out = review(
        &["-"],
        Some(b"apiVersion: v1\nkind: Service\nmetadata: {name: s}\n"),
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().last(),
        Some("0 workloads; 1 object without a Pod template skipped")
    );
    for (input, want) in [
        (
            "---\nkind: Pod\n---\n- a list\n",
            "expected a Kubernetes object, got a list",
        ),
        ("metadata: {name: x}\nspec: {}\n", "without a kind"),
    ] {
        let out = review(&["-"], Some(input.as_bytes()));
        assert_eq!(out.status.code(), Some(2), "{input}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{input}: {stderr}");
    }
}

/// `tolerable review … | head`: a reader that stops reading ends the output quietly, with the
/// status a shell gives a program SIGPIPE ended (141), in the table and in JSON.
#[test]
fn a_closed_pipe_ends_quietly() {
    let mut yaml = String::new();
    for i in 0..2000 {
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}}}\nspec:\n  containers: [{{name: c, image: 'not a reference {i}'}}]\n"
        ));
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), yaml).unwrap();
    for json in [false, true] {
        let mut command = tolerable();
        command
            .arg("review")
            .args(json.then_some("--json"))
            .arg(file.path());
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Close both ends before the output is written, as `2>&1 | head -1` does once it has
        // its line.
        drop(child.stdout.take());
        drop(child.stderr.take());
        let status = child.wait().unwrap();
        assert_eq!(
            status.code(),
            Some(141),
            "json: {json}: no panic (101), no error (2)"
        );
    }
}

/// The gate fails on images that share no architecture whether the webhook would deny the Pod
/// or only warn; a lookup failure has its own status (4), a failure when configured to deny.
#[test]
fn the_exit_status_is_a_gate_whatever_the_webhook_would_do() {
    let dir = corpus(&registry::plain().host);
    let mixed = dir.path().join("mixed.yaml");
    let out = tolerable()
        .env("TOLERABLE_POLICY__ON_NO_COMMON_ARCHITECTURE", "warn")
        .args(["review", "--json", mixed.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report = json_report(&out);
    assert_eq!(
        workload(&report, "Deployment", "mixed")["outcome"],
        "no_common_architecture"
    );

    let missing = format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {{name: j}}\nspec:\n  template:\n    spec:\n      containers: [{{name: c, image: '{}/fixtures/does-not-exist:v1'}}]\n",
        registry::plain().host
    );
    let file = dir.path().join("missing.yaml");
    std::fs::write(&file, missing).unwrap();
    // A lookup that failed is not a pass (issue 24: a gate with no network checked nothing):
    // its own status, 4, unless the config makes it a denial.
    // Under "gate" the workload would be held behind the gate (and not checked either: 4),
    // its summary naming the image it waits for.
    for (policy, code, outcome) in [
        ("allow", 4, "lookup_failed"),
        ("deny", 1, "denied"),
        ("gate", 4, "gated"),
    ] {
        let out = tolerable()
            .env("TOLERABLE_POLICY__ON_LOOKUP_FAILURE", policy)
            .args(["review", "--json", file.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{policy}");
        let report = json_report(&out);
        assert_eq!(workload(&report, "Job", "j")["outcome"], outcome);
        if policy == "gate" {
            let summary = workload(&report, "Job", "j")["summary"].to_string();
            assert!(
                summary.contains("waiting for the platforms of")
                    && summary.contains("does-not-exist"),
                "{summary}"
            );
        }
    }
}

/// Without a cluster, the pull secrets a workload names are not read: the warning names them.
#[test]
fn unread_pull_secrets_are_named() {
    let yaml = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: private, namespace: shop}}\nspec:\n  template:\n    spec:\n      imagePullSecrets: [{{name: regcred}}]\n      containers: [{{name: c, image: '{}/fixtures/multiarch-oci:v1'}}]\n",
        registry::plain().host
    );
    let out = review(&["--json", "-"], Some(yaml.as_bytes()));
    succeeded(&out);
    let report = json_report(&out);
    let warnings = strings(&workload(&report, "Deployment", "private")["warnings"]).join("\n");
    assert!(
        warnings.contains("image pull secrets not read: shop/regcred"),
        "{warnings}"
    );
}

/// With `--kubeconfig`, the workloads' pull secrets are read from the cluster as the webhook
/// reads them: an image behind htpasswd opens with the namespace's `regcred`.
#[test]
fn pull_secrets_from_the_cluster_with_a_kubeconfig() {
    use common::kube_api::{FakeApiServer, RegistryHosts};
    use common::kube_fake::kubeconfig;
    let api = FakeApiServer::start(RegistryHosts {
        basic: registry::basic().host.clone(),
        token: registry::token().host.clone(),
    });
    let config = kubeconfig(api.port, "admintoken");
    let ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca.path(), &common::certs::ca().ca_pem).unwrap();
    let yaml = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: private, namespace: team-a}}\nspec:\n  template:\n    spec:\n      imagePullSecrets: [{{name: regcred}}]\n      containers: [{{name: c, image: '{}/fixtures/arm64-oci:v1'}}]\n",
        registry::basic().host
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), yaml).unwrap();
    let out = tolerable()
        .env("TOLERABLE_REGISTRY__CA_PATH", ca.path())
        .args(["review", "--json", "--kubeconfig"])
        .arg(config.path())
        .arg(file.path())
        .output()
        .unwrap();
    succeeded(&out);
    let report = json_report(&out);
    let private = workload(&report, "Deployment", "private");
    assert_eq!(strings(&private["architectures"]), ["arm64"], "{private:#}");
    assert!(
        private["summary"]
            .as_str()
            .unwrap()
            .contains("credentials from secret team-a/regcred"),
        "{private:#}"
    );
    assert!(api
        .requests()
        .contains(&"/api/v1/namespaces/team-a/secrets/regcred".to_owned()));
}

/// `match_node_labels`: a workload's Pod labels listed there are required of its nodes in what
/// `review` says would be added; a workload without the label gets nothing of it.
#[test]
fn match_node_labels_are_in_what_would_be_added() {
    let image = format!("{}/fixtures/multiarch-oci:v1", registry::plain().host);
    let deployment = |name: &str, labels: &str| {
        format!("---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n  template:\n    metadata: {{labels: {labels}}}\n    spec:\n      containers: [{{name: c, image: '{image}'}}]\n")
    };
    let yaml = deployment("ml", "{team: ml, app: x}") + &deployment("plain", "{app: y}");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), yaml).unwrap();
    let out = tolerable()
        .env("TOLERABLE_POLICY__MATCH_NODE_LABELS", "team")
        .args(["review", "--json"])
        .arg(file.path())
        .output()
        .unwrap();
    let report = json_report(&out);
    let ml = workload(&report, "Deployment", "ml");
    assert!(
        strings(&ml["adds"])
            .iter()
            .any(|a| a.contains("team in (ml)")),
        "{ml:#}"
    );
    assert!(
        ml["summary"]
            .as_str()
            .unwrap()
            .contains("nodes labelled like the Pod: team=ml"),
        "{ml:#}"
    );
    let plain = workload(&report, "Deployment", "plain");
    assert!(!plain.to_string().contains("team"), "{plain:#}");
}
