//! `tolerable crashes list | forget` (issue 38) against a real redis-server holding what the
//! crash watch learned, written through the crash watch's own store
//! (`tolerable::crashes::shared::SharedLearned`, as `serve`'s leader writes it); and that store's
//! bounds, per namespace and in all.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use tolerable::crashes::shared::SharedLearned;
use tolerable::crashes::{MAX_LEARNED, MAX_PER_NAMESPACE};

use crate::common;
use crate::common::redis::RedisServer;

const TTL: Duration = Duration::from_secs(24 * 60 * 60);

fn digest(n: usize) -> String {
    format!("sha256:{n:064x}")
}

/// `tolerable crashes ARGS`, the shared cache on `redis` (by its variable, as a Deployment's
/// env gives it), isolated from this process's environment.
fn crashes(home: &Path, redis: Option<&RedisServer>, args: &[&str]) -> Output {
    let mut command: Command = common::cli::isolated(home, "2s");
    command.arg("crashes").args(args);
    if let Some(redis) = redis {
        command.env("TOLERABLE_SHARED_CACHE__URL", redis.url());
    }
    command.output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What two namespaces' crashes taught is listed a row per architecture; `forget --arch`
/// forgets that one, `forget` the rest; forgetting it again finds nothing (1).
#[tokio::test]
async fn list_shows_what_was_learned_and_forget_forgets_it() {
    let redis = RedisServer::start();
    let store = SharedLearned::new(redis.settings()).unwrap();
    assert!(store.learn("shop", &digest(1), "arm64", TTL).await.unwrap());
    assert!(store.learn("lab", &digest(1), "arm", TTL).await.unwrap());
    assert!(store.learn("shop", &digest(2), "amd64", TTL).await.unwrap());
    let home = tempfile::tempdir().unwrap();
    let listed = crashes(home.path(), Some(&redis), &["list"]);
    assert_eq!(listed.status.code(), Some(0), "{listed:?}");
    let text = stdout(&listed);
    let row = |d: usize, arch: &str, ns: &str| {
        let wanted = [
            digest(d),
            arch.to_owned(),
            ns.to_owned(),
            "in 24h00m".to_owned(),
        ];
        text.lines().any(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            words.len() == 5 && words[..3] == wanted[..3] && words[3..].join(" ") == wanted[3]
        })
    };
    assert!(text.starts_with("DIGEST"), "{text}");
    assert!(
        row(1, "arm64", "shop") && row(1, "arm", "lab") && row(2, "amd64", "shop"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 4, "{text}");

    let one = digest(1);
    let out = crashes(
        home.path(),
        Some(&redis),
        &["forget", &one, "--arch", "arm"],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        stdout(&out).contains("forgot 1 architecture(s) on arm"),
        "{out:?}"
    );
    let out = crashes(home.path(), Some(&redis), &["forget", &one]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = crashes(home.path(), Some(&redis), &["forget", &one]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stdout(&out).contains("nothing learned of"), "{out:?}");

    let left = store.entries().await.unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].digest, digest(2));
    assert!(
        !redis.keys().iter().any(|k| k.ends_with(&one)),
        "{:?}",
        redis.keys()
    );
}

/// Without a shared cache there is nothing to read: it says where learning lives and how to
/// forget it (3).
#[test]
fn without_a_shared_cache_it_says_learning_lives_in_each_replica() {
    let home = tempfile::tempdir().unwrap();
    for args in [&["list"][..], &["forget", "sha256:abc"][..]] {
        let out = crashes(home.path(), None, args);
        assert_eq!(out.status.code(), Some(3), "{out:?}");
        let text = stdout(&out);
        assert!(text.contains("each serve replica's memory"), "{text}");
        assert!(text.contains("restart the replicas"), "{text}");
    }
}

/// One namespace teaching more than its share forgets its own oldest, never another's; many
/// namespaces within their shares: the oldest of all goes, at most MAX_LEARNED kept. Read as
/// `list` reads it (one bounded range of the index).
#[tokio::test]
async fn the_shared_store_is_bounded_per_namespace_and_in_all() {
    let redis = RedisServer::start();
    let store = SharedLearned::new(redis.settings()).unwrap();
    store
        .learn("quiet", &digest(0), "arm64", TTL)
        .await
        .unwrap();
    for n in 1..=MAX_PER_NAMESPACE + 5 {
        store
            .learn("noisy", &digest(n), "arm64", TTL)
            .await
            .unwrap();
    }
    let entries = store.entries().await.unwrap();
    assert_eq!(entries.len(), MAX_PER_NAMESPACE + 1);
    assert!(entries.iter().any(|e| e.digest == digest(0)));
    assert!(!entries.iter().any(|e| e.digest == digest(1)));

    let base = 10_000;
    for n in 0..MAX_LEARNED {
        let namespace = format!("ns-{}", n % 16);
        store
            .learn(&namespace, &digest(base + n), "arm64", TTL)
            .await
            .unwrap();
    }
    let entries = store.entries().await.unwrap();
    assert_eq!(entries.len(), MAX_LEARNED);
    assert!(
        !entries.iter().any(|e| e.digest == digest(0)),
        "the oldest of all"
    );
    let learned_keys = redis
        .keys()
        .iter()
        .filter(|k| k.starts_with("tolerable:v1:learned:"))
        .count();
    assert_eq!(learned_keys, MAX_LEARNED);
}

/// `review` with the shared cache reads what the crash watch learned and leaves it out as the
/// webhook does, reporting it per image; without it the same Pod keeps arm64.
#[tokio::test]
async fn review_reports_and_leaves_out_what_was_learned() {
    let redis = RedisServer::start();
    let host = &common::registry::plain().host;
    let image = format!("{host}/fixtures/multiarch-oci:v1");
    let digest = common::digest_of(&image).await;
    let store = SharedLearned::new(redis.settings()).unwrap();
    store.learn("shop", &digest, "arm64", TTL).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pod.yaml");
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: shop\nspec:\n  containers:\n  - name: web\n    image: {image}\n"
    );
    std::fs::write(&file, pod).unwrap();
    let review = |shared: bool, json: bool| {
        let mut command = common::cli::isolated(dir.path(), "3s");
        command
            .env("TOLERABLE_REGISTRY__INSECURE", host)
            .arg("review");
        if shared {
            command.env("TOLERABLE_SHARED_CACHE__URL", redis.url());
        }
        if json {
            command.arg("--json");
        }
        command.arg(&file).output().unwrap()
    };
    let said = format!("learned: {digest} does not run on arm64");
    let report: serde_json::Value =
        serde_json::from_str(&common::cli::succeeded(&review(true, true))).unwrap();
    let web = common::cli::workload(&report, "Pod", "web");
    assert!(
        web["learned"][0].as_str().unwrap().starts_with(&said),
        "{web:#}"
    );
    let architectures = web["architectures"].to_string();
    assert!(
        !architectures.contains("arm64") && architectures.contains("amd64"),
        "{web:#}"
    );
    let table = common::cli::succeeded(&review(true, false));
    assert!(table.contains(&said), "{table}");
    let report: serde_json::Value =
        serde_json::from_str(&common::cli::succeeded(&review(false, true))).unwrap();
    let web = common::cli::workload(&report, "Pod", "web");
    assert!(web.get("learned").is_none(), "{web:#}");
    assert!(
        web["architectures"].to_string().contains("arm64"),
        "{web:#}"
    );
}

/// `audit` with the shared cache reports what was learned of a running workload's image among
/// its reasons, and leaves it out of the architectures its images share.
#[tokio::test]
async fn audit_reports_and_leaves_out_what_was_learned() {
    let api = super::audit::cluster();
    let redis = RedisServer::start();
    let host = &common::registry::plain().host;
    let digest = common::digest_of(&format!("{host}/team-a/web:1.4")).await;
    let store = SharedLearned::new(redis.settings()).unwrap();
    store.learn("team-a", &digest, "arm64", TTL).await.unwrap();
    let url = redis.url();
    let env = [("TOLERABLE_SHARED_CACHE__URL", url.as_str())];
    let out = super::audit::audit_with(api, "admintoken", &["--json"], &env);
    let report: serde_json::Value = serde_json::from_str(&common::cli::succeeded(&out)).unwrap();
    let web = common::cli::workload(&report, "Deployment", "web");
    let said = format!("learned: {digest} does not run on arm64");
    assert!(web["reasons"].to_string().contains(&said), "{web:#}");
    let architectures = web["architectures"].to_string();
    assert!(
        !architectures.contains("arm64") && architectures.contains("amd64"),
        "{web:#}"
    );
}
