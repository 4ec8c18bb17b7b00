//! `tolerable check` as an operator runs it, against a fake API server answering only as a real
//! one was recorded answering (tests/data/kube-api: the MutatingWebhookConfiguration `tolerable`
//! read, and missing; `webhook-wire/`: a Pod create through a webhook whose patch the API server
//! dropped, and one whose webhook call failed under failurePolicy Fail). Each outcome ends with
//! its own message and exit status. The "reachable and deciding" answer has no recording yet
//! (a dry-run Pod create through tolerable itself): `cmd::check`'s unit test covers it.

use crate::common;

use std::process::Output;
use std::sync::{Arc, Mutex};

use common::kube_fake::{full, kubeconfig, ready, recording, status, FakeApi, Req, Running};
use hyper::StatusCode;

/// What the fake answers a Pod create with, and whether the webhook configuration exists.
#[derive(Clone, Copy)]
pub(crate) enum Cluster {
    /// 201, the Pod without tolerable's annotation (pod-create-nopatchtype-ignore).
    PatchDropped { registered: bool },
    /// 500, "failed calling webhook" (pod-create-nopatchtype).
    CallFailed,
}

/// The fake API server (the one server, `kube_fake`, with this handler): a dry-run Pod create
/// in any namespace, the webhook configuration `tolerable`; anything else is unrecorded (501).
/// Records each request's method, path and query.
pub(crate) fn start(cluster: Cluster, requests: Arc<Mutex<Vec<String>>>) -> Running {
    FakeApi::new()
        .handler(Arc::new(move |req: &Req| {
            let (method, path) = (req.method.as_str(), req.path.as_str());
            let asked = format!("{method} {path}?{}", req.raw_query);
            requests.lock().unwrap().push(asked);
            let pods = path.starts_with("/api/v1/namespaces/") && path.ends_with("/pods");
            let mwc = path.ends_with("/mutatingwebhookconfigurations/tolerable");
            let answer = match (method, cluster) {
                ("POST", Cluster::PatchDropped { .. }) if pods => status(
                    StatusCode::CREATED,
                    recording("webhook-wire/pod-create-nopatchtype-ignore.body.json"),
                ),
                ("POST", Cluster::CallFailed) if pods => status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    recording("webhook-wire/pod-create-nopatchtype.body.json"),
                ),
                ("GET", Cluster::PatchDropped { registered: false }) if mwc => status(
                    StatusCode::NOT_FOUND,
                    recording("mwc-missing-get-404.body.json"),
                ),
                ("GET", _) if mwc => {
                    status(StatusCode::OK, recording("mwc-tolerable-get.body.json"))
                }
                _ => return None,
            };
            ready(full(answer))
        }))
        .start()
}

/// `tolerable check -n team-a` against `cluster`: its output and the requests it made.
fn check(cluster: Cluster) -> (Output, Vec<String>) {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let api = start(cluster, requests.clone());
    let config = kubeconfig(api.port, "admintoken");
    let home = tempfile::tempdir().unwrap();
    let out = common::cli::isolated(home.path(), "1s")
        .args(["check", "-n", "team-a", "--kubeconfig"])
        .arg(config.path())
        .output()
        .unwrap();
    let requests = requests.lock().unwrap().clone();
    (out, requests)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The Pod is created as a dry run (nothing stored), in the namespace asked for; it came back
/// without the decision and the webhook configuration is there with its CA bundle: the API
/// server did not get tolerable's answer — unreachable, exit status 1.
#[test]
fn a_pod_without_the_decision_is_reported_unreachable() {
    let (out, requests) = check(Cluster::PatchDropped { registered: true });
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stdout(&out).starts_with("unreachable: "),
        "{}",
        stdout(&out)
    );
    let create = requests
        .iter()
        .find(|r| r.starts_with("POST "))
        .expect("a create");
    assert!(
        create.starts_with("POST /api/v1/namespaces/team-a/pods?"),
        "{create}"
    );
    assert!(create.contains("dryRun=All"), "not a dry run: {create}");
    assert!(requests.iter().any(|r| r.starts_with(
        "GET /apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/tolerable"
    )));
}

/// No webhook configuration: not installed, exit status 1.
#[test]
fn no_webhook_configuration_is_reported_not_installed() {
    let (out, _) = check(Cluster::PatchDropped { registered: false });
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stdout(&out).starts_with("not installed: "),
        "{}",
        stdout(&out)
    );
}

/// A create the API server refused because a webhook call failed: its message, named as a
/// webhook error, exit status 1.
#[test]
fn a_failed_webhook_call_is_reported_with_the_api_servers_message() {
    let (out, _) = check(Cluster::CallFailed);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = stdout(&out);
    assert!(text.starts_with("webhook error: "), "{text}");
    assert!(
        text.contains(
            "the API server answered 500: Internal error occurred: failed calling webhook"
        ),
        "{text}"
    );
}

/// No cluster to ask: could not run, exit status 2, the cause on stderr.
#[test]
fn no_cluster_is_could_not_run() {
    let home = tempfile::tempdir().unwrap();
    let out = common::cli::isolated(home.path(), "1s")
        .args(["check", "--kubeconfig"])
        .arg(home.path().join("no-kubeconfig"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no-kubeconfig"), "{stderr}");
}
