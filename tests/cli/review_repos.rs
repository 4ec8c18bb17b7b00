//! `tolerable review -R` as a CI gate over a repository as teams keep them: workloads beside
//! kustomizations, a Helm chart, JSON patches, partial templates, a Knative Service, a file with
//! a byte order mark, a dangling symlink and a symlink loop. Every workload is reported once,
//! every other file is named with its reason, and the exit status says which case it is.

use crate::common;

use std::path::Path;

use common::cli::{json_report, review, succeeded, workload};
use common::registry;
use serde_json::Value;

fn write(root: &Path, path: &str, text: &str) {
    let path = root.join(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A repository tree written for this test; its images are on the test registry.
fn repository(host: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let multiarch = format!("{host}/fixtures/multiarch-oci:v1");
    let arm64 = format!("{host}/fixtures/arm64-oci:v1");
    write(root, "apps/web/deployment.yaml", &format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: shop\nspec:\n  template:\n    metadata:\n      labels: {{app: web}}\n    spec:\n      containers:\n      - name: web\n        image: {multiarch}\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: shop}}\nspec:\n  ports: [{{port: 80}}]\n"));
    write(root, "apps/web/kustomization.yaml", "resources:\n- deployment.yaml\npatches:\n- path: replicas.json\n- path: node-selector.yaml\n");
    write(
        root,
        "apps/web/replicas.json",
        "[\n  {\"op\": \"replace\", \"path\": \"/spec/replicas\", \"value\": 3}\n]\n",
    );
    write(root, "apps/web/node-selector.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  template:\n    spec:\n      nodeSelector: {disk: ssd}\n");
    // One bad document between two good ones: only it is skipped.
    write(root, "apps/batch.yml", &format!(
        "apiVersion: batch/v1\nkind: CronJob\nmetadata: {{name: nightly}}\nspec:\n  schedule: '0 3 * * *'\n  jobTemplate:\n    spec:\n      template:\n        spec:\n          restartPolicy: Never\n          containers: [{{name: run, image: '{arm64}'}}]\n---\njust some text\n---\napiVersion: batch/v1\nkind: Job\nmetadata: {{generateName: cleanup-}}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{{name: run, image: '{multiarch}'}}]\n"));
    write(root, "apps/serverless/hello.yaml", &format!(
        "apiVersion: serving.knative.dev/v1\nkind: Service\nmetadata: {{name: hello}}\nspec:\n  template:\n    spec:\n      containers:\n      - image: {arm64}\n"));
    write(root, "apps/bom.yaml", &format!(
        "\u{feff}apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {{name: agent}}\nspec:\n  template:\n    spec:\n      containers: [{{name: agent, image: '{multiarch}'}}]\n"));
    write(root, "apps/empty.yaml", "# nothing yet\n");
    write(
        root,
        "charts/api/Chart.yaml",
        "apiVersion: v2\nname: api\nversion: 0.1.0\n",
    );
    write(
        root,
        "charts/api/values.yaml",
        "image:\n  repository: api\n  tag: 1.0\n",
    );
    write(root, "charts/api/templates/deployment.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ include \"api.fullname\" . }}\nspec:\n  template:\n    spec:\n      containers:\n      - name: api\n        image: \"{{ .Values.image.repository }}:{{ .Values.image.tag }}\"\n");
    write(root, "charts/api/crds/widgets.yaml", "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: widgets.example.com}\n");
    // A plain manifest beside the chart's templates is read; so is a subchart's crds/, and its
    // templates are not.
    write(root, "charts/api/extra.yaml", &format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: extra}}\nspec:\n  template:\n    spec:\n      containers: [{{name: extra, image: '{multiarch}'}}]\n"));
    write(
        root,
        "charts/api/charts/db/Chart.yaml",
        "apiVersion: v2\nname: db\nversion: 0.1.0\n",
    );
    write(root, "charts/api/charts/db/crds/dbs.yaml", "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: dbs.example.com}\n");
    write(
        root,
        "charts/api/charts/db/templates/sts.yaml",
        "kind: StatefulSet\nmetadata: {name: {{ .Release.Name }}}\n",
    );
    #[cfg(unix)]
    {
        // A FIFO named like a manifest: never opened (it would wait for a writer forever).
        let fifo = root.join("apps/pipe.yaml");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        std::os::unix::fs::symlink("gone.yaml", root.join("apps/dangling.yaml")).unwrap();
        std::os::unix::fs::symlink("..", root.join("apps/web/up")).unwrap();
    }
    dir
}

fn skipped_inputs(report: &Value) -> Vec<(String, String)> {
    report["skipped_inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["source"].as_str().unwrap().to_owned(),
                s["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_repository_tree_every_workload_once_every_other_file_named() {
    let repo = repository(&registry::plain().host);
    let root = repo.path().to_str().unwrap();
    let out = review(&["-R", "--json", root], None);
    // Skipped inputs do not fail the gate without --strict.
    let report = json_report(&out);
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    let mut labels: Vec<(String, String)> = report["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            let source = w["source"].as_str().unwrap();
            let file = source.strip_prefix(root).unwrap().to_owned();
            (
                format!(
                    "{}/{}",
                    w["kind"].as_str().unwrap(),
                    w["name"].as_str().unwrap()
                ),
                file,
            )
        })
        .collect();
    labels.sort();
    // Once each, though apps/web/up leads back to the root (a loop).
    assert_eq!(
        labels,
        [
            ("CronJob/nightly".to_owned(), "/apps/batch.yml:1".to_owned()),
            ("DaemonSet/agent".to_owned(), "/apps/bom.yaml:1".to_owned()),
            (
                "Deployment/extra".to_owned(),
                "/charts/api/extra.yaml:1".to_owned()
            ),
            (
                "Deployment/web".to_owned(),
                "/apps/web/deployment.yaml:1".to_owned()
            ),
            ("Job/cleanup-*".to_owned(), "/apps/batch.yml:3".to_owned()),
            (
                "Service/hello".to_owned(),
                "/apps/serverless/hello.yaml:1".to_owned()
            ),
        ]
    );
    for (kind, name) in [
        ("Service", "hello"),
        ("DaemonSet", "agent"),
        ("Job", "cleanup-*"),
    ] {
        assert_eq!(
            workload(&report, kind, name)["outcome"],
            "decided",
            "{kind}/{name}"
        );
    }
    every_other_file_named(&report, root);
    // The chart's CRDs (its subchart's too) are read: objects without a Pod template.
    let kinds: Vec<&str> = report["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "Service",
            "CustomResourceDefinition",
            "CustomResourceDefinition"
        ]
    );
    assert_eq!(
        report["summary"],
        "6 workloads: 6 decided; 3 objects without a Pod template skipped; 12 inputs skipped (not reviewed)"
    );
}

/// The repository's files that hold no workload to review, each with its reason.
fn every_other_file_named(report: &Value, root: &str) {
    let skipped: Vec<(String, String)> = skipped_inputs(report)
        .into_iter()
        .map(|(source, reason)| (source.strip_prefix(root).unwrap().to_owned(), reason))
        .collect();
    let sources: Vec<&str> = skipped.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(
        sources,
        [
            "/apps/batch.yml:2",
            "/apps/dangling.yaml",
            "/apps/empty.yaml",
            "/apps/pipe.yaml",
            "/apps/web/kustomization.yaml:1",
            "/apps/web/node-selector.yaml:1",
            "/apps/web/replicas.json:1",
            "/charts/api/Chart.yaml:1",
            "/charts/api/charts/db/Chart.yaml:1",
            "/charts/api/charts/db/templates/sts.yaml",
            "/charts/api/templates/deployment.yaml",
            "/charts/api/values.yaml:1",
        ],
        "{skipped:#?}"
    );
    let reason = |source: &str| &skipped.iter().find(|(s, _)| s == source).unwrap().1;
    assert_eq!(
        reason("/apps/batch.yml:2"),
        "expected a Kubernetes object, got a string"
    );
    assert!(reason("/apps/dangling.yaml").starts_with("a dangling symlink"));
    assert!(reason("/apps/web/kustomization.yaml:1").contains("a kustomization"));
    assert!(
        reason("/apps/web/node-selector.yaml:1").contains("a partial Pod template (no containers)")
    );
    assert!(reason("/apps/web/replicas.json:1").contains("a JSON Patch"));
    assert!(reason("/charts/api/templates/deployment.yaml").contains("a Helm chart's template"));
    assert!(reason("/charts/api/charts/db/templates/sts.yaml").contains("a Helm chart's template"));
    assert!(reason("/charts/api/Chart.yaml:1").contains("a Helm chart's Chart.yaml"));
    assert!(reason("/charts/api/values.yaml:1").contains("Helm values?"));
    assert_eq!(
        reason("/apps/pipe.yaml"),
        "a FIFO, not a regular file: not read"
    );
    let batch = report["skipped_inputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["document"] == 2)
        .unwrap();
    assert_eq!(batch["line"], 13, "{batch}");
}

#[test]
fn exit_statuses_say_problems_skipped_inputs_or_nothing_read() {
    let host = &registry::plain().host;
    let repo = repository(host);
    let root = repo.path().to_str().unwrap();
    // --strict: the same tree fails on its skipped inputs, with its own status.
    let strict = review(&["-R", "--strict", root], None);
    assert_eq!(strict.status.code(), Some(3));
    let text = String::from_utf8_lossy(&strict.stdout);
    assert!(
        text.lines().next().unwrap().starts_with("WORKLOAD  "),
        "{text}"
    );
    assert!(text.lines().next().unwrap().contains("SOURCE"), "{text}");
    assert!(text.contains("skipped: "), "{text}");
    assert!(
        text.contains(&format!(
            "{root}/apps/batch.yml:2 (line 13): expected a Kubernetes object"
        )),
        "{text}"
    );

    // A problem in a manifest: 1 (and under --strict, 3: skipped inputs outrank it); its
    // other image is still looked up.
    write(repo.path(), "apps/broken.yaml", &format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: broken}}\nspec:\n  template:\n    spec:\n      containers:\n      - name: app\n        image: {host}/fixtures/multiarch-oci:v1\n      - name: pinned\n        image: 1.0\n"));
    let strict = review(&["-R", "--json", "--strict", root], None);
    assert_eq!(strict.status.code(), Some(3));
    let out = review(&["-R", "--json", root], None);
    assert_eq!(out.status.code(), Some(1));
    let report = json_report(&out);
    let broken = workload(&report, "Deployment", "broken");
    assert_eq!(broken["outcome"], "invalid_object");
    assert_eq!(
        broken["problems"][0],
        "container \"pinned\": its image 1.0 is not a string (line 11)"
    );
    let image = format!("{host}/fixtures/multiarch-oci:v1");
    assert!(
        broken["images"][&image]["platforms"].is_array(),
        "{broken:#}"
    );

    // Nothing that holds a Kubernetes object: could not run, each input named on stderr.
    let chart = repo.path().join("charts");
    let out = review(
        &[
            "-R",
            chart.join("api/templates").to_str().unwrap(),
            repo.path().join("apps/empty.yaml").to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nothing to review"), "{stderr}");
    assert!(
        stderr.contains("empty.yaml: empty: no document"),
        "{stderr}"
    );
    assert!(stderr.contains("a Helm chart's template"), "{stderr}");
    // Only the CRD: read, nothing to review, no failure.
    let out = review(&["-R", chart.join("api/crds").to_str().unwrap()], None);
    assert_eq!(
        succeeded(&out).lines().last(),
        Some("0 workloads; 1 object without a Pod template skipped")
    );
}

/// A chart's files give the same result whether the repository or the chart is walked: its
/// templates skipped as the chart's, its other manifests and its subchart's CRDs read.
#[test]
fn a_charts_files_give_the_same_result_whichever_root_is_walked() {
    let repo = repository(&registry::plain().host);
    let chart = repo.path().join("charts/api");
    let chart = chart.to_str().unwrap();
    // Each workload's and skipped input's source under the chart, with its outcome or reason.
    let under_chart = |root: &str| {
        let out = review(&["-R", "--json", root], None);
        let report = json_report(&out);
        let mut seen: Vec<(String, String)> = skipped_inputs(&report)
            .into_iter()
            .chain(report["workloads"].as_array().unwrap().iter().map(|w| {
                let source = w["source"].as_str().unwrap().to_owned();
                (source, w["outcome"].as_str().unwrap().to_owned())
            }))
            .filter_map(|(source, said)| Some((source.strip_prefix(chart)?.to_owned(), said)))
            .collect();
        seen.sort();
        seen
    };
    let from_the_repository = under_chart(repo.path().to_str().unwrap());
    let from_the_chart = under_chart(chart);
    assert_eq!(from_the_repository, from_the_chart);
    let sources: Vec<&str> = from_the_chart.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(
        sources,
        [
            "/Chart.yaml:1",
            "/charts/db/Chart.yaml:1",
            "/charts/db/templates/sts.yaml",
            "/extra.yaml:1",
            "/templates/deployment.yaml",
            "/values.yaml:1"
        ]
    );
    // Its templates named alone: still the chart's, nothing to review.
    let templates = format!("{chart}/templates");
    let out = review(&["-R", &templates], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("deployment.yaml: a Helm chart's template")
    );
}

/// `--strict` fails on a skipped input even when lookups failed too (3, not 4); a path on the
/// command line that is not there is an error (2), not a skipped input; causes go to stderr.
#[test]
fn strict_outranks_failed_lookups_and_a_mistyped_path_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    write(dir.path(), "good.yaml", &format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: good}}\nspec:\n  containers: [{{name: c, image: '{}/fixtures/multiarch-oci:v1'}}]\n",
        registry::plain().host
    ));
    write(dir.path(), "gone.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: gone}\nspec:\n  containers: [{name: c, image: '127.0.0.1:1/gone:v1'}]\n");
    write(
        dir.path(),
        "kustomization.yaml",
        "resources: [good.yaml, gone.yaml]\n",
    );
    let root = dir.path().to_str().unwrap();
    let out = review(&[root], None);
    assert_eq!(out.status.code(), Some(4));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stdout.contains("cause:"), "{stdout}");
    assert!(
        stderr.contains("cause: Pod/gone: 127.0.0.1:1/gone:v1: "),
        "{stderr}"
    );
    assert_eq!(review(&["--strict", root], None).status.code(), Some(3));
    let typo = dir.path().join("good.yml");
    let out = review(&[good.to_str().unwrap(), typo.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{}: cannot read", typo.display())),
        "{stderr}"
    );
}

/// The command ends once its answer is written: a registry on 127.0.0.1 that accepts
/// connections and never answers holds no lookup past `lookup_timeout`, and no connection
/// holds the exit. (A DNS query that blocks cannot be made on loopback; the runtime's end
/// without waiting for a blocking task is the unit test in `cmd.rs`.)
#[test]
fn the_command_ends_when_its_answer_is_written() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host = silent.local_addr().unwrap().to_string();
    // Accepts, keeps every connection open, answers nothing.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for connection in silent.incoming() {
            held.push(connection);
        }
    });
    let yaml = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: slow}}\nspec:\n  template:\n    spec:\n      containers: [{{name: c, image: '{host}/app:v1'}}]\n"
    );
    let started = std::time::Instant::now();
    let out = common::cli::tolerable()
        .env("TOLERABLE_REGISTRY__LOOKUP_TIMEOUT", "1s")
        .env("TOLERABLE_REGISTRY__INSECURE", &host)
        .args(["review", "--json", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child.stdin.take().unwrap().write_all(yaml.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    // Before the API server's own timeout for a webhook (10 s), with the lookup's 1 s spent.
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let report = json_report(&out);
    assert_eq!(
        workload(&report, "Deployment", "slow")["outcome"],
        "lookup_failed",
        "{report:#}"
    );
}

/// A List item without a kind is a skipped input; the List's other items are reviewed and the
/// run passes (it could read something).
#[test]
fn a_list_with_an_item_without_kind_keeps_its_other_items() {
    let list = format!(
        "apiVersion: v1\nkind: List\nitems:\n- metadata: {{name: x}}\n- apiVersion: v1\n  kind: Pod\n  metadata: {{name: p}}\n  spec:\n    containers: [{{name: c, image: '{}/fixtures/multiarch-oci:v1'}}]\n",
        registry::plain().host
    );
    let out = review(&["--json", "-"], Some(list.as_bytes()));
    let report = json_report(&out);
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(workload(&report, "Pod", "p")["outcome"], "decided");
    assert_eq!(
        skipped_inputs(&report),
        [(
            "-:1".to_owned(),
            "List item 1: an object without a kind: not a Kubernetes object".to_owned()
        )]
    );
    let strict = review(&["--strict", "-"], Some(list.as_bytes()));
    assert_eq!(strict.status.code(), Some(3));
}

/// `review --help` states the rules a CI gate relies on.
#[test]
fn help_states_the_rule_for_partial_templates_and_the_exit_statuses() {
    let out = common::cli::tolerable()
        .args(["review", "--help"])
        .output()
        .unwrap();
    let help = succeeded(&out);
    for said in [
        "a Pod template with no containers, `containers: []`, or a\ncontainer without an image is partial",
        "  2  could not run",
        "  3  with --strict: inputs were skipped, whatever else was found (3 outranks 1 and 4",
        "  4  no problem found, but some images could not be looked up",
        "UTF-16/UTF-32 with a byte order mark",
        "--patch shows each in detail instead",
        "--strict",
    ] {
        assert!(help.contains(said), "{said:?} not in:\n{help}");
    }
}

/// Inputs as kubectl reads them: a JSON stream and JSON Lines (a document per value, each at
/// its line), UTF-16 with a byte order mark (PowerShell's `>`); a 400 KB `[[[[…` file ends
/// with its error (refused before it is parsed); a file that is not UTF-8 is said once.
#[test]
fn json_lines_utf16_deep_nesting_and_binary_files_are_read_as_kubectl_reads_them() {
    let image = format!("{}/fixtures/multiarch-oci:v1", registry::plain().host);
    let pod = |name: &str| {
        format!("{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"{name}\"}},\"spec\":{{\"containers\":[{{\"name\":\"c\",\"image\":\"{image}\"}}]}}}}")
    };
    let dir = tempfile::tempdir().unwrap();
    let lines = format!("{}\n{}\n{{\"kind\" \"Pod\"}}\n", pod("a"), pod("b"));
    write(dir.path(), "pods.jsonl.json", &lines);
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: wide}}\nspec:\n  containers: [{{name: c, image: '{image}'}}]\n"
    );
    let mut utf16 = vec![0xFF, 0xFE];
    utf16.extend(yaml.encode_utf16().flat_map(u16::to_le_bytes));
    std::fs::write(dir.path().join("powershell.yaml"), utf16).unwrap();
    std::fs::write(dir.path().join("deep.yaml"), "[".repeat(400_000)).unwrap();
    std::fs::write(dir.path().join("binary.yaml"), b"kind: Pod\n\xff\xfe\xfd\n").unwrap();
    let out = review(&["--json", dir.path().to_str().unwrap()], None);
    let report = json_report(&out);
    for name in ["a", "b", "wide"] {
        assert_eq!(
            workload(&report, "Pod", name)["outcome"],
            "decided",
            "{report:#}"
        );
    }
    let root = dir.path().to_str().unwrap();
    let skipped: Vec<(String, String)> = skipped_inputs(&report)
        .into_iter()
        .map(|(source, reason)| (source.strip_prefix(root).unwrap().to_owned(), reason))
        .collect();
    assert_eq!(
        skipped,
        [
            (
                "/binary.yaml".to_owned(),
                "line 2: not UTF-8 text".to_owned()
            ),
            (
                "/deep.yaml:1".to_owned(),
                "nested deeper than 100 levels at line 1: not read".to_owned()
            ),
            (
                "/pods.jsonl.json:3".to_owned(),
                "input is neither JSON nor YAML: expected `:` at line 3 column 9".to_owned()
            ),
        ]
    );
}
