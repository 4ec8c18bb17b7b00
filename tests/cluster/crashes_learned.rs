//! What the crash watch learns, shared through the shared cache (issue 38): two `serve`
//! replicas against the same fake API server (the recorded crash, `tests/data/kube-api/crashes/`)
//! and one real redis-server; the leader confirms the crash, the other replica's admissions leave
//! the architecture out. And confirmation (c): the same image running on another architecture.

use std::time::{Duration, Instant};

use tolerable::cluster::lease::LeaderElection;
use tolerable::config::Config;

use super::crashes::{
    crashing_image, crashing_image_with, learned_then_left_out, pod_and_owner_events, watching,
    BOUND,
};
use crate::common;
use crate::common::crashes_api::Crashes;
use crate::common::kube_api::FakeApiServer;
use crate::common::redis::RedisServer;
use crate::common::registry;
use crate::common::webhook::{self, TestServer};

/// A `serve` replica with the crash watch, the node watch and the shared cache on `redis`,
/// leading as `leads` says: leading, it does not compete for the Lease; not leading, another
/// replica (the election returned) holds the Lease on the fake.
async fn replica(
    api: &FakeApiServer,
    redis: &RedisServer,
    leads: bool,
) -> (TestServer, Option<LeaderElection>) {
    let mut config = Config::load(None, Vec::new()).unwrap();
    config.policy = webhook::policy();
    config.resolver = common::settings();
    config.resolver.shared_cache = Some(redis.settings());
    config.read_pull_secrets = false;
    config.namespace_policy = false;
    config.watch_nodes = true;
    config.crash_watch = true;
    let client = api.client("admintoken");
    if leads {
        return (
            TestServer::start_configured(config, Some(client)).await,
            None,
        );
    }
    let (server, holder) = TestServer::start_following(config, client).await;
    (server, Some(holder))
}

/// An admission of `image` on `server`: its warnings.
async fn admission_warnings(server: &TestServer, image: &str) -> Vec<String> {
    let (_, response) = super::crashes::admit_in_shop(server, image, "web-3").await;
    webhook::warnings(&response)
}

/// The mislabelled index's crash (confirmation (b)) confirmed by the leading replica is written
/// to the shared cache (the digest's entry and the index); the other replica — which admitted
/// the image with arm64 before — leaves arm64 out of its next admissions, and says why.
#[tokio::test]
async fn a_crash_learned_by_the_leader_is_left_out_by_another_replica() {
    let redis = RedisServer::start();
    let registry = registry::plain();
    let pusher = common::fixtures::Pusher::for_mode(&registry.host, registry.mode);
    pusher
        .push("crashes/mislabelled", "mislabelled", "v1")
        .await;
    let (api, tag, image_id) = crashing_image(&registry.host, "crashes/mislabelled").await;
    let (other, _not_leading) = replica(&api, &redis, false).await;
    let before = admission_warnings(&other, &tag).await;
    assert!(!before.iter().any(|w| w.contains("left out")), "{before:?}");
    let (_leader, _lead) = replica(&api, &redis, true).await;
    let (pod, _) = pod_and_owner_events(&api).await;
    assert_eq!(pod["reason"], "WrongArchitecture");
    let digest = image_id.split_once('@').unwrap().1;
    let keys = redis.keys();
    for key in [
        format!("tolerable:v1:learned:{digest}"),
        "tolerable:v1:learned-index".to_owned(),
        "tolerable:v1:learned-ns:shop".to_owned(),
    ] {
        assert!(keys.contains(&key), "{key} not in {keys:?}");
    }
    // The other replica pulls the shared store on an interval: its admissions see it once it
    // has (BOUND is a hung test's guard).
    let deadline = Instant::now() + BOUND;
    loop {
        let warnings = admission_warnings(&other, &tag).await;
        if warnings.iter().any(|w| w.contains("arm64 left out")) {
            assert!(warnings.iter().any(|w| w.contains(digest)), "{warnings:?}");
            break;
        }
        assert!(Instant::now() < deadline, "never left out: {warnings:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    learned_then_left_out(&other, &tag).await;
}

/// The crash of an image whose index is consistent (its arm64 entry is an arm64 image: neither
/// (a) nor (b) confirms it) while the same image, by digest, runs ready in two other Pods of the
/// owner on amd64 nodes: confirmation (c) — one list of the owner's Pods by label — calls it a
/// wrong architecture, and it is learned: the next admission leaves arm64 out.
#[tokio::test]
async fn the_same_image_ready_on_another_architecture_confirms_the_crash() {
    let registry = registry::plain();
    let (api, tag, image_id) = crashing_image_with(
        &registry.host,
        "fixtures/multiarch-oci",
        Crashes::running_elsewhere,
    )
    .await;
    let server = watching(&api).await;
    let (pod, owner) = pod_and_owner_events(&api).await;
    assert_eq!(pod["reason"], "WrongArchitecture", "{pod:#}");
    let message = pod["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "{image_id} runs on amd64 nodes: its arm64 image does not run on arm64"
        )),
        "{message}"
    );
    assert_eq!(owner["reason"], "WrongArchitecture");
    let lists: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|p| p == "/api/v1/namespaces/shop/pods")
        .collect();
    assert_eq!(lists.len(), 1, "one list of the owner's Pods per crash");
    learned_then_left_out(&server, &tag).await;
}

/// The same crash, the owner's Pods listed but none other runs the image: unconfirmed, nothing
/// learned.
#[tokio::test]
async fn no_other_pod_running_the_image_leaves_the_crash_unconfirmed() {
    let registry = registry::plain();
    let (api, tag, _) = crashing_image(&registry.host, "fixtures/multiarch-oci").await;
    let server = watching(&api).await;
    let (pod, _) = pod_and_owner_events(&api).await;
    assert_eq!(pod["reason"], "ExecFormatError", "{pod:#}");
    assert!(api
        .requests()
        .iter()
        .any(|p| p == "/api/v1/namespaces/shop/pods"));
    let warnings = admission_warnings(&server, &tag).await;
    assert!(
        !warnings.iter().any(|w| w.contains("left out")),
        "{warnings:?}"
    );
}
