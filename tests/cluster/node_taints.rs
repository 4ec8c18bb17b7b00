//! `tolerable nodes plan | taint | untaint` through the real `kube` client against the thin fake
//! API server, seeded with the recorded mixed cluster: amd-1 (amd64), arm-1 (arm64, tainted by
//! hand), s390-1 (s390x, tainted by hand), bare-1 (no arch label; its kubelet says amd64).

use crate::common;

use std::collections::BTreeSet;
use std::process::Command;

use common::kube_api::{FakeApiServer, RegistryHosts};
use common::registry;
use serde_json::Value;
use tolerable::cluster::nodes::{reconcile_taints, webhook_ready, TaintAction, TaintError};
use tolerable::mutate::ARCH_LABEL;
use tolerable::taints::{TaintPolicy, MANAGED_ANNOTATION};

fn api() -> FakeApiServer {
    FakeApiServer::start(RegistryHosts {
        basic: registry::basic().host.clone(),
        token: registry::token().host.clone(),
    })
}

/// arm64 is the default pool here, so the two amd64 nodes are the ones to taint.
fn policy() -> TaintPolicy {
    TaintPolicy {
        default_architectures: BTreeSet::from(["arm64".to_owned()]),
        supported_architectures: BTreeSet::from(["amd64".to_owned(), "s390x".to_owned()]),
        key: ARCH_LABEL.into(),
        effect: "NoSchedule".into(),
        architecture_taints: Default::default(),
        force: false,
        taint_keys: BTreeSet::from([ARCH_LABEL.to_owned()]),
    }
}

fn taints(node: &Value) -> Vec<String> {
    node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            format!(
                "{}={}:{}",
                t["key"].as_str().unwrap(),
                t["value"].as_str().unwrap_or(""),
                t["effect"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test]
async fn plan_taint_twice_and_untaint_on_a_mixed_cluster() {
    let api = api();
    let client = api.client("admintoken");

    let plans = reconcile_taints(&client, &policy(), TaintAction::Plan)
        .await
        .unwrap();
    let changing: Vec<(&str, &str)> = plans
        .iter()
        .filter(|p| p.changes())
        .map(|p| (p.node.as_str(), p.architecture.as_deref().unwrap()))
        .collect();
    assert_eq!(changing, [("amd-1", "amd64"), ("bare-1", "amd64")]);
    // Planning changes nothing.
    assert_eq!(
        taints(&api.node("amd-1")),
        ["node.kubernetes.io/not-ready=:NoSchedule"]
    );

    let applied = reconcile_taints(&client, &policy(), TaintAction::Taint)
        .await
        .unwrap();
    assert_eq!(applied.iter().filter(|p| p.changes()).count(), 2);
    for node in ["amd-1", "bare-1"] {
        let node = api.node(node);
        assert_eq!(
            taints(&node),
            [
                "node.kubernetes.io/not-ready=:NoSchedule",
                "kubernetes.io/arch=amd64:NoSchedule"
            ],
            "the other taints stay"
        );
        assert_eq!(
            node["metadata"]["annotations"][MANAGED_ANNOTATION],
            "kubernetes.io/arch=amd64:NoSchedule"
        );
    }

    // Second time: nothing to do.
    let again = reconcile_taints(&client, &policy(), TaintAction::Taint)
        .await
        .unwrap();
    assert!(again.iter().all(|p| !p.changes()), "{again:?}");

    // Untaint removes what tolerable added and leaves hand-made taints alone.
    reconcile_taints(&client, &policy(), TaintAction::Untaint)
        .await
        .unwrap();
    assert_eq!(
        taints(&api.node("amd-1")),
        ["node.kubernetes.io/not-ready=:NoSchedule"]
    );
    assert!(api.node("amd-1")["metadata"]["annotations"]
        .get(MANAGED_ANNOTATION)
        .is_none());
    assert_eq!(
        taints(&api.node("arm-1")),
        [
            "kubernetes.io/arch=arm64:NoSchedule",
            "node.kubernetes.io/not-ready=:NoSchedule"
        ]
    );
    assert!(taints(&api.node("s390-1")).contains(&"kubernetes.io/arch=s390x:NoSchedule".to_owned()));
}

#[tokio::test]
async fn tainting_is_refused_while_the_webhook_is_absent() {
    let api = api();
    let client = api.client("admintoken");
    webhook_ready(&client).await.unwrap();
    api.set_webhook_registered(false);
    let refused = webhook_ready(&client).await.unwrap_err();
    assert!(
        matches!(refused, TaintError::WebhookNotReady(_)),
        "{refused}"
    );
    assert!(refused.to_string().contains("not registered"), "{refused}");
}

/// `tolerable nodes ARGS` as an operator runs it, with a kubeconfig pointing at the fake and
/// the given `TOLERABLE_*` variables.
struct NodesCli {
    dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
}

impl NodesCli {
    fn new(api: &FakeApiServer) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, &common::certs::ca().ca_pem).unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: https://127.0.0.1:{}\n    certificate-authority: {}\n\
                 users:\n- name: admin\n  user:\n    token: admintoken\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: admin\ncurrent-context: fake\n",
                api.port,
                ca.display()
            ),
        )
        .unwrap();
        Self { dir, kubeconfig }
    }

    fn run(&self, env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_tolerable"))
            .arg("nodes")
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("KUBECONFIG", &self.kubeconfig)
            .env("TOLERABLE_CREDENTIALS__READ_PULL_SECRETS", "false")
            .envs(env.iter().copied())
            .current_dir(self.dir.path())
            .output()
            .unwrap()
    }
}

/// The CLI as an operator runs it, with a kubeconfig pointing at the fake.
#[test]
fn the_cli_plans_refuses_and_forces() {
    let api = api();
    let cli = NodesCli::new(&api);
    let env = [
        ("TOLERABLE_POLICY__DEFAULT_ARCHITECTURES", "arm64"),
        ("TOLERABLE_POLICY__SUPPORTED_ARCHITECTURES", "amd64, s390x"),
    ];
    let run = |args: &[&str]| cli.run(&env, args);
    let plan = run(&["plan"]);
    let text = String::from_utf8_lossy(&plan.stdout);
    assert_eq!(
        plan.status.code(),
        Some(1),
        "{text}{}",
        String::from_utf8_lossy(&plan.stderr)
    );
    assert!(
        text.lines().any(|l| l.starts_with("amd-1")
            && l.contains("would add kubernetes.io/arch=amd64:NoSchedule")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("arm-1") && l.contains("no change")),
        "{text}"
    );
    // This fake has no DaemonSets recorded (it answers their list 501): the plan stands, and
    // says what it could not check.
    let stderr = String::from_utf8_lossy(&plan.stderr);
    assert!(
        stderr.contains("warning: DaemonSets not checked"),
        "{stderr}"
    );

    api.set_webhook_registered(false);
    let refused = run(&["taint"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("refusing to taint"));
    assert_eq!(taints(&api.node("amd-1")).len(), 1, "nothing was tainted");

    let forced = run(&["taint", "--force"]);
    assert!(
        forced.status.success(),
        "{}",
        String::from_utf8_lossy(&forced.stderr)
    );
    assert_eq!(taints(&api.node("amd-1")).len(), 2);
    let plan = run(&["plan"]);
    assert_eq!(plan.status.code(), Some(0), "nothing left to change");
}

/// An architecture in neither default_architectures nor supported_architectures would be fenced
/// off for good: planned as a refusal, refused by `nodes taint`, done only with `--force`.
#[test]
fn the_cli_refuses_to_fence_off_an_architecture_nobody_tolerates() {
    let api = api();
    let cli = NodesCli::new(&api);
    // arm64 is the default pool and s390x the only supported one: amd64 is in neither list.
    let env = [
        ("TOLERABLE_POLICY__DEFAULT_ARCHITECTURES", "arm64"),
        ("TOLERABLE_POLICY__SUPPORTED_ARCHITECTURES", "s390x"),
    ];
    let run = |args: &[&str]| cli.run(&env, args);
    let plan = run(&["plan"]);
    let text = String::from_utf8_lossy(&plan.stdout);
    assert!(
        text.lines().any(
            |l| l.starts_with("amd-1") && l.contains("would refuse to taint: amd64 is neither")
        ),
        "{text}"
    );
    let refused = run(&["taint"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("refusing to taint amd-1, bare-1: amd64 is neither"),
        "{stderr}"
    );
    assert_eq!(taints(&api.node("amd-1")).len(), 1, "nothing was tainted");
    let forced = run(&["taint", "--force"]);
    assert!(
        forced.status.success(),
        "{}",
        String::from_utf8_lossy(&forced.stderr)
    );
    assert!(taints(&api.node("amd-1")).contains(&"kubernetes.io/arch=amd64:NoSchedule".to_owned()));
}

/// What `serve --manage-node-taints` runs: the node watch and, on it, the tainter.
fn start_tainter(
    api: &FakeApiServer,
    policy: TaintPolicy,
) -> (
    tolerable::cluster::nodes::NodeWatch,
    tokio::task::JoinHandle<()>,
) {
    let client = api.client("admintoken");
    let watch = tolerable::cluster::nodes::NodeWatch::start(
        client.clone(),
        tolerable::mutate::Policy::default().taint_keys(),
    );
    let task = tokio::spawn(tolerable::cluster::nodes::keep_nodes_tainted(
        client,
        watch.clone(),
        policy,
    ));
    (watch, task)
}

/// `serve --manage-node-taints`: nodes the watch sees are tainted without anybody running
/// `nodes taint`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manage_node_taints_taints_what_the_node_watch_sees() {
    let api = api();
    let (_watch, task) = start_tainter(&api, policy());
    let started = std::time::Instant::now();
    while taints(&api.node("bare-1")).len() < 2 || taints(&api.node("amd-1")).len() < 2 {
        // Only keeps a tainter that never taints from hanging the test (the event is the taint).
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "nodes were not tainted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    task.abort();
    assert!(taints(&api.node("bare-1")).contains(&"kubernetes.io/arch=amd64:NoSchedule".to_owned()));
    // arm64 is the default here: arm-1 keeps exactly what it had.
    assert_eq!(
        taints(&api.node("arm-1")),
        [
            "kubernetes.io/arch=arm64:NoSchedule",
            "node.kubernetes.io/not-ready=:NoSchedule"
        ]
    );
}

/// `manage_node_taints` never fences off a pool nobody tolerates: with amd64 in neither list,
/// the amd64 nodes are left as they are, tick after tick. The tainter's own warning for each of
/// them proves it ran and refused (a tainter that never ran would patch nothing either).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manage_node_taints_leaves_an_architecture_nobody_tolerates_alone() {
    use tracing::instrument::WithSubscriber;
    let api = api();
    let mut unplanned = policy();
    unplanned.supported_architectures = BTreeSet::from(["s390x".to_owned()]);
    let client = api.client("admintoken");
    let watch = tolerable::cluster::nodes::NodeWatch::start(
        client.clone(),
        tolerable::mutate::Policy::default().taint_keys(),
    );
    // The tainter's log, captured from its own task whichever thread polls it.
    let log = common::captured_log::CapturedLog::default();
    let task = tokio::spawn(
        tolerable::cluster::nodes::keep_nodes_tainted(client, watch.clone(), unplanned)
            .with_subscriber(log.subscriber()),
    );
    let log_text = || log.text();
    let refused = |text: &str| {
        ["amd-1", "bare-1"].iter().all(|node| {
            text.lines()
                .any(|l| l.contains("not tainting") && l.contains(&format!("node={node}")))
        })
    };
    // Waits on the refusal itself; 30 s only keeps a broken tainter from hanging the suite.
    let started = std::time::Instant::now();
    while !refused(&log_text()) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the tainter never refused amd-1 and bare-1:\n{}",
            log_text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // And another tick after the one that refused.
    tokio::time::sleep(
        tolerable::cluster::nodes::MANAGE_INTERVAL + std::time::Duration::from_secs(1),
    )
    .await;
    task.abort();
    for node in ["amd-1", "bare-1"] {
        assert_eq!(
            taints(&api.node(node)),
            ["node.kubernetes.io/not-ready=:NoSchedule"],
            "{node} was tainted"
        );
    }
    assert!(
        !api.requests()
            .iter()
            .any(|r| r.starts_with("/api/v1/nodes/")),
        "no node was read whole or patched"
    );
}

/// `nodes plan` against the fake serving the recorded workloads (`tests/data/kube-api/workloads/`):
/// with an arm64 taint of another key (`arm64=true:NoSchedule`), the recorded DaemonSet
/// team-b/agent, whose template tolerates only `kubernetes.io/arch`, is named for its Pods on the
/// two arm64 nodes, with what to do; its Pods elsewhere are not.
#[test]
fn nodes_plan_names_the_daemonset_a_new_taint_would_take_off_its_nodes() {
    // The image host is never asked: `nodes plan` looks no image up.
    let api = common::workloads_api::WorkloadsApi::start("127.0.0.1:9");
    let kubeconfig = api.kubeconfig("admintoken");
    let run = |env: &[(&str, &str)]| {
        Command::new(env!("CARGO_BIN_EXE_tolerable"))
            .args(["nodes", "plan", "--kubeconfig"])
            .arg(kubeconfig.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("TOLERABLE_CREDENTIALS__READ_PULL_SECRETS", "false")
            .envs(env.iter().copied())
            .current_dir(std::env::temp_dir())
            .output()
            .unwrap()
    };
    let plan = run(&[(
        "TOLERABLE_ARCHITECTURE_TOLERATIONS__ARM64",
        "arm64=true:NoSchedule",
    )]);
    let text = String::from_utf8_lossy(&plan.stdout);
    let stderr = String::from_utf8_lossy(&plan.stderr);
    assert_eq!(plan.status.code(), Some(1), "{text}{stderr}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("arm-1") && l.contains("would add arm64=true:NoSchedule")),
        "{text}"
    );
    let agents: Vec<&str> = text.lines().filter(|l| l.contains("DaemonSet ")).collect();
    assert_eq!(
        agents,
        [
            "  DaemonSet team-b/agent: its Pods on arm-1, arm-2 would not come back once tainted: \
          its template does not tolerate arm64=true:NoSchedule; add a toleration for it to the \
          DaemonSet's Pod template before tainting"
        ],
        "{text}{stderr}"
    );
    assert!(!stderr.contains("not checked"), "{stderr}");
    for listed in [
        "/apis/apps/v1/daemonsets?&limit=500",
        "/api/v1/pods?&limit=500",
    ] {
        assert!(
            api.requests().iter().any(|r| r == listed),
            "{:?}",
            api.requests()
        );
    }

    // The default key: the recorded arm64 nodes carry it already, nothing would be added, and
    // no DaemonSet is listed at all.
    let plan = run(&[]);
    let text = String::from_utf8_lossy(&plan.stdout);
    assert!(!text.contains("DaemonSet"), "{text}");
}
