//! What the crash watch does to a crashed Pod, against the fake replaying the recorded crash
//! (`tests/data/kube-api/crashes/`): the mark (the `tolerable.io/crash` annotation, one JSON
//! Patch guarded by the Pod's uid), and `[crashes] heal` — a wrong-architecture crash (a
//! mislabelled index, confirmation (b)) whose Pod a ReplicaSet recreates is deleted once, with
//! the recorded uid precondition; a bare Pod, a DaemonSet's Pod and a Pod with a hostPath
//! volume are not; a Pod replaced before the delete (the recorded 409) is left alone. Each
//! asserts the patches or deletes the fake received, the Event's words and the count.

use serde_json::{json, Value};

use crate::common;
use crate::common::crashes_api::{Crashes, PodChanges, POD_UID};
use crate::common::kube_api::{FakeApiServer, RegistryHosts};
use crate::common::recorded::{exchanges, send};
use crate::common::registry;
use crate::common::webhook::TestServer;
use crate::crashes::{crashing_image_with, until_metric, watching_with, BOUND};

fn hosts() -> RegistryHosts {
    RegistryHosts {
        basic: registry::basic().host.clone(),
        token: registry::token().host.clone(),
    }
}

/// `serve` with the crash watch and `[crashes] heal`, its Pod changed by `changed`, the image
/// a mislabelled index (amd64 and arm64 entries, both amd64 images) pushed as `repository`:
/// the crash on the arm64 node is a confirmed wrong architecture, learned, and the decision
/// for its image now is amd64 alone.
async fn healing(repository: &str, changed: PodChanges) -> Healing {
    crashing(repository, changed, true).await
}

/// [`healing`], with `[crashes] heal` as `heal` says.
async fn crashing(repository: &str, changed: PodChanges, heal: bool) -> Healing {
    let registry = registry::plain();
    let pusher = common::fixtures::Pusher::for_mode(&registry.host, registry.mode);
    pusher.push(repository, "mislabelled", "v1").await;
    let (api, _, _) = crashing_image_with(&registry.host, repository, |c| c.changed(changed)).await;
    let server = watching_with(&api, |config| config.crash_heal = heal).await;
    (api, server)
}

/// The fake and the server (leading: it does not compete for the Lease).
type Healing = (FakeApiServer, TestServer);

/// The heal's count with `result` at 1 (the heal is done by then), then the Pod's Event.
async fn healed_as(api: &FakeApiServer, server: &TestServer, result: &str) -> String {
    let series = format!("tolerable_crash_heals_total{{result=\"{result}\"}}");
    until_metric(server, &series, 1.0).await;
    let on_pod = |e: &Value| e["involvedObject"]["kind"] == "Pod";
    assert!(
        api.wait_for_events(BOUND, |e| e.iter().any(on_pod)).await,
        "{:#?}",
        api.events()
    );
    let events = api.events();
    let event = events.iter().find(|e| on_pod(e)).unwrap();
    assert_eq!(event["reason"], "WrongArchitecture", "{event:#}");
    event["message"].as_str().unwrap().to_owned()
}

/// Without `[crashes] heal`, a wrong-architecture crash's Pod is marked — one JSON Patch that
/// tests its uid and adds the annotation (the recorded Pod has none) naming the verdict, the
/// container, the image by digest and the node's architecture — and never deleted.
#[tokio::test]
async fn a_wrong_architecture_crash_marks_its_pod() {
    let (api, _server) = crashing("mark/mislabelled", PodChanges::None, false).await;
    let on_pod = |e: &Value| e["involvedObject"]["kind"] == "Pod";
    assert!(
        api.wait_for_events(BOUND, |e| e.iter().any(on_pod)).await,
        "{:#?}",
        api.events()
    );
    let host = &registry::plain().host;
    let patches = api.crash_patches();
    assert_eq!(patches.len(), 1, "{patches:#?}");
    // The recorded Pod has no annotations: the map is added after a test of its uid and of
    // the resourceVersion read (the fake answers no other shape).
    let ops = patches[0].as_array().unwrap();
    assert_eq!(ops[1]["path"], "/metadata/resourceVersion", "{ops:#?}");
    let mark = ops[2]["value"]["tolerable.io/crash"].as_str().unwrap();
    let head = "wrong-architecture; container=web; image=";
    assert!(
        mark.starts_with(&format!("{head}{host}/mark/mislabelled@sha256:")),
        "{mark}"
    );
    assert!(mark.ends_with("; node-arch=arm64"), "{mark}");
    assert_eq!(
        patches[0][0],
        json!({"op": "test", "path": "/metadata/uid", "value": POD_UID})
    );
    assert_eq!(api.crash_deletes(), Vec::<Value>::new());
}

/// A ReplicaSet's Pod: deleted once, with the Pod's uid as the precondition (the recorded 200),
/// the Pod's Event saying so and where the images go now.
#[tokio::test]
async fn a_replica_sets_pod_of_a_learned_crash_is_deleted_by_uid_and_said_on_its_owner() {
    let (api, server) = healing("heal/replicaset", PodChanges::None).await;
    let message = healed_as(&api, &server, "deleted").await;
    assert!(
        message.contains(
            "deleted the Pod (crashes.heal): its ReplicaSet web-7d9c6b8f5 recreates it, its images now placed on amd64"
        ),
        "{message}"
    );
    assert_eq!(
        api.crash_deletes(),
        vec![json!({"preconditions": {"uid": POD_UID}})]
    );
    let on_owner = |e: &Value| e["regarding"]["kind"] == "ReplicaSet";
    assert!(
        api.wait_for_events(BOUND, |e| e.iter().any(on_owner)).await,
        "{:#?}",
        api.events()
    );
    let owner = api.events().into_iter().find(on_owner).unwrap();
    assert!(
        owner["note"].as_str().unwrap().contains("deleted the Pod"),
        "{owner:#}"
    );
}

/// A Pod `changed` so healing holds it: counted as held, no delete, the Event saying `why`.
async fn held(repository: &str, changed: PodChanges, why: &str) {
    let (api, server) = healing(repository, changed).await;
    let message = healed_as(&api, &server, "held").await;
    assert!(
        message.contains(&format!("not deleted (crashes.heal): {why}")),
        "{message}"
    );
    assert_eq!(api.crash_deletes(), Vec::<Value>::new());
}

#[tokio::test]
async fn a_bare_pod_is_not_deleted() {
    held(
        "heal/bare",
        PodChanges::Bare,
        "it has no controller to recreate it",
    )
    .await;
}

#[tokio::test]
async fn a_daemon_sets_pod_is_not_deleted() {
    held(
        "heal/daemonset",
        PodChanges::DaemonSet,
        "a DaemonSet's Pod is recreated on the same node",
    )
    .await;
}

#[tokio::test]
async fn a_pod_with_a_host_path_volume_is_not_deleted() {
    held(
        "heal/hostpath",
        PodChanges::HostPath,
        "its volume data is a hostPath",
    )
    .await;
}

/// The Pod read was replaced before the delete: its uid precondition is the recorded 409's,
/// answered as recorded — counted as gone, nothing more sent.
#[tokio::test]
async fn a_pod_replaced_before_the_delete_is_left_alone() {
    let (api, server) = healing("heal/replaced", PodChanges::Replaced).await;
    let message = healed_as(&api, &server, "gone").await;
    assert!(
        message.contains("not deleted (crashes.heal): it was gone or replaced already"),
        "{message}"
    );
    assert_eq!(
        api.crash_deletes(),
        vec![json!({"preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}})]
    );
}

/// The recorded DELETEs replayed against the fake: each answered with its recorded status and
/// body; a delete with another option (a grace period) is unrecorded.
#[tokio::test]
async fn the_fake_answers_the_recorded_deletes_as_recorded() {
    let api = FakeApiServer::start_with_crashes(hosts(), Crashes::recorded());
    let client = api.client("admintoken");
    let mut replayed = 0;
    for exchange in exchanges("crashes") {
        let request = &exchange.request;
        if request.method != "DELETE" {
            continue;
        }
        replayed += 1;
        let (code, answer) = send(
            &client,
            "DELETE",
            &request.path,
            request.content_type.as_deref(),
            request.body.as_ref(),
        )
        .await;
        assert_eq!(code, exchange.response.status, "{}", exchange.note);
        assert_eq!(answer, exchange.response.body, "{}", exchange.note);
    }
    assert_eq!(replayed, 2, "the 409 and the 200");
    let path = "/api/v1/namespaces/shop/pods/web-7d9c6b8f5-abcde";
    let graceless = json!({"preconditions": {"uid": POD_UID}, "gracePeriodSeconds": 0});
    let (code, _) = send(
        &client,
        "DELETE",
        path,
        Some("application/json"),
        Some(&graceless),
    )
    .await;
    assert_eq!(code, 501);
}
